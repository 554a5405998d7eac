"""Step 8: the same proxy over Ray async actors running TorchEngine workers."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from rollart.proxy.proxy import ACTIVE, OFFLOADED, LLMProxy
from rollart.proxy.testing import prompts_of_mixed_lengths
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, GenerateRequest, SamplingParams

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=48, temperature=0)


async def reference_outputs(path: str, prompts: list[list[int]]) -> list[tuple[int, ...]]:
    engine = TorchEngine.from_pretrained(path, offload_to_thread=False)
    for i, p in enumerate(prompts):
        engine.add_request(EngineRequest(str(i), tuple(p), GREEDY))
    outs = {}
    while engine.has_work():
        for o in await engine.step():
            outs[o.request_id] = o.token_ids
    return [outs[str(i)] for i in range(len(prompts))]


async def ray_pool(path: str, n: int):
    from rollart.proxy.ray_worker import RayWorkerHandle

    return [
        await RayWorkerHandle.create(f"ray{i}", partial(TorchEngine.from_pretrained, path), hardware="H20",
                                     devices=(i,), actor_options={"resources": {"H20": 1}})
        for i in range(n)
    ]


async def wait_for_progress(handle, steps: int) -> None:
    for _ in range(2000):  # bounded: ~20 s
        if (await handle.stats()).steps >= steps:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("worker made no progress")


async def test_ray_shrink_mid_generation_migrates_and_all_complete(ray_cluster, tiny_model_path):
    prompts = prompts_of_mixed_lengths(8, seed=41)
    expected = await reference_outputs(tiny_model_path, prompts)
    events = []
    handles = await ray_pool(tiny_model_path, 2)
    proxy = LLMProxy(handles, on_event=lambda kind, data: events.append((kind, data)))
    tasks = [asyncio.ensure_future(proxy.generate(GenerateRequest(tuple(p), GREEDY, f"r{i}", f"t{i}"))) for i, p in enumerate(prompts)]
    await wait_for_progress(handles[0], 4)
    devices = await proxy.shrink([0])
    states = [s.state for s in proxy.slots]
    out = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    await proxy.close()
    assert devices == [0] and states == [OFFLOADED, ACTIVE]
    moved = [d for kind, d in events if kind == "handed_back"]
    assert moved and all(0 < len(d["token_ids"]) < GREEDY.max_tokens for d in moved)
    for r, exp in zip(out, expected):
        assert r.finish_reason == "length" and len(r.token_ids) == GREEDY.max_tokens
        assert r.token_ids == exp  # greedy continuation after KV recompute is the uninterrupted one
    assert {r.worker_ids[-1] for r in out} == {"ray1"}


async def test_ray_actor_crash_restarts_and_requests_complete(ray_cluster, tiny_model_path):
    prompts = prompts_of_mixed_lengths(4, seed=43)
    expected = await reference_outputs(tiny_model_path, prompts)
    handles = await ray_pool(tiny_model_path, 2)
    proxy = LLMProxy(handles)
    tasks = [asyncio.ensure_future(proxy.generate(GenerateRequest(tuple(p), GREEDY, f"c{i}", f"u{i}"))) for i, p in enumerate(prompts)]
    await wait_for_progress(handles[0], 2)
    handles[0].kill()
    out = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    for _ in range(240):  # bounded (120 s): the requests moved on without waiting for the restart (D53)
        if proxy.slots[0].state == ACTIVE:
            break
        await asyncio.sleep(0.5)
    counters = dict(proxy.counters)
    slot_states = [(s.state, s.restarts) for s in proxy.slots]
    await proxy.close()
    assert [r.token_ids for r in out] == expected
    assert counters["failures"] == 1 and counters["finished"] == 4
    assert slot_states[0] == (ACTIVE, 1)


async def test_ray_health_check_restarts_a_killed_idle_actor(ray_cluster):
    """Issue 12 item 8: a killed actor with nothing in flight is found by the health check (before the fix it
    stayed ACTIVE until a request failed on it)."""
    from rollart.proxy.ray_worker import RayWorkerHandle
    from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware

    factory = partial(SimEngine, QWEN3_8B, lookup_hardware("H20"))
    handles = [await RayWorkerHandle.create(f"idle{i}", factory, hardware="H20", devices=(i,),
                                            actor_options={"resources": {"H20": 1}}) for i in range(2)]
    events = []
    proxy = LLMProxy(handles, health_check_interval_s=0.5, health_check_timeout_s=20.0,
                     on_event=lambda kind, data: events.append(kind))
    try:
        handles[0].kill()
        for _ in range(600):  # bounded: ~60 s
            # the event, not the slot's state: the slot turns ACTIVE before its resume() call returns
            if "worker_restarted" in events:
                break
            await asyncio.sleep(0.1)
        assert [(s.state, s.restarts) for s in proxy.slots] == [(ACTIVE, 1), (ACTIVE, 0)]
        assert proxy.counters["failures"] == 1 and proxy.counters["submitted"] == 0  # no request was needed
        assert "health_check_failed" in events and "worker_restarted" in events
        assert await proxy.check_health() == {0: "ok", 1: "ok"}  # the new actor answers
        out = await asyncio.wait_for(proxy.generate(GenerateRequest((5, 6, 7), SamplingParams(max_tokens=4))), 60)
        assert out.finish_reason == "length"
    finally:
        await proxy.close()
