"""Step 14: one controller per store: the lock names its holder, and a stale controller's writes are fenced off."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rollart.resource.errors import ResourceError
from rollart.resource.lease import ControllerLock, ControllerLockHeld, StaleController
from rollart.resource.manager import ResourceManager
from rollart.resource.store import SqliteMetadataStore
from rollart.resource.testing import RecordingHook

POOL = {"H20": range(0, 6)}

HOLDER = textwrap.dedent(
    """
    import sys, time
    from rollart.resource.manager import ResourceManager
    rm = ResourceManager(None, store=sys.argv[1], holder="the-other-controller")
    print("held", flush=True)
    time.sleep(120)
    """
)


def roles(rm):
    return {d: (r.role, r.owner) for d, r in rm.devices().items()}


def test_second_controller_process_is_refused_until_the_holder_dies(tmp_path):
    path = tmp_path / "meta.db"
    ResourceManager(POOL, store=path).close()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(ControllerLockHeld, match=r"is held by another controller: the-other-controller") as err:
            ResourceManager(None, store=path)
        assert str(path) in str(err.value) and "stop that controller" in str(err.value)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # the kernel dropped the dead holder's lock: no stale lock to clear by hand
    rm = ResourceManager(None, store=path, holder="me")
    assert rm.store._epoch == 3  # three controllers acquired this store: the first, the other process, this one
    rm.close()


def test_second_manager_in_one_process_is_refused(tmp_path):
    path = tmp_path / "meta.db"
    first = ResourceManager(POOL, store=path, holder="first")
    with pytest.raises(ControllerLockHeld, match="held by another controller: first"):
        ResourceManager(POOL, store=path)
    assert ControllerLock(path).holder() == "first"
    first.close()
    second = ResourceManager(POOL, store=path, holder="second")
    assert ControllerLock(path).holder() == "second"
    second.close()


def test_stale_controller_writes_are_refused(tmp_path):
    path = tmp_path / "meta.db"
    old = ResourceManager(POOL, store=path, holder="old")
    old.allocate("gen", "rollout", 4)
    os.remove(f"{path}.lock")  # the lock is lost (deleted by hand, or a file system where flock is not shared)
    new = ResourceManager(None, store=path, holder="new")
    snap = new.store.snapshot()
    with pytest.raises(StaleController, match=r"this controller \(epoch 1\) is stale: new took the store over at epoch 2"):
        old.allocate("gen", "rollout", 1)
    with pytest.raises(StaleController):
        asyncio.run(old.shrink("rollout", "train", [0]))
    with pytest.raises(StaleController):
        old.release("gen")
    assert new.store.snapshot() == snap  # the stale controller changed nothing
    assert asyncio.run(new.shrink("rollout", "train", [0])).phase == "completed"
    old.close()
    new.close()


async def test_controller_fenced_in_the_middle_of_a_transition(tmp_path):
    path = tmp_path / "meta.db"
    old = ResourceManager(POOL, store=path, holder="old")
    old.allocate("gen", "rollout", 4)
    before = roles(old)
    taken: list[ResourceManager] = []

    class TakeoverDuringPrepare(RecordingHook):
        async def prepare(self, transition):
            await super().prepare(transition)
            os.remove(f"{path}.lock")
            taken.append(ResourceManager(None, store=path, holder="new"))

    old_hook = TakeoverDuringPrepare()
    old.add_transition_hook(old_hook)
    with pytest.raises(StaleController, match="stale"):
        await old.shrink("rollout", "train", [1])
    new = taken[0]
    pending = new.pending_transition()
    assert pending is not None and pending.phase == "planned"  # the stale "prepared" write was refused
    new_hook = RecordingHook()
    new.add_transition_hook(new_hook)
    result = await new.recover()
    assert result.phase == "aborted" and roles(new) == before and new_hook.methods() == ["abort"]
    epochs = dict(new.store._conn.execute("SELECT id, epoch FROM transitions").fetchall())
    assert epochs[pending.id] == 2  # the last phase was written by the new controller
    old.close()
    new.close()


def test_bare_store_handle_cannot_write_a_controlled_store(tmp_path):
    path = tmp_path / "meta.db"
    rm = ResourceManager(POOL, store=path, holder="ctl")
    reader = SqliteMetadataStore(path)
    assert reader.devices() == rm.devices()  # reading is fine
    with pytest.raises(StaleController, match="this handle is not its controller"):
        reader.claim("x", "rollout", [0])
    with pytest.raises(ResourceError, match="holder must not be empty"):
        reader.acquire_controller("")
    reader.close()
    rm.close()
