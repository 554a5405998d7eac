"""Run output: one JSON object per iteration (metrics.jsonl, TensorBoard) and device-role intervals.

Why JSON lines: a crashed run keeps every completed iteration, tools read it line by line, and the
CLI and the benchmark share the format. Device roles are intervals so `rollart timeline` can draw the
picture the time-sharing blog uses (rollout / train / idle / transfer per device over time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rollart import checks as check
from rollart.scheduler.errors import SchedulerError

REQUIRED_KEYS = frozenset(
    {"iteration", "version", "reward_mean", "step_time_s", "tokens_per_s", "trajectories", "aborted", "switch_cost_s",
     "sync_s", "sync_bytes"}
)
ROLES = ("rollout", "train", "idle", "transfer")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends one JSON object per iteration to RUN_DIR/metrics.jsonl and mirrors it to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        """Create the run dir; TensorBoard is optional so tests stay light."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        """Write one iteration's record; it must carry the required keys (R8)."""
        # AST: AST_PRECONDITION(REQUIRED_KEYS <= set(record), got=sorted(REQUIRED_KEYS - set(record)), msg="record has every required key", exc=SchedulerError)
        check.precondition(REQUIRED_KEYS <= set(record), "record has every required key", got_lazy=lambda: sorted(REQUIRED_KEYS - set(record)), exc=SchedulerError)  # generated #d348ea95ef
        clean = {k: _jsonable(v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")
        if self._tb is not None:
            step = int(record["iteration"])
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


ENGINE_COUNTERS = ("prefix_lookups", "prefix_hits", "prompt_tokens_reused", "prefill_s", "decode_s")


def engine_metrics(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-iteration engine fields from two cumulative snapshots summed over the rollout engines.

    A counter that went down (an engine was rebuilt after a failure) counts from zero.
    """
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) if after.get(k, 0.0) >= before.get(k, 0.0) else after.get(k, 0.0)
         for k in ENGINE_COUNTERS}
    engine_s = d["prefill_s"] + d["decode_s"]
    return {
        "prefix_hit_rate": d["prefix_hits"] / d["prefix_lookups"] if d["prefix_lookups"] else 0.0,
        "prefix_reused_tokens": int(d["prompt_tokens_reused"]),
        "prefill_share": d["prefill_s"] / engine_s if engine_s > 0 else 0.0,
    }


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run, in order (what `rollart run` wrote)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RoleTimeline:
    """Records each device's role intervals (rollout / train / idle / transfer) to timeline.jsonl."""

    def __init__(self, path: Path, devices: list[int], clock: Callable[[], float]) -> None:
        """All devices start in role `idle` at clock()."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        now = clock()
        self._open: dict[int, tuple[str, float]] = {d: ("idle", now) for d in devices}

    def roles(self) -> dict[int, str]:
        """Each device's current role (what the CLI's progress display shows)."""
        return {d: role for d, (role, _) in self._open.items()}

    def set_role(self, devices: Iterable[int], role: str) -> None:
        """Close the devices' current intervals and open new ones in `role`."""
        # VAL: VAL_ONE_OF(role, choices=ROLES, exc=SchedulerError)
        check.one_of("role", role, ROLES, exc=SchedulerError)  # generated #7d22414e1b
        now = self._clock()
        lines = []
        for d in devices:
            old, t0 = self._open.get(d, ("idle", now))
            if old == role:
                continue
            if now > t0:
                lines.append(json.dumps({"device": d, "role": old, "t0": t0, "t1": now}))
            self._open[d] = (role, now)
        if lines:
            with self.path.open("a") as f:
                f.write("\n".join(lines) + "\n")

    def close(self) -> None:
        """Close every open interval and flush."""
        now = self._clock()
        lines = [json.dumps({"device": d, "role": r, "t0": t0, "t1": now}) for d, (r, t0) in self._open.items() if now > t0]
        self._open = {d: (r, now) for d, (r, _) in self._open.items()}
        if lines:
            with self.path.open("a") as f:
                f.write("\n".join(lines) + "\n")
