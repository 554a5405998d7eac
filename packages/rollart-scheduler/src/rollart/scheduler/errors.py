"""The exceptions of rollart.scheduler: one base class so callers can catch the package's failures."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error this package raises, so callers can catch the package's failures."""


class ConfigError(SchedulerError):
    """A run config is invalid; the message names the field path and the allowed values."""


class SchedulerTimeout(SchedulerError):
    """A wait ran past its deadline; the message says what was waited for and for how long."""
