"""`make demo`: the CPU demo that visibly learns (about 2-4 minutes on 2 cores).

What runs: a Ray local cluster on 127.0.0.1 with 3 logical GPUs (2 rollout workers as Ray actors
with a TorchEngine each, 1 for the trainer), a tiny Llama built locally from random init, a
`TorchTrainer`, async mode with alpha=1 plus time-sharing (the cost-aware policy), FrozenLake
(non-slippery 4x4) and multi-turn math with the calculator tool. See `rollart.scheduler.tasks` for
how the tasks are made learnable for a tiny model (compact vocabulary, shaped rewards; no downloads,
no warm start). Writes `RUN_DIR/metrics.jsonl`, TensorBoard logs and `RUN_DIR/timeline.png`.
"""

from __future__ import annotations

import argparse
import asyncio
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rollart.scheduler.cli import default_run_dir, init_ray, run_pipeline
from rollart.scheduler.config import RunConfig, load_config


def demo_config() -> RunConfig:
    """The shipped demo config (`rollart/scheduler/configs/demo.yaml`)."""
    with resources.as_file(resources.files("rollart.scheduler").joinpath("configs/demo.yaml")) as path:
        return load_config(path)


def main(argv: list[str] | None = None) -> int:
    """`make demo`: the CPU demo (async, alpha=1, time-sharing, FrozenLake + math) that learns."""
    parser = argparse.ArgumentParser(prog="python -m rollart.scheduler.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--no-ray", action="store_true", help="in-process rollout workers instead of Ray actors")
    args = parser.parse_args(argv)
    cfg = demo_config()
    if args.no_ray:
        cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"use_ray": False})})
    run_dir = args.run_dir or default_run_dir(cfg)
    console = Console()
    console.print(f"[bold]RollArt CPU demo[/bold] -> {run_dir}")
    init_ray(cfg)
    records = asyncio.run(run_pipeline(cfg, run_dir, args.iterations or cfg.run.iterations, console, resume=False))
    if records:
        table = Table(title="mean reward: first vs last iterations")
        for col in ("iterations", "reward", "frozenlake", "math", "step s", "tokens/s"):
            table.add_column(col)
        k = max(1, min(5, len(records) // 2))
        for name, part in (("first", records[:k]), ("last", records[-k:])):
            def mean(key: str, rows=part) -> str:
                vals = [r[key] for r in rows if r.get(key) is not None]
                return f"{sum(vals) / len(vals):.3f}" if vals else "-"

            table.add_row(f"{name} {k}", mean("reward_mean"), mean("reward_frozenlake"), mean("reward_math"),
                          mean("step_time_s"), mean("tokens_per_s"))
        console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
