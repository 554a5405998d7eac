"""What happened in a run, on disk: an event log, a trajectory ledger, and the resume cut.

Why files of JSON lines: a run that is killed keeps every line written before the kill, a user can
check "nothing lost" (every launched trajectory has exactly one ledger line with an outcome) and
"affinity held" (which hardware served each turn) with `jq`, and `rollart report` reads the same
lines. Why a cut on resume (`truncate_after`): the iterations after the last checkpoint run again,
so the lines they wrote the first time must go, or every such iteration would appear twice.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollart import checks as check
from rollart.scheduler.errors import SchedulerError

EVENTS_FILE = "events.jsonl"
LEDGER_FILE = "trajectories.jsonl"
METRICS_FILE = "metrics.jsonl"
OUTCOMES = ("consumed", "aborted", "failed", "buffered")
RECORD_FILES = (METRICS_FILE, EVENTS_FILE, LEDGER_FILE)


def _append(path: Path, line: dict[str, Any]) -> None:
    """One line per call, flushed at once, so a SIGKILL loses at most the line being written."""
    with path.open("a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def _read(path: Path) -> list[dict[str, Any]]:
    """Every complete line; a torn last line (the writer was killed mid-write) is skipped."""
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        if not raw.strip():
            continue
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return out


class EventLog:
    """Appends `{"t", "iteration", "kind", **detail}` to RUN_DIR/events.jsonl: restarts, outages, switches."""

    def __init__(self, run_dir: Path, clock: Callable[[], float] = time.time) -> None:
        """`clock` gives the unix time stamped on each event (a parameter so tests can fix it)."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / EVENTS_FILE
        self._clock = clock

    def record(self, kind: str, iteration: int | None = None, **detail: Any) -> dict[str, Any]:
        """Append one event and return it; `kind` names what happened (actor_died, pool_lost, ...)."""
        # VAL: VAL_NON_EMPTY(kind, exc=SchedulerError)
        check.non_empty("kind", kind, exc=SchedulerError)  # generated #5f97a28857
        event = {**detail, "t": self._clock(), "iteration": iteration, "kind": kind}
        _append(self.path, event)
        return event


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of a run, in the order they were written."""
    return _read(Path(run_dir) / EVENTS_FILE)


@dataclass
class TurnServed:
    """Who served one turn: the worker's id, its pool's hardware, and the weight version of its first token."""

    worker: str
    hardware: str
    version: int | None


@dataclass
class LedgerEntry:
    """One trajectory's line in RUN_DIR/trajectories.jsonl: where it ran and how it ended.

    `iteration` is the iteration during which the outcome was settled (a trajectory still buffered
    when the run ends carries the last iteration); `reason` says why for aborted and failed ones.
    """

    id: str
    iteration: int
    task: str
    tag: str
    outcome: str
    turns: list[TurnServed] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reason: str | None = None
    reward: float | None = None
    n_turns: int = 0
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        """The line's JSON object (the format `read_ledger` returns)."""
        return asdict(self)


class TrajectoryLedger:
    """Appends one line per trajectory to RUN_DIR/trajectories.jsonl and refuses a second line for an id."""

    def __init__(self, run_dir: Path) -> None:
        """Ids already in the file (an earlier segment of a resumed run) are not checked against: ids restart."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / LEDGER_FILE
        self._written: set[str] = set()

    def __contains__(self, trajectory_id: str) -> bool:
        """Whether this ledger (this process) already wrote a line for `trajectory_id`."""
        return trajectory_id in self._written

    def __len__(self) -> int:
        """How many lines this ledger wrote."""
        return len(self._written)

    def record(self, entry: LedgerEntry) -> None:
        """Append `entry`; each id at most once, with one of OUTCOMES."""
        # VAL: VAL_ONE_OF(entry.outcome, choices=OUTCOMES, exc=SchedulerError)
        check.one_of("entry.outcome", entry.outcome, OUTCOMES, exc=SchedulerError)  # generated #c803d1beb8
        # AST: AST_PRECONDITION(entry.id not in self._written, got=entry.id, msg="a trajectory has one ledger line", exc=SchedulerError)
        check.precondition(entry.id not in self._written, "a trajectory has one ledger line", got=entry.id, exc=SchedulerError)  # generated #36966ed856
        self._written.add(entry.id)
        _append(self.path, entry.to_json())


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    """The ledger lines of a run, in the order they were written."""
    return _read(Path(run_dir) / LEDGER_FILE)


def truncate_after(run_dir: Path, iteration: int, files: Iterable[str] = RECORD_FILES) -> dict[str, int]:
    """Drop every line whose `iteration` is after `iteration` from the run's records; returns lines dropped per file.

    Called on resume from the checkpoint of `iteration`: what the lost iterations wrote is rewritten
    by their second run. Lines without an iteration (events before the first one) are kept. Each
    file is rewritten to a temporary file and renamed, so a kill during the cut leaves the old file.
    """
    # VAL: VAL_INT_RANGE(iteration, min=0, max=2**62, exc=SchedulerError)
    check.int_range("iteration", iteration, min=0, max=2**62, exc=SchedulerError)  # generated #d3138b8386
    dropped: dict[str, int] = {}
    for name in files:
        path = Path(run_dir) / name
        if not path.exists():
            continue
        keep, n = [], 0
        for raw in path.read_text().splitlines():
            if not raw.strip():
                continue
            try:
                it = json.loads(raw).get("iteration")
            except (json.JSONDecodeError, AttributeError):
                n += 1  # a torn line from a killed writer
                continue
            if isinstance(it, int) and it > iteration:
                n += 1
            else:
                keep.append(raw)
        if n:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in keep))
            os.replace(tmp, path)
        dropped[name] = n
    return dropped


def empty_outcomes() -> dict[str, Any]:
    """An iteration's `outcomes` before anything happened."""
    return {"launched": 0, "consumed": 0, "aborted": {}, "failed": {}, "buffered": 0}


