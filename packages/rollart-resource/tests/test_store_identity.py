"""Step 30: the store knows its identity (issue 23 item 6): a store file is refused when it is not the one its
controller last committed, and a read-only store is refused naming the path.

Each test is one attack of the issue, on real SQLite files (and a real controller process killed with SIGKILL where
the attack needs a crash); each failed on the code before Step 30 (the store opened or wrote silently, or SQLite's
error named no file).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollart.resource.integrity import StoreDamaged, StoreNotWritable, install_checksum_function
from rollart.resource.manager import ResourceManager
from rollart.resource.store import SqliteMetadataStore, migrate

POOL = {"H20": range(0, 6)}


def roles(rm):
    return {d: (r.role, r.owner) for d, r in rm.devices().items()}


CONTROLLER = textwrap.dedent(
    """
    import asyncio, sys, time
    from rollart.resource.manager import ResourceManager
    rm = ResourceManager({"H20": range(0, 6)}, store=sys.argv[1])
    rm.allocate("gen", "rollout", 4)
    rm.close()  # the last connection checkpoints: the allocation is in the main file
    rm = ResourceManager(None, store=sys.argv[1])
    asyncio.run(rm.shrink("rollout", "train", [0, 1]))  # committed: in the -wal only
    print("shrunk", flush=True)
    time.sleep(120)
    """
)


def test_wal_deleted_under_a_live_controller_then_a_crash_is_refused_not_silently_lost(tmp_path):
    path = tmp_path / "meta.db"
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "shrunk"
        os.remove(f"{path}-wal")  # the attack: the committed shrink lives only in the deleted file
    finally:
        proc.send_signal(signal.SIGKILL)  # ... then the controller crashes
        proc.wait()
    # before: this opened the allocation without the shrink, devices 0 and 1 back in rollout, and no word of it
    with pytest.raises(StoreDamaged, match=r"it is at generation \d+, but the last controller committed generation "
                                           r"\d+ .*lacks the last 5 commits .*deleted or lost -wal file") as err:
        ResourceManager(POOL, store=path)
    assert f"delete {path}.lock" in str(err.value)


def test_wal_deleted_under_a_live_controller_refuses_the_next_write_and_keeps_the_commit(tmp_path):
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 4)
    assert asyncio.run(rm.shrink("rollout", "train", [0])).phase == "completed"
    committed = roles(rm)
    os.remove(f"{path}-wal")
    with pytest.raises(StoreDamaged, match=r"its -wal file .*meta.db-wal was deleted or replaced under the live "
                                           r"controller .*this write was refused"):
        rm.allocate("judge", "reward", 1)  # before: accepted, into a file no one would ever read again
    rm.close()  # SQLite checkpoints the open (deleted) -wal into the main file on close
    again = ResourceManager(None, store=path)
    assert roles(again) == committed  # the committed shrink is not lost
    again.close()


def identity_of(path: Path) -> tuple[str, int]:
    store = SqliteMetadataStore(path)
    try:
        return store.identity()
    finally:
        store.close()


def other_run(tmp_path: Path, name: str) -> Path:
    """Another run's store with the same pool (closed, so the whole of it is in the main file)."""
    path = tmp_path / name / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("other", "rollout", 2)
    rm.close()
    return path


@pytest.mark.parametrize("how", ["renamed over it", "rewritten in place"])
def test_store_replaced_under_a_live_controller_refuses_the_next_write(tmp_path, how):
    path = tmp_path / "run" / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 4)
    foreign = other_run(tmp_path, "other")
    if how == "renamed over it":
        shutil.copyfile(foreign, f"{path}.new")
        os.replace(f"{path}.new", path)
        problem = r"the file at this path is not the one this controller opened \(device/inode \d+/\d+, now \d+/\d+\)"
    else:
        with open(path, "r+b") as handle:  # same inode: the live connection would mix its cache and WAL with it
            handle.write(foreign.read_bytes())
        problem = r"its file was changed by another writer since this controller's last commit"
    with pytest.raises(StoreDamaged, match=problem):
        asyncio.run(rm.shrink("rollout", "train", [0]))  # before: the shrink "completed"
    with pytest.raises(StoreDamaged):
        rm.allocate("gen", "rollout", 1)  # and every write after it
    rm.close()


