"""`trainer: sim`: a train-step cost model behind the trainer seam, for cluster simulations.

It is a *simulation*, named as such (design D14): no weights, no gradients. A step on a batch of
T real tokens on n devices takes ``6 P T / (n F mfu)`` of compute plus a ring all-reduce of the
gradients, ``2 (n-1)/n x P x grad_bytes / bandwidth``, with F and the bandwidth from the hardware
catalogue of rollart-resource. ``train_step_async`` waits that time with ``asyncio.sleep``, so under
rollart-resource's ``VirtualTimeLoop`` a step of minutes costs microseconds of wall time.

Example:
    ```python
    trainer = SimTrainer(8.2e9, BUILTIN_HARDWARE["H800"], devices=64)
    metrics = await trainer.train_step_async(batch)   # sleeps metrics["step_s"] on the loop's clock
    ```
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollart import checks as check
from rollart.resource.hardware import HardwareSpec
from rollart.train.errors import TrainError
from rollart.train.state_io import write_json_atomic

if TYPE_CHECKING:
    import torch  # a simulation has no tensors but its version token: imported there, not here (D31)

    from rollart.train.batch import TrainBatch


@dataclass(frozen=True)
class TrainStepCost:
    """The modelled time of one train step, split into its parts (seconds)."""

    compute_s: float
    allreduce_s: float
    tokens: int
    devices: int

    @property
    def step_s(self) -> float:
        """compute + all-reduce (not overlapped)."""
        return self.compute_s + self.allreduce_s


def train_step_cost(n_params: float, tokens: int, devices: int, hardware: HardwareSpec, *, mfu: float = 0.4,
                    grad_bytes_per_param: float = 2.0, active_params: float | None = None,
                    forward_passes: int = 0) -> TrainStepCost:
    """(6 + 2 f) P_a T / (n F mfu) plus a ring all-reduce of the gradients over the hardware's collective bandwidth.

    D14; D25: ``forward_passes`` f forward-only passes before the update (old-policy and reference
    log-probs), and P_a the parameters a token goes through (``active_params``: MoE; default all).
    The all-reduce moves the gradients of all ``n_params``."""
    # deps: HardwareSpec.collective_gbps
    # VAL: VAL_POSITIVE(n_params, exc=TrainError)
    check.positive("n_params", n_params, exc=TrainError)  # generated #3b1a3e238f
    # VAL: VAL_INT_RANGE(tokens, min=0, max=1 << 50, exc=TrainError)
    check.int_range("tokens", tokens, min=0, max=1 << 50, exc=TrainError)  # generated #9bb5fc0dda
    # VAL: VAL_INT_RANGE(devices, min=1, max=1 << 20, exc=TrainError)
    check.int_range("devices", devices, min=1, max=1 << 20, exc=TrainError)  # generated #e9bc0cbd5b
    # AST: AST_PRECONDITION(0.0 < mfu <= 1.0, got=mfu, msg="mfu in (0, 1]", exc=TrainError)
    check.precondition(0.0 < mfu <= 1.0, "mfu in (0, 1]", got=mfu, exc=TrainError)  # generated #e4b0c47fe1
    # VAL: VAL_POSITIVE(grad_bytes_per_param, exc=TrainError)
    check.positive("grad_bytes_per_param", grad_bytes_per_param, exc=TrainError)  # generated #6d924f018f
    # VAL: VAL_INT_RANGE(forward_passes, min=0, max=16, exc=TrainError)
    check.int_range("forward_passes", forward_passes, min=0, max=16, exc=TrainError)  # generated #58b3f7c02e
    # AST: AST_PRECONDITION(active_params is None or 0 < active_params <= n_params, got=active_params, msg="active_params in (0, n_params]", exc=TrainError)
    check.precondition(active_params is None or 0 < active_params <= n_params, "active_params in (0, n_params]", got=active_params, exc=TrainError)  # generated #1bcdc3e20c
    active = n_params if active_params is None else active_params
    compute = (6.0 + 2.0 * forward_passes) * active * tokens / (devices * hardware.tflops_bf16 * 1e12 * mfu)
    allreduce = 0.0
    if devices > 1:
        grad_bytes = n_params * grad_bytes_per_param
        allreduce = 2.0 * (devices - 1) / devices * grad_bytes / (hardware.collective_gbps(devices) * 1e9)
    return TrainStepCost(compute, allreduce, tokens, devices)


@runtime_checkable
class AsyncStepTrainer(Protocol):
    """The optional awaitable step a simulated trainer offers (D15)."""

    async def train_step_async(self, batch: TrainBatch) -> dict[str, float]:
        """One step that waits its modelled time on the running loop's clock, then returns its metrics.

        rollart-app's `LocalTrainer` calls it instead of running `train_step` in a thread when the
        trainer has it, so under a virtual-clock loop the step takes virtual, not wall, time. Must
        only `await` (never block the loop); same version and metrics rules as `train_step`.
        """
        ...


class SimTrainer:
    """`trainer: sim`: a train-step cost model with the PolicyTrainer surface and no weights (D14)."""

    def __init__(self, n_params: float, hardware: HardwareSpec, devices: int, *, mfu: float = 0.4,
                 grad_bytes_per_param: float = 2.0, weight_bytes_per_param: float = 2.0, lr: float = 1e-6,
                 version: int = 0, active_params: float | None = None, forward_passes: int = 0) -> None:
        """Check the figures once (a bad one fails here, not at the first step); MoE and forward passes per D25."""
        # deps: train_step_cost
        # VAL: VAL_INT_RANGE(version, min=0, max=2**62, exc=TrainError)
        check.int_range("version", version, min=0, max=2**62, exc=TrainError)  # generated #f5ac0a70a8
        # VAL: VAL_POSITIVE(weight_bytes_per_param, exc=TrainError)
        check.positive("weight_bytes_per_param", weight_bytes_per_param, exc=TrainError)  # generated #696ab961fd
        train_step_cost(n_params, 0, devices, hardware, mfu=mfu, grad_bytes_per_param=grad_bytes_per_param,
                        active_params=active_params, forward_passes=forward_passes)
        self.n_params = n_params
        self.active_params = active_params
        self.forward_passes = forward_passes
        self.hardware = hardware
        self.devices = devices
        self.mfu = mfu
        self.grad_bytes_per_param = grad_bytes_per_param
        self.weight_bytes_per_param = weight_bytes_per_param
        self.lr = lr
        self._version = version

    @property
    def version(self) -> int:
        """Steps taken; the weight version published."""
        return self._version

    @property
    def weight_bytes(self) -> float:
        """Bytes a weight update moves: parameters x bytes per parameter."""
        return self.n_params * self.weight_bytes_per_param

    def step_cost(self, batch: TrainBatch) -> TrainStepCost:
        """The modelled cost of a step on `batch` (its real tokens)."""
        # deps: train_step_cost
        return self.cost_on(int(batch.attention_mask.sum()), self.devices)

    def cost_on(self, tokens: int, devices: int) -> TrainStepCost:
        """The modelled cost of a step of `tokens` real tokens on `devices` devices (this trainer's figures)."""
        # deps: train_step_cost
        return train_step_cost(self.n_params, tokens, devices, self.hardware, mfu=self.mfu,
                               grad_bytes_per_param=self.grad_bytes_per_param, active_params=self.active_params,
                               forward_passes=self.forward_passes)

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """Bookkeeping of one step at once; `step_s` reports the modelled time (no wait)."""
        # deps: SimTrainer.step_cost
        return self._account(batch, self.step_cost(batch))

    def _account(self, batch: TrainBatch, cost: TrainStepCost) -> dict[str, float]:
        self._version += 1
        return {
            "loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "ratio_mean": 0.0,
            "grad_norm": 0.0,  # a simulation does not learn: the torch trainer's keys, zero values
            "policy_tokens": float(batch.loss_mask.sum()),
            "sequences": float(batch.num_sequences),
            "micro_batches": 1.0,
            "lr": self.lr,
            "version": float(self._version),
            "step_s": cost.step_s,
            "compute_s": cost.compute_s,
            "allreduce_s": cost.allreduce_s,
            "tokens": float(cost.tokens),
        }

    async def train_step_async(self, batch: TrainBatch) -> dict[str, float]:
        """Wait the modelled step time on the loop's clock, then the bookkeeping of `train_step`."""
        # deps: SimTrainer.step_cost, SimTrainer.train_step
        cost = self.step_cost(batch)
        await asyncio.sleep(cost.step_s)
        return self._account(batch, cost)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """A version token, not weights: `{"sim.version": tensor([version])}` (for a real channel; SimChannel takes none)."""
        import torch

        return {"sim.version": torch.tensor([self._version], dtype=torch.int64)}

    def save_checkpoint(self, path: str | Path) -> None:
        """Write the directory `path` with `trainer.json` (the version; there are no weights) atomically."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path / "trainer.json", {"kind": "sim", "version": self._version, "n_params": self.n_params})

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the version from `path/trainer.json` (plain JSON, nothing to unpickle)."""
        meta_file = Path(path) / "trainer.json"
        # AST: AST_PRECONDITION(meta_file.is_file(), got=str(path), msg="a checkpoint directory written by save_checkpoint (with trainer.json)", exc=TrainError)
        check.precondition(meta_file.is_file(), "a checkpoint directory written by save_checkpoint (with trainer.json)", got_lazy=lambda: str(path), exc=TrainError)  # generated #ab62727e59
        state = json.loads(meta_file.read_text())
        # AST: AST_PRECONDITION(state.get("kind") == "sim", got=state.get("kind"), msg="a SimTrainer checkpoint", exc=TrainError)
        check.precondition(state.get("kind") == "sim", "a SimTrainer checkpoint", got_lazy=lambda: state.get("kind"), exc=TrainError)  # generated #1a35b540c4
        self._version = int(state["version"])