def settled(outcomes: dict[str, Any]) -> int:
    """How many trajectories an `outcomes` record settled: consumed + every aborted + every failed."""
    return int(outcomes["consumed"]) + sum(outcomes["aborted"].values()) + sum(outcomes["failed"].values())


def outcomes_add_up(outcomes: dict[str, Any], buffered_before: int) -> bool:
    """The identity of D49: buffered_before + launched == consumed + sum(aborted) + sum(failed) + buffered."""
    return buffered_before + int(outcomes["launched"]) == settled(outcomes) + int(outcomes["buffered"])


class OutcomeTally:
    """Counts launches and endings per iteration; `take()` gives the iteration's `outcomes` and starts the next.

    `buffered` is every trajectory launched (in this process) and not yet settled: in flight, being
    scored, or waiting in the buffer. So across consecutive records the identity of
    `outcomes_add_up` holds with `buffered_before` = the previous record's `buffered` (0 for the
    first record of a process).
    """

    def __init__(self) -> None:
        """Nothing launched yet."""
        self._open: set[str] = set()
        self._now = empty_outcomes()

    @property
    def open_ids(self) -> set[str]:
        """Launched and not yet settled."""
        return set(self._open)

    def launched(self, trajectory_id: str) -> None:
        """A trajectory started (its id is new)."""
        # AST: AST_PRECONDITION(trajectory_id not in self._open, got=trajectory_id, msg="a trajectory is launched once", exc=SchedulerError)
        check.precondition(trajectory_id not in self._open, "a trajectory is launched once", got=trajectory_id, exc=SchedulerError)  # generated #136c439012
        self._open.add(trajectory_id)
        self._now["launched"] += 1

    def ended(self, trajectory_id: str, outcome: str, reason: str | None = None) -> bool:
        """A trajectory settled; False (and nothing counted) when it was not open (ended twice, or never launched here)."""
        # VAL: VAL_ONE_OF(outcome, choices=("consumed", "aborted", "failed"), exc=SchedulerError)
        check.one_of("outcome", outcome, ("consumed", "aborted", "failed"), exc=SchedulerError)  # generated #cf74f511b5
        if trajectory_id not in self._open:
            return False
        self._open.discard(trajectory_id)
        if outcome == "consumed":
            self._now["consumed"] += 1
        else:
            bucket = self._now[outcome]
            key = reason or "unknown"
            bucket[key] = bucket.get(key, 0) + 1
        return True

    def take(self) -> dict[str, Any]:
        """This iteration's `outcomes` (with `buffered` = still open now); the next iteration counts from zero."""
        out = self._now
        out["buffered"] = len(self._open)
        self._now = empty_outcomes()
        return out


def add_routing(routing: dict[str, dict[str, int]], tag: str, hardware: str, n: int = 1) -> None:
    """Count `n` (requests or tokens) for `tag` on `hardware` in a `routing` / `routing_tokens` table."""
    per_tag = routing.setdefault(tag, {})
    per_tag[hardware] = per_tag.get(hardware, 0) + n
