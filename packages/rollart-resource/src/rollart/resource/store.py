"""The metadata store: the persistent, real-time view of devices, workers, services and events.

Why SQLite (design D1): the two-phase ledger needs atomic multi-row updates (roles and phase in one
transaction) and a restart must see exactly what was committed; SQLite in WAL mode gives both, in
the standard library, with concurrent readers. ``MetadataStore`` is the small protocol the manager
uses, so a store on shared storage can replace ``SqliteMetadataStore``.

Durability (design R15, D19): WAL with ``synchronous=FULL`` (the default): a commit is on disk before
the call returns, so before any hook hears the outcome; a kill of the process or a power loss loses
nothing committed. A damaged or deleted WAL loses the transactions from the damaged frame on (SQLite
keeps the consistent prefix; not detected). The store does not trust what it reads (D18): every row
carries a CRC-32 checked on every read, every value is checked against the known roles, phases and
health values, and a file that is empty, foreign, fails ``integrity_check`` or has a wrong schema or
row is refused at open with ``StoreDamaged`` naming the file and what to do.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rollart import checks as check
from rollart.resource.errors import ResourceError, TransitionInFlight
from rollart.resource.integrity import (
    APPLICATION_ID,
    CRC_COLUMNS,
    BadRow,
    StoreDamaged,
    StoreNotWritable,
    check_file,
    check_writable,
    checksum_migration,
    identity_migration,
    install_checksum_function,
    row_checksum,
)
from rollart.resource.lease import ControllerLock, StaleController
from rollart.resource.ledger import (
    OPEN_PHASES,
    PHASE_MOVES,
    PHASES,
    ROLES,
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
    "StoreDamaged",
    "StoreNotWritable",
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
    (  # v3: one controller per store: its fencing epoch, and the epoch that last moved each transition
        "CREATE TABLE controller (id INTEGER PRIMARY KEY CHECK (id = 1), epoch INTEGER NOT NULL, holder TEXT NOT NULL)",
        "ALTER TABLE transitions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0",
    ),
    checksum_migration(),  # v4: a CRC-32 per row kept by triggers, and the rollart application id
    identity_migration(),  # v5: the store's identity (run id, generation), mirrored in the lock file (D31)
)
SCHEMA_VERSION = len(MIGRATIONS)
SYNCHRONOUS: tuple[str, ...] = ("FULL", "EXTRA", "NORMAL")


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
    """The small interface the manager needs; SqliteMetadataStore is the embedded implementation.

    `ResourceManager` is its one caller, and the only writer once it called `acquire_controller`.
    Every write is one atomic transaction, on durable storage before the call returns (R15: the
    outcome is stored before any hook hears it); a write method's `event` is appended in that same
    transaction (D10), so the event log and the state never disagree. A write of a handle that is no
    longer the controller raises `StaleController` and changes nothing. Reads check what they read
    (D18) and raise `StoreDamaged` naming the store for a row that is not what was written. Calls are
    synchronous and short (a control-plane store of a few thousand rows).
    """

    def schema_version(self) -> int:
        """The schema version of the open store (in `snapshot`); a store newer than the code is refused at open."""
        ...

    def acquire_controller(self, holder: str) -> int:
        """Make this handle the store's one controller and return its fencing epoch.

        Called once by `ResourceManager.__init__` before any other call. Raises `ControllerLockHeld`
        (naming the holder) while another live controller holds the store. The epoch is greater
        than every earlier one, and a handle with an older epoch can no longer write.
        """
        ...

    def devices(self) -> dict[int, DeviceRecord]:
        """The ledger as committed: every device by id.

        Read before each allocation and transition; the write methods check it again inside their
        own transaction, so a decision made on this read cannot apply to a changed ledger.
        """
        ...

    def init_devices(self, devices: Sequence[DeviceRecord], *, event: EventDraft | None = None) -> None:
        """Create the device rows of a new pool, all free, with the `pool_created` event.

        Called once, when a manager opens a store without devices; raises `ResourceError` when the
        store holds devices already (a pool is never redefined by this call).
        """
        ...

    def claim(self, owner: str, role: str, devices: Sequence[int], *, event: EventDraft | None = None) -> None:
        """Bind free devices to `owner` in `role` (`ResourceManager.allocate`).

        Raises `ResourceError` when any of them is not free inside the write transaction; then
        none is bound.
        """
        ...

    def release(self, owner: str, devices: Sequence[int] | None = None, *, event: EventDraft | None = None) -> tuple[int, ...]:
        """Free `owner`'s devices (all of them when None) and return the ids freed, sorted.

        Raises `ResourceError` for a device the owner does not hold and `TransitionInFlight` for
        one in the open transition; nothing is freed then. The event is recorded only when a
        device was freed, with its `devices` set to the ids freed.
        """
        ...

    def begin_transition(self, transition: Transition, *, event: EventDraft | None = None) -> None:
        """Store a new transition in phase `planned`, revalidated against the ledger in the same transaction.

        Raises `TransitionInFlight` while another transition is open (one at a time) and
        `ResourceError` when the move is not valid for the current ledger (`validate_transition`).
        """
        ...

    def set_phase(self, transition_id: str, phase: str, reason: str | None = None, *, event: EventDraft | None = None) -> Transition:
        """Move a transition to `phase` along `PHASE_MOVES` (never to `committed`) and return it so.

        `reason` (why it is aborted) is kept with the transition. Raises `ResourceError` for an
        unknown id or a move the state machine does not allow; the phase is unchanged then.
        """
        ...

    def commit_transition(self, transition_id: str, *, event: EventDraft | None = None) -> Transition:
        """The atomic point: give every device of the transition its `to_role` and mark it `committed`.

        One transaction: after a crash the ledger is before or after the move, never in between.
        Raises `ResourceError` unless the transition is `prepared` and every device still has its
        `from_role`. Returns the transition in phase `committed`.
        """
        ...

    def open_transition(self) -> Transition | None:
        """The transition not yet finished (planned, prepared, committed or aborting), if any; at most one.

        `ResourceManager.recover` finishes or rolls it back after a controller restart.
        """
        ...

    def transitions(self) -> list[Transition]:
        """Every transition, oldest first: the ledger's history."""
        ...

    def put_worker(self, record: WorkerRecord, *, event: EventDraft | None = None) -> None:
        """Insert or replace a worker's row (`ResourceManager.report_worker`): one row per worker id.

        Raises `ResourceError` for a health that is not one of `WORKER_HEALTH`.
        """
        ...

    def workers(self, owner: str | None = None) -> list[WorkerRecord]:
        """The worker rows, all or one owner's, ordered by owner and rank."""
        ...

    def put_service(self, record: ServiceRecord, *, event: EventDraft | None = None) -> None:
        """Insert or replace a serverless service's row (registration and health reports).

        Raises `ResourceError` for a health that is not one of `SERVICE_HEALTH`.
        """
        ...

    def services(self) -> list[ServiceRecord]:
        """The registered services, ordered by name."""
        ...

    def append_event(self, kind: str, payload: Mapping[str, Any], at: float) -> Event:
        """Append one event on its own (`ResourceManager.record_event`) and return it with its `seq`.

        `payload` must be JSON-serialisable; `at` is the controller's clock. Sequence numbers only grow.
        """
        ...

    def events(self, since: int = 0) -> list[Event]:
        """The events with `seq > since`, in order; the manager reads them after each change to tell subscribers."""
        ...

    def last_event_seq(self) -> int:
        """The `seq` of the newest event (0 for an empty log), so a reader can follow the log from now on."""
        ...

    def snapshot(self) -> StoreSnapshot:
        """Everything the store holds, for "a restart restores the exact state" checks and debugging."""
        ...

    def close(self) -> None:
        """Release the store and the controller lock; called by `ResourceManager.close`, nothing after it.

        A controller that dies without it loses the lock with its process, so the next can take over.
        """
        ...


