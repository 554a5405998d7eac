"""`make demo`: the CPU demo that visibly learns (about 2-4 minutes on 2 cores).

What runs: a Ray local cluster on 127.0.0.1 with 3 logical GPUs (2 rollout workers as Ray actors
with a TorchEngine each, 1 for the trainer), a tiny Llama built locally from random init, a
`TorchTrainer`, async mode with alpha=1 plus time-sharing (the cost-aware policy), FrozenLake
(non-slippery 4x4) and multi-turn math with the calculator tool. See `rollart.app.tasks` for
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

from rollart.app.cli import default_run_dir, init_ray, run_pipeline
from rollart.app.config import RunConfig, load_config


def demo_config() -> RunConfig:
    """The shipped demo config (`rollart/app/configs/demo.yaml`)."""
    with resources.as_file(resources.files("rollart.app").joinpath("configs/demo.yaml")) as path:
        return load_config(path)


async def stop_leftover_tasks(timeout_s: float) -> list[str]:
    """Cancel the tasks still pending after the pipeline closed; wait with a deadline; name those that did not stop.

    Why: `asyncio.run` waits without a deadline for every cancelled task, so one task that never
    finishes its cancellation (seen once in four demo runs, after all metrics were written) would
    hang `make demo` at exit. Here the wait has a deadline and the culprits are named.
    """
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in tasks:
        t.cancel()
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    return sorted(t.get_name() + ": " + repr(t.get_coro())[:120] for t in pending)


def run_demo(cfg: RunConfig, run_dir: Path, iterations: int, console: Console) -> list[dict]:
    """Run the pipeline on a fresh event loop that is closed with a deadline (see `stop_leftover_tasks`)."""
    async def body() -> list[dict]:
        records = await run_pipeline(cfg, run_dir, iterations, console, resume=False)
        stuck = await stop_leftover_tasks(timeout_s=10.0)
        if stuck:
            console.print(f"[yellow]{len(stuck)} tasks did not stop within 10 s after close (left behind): {stuck}")
        return records

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(body())
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    """`make demo`: the CPU demo (async, alpha=1, time-sharing, FrozenLake + math) that learns."""
    parser = argparse.ArgumentParser(prog="python -m rollart.app.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=None, help="default: the config's run.iterations")
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=None, help="run seed (model init, env seeds); default: the config's")
    parser.add_argument("--no-ray", action="store_true", help="in-process rollout workers instead of Ray actors")
    args = parser.parse_args(argv)
    cfg = demo_config()
    if args.seed is not None:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": args.seed})})
    if args.no_ray:  # `cluster.ray: none`: in-process workers (a `use_ray` copy field was ignored, app D59)
        cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"ray": "none"})})
    run_dir = args.run_dir or default_run_dir(cfg)
    console = Console()
    console.print(f"[bold]RollArt CPU demo[/bold] -> {run_dir}")
    init_ray(cfg)
    records = run_demo(cfg, run_dir, args.iterations or cfg.run.iterations, console)
    if records:
        table = Table(title="mean reward: first vs last iterations")
        for col in ("iterations", "reward", "frozenlake", "math", "step s", "tokens/s"):
            table.add_column(col)
        k = max(1, min(5, len(records) // 2))
        spans = [(f"first {k}", records[:k]), (f"last {k}", records[-k:])]
        if len(records) >= 20:
            spans.append(("last 10", records[-10:]))
        for name, part in spans:
            def mean(key: str, rows=part) -> str:
                vals = [r[key] for r in rows if r.get(key) is not None]
                return f"{sum(vals) / len(vals):.3f}" if vals else "-"

            table.add_row(name, mean("reward_mean"), mean("reward_frozenlake"), mean("reward_math"),
                          mean("step_time_s"), mean("tokens_per_s"))
        console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
