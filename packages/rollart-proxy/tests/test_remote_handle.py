"""Issue 14 item 5: the proxy's commands are written once, in RemoteWorkerHandle, over one `call`."""

from __future__ import annotations

import asyncio
from functools import partial

from rollart.proxy.proxy import LLMProxy
from rollart.proxy.ray_worker import RemoteWorkerHandle
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import run_virtual
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker


class InProcessHandle(RemoteWorkerHandle):
    """The smallest transport: `call` runs the method on a worker in this process, and records it."""

    def __init__(self, worker: InferenceWorker) -> None:
        self.worker = worker
        self.worker_id, self.hardware, self.devices = worker.worker_id, worker.hardware, worker.devices
        self.calls: list[str] = []

    async def call(self, method, *args):
        self.calls.append(method)
        result = getattr(self.worker, method)(*args)
        return await result if asyncio.isfuture(result) or asyncio.iscoroutine(result) else result


def test_the_proxy_serves_shrinks_and_probes_through_one_call():
    async def go():
        workers = [InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware("H20")), devices=(i,))
                   for i in range(2)]
        for w in workers:
            await w.start()
        handles = [InProcessHandle(w) for w in workers]
        proxy = LLMProxy(handles)
        req = GenerateRequest(tuple(range(1, 20)), SamplingParams(max_tokens=50), "r0", "t0")
        out = await proxy.generate(req)
        await proxy.shrink([1])
        await proxy.expand([1])
        health = await proxy.check_health()
        await proxy.close()
        return out, health, handles

    out, health, handles = run_virtual(go())
    assert len(out.token_ids) == 50 and health == {0: "ok", 1: "ok"}
    every = set(handles[0].calls) | set(handles[1].calls)
    assert {"submit", "evict", "offload", "reload", "probe", "stop"} <= every
