"""LLMProxy: the gateway between generation clients and a fleet of inference workers.

Every ``generate`` call is one coroutine that owns its request until it answers, exactly once.
A worker may hand the request back (``migrated`` on shrink, rebalance or offload;
``worker_failed`` on a crash) with the tokens generated so far; the coroutine then resubmits the
continuation elsewhere, so the new worker only recomputes the KV (ROLL regenerates the turn; we
keep the tokens and their log-probs).

Failure handling (design D22-D24): a failed worker is restarted on its device within a restart
budget (``max_restarts`` per ``restart_window_s``, with exponential backoff between restarts of a
slot); beyond it the worker is removed and, when the proxy has a ``worker_factory``, replaced in
the background (rate-limited by the same budget). A periodic health check probes idle workers so a
dead one is found before a request lands on it. When no worker can ever serve again (every slot
removed, no restart, shrink or replacement under way) a request fails at once with
``NoWorkerAvailableError`` instead of waiting out its deadline. Failed restarts and replacements
are logged on the ``rollart.proxy.proxy`` logger.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rollart import checks as check
from rollart.proxy.errors import NoWorkerAvailableError, ProxyError, ProxyTimeoutError, WorkerFailedError
from rollart.proxy.routing import AffinityRouter, LoadIndex, RoutingPolicy, WorkerView
from rollart.proxy.types import (
    FINAL_REASONS,
    FINISH_ABORT,
    FINISH_MIGRATED,
    FINISH_WORKER_FAILED,
    EngineOutput,
    EngineRequest,
    GenerateRequest,
    GenerateResponse,
)
from rollart.proxy.weight_identity import same_payload, weights_digest
from rollart.proxy.worker import WorkerHandle

if TYPE_CHECKING:
    import torch

ACTIVE, DRAINING, OFFLOADED, REMOVED = "active", "draining", "offloaded", "removed"
EventHook = Callable[[str, dict[str, Any]], None]
WorkerFactory = Callable[[int], Awaitable[WorkerHandle]]
"""Builds and starts a fresh worker for a rank whose worker was removed (its devices may differ)."""

logger = logging.getLogger(__name__)


class WeightSource(Protocol):
    """Where ``update_weights`` gets a version's tensors (rollart-sync implements it)."""

    async def fetch(self, version: int) -> Mapping[str, torch.Tensor]:
        """The named tensors of exactly ``version`` (not merely the newest), by the names engines load.

        Called once per ``LLMProxy.update_weights(source, version)``, before any worker is touched,
        so an exception fails the update with nothing loaded. The proxy hands the mapping to every
        active worker and keeps it for workers that come back later (expand, restart), so it must
        stay unchanged until a newer version is pushed.
        """
        ...


class _Inflight(dict[str, int]):
    """request id -> outstanding tokens, keeping its token total and reporting every change (D16)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = 0
        self.on_change: Callable[[], None] | None = None

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def __setitem__(self, key: str, value: int) -> None:
        self.tokens += value - self.get(key, 0)
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        self.tokens -= self[key]
        super().__delitem__(key)
        self._changed()

    def pop(self, key: str, *default: Any) -> Any:  # type: ignore[override]
        if key not in self:
            return super().pop(key, *default)
        value = super().pop(key)
        self.tokens -= value
        self._changed()
        return value

    def clear(self) -> None:
        super().clear()
        self.tokens = 0
        self._changed()


@dataclass
class WorkerSlot:
    """The proxy's record of one worker: routing state, restarts, and what it has in flight.

    Assigning ``state`` and changing ``inflight`` report to the proxy's routing index (D16), so no
    code path that changes a slot has to remember the index.
    """

    rank: int
    handle: WorkerHandle
    state: str = ACTIVE
    version: int = 0
    restarts: int = 0
    incarnation: int = 0
    inflight: dict[str, int] = field(default_factory=_Inflight)  # request id -> outstanding tokens
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    restart_times: list[float] = field(default_factory=list)  # loop times of restarts in the budget window
    replacement_times: list[float] = field(default_factory=list)  # loop times of replacement attempts
    replacing: bool = False  # a replacement worker is being built right now

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name == "state" and (hook := self.__dict__.get("_on_change")) is not None:
            hook()

    def watch(self, index: LoadIndex) -> None:
        """Keep ``index`` current with this slot's state and load from now on."""
        inflight = self.inflight if isinstance(self.inflight, _Inflight) else _Inflight()
        if inflight is not self.inflight:
            for key, value in self.inflight.items():
                inflight[key] = value
            object.__setattr__(self, "inflight", inflight)

        def report() -> None:
            index.update(self.rank, self.handle.hardware, self.state == ACTIVE, len(inflight), inflight.tokens)

        inflight.on_change = report
        object.__setattr__(self, "_on_change", report)
        report()

    @property
    def devices(self) -> tuple[int, ...]:
        """The devices this worker holds."""
        return tuple(self.handle.devices)


@dataclass
class _Track:
    request: GenerateRequest
    engine_request: EngineRequest
    slot: WorkerSlot | None = None
    abort_reason: str | None = None
    worker_ids: list[str] = field(default_factory=list)
    failure: str = ""  # the last worker failure this request saw (the cause in the worker_failed event)
    waiter: _Waiter | None = None  # while it waits for a worker with room (back-pressure, D54)


@dataclass
class _Waiter:
    """A request waiting for a worker (D54): the proxy resolves ``future`` with the slot it routed the
    request to (already counted in the slot's in-flight), or None to make it look again itself."""

    track: _Track
    exclude: int | None
    future: asyncio.Future[WorkerSlot | None]


