"""The exceptions of rollart.sync: one base class, so callers can catch every sync failure at once."""

from __future__ import annotations


class SyncError(Exception):
    """Base class of every error raised by rollart.sync."""


class SyncValidationError(SyncError, ValueError):
    """An argument is outside what the API accepts (raised by the generated validation blocks)."""


class ChecksumMismatchError(SyncError):
    """A received bucket does not match the checksum in its manifest: a torn or corrupt transfer."""


class StaleVersionError(SyncError):
    """A version is not newer than the one already published or held; versions never go backwards."""


class VersionNotAvailableError(SyncError):
    """The requested version was never published or has already been garbage-collected."""


class SyncTimeoutError(SyncError, TimeoutError):
    """A wait ran past its deadline (every wait in rollart.sync has one)."""


class ChannelClosedError(SyncError):
    """The channel was closed; no publish or fetch may start on it."""
