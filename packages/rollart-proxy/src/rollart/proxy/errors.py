"""The exceptions of rollart.proxy: one base class so callers can catch the package's errors."""

from __future__ import annotations


class ProxyError(ValueError):
    """Bad input or an illegal operation on the proxy, a worker or an engine.

    A ``ValueError`` subclass so that generic input-validation handlers still catch it.
    """


class ProxyTimeoutError(TimeoutError):
    """A wait on the proxy or a worker passed its deadline (every wait in RollArt has one)."""


class WorkerFailedError(RuntimeError):
    """An engine step raised: the worker is FAILED until the proxy restarts or removes it."""


class NoWorkerAvailableError(ProxyError):
    """No active worker can take a request (all removed, offloaded or dead)."""
