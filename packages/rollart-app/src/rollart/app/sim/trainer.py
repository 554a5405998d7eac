"""The simulated trainer of `rollart sim` (design D22): rollart-train's SimTrainer, elastic under time-sharing.

Why a module of its own: `rollart.app.sim.parts` is imported by the task factory on every
`rollart plan` and `rollart run`, and rollart-train imports torch; only a run whose trainer backend
is `sim` needs this module, and the builder imports it then.
"""

from __future__ import annotations

from typing import Any

from rollart.train.sim_trainer import SimTrainer, TrainStepCost


class ElasticSimTrainer(SimTrainer):
    """SimTrainer whose step uses its own devices plus those lent to training right now (time-sharing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As SimTrainer; `lent` is kept by `on_role` (the TimeSharingController's role callback)."""
        super().__init__(*args, **kwargs)
        self.lent: set[int] = set()

    def on_role(self, devices: list[int], role: str) -> None:
        """Devices switched to `train` join the next step's data-parallel world; any other role leaves it."""
        if role == "train":
            self.lent.update(devices)
        else:
            self.lent.difference_update(devices)

    def step_cost(self, batch: Any) -> TrainStepCost:
        """The cost model over `devices + len(lent)` devices."""
        return self.cost_on(int(batch.attention_mask.sum()), self.devices + len(self.lent))
