"""`rollart sim`: run a scenario's runs through the real builder and Pipeline in virtual time (design D23).

Why this way: the simulator must not be a separate model of the system. Each run builds its
pipeline with `build_pipeline` (the same function `rollart run` uses) from a config whose parts are
the simulated ones (SimEngine workers behind the real LLMProxy, SimTrainer, SimChannel, synthetic
envs in real EnvManagers, the real SampleBuffer, RolloutScheduler and TimeSharingController), and
runs `Pipeline.run` on rollart-resource's VirtualTimeLoop (`run_virtual`), where every
`asyncio.sleep` of the parts jumps the clock instead of waiting.

What a run reports (`RunResult`), over the iterations after `warmup`:
    iteration_s      mean step time (get_batch -> train -> sync -> resume)
    rollout_s        mean time waiting for the batch (get_batch)
    tokens_per_s     response tokens generated (kept or not) per second of the window
    trained_tokens_per_s  response tokens of the batches trained on per second of the window (D66:
                     the time-sharing figure's metric; discarded and aborted tokens do not count)
    util_rollout     SimEngine busy time (prefill + decode) / (rollout devices x window)
    util_train       train step time x trainer devices (lent included) / (trainer devices x window)
    collected        trajectories consumed by batches (FAILED ones never are)
    aborted          ABORTED by the pipeline (staleness, redundancy, one_off/sync drops)
    failed           FAILED (env crash, LLM error); timeouts = failed on a deadline
    switch_s         mean time-sharing switch cost per iteration (shrink + expand)
    cost_per_hour    the run's devices x the catalogue's relative cost (H800 = 1.0, H20 = 1/2.85), per hour
    cost             cost_per_hour x the window, in H800-hours; tokens_per_cost: response tokens per H800-hour
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollart.app.config import RunConfig
from rollart.app.sim.scenario import RunSpec, Scenario
from rollart.resource.virtual_time import run_virtual
from rollart.scheduler.buffer import BufferCounts, TrajectoryRecord
from rollart.scheduler.timeline import ROLE_COLORS, save_figure


@dataclass
class RunResult:
    """One run's row of the table (see the module docstring); `history` keeps every iteration's record."""

    name: str
    iterations: int
    virtual_s: float
    wall_s: float
    iteration_s: float
    rollout_s: float
    tokens_per_s: float
    util_rollout: float
    util_train: float
    collected: int
    aborted: int
    failed: int
    timeouts: int
    in_buffer: int
    switch_s: float
    rollout_devices: int
    train_devices: int
    staleness_max: int
    alpha: int
    seen: int = 0  # trajectories the envs handed to the buffer (each is in exactly one bucket above)
    trained_tokens_per_s: float = 0.0  # response tokens of the trained batches per second (D66)
    cost_per_hour: float = 0.0  # the run's devices (rollout + trainer, each once) x catalogue cost, H800 = 1.0 (D62)
    cost: float = 0.0  # cost_per_hour x the measured window, in H800-hours
    tokens_per_cost: float = 0.0  # response tokens of the window per H800-hour
    history: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The table columns (no history)."""
        out = asdict(self)
        out.pop("history")
        out.pop("timeline")
        return out


def _engine_busy(workers: list[Any]) -> float:
    """Device-seconds the engines were busy: an engine of TP = k keeps k devices busy (D60)."""
    total = 0.0
    for w in workers:
        stats = getattr(getattr(w, "engine", None), "stats", None) or {}
        total += (float(stats.get("prefill_s", 0.0)) + float(stats.get("decode_s", 0.0))) * max(len(w.devices), 1)
    return total


def account(counts: BufferCounts) -> dict[str, int]:
    """Every trajectory the buffer saw, in exactly one bucket: collected, aborted, failed (timeouts among them), buffered.

    From the buffer's counters (D65): the simulator's buffer hands closed records to a ledger and forgets them."""
    return {"collected": counts.consumed, "aborted": counts.aborted - counts.failed, "failed": counts.failed,
            "timeouts": counts.timeouts, "in_buffer": counts.buffered}


def _forget(trajectory_id: str, record: TrajectoryRecord) -> None:
    """The simulator's ledger: the counters have what the run reports; the records are dropped (D65)."""


