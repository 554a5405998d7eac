"""Pipeline modes on the CPU demo workload: tokens/s and step time, sync vs one_off vs async vs time_sharing.

    python scripts/bench/bench_scheduler_modes.py [--quick] [--repeats N] [--iterations N]

Every mode runs the same demo workload (tiny random-init model, FrozenLake + math, batch 64 in
groups of 8, two rollout workers and one trainer device) in this one process; time_sharing runs
twice, with the cost-aware default policy and with the ROLL-like "always shrink" policy. The modes
run in rounds (one run of each per round, the order rotated each round; each run drops its
warm-up iteration), and the table gives the median over rounds with the min-max spread. Ratios
are per-round ratios against sync, so load that drifts between rounds on a shared machine cancels.

Two token rates, because aborted trajectories cost generation but train nothing:
  generated tok/s - every response token generated during the step, aborted trajectories included
                    (the pipeline's own `tokens_per_s`);
  trained tok/s   - the response tokens of the batches the trainer consumed, over the step time:
                    the headline, and the ratio column.
A row also says how many devices the time-sharing policy lent (the cost-aware policy may lend
none, and then it measured the asynchronous pipeline plus its policy check, not time sharing).
On a CPU the "devices" are logical: lending a rollout worker to the trainer does not make the
trainer faster here, so time_sharing shows its switch cost, not its speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from statistics import mean, median

from bench_stats import fmt, ratio_fmt, rounds
from rich.console import Console
from rich.table import Table

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config

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
    trained: list[int] = []  # policy tokens of every batch the trainer consumed, in order
    train_step = pipe.parts.trainer.train_step

    def counting_train_step(batch):
        trained.append(int(batch.num_policy_tokens))
        return train_step(batch)

    pipe.parts.trainer.train_step = counting_train_step
    t0 = time.perf_counter()
    try:
        recs = await pipe.run(iterations + 1)
    finally:
        await pipe.close()
    wall = time.perf_counter() - t0
    recs, kept = recs[1:], trained[1:]  # drop the warm-up iteration
    steps = sum(r["step_time_s"] for r in recs)
    return {
        "step_s": mean(r["step_time_s"] for r in recs),
        "generated_tok_s": mean(r["tokens_per_s"] for r in recs),
        "trained_tok_s": sum(kept) / steps,
        "train_s": mean(r["train_s"] for r in recs),
        "aborted": mean(r["aborted"] for r in recs),
        "switch_s": mean(r["switch_cost_s"] for r in recs),
        "lent": mean(r["lent_devices"] for r in recs),
        "reward_last": recs[-1]["reward_mean"],
        "wall_s": wall,
    }


def label(name: str, lent: list[float]) -> str:
    """Say what a time-sharing row measured: how many devices it actually lent."""
    if not name.startswith("time_sharing"):
        return name
    if max(lent) == 0:
        return f"{name}: lent 0 devices in every round (= async + policy check)"
    return f"{name}: lent {median(lent):.1f} devices per iteration"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 measured iterations and 2 rounds")
    parser.add_argument("--iterations", type=int, default=None, help="measured iterations per run (default 5)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3)")
    args = parser.parse_args(argv)
    iterations = args.iterations or (2 if args.quick else 5)
    repeats = args.repeats or (2 if args.quick else 3)
    names = [name for name, _, _ in MODES]
    spec = {name: (mode, policy) for name, mode, policy in MODES}
    runs: dict[str, list[dict]] = {name: [{}] * repeats for name in names}
    for r, name in rounds(names, repeats):
        runs[name][r] = asyncio.run(measure(*spec[name], iterations))
    base = [x["trained_tok_s"] for x in runs["sync"]]
    table = Table(title=f"pipeline modes, CPU demo workload ({iterations} iterations per run after 1 warm-up; "
                        f"median (min-max) of {repeats} interleaved rounds)")
    for col in ("mode", "step s", "trained tok/s", "vs sync (trained tok/s)", "generated tok/s (incl. aborted)",
                "aborted/iter", "switch s", "devices lent"):
        table.add_column(col, justify="right")
    for name in names:
        xs = runs[name]
        col = {k: [x[k] for x in xs] for k in xs[0]}
        table.add_row(label(name, col["lent"]), fmt(col["step_s"]), fmt(col["trained_tok_s"], ".0f"),
                      ratio_fmt(col["trained_tok_s"], base), fmt(col["generated_tok_s"], ".0f"),
                      fmt(col["aborted"], ".1f"), fmt(col["switch_s"], ".3f"), fmt(col["lent"], ".1f"))
    Console(width=220).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
