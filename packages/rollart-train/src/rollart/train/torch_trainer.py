"""`TorchTrainer`: the policy trainer on plain torch (CPU here, any torch device elsewhere).

One `train_step` is one optimizer step: the batch is cut into micro-batches, each micro-batch's
loss is normalized by the *whole* batch's counts (so gradients accumulate exactly), gradients
are clipped, AdamW steps and the version grows by one. `MegatronTrainer` reuses all of it and
overrides only the forward and the weight export.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollart import checks as check
from rollart.train.batch import TrainBatch
from rollart.train.errors import TrainError
from rollart.train.losses import LossConfig, policy_loss, token_log_probs
from rollart.train.state_io import load_state, save_state, write_json_atomic

log = logging.getLogger(__name__)

CHECKPOINT_FORMATS = (2,)  # 2: safetensors + JSON directory (D19); 1 was a torch.save pickle


@dataclass(frozen=True)
class TrainerConfig:
    """Optimizer and step knobs of a trainer (AdamW, micro-batching, clipping) and the loss.

    Attributes:
        lr: AdamW learning rate.
        weight_decay: AdamW decoupled weight decay.
        betas: AdamW betas.
        adam_eps: AdamW epsilon.
        micro_batch_size: sequences per forward/backward; gradients accumulate over the batch.
        max_grad_norm: global L2 norm the gradients are clipped to before each step.
        loss: the policy-loss configuration.
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        """Reject bad knobs at construction."""
        # VAL: VAL_POSITIVE(self.lr, exc=TrainError)
        check.positive("lr", self.lr, exc=TrainError)  # generated #8e6ea54f60
        # VAL: VAL_NON_NEGATIVE(self.weight_decay, exc=TrainError)
        check.non_negative("weight_decay", self.weight_decay, exc=TrainError)  # generated #e4f52b7ece
        # VAL: VAL_INT_RANGE(self.micro_batch_size, min=1, max=1_000_000, exc=TrainError)
        check.int_range("micro_batch_size", self.micro_batch_size, min=1, max=1_000_000, exc=TrainError)  # generated #1d7a256d75
        # VAL: VAL_POSITIVE(self.max_grad_norm, exc=TrainError)
        check.positive("max_grad_norm", self.max_grad_norm, exc=TrainError)  # generated #da18aa974c
        # VAL: VAL_TYPE(self.loss, LossConfig, exc=TrainError)
        check.of_type("loss", self.loss, LossConfig, exc=TrainError)  # generated #8035a1c634


