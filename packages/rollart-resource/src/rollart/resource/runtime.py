"""Where workers live: in this process (LocalRuntime) or as Ray actors on placement groups (RayRuntime).

Why a protocol (design D8): the Cluster is the same code in the local, Ray and simulated runtimes
(design/000-overview.md §3); only spawning, calling and killing differ. Ray is imported lazily, so the local
runtime (tests, simulation) never pays for it.

Placement (design D6): one placement group per worker, strategy STRICT_PACK, one bundle
``{GPU: n, <hw type>: n}`` (``{CPU: n}`` for the CPU type). On a real cluster the hardware-type
resource is what makes Ray put the worker on a node of that type; a restart reuses the group (same
devices); a removal deletes the group, returning the capacity to Ray.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollart import checks as check
from rollart.resource.errors import CallTimeout, PlacementTimeout, ResourceError, WorkerDiedError

__all__ = ["LocalRuntime", "RayRuntime", "WorkerContext", "WorkerRuntime", "bundle_for"]

CPU_TYPE = "CPU"


@dataclass(frozen=True)
class WorkerContext:
    """What a worker knows about itself: owner cluster, rank, world size, hardware type and devices.

    Attributes:
        owner: the cluster's name (its owner name in the ledger).
        rank: this worker's rank, 0-based, stable across restarts.
        world_size: the number of workers the cluster was created with.
        hw: the hardware type of the worker's devices.
        devices: ledger ids of the worker's devices.
    """

    owner: str
    rank: int
    world_size: int
    hw: str
    devices: tuple[int, ...]


@runtime_checkable
class WorkerRuntime(Protocol):
    """Where workers live: in this process (LocalRuntime) or as Ray actors (RayRuntime).

    `Cluster` is the only caller and keeps the handles; a handle is opaque to it and only ever
    passed back to the runtime that made it. Whether a dead worker is restarted or removed is the
    cluster's decision (R9), never the runtime's (no automatic restarts underneath).
    """

    async def spawn(self, worker_cls: type, context: WorkerContext, args: tuple, kwargs: Mapping[str, Any], *, timeout: float) -> Any:
        """Start one worker, `worker_cls(context, *args, **kwargs)`, on `context.devices`; return its handle.

        Called by `Cluster.create` for every rank at once, after the ledger allocated the devices.
        Returns once the worker answers calls; past `timeout` seconds it raises `PlacementTimeout`
        and leaves nothing behind (no actor, no reserved capacity). A worker that dies while
        starting raises `WorkerDiedError`. If any rank fails, the cluster `remove`s the others.
        """
        ...

    async def call(self, handle: Any, method: str, args: tuple, kwargs: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """Run `method(*args, **kwargs)` on the worker and return its result (awaited if it is a coroutine).

        Called by `Cluster` for every dispatched call and health check, concurrently for many ranks
        and many calls on one rank. A dead worker raises `WorkerDiedError` (the cluster restarts
        or removes it); past `timeout` (None: no deadline) it raises `CallTimeout` and cancels
        the call where it can. An exception of the method itself propagates unchanged.
        """
        ...

    async def kill(self, handle: Any) -> None:
        """Make the worker dead at once, without cleanup: every later `call` raises `WorkerDiedError`.

        Fault injection for tests and drills, and the first half of `restart` / `remove`; the
        cluster only learns of it through a failing call. Its devices and placement stay reserved.
        """
        ...

    async def restart(self, handle: Any, *, timeout: float) -> Any:
        """Replace a dead worker by a fresh instance with the same context (same devices); return the new handle.

        Called by `Cluster` at most once per rank, after a call found the worker dead; the old
        handle must not be used again. Raises (`PlacementTimeout`, `WorkerDiedError`) when the new
        worker does not answer within `timeout`; the cluster then removes the worker.
        """
        ...

    async def remove(self, handle: Any) -> None:
        """Stop the worker for good and give its placement back (the cluster releases the ledger devices).

        Called by `Cluster` when a restart is not allowed or failed, when spawning another rank
        failed, and by `Cluster.shutdown` for every worker. Must work on a worker that is already
        dead; the cluster logs (or, at shutdown, ignores) an exception here.
        """
        ...


def bundle_for(hw: str, num_devices: int, cpus: float = 0.0) -> dict[str, float]:
    """The placement-group bundle of one worker: a logical GPU per device plus the hardware-type resource."""
    # deps: none
    # VAL: VAL_NON_EMPTY(hw, exc=ResourceError)
    check.non_empty("hw", hw, exc=ResourceError)  # generated #964cc55dee
    # VAL: VAL_INT_RANGE(num_devices, min=1, max=1024, exc=ResourceError)
    check.int_range("num_devices", num_devices, min=1, max=1024, exc=ResourceError)  # generated #6d8ec45d96
    if hw == CPU_TYPE:
        return {"CPU": float(num_devices) + cpus}
    bundle = {"GPU": float(num_devices), hw: float(num_devices)}
    if cpus > 0:
        bundle["CPU"] = cpus
    return bundle


@dataclass
class _LocalHandle:
    worker: Any
    worker_cls: type
    context: WorkerContext
    args: tuple
    kwargs: Mapping[str, Any]
    alive: bool = True


class LocalRuntime:
    """Workers as plain objects in this process (tests, the local and simulated runtimes)."""

    async def spawn(self, worker_cls: type, context: WorkerContext, args: tuple, kwargs: Mapping[str, Any], *, timeout: float) -> Any:
        """Construct the worker here; the timeout is unused but kept for the protocol."""
        # deps: none
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        return _LocalHandle(worker_cls(context, *args, **dict(kwargs)), worker_cls, context, tuple(args), dict(kwargs))

    async def call(self, handle: Any, method: str, args: tuple, kwargs: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """Call a method (awaiting it if async); a killed worker raises WorkerDiedError.

        ``timeout`` bounds an async method (it is cancelled at the deadline, CallTimeout); a sync method
        runs on the caller's loop and cannot be interrupted in-process (use the Ray runtime for those).
        """
        # deps: none
        if not handle.alive:
            raise WorkerDiedError(f"worker {handle.context.owner}/{handle.context.rank} is dead (local runtime)")
        result = getattr(handle.worker, method)(*args, **kwargs)
        if inspect.isawaitable(result):
            if timeout is None:
                return await result
            try:
                return await asyncio.wait_for(result, timeout)
            except TimeoutError:
                raise CallTimeout(handle.context.owner, handle.context.rank, method, timeout) from None
        return result

    async def kill(self, handle: Any) -> None:
        """Simulate the death of a worker (the object stays, its calls fail)."""
        # deps: none
        handle.alive = False

    async def restart(self, handle: Any, *, timeout: float) -> Any:
        """A fresh instance with the same context (same devices)."""
        # deps: LocalRuntime.spawn
        handle.alive = False
        return await self.spawn(handle.worker_cls, handle.context, handle.args, handle.kwargs, timeout=timeout)

    async def remove(self, handle: Any) -> None:
        """Forget the worker."""
        # deps: none
        handle.alive = False


@dataclass
class _RayHandle:
    actor: Any
    placement_group: Any
    worker_cls: type
    context: WorkerContext
    args: tuple
    kwargs: Mapping[str, Any]
    bundle: dict[str, float] = field(default_factory=dict)


async def _await_ref(ref: Any, timeout: float) -> Any:
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), max(timeout, 0.001))


class RayRuntime:
    """Workers as Ray actors, one placement group per worker with a bundle of the right hardware type."""

    def __init__(self, *, cpus_per_worker: float = 0.0) -> None:
        """Ray must already be initialised by the caller (a test fixture or the CLI)."""
        # deps: none
        # VAL: VAL_NON_NEGATIVE(cpus_per_worker, exc=ResourceError)
        check.non_negative("cpus_per_worker", cpus_per_worker, exc=ResourceError)  # generated #865e64641a
        self._cpus = float(cpus_per_worker)
        self._actor_classes: dict[type, Any] = {}

    def _start_actor(self, handle_pg: Any, worker_cls: type, context: WorkerContext, args: tuple,
                     kwargs: Mapping[str, Any]) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote_cls = self._actor_classes.get(worker_cls)
        if remote_cls is None:
            remote_cls = self._actor_classes[worker_cls] = ray.remote(worker_cls)
        n = len(context.devices)
        gpu = context.hw != CPU_TYPE
        return remote_cls.options(
            num_cpus=self._cpus if gpu else float(n) + self._cpus,
            num_gpus=n if gpu else 0,
            resources={context.hw: n} if gpu else {},
            max_restarts=0,  # the Cluster decides about restarts (R9), not Ray
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=handle_pg,
                                                                 placement_group_bundle_index=0),
        ).remote(context, *args, **dict(kwargs))

    async def spawn(self, worker_cls: type, context: WorkerContext, args: tuple, kwargs: Mapping[str, Any], *, timeout: float) -> Any:
        """Create the worker's placement group (bundle_for), wait for it, start the actor on it."""
        # deps: bundle_for
        # VAL: VAL_TIMEOUT(timeout, exc=ResourceError)
        check.timeout("timeout", timeout, exc=ResourceError)  # generated #db0d52c256
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        bundle = bundle_for(context.hw, len(context.devices), self._cpus)
        pg = placement_group([bundle], strategy="STRICT_PACK")
        try:
            await _await_ref(pg.ready(), deadline - loop.time())
        except TimeoutError:
            remove_placement_group(pg)
            raise PlacementTimeout(
                f"placement group for worker {context.owner}/{context.rank} with bundle {bundle} was not ready "
                f"within timeout={timeout}s; available: {ray.available_resources()}") from None
        handle = _RayHandle(None, pg, worker_cls, context, tuple(args), dict(kwargs), bundle)
        try:
            handle.actor = self._start_actor(pg, worker_cls, context, args, kwargs)
            await self._wait_started(handle, deadline - loop.time(), timeout)
        except BaseException:
            await self.remove(handle)
            raise
        return handle

    async def _wait_started(self, handle: _RayHandle, remaining: float, timeout: float) -> None:
        import ray

        try:
            await _await_ref(handle.actor.rollart_ping.remote(), remaining)
        except TimeoutError:
            raise PlacementTimeout(f"worker {handle.context.owner}/{handle.context.rank} did not start within "
                                   f"timeout={timeout}s") from None
        except ray.exceptions.RayActorError as exc:
            raise WorkerDiedError(f"worker {handle.context.owner}/{handle.context.rank} died while starting: "
                                  f"{exc}") from exc

    async def call(self, handle: Any, method: str, args: tuple, kwargs: Mapping[str, Any], *, timeout: float | None = None) -> Any:
        """Await the actor call; a dead actor becomes WorkerDiedError, a missed deadline CallTimeout.

        At the deadline the task is cancelled with ``ray.cancel`` (an async actor's coroutine is
        cancelled; a sync method already running cannot be, and keeps its actor busy).
        """
        # deps: none
        import ray

        ref = getattr(handle.actor, method).remote(*args, **kwargs)
        try:
            if timeout is None:
                return await ref
            try:
                return await _await_ref(ref, timeout)
            except TimeoutError:
                try:
                    ray.cancel(ref)
                except Exception:  # cancellation is best effort; the caller gets CallTimeout anyway
                    pass
                raise CallTimeout(handle.context.owner, handle.context.rank, method, timeout) from None
        except ray.exceptions.RayActorError as exc:
            raise WorkerDiedError(f"worker {handle.context.owner}/{handle.context.rank} is dead: "
                                  f"{type(exc).__name__}") from exc

    async def kill(self, handle: Any) -> None:
        """ray.kill the actor (no restart by Ray: the cluster decides)."""
        # deps: none
        import ray

        if handle.actor is not None:
            ray.kill(handle.actor, no_restart=True)

    async def restart(self, handle: Any, *, timeout: float) -> Any:
        """A new actor in the same placement group, hence on the same devices."""
        # deps: none
        await self.kill(handle)
        fresh = _RayHandle(None, handle.placement_group, handle.worker_cls, handle.context, handle.args,
                           handle.kwargs, handle.bundle)
        fresh.actor = self._start_actor(handle.placement_group, handle.worker_cls, handle.context, handle.args,
                                        handle.kwargs)
        await self._wait_started(fresh, timeout, timeout)
        return fresh

    async def remove(self, handle: Any) -> None:
        """Kill the actor and remove its placement group, giving the capacity back to Ray."""
        # deps: none
        from ray.util.placement_group import remove_placement_group

        await self.kill(handle)
        remove_placement_group(handle.placement_group)
