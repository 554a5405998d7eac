"""Pipeline modes on the CPU demo workload: tokens/s and step time, sync vs one_off vs async vs time_sharing.

    python scripts/bench/bench_scheduler_modes.py [--quick]

Every mode runs the same demo workload (tiny random-init model, FrozenLake + math, batch 64 in
groups of 8, two rollout workers and one trainer device) in this one process, one after the
other, with a warm-up iteration dropped; time_sharing runs twice, with the cost-aware default
policy and with the ROLL-like "always shrink" policy. Ratios are against sync measured in the
same run. On a CPU the "devices" are logical: lending a rollout worker to the trainer does not
make the trainer faster here, so time_sharing shows its switch cost, not its speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from statistics import mean

from rich.console import Console
from rich.table import Table

from rollart.scheduler.builder import build_pipeline
from rollart.scheduler.config import parse_config

MODES = [("sync", "sync", None), ("one_off", "one_off", None), ("async", "async", None),
         ("time_sharing (cost-aware)", "time_sharing", "cost_aware"),
         ("time_sharing (always shrink)", "time_sharing", "always_shrink")]


def workload(mode: str, policy: str | None) -> dict:
    return {
        "run": {"seed": 0, "tensorboard": False},
        "pipeline": {"mode": mode, "alpha": 0 if mode == "sync" else 1, "batch_size": 64, "group_size": 8,
                     "redundancy": 1.25},
        "time_sharing": {"policy": policy or "cost_aware", "slots_per_device": 16},
        "rollout": {"pools": [{"name": "rollout", "devices": 2}]},
        "tasks": [{"env": "frozenlake", "weight": 2.0, "max_turns": 8}, {"env": "math", "max_turns": 4}],
    }


async def measure(mode: str, policy: str | None, iterations: int) -> dict:
    cfg = parse_config(workload(mode, policy))
    pipe = await build_pipeline(cfg, tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    t0 = time.perf_counter()
    try:
        recs = await pipe.run(iterations + 1)
    finally:
        await pipe.close()
    wall = time.perf_counter() - t0
    recs = recs[1:]  # drop the warm-up iteration
    return {
        "step_s": mean(r["step_time_s"] for r in recs),
        "tokens_per_s": mean(r["tokens_per_s"] for r in recs),
        "train_s": mean(r["train_s"] for r in recs),
        "aborted": mean(r["aborted"] for r in recs),
        "switch_s": mean(r["switch_cost_s"] for r in recs),
        "lent": mean(r["lent_devices"] for r in recs),
        "reward_last": recs[-1]["reward_mean"],
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 measured iterations per mode instead of 10")
    args = parser.parse_args(argv)
    iterations = 3 if args.quick else 10
    results = {name: asyncio.run(measure(mode, policy, iterations)) for name, mode, policy in MODES}
    base = results["sync"]
    table = Table(title=f"pipeline modes, CPU demo workload ({iterations} iterations each after 1 warm-up)")
    for col in ("mode", "step s", "tokens/s", "vs sync (tokens/s)", "train s", "aborted/iter", "switch s", "lent"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['step_s']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x",
                      f"{r['train_s']:.2f}", f"{r['aborted']:.1f}", f"{r['switch_s']:.3f}", f"{r['lent']:.1f}")
    Console(width=150).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
