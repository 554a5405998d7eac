"""The seam the scheduler types against: what any rollart trainer offers."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from rollart.train.batch import TrainBatch


@runtime_checkable
class PolicyTrainer(Protocol):
    """What the scheduler needs from a trainer: a step, a versioned weight export, checkpoints.

    `named_tensors()` and `version` are the pair rollart-sync publishes: names are the HF model's
    `state_dict` names so every engine loads them by name, and the version grows by one per step.

    The methods are synchronous and may take seconds: rollart-app's `LocalTrainer` and trainer
    actors run them in a worker thread, one at a time, so they need no locking of their own.
    """

    @property
    def version(self) -> int:
        """Number of optimizer steps taken; the weight version published to rollart-sync.

        Starts at the constructor's version (0 by default), grows by exactly one per successful
        `train_step` and is set by `load_checkpoint`; never goes back otherwise.
        """
        ...

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on the batch (PPO-clip on its GRPO advantages); returns metrics.

        Called once per pipeline iteration (per data-parallel replica, on its shard). Returns at
        least `loss` and the new `version`; a step that cannot finish (a non-finite loss) raises
        `TrainError` before the optimizer moves, leaving weights and version unchanged.
        """
        ...

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The weights under HF state_dict names, for rollart-sync.

        Called after a step, before the weight update publishes them. The tensors must not change
        under the caller: return copies, or views only when the caller snapshots them before the
        next `train_step` (a channel's pack does, rollart-app D40). Tied weights appear once.
        """
        ...

    def save_checkpoint(self, path: str | Path) -> None:
        """Write model, optimizer state and version into the directory `path` (safetensors + JSON, D19).

        Called between steps by the pipeline's checkpoints; must never leave a half-written
        checkpoint at `path` (a crash keeps the previous one) and must not pickle.
        """
        ...

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what save_checkpoint wrote, `version` included; never unpickles.

        Called before the first step of a resumed run. A directory save_checkpoint did not write,
        or of an unknown format, raises `TrainError` naming it.
        """
        ...