def validate_request(request: GenerateRequest, router: RoutingPolicy) -> None:
    """Reject bad input before it reaches a worker, naming the field, the value and what is allowed."""
    params = request.params
    # VAL: VAL_NON_EMPTY(request.prompt_ids, exc=ProxyError)
    check.non_empty("request.prompt_ids", request.prompt_ids, exc=ProxyError)  # generated #1d2562ad28
    # VAL: VAL_INT_RANGE(request.prompt_ids, min=0, max=1 << 31, each=True, exc=ProxyError)
    check.int_range_each("request.prompt_ids", request.prompt_ids, min=0, max=1 << 31, exc=ProxyError)  # generated #a586c0b2b6
    # VAL: VAL_INT_RANGE(params.max_tokens, min=1, max=1 << 20, exc=ProxyError)
    check.int_range("params.max_tokens", params.max_tokens, min=1, max=1 << 20, exc=ProxyError)  # generated #ddd0538e77
    # VAL: VAL_NON_NEGATIVE(params.temperature, exc=ProxyError)
    check.non_negative("params.temperature", params.temperature, exc=ProxyError)  # generated #3ec12291f9
    # VAL: VAL_POSITIVE(params.top_p, exc=ProxyError)
    check.positive("params.top_p", params.top_p, exc=ProxyError)  # generated #1681d97df7
    # VAL: VAL_INT_RANGE(params.top_k, min=0, max=1 << 31, exc=ProxyError)
    check.int_range("params.top_k", params.top_k, min=0, max=1 << 31, exc=ProxyError)  # generated #9e81414139
    # VAL: VAL_INT_RANGE(params.stop_token_ids, min=0, max=1 << 31, each=True, exc=ProxyError)
    check.int_range_each("params.stop_token_ids", params.stop_token_ids, min=0, max=1 << 31, exc=ProxyError)  # generated #cdcb5553fc
    # AST: AST_PRECONDITION(params.top_p <= 1.0, got=params.top_p, msg="params.top_p <= 1", exc=ProxyError)
    check.precondition(params.top_p <= 1.0, "params.top_p <= 1", got=params.top_p, exc=ProxyError)  # generated #242ac042f4
    if isinstance(router, AffinityRouter):
        router.hardware_for(request.tag)  # raises on an unknown tag without a default


