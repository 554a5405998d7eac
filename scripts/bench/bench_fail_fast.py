"""Time from the start of a run whose env always raises to the run ending (issue 21 item 4, scheduler D52).

One in-process run (`cluster.ray: none`, the tiny checkpoint, one torch rollout worker) of a task
whose env's `step` raises on every call (`CountdownStubEnv(crash_on_step=1)`), in two variants interleaved in rounds:
  watch     - today's pipeline: `FailureWatch` ends the run with `TaskFailingError` after 16 failures
  no_watch  - the watch's limit set out of reach (the behaviour before D52): the run ends when
              `get_batch` gives up after `pipeline.get_batch_timeout_s` (20 s here; 426 s in the issue)
Each row reports the median and the min-max spread of the seconds from the build to the error, and
which error ended the run.

    PYTHONPATH=... .venv/bin/python scripts/bench/bench_fail_fast.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stats import fmt, rounds  # noqa: E402

from rollart.app.cli import run_pipeline  # noqa: E402
from rollart.app.config import parse_config  # noqa: E402
from rollart.scheduler import pipeline as pipeline_module  # noqa: E402
from rollart.scheduler.failures import FailureWatch  # noqa: E402


class NoWatch(FailureWatch):
    """The watch with its limit out of reach: counts, never stops the run (the pre-D52 behaviour)."""

    def __init__(self, limit: int = 16) -> None:
        super().__init__(limit=1_000_000)


def one_run(folder: Path, ckpt: str, variant: str) -> tuple[float, str]:
    config = parse_config({
        "run": {"name": f"bench-{variant}", "iterations": 1, "tensorboard": False},
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4, "get_batch_timeout_s": 20},
        "model": {"path": ckpt},
        "rollout": {"pools": [{"name": "rollout", "devices": 1}]},
        "tasks": [{"env": "rollart.env.stubs:CountdownStubEnv", "env_args": {"crash_on_step": 1},
                   "reward": "env_success", "prompts": "chat_template", "max_turns": 2}],
    })
    pipeline_module.FailureWatch = FailureWatch if variant == "watch" else NoWatch
    t0 = time.perf_counter()
    try:
        asyncio.run(run_pipeline(config, folder / f"run-{variant}-{time.monotonic_ns()}", 1, base_dir=folder))
        ended = "finished"
    except Exception as err:  # noqa: BLE001 - which error ended the run is the result
        ended = type(err).__name__
    return time.perf_counter() - t0, ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from rollart.proxy.testing import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpt = build_tiny_model(folder / "ckpt")
        times: dict[str, list[float]] = {"watch": [], "no_watch": []}
        ends: dict[str, set[str]] = {"watch": set(), "no_watch": set()}
        for _, variant in rounds(["watch", "no_watch"], args.repeats):
            seconds, ended = one_run(folder, ckpt, variant)
            times[variant].append(seconds)
            ends[variant].add(ended)
        print(f"{'variant':10} {'seconds to the error: median (min-max)':42} ended by")
        for variant in ("watch", "no_watch"):
            print(f"{variant:10} {fmt(times[variant]):42} {', '.join(sorted(ends[variant]))}")


if __name__ == "__main__":
    main()
