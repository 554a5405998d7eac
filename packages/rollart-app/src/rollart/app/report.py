"""`rollart report RUN_DIR`: what happened in a run, as a printed summary and a page with plots.

Why (issue 21, item 6): the run directory holds metrics.jsonl, the trajectory ledger, the event log
and the role timeline, but a user had to read JSON lines to answer "did it learn", "was anything
lost", "did affinity hold", "what failed". This reads whatever of those files exist (a run killed
early, or one written before the ledger existed, still reports what it has), prints a summary, and
writes RUN_DIR/report.html with PNG plots next to it: reward per task, throughput, staleness,
failures per iteration and the role timeline.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart.scheduler.errors import SchedulerError
from rollart.scheduler.metrics import read_metrics
from rollart.scheduler.records import read_events, read_ledger
from rollart.scheduler.timeline import plot_timeline, save_figure

REPORT_FILE = "report.html"


@dataclass
class RunSummary:
    """The numbers `rollart report` prints and the page shows."""

    run_dir: Path
    iterations: int = 0
    reward_first: float | None = None
    reward_last: float | None = None
    reward_by_task: dict[str, float] = field(default_factory=dict)
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    staleness_max: int | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    routing: dict[str, dict[str, int]] = field(default_factory=dict)
    env_errors: dict[str, int] = field(default_factory=dict)
    reward_errors: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    files: dict[str, bool] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """The summary as plain lines (what the CLI prints)."""
        def fmt(x: float | None, spec: str = ".3f") -> str:
            return "-" if x is None else format(x, spec)

        out = [f"run {self.run_dir}: {self.iterations} iterations",
               f"reward: first {fmt(self.reward_first)}, last {fmt(self.reward_last)}"
               + "".join(f"; {t} {v:.3f}" for t, v in sorted(self.reward_by_task.items())),
               f"throughput: {fmt(self.tokens_per_s, '.0f')} tokens/s, step {fmt(self.step_time_s, '.2f')} s (means); "
               f"staleness max {self.staleness_max if self.staleness_max is not None else '-'}"]
        if self.outcomes:
            out.append("trajectories: " + ", ".join(f"{k} {v}" for k, v in self.outcomes.items()))
        for tag, per_hw in sorted(self.routing.items()):
            out.append(f"routing {tag}: " + ", ".join(f"{hw} {n}" for hw, n in sorted(per_hw.items())))
        for name, counts in (("env errors", self.env_errors), ("reward errors", self.reward_errors),
                             ("events", self.events)):
            if counts:
                out.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        missing = [name for name, present in self.files.items() if not present]
        if missing:
            out.append("not in the run directory: " + ", ".join(missing))
        return out


def _add(total: dict[str, int], part: dict[str, Any] | None) -> None:
    for key, n in (part or {}).items():
        if isinstance(n, (int, float)):
            total[key] = total.get(key, 0) + int(n)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(run_dir: Path) -> RunSummary:
    """Read metrics.jsonl, trajectories.jsonl, events.jsonl (each optional) into a summary."""
    run_dir = Path(run_dir)
    metrics, ledger, events = read_metrics(run_dir), read_ledger(run_dir), read_events(run_dir)
    s = RunSummary(run_dir, files={name: (run_dir / name).exists() for name in
                                   ("metrics.jsonl", "trajectories.jsonl", "events.jsonl", "timeline.jsonl")})
    s.iterations = len(metrics)
    rewards = [r["reward_mean"] for r in metrics if r.get("reward_mean") is not None]
    s.reward_first, s.reward_last = (rewards[0], rewards[-1]) if rewards else (None, None)
    tasks = sorted({k for r in metrics for k in r if k.startswith("reward_") and k not in ("reward_mean",
                   "reward_retries", "reward_outage_s", "reward_errors")})
    for key in tasks:
        vals = [r[key] for r in metrics[-5:] if isinstance(r.get(key), (int, float))]
        if vals:
            s.reward_by_task[key.removeprefix("reward_")] = sum(vals) / len(vals)
    s.tokens_per_s = _mean([r["tokens_per_s"] for r in metrics if isinstance(r.get("tokens_per_s"), (int, float))])
    s.step_time_s = _mean([r["step_time_s"] for r in metrics if isinstance(r.get("step_time_s"), (int, float))])
    stale = [r["staleness_max"] for r in metrics if isinstance(r.get("staleness_max"), int)]
    s.staleness_max = max(stale) if stale else None
    if ledger:
        s.outcomes = dict(Counter(str(line.get("outcome")) for line in ledger))
        for line in ledger:
            for turn in line.get("turns") or []:
                per_tag = s.routing.setdefault(str(line.get("tag")), {})
                per_tag[str(turn.get("hardware"))] = per_tag.get(str(turn.get("hardware")), 0) + 1
    else:
        for r in metrics:
            out = r.get("outcomes") or {}
            for key in ("launched", "consumed", "buffered"):
                if isinstance(out.get(key), int):
                    s.outcomes[key] = out[key] if key == "buffered" else s.outcomes.get(key, 0) + out[key]
            for key in ("aborted", "failed"):
                if isinstance(out.get(key), dict):
                    s.outcomes[key] = s.outcomes.get(key, 0) + sum(out[key].values())
            for tag, per_hw in (r.get("routing") or {}).items():
                _add(s.routing.setdefault(tag, {}), per_hw)
    for r in metrics:
        _add(s.env_errors, r.get("env_errors"))
        _add(s.reward_errors, r.get("reward_errors"))
    s.events = dict(Counter(str(e.get("kind")) for e in events))
    return s


def _series_plot(metrics: list[dict[str, Any]], keys: list[str], title: str, ylabel: str, out: Path) -> Path | None:
    """One line per key over the iterations; None when no record has any of the keys."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in metrics)]
    if not present:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key in present:
        pts = [(r["iteration"], r[key]) for r in metrics if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=key)
    ax.set_title(title)
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out)