class LLMProxy:
    """Routes generation requests to workers; suspend/resume, weight updates, shrink/expand, failures."""

    def __init__(
        self,
        workers: Sequence[WorkerHandle],
        *,
        affinity: Mapping[str, str] | None = None,
        router: RoutingPolicy | None = None,
        max_inflight_per_worker: int = 64,
        request_timeout_s: float = 600.0,
        max_restarts: int = 1,
        version: int = 0,
        on_event: EventHook | None = None,
        restart_window_s: float = 600.0,
        restart_backoff_s: float = 1.0,
        restart_backoff_max_s: float = 60.0,
        worker_factory: WorkerFactory | None = None,
        health_check_interval_s: float | None = 5.0,
        health_check_timeout_s: float = 10.0,
    ) -> None:
        """Wrap started workers; rank i is ``workers[i]`` (or its replacement) for the life of the proxy.

        ``max_restarts`` restarts per worker within any ``restart_window_s``, the k-th of them after
        ``restart_backoff_s * 2**(k-2)`` s (capped by ``restart_backoff_max_s``; the first is immediate);
        ``worker_factory(rank)`` replaces a removed worker; ``health_check_interval_s`` (None: off) probes
        the active workers, each probe bounded by ``health_check_timeout_s``.
        """
        # VAL: VAL_NON_EMPTY(workers, exc=ProxyError)
        check.non_empty("workers", workers, exc=ProxyError)  # generated #e7f9a85c95
        # VAL: VAL_UNIQUE([w.worker_id for w in workers], name="worker_id of workers", exc=ProxyError)
        check.unique("worker_id of workers", [w.worker_id for w in workers], exc=ProxyError)  # generated #92d00b353c
        # VAL: VAL_INT_RANGE(max_inflight_per_worker, min=1, max=1 << 20, exc=ProxyError)
        check.int_range("max_inflight_per_worker", max_inflight_per_worker, min=1, max=1 << 20, exc=ProxyError)  # generated #01201aac44
        # VAL: VAL_TIMEOUT(request_timeout_s, exc=ProxyError)
        check.timeout("request_timeout_s", request_timeout_s, exc=ProxyError)  # generated #3e2edac7a9
        # VAL: VAL_INT_RANGE(max_restarts, min=0, max=100, exc=ProxyError)
        check.int_range("max_restarts", max_restarts, min=0, max=100, exc=ProxyError)  # generated #b77da567c2
        # VAL: VAL_TIMEOUT(restart_window_s, exc=ProxyError)
        check.timeout("restart_window_s", restart_window_s, exc=ProxyError)  # generated #5f7a5d1b5e
        # VAL: VAL_NON_NEGATIVE(restart_backoff_s, exc=ProxyError)
        check.non_negative("restart_backoff_s", restart_backoff_s, exc=ProxyError)  # generated #9d60a0e2bd
        # VAL: VAL_NON_NEGATIVE(restart_backoff_max_s, exc=ProxyError)
        check.non_negative("restart_backoff_max_s", restart_backoff_max_s, exc=ProxyError)  # generated #1070eb14ed
        # VAL: VAL_TIMEOUT(health_check_timeout_s, exc=ProxyError)
        check.timeout("health_check_timeout_s", health_check_timeout_s, exc=ProxyError)  # generated #00b5882b1a
        if health_check_interval_s is not None:
            # VAL: VAL_TIMEOUT(health_check_interval_s, exc=ProxyError)
            check.timeout("health_check_interval_s", health_check_interval_s, exc=ProxyError)  # generated #1504daa75e
        self._slots = [WorkerSlot(rank, handle, version=version) for rank, handle in enumerate(workers)]
        self._router: RoutingPolicy = router if router is not None else AffinityRouter(affinity)
        self._capacity = max_inflight_per_worker
        self._index = LoadIndex(max_inflight_per_worker)
        for slot in self._slots:
            slot.watch(self._index)
        self._timeout = request_timeout_s
        self._max_restarts = max_restarts
        self._version = version
        self._latest_weights: Mapping[str, torch.Tensor] | None = None
        self._latest_digest: str | None = None  # digest of the payload pushed under self._version
        self._tracks: dict[str, _Track] = {}
        self._by_trajectory: dict[str, dict[str, _Track]] = {}  # trajectory id -> its in-flight tracks (D31)
        self._sticky: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._waiters: deque[_Waiter] = deque()  # requests waiting for a worker with room, oldest first (D54)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._closed = False
        self._control = asyncio.Lock()
        self._ids = itertools.count()
        self._on_event = on_event
        self._restart_window = float(restart_window_s)
        self._backoff = float(restart_backoff_s)
        self._backoff_max = float(restart_backoff_max_s)
        self._worker_factory = worker_factory
        self._health_interval = health_check_interval_s
        self._health_timeout = float(health_check_timeout_s)
        self._monitor: asyncio.Task | None = None
        self._replacements: dict[int, asyncio.Task] = {}
        self._background: set[asyncio.Task] = set()  # failure handling started by control calls (D40)
        self._failing: dict[tuple[int, int], asyncio.Task] = {}  # (rank, incarnation) -> its failure task (D53)
        self.counters = {"submitted": 0, "finished": 0, "aborted": 0, "migrated": 0, "failures": 0, "removed": 0,
                         "replaced": 0}
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # built outside a loop: the health check starts with the first request
            pass
        else:
            self._ensure_monitor()

    # ---- views ----------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The latest weight version the proxy has pushed."""
        return self._version

    @property
    def slots(self) -> tuple[WorkerSlot, ...]:
        """Every worker's record, by rank."""
        return tuple(self._slots)

    def active_ranks(self) -> list[int]:
        """Ranks that receive new requests."""
        return [s.rank for s in self._slots if s.state == ACTIVE]

    def inflight_count(self) -> int:
        """Requests accepted and not yet answered."""
        return len(self._tracks)

    def _emit(self, kind: str, **data: Any) -> None:
        logger.debug("%s %s", kind, data)
        if self._on_event is not None:
            self._on_event(kind, data)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        if self._waiters:
            self._dispatch()

    def _dispatch(self) -> None:
        """Hand the room a change made to the waiting requests, oldest first (D54).

        Each waiter the router now places is routed here and its slot counted, so one freed place wakes
        one request, not every waiting one (they used to wake on every change, each to find the place
        taken: O(waiting) tasks and timers per answered request). With the built-in routers nothing can
        be placed while no worker is below capacity, so that case costs O(1); a custom router is asked
        for every waiter. While no worker is active every waiter looks again itself (it raises when none
        can come back)."""
        indexed = isinstance(self._router, AffinityRouter)
        if self._index.active_count(None) == 0:
            if not self._can_recover():
                while self._waiters:
                    self._wake(self._waiters.popleft(), None)
            return
        kept: deque[_Waiter] = deque()
        waiters = self._waiters
        while waiters:
            if indexed and self._index.least_loaded(None, None) is None:
                break  # every worker is full: nobody can be placed
            waiter = waiters.popleft()
            if waiter.future.done():
                continue
            rank = self._route(waiter.track, waiter.exclude)
            if rank is None:
                kept.append(waiter)
            else:
                self._wake(waiter, self._assign(waiter.track, rank))
        kept.extend(waiters)
        self._waiters = kept

    @staticmethod
    def _wake(waiter: _Waiter, slot: WorkerSlot | None) -> None:
        waiter.track.waiter = None
        if not waiter.future.done():
            waiter.future.set_result(slot)

    def _unwait(self, track: _Track) -> None:
        """Wake a waiting request to look again itself (it was aborted, or the proxy closed)."""
        waiter = track.waiter
        if waiter is not None:
            self._wake(waiter, None)
            self._waiters.remove(waiter)

    # ---- generate -------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest, timeout_s: float | None = None) -> GenerateResponse:
        """Answer one request exactly once: finished (stop/length) or aborted with a reason."""
        if self._closed:
            raise ProxyError("the proxy is closed; create a new LLMProxy to generate again")
        self._ensure_monitor()
        validate_request(request, self._router)
        timeout = self._timeout if timeout_s is None else timeout_s
        # VAL: VAL_TIMEOUT(timeout, exc=ProxyError)
        check.timeout("timeout", timeout, exc=ProxyError)  # generated #4f5b036b6f
        request_id = request.request_id or f"req-{next(self._ids)}"
        # AST: AST_PRECONDITION(request_id not in self._tracks, got=request_id, msg="request id not in flight", exc=ProxyError)
        check.precondition(request_id not in self._tracks, "request id not in flight", got=request_id, exc=ProxyError)  # generated #bcb6e8acff
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ereq = EngineRequest(request_id, tuple(request.prompt_ids), request.params, request.trajectory_id)
        track = _Track(request, ereq)
        self._tracks[request_id] = track
        siblings = self._by_trajectory.setdefault(request.trajectory_id, {})
        siblings[request_id] = track
        self.counters["submitted"] += 1
        try:
            return await self._drive(track, deadline)
        finally:
            del self._tracks[request_id]
            del siblings[request_id]
            if not siblings and self._by_trajectory.get(request.trajectory_id) is siblings:
                del self._by_trajectory[request.trajectory_id]
            self._notify()

    async def _drive(self, track: _Track, deadline: float) -> GenerateResponse:
        exclude: int | None = None
        while True:
            await self._wait(self._resumed, deadline, "proxy resume")
            if track.abort_reason is not None:
                return self._answer(track, None)
            slot = await self._acquire(track, deadline, exclude)
            if slot is None:
                return self._answer(track, None)
            incarnation = slot.incarnation
            track.worker_ids.append(slot.handle.worker_id)
            try:
                pending = slot.handle.submit(track.engine_request)  # queued now, while the slot is active
                async with asyncio.timeout_at(deadline):  # no task per request, unlike wait_for
                    output = await pending
            except TimeoutError as exc:
                await self._abort_on(slot, track.engine_request.request_id)
                raise ProxyTimeoutError(
                    f"request {track.engine_request.request_id!r} not answered within its deadline on worker {slot.handle.worker_id}"
                ) from exc
            except WorkerFailedError as exc:
                track.failure = str(exc)
                req = track.engine_request
                output = EngineOutput(req.request_id, req.generated_ids, req.generated_logprobs, req.generated_versions, FINISH_WORKER_FAILED)
            finally:
                self._release(slot, track)
            if output.finish_reason in FINAL_REASONS:
                return self._answer(track, output)
            # handed back: keep every generated token and continue elsewhere
            kept = len(output.token_ids) - len(track.engine_request.generated_ids)
            # AST: AST_INVARIANT(kept >= 0, got=(output.token_ids, track.engine_request.generated_ids), msg="a hand-back never loses tokens")
            check.invariant(kept >= 0, "a hand-back never loses tokens", got=(output.token_ids, track.engine_request.generated_ids))  # generated #73d346c035
            track.engine_request = output.resume_request(track.engine_request)
            self.counters["migrated"] += 1
            self._emit("handed_back", request_id=output.request_id, reason=output.finish_reason,
                       worker=slot.handle.worker_id, token_ids=output.token_ids)
            exclude = slot.rank if output.finish_reason == FINISH_MIGRATED else None
            if output.finish_reason == FINISH_WORKER_FAILED and not self._closed:
                # In its own task (D53): this request's task may be cancelled (a stale or redundant
                # trajectory, a shutdown), and a restart cancelled half-way left the slot draining for good.
                self._fail_later(slot, incarnation, track.failure or "its engine or process failed")
                await asyncio.sleep(0)  # the failure task marks the slot before this request is routed again
                if slot.state == ACTIVE and slot.incarnation == incarnation:
                    exclude = slot.rank

    def _answer(self, track: _Track, output: EngineOutput | None) -> GenerateResponse:
        req = track.engine_request
        if output is None or output.finish_reason == FINISH_ABORT:
            tokens = output or EngineOutput(req.request_id, req.generated_ids, req.generated_logprobs, req.generated_versions, FINISH_ABORT)
            self.counters["aborted"] += 1
            reason = track.abort_reason or "aborted by the worker"
            response = GenerateResponse(req.request_id, req.trajectory_id, tokens.token_ids, tokens.logprobs,
                                        tokens.token_versions, FINISH_ABORT, reason, tuple(track.worker_ids))
        else:
            self.counters["finished"] += 1
            response = GenerateResponse(req.request_id, req.trajectory_id, output.token_ids, output.logprobs,
                                        output.token_versions, str(output.finish_reason), None, tuple(track.worker_ids))
        self._emit("answered", request_id=req.request_id, finish_reason=response.finish_reason)
        return response

    async def _wait(self, event: asyncio.Event, deadline: float, what: str) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        if event.is_set():
            return
        try:
            await asyncio.wait_for(event.wait(), max(remaining, 0.0))
        except TimeoutError as exc:
            raise ProxyTimeoutError(f"timed out waiting for {what}") from exc

    async def _acquire(self, track: _Track, deadline: float, exclude: int | None) -> WorkerSlot | None:
        """Route with back-pressure: wait (until the deadline) for a worker with room; None if aborted.

        A request that finds no room queues behind the ones already waiting; the proxy routes it when
        a change gives it room (D54, `_dispatch`), so it wakes once, with its slot."""
        while True:
            if track.abort_reason is not None:
                return None
            has_active = self._index.active_count(None) > 0
            rank = self._route(track, exclude) if not self._waiters else None  # else it queues (FIFO)
            if rank is not None:
                return self._assign(track, rank)
            if not has_active and not self._can_recover():  # O(n) only when the pool is empty
                raise NoWorkerAvailableError(self._pool_gone(track.engine_request.request_id))
            what = "a worker with room (back-pressure)" if has_active else "an active worker (pool empty)"
            waiter = _Waiter(track, exclude, asyncio.get_running_loop().create_future())
            track.waiter = waiter
            self._waiters.append(waiter)
            if has_active and len(self._waiters) > 1:
                self._dispatch()  # room the older waiters cannot use (affinity) may be this one's
            try:
                if waiter.future.done():
                    slot = waiter.future.result()
                else:
                    async with asyncio.timeout_at(deadline):
                        slot = await waiter.future
            except BaseException as exc:
                if track.waiter is waiter:  # still queued: leave the queue
                    track.waiter = None
                    self._waiters.remove(waiter)
                elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.result() is not None:
                    self._release(waiter.future.result(), track)  # routed as the deadline or a cancel came
                if isinstance(exc, TimeoutError):
                    if not has_active:
                        raise NoWorkerAvailableError(
                            f"no active worker for request {track.engine_request.request_id!r} before its deadline") from exc
                    raise ProxyTimeoutError(f"timed out waiting for {what}") from exc
                raise
            if slot is not None:
                return slot

    def _route(self, track: _Track, exclude: int | None) -> int | None:
        """The router's choice for a request now (no state changed), or None: no worker it may use has room."""
        request = track.request
        sticky = self._sticky.get(request.trajectory_id) if request.trajectory_id and exclude is None else None
        if isinstance(self._router, AffinityRouter):  # O(log n) from the index (D16)
            if self._index.active_count(None) == 0:
                return None
            return self._router.choose_indexed(request, self._index, sticky, exclude)
        views = [  # a custom policy sees a view of every active worker
            WorkerView(s.rank, s.handle.hardware, len(s.inflight), sum(s.inflight.values()), self._capacity)
            for s in self._slots
            if s.state == ACTIVE
        ]
        if exclude is not None and len(views) > 1:
            views = [v for v in views if v.rank != exclude]
        return self._router.choose(request, views, sticky) if views else None

    def _assign(self, track: _Track, rank: int) -> WorkerSlot:
        """Count a routed request in its slot's in-flight (the index sees it) and make the trajectory stick to it."""
        slot = self._slots[rank]
        # AST: AST_INVARIANT(slot.state == ACTIVE, got=(rank, slot.state), msg="route only to active workers")
        check.invariant(slot.state == ACTIVE, "route only to active workers", got=(rank, slot.state))  # generated #e3b13c04ec
        req = track.engine_request
        slot.inflight[req.request_id] = len(req.context_ids) + req.remaining_tokens
        track.slot = slot
        if track.request.trajectory_id:
            self._sticky[track.request.trajectory_id] = rank
        return slot

    def _can_recover(self) -> bool:
        """Whether a worker may become active again without a new request's help: a restart or a shrink
        under way (draining), an offloaded worker an expand brings back, or a replacement being built."""
        return any(s.state in (DRAINING, OFFLOADED) or s.replacing for s in self._slots)

    def _pool_gone(self, request_id: str) -> str:
        removed = sum(s.state == REMOVED for s in self._slots)
        hint = ("replacements are retried with backoff" if self._worker_factory is not None
                else "pass worker_factory= to LLMProxy to replace removed workers")
        return (f"no worker can serve request {request_id!r}: {removed} of {len(self._slots)} workers are removed "
                f"after failures and none is restarting or being replaced ({hint})")

    def _release(self, slot: WorkerSlot, track: _Track) -> None:
        slot.inflight.pop(track.engine_request.request_id, None)
        track.slot = None
        self._notify()

    async def _abort_on(self, slot: WorkerSlot, request_id: str) -> None:
        try:
            await slot.handle.abort(request_id)
        except Exception as exc:  # the worker may be gone; the request is answered by its coroutine anyway
            logger.debug("abort of %s on worker %d failed: %r", request_id, slot.rank, exc)

    # ---- control --------------------------------------------------------------------------------

    async def abort(self, trajectory_id: str, reason: str = "aborted by client") -> int:
        """Abort every in-flight request of a trajectory; each answers ``abort`` with ``reason``."""
        # VAL: VAL_NON_EMPTY(trajectory_id, exc=ProxyError)
        check.non_empty("trajectory_id", trajectory_id, exc=ProxyError)  # generated #a2c56ebaf0
        tracks = list(self._by_trajectory.get(trajectory_id, {}).values())
        for track in tracks:
            track.abort_reason = reason
            self._unwait(track)
        self._notify()
        await asyncio.gather(*(self._abort_on(t.slot, t.engine_request.request_id) for t in tracks if t.slot is not None))
        self._sticky.pop(trajectory_id, None)
        return len(tracks)

    async def suspend(self) -> None:
        """Pause generation for a weight update: new requests wait, running ones pause in place."""
        self._resumed.clear()
        await self._broadcast("suspend")

    async def resume(self) -> None:
        """Continue after ``suspend``; paused requests continue (their KV recomputed if weights changed)."""
        await self._broadcast("resume")
        self._resumed.set()
        self._notify()

    async def _broadcast(self, method: str) -> None:
        """Call suspend/resume on every worker that is not removed; a worker that failed (or died)
        meanwhile is skipped and handed to failure handling in the background (D40): its restart or
        replacement applies the proxy's current suspension state."""
        slots = [s for s in self._slots if s.state != REMOVED]
        incarnations = [s.incarnation for s in slots]
        results = await asyncio.gather(*(getattr(s.handle, method)() for s in slots), return_exceptions=True)
        for slot, incarnation, result in zip(slots, incarnations, results):
            if isinstance(result, WorkerFailedError):
                self._fail_later(slot, incarnation, result)
            elif isinstance(result, BaseException):
                raise result

    def _fail_later(self, slot: WorkerSlot, incarnation: int, cause: str | BaseException) -> asyncio.Task | None:
        """Handle a worker's failure in a task of the proxy's own, never in the caller's (D40, D53).

        A control call is not held up by the restart, and a request or probe whose task is cancelled
        meanwhile cannot cancel the restart half-way (which left the slot draining at its old version).
        One task per failed incarnation; later reports of the same failure get that task.
        """
        key = (slot.rank, incarnation)
        if key in self._failing or self._closed or slot.state != ACTIVE or slot.incarnation != incarnation:
            return self._failing.get(key)  # already being handled, or nothing to handle
        logger.warning("worker %s (rank %d) failed: %s", slot.handle.worker_id, slot.rank, cause)
        task = asyncio.get_running_loop().create_task(self._handle_failure(slot, incarnation, cause=str(cause)),
                                                      name=f"failure-rank-{slot.rank}")
        self._failing[key] = task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda _t, key=key: self._failing.pop(key, None))
        return task

    async def update_weights(self, source: WeightSource | Mapping[str, torch.Tensor], version: int) -> None:
        """Push ``version`` to every active worker; offloaded ones get it on expand.

        Re-sending the version already pushed is accepted only with the same weights (a no-op);
        different weights under it raise ProxyError (a version names one set of weights).
        """
        # VAL: VAL_VERSION_MONOTONIC(version, self._version, strict=False, exc=ProxyError)
        check.version_monotonic("version", version, self._version, strict=False, exc=ProxyError)  # generated #446e2b7c63
        weights = await source.fetch(version) if hasattr(source, "fetch") else source
        # A version names one set of weights: its tokens are tagged with it. Before any push the
        # construction version's weights are unknown here, and the workers (which hold them) decide.
        # AST: AST_PRECONDITION(version != self._version or self._latest_digest is None or same_payload(self._latest_digest, weights), got=version, msg="a version already pushed is re-sent only with the weights pushed under it (publish changed weights under a new version)", exc=ProxyError)
        check.precondition(version != self._version or self._latest_digest is None or same_payload(self._latest_digest, weights), "a version already pushed is re-sent only with the weights pushed under it (publish changed weights under a new version)", got=version, exc=ProxyError)  # generated #6719edbd59
        if version == self._version and self._latest_digest is not None:
            return  # an identical re-send: every active worker serves these weights already
        digest = weights_digest(weights)
        async with self._control:
            active = [s for s in self._slots if s.state == ACTIVE]
            incarnations = [s.incarnation for s in active]
            results = await asyncio.gather(*(s.handle.load_weights(weights, version) for s in active),
                                           return_exceptions=True)
            failed = [(s, i, r) for s, i, r in zip(active, incarnations, results) if isinstance(r, WorkerFailedError)]
            other = [r for r in results if isinstance(r, BaseException) and not isinstance(r, WorkerFailedError)]
            if other:
                raise other[0]
            if failed and len(failed) == len(active):
                raise failed[0][2]  # no worker holds the version: the update did not happen
            for slot, result in zip(active, results):
                if not isinstance(result, BaseException):
                    slot.version = version
            self._version = version
            self._latest_weights = weights
            self._latest_digest = digest
        for slot, incarnation, error in failed:  # restarted or replaced with these weights (D40)
            self._fail_later(slot, incarnation, error)
        self._emit("weights_updated", version=version)

    async def shrink(self, ranks: Sequence[int] | None = None, count: int | None = None) -> list[int]:
        """Release workers: stop routing to them, migrate their requests, offload; return their devices."""
        async with self._control:
            if ranks is None:
                # VAL: VAL_INT_RANGE(count, min=1, max=len(self._slots), exc=ProxyError)
                check.int_range("count", count, min=1, max=len(self._slots), exc=ProxyError)  # generated #fcc5f44645
                by_load = sorted(self.active_ranks(), key=lambda r: (len(self._slots[r].inflight), -r))
                ranks = by_load[:count]
            ranks = list(ranks)
            validate_shrink_ranks(ranks, self._slots, self.inflight_count())
            chosen = [self._slots[r] for r in ranks]
            for slot in chosen:
                slot.state = DRAINING
            self._notify()
            await asyncio.gather(*(s.handle.evict(None) for s in chosen))
            await asyncio.gather(*(s.handle.offload() for s in chosen))
            for slot in chosen:
                slot.state = OFFLOADED
            self._notify()
            devices = [d for s in chosen for d in s.devices]
            self._emit("shrunk", ranks=ranks, devices=devices)
            return devices

    async def expand(self, ranks: Sequence[int]) -> list[int]:
        """Bring offloaded workers back with the latest weights and rebalance requests onto them."""
        async with self._control:
            ranks = list(ranks)
            validate_ranks(ranks, self._slots, of=[s.rank for s in self._slots if s.state == OFFLOADED])
            chosen = [self._slots[r] for r in ranks]
            await asyncio.gather(*(s.handle.reload() for s in chosen))
            if self._latest_weights is not None:
                stale = [s for s in chosen if s.version < self._version]
                await asyncio.gather(*(s.handle.load_weights(self._latest_weights, self._version) for s in stale))
            for slot in chosen:
                slot.version = self._version
                slot.state = ACTIVE
            self._notify()
            await self._rebalance()
            devices = [d for s in chosen for d in s.devices]
            self._emit("expanded", ranks=ranks, devices=devices)
            return devices

    async def _rebalance(self) -> None:
        """Move the youngest requests off workers holding more than their share."""
        active = [s for s in self._slots if s.state == ACTIVE]
        total = sum(len(s.inflight) for s in active)
        share = -(-total // len(active)) if active else 0
        evictions = []
        for slot in active:
            excess = len(slot.inflight) - share
            if excess > 0:
                youngest = sorted(slot.inflight, key=lambda rid: len(self._tracks[rid].engine_request.generated_ids))
                evictions.append(slot.handle.evict(youngest[:excess]))
        await asyncio.gather(*evictions)

    def _budget_delay(self, times: list[float], now: float) -> float | None:
        return restart_delay(times, now, window_s=self._restart_window, max_restarts=self._max_restarts,
                             backoff_s=self._backoff, backoff_max_s=self._backoff_max)

    async def _bring_up(self, slot: WorkerSlot) -> None:
        """After a restart or a replacement: latest weights, the proxy's suspension state, then route to it."""
        async with self._control:  # an update running now either saw this slot active or left its weights here
            if self._latest_weights is not None:
                await slot.handle.load_weights(self._latest_weights, self._version)
                slot.version = self._version
            if not self._resumed.is_set():
                await slot.handle.suspend()
            slot.state = ACTIVE
        if self._resumed.is_set():  # a resume() that ran during the restart skipped this slot
            await slot.handle.resume()

    async def _handle_failure(self, slot: WorkerSlot, incarnation: int, cause: str = "") -> None:
        """Restart a failed worker on its device within the budget (with backoff); beyond it, remove it
        and, with a ``worker_factory``, replace it in the background."""
        async with slot.lock:
            if slot.incarnation != incarnation or slot.state != ACTIVE:
                return  # another request (or the health check) already handled this failure
            slot.incarnation += 1
            self.counters["failures"] += 1
            loop = asyncio.get_running_loop()
            delay = self._budget_delay(slot.restart_times, loop.time())
            worker_id = slot.handle.worker_id
            self._emit("worker_failed", rank=slot.rank, worker=worker_id, hardware=slot.handle.hardware,
                       cause=cause or "its engine or process failed")
            if delay is None:
                logger.warning("worker %s (rank %d) failed again: its restart budget (%d per %g s) is spent; "
                               "removing it", worker_id, slot.rank, self._max_restarts, self._restart_window)
            else:
                slot.state = DRAINING
                self._notify()
                if delay > 0:
                    await asyncio.sleep(delay)
                slot.restart_times.append(loop.time())
                slot.restarts += 1
                try:
                    await slot.handle.restart()
                    await self._bring_up(slot)
                    self._emit("worker_restarted", rank=slot.rank, worker=slot.handle.worker_id,
                               hardware=slot.handle.hardware)
                    logger.info("worker %d restarted on devices %s", slot.rank, list(slot.devices))
                    self._notify()
                    return
                except Exception:  # a failed restart removes the worker
                    logger.warning("restart of worker %s (rank %d) failed; removing it", worker_id, slot.rank,
                                   exc_info=True)
            slot.state = REMOVED
            self.counters["removed"] += 1
            self._emit("worker_removed", rank=slot.rank, worker=worker_id, hardware=slot.handle.hardware)
            logger.warning("worker %d removed; %d active workers left", slot.rank, len(self.active_ranks()))
            self._notify()
            try:
                await slot.handle.stop()
            except Exception:
                logger.warning("stopping removed worker %s (rank %d) failed", worker_id, slot.rank, exc_info=True)
            if self._worker_factory is not None and not self._closed and slot.rank not in self._replacements:
                slot.replacing = True  # requests wait for the first attempt instead of failing at once
                task = loop.create_task(self._replace(slot), name=f"replace-rank-{slot.rank}")
                self._replacements[slot.rank] = task
                task.add_done_callback(lambda _t, rank=slot.rank: self._replacements.pop(rank, None))

    async def adopt(self, rank: int, handle: WorkerHandle) -> None:
        """Install a worker built outside the proxy in the removed slot `rank` (D56).

        Why: a worker that must join a weight channel's world first (torch_dist, Mooncake) cannot be
        built by ``worker_factory`` at any moment; its owner builds it at the next weight update,
        once it holds the update's version, and hands it over here. It then loads the latest weights
        (what it received), takes the proxy's suspension state, and serves.
        """
        # VAL: VAL_INT_RANGE(rank, min=0, max=len(self._slots) - 1, exc=ProxyError)
        check.int_range("rank", rank, min=0, max=len(self._slots) - 1, exc=ProxyError)  # generated #77c85b3541
        slot = self._slots[rank]
        # AST: AST_PRECONDITION(slot.state == REMOVED and not slot.replacing, got=(rank, slot.state), msg="a worker is adopted only into a removed slot that nothing else is replacing", exc=ProxyError)
        check.precondition(slot.state == REMOVED and not slot.replacing, "a worker is adopted only into a removed slot that nothing else is replacing", got=(rank, slot.state), exc=ProxyError)  # generated #3942b7f6e1
        async with slot.lock:
            slot.handle = handle
            slot.incarnation += 1
            slot.restart_times.clear()
            slot.replacement_times.clear()
            await self._bring_up(slot)
        self.counters["replaced"] += 1
        self._emit("worker_replaced", rank=slot.rank, worker=handle.worker_id, hardware=handle.hardware)
        logger.info("rank %d adopted worker %s", slot.rank, handle.worker_id)
        self._notify()

    async def _replace(self, slot: WorkerSlot) -> None:
        """Build a new worker for a removed slot with ``worker_factory``, retrying failures with backoff
        (at most ``max_restarts`` attempts per window), until one is up or the proxy closes."""
        assert self._worker_factory is not None
        loop = asyncio.get_running_loop()
        while not self._closed:
            now = loop.time()
            delay = self._budget_delay(slot.replacement_times, now)
            if delay != 0 and slot.replacing:  # waiting out a backoff or the window: the pool cannot serve meanwhile
                slot.replacing = False
                self._notify()
            if delay is None:  # budget spent: wait until the oldest attempt leaves the window
                await asyncio.sleep(max(slot.replacement_times[0] + self._restart_window - now, 1e-3))
                continue
            if delay > 0:
                await asyncio.sleep(delay)
            if self._closed:
                return
            slot.replacement_times.append(loop.time())
            slot.replacing = True
            handle: WorkerHandle | None = None
            try:
                handle = await self._worker_factory(slot.rank)
                async with slot.lock:
                    slot.handle = handle
                    slot.incarnation += 1
                    slot.restart_times.clear()  # a new worker, a new restart budget
                    await self._bring_up(slot)
            except Exception as exc:
                logger.warning("replacing worker of rank %d failed (attempt %d in the window); retrying with "
                               "backoff", slot.rank, len(slot.replacement_times), exc_info=True)
                slot.state = REMOVED
                self._emit("replacement_failed", rank=slot.rank, hardware=slot.handle.hardware,
                           error=f"{type(exc).__name__}: {exc}".splitlines()[0])
                if handle is not None:
                    try:
                        await handle.stop()
                    except Exception:
                        logger.warning("stopping the failed replacement of rank %d failed", slot.rank, exc_info=True)
                continue
            finally:
                slot.replacing = False
                self._notify()
            self.counters["replaced"] += 1
            self._emit("worker_replaced", rank=slot.rank, worker=slot.handle.worker_id, hardware=slot.handle.hardware)
            logger.info("rank %d replaced by worker %s", slot.rank, slot.handle.worker_id)
            return

    # ---- health ---------------------------------------------------------------------------------

    def _ensure_monitor(self) -> None:
        if self._health_interval is not None and self._monitor is None and not self._closed:
            self._monitor = asyncio.get_running_loop().create_task(self._health_loop(), name="proxy-health-check")

    async def _health_loop(self) -> None:
        assert self._health_interval is not None
        while not self._closed:
            await asyncio.sleep(self._health_interval)
            try:
                await self.check_health()
            except Exception:  # the monitor must outlive one bad round
                logger.exception("health check round failed")

    async def check_health(self) -> dict[int, str]:
        """Probe every active worker once (``WorkerHandle.probe``, bounded by ``health_check_timeout_s``);
        a failed or unanswered probe is handled as a worker failure. Returns {rank: ok|failed|no_probe}."""
        # deps: WorkerHandle.probe, LLMProxy._handle_failure
        slots = [s for s in self._slots if s.state == ACTIVE]
        outcomes = await asyncio.gather(*(self._probe(s) for s in slots))
        return {s.rank: outcome for s, outcome in zip(slots, outcomes)}

    async def _probe(self, slot: WorkerSlot) -> str:
        probe = getattr(slot.handle, "probe", None)
        if probe is None:  # a handle without a probe is checked by its requests only
            return "no_probe"
        incarnation = slot.incarnation
        try:
            await asyncio.wait_for(probe(), self._health_timeout)
            return "ok"
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if slot.incarnation != incarnation or slot.state != ACTIVE:
                return "ok"  # restarted or moved meanwhile: this probe saw the old worker
            what = f"no answer within {self._health_timeout:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            logger.warning("health check: worker %s (rank %d) failed its probe: %s", slot.handle.worker_id,
                           slot.rank, what)
            self._emit("health_check_failed", rank=slot.rank, error=what)
            task = self._fail_later(slot, incarnation, f"health check: {what}")
            if task is not None:
                await asyncio.shield(task)  # the round reports after the restart; cancelling it spares the restart
            return "failed"

    async def close(self) -> None:
        """Stop every worker; requests still in flight are answered at once as aborted ("proxy closed").

        Without this a request handed back by a stopping worker would look for another worker until
        its deadline, and a caller cancelling it at shutdown would wait on a restart that never helps.
        """
        self._closed = True
        background = [t for t in (self._monitor, *self._replacements.values(), *self._background) if t is not None]
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        for track in self._tracks.values():
            track.abort_reason = track.abort_reason or "proxy closed"
            self._unwait(track)
        self._resumed.set()
        self._notify()
        await asyncio.gather(*(s.handle.stop() for s in self._slots if s.state != REMOVED), return_exceptions=True)


