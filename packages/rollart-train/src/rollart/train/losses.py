"""PPO-clip policy loss with importance ratios, KL to a reference, entropy bonus, aggregation.

Every function works on [B, T] tensors aligned with `TrainBatch.input_ids` (position t holds
quantities of token t) and a boolean `loss_mask` of policy-produced tokens. Masked positions are
removed with `torch.where` before any arithmetic, never by multiplying with 0, so a NaN or inf at
a masked position (say a garbage behaviour log-prob on an observation token) cannot leak into the
loss or the gradients.

Aggregation divides partial sums by a *global* denominator (`num_tokens` or `num_sequences` of the
whole batch), so the losses of micro-batches add up to the loss of the full batch: gradient
accumulation is exact, not an average of averages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollart import checks as check
from rollart.train.batch import TrainBatch
from rollart.train.errors import TrainError

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


@dataclass(frozen=True)
class LossConfig:
    """The knobs of the policy loss.

    Attributes:
        clip_eps_low: PPO lower clip, the ratio is clipped at 1 - clip_eps_low.
        clip_eps_high: PPO upper clip, the ratio is clipped at 1 + clip_eps_high (DAPO's
            clip-higher when larger than clip_eps_low).
        kl_coef: weight of the k3 KL estimate to the reference policy (0 disables it).
        entropy_coef: weight of the entropy bonus (subtracted from the loss; 0 disables it).
        aggregation: how per-token losses become one number, one of `AGGREGATIONS`.
    """

    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"

    def __post_init__(self) -> None:
        # VAL: VAL_POSITIVE(self.clip_eps_low, exc=TrainError)
        check.positive("clip_eps_low", self.clip_eps_low, exc=TrainError)  # generated #94ec792dcc
        # VAL: VAL_POSITIVE(self.clip_eps_high, exc=TrainError)
        check.positive("clip_eps_high", self.clip_eps_high, exc=TrainError)  # generated #7613e40b91
        # VAL: VAL_NON_NEGATIVE(self.kl_coef, exc=TrainError)
        check.non_negative("kl_coef", self.kl_coef, exc=TrainError)  # generated #2c6a7fe608
        # VAL: VAL_NON_NEGATIVE(self.entropy_coef, exc=TrainError)
        check.non_negative("entropy_coef", self.entropy_coef, exc=TrainError)  # generated #0e092e805c
        # VAL: VAL_ONE_OF(self.aggregation, choices=AGGREGATIONS, exc=TrainError)
        check.one_of("aggregation", self.aggregation, AGGREGATIONS, exc=TrainError)  # generated #20532d4495


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """Upcast half precision for a stable softmax; never downcast float64 (it would break gradcheck)."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


