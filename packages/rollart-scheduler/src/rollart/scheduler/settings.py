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
        """One of `sync`, `one_off`, `async`, `time_sharing` (D5); `Pipeline.step` reads it every iteration."""
        ...

    @property
    def alpha(self) -> int:
        """The per-trajectory asynchronous bound (>= 0; 0 in `sync`, 1 in `one_off`).

        `Pipeline` refuses a buffer whose alpha differs (`ConfigError`); `SampleBuffer.from_config` uses it.
        """
        ...

    @property
    def batch_size(self) -> int:
        """Trajectories per train step; a multiple of `group_size` (the buffer hands out whole groups)."""
        ...

    @property
    def group_size(self) -> int:
        """Trajectories per prompt group (GRPO); `Pipeline` refuses a buffer with another group size."""
        ...

    @property
    def get_batch_timeout_s(self) -> float:
        """Seconds `get_batch` may wait for a full batch (past it the run fails); also bounds a time-sharing step."""
        ...

    @property
    def update_timeout_s(self) -> float:
        """Seconds each of the rollout's suspend and the weight update (`ModelUpdater.model_update`) may take."""
        ...


class RunSettings(Protocol):
    """The `run` section: the run's name (progress line) and how often it checkpoints."""

    @property
    def name(self) -> str:
        """The run's name, shown in the progress line."""
        ...

    @property
    def checkpoint_every(self) -> int:
        """Iterations between checkpoints (>= 1); used only when the parts have a `Checkpointer`."""
        ...


class AdvantageSettings(Protocol):
    """The part of the `trainer` section the pipeline applies when it builds a batch."""

    @property
    def normalize_advantage_std(self) -> bool:
        """True: GRPO advantages over the group's std; False: Dr.GRPO (reward minus the group mean).

        Read for every batch the pipeline builds (`rollart.train.build_train_batch`).
        """
        ...


class PipelineConfig(Protocol):
    """A run's settings as `Pipeline` and `SampleBuffer.from_config` read them.

    Read-only and read as the run goes (not copied at construction), so they must not change during a
    run. With a `Checkpointer` in the parts, `Pipeline` also stores the whole object in each checkpoint
    (`config_identity`), which needs a pydantic model or JSON-serialisable data.
    """

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