def _checked_row(table: str, row: tuple) -> tuple:
    """The row's values without its checksum, after checking the checksum."""
    *values, crc = row
    # VAL: VAL_CHECKSUM(crc, expected=row_checksum(table, *values), exc=BadRow)
    check.checksum("crc", crc, row_checksum(table, *values), exc=BadRow)  # generated #e3acbf07e8
    return tuple(values)


def _ids(text: str) -> tuple[int, ...]:
    ids = json.loads(text)
    # VAL: VAL_TYPE(ids, list, exc=BadRow)
    check.of_type("ids", ids, list, exc=BadRow)  # generated #5208261907
    # VAL: VAL_INT_RANGE(ids, min=0, max=2**31 - 1, each=True, exc=BadRow)
    check.int_range_each("ids", ids, min=0, max=2**31 - 1, exc=BadRow)  # generated #2d735da989
    return tuple(ids)


def _device_of(row: tuple) -> DeviceRecord:
    did, hw, role, owner = _checked_row("devices", row)
    # VAL: VAL_TYPE(hw, str, exc=BadRow)
    check.of_type("hw", hw, str, exc=BadRow)  # generated #76b0765580
    # VAL: VAL_NON_EMPTY(hw, exc=BadRow)
    check.non_empty("hw", hw, exc=BadRow)  # generated #381a6ddbc2
    # VAL: VAL_ONE_OF(role, choices=ROLES, exc=BadRow)
    check.one_of("role", role, ROLES, exc=BadRow)  # generated #17ad3d0bfd
    # AST: AST_INVARIANT((role == "free") == (owner is None), got=(role, owner), msg="a device is free iff it has no owner", exc=BadRow)
    check.invariant((role == "free") == (owner is None), "a device is free iff it has no owner", got=(role, owner), exc=BadRow)  # generated #fb36c4f00f
    # AST: AST_INVARIANT(owner is None or (isinstance(owner, str) and owner != ""), got=owner, msg="an owner is a non-empty name", exc=BadRow)
    check.invariant(owner is None or (isinstance(owner, str) and owner != ""), "an owner is a non-empty name", got=owner, exc=BadRow)  # generated #7fbbb95703
    return DeviceRecord(did, hw, role, owner)


