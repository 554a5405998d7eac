"""What the scheduling library reads of a run's settings, as Protocols (design D45).

Why Protocols and not the run config itself: the YAML schema (`rollart.app.config.RunConfig`)
belongs to the application, which sits above this library; the pipeline and the buffer need six
values of it. Any object with these attributes drives them: the application's pydantic
`RunConfig`, or a few dataclasses in a pipeline composed by hand.
"""

from __future__ import annotations

from typing import Protocol


class PipelineSettings(Protocol):
    """The `pipeline` section: mode, bound, batch and group sizes, deadlines."""

    @property
    def mode(self) -> str:
        """One of `sync`, `one_off`, `async`, `time_sharing`."""
        ...

    @property
    def alpha(self) -> int:
        """The per-trajectory asynchronous bound."""
        ...

    @property
    def batch_size(self) -> int:
        """Trajectories per train step."""
        ...

    @property
    def group_size(self) -> int:
        """Trajectories per prompt group (GRPO)."""
        ...

    @property
    def get_batch_timeout_s(self) -> float:
        """The deadline for one batch."""
        ...

    @property
    def update_timeout_s(self) -> float:
        """The deadline for suspend and the weight update."""
        ...


class RunSettings(Protocol):
    """The `run` section: the run's name (progress line) and how often it checkpoints."""

    @property
    def name(self) -> str:
        """The run's name."""
        ...

    @property
    def checkpoint_every(self) -> int:
        """Iterations between checkpoints."""
        ...


class AdvantageSettings(Protocol):
    """The part of the `trainer` section the pipeline applies when it builds a batch."""

    @property
    def normalize_advantage_std(self) -> bool:
        """False: Dr.GRPO advantages (reward minus the group mean)."""
        ...


class PipelineConfig(Protocol):
    """A run's settings as `Pipeline` and `SampleBuffer.from_config` read them."""

    @property
    def pipeline(self) -> PipelineSettings:
        """Mode, bound, sizes, deadlines."""
        ...

    @property
    def run(self) -> RunSettings:
        """Name and checkpoint cadence."""
        ...

    @property
    def trainer(self) -> AdvantageSettings:
        """Advantage normalisation."""
        ...
