"""Step 25: one virtual hour of multi-turn serving (SimEngine workers behind the real LLMProxy) runs in
virtual time on rollart-resource's VirtualTimeLoop and is deterministic for a seed."""

from __future__ import annotations

import asyncio
from functools import partial

from rollart.proxy.proxy import LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker
from rollart.resource.virtual_time import VirtualTimeLoop, run_virtual

HOUR = 3600.0


async def serve_one_hour(n_workers: int = 4, n_trajectories: int = 12) -> dict:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    rng = loop.rng  # the run's seeded randomness: env latencies and observation lengths
    hw = ["H800" if i % 3 == 0 else "H20" for i in range(n_workers)]
    workers = [InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware(h), seed=i), hardware=h, devices=(i,))
               for i, h in enumerate(hw)]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers, affinity={"lake": "H800", "default": "H20"})
    turns: list[int] = [0] * n_trajectories

    async def trajectory(i: int) -> None:
        tag = "lake" if i % 2 == 0 else "math"
        context: tuple[int, ...] = tuple(range(1, 200 + 10 * i))
        while loop.time() < HOUR:
            out = await proxy.generate(GenerateRequest(context, SamplingParams(max_tokens=16), trajectory_id=f"t{i}", tag=tag))
            assert out.finish_reason == "length" and len(out.token_ids) == 16
            turns[i] += 1
            await asyncio.sleep(rng.lognormvariate(3.0, 0.8))  # env latency: median 20 s, long tail
            context = context + out.token_ids + tuple(range(1, rng.randint(10, 60)))

    await asyncio.gather(*(trajectory(i) for i in range(n_trajectories)))
    stats = [w.engine.stats for w in workers]
    await proxy.close()
    return {"turns": turns, "end": loop.time(), "counters": dict(proxy.counters),
            "hits": [s["prefix_hit_tokens"] for s in stats]}


def test_one_virtual_hour_of_multi_turn_serving_is_deterministic():
    a = run_virtual(serve_one_hour(), seed=3)
    b = run_virtual(serve_one_hour(), seed=3)
    c = run_virtual(serve_one_hour(), seed=4)
    assert a.virtual_s >= HOUR and a.result["end"] >= HOUR
    assert a.result == b.result and a.virtual_s == b.virtual_s  # same seed, same outcome, to the token
    assert a.result != c.result
    assert sum(a.result["turns"]) == a.result["counters"]["finished"] > 12 * 60  # every request answered
    assert a.result["counters"]["aborted"] == 0
    assert sum(a.result["hits"]) > 0  # later turns reuse their trajectory's prefix (stickiness + cache)
