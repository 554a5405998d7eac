"""The metadata store: the persistent, real-time view of devices, workers, services and events.

Why SQLite (design D1): the two-phase ledger needs atomic multi-row updates (roles and phase in one
transaction) and a restart must see exactly what was committed; SQLite in WAL mode gives both, in
the standard library, with concurrent readers. ``MetadataStore`` is the small protocol the manager
uses, so a store on shared storage can replace ``SqliteMetadataStore``.

Durability: ``synchronous=NORMAL`` in WAL mode survives a crash of the controller process (what the
ledger's recovery is about); only an OS crash or power loss may lose the last commits.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollart.resource import checks as check
from rollart.resource.errors import ResourceError, TransitionInFlight
from rollart.resource.ledger import (
    OPEN_PHASES,
    PHASE_MOVES,
    TRANSITION_ROLES,
    DeviceRecord,
    Transition,
    validate_transition,
)

__all__ = [
    "SCHEMA_VERSION",
    "SERVICE_HEALTH",
    "WORKER_HEALTH",
    "Event",
    "EventDraft",
    "MetadataStore",
    "ServiceRecord",
    "SqliteMetadataStore",
    "StoreSnapshot",
    "WorkerRecord",
    "migrate",
]

WORKER_HEALTH: tuple[str, ...] = ("alive", "dead", "removed")
SERVICE_HEALTH: tuple[str, ...] = ("unknown", "healthy", "unhealthy")

# Forward migrations, one list of statements per version; version N is MIGRATIONS[N - 1].
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # v1: the ledger
        "CREATE TABLE devices (id INTEGER PRIMARY KEY, hw TEXT NOT NULL, role TEXT NOT NULL, owner TEXT)",
        "CREATE TABLE transitions (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,"
        " from_role TEXT NOT NULL, to_role TEXT NOT NULL, devices TEXT NOT NULL, phase TEXT NOT NULL, reason TEXT)",
        "CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, payload TEXT NOT NULL,"
        " at REAL NOT NULL)",
    ),
    (  # v2: workers and serverless services
        "CREATE TABLE workers (id TEXT PRIMARY KEY, owner TEXT NOT NULL, rank INTEGER NOT NULL, hw TEXT NOT NULL,"
        " devices TEXT NOT NULL, health TEXT NOT NULL, restarts INTEGER NOT NULL)",
        "CREATE TABLE services (name TEXT PRIMARY KEY, url TEXT NOT NULL, owner TEXT NOT NULL, health TEXT NOT NULL,"
        " last_error TEXT)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class WorkerRecord:
    """A worker's row: where it runs and how healthy it is.

    Attributes:
        id: ``"<owner>/<rank>"``.
        owner: the cluster that owns the worker.
        rank: the worker's rank in its cluster.
        hw: hardware type of its devices.
        devices: ledger ids of its devices.
        health: one of ``WORKER_HEALTH``.
        restarts: how many times the cluster restarted it.
    """

    id: str
    owner: str
    rank: int
    hw: str
    devices: tuple[int, ...]
    health: str
    restarts: int


@dataclass(frozen=True)
class ServiceRecord:
    """A registered serverless endpoint and its last known health.

    Attributes:
        name: the service name (unique).
        url: the http(s) endpoint.
        owner: the cluster that registered it.
        health: one of ``SERVICE_HEALTH``.
        last_error: the last failure seen, if any.
    """

    name: str
    url: str
    owner: str
    health: str
    last_error: str | None


@dataclass(frozen=True)
class Event:
    """One entry of the event log (the persistent record of what the control plane did).

    Attributes:
        seq: monotonically increasing sequence number.
        kind: what happened (``allocated``, ``transition_committed``, ``worker_removed``, ...).
        payload: JSON-serialisable details.
        at: the controller's loop time when it was recorded.
    """

    seq: int
    kind: str
    payload: Mapping[str, Any]
    at: float


@dataclass(frozen=True)
class EventDraft:
    """An event to append in the same SQL transaction as the change it describes (design D10).

    Attributes:
        kind: what happened.
        payload: JSON-serialisable details.
        at: the controller's loop time.
    """

    kind: str
    payload: Mapping[str, Any]
    at: float


@dataclass(frozen=True)
class StoreSnapshot:
    """Everything the store holds, for "restart restores the exact state" checks and debugging."""

    schema_version: int
    devices: tuple[DeviceRecord, ...]
    transitions: tuple[Transition, ...]
    workers: tuple[WorkerRecord, ...]
    services: tuple[ServiceRecord, ...]
    events: tuple[Event, ...]


@runtime_checkable
class MetadataStore(Protocol):
    """The small interface the manager needs; SqliteMetadataStore is the embedded implementation."""

    def schema_version(self) -> int: ...
    def devices(self) -> dict[int, DeviceRecord]: ...
    def init_devices(self, devices: Sequence[DeviceRecord], *, event: EventDraft | None = None) -> None: ...
    def claim(self, owner: str, role: str, devices: Sequence[int], *, event: EventDraft | None = None) -> None: ...
    def release(self, owner: str, devices: Sequence[int] | None = None, *, event: EventDraft | None = None) -> tuple[int, ...]: ...
    def begin_transition(self, transition: Transition, *, event: EventDraft | None = None) -> None: ...
    def set_phase(self, transition_id: str, phase: str, reason: str | None = None, *, event: EventDraft | None = None) -> Transition: ...
    def commit_transition(self, transition_id: str, *, event: EventDraft | None = None) -> Transition: ...
    def open_transition(self) -> Transition | None: ...
    def transitions(self) -> list[Transition]: ...
    def put_worker(self, record: WorkerRecord, *, event: EventDraft | None = None) -> None: ...
    def workers(self, owner: str | None = None) -> list[WorkerRecord]: ...
    def put_service(self, record: ServiceRecord, *, event: EventDraft | None = None) -> None: ...
    def services(self) -> list[ServiceRecord]: ...
    def append_event(self, kind: str, payload: Mapping[str, Any], at: float) -> Event: ...
    def events(self, since: int = 0) -> list[Event]: ...
    def last_event_seq(self) -> int: ...
    def snapshot(self) -> StoreSnapshot: ...
    def close(self) -> None: ...


def _transition_of(row: sqlite3.Row | tuple) -> Transition:
    tid, kind, from_role, to_role, devices, phase = row
    return Transition(tid, kind, from_role, to_role, tuple(json.loads(devices)), phase)


def _worker_of(row: tuple) -> WorkerRecord:
    wid, owner, rank, hw, devices, health, restarts = row
    return WorkerRecord(wid, owner, rank, hw, tuple(json.loads(devices)), health, restarts)


_TRANSITION_COLS = "id, kind, from_role, to_role, devices, phase"


class SqliteMetadataStore:
    """The embedded store: one SQLite file (WAL), every multi-row change in one transaction."""

    def __init__(self, path: str | Path = ":memory:", *, busy_timeout: float = 5.0) -> None:
        """Open (creating or migrating) the file; the busy timeout is the deadline for the write lock."""
        # deps: migrate
        # VAL: VAL_TIMEOUT(busy_timeout, exc=ResourceError)
        check.timeout("busy_timeout", busy_timeout, exc=ResourceError)  # generated #cac9625f79
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write transaction takes the
        # write lock up front and a validation inside it sees the state it is about to change.
        self._conn = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        migrate(self._conn)

    # -- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _write(self, event: EventDraft | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction; the event (if any) is appended inside it, so it commits with the change."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
            if event is not None:
                self._insert_event(event)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _insert_event(self, event: EventDraft) -> int:
        if not event.kind:
            raise ResourceError(f"event.kind must not be empty, got {event.kind!r}")
        text = json.dumps(dict(event.payload), sort_keys=True)
        return self._conn.execute("INSERT INTO events (kind, payload, at) VALUES (?, ?, ?)",
                                  (event.kind, text, event.at)).lastrowid

    def _transition(self, transition_id: str) -> Transition:
        row = self._conn.execute(f"SELECT {_TRANSITION_COLS} FROM transitions WHERE id = ?", (transition_id,)).fetchone()
        if row is None:
            raise ResourceError(f"transition_id {transition_id!r} is not a known transition")
        return _transition_of(row)

    # -- ledger -------------------------------------------------------------------------------
    def schema_version(self) -> int:
        """The schema version of the open file (PRAGMA user_version)."""
        # deps: none
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def devices(self) -> dict[int, DeviceRecord]:
        """The ledger: every device by id."""
        # deps: none
        rows = self._conn.execute("SELECT id, hw, role, owner FROM devices ORDER BY id").fetchall()
        return {r[0]: DeviceRecord(*r) for r in rows}

    def init_devices(self, devices: Sequence[DeviceRecord], *, event: EventDraft | None = None) -> None:
        """Create the device rows of a new pool, all free; refuses if rows exist already."""
        # deps: none
        # VAL: VAL_NON_EMPTY(devices, exc=ResourceError)
        check.non_empty("devices", devices, exc=ResourceError)  # generated #dee40652f9
        with self._write(event) as conn:
            # AST: AST_PRECONDITION(not self.devices(), got=len(self.devices()), msg="the store has no devices yet", exc=ResourceError)
            check.precondition(not self.devices(), "the store has no devices yet", got_lazy=lambda: len(self.devices()), exc=ResourceError)  # generated #fcfede9a56
            conn.executemany("INSERT INTO devices (id, hw, role, owner) VALUES (?, ?, 'free', NULL)",
                             [(d.id, d.hw) for d in devices])

    def claim(self, owner: str, role: str, devices: Sequence[int], *, event: EventDraft | None = None) -> None:
        """Bind free devices to an owner and role, checking they are free inside the write transaction."""
        # deps: none
        # VAL: VAL_NON_EMPTY(owner, exc=ResourceError)
        check.non_empty("owner", owner, exc=ResourceError)  # generated #a733878f01
        # VAL: VAL_ONE_OF(role, choices=TRANSITION_ROLES, exc=ResourceError)
        check.one_of("role", role, TRANSITION_ROLES, exc=ResourceError)  # generated #7fbd1c5285
        devices = list(devices)
        # VAL: VAL_NON_EMPTY(devices, exc=ResourceError)
        check.non_empty("devices", devices, exc=ResourceError)  # generated #dee40652f9
        with self._write(event) as conn:
            free = {r[0] for r in conn.execute("SELECT id FROM devices WHERE role = 'free'")}
            # VAL: VAL_SUBSET(devices, of=free, exc=ResourceError)
            check.subset("devices", devices, of=free, exc=ResourceError)  # generated #3a721be890
            conn.executemany("UPDATE devices SET role = ?, owner = ? WHERE id = ?", [(role, owner, d) for d in devices])

    def release(self, owner: str, devices: Sequence[int] | None = None, *, event: EventDraft | None = None) -> tuple[int, ...]:
        """Return an owner's devices (all, or the given ones) to the free pool; returns the ids freed.

        The event, if any, is recorded only when devices were freed, with ``devices`` set to them.
        """
        # deps: none
        with self._write() as conn:
            owned = [r[0] for r in conn.execute("SELECT id FROM devices WHERE owner = ? ORDER BY id", (owner,))]
            devices = owned if devices is None else list(devices)
            # VAL: VAL_SUBSET(devices, of=owned, exc=ResourceError)
            check.subset("devices", devices, of=owned, exc=ResourceError)  # generated #e72e19808a
            pending = self.open_transition()
            if pending is not None and set(pending.devices) & set(devices):
                raise TransitionInFlight(
                    f"devices {sorted(set(pending.devices) & set(devices))} are part of the open transition "
                    f"{pending.id} ({pending.kind} {pending.from_role}->{pending.to_role}, phase {pending.phase}); "
                    "finish or recover it before releasing them")
            conn.executemany("UPDATE devices SET role = 'free', owner = NULL WHERE id = ?", [(d,) for d in devices])
            if devices and event is not None:  # the event names the devices actually freed
                self._insert_event(EventDraft(event.kind, {**event.payload, "devices": sorted(devices)}, event.at))
        return tuple(sorted(devices))

    def begin_transition(self, transition: Transition, *, event: EventDraft | None = None) -> None:
        """Insert a planned transition after revalidating it, atomically refusing if one is open."""
        # deps: validate_transition
        # AST: AST_PRECONDITION(transition.phase == "planned", got=transition.phase, msg="a new transition is planned", exc=ResourceError)
        check.precondition(transition.phase == "planned", "a new transition is planned", got=transition.phase, exc=ResourceError)  # generated #d4a1fb4523
        with self._write(event) as conn:
            pending = self.open_transition()
            if pending is not None:
                raise TransitionInFlight(
                    f"cannot {transition.kind} devices {list(transition.devices)}: transition {pending.id} "
                    f"({pending.kind} {pending.from_role}->{pending.to_role} of {list(pending.devices)}) is in flight "
                    f"in phase {pending.phase!r}; one transition at a time (finish it or call recover())")
            devices = validate_transition(transition.kind, transition.from_role, transition.to_role,
                                          transition.devices, self.devices())
            conn.execute(
                "INSERT INTO transitions (id, kind, from_role, to_role, devices, phase) VALUES (?, ?, ?, ?, ?, ?)",
                (transition.id, transition.kind, transition.from_role, transition.to_role, json.dumps(devices),
                 "planned"))

    def set_phase(self, transition_id: str, phase: str, reason: str | None = None, *, event: EventDraft | None = None) -> Transition:
        """Move a transition along the state machine (not to committed: that is commit_transition)."""
        # deps: none
        # AST: AST_PRECONDITION(phase != "committed", got=phase, msg="commit goes through commit_transition", exc=ResourceError)
        check.precondition(phase != "committed", "commit goes through commit_transition", got=phase, exc=ResourceError)  # generated #864d20b0be
        with self._write(event) as conn:
            current = self._transition(transition_id)
            # VAL: VAL_STATE_TRANSITION(current.phase, phase, allowed=PHASE_MOVES, exc=ResourceError)
            check.transition("current.phase", current.phase, phase, PHASE_MOVES, exc=ResourceError)  # generated #e7d9c1a179
            conn.execute("UPDATE transitions SET phase = ?, reason = COALESCE(?, reason) WHERE id = ?",
                         (phase, reason, transition_id))
        return Transition(current.id, current.kind, current.from_role, current.to_role, current.devices, phase)

    def commit_transition(self, transition_id: str, *, event: EventDraft | None = None) -> Transition:
        """The atomic point: apply the roles and mark committed in one SQL transaction."""
        # deps: none
        with self._write(event) as conn:
            current = self._transition(transition_id)
            # VAL: VAL_STATE_TRANSITION(current.phase, "committed", allowed=PHASE_MOVES, exc=ResourceError)
            check.transition("current.phase", current.phase, "committed", PHASE_MOVES, exc=ResourceError)  # generated #a23e477e02
            ledger = self.devices()
            moved = [d for d in current.devices if ledger[d].role == current.from_role]
            # AST: AST_INVARIANT(len(moved) == len(current.devices), got=current.devices, msg="every device of the transition still has its from_role", exc=ResourceError)
            check.invariant(len(moved) == len(current.devices), "every device of the transition still has its from_role", got=current.devices, exc=ResourceError)  # generated #b1561f28c8
            conn.executemany("UPDATE devices SET role = ? WHERE id = ?", [(current.to_role, d) for d in current.devices])
            conn.execute("UPDATE transitions SET phase = 'committed' WHERE id = ?", (transition_id,))
        return Transition(current.id, current.kind, current.from_role, current.to_role, current.devices, "committed")

    def open_transition(self) -> Transition | None:
        """The transition in planned/prepared/committed, if any (at most one)."""
        # deps: none
        marks = ", ".join("?" * len(OPEN_PHASES))
        row = self._conn.execute(
            f"SELECT {_TRANSITION_COLS} FROM transitions WHERE phase IN ({marks}) ORDER BY seq LIMIT 1", OPEN_PHASES
        ).fetchone()
        return None if row is None else _transition_of(row)

    def transitions(self) -> list[Transition]:
        """All transitions, oldest first (the history of the ledger)."""
        # deps: none
        rows = self._conn.execute(f"SELECT {_TRANSITION_COLS} FROM transitions ORDER BY seq").fetchall()
        return [_transition_of(r) for r in rows]

    def transition_reason(self, transition_id: str) -> str | None:
        """Why a transition was aborted (or how it was recovered), if recorded."""
        row = self._conn.execute("SELECT reason FROM transitions WHERE id = ?", (transition_id,)).fetchone()
        if row is None:
            raise ResourceError(f"transition_id {transition_id!r} is not a known transition")
        return row[0]

    # -- workers and services ----------------------------------------------------------------
    def put_worker(self, record: WorkerRecord, *, event: EventDraft | None = None) -> None:
        """Insert or replace a worker row (health reports are idempotent upserts)."""
        # deps: none
        # VAL: VAL_ONE_OF(record.health, choices=WORKER_HEALTH, exc=ResourceError)
        check.one_of("record.health", record.health, WORKER_HEALTH, exc=ResourceError)  # generated #f6ba681bf2
        with self._write(event) as conn:
            conn.execute("INSERT OR REPLACE INTO workers VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (record.id, record.owner, record.rank, record.hw, json.dumps(list(record.devices)),
                          record.health, record.restarts))

    def workers(self, owner: str | None = None) -> list[WorkerRecord]:
        """Worker rows, all or one owner's, by id."""
        # deps: none
        cols = "id, owner, rank, hw, devices, health, restarts"
        if owner is None:
            rows = self._conn.execute(f"SELECT {cols} FROM workers ORDER BY owner, rank").fetchall()
        else:
            rows = self._conn.execute(f"SELECT {cols} FROM workers WHERE owner = ? ORDER BY rank", (owner,)).fetchall()
        return [_worker_of(r) for r in rows]

    def put_service(self, record: ServiceRecord, *, event: EventDraft | None = None) -> None:
        """Insert or replace a service row."""
        # deps: none
        # VAL: VAL_ONE_OF(record.health, choices=SERVICE_HEALTH, exc=ResourceError)
        check.one_of("record.health", record.health, SERVICE_HEALTH, exc=ResourceError)  # generated #4cdad7067c
        with self._write(event) as conn:
            conn.execute("INSERT OR REPLACE INTO services VALUES (?, ?, ?, ?, ?)",
                         (record.name, record.url, record.owner, record.health, record.last_error))

    def services(self) -> list[ServiceRecord]:
        """Registered services by name."""
        # deps: none
        rows = self._conn.execute("SELECT name, url, owner, health, last_error FROM services ORDER BY name")
        return [ServiceRecord(*r) for r in rows.fetchall()]

    # -- events ---------------------------------------------------------------------------------
    def append_event(self, kind: str, payload: Mapping[str, Any], at: float) -> Event:
        """Append to the event log; payload must be JSON-serialisable."""
        # deps: none
        # VAL: VAL_NON_EMPTY(kind, exc=ResourceError)
        check.non_empty("kind", kind, exc=ResourceError)  # generated #73471c46a6
        draft = EventDraft(kind, payload, at)
        with self._write():
            seq = self._insert_event(draft)
        return Event(seq, kind, json.loads(json.dumps(dict(payload), sort_keys=True)), at)

    def events(self, since: int = 0) -> list[Event]:
        """Events with seq > since, in order."""
        # deps: none
        rows = self._conn.execute("SELECT seq, kind, payload, at FROM events WHERE seq > ? ORDER BY seq", (since,))
        return [Event(seq, kind, json.loads(payload), at) for seq, kind, payload, at in rows.fetchall()]

    def last_event_seq(self) -> int:
        """The seq of the newest event (0 when the log is empty), so a reader can follow the log."""
        # deps: none
        row = self._conn.execute("SELECT MAX(seq) FROM events").fetchone()
        return row[0] or 0

    def snapshot(self) -> StoreSnapshot:
        """Every table, for equality checks across a restart."""
        # deps: devices, transitions, workers, services, events
        return StoreSnapshot(self.schema_version(), tuple(self.devices().values()), tuple(self.transitions()),
                             tuple(self.workers()), tuple(self.services()), tuple(self.events()))

    def close(self) -> None:
        """Close the connection (a crashed controller simply never calls it)."""
        # deps: none
        self._conn.close()


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring a database to the target schema version, one migration per transaction; returns the version."""
    # deps: MIGRATIONS
    # VAL: VAL_INT_RANGE(target, min=1, max=SCHEMA_VERSION, exc=ResourceError)
    check.int_range("target", target, min=1, max=SCHEMA_VERSION, exc=ResourceError)  # generated #fc658e50cc
    current = conn.execute("PRAGMA user_version").fetchone()[0]
    if current > SCHEMA_VERSION:
        raise ResourceError(f"store schema version {current} is newer than this code supports ({SCHEMA_VERSION}); "
                            "upgrade rollart-resource")
    for version in range(current + 1, target + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version:d}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return max(current, target)