async def simulate_run(config: RunConfig, name: str, warmup: int = 0,
                       on_iteration: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Build the pipeline from `config` with the one builder and run it on the running (virtual) loop."""
    from rollart.app.builder import build_pipeline

    loop = asyncio.get_running_loop()
    snapshots: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rollart-sim-") as d:
        pipe = await build_pipeline(config, Path(d), tensorboard=False, records=_forget)
        trainer = pipe.parts.trainer.inner
        train_busy = [0.0]

        def snapshot() -> None:
            snapshots.update(t=loop.time(), busy=_engine_busy(pipe.parts.workers), train=train_busy[0])

        def step_done(rec: dict[str, Any]) -> None:
            train_busy[0] += rec["train_s"] * (trainer.devices + rec["lent_devices"])
            if rec["iteration"] == warmup:
                snapshot()
            if on_iteration is not None:
                on_iteration(rec)

        snapshot()
        try:
            history = await pipe.run(config.run.iterations, on_iteration=step_done)
            t_end, busy_end, train_end = loop.time(), _engine_busy(pipe.parts.workers), train_busy[0]
            counts = account(pipe.parts.buffer.counts())
            seen = pipe.seen_trajectories
        finally:
            pipe.parts.rollout.pause_launches()  # the run is over: end what is in flight before closing
            await pipe.parts.rollout.abort_inflight("simulation ended")
            await pipe.close()
            timeline_path = Path(d) / "timeline.jsonl"
            timeline = [json.loads(x) for x in timeline_path.read_text().splitlines() if x.strip()] \
                if timeline_path.exists() else []
        await _cancel_leftovers()
    window = history[warmup:]
    span = max(t_end - snapshots["t"], 1e-9)
    n_roll = len(pipe.parts.rollout_devices)
    n_train = trainer.devices
    tokens_per_s = sum(r["tokens_per_s"] * r["step_time_s"] for r in window) / span
    cost_per_hour = _cost_per_hour(pipe.parts)
    return RunResult(
        name=name, iterations=len(history), virtual_s=t_end, wall_s=0.0,
        iteration_s=sum(r["step_time_s"] for r in window) / len(window),
        rollout_s=sum(r["get_batch_s"] for r in window) / len(window),
        tokens_per_s=tokens_per_s,
        trained_tokens_per_s=sum(r["trained_tokens"] for r in window) / span,
        cost_per_hour=cost_per_hour, cost=cost_per_hour * span / 3600.0,
        tokens_per_cost=tokens_per_s * 3600.0 / cost_per_hour if cost_per_hour else 0.0,
        util_rollout=(busy_end - snapshots["busy"]) / (n_roll * span),
        util_train=(train_end - snapshots["train"]) / (n_train * span),
        switch_s=sum(r["switch_cost_s"] for r in window) / len(window),
        rollout_devices=n_roll, train_devices=n_train,
        staleness_max=max(r["staleness_max"] for r in history), alpha=config.pipeline.alpha,
        seen=seen, history=history, timeline=timeline, **counts)


def _cost_per_hour(parts: Any) -> float:
    """The catalogue's relative cost of every device the run holds, rollout and trainer, each counted once (D62)."""
    from collections import Counter

    from rollart.resource.hardware import HardwareCatalogue

    hardware = parts.placement.hardware
    held = set(parts.rollout_devices) | set(parts.train_devices)
    return HardwareCatalogue().cost_per_hour(Counter(hardware[d] for d in held))


async def _cancel_leftovers() -> None:
    """Cancel what a closed pipeline left behind (env sleeps of aborted work), so the loop closes clean."""
    me = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


SIM_GC_THRESHOLD = (100_000, 50, 100)


@contextlib.contextmanager
def simulation_gc(threshold: tuple[int, int, int] = SIM_GC_THRESHOLD) -> Iterator[None]:
    """Collect less often while a simulation runs, and restore the process's settings after (D25).

    Why: a 3,000-GPU run holds millions of live objects (requests, timers, tasks) and allocates a
    timer or a task per event; at CPython's default threshold (700 allocations) the collector ran
    5,600 times in one iteration and every older-generation pass walked the whole heap: 35-50 % of the
    wall time. What existed before the run is frozen (never scanned again during it); garbage cycles
    are still collected, only less often.
    """
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*threshold)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def run_one(scenario: Scenario, run: RunSpec, on_iteration: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """One run of a scenario on a fresh VirtualTimeLoop seeded with the scenario's seed."""
    config = scenario.run_config(run)
    with simulation_gc():
        done = run_virtual(simulate_run(config, run.name, scenario.warmup, on_iteration), seed=scenario.seed)
    done.result.wall_s = done.wall_s
    return done.result


def run_scenario(scenario: Scenario, on_iteration: Callable[[str, dict[str, Any]], None] | None = None,
                 only: list[str] | None = None) -> list[RunResult]:
    """Every run of the scenario in order (or those named in `only`)."""
    out = []
    for run in scenario.runs:
        if only and run.name not in only:
            continue
        cb = (lambda rec, name=run.name: on_iteration(name, rec)) if on_iteration is not None else None
        out.append(run_one(scenario, run, cb))
    return out


COLUMNS = [("iteration_s", "iter s", "{:.1f}"), ("rollout_s", "batch wait s", "{:.1f}"), ("tokens_per_s", "tok/s", "{:,.0f}"), ("util_rollout", "rollout util", "{:.0%}"),
           ("cost_per_hour", "cost/h", "{:.2f}"), ("tokens_per_cost", "tok/cost", "{:,.0f}"),
           ("util_train", "train util", "{:.0%}"), ("collected", "collected", "{}"), ("aborted", "aborted", "{}"),
           ("failed", "failed", "{}"), ("timeouts", "timeouts", "{}"), ("switch_s", "switch s", "{:.2f}"),
           ("staleness_max", "max stale", "{}"), ("wall_s", "wall s", "{:.1f}")]


def render(scenario: Scenario, results: list[RunResult], console: Any) -> None:
    """A rich table per scenario: one row per run, ratios against the first run.

    Why two layouts: the row-per-run table is ~170 columns wide, and rich squeezes a wider table
    than the terminal into "…" cells. When it does not fit, the same cells go out transposed (a row
    per measurement, a column per run), which an 80-column terminal shows whole for a few runs.
    """
    from rich.table import Table

    title = f"{scenario.name}: {scenario.paper}" if scenario.paper else scenario.name
    heads = ["run", *(head for _, head, _ in COLUMNS), "x iter (vs first)", "x tok/s (vs first)"]
    cells = [_cells(r, results[0]) for r in results]
    table = Table(title=title)
    table.add_column(heads[0])
    for head in heads[1:]:
        table.add_column(head, justify="right")
    for row in cells:
        table.add_row(*row)
    # measured unclamped: rich clamps a measurement to the options' width, which would always "fit"
    if console.measure(table, options=console.options.update_width(1 << 20)).maximum > console.width:
        table = Table(title=title)
        table.add_column(heads[0])
        for row in cells:
            table.add_column(row[0], justify="right")
        for i, head in enumerate(heads[1:], start=1):
            table.add_row(head, *(row[i] for row in cells))
    console.print(table)


def _cells(r: RunResult, base: RunResult) -> list[str]:
    """One run's cells in `render`'s column order: name, COLUMNS, then the two ratios against `base`."""
    row = r.row()
    return [r.name, *(fmt.format(row[key]) for key, _, fmt in COLUMNS),
            f"{base.iteration_s / r.iteration_s:.2f}x" if r.iteration_s else "-",
            f"{r.tokens_per_s / base.tokens_per_s:.2f}x" if base.tokens_per_s else "-"]


def plot_roles(results: list[RunResult], out: Path, title: str = "") -> Path:
    """Devices in each role over virtual time, one panel per run (the blog's comparison picture)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.4 * len(results) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        events = sorted({e["t0"] for e in r.timeline} | {e["t1"] for e in r.timeline})
        if len(events) < 2:
            continue
        mids = [(a + b) / 2 for a, b in zip(events, events[1:])]
        stacks = []
        for role in ROLE_COLORS:
            spans = [(e["t0"], e["t1"]) for e in r.timeline if e["role"] == role]
            stacks.append([sum(1 for t0, t1 in spans if t0 <= m < t1) for m in mids])
        ax.stackplot(events[:-1], *stacks, step="post", colors=list(ROLE_COLORS.values()), labels=list(ROLE_COLORS))
        ax.set_title(f"{r.name}: {r.iteration_s:.0f} s/iter, {r.tokens_per_s:,.0f} tok/s", fontsize=9)
        ax.set_ylabel("devices")
    axes[-1, 0].set_xlabel("virtual seconds")
    axes[0, 0].legend(loc="upper right", ncol=4, fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, out)
