"""Regenerate the demo figures of docs/getting-started.md from a real CPU run.

    python scripts/docs_figures.py [--iterations 200] [--seed 0] [--out docs/img]

Why a script: the pictures on the page must be what the demo does, not a drawing of what it
should do, so they come from `rollart run examples/configs/cpu_demo.yaml -n ITERATIONS
--set run.seed=SEED` (a Ray cluster on 127.0.0.1, the tiny random-init model, time-sharing),
run here in a fresh temporary run directory, and from nothing else. It writes

- `demo_reward.png`: the per-iteration mean reward, overall and per task, from `metrics.jsonl`;
- `demo_timeline.png`: each device's role over five seconds around the longest train step that
  borrowed a rollout device (time-sharing; the last seconds of the run if none did), drawn by
  `rollart.scheduler.timeline.plot_timeline` (the picture `rollart timeline` draws) from the
  run's `timeline.jsonl`, cut to a window because a whole run's switches blur into one colour.

The run is asynchronous, so a rerun with the same seed draws a curve of the same shape, not the
same pixels. With the defaults: 2 min 33 s of wall time on 2 shared CPU cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "configs" / "cpu_demo.yaml"
MAX_PNG_BYTES = 150_000  # the PNGs are committed; a large one bloats every clone


def run_demo(run_dir: Path, iterations: int, seed: int) -> None:
    """Run the demo config through the CLI, as a reader would, so the figure shows that command."""
    args = ["run", str(CONFIG.relative_to(ROOT)), "-n", str(iterations), "--run-dir", str(run_dir),
            "--set", f"run.seed={seed}"]
    print("$ rollart", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "rollart.app.cli", *args], check=True, cwd=ROOT)


def read_records(run_dir: Path) -> list[dict]:
    """The run's iterations; a run that wrote none cannot be drawn, so it stops the script."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        raise SystemExit(f"{path} holds no iteration")
    return records


def rolling_mean(values: list[float | None], window: int) -> list[float | None]:
    """A trailing mean, so the trend shows through the noise of a 64-trajectory batch."""
    out: list[float | None] = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1):i + 1] if v is not None]
        out.append(sum(part) / len(part) if part else None)
    return out


def plot_reward(records: list[dict], out: Path, title: str, window: int = 10) -> Path:
    """Raw values faint, the trailing mean solid: one colour per series (overall, each task)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rollart.scheduler.timeline import save_figure

    tasks = sorted({k for r in records for k in r if k.startswith("reward_") and k != "reward_mean"})
    x = [r["iteration"] for r in records]
    fig, ax = plt.subplots(figsize=(8, 4))
    for key, color in zip(["reward_mean", *tasks], ["black", "#4C72B0", "#DD8452", "#55A868", "#8172B2"]):
        y = [r.get(key) for r in records]
        label = "all tasks" if key == "reward_mean" else key.removeprefix("reward_")
        ax.plot(x, y, color=color, alpha=0.25, linewidth=1)
        ax.plot(x, rolling_mean(y, window), color=color, linewidth=2, label=f"{label} (mean of last {window})")
    ax.set_xlabel("iteration (one batch of 64 trajectories)")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, out)


def timeline_window(records: list[dict], rows: list[dict], seconds: float) -> tuple[float, float]:
    """The `seconds` that end just after an iteration which lent rollout devices to training.

    Why there: a time-sharing switch (shrink, train on the lent device, expand) is what the
    picture is for, and the cost-aware policy lends in only a few iterations of a run; without
    one, the last seconds of the run.
    """
    end = max(r["t1"] for r in rows)
    lent = [r for r in records if r.get("lent_devices")]
    if lent:  # the longest lent train step is the widest, so the easiest to see
        end = min(end, max(lent, key=lambda r: r["train_s"])["t_end"] + seconds / 4)
    return end - seconds, end


def plot_timeline_window(run_dir: Path, records: list[dict], out: Path, seconds: float) -> Path:
    """Cut timeline.jsonl to a window and let `plot_timeline` draw it, as `rollart timeline` would."""
    from rollart.scheduler.timeline import plot_timeline

    rows = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines() if line.strip()]
    start, end = timeline_window(records, rows, seconds)
    cut = [{**r, "t0": max(r["t0"], start), "t1": min(r["t1"], end)} for r in rows if r["t1"] > start and r["t0"] < end]
    t_run = min(r["t0"] for r in rows)
    with tempfile.TemporaryDirectory() as tmp:  # plot_timeline titles the figure with the directory's name
        window_dir = Path(tmp) / f"cpu_demo, seconds {start - t_run:.0f} to {end - t_run:.0f} of the run"
        window_dir.mkdir()
        (window_dir / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cut))
        return plot_timeline(window_dir, out)


def main(argv: list[str] | None = None) -> int:
    """Run, draw, and refuse a PNG too large to commit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="the demo config's own run.iterations")
    parser.add_argument("--seed", type=int, default=0, help="run.seed (model init, env seeds)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--timeline-seconds", type=float, default=5.0, help="the window of the timeline figure")
    parser.add_argument("--run-dir", type=Path, default=None, help="keep the run here (default: a temporary dir)")
    parser.add_argument("--draw-only", action="store_true", help="redraw from the run already in --run-dir")
    args = parser.parse_args(argv)
    if args.draw_only and args.run_dir is None:
        parser.error("--draw-only needs --run-dir")
    with tempfile.TemporaryDirectory(prefix="rollart-docs-") as tmp:
        run_dir = args.run_dir or Path(tmp) / "run"
        if not args.draw_only:
            run_demo(run_dir, args.iterations, args.seed)
        records = read_records(run_dir)
        title = f"CPU demo (examples/configs/cpu_demo.yaml), {len(records)} iterations, seed {args.seed}"
        paths = [plot_reward(records, args.out / "demo_reward.png", title),
                 plot_timeline_window(run_dir, records, args.out / "demo_timeline.png", args.timeline_seconds)]
    for path in paths:
        size = path.stat().st_size
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {size / 1000:.0f} kB")
        if size > MAX_PNG_BYTES:
            raise SystemExit(f"{path} is {size} bytes, over {MAX_PNG_BYTES}: draw it smaller")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
