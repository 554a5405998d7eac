"""Proxy overhead per request, and as a share of the engine's own time for the same requests.

The control plane is timed against a SimEngine with ``time_scale=0`` (it computes its roofline but
does not sleep), so the difference between a path and the engine called directly is pure
control-plane cost: routing, the worker's command queue, futures, and for Ray the actor calls.
Each request asks for ``max_tokens`` tokens of a 32-token prompt; ``concurrency`` are in flight.

A microsecond figure alone says nothing about whether it matters, so the overhead is also given as
a share of what an engine spends on the same requests:
  modelled - the SimEngine roofline seconds (Qwen3-8B on an H20) of the direct run;
  real     - a TorchEngine on the tiny local Llama, float32 on this CPU, measured on its own
             ``--torch-requests`` requests (same prompt, max_tokens and concurrency) and given
             per request (it is ~1000x slower than the control plane, so a full run would take hours).

Rows (every row times all N requests, Ray included; the paths run in interleaved rounds and the
table gives the median over rounds with the min-max spread):
  engine direct   - add_request + step loop on the engine itself (the baseline)
  worker.submit   - InferenceWorker command loop, no proxy
  proxy (local)   - LLMProxy.generate over in-process workers
  proxy (ray)     - LLMProxy.generate over a RayWorkerHandle actor (local Ray on 127.0.0.1)

    .venv/bin/python scripts/bench/bench_proxy_overhead.py [--quick] [--no-ray] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from functools import partial

from bench_stats import fmt, rounds
from rich.console import Console
from rich.table import Table

from rollart.proxy.proxy import LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.types import EngineRequest, GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker

PATHS = ("engine direct", "worker.submit", "proxy (local)", "proxy (ray)")


def make_engine() -> SimEngine:
    return SimEngine(QWEN3_8B, lookup_hardware("H20"), time_scale=0.0)


def requests(n: int, max_tokens: int) -> list[GenerateRequest]:
    return [GenerateRequest(tuple(range(1, 33)), SamplingParams(max_tokens=max_tokens, temperature=0), f"r{i}", f"t{i}")
            for i in range(n)]


async def run_direct(engine, reqs: list[GenerateRequest], concurrency: int) -> float:
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


async def time_path(path: str, reqs: list[GenerateRequest], concurrency: int, modelled: list[float]) -> float:
    """Seconds for all of `reqs` through one path (a fresh engine / worker / actor each time)."""
    if path == "engine direct":
        engine = make_engine()
        seconds = await run_direct(engine, reqs, concurrency)
        modelled.append(engine.stats["prefill_s"] + engine.stats["decode_s"])
        return seconds
    if path == "worker.submit":
        return await bench_worker(reqs, concurrency)
    if path == "proxy (local)":
        local = [InferenceWorker("w0", make_engine)]
        await local[0].start()
        return await bench_proxy(reqs, concurrency, local)
    from rollart.proxy.ray_worker import RayWorkerHandle

    handle = await RayWorkerHandle.create("ray0", partial(make_engine), actor_options={"num_cpus": 0})
    return await bench_proxy(reqs, concurrency, [handle])


async def torch_engine_seconds_per_request(n: int, max_tokens: int, concurrency: int) -> float:
    """A real engine's time per request on this machine: TorchEngine, tiny Llama, float32 CPU."""
    from rollart.proxy.testing import build_tiny_model
    from rollart.proxy.torch_engine import TorchEngine

    engine = TorchEngine.from_pretrained(build_tiny_model(tempfile.mkdtemp(prefix="rollart-bench-")),
                                         max_num_seqs=concurrency, offload_to_thread=False)
    await run_direct(engine, requests(concurrency, max_tokens), concurrency)  # warm-up
    return await run_direct(engine, requests(n, max_tokens), concurrency) / n


async def main_async(args: argparse.Namespace) -> None:
    n = 200 if args.quick else 2000
    repeats = args.repeats or (2 if args.quick else 3)
    paths = PATHS[:3] if args.no_ray else PATHS
    if not args.no_ray:
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    table = Table(title=f"Proxy overhead per request ({n} requests in every row, {args.concurrency} in flight; "
                        f"median (min-max) of {repeats} interleaved rounds)")
    for col in ("path", "max_tokens", "us / request", "overhead us / request", "share of modelled engine",
                "share of real engine"):
        table.add_column(col, justify="right")
    notes = []
    for max_tokens in (1, 16):
        reqs = requests(n, max_tokens)
        seconds: dict[str, list[float]] = {p: [0.0] * repeats for p in paths}
        modelled: list[float] = []
        for r, path in rounds(paths, repeats):
            seconds[path][r] = await time_path(path, reqs, args.concurrency, modelled)
        real_per_req = await torch_engine_seconds_per_request(args.torch_requests, max_tokens, args.concurrency)
        model_per_req = modelled[0] / n
        notes.append(f"max_tokens={max_tokens}: modelled engine {model_per_req * 1e6:.0f} us/request "
                     f"(SimEngine roofline, Qwen3-8B on H20, batch {args.concurrency}); real engine "
                     f"{real_per_req * 1e6:.0f} us/request (TorchEngine, tiny Llama, CPU, {args.torch_requests} requests)")
        base = seconds["engine direct"]
        for path in paths:
            over = [(t - b) / n for t, b in zip(seconds[path], base)]
            table.add_row(path, str(max_tokens), fmt(seconds[path], ".0f", 1e6 / n), fmt(over, ".0f", 1e6),
                          fmt([o / model_per_req for o in over], ".1%"), fmt([o / real_per_req for o in over], ".2%"))
    console = Console(width=200)
    console.print(table)
    for note in notes:
        console.print(note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray row")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3, quick 2)")
    parser.add_argument("--torch-requests", type=int, default=64, help="requests timed on the real TorchEngine")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