def failure_series(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per iteration: aborted, failed (outcomes, when recorded), env errors and reward errors, as plain numbers."""
    out = []
    for r in metrics:
        outcomes = r.get("outcomes") or {}
        failed = outcomes.get("failed")
        out.append({"iteration": r.get("iteration"), "aborted": r.get("aborted"),
                    "failed": sum(failed.values()) if isinstance(failed, dict) else None,
                    "env_errors": sum((r.get("env_errors") or {}).values()),
                    "reward_errors": sum((r.get("reward_errors") or {}).values())})
    return out


def write_report(run_dir: Path) -> Path:
    """Write RUN_DIR/report.html and its PNGs (report-*.png); plots whose data is absent are left out."""
    # deps: summarize, plot_timeline, failure_series
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SchedulerError(f"RUN_DIR: {str(run_dir)!r} is not a directory (a run directory written by `rollart run`)")
    summary = summarize(run_dir)
    metrics = read_metrics(run_dir)
    tasks = [k for k in sorted({k for r in metrics for k in r}) if k.startswith("reward_")
             and k not in ("reward_retries", "reward_outage_s", "reward_errors")]
    plots = [("reward per task", _series_plot(metrics, tasks, "reward per task", "mean reward", run_dir / "report-reward.png")),
             ("throughput", _series_plot(metrics, ["tokens_per_s"], "throughput", "tokens/s", run_dir / "report-throughput.png")),
             ("staleness", _series_plot(metrics, ["staleness_max"], "staleness", "versions", run_dir / "report-staleness.png")),
             ("failures", _series_plot(failure_series(metrics), ["aborted", "failed", "env_errors", "reward_errors"],
                                       "failures per iteration", "trajectories", run_dir / "report-failures.png"))]
    try:
        plots.append(("role timeline", plot_timeline(run_dir, run_dir / "report-timeline.png")))
    except SchedulerError:
        plots.append(("role timeline", None))
    body = ["<h1>RollArt run report</h1>", "<pre>" + html.escape("\n".join(summary.lines())) + "</pre>"]
    for title, path in plots:
        body.append(f"<h2>{html.escape(title)}</h2>")
        body.append(f'<img src="{html.escape(path.name)}" alt="{html.escape(title)}">' if path is not None
                    else "<p>no data in this run directory</p>")
    body.append("<h2>summary as JSON</h2><pre>" + html.escape(json.dumps(
        {k: v for k, v in vars(summary).items() if k != "run_dir"}, indent=1, sort_keys=True)) + "</pre>")
    out = run_dir / REPORT_FILE
    out.write_text("<!doctype html><html><head><meta charset='utf-8'><title>RollArt report</title></head><body>"
                   + "\n".join(body) + "</body></html>\n")
    return out
