"""The decorators of the programming model (paper Listing 1): register, hw_mapping, register_serverless.

Why decorators that only attach data: a worker class must stay a plain class that Ray can ship and
that runs unchanged in-process; the Cluster reads the attached ``DispatchSpec`` when it binds its
proxies (paper Listing 2, ``_bind_worker_method``). Specs hold plain dicts so the class pickles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rollart import checks as check
from rollart.resource.errors import ResourceError

__all__ = ["DISPATCH_MODES", "DispatchSpec", "ServerlessSpec", "dispatch_spec_of", "hw_mapping", "register",
           "register_serverless"]

F = TypeVar("F", bound=Callable[..., Any])

DISPATCH_MODES: tuple[str, ...] = ("execute_all", "execute_rank0", "dp_split")
"""How ``register`` dispatches: broadcast and gather, the lowest rank only, or split a list across workers."""

ROUTE_MODE = "hw_mapping"
_ATTR = "__rollart_dispatch__"


@dataclass(frozen=True)
class ServerlessSpec:
    """Where a worker's serverless attribute points and how its client retries.

    Attributes:
        attribute: the worker attribute replaced by the client.
        url: the http(s) function endpoint.
        timeout: per-attempt deadline in seconds.
        retries: retries after the first attempt.
        backoff: base of the exponential backoff in seconds.
        headers: sent with every request (e.g. authorization); never written to the store.
    """

    attribute: str
    url: str
    timeout: float
    retries: int
    backoff: float
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class DispatchSpec:
    """How a Cluster proxy calls a worker method; stored on the function by the decorators.

    Attributes:
        mode: one of ``DISPATCH_MODES``, or ``"hw_mapping"`` for routed methods.
        hw_affinity: ``{tag_name: hardware type}`` with a ``"default"`` entry, for routed methods.
        serverless: the endpoint installed on the workers, for serverless methods.
        call_timeout: this method's call deadline in seconds (None: the cluster's ``call_timeout``).
    """

    mode: str
    hw_affinity: Mapping[str, str] | None = None
    serverless: ServerlessSpec | None = None
    call_timeout: float | None = None


def register(mode: str = "execute_all", *, timeout: float | None = None) -> Callable[[F], F]:
    """Mark a worker method for the Cluster proxy with a dispatch mode (paper Listing 1 line 8).

    ``timeout`` is this method's call deadline in seconds (a long training step may need more than the
    cluster's ``call_timeout``, a ping much less); None keeps the cluster's.
    """
    # deps: none
    if timeout is not None:
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
    # VAL: VAL_ONE_OF(mode, choices=DISPATCH_MODES, exc=ResourceError)
    check.one_of("mode", mode, DISPATCH_MODES, exc=ResourceError)  # generated #89b950d2c1

    def decorate(fn: F) -> F:
        setattr(fn, _ATTR, DispatchSpec(mode, call_timeout=None if timeout is None else float(timeout)))
        return fn

    return decorate


def hw_mapping(hw_affinity: Mapping[str, str], *, timeout: float | None = None) -> Callable[[F], F]:
    """Route calls by their tag_name to workers of the preferred hardware, "default" as fallback.

    ``timeout`` is this method's call deadline in seconds; None keeps the cluster's ``call_timeout``.
    """
    # deps: none
    if timeout is not None:
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
    # VAL: VAL_NON_EMPTY(hw_affinity, exc=ResourceError)
    check.non_empty("hw_affinity", hw_affinity, exc=ResourceError)  # generated #2236af1839
    # AST: AST_PRECONDITION("default" in hw_affinity, got=sorted(hw_affinity), msg="hw_affinity has a 'default' entry", exc=ResourceError)
    check.precondition("default" in hw_affinity, "hw_affinity has a 'default' entry", got_lazy=lambda: sorted(hw_affinity), exc=ResourceError)  # generated #7ef9fa7718
    affinity = dict(hw_affinity)

    def decorate(fn: F) -> F:
        setattr(fn, _ATTR, DispatchSpec(ROUTE_MODE, hw_affinity=affinity,
                                        call_timeout=None if timeout is None else float(timeout)))
        return fn

    return decorate


def register_serverless(attribute: str, url: str, *, timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, mode: str = "execute_all", headers: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Replace `attribute` on every worker with a client of the HTTP function at url (paper Listing 1 line 26)."""
    # deps: none
    # VAL: VAL_NON_EMPTY(attribute, exc=ResourceError)
    check.non_empty("attribute", attribute, exc=ResourceError)  # generated #3638195226
    # AST: AST_PRECONDITION(url.startswith(("http://", "https://")), got=url, msg="url is http(s)", exc=ResourceError)
    check.precondition(url.startswith(("http://", "https://")), "url is http(s)", got=url, exc=ResourceError)  # generated #24e60dbe7f
    # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
    check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
    # VAL: VAL_INT_RANGE(retries, min=0, max=100, exc=ResourceError)
    check.int_range("retries", retries, min=0, max=100, exc=ResourceError)  # generated #b572bd3688
    # VAL: VAL_NON_NEGATIVE(backoff, exc=ResourceError)
    check.non_negative("backoff", backoff, exc=ResourceError)  # generated #a46bfb2008
    # VAL: VAL_ONE_OF(mode, choices=DISPATCH_MODES, exc=ResourceError)
    check.one_of("mode", mode, DISPATCH_MODES, exc=ResourceError)  # generated #89b950d2c1
    spec = DispatchSpec(mode, serverless=ServerlessSpec(attribute, url, float(timeout), retries, float(backoff),
                                                        dict(headers) if headers else None))

    def decorate(fn: F) -> F:
        setattr(fn, _ATTR, spec)
        return fn

    return decorate


def dispatch_spec_of(fn: Any) -> DispatchSpec | None:
    """The dispatch spec a decorator put on fn, or None for an undecorated method."""
    # deps: none
    return getattr(fn, _ATTR, None)