def _model_device(model: torch.nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _trim_padding(batch: TrainBatch) -> TrainBatch:
    """Drop trailing columns that are padding in every row (micro-batches are often shorter)."""
    length = int(batch.attention_mask.sum(dim=1).max().item())
    if length == batch.input_ids.shape[1]:
        return batch
    kwargs = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        kwargs[f.name] = value[:, :length] if value is not None and value.dim() == 2 else value
    return TrainBatch(**kwargs)


class TorchTrainer:
    """A policy trainer on plain torch: micro-batches, exact accumulation, clipping, AdamW.

    Example:
        >>> from rollart.train import TorchTrainer, TrainerConfig, build_causal_lm, tiny_llama_config
        >>> trainer = TorchTrainer(build_causal_lm(tiny_llama_config()), TrainerConfig(lr=1e-3))
        >>> trainer.version
        0
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: TrainerConfig | None = None,
        reference_model: torch.nn.Module | None = None,
        process_group: Any = None,
        device: str | None = None,
    ) -> None:
        """Take a built model (the scheduler and proxy build the same one from a config).

        Args:
            model: a causal LM whose forward takes `input_ids` and `attention_mask` and returns
                an object with `.logits` (any HF `*ForCausalLM`).
            config: optimizer, step and loss knobs; defaults to `TrainerConfig()`.
            reference_model: frozen model for the KL term, used when a batch carries no
                `reference_log_probs` and `kl_coef > 0`.
            process_group: a torch.distributed group of data-parallel replicas (design D9). Each
                replica gets its shard of the batch; token and sequence counts and then the
                gradients are summed over the group before clipping, so every replica takes the
                step the whole batch would give on one device and the weights stay identical.
            device: where the model, the reference model, every micro-batch and the group's
                reductions live (`cuda:0` under NCCL); None keeps the model where it is. The caller
                resolves it from what Ray assigned (rollart.resource.accelerators, D27).
        """
        self.device = torch.device(device) if device is not None else _model_device(model)
        if device is not None:
            model.to(self.device)
            if reference_model is not None:
                reference_model.to(self.device)
            log.info("trainer model on %s", self.device)
        self.model = model
        self.config = config if config is not None else TrainerConfig()
        self.reference_model = reference_model
        if reference_model is not None:
            reference_model.requires_grad_(False)
            reference_model.eval()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.config.lr,
            betas=self.config.betas,
            eps=self.config.adam_eps,
            weight_decay=self.config.weight_decay,
        )
        self._version = 0
        self.process_group = process_group

    @property
    def version(self) -> int:
        """Optimizer steps taken so far (0 after construction); +1 per train_step."""
        return self._version

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T, V] logits of the policy; the one method a backend overrides."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask.long()).logits

    def compute_log_probs(self, batch: TrainBatch) -> torch.Tensor:
        """Current-policy token log-probs of a batch ([B, T]), without gradients.

        Used for reference log-probs and diagnostics (e.g. the mismatch between the engine's
        behaviour log-probs and the trainer's own).
        """
        # deps: forward_logits, token_log_probs
        with torch.no_grad():
            return token_log_probs(self.forward_logits(batch.input_ids, batch.attention_mask), batch.input_ids)

    def _with_reference(self, batch: TrainBatch) -> TrainBatch:
        if batch.reference_log_probs is not None or self.reference_model is None or self.config.loss.kl_coef == 0:
            return batch
        with torch.no_grad():
            logits = self.reference_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
            reference = token_log_probs(logits, batch.input_ids)
        return dataclasses.replace(batch, reference_log_probs=torch.where(batch.loss_mask, reference, 0.0))

    def accumulate_gradients(self, batch: TrainBatch, num_tokens: float | None = None,
                             num_sequences: int | None = None) -> dict[str, float]:
        """Forward and backward over the micro-batches of `batch`, leaving the sum in `.grad`.

        Each micro-batch's loss is divided by the whole batch's token / sequence counts, so the
        accumulated gradient equals the gradient of the full-batch loss whatever the
        micro-batch size. Does not zero gradients first and does not step. A data-parallel
        replica passes the whole batch's `num_tokens` / `num_sequences` (its shard is a part).

        Returns:
            Additive sums: `loss`, `pg_loss`, `kl_sum`, `entropy_sum`, `clipped_sum`,
            `ratio_sum`, `policy_tokens` and `micro_batches`.
        """
        # deps: forward_logits, policy_loss, TrainBatch.select
        num_tokens = batch.num_policy_tokens if num_tokens is None else num_tokens
        num_sequences = batch.num_sequences if num_sequences is None else num_sequences
        # VAL: VAL_POSITIVE(num_tokens, exc=TrainError)
        check.positive("num_tokens", num_tokens, exc=TrainError)  # generated #153060f7cd
        batch = self._with_reference(batch)
        size = self.config.micro_batch_size
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        for start in range(0, batch.num_sequences, size):
            micro = _trim_padding(batch.select(slice(start, start + size))).to(self.device)
            logits = self.forward_logits(micro.input_ids, micro.attention_mask)
            loss, parts = policy_loss(logits, micro, self.config.loss, num_tokens, num_sequences)
            loss.backward()
            sums["loss"] += float(loss.detach())
            sums["micro_batches"] += 1
            for key, value in parts.items():
                sums[key] += value
        return dict(sums)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step over all micro-batches of `batch`; version += 1 on success.

        A step whose loss is not finite raises before the optimizer moves, so the weights and
        the version stay as they were.

        Returns:
            Metrics: `loss`, `pg_loss`, `kl`, `entropy` (token means), `clip_frac`, `ratio_mean`,
            `grad_norm` (before clipping), `policy_tokens`, `sequences`, `micro_batches`, `lr`
            and the new `version`.
        """
        # deps: accumulate_gradients
        self.optimizer.zero_grad(set_to_none=True)
        if self.process_group is None:
            sums = self.accumulate_gradients(batch)
        else:
            sums = self._data_parallel_gradients(batch)
        num_tokens = sums["policy_tokens"]
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        metrics = {
            "loss": sums["loss"],
            "pg_loss": sums["pg_loss"],
            "kl": sums["kl_sum"] / num_tokens,
            "entropy": sums["entropy_sum"] / num_tokens,
            "clip_frac": sums["clipped_sum"] / num_tokens,
            "ratio_mean": sums["ratio_sum"] / num_tokens,
            "grad_norm": grad_norm,
            "policy_tokens": num_tokens,
            "sequences": float(sums.get("sequences", batch.num_sequences)),
            "micro_batches": sums["micro_batches"],
            "lr": float(self.optimizer.param_groups[0]["lr"]),
        }
        if not math.isfinite(metrics["loss"]):
            self.optimizer.zero_grad(set_to_none=True)
        # AST: AST_POSTCONDITION(math.isfinite(metrics["loss"]), got=metrics["loss"], msg="the step's loss is finite", exc=TrainError)
        check.postcondition(math.isfinite(metrics["loss"]), "the step's loss is finite", got=metrics["loss"], exc=TrainError)  # generated #02aa493e79
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._version += 1
        metrics["version"] = float(self._version)
        log.debug("train step -> version %d: %s", self._version, metrics)
        return metrics

    def _data_parallel_gradients(self, shard: TrainBatch) -> dict[str, float]:
        """Accumulate this replica's shard under the global counts, then sum gradients and metrics over the group."""
        import torch.distributed as dist

        group = self.process_group
        # every reduced tensor on the model's device: NCCL reduces CUDA tensors only (D28)
        counts = torch.tensor([float(shard.num_policy_tokens), float(shard.num_sequences)], dtype=torch.float64,
                              device=self.device)
        dist.all_reduce(counts, group=group)
        sums = self.accumulate_gradients(shard, num_tokens=float(counts[0]), num_sequences=int(counts[1])) \
            if shard.num_sequences > 0 else {}
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
        keys = ("loss", "pg_loss", "kl_sum", "entropy_sum", "clipped_sum", "ratio_sum", "micro_batches")
        totals = torch.tensor([float(sums.get(k, 0.0)) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(totals, group=group)
        out = {k: float(v) for k, v in zip(keys, totals.tolist())}
        out["policy_tokens"] = float(counts[0])
        out["sequences"] = float(counts[1])
        return out

    def named_tensors(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """Detached copies of the weights under HF state_dict names (views of the live weights with `copy=False`).

        Copies, because a publisher may still serialize them while the next step runs; a caller that
        snapshots them itself before the next step (a weight channel's pack does) passes
        `copy=False` and saves a copy into fresh memory per update (rollart-app D40). A tensor
        shared under two names (tied embeddings: `lm_head.weight` aliases
        `model.embed_tokens.weight`) is exported once, under its first name, so the key set
        equals `named_parameters()` plus persistent buffers, the names an engine loads by.
        """
        out: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, tensor in self.model.state_dict().items():
            if tensor.data_ptr() in seen and tensor.numel() > 0:
                continue
            seen.add(tensor.data_ptr())
            out[name] = tensor.detach().clone() if copy else tensor.detach()
        return out

    def save_checkpoint(self, path: str | Path) -> None:
        """Write the directory `path`: model and optimizer tensors as safetensors, the rest as JSON (D19).

        Written into `path.tmp` and swapped in by renames, so a crash mid-save keeps the old checkpoint.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_state(self.model.state_dict(), tmp, "model")
        save_state(self.optimizer.state_dict(), tmp, "optimizer")
        write_json_atomic(tmp / "trainer.json", {"format": CHECKPOINT_FORMATS[-1], "kind": "torch",
                                                 "version": self._version, "config": dataclasses.asdict(self.config)})
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore weights, optimizer state and version written by save_checkpoint; never unpickles."""
        path = Path(path)
        meta_file = path / "trainer.json"
        # AST: AST_PRECONDITION(meta_file.is_file(), got=str(path), msg="a checkpoint directory written by save_checkpoint (with trainer.json)", exc=TrainError)
        check.precondition(meta_file.is_file(), "a checkpoint directory written by save_checkpoint (with trainer.json)", got_lazy=lambda: str(path), exc=TrainError)  # generated #ab62727e59
        state = json.loads(meta_file.read_text())
        checkpoint_format = state.get("format")
        # VAL: VAL_ONE_OF(checkpoint_format, choices=CHECKPOINT_FORMATS, exc=TrainError)
        check.one_of("checkpoint_format", checkpoint_format, CHECKPOINT_FORMATS, exc=TrainError)  # generated #78525886a2
        self.model.load_state_dict(load_state(path, "model"))
        self.optimizer.load_state_dict(load_state(path, "optimizer"))
        self._version = int(state["version"])

    def continue_at(self, version: int) -> None:
        """Number the next step `version + 1` (D22): a trainer rebuilt from an older checkpoint keeps the
        run's version counter, which the buffer's staleness bound and the proxy only let go forward."""
        # VAL: VAL_INT_RANGE(version, min=self._version, max=2**62, exc=TrainError)
        check.int_range("version", version, min=self._version, max=2**62, exc=TrainError)  # generated #572a97feff
        self._version = int(version)
