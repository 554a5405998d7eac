"""The training batch: padded tensors built from plain per-sample lists.

rollart.train imports no rollart package but rollart.resource, so it cannot see the env's
`Trajectory`. The scheduler converts each trajectory into a `TrainSample` (plain lists) and
`build_train_batch` pads them into a `TrainBatch`, the only thing a trainer consumes.

Alignment convention: every per-token list is aligned with `token_ids`; entry `t` of
`behaviour_log_probs` is log p(token_ids[t] | token_ids[:t]) under the policy that sampled it,
and `policy_mask[t]` is 1 when the policy produced token t (0 for prompt and environment
observation tokens). Token 0 has no prefix, so it can never be a policy token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from rollart import checks as check
from rollart.train.advantages import grpo_advantages
from rollart.train.errors import TrainError

if TYPE_CHECKING:
    import torch  # annotations only: the simulator imports this module without torch (D31)


@dataclass(frozen=True)
class TrainSample:
    """One trajectory as plain lists, the form the scheduler hands over."""

    token_ids: list[int]
    policy_mask: list[int]
    behaviour_log_probs: list[float]
    reward: float
    group_id: int
    reference_log_probs: list[float] | None = None


@dataclass
class TrainBatch:
    """Right-padded tensors of one training batch (B sequences, T positions).

    Attributes:
        input_ids: [B, T] long token ids, padded with the pad id.
        attention_mask: [B, T] bool, True on real (non-pad) tokens.
        loss_mask: [B, T] bool, True on tokens the policy produced; the loss sees only these.
        behaviour_log_probs: [B, T] float, log-probs recorded at rollout (0 where masked).
        advantages: [B] float32, one advantage per sequence (computed in float64), broadcast over its policy tokens.
        rewards: [B] float64, the scalar reward of each sequence (float64 so close rewards stay apart).
        group_ids: [B] long, the GRPO group of each sequence.
        reference_log_probs: [B, T] float or None, log-probs under the reference policy.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_log_probs: torch.Tensor
    advantages: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    reference_log_probs: torch.Tensor | None = None

    @property
    def num_sequences(self) -> int:
        """How many sequences the batch holds (B)."""
        return int(self.input_ids.shape[0])

    @property
    def num_policy_tokens(self) -> int:
        """How many tokens the loss sees (policy-produced tokens over the whole batch)."""
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch on `device` (itself when already there): the trainer's model device decides (D27)."""
        import torch

        if self.input_ids.device == torch.device(device):
            return self
        kwargs = {f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device) for f in fields(self)}
        return TrainBatch(**kwargs)

    def select(self, index: slice) -> TrainBatch:
        """The sub-batch of rows `index` (a slice), used to cut micro-batches without copying."""
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            kwargs[f.name] = None if value is None else value[index]
        return TrainBatch(**kwargs)


def validate_train_sample(sample: TrainSample, index: int) -> None:
    """Check one sample's lists agree in length and its mask is 0/1 with no policy token at 0.

    A separate function (more than ~10 lines) so `build_train_batch` stays readable; `index`
    names the sample in the message.
    """
    n = len(sample.token_ids)
    if n < 2:
        raise TrainError(f"samples[{index}].token_ids must hold at least 2 tokens, got {sample.token_ids!r}")
    for name in ("policy_mask", "behaviour_log_probs", "reference_log_probs"):
        values = getattr(sample, name)
        if values is not None and len(values) != n:
            raise TrainError(
                f"samples[{index}].{name} must have len(token_ids)={n} entries, got {len(values)}"
            )
    bad = [m for m in sample.policy_mask if m not in (0, 1)]
    if bad:
        raise TrainError(f"samples[{index}].policy_mask must contain only 0 or 1, got {bad[:5]!r}")
    if sample.policy_mask[0] != 0:
        raise TrainError(f"samples[{index}].policy_mask[0] must be 0 (token 0 has no prefix), got {sample.policy_mask[0]!r}")
    if sum(sample.policy_mask) == 0:
        raise TrainError(f"samples[{index}].policy_mask must mark at least one policy token, got all zeros")


def build_train_batch(
    samples: Sequence[TrainSample],
    pad_token_id: int = 0,
    normalize_advantage_std: bool = True,
) -> TrainBatch:
    """Pad plain per-sample lists into a `TrainBatch` and compute GRPO advantages.

    Advantages are computed here, over the whole batch, because GRPO normalizes within a group
    and a group may be split across micro-batches later.
    """
    # deps: validate_train_sample, grpo_advantages
    import torch

    # VAL: VAL_NON_EMPTY(samples, exc=TrainError)
    check.non_empty("samples", samples, exc=TrainError)  # generated #5cc6b4a2ba
    # VAL: VAL_INT_RANGE(pad_token_id, min=0, max=2**31 - 1, exc=TrainError)
    check.int_range("pad_token_id", pad_token_id, min=0, max=2**31 - 1, exc=TrainError)  # generated #26c12f5d56
    for i, sample in enumerate(samples):
        validate_train_sample(sample, i)
    with_ref = [s.reference_log_probs is not None for s in samples]
    if any(with_ref) and not all(with_ref):
        raise TrainError(
            f"reference_log_probs must be given for all samples or none, got it for {sum(with_ref)} of {len(samples)}"
        )
    batch_size, length = len(samples), max(len(s.token_ids) for s in samples)
    input_ids = torch.full((batch_size, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, length), dtype=torch.bool)
    loss_mask = torch.zeros((batch_size, length), dtype=torch.bool)
    behaviour = torch.zeros((batch_size, length), dtype=torch.float32)
    reference = torch.zeros((batch_size, length), dtype=torch.float32) if all(with_ref) else None
    for i, s in enumerate(samples):
        n = len(s.token_ids)
        input_ids[i, :n] = torch.tensor(s.token_ids, dtype=torch.long)
        attention_mask[i, :n] = True
        mask = torch.tensor(s.policy_mask, dtype=torch.bool)
        loss_mask[i, :n] = mask
        behaviour[i, :n] = torch.where(mask, torch.tensor(s.behaviour_log_probs, dtype=torch.float32), 0.0)
        if reference is not None:
            reference[i, :n] = torch.where(mask, torch.tensor(s.reference_log_probs, dtype=torch.float32), 0.0)
    # float64 rewards: float32 would round 1e6 + 0.01 to 1e6 before the advantages see it
    rewards = torch.tensor([float(s.reward) for s in samples], dtype=torch.float64)
    group_ids = torch.tensor([int(s.group_id) for s in samples], dtype=torch.long)
    # computed in float64 (an equal-reward group is exactly 0), stored float32 like the log-probs
    advantages = grpo_advantages(rewards, group_ids, normalize_std=normalize_advantage_std).to(torch.float32)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behaviour_log_probs=behaviour,
        advantages=advantages,
        rewards=rewards,
        group_ids=group_ids,
        reference_log_probs=reference,
    )