def restart_delay(times: list[float], now: float, *, window_s: float, max_restarts: int, backoff_s: float, backoff_max_s: float) -> float | None:
    """The restart budget (design D22): prune ``times`` (loop times of earlier restarts) to the window ending
    at ``now``; None when ``max_restarts`` are already in it, else the pause before the next restart
    (0 for the first in the window, then ``backoff_s * 2**(k-1)`` after k restarts, capped)."""
    # deps: none
    times[:] = [t for t in times if now - t < window_s]
    if len(times) >= max_restarts:
        return None
    return 0.0 if not times else min(backoff_max_s, backoff_s * 2 ** min(len(times) - 1, 60))


def validate_ranks(ranks: list[int], slots: Sequence[WorkerSlot], of: list[int]) -> None:
    """Ranks of a shrink or an expand: some, each a worker of the pool, none twice, all among ``of``
    (the workers in the state the move starts from)."""
    # VAL: VAL_NON_EMPTY(ranks, exc=ProxyError)
    check.non_empty("ranks", ranks, exc=ProxyError)  # generated #d086a496b5
    # VAL: VAL_INT_RANGE(ranks, min=0, max=len(slots) - 1, each=True, exc=ProxyError)
    check.int_range_each("ranks", ranks, min=0, max=len(slots) - 1, exc=ProxyError)  # generated #b3e72a587f
    # VAL: VAL_UNIQUE(ranks, exc=ProxyError)
    check.unique("ranks", ranks, exc=ProxyError)  # generated #d32eabdc71
    # VAL: VAL_SUBSET(ranks, of=of, exc=ProxyError)
    check.subset("ranks", ranks, of=of, exc=ProxyError)  # generated #77b0daba07


def validate_shrink_ranks(ranks: list[int], slots: Sequence[WorkerSlot], inflight: int) -> None:
    """Target ranks valid and active, and not the whole active pool while requests are in flight."""
    active = [s.rank for s in slots if s.state == ACTIVE]
    validate_ranks(ranks, slots, of=active)
    remaining = len(active) - len(ranks)
    # AST: AST_PRECONDITION(remaining > 0 or inflight == 0, got=(ranks, active, inflight), msg="the pool keeps a worker while requests are in flight", exc=ProxyError)
    check.precondition(remaining > 0 or inflight == 0, "the pool keeps a worker while requests are in flight", got=(ranks, active, inflight), exc=ProxyError)  # generated #fd9e1ae5f7
