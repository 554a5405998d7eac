"""The exceptions of rollart.resource, in one module so every other module (and caller) shares them.

Why one module: validation annotations name these classes with ``exc=``, and callers in other
packages catch them without importing the module that happens to raise them.
"""

from __future__ import annotations


class ResourceError(ValueError):
    """Bad input or a request the ledger's state forbids; a ValueError so generic validation catches it."""


class UnknownHardwareError(ResourceError):
    """A hardware type that the catalogue does not know; the message lists the known types."""


class TransitionInFlight(ResourceError):
    """A second shrink/expand while one is open; the store enforces one open transition at a time."""


class WorkerDiedError(RuntimeError):
    """The runtime lost a worker (process or actor died); raised by WorkerRuntime.call."""


class WorkerFailedError(RuntimeError):
    """A cluster call hit a dead worker; says whether the worker was restarted or removed."""

    def __init__(self, owner: str, rank: int, action: str, cause: BaseException | None = None) -> None:
        """Keep owner, rank and the repair action so the caller can decide to retry."""
        # deps: none
        super().__init__(f"worker {owner}/{rank} died and was {action}" + (f": {cause!r}" if cause else ""))
        self.owner = owner
        self.rank = rank
        self.action = action
        self.cause = cause


class ServerlessError(RuntimeError):
    """A serverless endpoint failed after all retries, or answered with a client error."""

    def __init__(self, url: str, attempts: int, detail: str) -> None:
        """Name the endpoint and the attempts so the message says what was tried."""
        # deps: none
        super().__init__(f"serverless endpoint {url} failed after {attempts} attempt(s): {detail}")
        self.url = url
        self.attempts = attempts
        self.detail = detail


class PlacementTimeout(TimeoutError):
    """A placement group or worker did not become ready before its deadline."""


class CallTimeout(TimeoutError):
    """A worker call did not return before its deadline; names the method, the worker and the deadline."""

    def __init__(self, owner: str, rank: int, method: str, timeout: float) -> None:
        """Keep what was called on whom and the deadline it missed, so the caller can decide what to do."""
        # deps: none
        super().__init__(f"worker {owner}/{rank}: call {method!r} did not return within its deadline of "
                         f"{timeout:g} s (raise it per call with rollart_timeout=, per method with "
                         f"register(timeout=) or per cluster with Cluster.create(call_timeout=))")
        self.owner = owner
        self.rank = rank
        self.method = method
        self.timeout = timeout
