"""Trajectory-level vs batch-level environment interaction under env latency N(mu, sigma), in virtual time.

Workload (paper §7.4, Fig. 12a): B environments, T turns each, per-turn environment latency
~ N(mu=10 s, sigma) clipped at 0, LLM generation a fixed-latency stub (StubLLMClient, L s per call,
unbounded concurrency: the same for both modes). Everything runs on the virtual-clock loop, so the
figures are simulated seconds; wall time is only the Python overhead.

Columns per sigma:
  batch      - EnvGroup: lockstep turns (every generation waits for the slowest step and vice versa)
  traj       - independent EnvManagers, one trajectory each per iteration (iteration ends at the slowest)
  async      - independent EnvManagers running continuously; time per B collected trajectories
  ratio      - batch / traj (the paper's comparison), async ratio = batch / async

    .venv/bin/python scripts/bench/bench_env_trajectory_vs_batch.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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


async def batch_level(managers, iterations):
    loop, group = asyncio.get_running_loop(), EnvGroup(managers)
    times = []
    for it in range(iterations):
        t0 = loop.time()
        await group.run_batch([it * len(managers) + i for i in range(len(managers))])
        times.append(loop.time() - t0)
    return statistics.mean(times)


async def trajectory_level(managers, iterations):
    loop = asyncio.get_running_loop()
    times = []
    for it in range(iterations):
        t0 = loop.time()
        await asyncio.gather(*(m.run_trajectory(seed=it * len(managers) + i) for i, m in enumerate(managers)))
        times.append(loop.time() - t0)
    return statistics.mean(times)


async def continuous(managers, iterations, sink):
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = [asyncio.create_task(m.run(iter(range(i * 10**6, (i + 1) * 10**6)))) for i, m in enumerate(managers)]
    target = iterations * len(managers)
    reached = asyncio.Event()
    sink.on_put = lambda: reached.set() if len(sink.items) >= target else None
    await reached.wait()
    elapsed = loop.time() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed / iterations


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

    table = Table(title=f"step time (virtual s): {n_envs} envs x {args.turns} turns, env N({args.mu}, sigma), "
                        f"LLM stub {args.llm_latency} s, mean of {iterations} iterations")  # fmt: skip
    for col in ("sigma", "batch-level", "trajectory-level", "ratio", "async (continuous)", "async ratio"):
        table.add_column(col, justify="right")
    wall0 = time.perf_counter()
    for sigma in sigmas:
        res = {}
        for mode in ("batch", "traj", "async"):
            sink = CountingSink()
            mgrs = make_managers(prompts, tokenizer, n_envs, args.turns, args.mu, sigma, args.llm_latency, sink, sigma)
            if mode == "batch":
                res[mode] = run_virtual(batch_level(mgrs, iterations)).result
            elif mode == "traj":
                res[mode] = run_virtual(trajectory_level(mgrs, iterations)).result
            else:
                res[mode] = run_virtual(continuous(mgrs, iterations, sink)).result
        table.add_row(
            str(sigma), f"{res['batch']:.1f}", f"{res['traj']:.1f}", f"{res['batch'] / res['traj']:.2f}x",
            f"{res['async']:.1f}", f"{res['batch'] / res['async']:.2f}x",
        )  # fmt: skip
    console = Console(width=120)
    console.print(table)
    console.print(f"paper (Fig. 12a): 1.23x (sigma=1) .. 2.27x (sigma=10); wall time {time.perf_counter() - wall0:.1f} s")


if __name__ == "__main__":
    main()
