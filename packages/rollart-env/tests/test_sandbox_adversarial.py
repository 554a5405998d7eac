"""Hostile programs against the sandbox (issue 12, items 2-4): the containment must come from the OS.

Each program here does what a policy optimising a reward could learn to do: remove the in-process
guard, leave a double-forked `setsid` child behind, hold the output pipes open, reach a listener on
the host's loopback, or rewrite another run's files. Every test runs in both containment modes
(bubblewrap and the process fallback) where the host offers them. Real processes, no mocks.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits
from rollart.env.envs.sandbox_os import RUN_UID_BASE, RUN_UID_COUNT, lease_uid, live_processes_of

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, memory_bytes=256 * 1024 * 1024, output_bytes=4096)
ROOT = os.geteuid() == 0

# Removes the audit-hook tripwire from inside the program (its lists are closure cells of the hook).
DISABLE_GUARD = """
import gc
for _o in gc.get_objects():
    if getattr(_o, "__name__", "") == "guard" and getattr(_o, "__closure__", None):
        for _c in _o.__closure__:
            if isinstance(_c.cell_contents, (tuple, frozenset)):
                _c.cell_contents = type(_c.cell_contents)()
"""

# A double-forked, setsid child that outlives its parent: it writes a heartbeat file and tries the
# host's loopback listener for 20 s. Its parent exits 0 at once.
ESCAPE = """
import os, socket, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0,):
            os.close(fd)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                with open({beat!r}, "a") as f:
                    f.write("x")
            except OSError:
                pass
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=0.2).close()
                print("CONNECTED", flush=True)
            except OSError:
                pass
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
print("parent done", flush=True)
"""


def _modes() -> list[str]:
    modes = ["process"]
    probe = PythonSandbox(LIMITS, mode="auto")
    if asyncio.run(probe.containment()) == "bwrap":
        modes.insert(0, "bwrap")
    return modes


MODES = _modes()


class Listener:
    """A TCP listener on the host's 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def shared_dir():
    """A world-writable host directory: where an escaped child would leave its heartbeat."""
    d = tempfile.mkdtemp(prefix="rollart-test-shared-")
    os.chmod(d, 0o777)
    yield Path(d)
    for f in Path(d).iterdir():
        f.unlink()
    os.rmdir(d)


def _sandbox(mode: str, guard: bool = False, limits: SandboxLimits = LIMITS) -> PythonSandbox:
    if mode == "process" and not ROOT:
        pytest.skip("the process fallback without root has no per-run uid (documented: not containment)")
    return PythonSandbox(limits, audit_guard=guard, mode=mode)


def _still_growing(path: Path, wait_s: float = 0.6) -> bool:
    before = path.stat().st_size if path.exists() else 0
    time.sleep(wait_s)
    after = path.stat().st_size if path.exists() else 0
    return after > before


@pytest.mark.parametrize("mode", MODES)
async def test_an_escaped_setsid_grandchild_dies_with_the_run(mode, listener, shared_dir):
    """Guard off: the double-forked setsid child must not outlive the run, write, or reach the host."""
    sandbox = _sandbox(mode)
    beat = shared_dir / "heartbeat"
    result = await sandbox.run(ESCAPE.format(beat=str(beat), port=listener.port))
    assert result.status == "ok" and "parent done" in result.stdout, result
    assert result.containment == mode
    assert not await asyncio.to_thread(_still_growing, beat), "an escaped child kept writing after the run"
    if result.run_uid is not None:
        assert live_processes_of(result.run_uid) == []
    assert listener.accepted == 0 and "CONNECTED" not in result.stdout


@pytest.mark.parametrize("mode", MODES)
async def test_the_program_can_remove_the_guard_and_is_still_contained(mode, listener, shared_dir):
    """Guard on: the program switches it off itself (one loop over gc), then escapes as above."""
    sandbox = _sandbox(mode, guard=True)
    probe = await sandbox.run(DISABLE_GUARD + "import socket\nprint('GUARD OFF', socket.socket)")
    assert "GUARD OFF" in probe.stdout, "the tripwire is expected to be removable: nothing may rely on it"
    beat = shared_dir / "heartbeat"
    result = await sandbox.run(DISABLE_GUARD + ESCAPE.format(beat=str(beat), port=listener.port))
    assert result.status == "ok", result
    assert not await asyncio.to_thread(_still_growing, beat)
    assert listener.accepted == 0 and "CONNECTED" not in result.stdout
    if result.run_uid is not None:
        assert live_processes_of(result.run_uid) == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_child_holding_the_pipes_neither_raises_nor_turns_success_into_timeout(mode):
    """The program exits 0 at once; its detached grandchild keeps stdout/stderr open and sleeps."""
    sandbox = _sandbox(mode)
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('exited', flush=True)\n"
    )
    result = await sandbox.run(code)
    assert (result.status, result.returncode) == ("ok", 0), result
    assert result.stdout == "exited\n"
    if result.run_uid is not None:
        assert live_processes_of(result.run_uid) == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_host_loopback_listener_is_unreachable(mode, listener):
    sandbox = _sandbox(mode)
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=1)\nprint('CONNECTED')"
    result = await sandbox.run(code)
    assert result.network_isolation == "netns"
    assert "CONNECTED" not in result.stdout and result.status == "error"
    await asyncio.sleep(0.3)
    assert listener.accepted == 0


