"""Routing policies: which worker serves a request.

The default follows the paper (Listing 1): hardware affinity by the request's tag first (a
``{"FrozenLake": "H800", "default": "H20"}`` map), then least outstanding tokens among workers with
room, with trajectory stickiness so the next turn of a trajectory hits that worker's prefix cache.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rollart import checks as check
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
        """Pick a worker for ``request`` among the routable ``workers``, or None to make it wait.

        Called by ``LLMProxy`` synchronously on the event loop for every routing attempt: when a
        request arrives and again each time one it handed back (migration, a failed worker) looks
        for a new worker. ``workers`` are the active workers (not the one a migrated request just
        left, while another is active); ``sticky_rank`` is the rank this trajectory's previous
        request used (None after a migration), so a policy can reuse that worker's prefix cache.

        Returns the ``rank`` of one of ``workers``, or None for back-pressure: the request waits
        for the next change (a request ends, a worker comes back) and asks again, until its
        deadline. Must be quick and must not block or await; it may keep its own state.
        """
        ...


def _sticky_or_least_loaded(room: Sequence[WorkerView], sticky_rank: int | None) -> int | None:
    """The sticky worker if it has room, else the least (tokens, inflight, rank); None if no room."""
    if not room:
        return None
    if sticky_rank is not None and any(w.rank == sticky_rank for w in room):
        return sticky_rank
    return min(room, key=lambda w: (w.outstanding_tokens, w.inflight, w.rank)).rank


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
            check.one_of("tag", tag, allowed, exc=ProxyError)  # generated #901bd4a56e
            pass
        return self.affinity.get(tag, self.affinity.get("default"))

    def choose(self, request: GenerateRequest, workers: Sequence[WorkerView], sticky_rank: int | None) -> int | None:
        """Preferred hardware if any such worker is routable (else any); then sticky; then least loaded."""
        hardware = self.hardware_for(request.tag)
        pool = [w for w in workers if hardware is None or w.hardware == hardware] or list(workers)
        return _sticky_or_least_loaded([w for w in pool if w.inflight < w.capacity], sticky_rank)

    def choose_indexed(self, request: GenerateRequest, index: LoadIndex, sticky_rank: int | None, exclude: int | None) -> int | None:
        """The decision of ``choose`` over every active worker, in O(log n) from the index (D16).

        ``exclude`` (the worker a migrated request left) is skipped only while another worker is
        active, as the proxy filters views; the preferred hardware counts as present while an active
        worker of it remains after that filter.
        """
        # deps: AffinityRouter.hardware_for, LoadIndex.least_loaded, LoadIndex.active_count
        if exclude is not None and not (index.is_active(exclude) and index.active_count(None) > 1):
            exclude = None
        hardware = self.hardware_for(request.tag)
        key: str | None = None
        if hardware is not None:
            present = index.active_count(hardware) - (1 if exclude is not None and index.hardware_of(exclude) == hardware else 0)
            key = hardware if present > 0 else None
        if (sticky_rank is not None and sticky_rank != exclude and index.routable(sticky_rank)
                and (key is None or index.hardware_of(sticky_rank) == key)):
            return sticky_rank
        return index.least_loaded(key, exclude)


class SoftAffinityRouter(AffinityRouter):
    """Soft affinity (D51): the preferred hardware while one of its workers has room, else spill.

    Why: with hard affinity a request waits for its preferred hardware even while workers of the
    other hardware sit idle; at the paper's proportions (Fig 11a: 8 H800 + 3 H20) the decode-heavy
    half queues on 3 H20 and the H800s wait. Here the preferred hardware is saturated exactly when
    none of its active workers is below ``max_inflight_per_worker`` (the proxy's queue depth), and
    only then does a request go to the least-loaded worker with room of any hardware; no constant
    of its own. The decision stays O(log n) from the index (D16).
    """

    def choose(self, request: GenerateRequest, workers: Sequence[WorkerView], sticky_rank: int | None) -> int | None:
        """``AffinityRouter.choose``, but a full preferred hardware spills to any worker with room."""
        rank = super().choose(request, workers, sticky_rank)
        if rank is not None:
            return rank
        return _sticky_or_least_loaded([w for w in workers if w.inflight < w.capacity], sticky_rank)

    def choose_indexed(self, request: GenerateRequest, index: LoadIndex, sticky_rank: int | None, exclude: int | None) -> int | None:
        """The decision of ``choose`` over every active worker, in O(log n) from the index (D16, D51)."""
        # deps: AffinityRouter.choose_indexed, LoadIndex.least_loaded, LoadIndex.routable
        rank = super().choose_indexed(request, index, sticky_rank, exclude)
        if rank is not None:
            return rank
        if exclude is not None and not (index.is_active(exclude) and index.active_count(None) > 1):
            exclude = None
        if sticky_rank is not None and sticky_rank != exclude and index.routable(sticky_rank):
            return sticky_rank
        return index.least_loaded(None, exclude)


ROUTING_POLICIES = ("hard", "soft")


def make_router(policy: str, affinity: Mapping[str, str] | None) -> AffinityRouter:
    """The router of a routing policy by name: ``hard`` (wait for the preferred hardware) or ``soft`` (D51)."""
    # VAL: VAL_ONE_OF(policy, choices=ROUTING_POLICIES, exc=ProxyError)
    check.one_of("policy", policy, ROUTING_POLICIES, exc=ProxyError)  # generated #8130cf6397
    if policy == "soft":
        return SoftAffinityRouter(affinity)
    return AffinityRouter(affinity)


class LoadIndex:
    """Per-hardware heaps of routable workers by load, with lazy invalidation (D16).

    Why: a decision over views of every worker is O(n) per request; here an update and a decision
    are O(log n) amortised. An entry ``(tokens, inflight, rank, stamp)`` is current while ``stamp``
    equals the worker's stamp; every update pushes a fresh entry and bumps the stamp, and stale
    entries are dropped when they reach a heap's top. A heap with more than twice its live entries
    (plus 64) is rebuilt, so memory stays O(n).
    """

    def __init__(self, capacity: int) -> None:
        """``capacity``: in-flight requests per worker above which a worker is not routable."""
        # VAL: VAL_INT_RANGE(capacity, min=1, max=1 << 20, exc=ProxyError)
        check.int_range("capacity", capacity, min=1, max=1 << 20, exc=ProxyError)  # generated #bd75ed5953
        self.capacity = capacity
        self._state: dict[int, tuple[str, bool, int, int, int]] = {}  # rank -> (hw, active, inflight, tokens, stamp)
        self._heaps: dict[str | None, list[tuple[int, int, int, int]]] = {None: []}
        self._live: dict[str | None, int] = {None: 0}
        self._active: dict[str | None, int] = {None: 0}

    def update(self, rank: int, hardware: str, active: bool, inflight: int, tokens: int) -> None:
        """Record a worker's state and load; O(log n)."""
        old = self._state.get(rank)
        stamp = 0
        if old is not None:
            old_hw, old_active, old_inflight, _, stamp = old
            if old_active:
                self._active[None] -= 1
                self._active[old_hw] -= 1
                if old_inflight < self.capacity:
                    self._live[None] -= 1
                    self._live[old_hw] -= 1
        stamp += 1
        self._state[rank] = (hardware, active, inflight, tokens, stamp)
        if hardware not in self._heaps:
            self._heaps[hardware], self._live[hardware], self._active[hardware] = [], 0, 0
        if active:
            self._active[None] += 1
            self._active[hardware] += 1
            if inflight < self.capacity:
                entry = (tokens, inflight, rank, stamp)
                for key in (None, hardware):
                    self._live[key] += 1
                    heap = self._heaps[key]
                    heapq.heappush(heap, entry)
                    if len(heap) > 2 * self._live[key] + 64:
                        self._rebuild(key)

    def _rebuild(self, key: str | None) -> None:
        heap = [e for e in self._heaps[key] if self._current(e)]
        heapq.heapify(heap)
        self._heaps[key] = heap

    def _current(self, entry: tuple[int, int, int, int]) -> bool:
        return self._state[entry[2]][4] == entry[3]

    def active_count(self, hardware: str | None) -> int:
        """Active workers of a hardware type (None: of every type)."""
        return self._active.get(hardware, 0)

    def hardware_of(self, rank: int) -> str | None:
        """The hardware a worker was last recorded with (None if never)."""
        state = self._state.get(rank)
        return state[0] if state is not None else None

    def is_active(self, rank: int) -> bool:
        """Whether a worker is active (routable or full)."""
        state = self._state.get(rank)
        return state is not None and state[1]

    def routable(self, rank: int) -> bool:
        """Whether a worker is active and below capacity."""
        state = self._state.get(rank)
        return state is not None and state[1] and state[2] < self.capacity

    def least_loaded(self, hardware: str | None, exclude: int | None) -> int | None:
        """The routable worker of least (tokens, inflight, rank) of a type (None: any), skipping ``exclude``."""
        heap = self._heaps.get(hardware)
        if not heap:
            return None
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)
        if not heap:
            return None
        if heap[0][2] != exclude:
            return heap[0][2]
        top = heapq.heappop(heap)  # the excluded worker: look one further, then put it back
        while heap and not self._current(heap[0]):
            heapq.heappop(heap)
        best = heap[0][2] if heap else None
        heapq.heappush(heap, top)
        return best
