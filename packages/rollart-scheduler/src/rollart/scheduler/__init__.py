"""rollart.scheduler: The sample buffer with the asynchronous bound, the rollout scheduler, time-sharing, pipeline modes and the `rollart` command.

Modules:

- `rollart.scheduler.buffer`: `SampleBuffer`, the per-trajectory asynchronous bound alpha, group-aware.
- `rollart.scheduler.rollout`: `RolloutScheduler`, EnvManagers with redundancy, suspend/resume, staleness aborts.
- `rollart.scheduler.timesharing`: `TimeSharingController`, `CostAwarePolicy`, `AlwaysShrinkPolicy`.
- `rollart.scheduler.pipeline`: `Pipeline` in the modes `sync`, `one_off`, `async`, `time_sharing`.
- `rollart.scheduler.config`: the YAML run config (pydantic) with errors naming field and allowed values.
- `rollart.scheduler.builder`, `adapters`, `ray_workers`, `tasks`: the wiring of the other packages.
- `rollart.scheduler.cli` (`rollart run`, `rollart timeline`) and `rollart.scheduler.demo` (`make demo`).
"""

__version__ = "0.1.0"
