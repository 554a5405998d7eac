"""Rollout workers as Ray actors on logical GPUs, placed through rollart.resource.

Why here and not in rollart.proxy: the proxy talks to any `WorkerHandle`; which process a worker
lives in is a deployment choice the scheduler makes. Each actor hosts one proxy `InferenceWorker`
with a `TorchEngine` over the tiny model; `RayRuntime` (rollart.resource) creates one placement
group per worker with a bundle `{GPU: 1, <hw>: 1}`, and the device ids come from the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineOutput, EngineRequest
from rollart.proxy.worker import InferenceWorker
from rollart.resource.runtime import RayRuntime, WorkerContext
from rollart.resource.worker import Worker


class RolloutActor(Worker):
    """A Ray actor body: one InferenceWorker + TorchEngine bound to one logical device."""

    def __init__(self, context: WorkerContext, model_config: Any, seed: int, max_num_seqs: int) -> None:
        """Build (lazily, in `start`) the same random-init model as the trainer: version 0 needs no transfer."""
        super().__init__(context)
        import torch

        torch.set_num_threads(1)
        from rollart.train.models import build_causal_lm

        self._worker = InferenceWorker(
            f"rollout-{context.rank}",
            lambda: TorchEngine(build_causal_lm(model_config, seed=seed), max_num_seqs=max_num_seqs),
            hardware=context.hw,
            devices=context.devices,
        )

    async def start(self) -> None:
        """Start the worker loop inside the actor's event loop."""
        await self._worker.start()

    async def submit(self, request: EngineRequest) -> EngineOutput:
        """Forwarded to InferenceWorker.submit."""
        return await self._worker.submit(request)

    async def abort(self, request_id: str) -> bool:
        """Forwarded to InferenceWorker.abort."""
        return await self._worker.abort(request_id)

    async def evict(self, request_ids: list[str] | None = None) -> list[str]:
        """Forwarded to InferenceWorker.evict."""
        return await self._worker.evict(request_ids)

    async def suspend(self) -> None:
        """Forwarded to InferenceWorker.suspend."""
        await self._worker.suspend()

    async def resume(self) -> None:
        """Forwarded to InferenceWorker.resume."""
        await self._worker.resume()

    async def offload(self) -> None:
        """Forwarded to InferenceWorker.offload."""
        await self._worker.offload()

    async def reload(self) -> None:
        """Forwarded to InferenceWorker.reload."""
        await self._worker.reload()

    async def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Forwarded to InferenceWorker.load_weights."""
        await self._worker.load_weights(dict(weights), version)

    async def engine_stats(self) -> dict[str, float]:
        """The engine's cumulative counters (TorchEngine.stats) as a plain dict."""
        import dataclasses

        engine = self._worker.engine
        return dataclasses.asdict(engine.stats()) if engine is not None and hasattr(engine, "stats") else {}

    async def restart(self) -> None:
        """Forwarded to InferenceWorker.restart."""
        await self._worker.restart()

    async def stop(self) -> None:
        """Forwarded to InferenceWorker.stop."""
        await self._worker.stop()


class RayWorkerHandle:
    """The proxy's `WorkerHandle` over a RolloutActor (calls go through `RayRuntime.call`)."""

    def __init__(self, runtime: RayRuntime, handle: Any, context: WorkerContext) -> None:
        """Wrap a spawned actor."""
        self.runtime = runtime
        self.handle = handle
        self.worker_id = f"ray-rollout-{context.rank}"
        self.hardware = context.hw
        self.devices = tuple(context.devices)

    async def _call(self, method: str, *args: Any) -> Any:
        return await self.runtime.call(self.handle, method, args, {})

    async def submit(self, request: EngineRequest) -> EngineOutput:
        """Add a request and wait for its output."""
        return await self._call("submit", request)

    async def abort(self, request_id: str) -> bool:
        """Abort one request."""
        return await self._call("abort", request_id)

    async def evict(self, request_ids: list[str] | None = None) -> list[str]:
        """Hand requests back as migrated."""
        return await self._call("evict", request_ids)

    async def suspend(self) -> None:
        """Stop stepping."""
        await self._call("suspend")

    async def resume(self) -> None:
        """Step again."""
        await self._call("resume")

    async def offload(self) -> None:
        """Offload weights."""
        await self._call("offload")

    async def reload(self) -> None:
        """Reload weights."""
        await self._call("reload")

    async def load_weights(self, weights: Mapping[str, Any], version: int) -> None:
        """Ship the tensors to the actor (Ray's object store) and load them as `version`."""
        await self._call("load_weights", {k: v.contiguous() for k, v in weights.items()}, version)

    async def engine_stats(self) -> dict[str, float]:
        """The engine's cumulative counters, for metrics.jsonl."""
        return await self._call("engine_stats")

    async def restart(self) -> None:
        """Restart the engine inside the actor."""
        await self._call("restart")

    async def stop(self) -> None:
        """Stop the worker and remove the actor and its placement group."""
        try:
            await self._call("stop")
        finally:
            await self.runtime.remove(self.handle)


async def start_ray_workers(model_config: Any, seed: int, devices: list[int], hw: str, max_num_seqs: int,
                            timeout_s: float = 120.0) -> list[RayWorkerHandle]:
    """Spawn one RolloutActor per device (Ray must be initialised) and start its worker."""
    runtime = RayRuntime()
    out = []
    for rank, device in enumerate(devices):
        ctx = WorkerContext(owner="rollout", rank=rank, world_size=len(devices), hw=hw, devices=(device,))
        handle = await runtime.spawn(RolloutActor, ctx, (model_config, seed, max_num_seqs), {}, timeout=timeout_s)
        wh = RayWorkerHandle(runtime, handle, ctx)
        await wh._call("start")
        out.append(wh)
    return out
