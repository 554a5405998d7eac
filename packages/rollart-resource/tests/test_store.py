"""Step 3: the metadata store: migrations, restart, WAL, workers, services, events."""

from __future__ import annotations

import sqlite3

import pytest

from rollart.resource.errors import ResourceError
from rollart.resource.ledger import DeviceRecord, TransitionVetoed
from rollart.resource.manager import ResourceManager
from rollart.resource.store import (
    SCHEMA_VERSION,
    EventDraft,
    MetadataStore,
    SqliteMetadataStore,
    WorkerRecord,
    migrate,
)
from rollart.resource.testing import RecordingHook

POOL = {"H800": range(0, 2), "H20": range(2, 6)}


def test_migration_v1_to_v2_keeps_rows(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, target=1) == 1
    conn.execute("INSERT INTO devices VALUES (0, 'H800', 'train', 'trainer')")
    conn.execute("INSERT INTO events (kind, payload, at) VALUES ('old', '{}', 1.5)")
    conn.close()
    store = SqliteMetadataStore(path)
    assert store.schema_version() == SCHEMA_VERSION
    assert store.devices() == {0: DeviceRecord(0, "H800", "train", "trainer")}
    assert [e.kind for e in store.events()] == ["old"]
    store.put_worker(WorkerRecord("trainer/0", "trainer", 0, "H800", (0,), "alive", 0))
    assert store.workers("trainer")[0].devices == (0,)
    store.close()
    # a store from the future is refused with a clear message
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ResourceError, match="schema version 99 is newer"):
        SqliteMetadataStore(path)
    with pytest.raises(ResourceError, match="target must be an integer in"):
        migrate(sqlite3.connect(":memory:"), target=SCHEMA_VERSION + 1)


def test_wal_mode(tmp_path):
    store = SqliteMetadataStore(tmp_path / "m.db")
    assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert isinstance(store, MetadataStore)
    # a second connection (another reader) sees committed rows while the first stays open
    store.init_devices([DeviceRecord(0, "H20", "free", None)])
    other = SqliteMetadataStore(tmp_path / "m.db")
    assert other.devices() == store.devices()
    with pytest.raises(ResourceError, match="the store has no devices yet"):
        other.init_devices([DeviceRecord(1, "H20", "free", None)])
    with pytest.raises(ResourceError, match="busy_timeout"):
        SqliteMetadataStore(tmp_path / "m.db", busy_timeout=0)


async def test_restart_restores_exact_state(tmp_path):
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("trainer", "train", 2, hw="H800")
    rm.allocate("gen", "rollout", 3, hw="H20")
    rm.add_transition_hook(RecordingHook())
    await rm.shrink("rollout", "train", [2])
    with pytest.raises(TransitionVetoed, match="no"):
        rm.add_transition_hook(RecordingHook(veto="no"))
        await rm.shrink("rollout", "train", [3])
    rm.report_worker(WorkerRecord("gen/0", "gen", 0, "H20", (2,), "alive", 0))
    rm.report_worker(WorkerRecord("gen/1", "gen", 1, "H20", (3,), "dead", 1))
    rm.register_service("judge", "http://127.0.0.1:9/reward", "rewarder")
    rm.report_service_health("judge", False, "connection refused")
    before = rm.store.snapshot()
    rm.close()
    reopened = ResourceManager(None, store=path)
    assert reopened.store.snapshot() == before
    reopened.close()  # one controller per store (Step 14): the next one opens after this one closed
    assert ResourceManager(POOL, store=path).store.snapshot() == before
    assert before.services[0].health == "unhealthy" and before.services[0].last_error == "connection refused"
    assert [w.health for w in before.workers] == ["alive", "dead"]
    assert [t.phase for t in before.transitions] == ["completed", "aborted"]


def test_events_delivered_to_subscribers():
    rm = ResourceManager(POOL)
    seen, also = [], []
    unsubscribe = rm.subscribe(seen.append)

    def broken(event):
        raise RuntimeError("subscriber bug")

    rm.subscribe(broken)
    rm.subscribe(also.append)
    rm.allocate("gen", "rollout", 2)
    rm.report_worker(WorkerRecord("gen/0", "gen", 0, "H800", (0,), "removed", 1))
    unsubscribe()
    rm.release("gen")
    assert [e.kind for e in seen] == ["allocated", "worker_removed"]
    assert [e.kind for e in also] == ["allocated", "worker_removed", "released"]
    assert seen[1].payload["devices"] == [0] and seen[1].payload["restarts"] == 1
    assert [e.seq for e in rm.store.events()] == sorted(e.seq for e in rm.store.events())
    assert [e.kind for e in rm.store.events(since=seen[0].seq)] == ["worker_removed", "released"]


def test_service_and_worker_validation_store_unchanged():
    rm = ResourceManager(POOL)
    rm.register_service("judge", "https://example.invalid/fn", "r")
    snap = rm.store.snapshot()
    with pytest.raises(ResourceError, match="url is http"):
        rm.register_service("x", "fc://xxx", "r")
    with pytest.raises(ResourceError, match="name must not be empty"):
        rm.register_service("", "http://a", "r")
    with pytest.raises(ResourceError, match=r"name must be one of \['judge'\], got 'nope'"):
        rm.report_service_health("nope", True)
    with pytest.raises(ResourceError, match="record.health must be one of"):
        rm.report_worker(WorkerRecord("a/0", "a", 0, "H20", (2,), "zombie", 0))
    with pytest.raises(ResourceError, match="kind must not be empty"):
        rm.record_event("", {})
    assert rm.store.snapshot() == snap
    assert rm.report_service_health("judge", True).health == "healthy"


def test_event_commits_with_its_change():
    store = SqliteMetadataStore()
    store.init_devices([DeviceRecord(0, "H20", "free", None), DeviceRecord(1, "H20", "free", None)],
                       event=EventDraft("pool_created", {"n": 2}, 0.0))
    # a bad event fails the whole transaction: the change is rolled back with it
    with pytest.raises(ResourceError, match="event.kind must not be empty"):
        store.claim("gen", "rollout", [0], event=EventDraft("", {}, 1.0))
    assert store.devices()[0].role == "free"
    store.claim("gen", "rollout", [0, 1], event=EventDraft("allocated", {"owner": "gen"}, 2.0))
    assert store.release("nobody", event=EventDraft("released", {"owner": "nobody"}, 3.0)) == ()
    assert store.release("gen", [1], event=EventDraft("released", {"owner": "gen"}, 4.0)) == (1,)
    events = store.events()
    assert [(e.kind, e.at) for e in events] == [("pool_created", 0.0), ("allocated", 2.0), ("released", 4.0)]
    assert events[-1].payload == {"owner": "gen", "devices": [1]}  # release names what it freed
    assert store.last_event_seq() == events[-1].seq
