"""`rollart timeline`: draw each device's role over time from RUN_DIR/timeline.jsonl.

Why this picture: it is how the time-sharing blog compares colocated, disaggregated and
time-shared schemes — idle gaps (bubbles) and lent devices are visible at a glance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollart.scheduler.errors import SchedulerError

ROLE_COLORS = {"rollout": "#4C72B0", "train": "#DD8452", "transfer": "#C44E52", "idle": "#DDDDDD"}
"""One colour per device role, bottom to top in stacked plots; `rollart timeline` and `rollart sim` share it."""


def save_figure(fig: Any, out: Path) -> Path:
    """Write a matplotlib figure as PNG (creating its directory) and release it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_timeline(run_dir: Path, out: Path) -> Path:
    """Draw each device's role over time from timeline.jsonl (the blog's comparison picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    src = Path(run_dir) / "timeline.jsonl"
    if not src.exists():
        raise SchedulerError(f"run_dir {str(run_dir)!r} has no timeline.jsonl (was it written by `rollart run`?)")
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    if not rows:
        raise SchedulerError(f"{src} is empty")
    t_start = min(r["t0"] for r in rows)
    devices = sorted({r["device"] for r in rows})
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(devices) + 1.5))
    for i, d in enumerate(devices):
        for role in ROLE_COLORS:
            spans = [(r["t0"] - t_start, r["t1"] - r["t0"]) for r in rows if r["device"] == d and r["role"] == role]
            if spans:
                ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=ROLE_COLORS[role])
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels([f"GPU {d}" for d in devices])
    ax.set_xlabel("seconds since start")
    ax.set_title(f"device roles: {Path(run_dir).name}")
    ax.legend(handles=[Patch(color=c, label=r) for r, c in ROLE_COLORS.items()], loc="upper right", ncol=4, fontsize=8)
    return save_figure(fig, out)
