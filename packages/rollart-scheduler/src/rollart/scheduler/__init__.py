"""rollart.scheduler: The sample buffer with the asynchronous bound, the rollout scheduler, time-sharing, pipeline modes and the `rollart` command."""

__version__ = "0.1.0"
