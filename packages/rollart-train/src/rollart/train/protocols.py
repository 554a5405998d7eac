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
    """

    @property
    def version(self) -> int:
        """Number of optimizer steps taken; the weight version published to rollart-sync."""
        ...

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on the batch; returns metrics."""
        ...

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The weights under HF state_dict names, for rollart-sync."""
        ...

    def save_checkpoint(self, path: str | Path) -> None:
        """Write model, optimizer state and version."""
        ...

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what save_checkpoint wrote."""
        ...
