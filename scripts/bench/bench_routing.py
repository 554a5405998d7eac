"""Routing cost against worker count: the O(log n) load index (D16) vs a view of every worker.

Rows (interleaved, repeated; median and min-max spread):
  decision   - one routing decision plus the load updates of routing and releasing one request, on a
               proxy of N SimEngine workers holding random loads (``LLMProxy._acquire``/``_release``);
               ``index`` is the default AffinityRouter path, ``views`` the pre-D16 path (a RoutingPolicy
               that is not an AffinityRouter gets a WorkerView of every active worker per decision).
  end to end - N H20 SimEngine workers (Qwen3-8B roofline) in virtual time, one 2-turn trajectory per
               worker (turn 2 extends turn 1's context), through LLMProxy.generate; wall seconds for
               the whole run; every request must finish with reason "length" or the row fails.
               ``index+quantum`` adds SimEngine(decode_quantum_s=0.1) (proxy D19: several decode tokens
               per engine step while nothing finishes; same tokens and finish times).

    .venv/bin/python scripts/bench/bench_routing.py [--quick] [--sizes 100,1000,3000] [--e2e-only]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from functools import partial

from rollart.proxy.proxy import LLMProxy, _Track
from rollart.proxy.routing import AffinityRouter, WorkerView
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.types import EngineRequest, GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker
from rollart.resource.virtual_time import run_virtual


class ViewRouter:
    """The pre-D16 path: the same decision, from a view of every active worker."""

    def __init__(self, affinity=None) -> None:
        self.inner = AffinityRouter(affinity)

    def hardware_for(self, tag: str):
        return self.inner.hardware_for(tag)

    def choose(self, request: GenerateRequest, workers: Sequence[WorkerView], sticky_rank: int | None) -> int | None:
        return self.inner.choose(request, workers, sticky_rank)


def pool(n: int, quantum: float = 0.0) -> list[InferenceWorker]:
    hw = ["H800" if i % 4 == 0 else "H20" for i in range(n)]
    return [InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware(h), decode_quantum_s=quantum),
                            hardware=h, devices=(i,)) for i, h in enumerate(hw)]


async def decisions(n: int, mode: str, count: int) -> float:
    """Seconds per routing decision (+ its acquire/release updates), workers not started (no serving)."""
    router = AffinityRouter({"lake": "H800", "default": "H20"}) if mode == "index" else ViewRouter({"lake": "H800", "default": "H20"})
    proxy = LLMProxy(pool(n), router=router, max_inflight_per_worker=64)
    rng = random.Random(0)
    for slot in proxy.slots:  # background load so the choice is not trivial
        for j in range(rng.randrange(0, 8)):
            slot.inflight[f"bg{slot.rank}-{j}"] = rng.randrange(100, 5000)
    loop = asyncio.get_running_loop()
    tracks = []
    for i in range(count):
        r = GenerateRequest((1, 2, 3), SamplingParams(max_tokens=rng.randrange(10, 500)), f"q{i}", f"t{i}",
                            tag="lake" if i % 3 == 0 else "math")
        tracks.append(_Track(r, EngineRequest(r.request_id, r.prompt_ids, r.params, r.trajectory_id)))
    deadline = loop.time() + 3600
    t0 = time.perf_counter()
    for track in tracks:
        slot = await proxy._acquire(track, deadline, None)
        proxy._release(slot, track)
    return (time.perf_counter() - t0) / count


async def end_to_end(n: int, mode: str) -> int:
    workers = pool(n, 0.1 if mode == "index+quantum" else 0.0)
    for w in workers:
        await w.start()
    router = ViewRouter({"lake": "H800", "default": "H20"}) if mode == "views" else AffinityRouter({"lake": "H800", "default": "H20"})
    proxy = LLMProxy(workers, router=router)

    async def trajectory(i: int) -> list[str]:
        prompt = tuple(range(1, 513))
        tag = "lake" if i % 4 == 0 else "math"
        first = await proxy.generate(GenerateRequest(prompt, SamplingParams(max_tokens=128), trajectory_id=f"t{i}", tag=tag))
        prompt2 = prompt + first.token_ids + tuple(range(1, 65))
        second = await proxy.generate(GenerateRequest(prompt2, SamplingParams(max_tokens=128), trajectory_id=f"t{i}", tag=tag))
        return [first.finish_reason, second.finish_reason]

    reasons = await asyncio.gather(*(trajectory(i) for i in range(n)))
    await proxy.close()
    done = sum(r == ["length", "length"] for r in reasons)
    assert done == n, f"{n - done} trajectories did not finish"
    return done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--e2e-only", action="store_true")
    args = ap.parse_args()
    sizes = [100, 1000] if args.quick else [100, 1000, 3000]
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    repeats = 2 if args.quick else 3
    count = 300 if args.quick else 1000
    print("| row | workers | mode | median | spread (min-max) | repeats |")
    print("|---|---|---|---|---|---|")
    for n in ([] if args.e2e_only else sizes):
        per: dict[str, list[float]] = {"views": [], "index": []}
        for _ in range(repeats):
            for mode in ("views", "index"):  # interleaved
                per[mode].append(run_virtual(decisions(n, mode, count)).result)
        for mode, xs in per.items():
            print(f"| decision (+2 updates) | {n} | {mode} | {statistics.median(xs) * 1e6:.1f} us | "
                  f"{min(xs) * 1e6:.1f}-{max(xs) * 1e6:.1f} us | {repeats} |")
    for n in sizes:
        per = {"views": [], "index": [], "index+quantum": []}
        e2e_repeats = 1 if (n >= 3000 or args.quick) else 2
        for _ in range(e2e_repeats):
            for mode in per:
                run = run_virtual(end_to_end(n, mode))
                per[mode].append(run.wall_s)
        for mode, xs in per.items():
            print(f"| end to end, {n} x 2-turn trajectories (all finished) | {n} | {mode} | {statistics.median(xs):.2f} s wall | "
                  f"{min(xs):.2f}-{max(xs):.2f} s | {e2e_repeats} |")


if __name__ == "__main__":
    main()
