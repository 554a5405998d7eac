"""The exceptions of rollart.scheduler: one base class so callers can catch the package's failures."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error this package raises, so callers can catch the package's failures."""


class ConfigError(SchedulerError):
    """A run config is invalid; the message names the field path and the allowed values."""


class SchedulerTimeout(SchedulerError):
    """A wait ran past its deadline; the message says what was waited for and for how long."""


class RunFailed(SchedulerError):
    """A part the run cannot go on without is gone (a rollout pool lost every worker, a trainer actor died
    past its budget); the message is the one line the user sees: what, why, and how to resume."""
