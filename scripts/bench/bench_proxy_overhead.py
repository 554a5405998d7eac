"""Proxy overhead per request: LLMProxy (in-process and over Ray) against calling the engine directly.

The engine is SimEngine with ``time_scale=0`` (it computes its roofline but does not sleep), so
what is timed is pure control-plane cost: routing, the worker's command queue, futures, and for
Ray the actor calls. Each request asks for ``max_tokens`` tokens of a short prompt; ``concurrency``
requests are in flight at once.

Rows:
  engine direct   - add_request + step loop on the engine itself (the baseline)
  worker.submit   - InferenceWorker command loop, no proxy
  proxy (local)   - LLMProxy.generate over in-process workers
  proxy (ray)     - LLMProxy.generate over RayWorkerHandle actors (local Ray on 127.0.0.1)

    .venv/bin/python scripts/bench/bench_proxy_overhead.py [--quick] [--no-ray]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from functools import partial

from rich.console import Console
from rich.table import Table

from rollart.proxy.proxy import LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.types import EngineRequest, GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker


def make_engine() -> SimEngine:
    return SimEngine(QWEN3_8B, lookup_hardware("H20"), time_scale=0.0)


def requests(n: int, max_tokens: int) -> list[GenerateRequest]:
    return [GenerateRequest(tuple(range(1, 33)), SamplingParams(max_tokens=max_tokens), f"r{i}", f"t{i}") for i in range(n)]


async def bench_direct(reqs: list[GenerateRequest], concurrency: int) -> float:
    engine = make_engine()
    start = time.perf_counter()
    for lo in range(0, len(reqs), concurrency):
        for r in reqs[lo : lo + concurrency]:
            engine.add_request(EngineRequest(r.request_id, r.prompt_ids, r.params, r.trajectory_id))
        while engine.has_work():
            await engine.step()
    return time.perf_counter() - start


async def bench_worker(reqs: list[GenerateRequest], concurrency: int) -> float:
    worker = InferenceWorker("w", make_engine)
    await worker.start()
    start = time.perf_counter()
    for lo in range(0, len(reqs), concurrency):
        await asyncio.gather(*(worker.submit(EngineRequest(r.request_id, r.prompt_ids, r.params, r.trajectory_id))
                               for r in reqs[lo : lo + concurrency]))
    elapsed = time.perf_counter() - start
    await worker.stop()
    return elapsed


async def bench_proxy(reqs: list[GenerateRequest], concurrency: int, workers: list) -> float:
    proxy = LLMProxy(workers, max_inflight_per_worker=concurrency)
    start = time.perf_counter()
    for lo in range(0, len(reqs), concurrency):
        await asyncio.gather(*(proxy.generate(r) for r in reqs[lo : lo + concurrency]))
    elapsed = time.perf_counter() - start
    await proxy.close()
    return elapsed


async def main_async(args: argparse.Namespace) -> None:
    n = 200 if args.quick else 2000
    rows = []
    for max_tokens in (1, 16):
        reqs = requests(n, max_tokens)
        direct = await bench_direct(reqs, args.concurrency)
        rows.append(("engine direct", max_tokens, direct))
        rows.append(("worker.submit", max_tokens, await bench_worker(reqs, args.concurrency)))
        local = [InferenceWorker("w0", make_engine)]
        await local[0].start()
        rows.append(("proxy (local)", max_tokens, await bench_proxy(reqs, args.concurrency, local)))
        if not args.no_ray:
            import ray

            from rollart.proxy.ray_worker import RayWorkerHandle

            if not ray.is_initialized():
                ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
            handle = await RayWorkerHandle.create("ray0", partial(make_engine), actor_options={"num_cpus": 0})
            ray_n = reqs[: max(n // 10, 50)]
            t = await bench_proxy(ray_n, args.concurrency, [handle])
            rows.append(("proxy (ray)", max_tokens, t * len(reqs) / len(ray_n)))
    table = Table(title=f"Proxy overhead per request ({n} requests, {args.concurrency} in flight, SimEngine time_scale=0)")
    for col in ("path", "max_tokens", "us / request", "vs engine direct", "overhead us / request"):
        table.add_column(col, justify="right")
    base = {mt: t for name, mt, t in rows if name == "engine direct"}
    for name, mt, t in rows:
        table.add_row(name, str(mt), f"{t / n * 1e6:.0f}", f"{t / base[mt]:.2f}x", f"{(t - base[mt]) / n * 1e6:.0f}")
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray row")
    parser.add_argument("--concurrency", type=int, default=32)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
