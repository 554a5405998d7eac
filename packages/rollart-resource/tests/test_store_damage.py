"""Step 15: the store does not trust what it reads: byte flips, truncation, an empty or foreign file, a damaged WAL.

Every damaged main file must be refused with StoreDamaged (naming the file and what to do) or read back exactly
as it was written (a flip in unused space); never opened as a silently different ledger, never a raw sqlite3 error.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.resource.errors import ResourceError, UnknownHardwareError
from rollart.resource.hardware import HardwareCatalogue, HardwareSpec
from rollart.resource.integrity import StoreDamaged, row_checksum
from rollart.resource.manager import ResourceManager
from rollart.resource.store import SqliteMetadataStore, WorkerRecord
from rollart.resource.testing import RecordingHook

POOL = {"H800": range(0, 2), "H20": range(2, 8)}


def build_store(path: Path) -> object:
    """A store with every table in use; returns its snapshot. Closing checkpoints the WAL into the main file."""
    rm = ResourceManager(POOL, store=path)
    rm.allocate("trainer", "train", 2, hw="H800")
    rm.allocate("gen", "rollout", 5, hw="H20")
    rm.add_transition_hook(RecordingHook())
    asyncio.run(rm.shrink("rollout", "train", [2, 3]))
    rm.report_worker(WorkerRecord("gen/0", "gen", 0, "H20", (4,), "alive", 0))
    rm.register_service("judge", "http://127.0.0.1:9/reward", "rewarder")
    snap = rm.store.snapshot()
    rm.close()
    return snap


class Pristine(tuple):
    def __repr__(self):
        return "<pristine store>"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "meta.db"
    snap = build_store(path)
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return Pristine((path, snap, path.read_bytes()))


def open_outcome(path: Path, original) -> str:
    """'refused' (StoreDamaged naming the file), 'same' (read back identical) or raises (a silent change)."""
    try:
        rm = ResourceManager(None, store=path)
    except StoreDamaged as exc:
        assert str(path) in str(exc) and "restore" in str(exc)
        return "refused"
    except ResourceError as exc:  # e.g. a flipped schema version "from the future": still names the file
        assert str(path) in str(exc)
        return "refused"
    try:
        snap = rm.store.snapshot()
    finally:
        rm.close()
    assert snap == original, "a damaged store was read back as a different state"
    return "same"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_byte_flips_are_refused_or_harmless(pristine, tmp_path_factory, data):
    path, original, raw = pristine
    offset = data.draw(st.integers(0, len(raw) - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="xor mask")
    damaged = tmp_path_factory.mktemp("flip") / "meta.db"
    damaged.write_bytes(raw[:offset] + bytes([raw[offset] ^ mask]) + raw[offset + 1:])
    open_outcome(damaged, original)


@pytest.mark.parametrize("old, new", [(b"rollout", b"pollout"), (b"trainer", b"drainer"), (b"H800", b"J800")])
def test_the_flips_sqlite_calls_ok_are_caught_by_row_checksums(pristine, tmp_path, old, new):
    path, original, raw = pristine
    assert old in raw
    damaged = tmp_path / "meta.db"
    damaged.write_bytes(raw.replace(old, new, 1))
    conn = sqlite3.connect(damaged)
    assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"  # SQLite's own check sees nothing wrong
    conn.close()
    with pytest.raises(StoreDamaged, match=r"damaged: table \w+, row .*checksums to"):
        ResourceManager(None, store=damaged)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_files_are_refused(pristine, tmp_path_factory, data):
    path, original, raw = pristine
    size = data.draw(st.integers(1, len(raw) - 1), label="truncated size")
    damaged = tmp_path_factory.mktemp("trunc") / "meta.db"
    damaged.write_bytes(raw[:size])
    assert open_outcome(damaged, original) == "refused"


def test_empty_and_foreign_files_are_refused(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for pool in (POOL, None):  # with a pool the old code made a brand-new all-free pool: every role lost
        with pytest.raises(StoreDamaged, match=r"empty.db is damaged: the file exists but is empty \(0 bytes\)"):
            ResourceManager(pool, store=empty)
    assert empty.stat().st_size == 0  # refused before SQLite touched it
    text = tmp_path / "notes.db"
    text.write_text("not a database at all")
    with pytest.raises(StoreDamaged, match="not an SQLite database"):
        SqliteMetadataStore(text)
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()
    with pytest.raises(StoreDamaged, match="not a rollart store"):
        ResourceManager(POOL, store=foreign)


def test_writers_without_the_checksum_function_cannot_write(pristine, tmp_path):
    path, original, raw = pristine
    copy = tmp_path / "meta.db"
    copy.write_bytes(raw)
    conn = sqlite3.connect(copy)
    with pytest.raises(sqlite3.OperationalError, match="no such function: rollart_crc"):
        conn.execute("UPDATE devices SET role = 'train' WHERE id = 4")
    conn.close()
    rm = ResourceManager(None, store=copy)
    assert rm.store.snapshot() == original
    rm.close()
    assert row_checksum("devices", 4, "H20", "rollout", "gen") != row_checksum("devices", 4, "H20", "pollout", "gen")


def test_unknown_hardware_in_the_store_names_the_file(tmp_path):
    catalogue = HardwareCatalogue([HardwareSpec("B300", 2000.0, 288.0, 8.0, 1800.0, 3.0)])
    path = tmp_path / "meta.db"
    ResourceManager({"B300": range(0, 2)}, store=path, catalogue=catalogue).close()
    with pytest.raises(UnknownHardwareError, match=r"meta.db.*not allowed: \['B300'\].*register a user-defined type"):
        ResourceManager(None, store=path)
    ResourceManager(None, store=path, catalogue=catalogue).close()


WRITER = textwrap.dedent(
    """
    import asyncio, os, sys
    from rollart.resource.manager import ResourceManager
    rm = ResourceManager(None, store=sys.argv[1])
    for _ in range(3):
        asyncio.run(rm.shrink("rollout", "train", [5]))
        asyncio.run(rm.expand("train", "rollout", [5]))
    asyncio.run(rm.shrink("rollout", "train", [6]))
    os._exit(0)  # no close, no checkpoint: the last transactions live only in the WAL
    """
)


def test_damaged_wal_is_refused_then_the_consistent_prefix_opens_on_request(pristine, tmp_path):
    path, original, raw = pristine
    copy = tmp_path / "meta.db"
    copy.write_bytes(raw)
    subprocess.run([sys.executable, "-c", WRITER, str(copy)], check=True, timeout=120)
    wal = Path(f"{copy}-wal")
    assert wal.stat().st_size > 0
    frames = bytearray(wal.read_bytes())
    frames[len(frames) // 2] ^= 0xFF  # a damaged frame in the middle of the WAL
    wal.write_bytes(bytes(frames))
    # SQLite keeps the frames before the damaged one; the lock file says the controller committed more (D31)
    with pytest.raises(StoreDamaged, match=r"it is at generation \d+, but the last controller committed generation "
                                           r"\d+ .*older copy that lacks the last \d+ commits"):
        ResourceManager(None, store=copy)
    Path(f"{copy}.lock").unlink()  # the operator accepts the loss, as the message says
    rm = ResourceManager(None, store=copy)  # opens: the consistent prefix
    ledger = {d: (r.role, r.owner) for d, r in rm.devices().items()}
    # an earlier consistent state: the pristine one, or one of the shrink/expand steps after it
    assert {d: v for d, v in ledger.items() if d not in (5, 6)} == {
        r.id: (r.role, r.owner) for r in original.devices if r.id not in (5, 6)}
    assert ledger[5][0] in ("rollout", "train") and ledger[6][0] in ("rollout", "train")
    asyncio.run(rm.recover())
    assert rm.pending_transition() is None
    assert len(rm.store.transitions()) < len(original.transitions) + 7  # the tail after the damage is lost
    rm.close()
