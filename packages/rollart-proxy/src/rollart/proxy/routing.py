"""Routing policies: which worker serves a request.

The default follows the paper (Listing 1): hardware affinity by the request's tag first (a
``{"FrozenLake": "H800", "default": "H20"}`` map), then least outstanding tokens among workers with
room, with trajectory stickiness so the next turn of a trajectory hits that worker's prefix cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rollart.proxy.errors import ProxyError
from rollart.proxy.types import GenerateRequest


@dataclass(frozen=True)
class WorkerView:
    """What a routing policy sees of one routable worker."""

    rank: int
    hardware: str
    inflight: int
    outstanding_tokens: int
    capacity: int


class RoutingPolicy(Protocol):
    """Pluggable routing: return a rank, or None to wait (back-pressure)."""

    def choose(self, request: GenerateRequest, workers: Sequence[WorkerView], sticky_rank: int | None) -> int | None:
        """Pick a worker for ``request`` among the routable ``workers``."""
        ...


class AffinityRouter:
    """Hardware affinity by tag, then stickiness, then least outstanding tokens."""

    def __init__(self, affinity: Mapping[str, str] | None = None) -> None:
        """``affinity`` maps a tag to a hardware name; the key ``"default"`` covers other tags."""
        self.affinity = dict(affinity or {})

    def hardware_for(self, tag: str) -> str | None:
        """The preferred hardware of a tag (None when there is no affinity map)."""
        if not self.affinity:
            return None
        allowed = set(self.affinity)
        if "default" not in allowed:
            # VAL: VAL_ONE_OF(tag, choices=allowed, exc=ProxyError)
            # >>> generated VAL_ONE_OF #690959183c (edit the annotation, not this block)
            if tag not in allowed:
                raise ProxyError(f"tag must be one of {sorted(allowed, key=repr)!r}, got {tag!r}")
            # <<< generated
            pass
        return self.affinity.get(tag, self.affinity.get("default"))

    def choose(self, request: GenerateRequest, workers: Sequence[WorkerView], sticky_rank: int | None) -> int | None:
        """Preferred hardware if any such worker is routable (else any); then sticky; then least loaded."""
        hardware = self.hardware_for(request.tag)
        pool = [w for w in workers if hardware is None or w.hardware == hardware] or list(workers)
        room = [w for w in pool if w.inflight < w.capacity]
        if not room:
            return None
        if sticky_rank is not None and any(w.rank == sticky_rank for w in room):
            return sticky_rank
        return min(room, key=lambda w: (w.outstanding_tokens, w.inflight, w.rank)).rank
