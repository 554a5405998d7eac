"""Reward-as-a-Service throughput and tail latency vs calling the reward function in-process.

A real service process (uvicorn, N workers, SQLite idempotency cache) on 127.0.0.1 scores one
trajectory per request with the `math` rule reward (math-verify); every request has a fresh
idempotency key, so nothing is served from the cache. The baseline awaits the same function in
this process at the same concurrency. Columns: requests/s and p50/p99 latency per concurrency.

    .venv/bin/python scripts/bench/bench_reward_service.py [--quick] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import httpx
from rich.console import Console
from rich.table import Table

from rollart.env.trajectory import Trajectory, Turn
from rollart.reward.client import RewardClient
from rollart.reward.rules import MathAnswerReward

TOKEN = "bench-token-0123456789"


def make_traj(i: int) -> Trajectory:
    a, b = i % 97, (i * 7) % 89
    return Trajectory(
        id=f"bench-{uuid.uuid4().hex[:8]}-{i}",
        turns=[Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[-0.1], response_text=f"<answer>{a + b}</answer>")],
        info={"ground_truth": str(a + b)},
    )


async def run_load(call, n: int, concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            t0 = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0, latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(workers: int, cache_path: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"token": TOKEN, "port": port, "workers": workers, "cache_path": cache_path, "max_concurrency": 256}
    proc = subprocess.Popen([sys.executable, "-m", "rollart.reward.service", "--config-json", json.dumps(config)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError("service did not become healthy")


async def bench(args) -> None:
    reward = MathAnswerReward()
    levels = [1, 16, 64]
    n = 150 if args.quick else 600
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(args.workers, os.path.join(tmp, "cache.sqlite"))
        client = RewardClient(url, TOKEN, timeout_s=30)
        try:
            await run_load(lambda i: client.score("math", make_traj(i)), 20, 4)  # warm up the workers
            await run_load(lambda i: reward.score(make_traj(i)), 20, 4)
            for c in levels:
                trajs = [make_traj(i) for i in range(n)]
                wall_s, lat_s = await run_load(lambda i, t=trajs: client.score("math", t[i]), n, c)
                trajs = [make_traj(i) for i in range(n)]
                wall_p, lat_p = await run_load(lambda i, t=trajs: reward.score(t[i]), n, c)
                rows.append((c, n / wall_s, pct(lat_s, 0.5), pct(lat_s, 0.99), n / wall_p, pct(lat_p, 0.5), pct(lat_p, 0.99)))
        finally:
            await client.aclose()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
    table = Table(title=f"reward 'math' (math-verify): service ({args.workers} workers, HTTP + SQLite cache) vs in-process, {n} requests per level")
    for col in ("concurrency", "service req/s", "service p50 ms", "service p99 ms", "in-process req/s",
                "in-process p50 ms", "in-process p99 ms", "service / in-process"):  # fmt: skip
        table.add_column(col, justify="right")
    for c, rs, p50s, p99s, rp, p50p, p99p in rows:
        table.add_row(str(c), f"{rs:.0f}", f"{p50s * 1e3:.1f}", f"{p99s * 1e3:.1f}", f"{rp:.0f}", f"{p50p * 1e3:.1f}",
                      f"{p99p * 1e3:.1f}", f"{rs / rp:.2f}x")  # fmt: skip
    Console(width=170).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="150 requests per concurrency level instead of 600")
    parser.add_argument("--workers", type=int, default=2)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