def test_an_older_copy_of_the_store_is_refused_at_open_naming_both_generations(tmp_path):
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 4)
    rm.close()
    backup = path.read_bytes()  # the operator's backup
    old_run, old_generation = identity_of(path)
    rm = ResourceManager(None, store=path)
    asyncio.run(rm.shrink("rollout", "train", [0, 1]))
    run_id, generation = rm.store.identity()
    rm.close()
    assert run_id == old_run and generation > old_generation
    path.write_bytes(backup)  # restored: an older copy of this run's store (its -wal was removed on close)
    assert not Path(f"{path}-wal").exists()
    with pytest.raises(StoreDamaged, match=rf"it is at generation {old_generation}, but the last controller committed "
                                           rf"generation {generation} .*lacks the last {generation - old_generation} "
                                           "commits"):
        ResourceManager(None, store=path)  # before: opened, the shrink forgotten
    with pytest.raises(StoreDamaged, match="older copy"):
        SqliteMetadataStore(path)  # a bare reader is told too
    with pytest.raises(StoreDamaged, match="older copy"):
        ResourceManager(POOL, store=path)  # and so is a controller given the pool again


def test_a_foreign_store_with_the_same_pool_is_refused_naming_both_run_ids(tmp_path):
    path = tmp_path / "run" / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 4)
    ours = rm.store.identity()[0]
    rm.close()
    foreign = other_run(tmp_path, "other")
    theirs = identity_of(foreign)[0]
    shutil.copyfile(foreign, path)
    with pytest.raises(StoreDamaged, match=rf"it is the store of run {theirs}, but the lock file .*meta.db.lock says "
                                           rf"this path holds run {ours}: another run's store"):
        ResourceManager(POOL, store=path)  # before: opened, with the other run's roles


def test_the_identity_survives_a_crash_between_commit_and_mirror(tmp_path):
    """A store ahead of its lock file is a controller killed after its commit: accepted, and the mirror catches up."""
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path)
    rm.allocate("gen", "rollout", 2)
    generation = rm.store.identity()[1]
    rm.close()
    conn = sqlite3.connect(path)  # as if the last commit landed and the process died before the mirror
    install_checksum_function(conn)
    conn.execute("UPDATE identity SET generation = generation + 1")
    conn.commit()
    conn.close()
    rm = ResourceManager(None, store=path)
    assert rm.store.identity()[1] == generation + 2  # +1 above, +1 for this controller's epoch
    rm.close()


READ_ONLY = textwrap.dedent(
    """
    import sys
    from rollart.resource.manager import ResourceManager
    try:
        ResourceManager({"H20": range(0, 2)}, store=sys.argv[1]).close()
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("opened")
    """
)


def run_unprivileged(path: Path) -> str:
    """Open the store in a process that file permissions apply to (root without its override capabilities)."""
    command = [sys.executable, "-c", READ_ONLY, str(path)]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions do not apply to this process")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout.strip()


@pytest.mark.parametrize("case", ["new store in a read-only directory", "store in a read-only directory",
                                  "read-only store file"])
def test_a_read_only_store_is_refused_naming_the_path(tmp_path, case):
    directory = tmp_path / "run"
    directory.mkdir()
    path = directory / "meta.db"
    if case != "new store in a read-only directory":
        ResourceManager(POOL, store=path).close()
    target = path if case == "read-only store file" else directory
    os.chmod(target, 0o444 if target == path else 0o555)
    try:
        out = run_unprivileged(path)
    finally:
        os.chmod(target, 0o644 if target == path else 0o755)
    # before: sqlite3.OperationalError "unable to open database file" / "attempt to write a readonly database"
    assert out.startswith(f"StoreNotWritable metadata store {path} cannot be written: "), out
    assert ("read-only for this process" in out) and str(target) in out
    assert StoreNotWritable.__name__ in out


def test_a_v4_store_and_its_old_lock_file_migrate_to_an_identity(tmp_path):
    """A store written before schema v5, with a lock file naming only its holder, opens and gets its identity."""
    path = tmp_path / "meta.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    migrate(conn, target=4)
    conn.execute("INSERT INTO devices (id, hw, role, owner) VALUES (0, 'H20', 'rollout', 'gen')")
    conn.close()
    Path(f"{path}.lock").write_text('{"holder": "a controller of the old code"}')
    rm = ResourceManager(None, store=path)
    run_id, generation = rm.store.identity()
    assert rm.store.schema_version() == 5 and len(run_id) == 32 and generation == 1  # the epoch write
    assert roles(rm) == {0: ("rollout", "gen")}
    rm.close()
    record = json.loads(Path(f"{path}.lock").read_text())
    assert record["run_id"] == run_id and record["generation"] == generation
    ResourceManager(None, store=path).close()