def _transition_of(row: tuple) -> Transition:
    _seq, tid, kind, from_role, to_role, devices, phase, _reason, _epoch = _checked_row("transitions", row)
    # VAL: VAL_ONE_OF(kind, choices=("shrink", "expand"), exc=BadRow)
    check.one_of("kind", kind, ("shrink", "expand"), exc=BadRow)  # generated #c3d5e2e120
    # VAL: VAL_ONE_OF(from_role, choices=TRANSITION_ROLES, exc=BadRow)
    check.one_of("from_role", from_role, TRANSITION_ROLES, exc=BadRow)  # generated #7d740c1367
    # VAL: VAL_ONE_OF(to_role, choices=TRANSITION_ROLES, exc=BadRow)
    check.one_of("to_role", to_role, TRANSITION_ROLES, exc=BadRow)  # generated #b9633501d2
    # VAL: VAL_ONE_OF(phase, choices=PHASES, exc=BadRow)
    check.one_of("phase", phase, PHASES, exc=BadRow)  # generated #44ed0f3fa9
    return Transition(tid, kind, from_role, to_role, _ids(devices), phase)


def _event_of(row: tuple) -> Event:
    seq, kind, payload, at = _checked_row("events", row)
    # VAL: VAL_NON_EMPTY(kind, exc=BadRow)
    check.non_empty("kind", kind, exc=BadRow)  # generated #38f9ec144b
    # VAL: VAL_FINITE(at, exc=BadRow)
    check.finite("at", at, exc=BadRow)  # generated #25eb71f5a0
    body = json.loads(payload)
    # VAL: VAL_TYPE(body, dict, exc=BadRow)
    check.of_type("body", body, dict, exc=BadRow)  # generated #2d45dfe813
    return Event(seq, kind, body, at)


def _worker_of(row: tuple) -> WorkerRecord:
    wid, owner, rank, hw, devices, health, restarts = _checked_row("workers", row)
    # VAL: VAL_ONE_OF(health, choices=WORKER_HEALTH, exc=BadRow)
    check.one_of("health", health, WORKER_HEALTH, exc=BadRow)  # generated #1d77a73fa7
    # VAL: VAL_INT_RANGE(rank, min=0, max=2**31 - 1, exc=BadRow)
    check.int_range("rank", rank, min=0, max=2**31 - 1, exc=BadRow)  # generated #74afde493a
    return WorkerRecord(wid, owner, rank, hw, _ids(devices), health, restarts)


def _service_of(row: tuple) -> ServiceRecord:
    name, url, owner, health, last_error = _checked_row("services", row)
    # VAL: VAL_ONE_OF(health, choices=SERVICE_HEALTH, exc=BadRow)
    check.one_of("health", health, SERVICE_HEALTH, exc=BadRow)  # generated #51784e3604
    return ServiceRecord(name, url, owner, health, last_error)


def _controller_of(row: tuple) -> tuple[int, str]:
    _id, epoch, holder = _checked_row("controller", row)
    # VAL: VAL_INT_RANGE(epoch, min=1, max=2**62, exc=BadRow)
    check.int_range("epoch", epoch, min=1, max=2**62, exc=BadRow)  # generated #6442db0e92
    return epoch, holder


def _identity_of(row: tuple) -> tuple[str, int]:
    _id, run_id, generation = _checked_row("identity", row)
    # VAL: VAL_TYPE(run_id, str, exc=BadRow)
    check.of_type("run_id", run_id, str, exc=BadRow)  # generated #9d0c2d472c
    # VAL: VAL_NON_EMPTY(run_id, exc=BadRow)
    check.non_empty("run_id", run_id, exc=BadRow)  # generated #4f2d2e705d
    # VAL: VAL_INT_RANGE(generation, min=0, max=2**62, exc=BadRow)
    check.int_range("generation", generation, min=0, max=2**62, exc=BadRow)  # generated #8419251243
    return run_id, generation


