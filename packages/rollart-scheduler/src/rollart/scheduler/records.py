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
OPEN_TRAJECTORIES = "open_trajectories.json"  # in a checkpoint: ids open at its record (D65)


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


def reason_key(reason: str) -> str:
    """A short, low-cardinality key for an abort reason or a failure kind (the metrics' dict keys).

    The ledger keeps the full reason; the per-iteration counts group by what happened: `stale`,
    `shutdown`, `one_off`, `sync`, `llm_abort`, `group_member_lost`, `group_closed`, `env_crash`, ...
    """
    text = reason.strip()
    for prefix in ("trajectory aborted: ", "trajectory failed: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    if text.startswith("cancelled:"):
        text = text[len("cancelled:"):]
    if text.startswith("member "):
        return "group_member_lost"
    if text.startswith("group ") and "already closed" in text:
        return "group_closed"
    if text.startswith("group ") and "already has" in text:
        return "group_full"
    head = text.split(":", 1)[0].strip()
    return "_".join(head.split()[:3]) or "unknown"


class RunRecorder:
    """Feeds the records from a running pipeline: served requests, puts, settlements, the iteration cut.

    Why one object: the ledger line of a trajectory needs what the proxy client saw (who served
    each turn), what the env produced (reward, tokens) and how the buffer settled it; the metrics
    need the same events counted per iteration. The pipeline owns it (D50).
    """

    def __init__(self, run_dir: Path, hardware_of: Callable[[str], str] | None = None) -> None:
        """`hardware_of(worker_id)` names the hardware of a worker (replacements included)."""
        self.events = EventLog(run_dir)
        self.ledger = TrajectoryLedger(run_dir)
        self.tally = OutcomeTally()
        self.hardware_of = hardware_of or (lambda worker_id: "?")
        self.iteration = 0  # the iteration the lines written now belong to (set by the pipeline)
        self._turns: dict[str, list[TurnServed]] = {}
        self._put: dict[str, Any] = {}  # handed to the buffer, not settled yet
        self.routing: dict[str, dict[str, int]] = {}
        self.routing_tokens: dict[str, dict[str, int]] = {}
        self.open_at_record: set[str] = set()  # open when the last record was taken: what a checkpoint of it leaves open (D65)

    def _launch(self, trajectory_id: str) -> None:
        if trajectory_id not in self._turns and trajectory_id not in self.ledger:
            self._turns[trajectory_id] = []
            self.tally.launched(trajectory_id)

    def served(self, trajectory_id: str, tag: str, worker_ids: tuple[str, ...], tokens: int,
               version: int | None) -> None:
        """One generate response: counts routing, remembers the turn's worker (the launch, on the first)."""
        if not worker_ids:
            return
        worker = worker_ids[-1]
        hardware = self.hardware_of(worker)
        add_routing(self.routing, tag, hardware)
        add_routing(self.routing_tokens, tag, hardware, tokens)
        if trajectory_id:
            self._launch(trajectory_id)
            if trajectory_id in self._turns:
                self._turns[trajectory_id].append(TurnServed(worker, hardware, version))

    def put(self, trajectory: Any) -> None:
        """Buffer observer: a trajectory ended (a launch too if it never reached the LLM)."""
        self._launch(trajectory.id)
        self._put[trajectory.id] = trajectory

    def settled(self, trajectory: Any, state: str, reason: str) -> None:
        """Buffer settlement observer: consumed, or aborted (failed when the trajectory itself failed)."""
        status = str(getattr(trajectory.status, "value", trajectory.status))
        outcome = "consumed" if state == "consumed" else "failed" if status == "failed" else "aborted"
        full = (getattr(trajectory, "reason", "") or reason) if outcome == "failed" else reason
        if not self.tally.ended(trajectory.id, outcome, reason_key(full) if outcome != "consumed" else None):
            return
        self._put.pop(trajectory.id, None)
        self._write(trajectory.id, trajectory, outcome, full or None)

    def _write(self, trajectory_id: str, trajectory: Any | None, outcome: str, reason: str | None) -> None:
        turns = self._turns.pop(trajectory_id, [])
        group = getattr(trajectory, "group_id", "") or trajectory_id
        versions = list(trajectory.weight_versions()) if trajectory is not None else []
        count = getattr(trajectory, "num_response_tokens", None)
        self.ledger.record(LedgerEntry(
            id=trajectory_id, iteration=self.iteration, task=group.rsplit("-g", 1)[0],
            tag=getattr(trajectory, "tag", "") or "", outcome=outcome, turns=turns, versions=versions, reason=reason,
            reward=None if getattr(trajectory, "reward", None) is None else float(trajectory.reward),
            n_turns=len(getattr(trajectory, "turns", []) or []), tokens=int(count()) if callable(count) else 0))

    def take_iteration(self) -> dict[str, Any]:
        """The iteration's `routing`, `routing_tokens` and `outcomes` fields; the next iteration counts anew."""
        out = {"routing": self.routing, "routing_tokens": self.routing_tokens, "outcomes": self.tally.take()}
        self.routing, self.routing_tokens = {}, {}
        self.open_at_record = self.tally.open_ids
        return out

    def settle_lost(self, iteration: int, open_ids: Iterable[str]) -> int:
        """On resume from the checkpoint of `iteration`: a line for every trajectory open at its record that has none.

        The buffer is not checkpointed, so what was in flight or buffered when that record was taken
        died with the process (or, after a clean stop, its `buffered` lines were cut with the later
        iterations). Each gets an `aborted` line (`lost_on_resume`), and a `run_closed` event at
        `iteration` settles them, so the identity of D49 holds across the two processes (D65).
        """
        # VAL: VAL_INT_RANGE(iteration, min=0, max=2**62, exc=SchedulerError)
        check.int_range("iteration", iteration, min=0, max=2**62, exc=SchedulerError)  # generated #d3138b8386
        have = {line["id"] for line in read_ledger(self.ledger.run_dir)}
        lost = sorted(set(open_ids) - have)
        reason = (f"lost_on_resume: open when the record of iteration {iteration} was taken; the process that ran it "
                  f"ended and the run resumed from that checkpoint")
        for trajectory_id in lost:
            self.ledger.record(LedgerEntry(id=trajectory_id, iteration=iteration, task="unknown", tag="",
                                           outcome="aborted", reason=reason))
        if lost:
            outcomes = empty_outcomes()
            outcomes["aborted"] = {"lost_on_resume": len(lost)}
            self.events.record("run_closed", iteration=iteration, outcomes=outcomes, resumed=True)
        return len(lost)

    def close(self) -> int:
        """Write a line for every trajectory still open: `buffered` if the buffer holds it, else `aborted`.

        First a `run_closed` event carries the `outcomes` counted since the last iteration's record
        (launches and settlements after it, `buffered` = the lines written now), so the metrics plus
        this event account for every ledger line (D49).
        """
        self.events.record("run_closed", iteration=self.iteration, outcomes=self.tally.take())
        n = 0
        for trajectory_id in sorted(self.tally.open_ids):
            trajectory = self._put.pop(trajectory_id, None)
            if trajectory is not None:
                self._write(trajectory_id, trajectory, "buffered", None)
            else:
                self._write(trajectory_id, None, "aborted", "unfinished when the run closed")
            n += 1
        return n


def accounting_problems(run_dir: Path) -> list[str]:
    """What breaks "every launched trajectory has exactly one ledger line" in a run directory (empty: none).

    Checks the identity of D49 on every metrics record and on each `run_closed` event (a process's
    tail; `buffered` restarts at 0 after it), that no id has two lines, and that the launches
    counted by the records and the closings equal the ledger's lines. Meant for one process's run,
    or a resumed run whose earlier process closed cleanly: a process killed mid-run leaves its
    open trajectories without lines (what it ran after the checkpoint is cut on resume).
    """
    records = _read(Path(run_dir) / METRICS_FILE)
    closes = [e for e in read_events(run_dir) if e.get("kind") == "run_closed"]
    ledger = read_ledger(run_dir)
    problems: list[str] = []
    seen: set[str] = set()
    for line in ledger:
        if line["id"] in seen:
            problems.append(f"trajectory {line['id']} has more than one ledger line")
        seen.add(line["id"])
        if line.get("outcome") not in OUTCOMES:
            problems.append(f"trajectory {line['id']} has outcome {line.get('outcome')!r}, not one of {OUTCOMES}")
    before, ci, launched = 0, 0, 0

    def check_one(outcomes: dict[str, Any], what: str) -> None:
        if not outcomes_add_up(outcomes, before):
            problems.append(f"{what}: outcomes do not add up: {before} buffered before + {outcomes['launched']} "
                            f"launched != {settled(outcomes)} settled + {outcomes['buffered']} buffered")

    for rec in records:
        while ci < len(closes) and (closes[ci].get("iteration") or 0) < rec["iteration"]:
            check_one(closes[ci]["outcomes"], f"run_closed at iteration {closes[ci].get('iteration')}")
            launched += closes[ci]["outcomes"]["launched"]
            before, ci = 0, ci + 1
        if "outcomes" not in rec:
            continue
        check_one(rec["outcomes"], f"iteration {rec['iteration']}")
        launched += rec["outcomes"]["launched"]
        before = rec["outcomes"]["buffered"]
    for close in closes[ci:]:
        check_one(close["outcomes"], f"run_closed at iteration {close.get('iteration')}")
        launched += close["outcomes"]["launched"]
        before = 0
    if launched != len(ledger):
        problems.append(f"{launched} trajectories launched, {len(ledger)} ledger lines")
    return problems
