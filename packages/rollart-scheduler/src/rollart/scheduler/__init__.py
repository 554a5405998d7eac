"""rollart.scheduler: the scheduling library: the sample buffer with the asynchronous bound, the rollout scheduler, time-sharing and the pipeline loop.

It composes nothing by itself: it parses no YAML, starts no Ray actor from a config and has no
command line (that is the application, `rollart.app`). A pipeline composed by hand imports only
this library and the packages whose parts it uses.

Modules:

- `rollart.scheduler.buffer`: `SampleBuffer`, the per-trajectory asynchronous bound alpha, group-aware.
- `rollart.scheduler.rollout`: `RolloutScheduler`, EnvManagers with redundancy, suspend/resume, staleness aborts.
- `rollart.scheduler.timesharing`: `TimeSharingController`, `CostAwarePolicy`, `AlwaysShrinkPolicy`.
- `rollart.scheduler.pipeline`: `Pipeline` in the modes `sync`, `one_off`, `async`, `time_sharing`.
- `rollart.scheduler.settings`: the Protocols of what the pipeline reads of a run's settings.
- `rollart.scheduler.scoring`: `ScoringSink`, rewards scored off the EnvManager's path.
- `rollart.scheduler.adapters`: the seams to rollart.proxy, rollart.train and rollart.env.
- `rollart.scheduler.metrics`, `timeline`, `checkpoint`, `progress`: what a pipeline records, saves and shows.
"""

__version__ = "0.1.0"