_DECODERS: dict[str, Callable[[tuple], Any]] = {
    "devices": _device_of, "transitions": _transition_of, "events": _event_of, "workers": _worker_of,
    "services": _service_of, "controller": _controller_of, "identity": _identity_of,
}
_SELECT = {table: f"SELECT {', '.join((*cols, 'crc'))} FROM {table}" for table, cols in CRC_COLUMNS.items()}


def _is_damage(exc: sqlite3.Error) -> bool:
    """SQLite errors that mean a damaged file (not a busy lock, not a bug in a statement of ours)."""
    text = str(exc).lower()
    return type(exc) is sqlite3.DatabaseError or any(
        sign in text for sign in ("malformed", "corrupt", "not a database", "no such table", "no such column",
                                  "no such function", "disk i/o", "unsupported file format", "syntax error",
                                  "could not decode"))


def _sqlite_damage_is_store_damage(method: Callable) -> Callable:
    """Turn a raw ``sqlite3.DatabaseError`` ("database disk image is malformed") into StoreDamaged naming the file."""
    @functools.wraps(method)
    def wrapper(self: SqliteMetadataStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except UnicodeDecodeError as exc:
            raise StoreDamaged(self.path, f"text that is not UTF-8: {exc}") from exc
        except sqlite3.Error as exc:
            if _is_damage(exc):
                raise StoreDamaged(self.path, f"SQLite: {exc}") from exc
            raise
    return wrapper


def _create_atomically(path: str) -> None:
    """Create a new store beside its path, complete, then link it into place (never replacing a file).

    Why: ``sqlite3.connect`` creates an empty file first; a controller killed before the first commit would
    leave a 0-byte store, which the next open must refuse (it cannot tell it from a truncated one). Created
    aside and linked in, the store at ``path`` is always either absent or a complete, migrated database.
    """
    tmp = f"{path}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            migrate(conn)
        finally:
            conn.close()  # the last connection checkpoints: the whole database is in the file
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails if another process created the store meanwhile
        except FileExistsError:
            pass
        dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        for leftover in (tmp, f"{tmp}-wal", f"{tmp}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _expected_schema() -> list[tuple]:
    """The schema this code creates (sqlite_master rows), to compare an opened file against."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn)
        return conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    finally:
        conn.close()


class SqliteMetadataStore:
    """The embedded store: one SQLite file (WAL), every multi-row change in one transaction, every row checked."""

    def __init__(self, path: str | Path = ":memory:", *, busy_timeout: float = 5.0, synchronous: str = "FULL") -> None:
        """Open (creating or migrating) the file and verify it; the busy timeout is the deadline for the write lock.

        The store's identity (design D31) is checked against the lock file beside it: a store of another run, or
        one older than the last controller's last commit (a restored backup, a deleted -wal), is refused.

        Raises:
            StoreDamaged: the file exists but is empty, is not a rollart store, fails ``verify``, or is not the
                store the lock file says the last controller committed (another run id, an older generation).
            StoreNotWritable: the directory or a file of the store is read-only for this process (names the path).
        """
        # deps: migrate, check_file, check_writable, SqliteMetadataStore.verify
        # VAL: VAL_TIMEOUT(busy_timeout, exc=ResourceError)
        check.timeout("busy_timeout", busy_timeout, exc=ResourceError)  # generated #cac9625f79
        # VAL: VAL_ONE_OF(synchronous, choices=SYNCHRONOUS, exc=ResourceError)
        check.one_of("synchronous", synchronous, SYNCHRONOUS, exc=ResourceError)  # generated #90613314ea
        self.path = str(path)
        witness: dict | None = None
        self._created = False
        self._files: tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None = None  # see _file_ids
        if self.path != ":memory:":
            check_writable(self.path)
            # read before the store: a controller mirrors its commit after it, so the store is never behind an
            # honest mirror read first
            witness = ControllerLock(self.path).read()
            if not check_file(self.path):
                _create_atomically(self.path)
                self._created = True  # a new store: the lock file speaks of a store that was moved aside
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so a write transaction takes the
        # write lock up front and a validation inside it sees the state it is about to change.
        self._epoch: int | None = None  # the fencing epoch, once this handle acquired the store as its controller
        self._lock: ControllerLock | None = None
        self._conn = sqlite3.connect(self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        try:
            install_checksum_function(self._conn)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous}")
            migrate(self._conn)
            self.verify()
            self.run_id, self._generation = self.identity()
            if witness is not None and not self._created:
                self._check_witness(witness)
            self._files = self._file_ids()
        except UnicodeDecodeError as exc:  # text SQLite hands back that is not UTF-8 (the schema, a value)
            self._conn.close()
            raise StoreDamaged(self.path, f"text that is not UTF-8: {exc}") from exc
        except sqlite3.Error as exc:
            self._conn.close()
            if "unable to open" in str(exc) or "readonly" in str(exc):  # a race with check_writable, or a mount
                raise StoreNotWritable(self.path, f"SQLite: {exc}") from exc
            if _is_damage(exc):
                raise StoreDamaged(self.path, f"SQLite cannot open it: {exc}") from exc
            raise
        except StoreDamaged:
            self._conn.close()
            raise
        except ResourceError as exc:  # e.g. a schema version from the future: say which file
            self._conn.close()
            raise type(exc)(f"metadata store {self.path}: {exc}") from None
        except BaseException:
            self._conn.close()
            raise

    def verify(self) -> None:
        """Check the whole file: SQLite's pages, the application id, the schema, every row's checksum and values.

        Run at open; cheap for a control-plane store (a few thousand rows: milliseconds).

        Raises:
            StoreDamaged: naming the file, the first problem found, and what to do.
        """
        # deps: none
        problems = [r[0] for r in self._conn.execute("PRAGMA integrity_check(5)").fetchall()]
        if problems != ["ok"]:
            raise StoreDamaged(self.path, "SQLite integrity_check found " + "; ".join(map(str, problems)))
        app = self._conn.execute("PRAGMA application_id").fetchone()[0]
        if app != APPLICATION_ID:
            raise StoreDamaged(self.path, f"application_id is {app:#x}, not a rollart store ({APPLICATION_ID:#x})")
        schema = self._conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        expected = _expected_schema()
        if schema != expected:
            differ = sorted({r[1] for r in set(schema) ^ set(expected)})
            raise StoreDamaged(self.path, f"its schema differs from the one this code creates (in {differ})")
        self.identity()
        devices = self.devices()
        transitions = self.transitions()
        self.events()
        self.workers()
        self.services()
        self._read("controller")
        if not devices and (transitions or self._conn.execute(
                "SELECT 1 FROM events WHERE kind = 'pool_created' LIMIT 1").fetchone()):
            raise StoreDamaged(self.path, "the device rows are missing while transitions or a pool_created event exist")
        for t in transitions:
            if not set(t.devices) <= set(devices):
                raise StoreDamaged(self.path, f"transition {t.id} names devices {sorted(set(t.devices) - set(devices))} "
                                              "that the ledger does not hold")

    def _read(self, table: str, where: str = "", args: Sequence[Any] = ()) -> list[Any]:
        """Rows of one table, each checked (checksum, values) and decoded; a bad row is StoreDamaged."""
        out = []
        for row in self._conn.execute(f"{_SELECT[table]} {where}", tuple(args)).fetchall():
            try:
                out.append(_DECODERS[table](row))
            except (ValueError, TypeError) as exc:
                raise StoreDamaged(self.path, f"table {table}, row {row[0]!r}: {exc}") from None
        return out

    # -- identity (design D31) -----------------------------------------------------------------
    def identity(self) -> tuple[str, int]:
        """The store's run id and generation: which run's store this is, and how many writes it committed.

        The run id is drawn when the store is created (or migrated to v5); every committed write transaction adds 1
        to the generation. An operator compares them with the lock file's ``run_id``/``generation`` (design D31).
        """
        # deps: none
        rows = self._read("identity")
        if len(rows) != 1:
            raise StoreDamaged(self.path, f"it has {len(rows)} identity rows instead of one")
        return rows[0]

    def _check_witness(self, witness: Mapping[str, Any]) -> None:
        """Refuse a store that is not the one the lock file says the last controller committed.

        A store AHEAD of the lock file is accepted: a controller killed between its commit and the mirror.
        """
        lock = f"{self.path}.lock"
        run_id, generation = witness.get("run_id"), witness.get("generation")
        if not isinstance(run_id, str) or not isinstance(generation, int):
            return  # no controller committed with this code yet (a new lock file, or one from before schema v5)
        if run_id != self.run_id:
            raise StoreDamaged(self.path, f"it is the store of run {self.run_id}, but the lock file {lock} says this "
                                          f"path holds run {run_id}: another run's store (with the same pool or not) "
                                          "was put in its place")
        if generation > self._generation:
            raise StoreDamaged(self.path, f"it is at generation {self._generation}, but the last controller committed "
                                          f"generation {generation} (lock file {lock}): it is an older copy that lacks "
                                          f"the last {generation - self._generation} commits (a restored backup, or a "
                                          f"deleted or lost -wal file). To accept losing them, delete {lock} and open "
                                          "it again")

    def _file_ids(self) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None:
        """(device, inode, ctime, size) of the store file and of its -wal (None when absent); None in memory.

        Only this process writes them while it is the controller (SQLite checkpoints on the committing
        connection), so a change between its commits is another writer: a file replaced, restored or deleted.
        """
        if self.path == ":memory:":
            return None
        out: list[tuple[int, ...] | None] = []
        for file in (self.path, f"{self.path}-wal"):
            try:
                st = os.stat(file)
            except FileNotFoundError:
                out.append(None)
            else:
                out.append((st.st_dev, st.st_ino, st.st_ctime_ns, st.st_size))
        return out[0], out[1]

    def _check_files(self, *, written: bool = False) -> None:
        """Inside a write transaction: the store file and its -wal are the ones this handle opened (and, when
        ``written``, as this controller left them at its last commit)."""
        if self._files is None:
            return
        (main, wal), (now_main, now_wal) = self._files, self._file_ids()  # type: ignore[misc]
        assert main is not None
        if now_main is None or now_main[:2] != main[:2]:
            now = "gone" if now_main is None else f"now {now_main[0]}/{now_main[1]}"
            raise StoreDamaged(self.path, f"the file at this path is not the one this controller opened (device/inode "
                                          f"{main[0]}/{main[1]}, {now}): it was replaced or deleted under the live "
                                          "controller, so this write was refused and nothing was written")
        if wal is not None and (now_wal is None or now_wal[:2] != wal[:2]):
            raise StoreDamaged(self.path, f"its -wal file {self.path}-wal was deleted or replaced under the live "
                                          "controller (the commits since the last checkpoint are in the one this "
                                          "controller opened), so this write was refused and nothing was written")
        if written:  # the one writer: any other change to the files is not its own
            for name, before, now in (("file", main, now_main), ("-wal file", wal, now_wal)):
                if before is not None and now != before:
                    raise StoreDamaged(self.path, f"its {name} was changed by another writer since this controller's "
                                                  f"last commit (ctime/size {before[2:]} -> {now[2:] if now else None}"
                                                  "): restored or rewritten in place under the live controller, its "
                                                  "tables would mix two stores; this write was refused")

    # -- plumbing ---------------------------------------------------------------------------
    @contextmanager
    def _write(self, event: EventDraft | None = None, *, fenced: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction; the event (if any) is appended inside it, so it commits with the change.

        Before the change (inside ``BEGIN IMMEDIATE``, so nothing moves meanwhile): the files are the ones this
        handle opened (two ``stat``), the identity row is this store's (one small read), and the controller's fence.
        The commit bumps the generation and mirrors it into the lock file (design D31).
        """
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._check_files()
            run_id, generation = self.identity()
            if run_id != self.run_id:
                raise StoreDamaged(self.path, f"it is now the store of run {run_id}, not of run {self.run_id} that this "
                                              "controller opened: replaced under the live controller; this write was "
                                              "refused")
            if fenced:
                self._check_fence()
            if self._epoch is not None:  # the fence passed: no other controller wrote since this one's last commit
                self._check_files(written=True)
            if self._epoch is not None and generation != self._generation:
                raise StoreDamaged(self.path, f"it is at generation {generation}, but this controller's last commit "
                                              f"was generation {self._generation}: the file was replaced or rolled "
                                              "back under the live controller; this write was refused")
            yield self._conn
            if event is not None:
                self._insert_event(event)
            self._conn.execute("UPDATE identity SET generation = generation + 1 WHERE id = 1")
        except BaseException:
            if self._conn.in_transaction:  # SQLite may have rolled back already (a damaged page)
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        self._generation = generation + 1
        self._files = self._file_ids()
        if self._lock is not None:
            self._lock.record(self.run_id, self._generation)

    def _check_fence(self) -> None:
        """Inside a write transaction: refuse the write unless this handle is the store's current controller."""
        rows = self._read("controller", "WHERE id = 1")
        row = rows[0] if rows else None
        if row is None:
            return  # nobody ever controlled this store (a bare store used directly, e.g. by a tool or a test)
        if self._epoch is None:
            raise StaleController(f"store {self.path}: this handle is not its controller (the store is held by "
                                  f"{row[1]}, epoch {row[0]}); only the controller writes: read only, or go through "
                                  "the ResourceManager that holds the store")
        if row[0] < self._epoch:
            raise StoreDamaged(self.path, f"its controller epoch is {row[0]}, older than this controller's {self._epoch}: "
                                          "the file was replaced by an older copy under the live controller; this "
                                          "write was refused")
        if row[0] != self._epoch:
            raise StaleController(f"store {self.path}: this controller (epoch {self._epoch}) is stale: {row[1]} took the "
                                  f"store over at epoch {row[0]}, so this write was refused and nothing changed. Stop "
                                  "this controller; the current holder finishes any open transition with recover()")

    def _insert_event(self, event: EventDraft) -> int:
        if not event.kind:
            raise ResourceError(f"event.kind must not be empty, got {event.kind!r}")
        text = json.dumps(dict(event.payload), sort_keys=True)
        return self._conn.execute("INSERT INTO events (kind, payload, at) VALUES (?, ?, ?)",
                                  (event.kind, text, event.at)).lastrowid

    def _transition(self, transition_id: str) -> Transition:
        rows = self._read("transitions", "WHERE id = ?", (transition_id,))
        if not rows:
            raise ResourceError(f"transition_id {transition_id!r} is not a known transition")
        return rows[0]

    # -- controller -----------------------------------------------------------------------------
    def acquire_controller(self, holder: str) -> int:
        """Become the store's one controller: take the file lock, then bump and keep the fencing epoch.

        Returns:
            This controller's epoch; every later write of this handle checks it is still the store's.

        Raises:
            ControllerLockHeld: another live controller holds the store (the message names it).
        """
        # deps: ControllerLock.acquire
        # VAL: VAL_NON_EMPTY(holder, exc=ResourceError)
        check.non_empty("holder", holder, exc=ResourceError)  # generated #aa15354e23
        if self.path != ":memory:" and self._lock is None:
            lock = ControllerLock(self.path)
            previous = lock.acquire(holder)
            try:
                # under the lock, again: a controller may have committed since this handle opened the store
                self._generation = self.identity()[1]
                if not self._created:
                    self._check_witness(previous)
                # the witness now speaks of this store (a new store's lock file may still name a moved-aside one)
                lock.record(self.run_id, self._generation)
            except BaseException:
                lock.release()
                raise
            self._lock = lock
        with self._write(fenced=False) as conn:
            conn.execute("INSERT INTO controller (id, epoch, holder) VALUES (1, 1, ?) "
                         "ON CONFLICT(id) DO UPDATE SET epoch = epoch + 1, holder = excluded.holder", (holder,))
            epoch = conn.execute("SELECT epoch FROM controller WHERE id = 1").fetchone()[0]
        self._epoch = epoch
        return epoch

    # -- ledger -------------------------------------------------------------------------------
    def schema_version(self) -> int:
        """The schema version of the open file (PRAGMA user_version)."""
        # deps: none
        return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def devices(self) -> dict[int, DeviceRecord]:
        """The ledger: every device by id."""
        # deps: none
        return {rec.id: rec for rec in self._read("devices", "ORDER BY id")}

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
            free = {d for d, rec in self.devices().items() if rec.role == "free"}
            # VAL: VAL_SUBSET(devices, of=free, exc=ResourceError)
            check.subset("devices", devices, of=free, exc=ResourceError)  # generated #3a721be890
            conn.executemany("UPDATE devices SET role = ?, owner = ? WHERE id = ?", [(role, owner, d) for d in devices])

    def release(self, owner: str, devices: Sequence[int] | None = None, *, event: EventDraft | None = None) -> tuple[int, ...]:
        """Return an owner's devices (all, or the given ones) to the free pool; returns the ids freed.

        The event, if any, is recorded only when devices were freed, with ``devices`` set to them.
        """
        # deps: none
        with self._write() as conn:
            owned = [d for d, rec in self.devices().items() if rec.owner == owner]
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
                "INSERT INTO transitions (id, kind, from_role, to_role, devices, phase, epoch) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (transition.id, transition.kind, transition.from_role, transition.to_role, json.dumps(devices),
                 "planned", self._epoch or 0))

    def set_phase(self, transition_id: str, phase: str, reason: str | None = None, *, event: EventDraft | None = None) -> Transition:
        """Move a transition along the state machine (not to committed: that is commit_transition)."""
        # deps: none
        # AST: AST_PRECONDITION(phase != "committed", got=phase, msg="commit goes through commit_transition", exc=ResourceError)
        check.precondition(phase != "committed", "commit goes through commit_transition", got=phase, exc=ResourceError)  # generated #864d20b0be
        with self._write(event) as conn:
            current = self._transition(transition_id)
            # VAL: VAL_STATE_TRANSITION(current.phase, phase, allowed=PHASE_MOVES, exc=ResourceError)
            check.transition("current.phase", current.phase, phase, PHASE_MOVES, exc=ResourceError)  # generated #e7d9c1a179
            conn.execute("UPDATE transitions SET phase = ?, reason = COALESCE(?, reason), epoch = ? WHERE id = ?",
                         (phase, reason, self._epoch or 0, transition_id))
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
            conn.execute("UPDATE transitions SET phase = 'committed', epoch = ? WHERE id = ?",
                         (self._epoch or 0, transition_id))
        return Transition(current.id, current.kind, current.from_role, current.to_role, current.devices, "committed")

    def open_transition(self) -> Transition | None:
        """The transition in planned/prepared/committed, if any (at most one)."""
        # deps: none
        marks = ", ".join("?" * len(OPEN_PHASES))
        rows = self._read("transitions", f"WHERE phase IN ({marks}) ORDER BY seq LIMIT 1", OPEN_PHASES)
        return rows[0] if rows else None

    def transitions(self) -> list[Transition]:
        """All transitions, oldest first (the history of the ledger)."""
        # deps: none
        return self._read("transitions", "ORDER BY seq")

    def transition_reason(self, transition_id: str) -> str | None:
        """Why a transition was aborted (or how it was recovered), if recorded."""
        self._transition(transition_id)  # checks the row (its checksum covers the reason)
        return self._conn.execute("SELECT reason FROM transitions WHERE id = ?", (transition_id,)).fetchone()[0]

    # -- workers and services ----------------------------------------------------------------
    def put_worker(self, record: WorkerRecord, *, event: EventDraft | None = None) -> None:
        """Insert or replace a worker row (health reports are idempotent upserts)."""
        # deps: none
        # VAL: VAL_ONE_OF(record.health, choices=WORKER_HEALTH, exc=ResourceError)
        check.one_of("record.health", record.health, WORKER_HEALTH, exc=ResourceError)  # generated #f6ba681bf2
        with self._write(event) as conn:
            conn.execute("INSERT OR REPLACE INTO workers (id, owner, rank, hw, devices, health, restarts) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (record.id, record.owner, record.rank, record.hw, json.dumps(list(record.devices)),
                          record.health, record.restarts))

    def workers(self, owner: str | None = None) -> list[WorkerRecord]:
        """Worker rows, all or one owner's, by id."""
        # deps: none
        if owner is None:
            return self._read("workers", "ORDER BY owner, rank")
        return self._read("workers", "WHERE owner = ? ORDER BY rank", (owner,))

    def put_service(self, record: ServiceRecord, *, event: EventDraft | None = None) -> None:
        """Insert or replace a service row."""
        # deps: none
        # VAL: VAL_ONE_OF(record.health, choices=SERVICE_HEALTH, exc=ResourceError)
        check.one_of("record.health", record.health, SERVICE_HEALTH, exc=ResourceError)  # generated #4cdad7067c
        with self._write(event) as conn:
            conn.execute("INSERT OR REPLACE INTO services (name, url, owner, health, last_error) VALUES (?, ?, ?, ?, ?)",
                         (record.name, record.url, record.owner, record.health, record.last_error))

    def services(self) -> list[ServiceRecord]:
        """Registered services by name."""
        # deps: none
        return self._read("services", "ORDER BY name")

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
        return self._read("events", "WHERE seq > ? ORDER BY seq", (since,))

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
        """Close the connection and drop the controller lock (a crashed controller's lock the kernel drops)."""
        # deps: none
        self._conn.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None


for _name in ("schema_version", "acquire_controller", "devices", "init_devices", "claim", "release", "begin_transition",
              "set_phase", "commit_transition", "open_transition", "transitions", "transition_reason", "put_worker",
              "workers", "put_service", "services", "append_event", "events", "last_event_seq", "snapshot", "verify", "identity"):
    setattr(SqliteMetadataStore, _name, _sqlite_damage_is_store_damage(getattr(SqliteMetadataStore, _name)))


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring a database to the target schema version, one migration per transaction; returns the version."""
    # deps: MIGRATIONS
    # VAL: VAL_INT_RANGE(target, min=1, max=SCHEMA_VERSION, exc=ResourceError)
    check.int_range("target", target, min=1, max=SCHEMA_VERSION, exc=ResourceError)  # generated #fc658e50cc
    install_checksum_function(conn)  # the v4 triggers call it
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
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return max(current, target)
