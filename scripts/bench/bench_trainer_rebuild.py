"""Cost of a dead trainer actor: the rebuild from the last checkpoint (issue 21 item 2, rollart-app D75).

The example two-pool layout (`examples/configs/two_pools_affinity.yaml`, torch engines on the tiny
model, Ray with logical GPUs) with the trainer as one Ray actor (`placement: actors`, `sync.channel:
local`) is built once per repeat; after a warm-up iteration, iterations alternate:
  baseline - an iteration with nothing killed: its `train_s`
  killed   - the trainer actor's process is SIGKILLed just before the iteration: its `train_s`
             (release the dead group, start a new actor on the same device, load the checkpoint,
             redo the step on the same batch)
  rebuild  - the `seconds` of that iteration's `trainer_rebuilt` event (the rebuild alone)
  served   - trajectories the rollout side finished during the killed iteration's train phase
Rows are interleaved in one run; each reports the median and the min-max spread.

    .venv/bin/python scripts/bench/bench_trainer_rebuild.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config
from rollart.scheduler.records import read_events

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "configs" / "two_pools_affinity.yaml"


async def kill_trainer(pipe) -> None:
    actor = pipe.parts.trainer.handles[0].actor
    os.kill(await actor.__ray_call__.remote(lambda self: os.getpid()), signal.SIGKILL)


async def one_run(cfg, rows: dict[str, list[float]], repeat: int) -> None:
    """A fresh pipeline: a warm-up iteration, then baseline and killed iterations in turn (two rebuilds)."""
    with tempfile.TemporaryDirectory() as run_dir:
        pipe = await build_pipeline(cfg, Path(run_dir))
        try:
            await pipe.run(1, progress=False)  # warm-up
            for _ in range(2):  # the budget allows two rebuilds per run
                rows["baseline"].append((await pipe.run(pipe.iteration + 1, progress=False))[0]["train_s"])
                await kill_trainer(pipe)
                seen = pipe.seen_trajectories
                rec = (await pipe.run(pipe.iteration + 1, progress=False))[0]
                event = [e for e in read_events(Path(run_dir)) if e["kind"] == "trainer_rebuilt"][-1]
                rows["killed"].append(rec["train_s"])
                rows["rebuild"].append(event["seconds"])
                rows["served"].append(float(pipe.seen_trajectories - seen))
                print(f"  repeat {repeat}: baseline {rows['baseline'][-1]:.2f} s, killed {rec['train_s']:.2f} s, "
                      f"rebuild {event['seconds']:.2f} s, {rows['served'][-1]:.0f} trajectories meanwhile", flush=True)
        finally:
            await pipe.close()


def summary(rows: dict[str, list[float]], repeats: int) -> str:
    lines = [f"train phase of an iteration, {repeats} runs x 2 (median, min-max):"]
    for name, values in rows.items():
        unit = "traj" if name == "served" else "s"
        lines.append(f"  {name:9s} {statistics.median(values):7.2f} {unit}   [{min(values):.2f} - {max(values):.2f}]  "
                     f"n={len(values)}")
    return "\n".join(lines)


async def main(repeats: int) -> None:
    import ray

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["run"]["tensorboard"] = False
    raw["trainer"].update({"placement": "actors", "devices": 1, "restarts": 2})
    cfg = parse_config(raw)
    ray.init(num_gpus=3, resources={"H800": 2.0, "H20": 2.0}, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False)
    rows: dict[str, list[float]] = {"baseline": [], "killed": [], "rebuild": [], "served": []}
    try:
        for repeat in range(repeats):
            await one_run(cfg, rows, repeat)
    finally:
        ray.shutdown()
    print("\n" + summary(rows, repeats))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.repeats)))