TAMPER = """
import glob, os
hits = 0
mine = os.path.realpath(os.getcwd())
others = set(glob.glob("/tmp/rollart-sandbox-*") + glob.glob({tmp!r} + "/rollart-sandbox-*"))
for d in sorted(others):
    if os.path.realpath(d) == mine:
        continue
    for name in ("solution.py", "mine.txt"):
        try:
            with open(os.path.join(d, name), "w") as f:
                f.write("tampered")
            hits += 1
        except OSError:
            pass
print("HITS", hits)
"""

VICTIM = """
import pathlib, time
pathlib.Path("mine.txt").write_text("A")
time.sleep(1.5)
print(pathlib.Path("mine.txt").read_text(), pathlib.Path(__file__ if "__file__" in dir() else "solution.py").exists())
"""


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_runs_cannot_write_each_others_work_directory(mode):
    sandbox = _sandbox(mode)

    async def attacker():
        await asyncio.sleep(0.5)
        return await sandbox.run(TAMPER.format(tmp=tempfile.gettempdir()))

    victim, evil = await asyncio.gather(sandbox.run(VICTIM), attacker())
    assert victim.status == "ok" and victim.stdout.startswith("A "), victim
    assert "HITS 0" in evil.stdout, evil
    if victim.run_uid is not None:
        assert victim.run_uid != evil.run_uid


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
def test_uid_leases_are_exclusive_and_in_range():
    leases = [lease_uid() for _ in range(8)]
    try:
        uids = [lease.uid for lease in leases]
        assert len(set(uids)) == len(uids)
        assert all(RUN_UID_BASE <= uid < RUN_UID_BASE + RUN_UID_COUNT for uid in uids)
    finally:
        for lease in leases:
            lease.release()


async def test_auto_mode_reports_what_it_got_and_bwrap_mode_refuses_a_missing_binary():
    sandbox = PythonSandbox(LIMITS, mode="auto")
    result = await sandbox.run("print(1)")
    assert result.containment in ("bwrap", "process") and result.stdout == "1\n"
    missing = PythonSandbox(LIMITS, mode="bwrap", bwrap="rollart-no-such-bwrap")
    with pytest.raises(Exception, match="bubblewrap"):
        await missing.run("print(1)")


@pytest.mark.parametrize("mode", MODES)
async def test_a_fork_bomb_without_the_guard_is_bounded_and_leaves_nothing(mode):
    sandbox = _sandbox(mode, limits=SandboxLimits(cpu_s=1, wall_s=2.0, max_processes=16))
    result = await sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert result.status in ("timeout", "cpu_limit", "killed"), result
    if result.run_uid is not None:
        assert live_processes_of(result.run_uid) == []
    assert (await sandbox.run("print('host fine')")).stdout == "host fine\n"


async def test_a_bwrap_that_cannot_run_here_is_detected_at_run_time_and_auto_falls_back():
    """`false` stands in for a bubblewrap that exists but cannot create namespaces (e.g. no userns)."""
    sandbox = PythonSandbox(LIMITS, mode="auto", bwrap="false")
    result = await sandbox.run("print('fallback')")
    assert (result.containment, result.stdout) == ("process", "fallback\n")
    strict = PythonSandbox(LIMITS, mode="bwrap", bwrap="false")
    with pytest.raises(Exception, match="cannot run here"):
        await strict.run("print(1)")


def _sandbox_uid_processes() -> list[int]:
    """Live (non-zombie) processes whose real uid is any sandbox uid: one pass over /proc."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path("/proc", entry, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        uid = int(fields.get("Uid", "-1").split()[0])
        if RUN_UID_BASE <= uid < RUN_UID_BASE + RUN_UID_COUNT and not fields.get("State", "").startswith(("Z", "X")):
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
@pytest.mark.parametrize("mode", MODES)
async def test_cancelling_a_run_kills_it_and_its_escaped_children(mode, listener, shared_dir):
    """The EnvManager cancels a step (staleness, shutdown): nothing of that run may keep running."""
    sandbox = _sandbox(mode)
    await sandbox.containment()
    beat = shared_dir / "heartbeat"
    task = asyncio.create_task(sandbox.run(ESCAPE.format(beat=str(beat), port=listener.port) + "\nimport time\ntime.sleep(100)"))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await asyncio.to_thread(_still_growing, beat)
    assert _sandbox_uid_processes() == []
