"""The simulated trainer of `rollart sim` (design D22): rollart-train's SimTrainer, elastic under time-sharing.

Why a module of its own: `rollart.app.sim.parts` is imported by the task factory on every
`rollart plan` and `rollart run`, and rollart-train imports torch; only a run whose trainer backend
is `sim` needs this module, and the builder imports it then.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollart.train.batch import TrainSample, validate_train_sample
from rollart.train.sim_trainer import SimTrainer, TrainStepCost


@dataclass(frozen=True)
class TokenCount:
    """A mask's total, where the cost model reads `mask.sum()` of a tensor batch."""

    total: int

    def sum(self) -> int:
        """The number of ones of the mask it stands for."""
        return self.total


@dataclass(frozen=True)
class SimBatch:
    """What a simulated step reads of a batch, without the tensors (D65): the sequences, their real
    tokens (`attention_mask.sum()`) and their policy tokens (`loss_mask.sum()`), the same numbers
    `rollart.train.build_train_batch` would give."""

    num_sequences: int
    attention_mask: TokenCount
    loss_mask: TokenCount


def sim_batch(samples: Sequence[TrainSample]) -> SimBatch:
    """Count the samples' tokens; each sample is checked as `build_train_batch` checks it."""
    # deps: validate_train_sample
    for i, sample in enumerate(samples):
        validate_train_sample(sample, i)
    return SimBatch(num_sequences=len(samples), attention_mask=TokenCount(sum(len(s.token_ids) for s in samples)),
                    loss_mask=TokenCount(sum(sum(s.policy_mask) for s in samples)))


class ElasticSimTrainer(SimTrainer):
    """SimTrainer whose step uses its own devices plus those lent to training right now (time-sharing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As SimTrainer; `lent` is kept by `on_role` (the TimeSharingController's role callback)."""
        super().__init__(*args, **kwargs)
        self.lent: set[int] = set()

    def build_batch(self, samples: Sequence[TrainSample], pad_token_id: int, normalize_advantage_std: bool) -> SimBatch:
        """Token counts, not padded tensors: all a simulated step reads (D65; rollart-scheduler D57)."""
        # deps: sim_batch
        return sim_batch(samples)

    def on_role(self, devices: list[int], role: str) -> None:
        """Devices switched to `train` join the next step's data-parallel world; any other role leaves it."""
        if role == "train":
            self.lent.update(devices)
        else:
            self.lent.difference_update(devices)

    def step_cost(self, batch: Any) -> TrainStepCost:
        """The cost model over `devices + len(lent)` devices."""
        return self.cost_on(int(batch.attention_mask.sum()), self.devices + len(self.lent))
