"""Rollout and trainer actors on Ray, placed through rollart.resource on their hardware's resources.

Why here and not in rollart.proxy: the proxy talks to any `WorkerHandle`; which process a worker
lives in is a deployment choice the application makes. `RayRuntime` (rollart.resource) creates one
placement group per actor with a bundle `{GPU: n, <hw>: n}` and the device ids come from the ledger,
so a pool of H20 workers runs only where the cluster advertises H20.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rollart.app.actors import RolloutActor, TrainerActor
from rollart.app.engines import EngineSpec
from rollart.app.model_source import ModelSpec
from rollart.proxy.errors import WorkerFailedError
from rollart.proxy.ray_worker import RemoteWorkerHandle
from rollart.resource.errors import WorkerDiedError
from rollart.resource.runtime import RayRuntime, WorkerContext


class RayWorkerHandle(RemoteWorkerHandle):
    """The proxy's generic `RemoteWorkerHandle` over a RolloutActor: every command is one `RayRuntime.call`."""

    def __init__(self, runtime: RayRuntime, handle: Any, context: WorkerContext, worker_id: str | None = None,
                 start_timeout_s: float = 300.0) -> None:
        """Wrap a spawned actor; `worker_id` defaults to `<pool>-<rank>` (a replacement adds its number)."""
        self.runtime = runtime
        self.handle = handle
        self.worker_id = worker_id or f"{context.owner}-{context.rank}"
        self.hardware = context.hw
        self.devices = tuple(context.devices)
        self.start_timeout_s = start_timeout_s

    async def call(self, method: str, *args: Any) -> Any:
        """Any actor method (the proxy's commands, and extras such as `receive`, `checksums`).

        A dead actor (SIGKILL, node loss) raises the proxy's `WorkerFailedError` (D51): the proxy
        re-routes what it had in flight and restarts or replaces it.
        """
        try:
            return await self.runtime.call(self.handle, method, args, {})
        except WorkerDiedError as exc:
            raise WorkerFailedError(f"rollout actor {self.worker_id} ({self.hardware}) died during {method}: {exc}") from exc

    async def restart(self) -> None:
        """A new actor in the dead one's placement group (same device), started; the proxy then loads the
        current weights. Before, `restart` was a call on the dead actor itself, which always failed."""
        self.handle = await self.runtime.restart(self.handle, timeout=self.start_timeout_s)
        await asyncio.wait_for(self.call("start"), self.start_timeout_s)

    async def engine_stats(self) -> dict[str, float]:
        """The engine's cumulative counters, for metrics.jsonl."""
        return await self.call("engine_stats")

    async def stop(self) -> None:
        """Stop the worker and remove the actor and its placement group."""
        try:
            await self.call("stop")
        except WorkerFailedError:  # a dead actor has nothing to stop; its placement group still goes
            pass
        finally:
            await self.runtime.remove(self.handle)


async def start_rollout_actor(runtime: RayRuntime, owner: str, engine: EngineSpec, rank: int, world_size: int,
                              device: int, worker_id: str | None = None, timeout_s: float = 300.0) -> RayWorkerHandle:
    """One RolloutActor on `device`, spawned and started (a pool's worker, or its replacement)."""
    ctx = WorkerContext(owner=owner, rank=rank, world_size=world_size, hw=engine.hardware, devices=(device,))
    handle = await runtime.spawn(RolloutActor, ctx, (engine,), {}, timeout=timeout_s)
    wh = RayWorkerHandle(runtime, handle, ctx, worker_id=worker_id, start_timeout_s=timeout_s)
    try:
        await asyncio.wait_for(wh.call("start"), timeout_s)
    except BaseException:
        await runtime.remove(handle)
        raise
    return wh


async def start_rollout_actors(runtime: RayRuntime, owner: str, engine: EngineSpec, devices: list[int],
                               timeout_s: float = 300.0) -> list[RayWorkerHandle]:
    """One RolloutActor per device of a pool, all spawned and started concurrently."""
    return list(await asyncio.gather(*(start_rollout_actor(runtime, owner, engine, r, len(devices), d, timeout_s=timeout_s)
                                       for r, d in enumerate(devices))))


async def start_trainer_actors(runtime: RayRuntime, model: ModelSpec, backend: str, trainer_config: Any, hardware: str,
                               devices: list[int], timeout_s: float = 300.0) -> list[Any]:
    """One TrainerActor per trainer device (data-parallel replicas), in rank order."""
    async def one(rank: int, device: int) -> Any:
        ctx = WorkerContext(owner="trainer", rank=rank, world_size=len(devices), hw=hardware, devices=(device,))
        return await runtime.spawn(TrainerActor, ctx, (model, backend, trainer_config), {}, timeout=timeout_s)

    return list(await asyncio.gather(*(one(r, d) for r, d in enumerate(devices))))