def token_log_probs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each token given its prefix, aligned with `input_ids` ([B, T]).

    A causal LM's logits at position t predict token t+1; shifting here, once, keeps every other
    tensor aligned with the tokens. Position 0 has no prefix and gets 0. Computed in the logits'
    dtype when it is float32 or wider (float64 stays float64, so `gradcheck` works); half
    precision logits are upcast to float32 for the softmax.
    """
    # AST: AST_PRECONDITION(logits.shape[:2] == input_ids.shape, got=(tuple(logits.shape), tuple(input_ids.shape)), msg="logits are [B, T, V] for input_ids [B, T]", exc=TrainError)
    check.precondition(logits.shape[:2] == input_ids.shape, "logits are [B, T, V] for input_ids [B, T]", got_lazy=lambda: (tuple(logits.shape), tuple(input_ids.shape)), exc=TrainError)  # generated #88b3d927b8
    log_softmax = torch.log_softmax(_at_least_float32(logits[:, :-1]), dim=-1)
    picked = torch.gather(log_softmax, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the distribution each token was drawn from, aligned like `token_log_probs` (same dtype rule)."""
    log_softmax = torch.log_softmax(_at_least_float32(logits[:, :-1]), dim=-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return torch.cat([torch.zeros_like(entropy[:, :1]), entropy], dim=1)


def ppo_clip_loss(
    log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = pi / pi_behaviour.

    The ratio is taken against the log-probs recorded at rollout, not against a fresh forward of
    the old weights: under asynchronous rollout the behaviour policy is up to alpha versions old
    and only its own log-probs make the importance weight right. Returns (loss, ratio, clipped),
    all [B, T] and zero (ratio one) outside `loss_mask`; `advantages` is [B] or [B, T].
    """
    # AST: AST_PRECONDITION(log_probs.shape == behaviour_log_probs.shape == loss_mask.shape, got=(tuple(log_probs.shape), tuple(behaviour_log_probs.shape), tuple(loss_mask.shape)), msg="log_probs, behaviour_log_probs and loss_mask have one shape", exc=TrainError)
    check.precondition(log_probs.shape == behaviour_log_probs.shape == loss_mask.shape, "log_probs, behaviour_log_probs and loss_mask have one shape", got_lazy=lambda: (tuple(log_probs.shape), tuple(behaviour_log_probs.shape), tuple(loss_mask.shape)), exc=TrainError)  # generated #66f2c1d855
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_probs)
    log_ratio = torch.where(loss_mask, log_probs - behaviour_log_probs, torch.zeros_like(log_probs))
    ratio = torch.exp(log_ratio)
    adv = torch.where(loss_mask, advantages, torch.zeros_like(log_probs))
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    loss = torch.where(loss_mask, -torch.minimum(unclipped, clipped), torch.zeros_like(log_probs))
    was_clipped = loss_mask & (clipped < unclipped)
    return loss, ratio, was_clipped


def kl_k3(log_probs: torch.Tensor, reference_log_probs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): exp(d) - d - 1 with d = log pi_ref - log pi.

    Schulman's k3 is unbiased for samples drawn from pi, never negative and of low variance,
    which is why GRPO uses it; zero outside `loss_mask`.
    """
    diff = torch.where(loss_mask, reference_log_probs - log_probs, torch.zeros_like(log_probs))
    return torch.where(loss_mask, torch.exp(diff) - diff - 1.0, torch.zeros_like(log_probs))


def masked_aggregate(
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str,
    num_tokens: int,
    num_sequences: int,
) -> torch.Tensor:
    """Reduce per-token values to one scalar over the policy tokens.

    Modes: `token_mean` (every token weighs the same; long answers weigh more),
    `seq_mean_token_mean` (every sequence weighs the same: GRPO's original form) and
    `seq_mean_token_sum` (Dr.GRPO: a per-sequence sum over a constant, no length bias).
    `num_tokens` / `num_sequences` are those of the whole batch, so micro-batch results add up.
    """
    # VAL: VAL_ONE_OF(mode, choices=AGGREGATIONS, exc=TrainError)
    check.one_of("mode", mode, AGGREGATIONS, exc=TrainError)  # generated #96e4446c99
    # VAL: VAL_POSITIVE(num_tokens, exc=TrainError)
    check.positive("num_tokens", num_tokens, exc=TrainError)  # generated #153060f7cd
    # VAL: VAL_POSITIVE(num_sequences, exc=TrainError)
    check.positive("num_sequences", num_sequences, exc=TrainError)  # generated #8b7469eac4
    masked = torch.where(loss_mask, values, torch.zeros_like(values))
    if mode == "token_mean":
        return masked.sum() / num_tokens
    per_sequence = masked.sum(dim=-1)
    if mode == "seq_mean_token_mean":
        per_sequence = per_sequence / loss_mask.sum(dim=-1).clamp(min=1)
    return per_sequence.sum() / num_sequences


def policy_loss(
    logits: torch.Tensor,
    batch: TrainBatch,
    config: LossConfig,
    num_tokens: int,
    num_sequences: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The full RL loss of one (micro-)batch: PPO-clip + kl_coef * KL - entropy_coef * entropy.

    Returns the loss (to backpropagate) and token *sums* of the diagnostics (`kl_sum`,
    `entropy_sum`, `clipped_sum`, `ratio_sum`, `policy_tokens`) plus the already-normalized
    `pg_loss`, so a trainer adds micro-batch results and divides once.
    """
    # deps: token_log_probs, token_entropy, ppo_clip_loss, kl_k3, masked_aggregate
    mask = batch.loss_mask
    log_probs = token_log_probs(logits, batch.input_ids)
    pg_tokens, ratio, clipped = ppo_clip_loss(
        log_probs, batch.behaviour_log_probs, batch.advantages, mask, config.clip_eps_low, config.clip_eps_high
    )
    pg_loss = masked_aggregate(pg_tokens, mask, config.aggregation, num_tokens, num_sequences)
    loss = pg_loss
    if config.entropy_coef > 0:
        entropy = token_entropy(logits)
        loss = loss - config.entropy_coef * masked_aggregate(entropy, mask, config.aggregation, num_tokens, num_sequences)
    else:
        with torch.no_grad():
            entropy = token_entropy(logits)
    kl = None
    if batch.reference_log_probs is not None:
        kl = kl_k3(log_probs, batch.reference_log_probs, mask)
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * masked_aggregate(kl, mask, config.aggregation, num_tokens, num_sequences)
    elif config.kl_coef > 0:
        raise TrainError("batch.reference_log_probs must be set when kl_coef > 0, got None")
    zeros = torch.zeros_like(log_probs)
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "kl_sum": float(torch.where(mask, kl.detach(), zeros).sum()) if kl is not None else 0.0,
        "entropy_sum": float(torch.where(mask, entropy.detach(), zeros).sum()),
        "clipped_sum": float(clipped.sum()),
        "ratio_sum": float(torch.where(mask, ratio.detach(), zeros).sum()),
        "policy_tokens": float(mask.sum()),
    }
    return loss, metrics
