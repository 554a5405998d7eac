"""Trajectory-level vs batch-level environment interaction under env latency N(mu, sigma), in virtual time.

Workload (paper §7.4, Fig. 12a): B environments, T turns each, per-turn environment latency
~ N(mu=10 s, sigma) clipped at 0, LLM generation a fixed-latency stub (StubLLMClient, L s per call,
unbounded concurrency: the same for both modes). Everything runs on the virtual-clock loop, so the
figures are simulated seconds; wall time is only the Python overhead.

Columns per sigma:
  batch      - EnvGroup: lockstep turns (every generation waits for the slowest step and vice versa)
  traj       - independent EnvManagers, one trajectory each per iteration (iteration ends at the slowest)
  async      - independent EnvManagers running continuously
  failed     - trajectories that ended FAILED (e.g. an environment step over the manager's step
               timeout, 30 s by default: at sigma 10 a N(10, 10) step exceeds it often) out of all
               that ended, per mode
  s / B ok   - seconds per B *finished* trajectories: a failed trajectory is never counted as
               collected, so failures make a mode slower, not faster
  ratio      - batch / traj and batch / async on s / B ok

The LLM stub has a fixed latency and unlimited concurrency (no real engine); the simulator work
replaces it with the real proxy. This script only keeps the comparison honest about failures.

    .venv/bin/python scripts/bench/bench_env_trajectory_vs_batch.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rich.console import Console
from rich.table import Table

from rollart.env.envs.latency import LatencyDistribution, LatencyWrapper
from rollart.env.envs.math_calc import MathCalcEnv
from rollart.env.group import EnvGroup
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.prompts import ChatTemplatePromptBuilder
from rollart.env.stubs import ListSink, StubLLMClient
from rollart.env.tiny_tokenizer import build_tiny_chat_tokenizer
from rollart.env.trajectory import TrajectoryStatus
from rollart.resource.virtual_time import run_virtual


class CountingSink(ListSink):
    """A list sink that calls `on_put` after each trajectory (to stop the continuous run on time)."""

    def __init__(self) -> None:
        super().__init__()
        self.on_put = lambda: None

    def put_nowait(self, trajectory) -> None:
        super().put_nowait(trajectory)
        self.on_put()


def make_managers(prompts, tokenizer, n, turns, mu, sigma, llm_latency, sink, seed):
    managers = []
    for i in range(n):

        def factory(i=i):
            return LatencyWrapper(
                MathCalcEnv(max_tool_calls=1000),
                step_latency=LatencyDistribution("gaussian", mu, sigma),
                seed=seed * 1000 + i,
            )

        llm = StubLLMClient(
            lambda s: tokenizer.encode(s, add_special_tokens=False), ["<calc>2+2</calc>"], latency_s=llm_latency
        )
        cfg = EnvManagerConfig(max_turns=turns, seed=seed + i)
        managers.append(EnvManager(factory, llm, prompts, sink, cfg, name=f"m{i}"))
    return managers


def _tally(trajectories) -> tuple[int, int]:
    """(finished, failed) among ended trajectories; only FINISHED ones are collected."""
    finished = sum(1 for t in trajectories if t.status == TrajectoryStatus.FINISHED)
    failed = sum(1 for t in trajectories if t.status == TrajectoryStatus.FAILED)
    return finished, failed


async def batch_level(managers, iterations):
    """(virtual seconds, finished, failed) over `iterations` lockstep batches."""
    loop, group = asyncio.get_running_loop(), EnvGroup(managers)
    t0, ended = loop.time(), []
    for it in range(iterations):
        ended += await group.run_batch([it * len(managers) + i for i in range(len(managers))])
    return (loop.time() - t0, *_tally(ended))


async def trajectory_level(managers, iterations):
    """(virtual seconds, finished, failed) over `iterations` rounds of one trajectory per manager."""
    loop = asyncio.get_running_loop()
    t0, ended = loop.time(), []
    for it in range(iterations):
        ended += await asyncio.gather(*(m.run_trajectory(seed=it * len(managers) + i) for i, m in enumerate(managers)))
    return (loop.time() - t0, *_tally(ended))


async def continuous(managers, iterations, sink):
    """(virtual seconds, finished, failed) until iterations x B trajectories *finished*."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = [asyncio.create_task(m.run(iter(range(i * 10**6, (i + 1) * 10**6)))) for i, m in enumerate(managers)]
    target = iterations * len(managers)
    reached = asyncio.Event()
    sink.on_put = lambda: reached.set() if _tally(sink.items)[0] >= target else None
    await reached.wait()
    elapsed = loop.time() - t0
    finished, failed = _tally(list(sink.items))  # before the shutdown cancels the ones in flight
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed, finished, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sigmas, fewer environments and iterations")
    parser.add_argument("--envs", type=int, default=None)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--llm-latency", type=float, default=5.0)
    parser.add_argument("--mu", type=float, default=10.0)
    args = parser.parse_args()
    sigmas = [1, 5, 10] if args.quick else list(range(1, 11))
    n_envs = args.envs or (16 if args.quick else 64)
    iterations = 2 if args.quick else 10
    tokenizer = build_tiny_chat_tokenizer()
    prompts = ChatTemplatePromptBuilder(tokenizer)

    table = Table(title=f"virtual seconds per {n_envs} finished trajectories: {n_envs} envs x {args.turns} turns, "
                        f"env N({args.mu}, sigma), LLM stub {args.llm_latency} s, {iterations} iterations")  # fmt: skip
    for col in ("sigma", "batch s / B ok", "batch failed", "traj s / B ok", "traj failed", "ratio",
                "async s / B ok", "async failed", "async ratio"):
        table.add_column(col, justify="right")
    wall0 = time.perf_counter()
    for sigma in sigmas:
        res = {}
        for mode in ("batch", "traj", "async"):
            sink = CountingSink()
            mgrs = make_managers(prompts, tokenizer, n_envs, args.turns, args.mu, sigma, args.llm_latency, sink, sigma)
            if mode == "batch":
                seconds, ok, failed = run_virtual(batch_level(mgrs, iterations)).result
            elif mode == "traj":
                seconds, ok, failed = run_virtual(trajectory_level(mgrs, iterations)).result
            else:
                seconds, ok, failed = run_virtual(continuous(mgrs, iterations, sink)).result
            per_b = seconds / (ok / n_envs) if ok else float("inf")
            res[mode] = (per_b, f"{failed}/{ok + failed}")
        table.add_row(
            str(sigma), f"{res['batch'][0]:.1f}", res["batch"][1], f"{res['traj'][0]:.1f}", res["traj"][1],
            f"{res['batch'][0] / res['traj'][0]:.2f}x", f"{res['async'][0]:.1f}", res["async"][1],
            f"{res['batch'][0] / res['async'][0]:.2f}x",
        )  # fmt: skip
    console = Console(width=120)
    console.print(table)
    console.print(f"paper (Fig. 12a): 1.23x (sigma=1) .. 2.27x (sigma=10); wall time {time.perf_counter() - wall0:.1f} s")


if __name__ == "__main__":
    main()
