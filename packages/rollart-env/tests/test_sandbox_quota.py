"""Disk and tmpfs quotas per run, and an interpreter under /tmp (issue 23, item C). Real bubblewrap.

Before: a run wrote hundreds of MiB to the host disk through its work directory within its 5 s
(only single files were capped), and as much as RAM allowed into its private /tmp; an interpreter
living under /tmp vanished under the private /tmp, so `auto` fell back to the process mode. Now all a
run can write is one tmpfs of `SandboxLimits.disk_bytes`, and the interpreter's directory is mounted
wherever it lives.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time

import pytest

from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits

MIB = 1024 * 1024
QUOTA = 16 * MIB
LIMITS = SandboxLimits(cpu_s=4, wall_s=10.0, file_bytes=512 * MIB, disk_bytes=QUOTA)

# Writes 1 MiB chunks into `where` until 160 MiB or an error, reports how far it got, then holds on
# so the host's free space can be watched while the files exist.
FILLER = """
import os, time
where, total = {where!r}, 0
chunk = b"x" * (1024 * 1024)
try:
    with open(os.path.join(where, "fill.bin"), "wb") as f:
        while total < 160 * 1024 * 1024:
            f.write(chunk)
            f.flush()
            total += len(chunk)
        os.fsync(f.fileno())
except OSError as exc:
    print("STOPPED", type(exc).__name__, exc.strerror, flush=True)
print("WROTE", total, flush=True)
time.sleep(1.5)
"""


async def _bwrap_sandbox(limits: SandboxLimits = LIMITS, python: str | None = None) -> PythonSandbox:
    sandbox = PythonSandbox(limits, mode="bwrap", python=python)
    try:
        await sandbox.containment()
    except Exception as exc:  # noqa: BLE001 - no bubblewrap here: nothing to test
        if python is None:
            pytest.skip(f"bubblewrap cannot run here: {exc}")
        raise
    return sandbox


def _free_bytes() -> int:
    st = os.statvfs(tempfile.gettempdir())
    return st.f_bavail * st.f_frsize


async def _run_watching_the_disk(sandbox: PythonSandbox, code: str):
    """Run `code`; return the result and the largest drop of the host's free space seen meanwhile."""
    before = await asyncio.to_thread(_free_bytes)
    task = asyncio.create_task(sandbox.run(code))
    lowest = before
    while not task.done():
        lowest = min(lowest, await asyncio.to_thread(_free_bytes))
        await asyncio.sleep(0.05)
    return await task, before - lowest


def _written(stdout: str) -> int:
    return int(stdout.split("WROTE", 1)[1].split()[0])


@pytest.mark.parametrize("where", ["/sandbox", "/tmp", "."])
async def test_writing_past_the_quota_fails_clearly_and_the_host_disk_does_not_grow(where):
    sandbox = await _bwrap_sandbox()
    result, drop = await _run_watching_the_disk(sandbox, FILLER.format(where=where))
    assert "STOPPED OSError No space left on device" in result.stdout, result
    assert _written(result.stdout) <= QUOTA
    assert drop < 64 * MIB, f"the host disk lost {drop / MIB:.0f} MiB during the run"


async def test_a_quota_exceeded_run_reports_disk_limit():
    sandbox = await _bwrap_sandbox()
    result = await sandbox.run("open('/tmp/x', 'wb').write(b'x' * (32 * 1024 * 1024))")
    assert result.status == "disk_limit" and "No space left on device" in result.stderr, result


async def test_dev_shm_is_not_a_second_unbounded_store():
    sandbox = await _bwrap_sandbox()
    result = await sandbox.run(FILLER.format(where="/dev/shm"))
    assert "STOPPED" in result.stdout and _written(result.stdout) == 0, result


async def test_nothing_outside_the_quota_is_writable():
    """bubblewrap's root is a tmpfs of its own: writable, it was a store of unbounded size (RAM)."""
    sandbox = await _bwrap_sandbox()
    code = (
        "import os\n"
        "for p in ('/x', '/var/x', '/run/x', '/etc/x', '/root/x', '/home/x', '/dev/x', '/dev/shm/x', '/usr/x'):\n"
        "    try:\n"
        "        os.makedirs(os.path.dirname(p), exist_ok=True)\n"
        "        open(p, 'w').write('a')\n"
        "        print('WROTE', p)\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"  # the /tmp link is in the read-only root (what it points to is the run's own, in the quota)
        "    os.rename('/tmp', '/tmp-moved')\n"
        "    print('MOVED /tmp')\n"
        "except OSError:\n"
        "    pass\n"
        "open('/tmp/ok', 'w').write('a')\n"
        "open('/dev/null', 'w').write('a')\n"
        "print('DONE')\n"
    )
    result = await sandbox.run(code)
    assert result.stdout == "DONE\n", result


@pytest.fixture
def interpreter_under_tmp():
    """A Python whose whole prefix lives under /tmp (hard links of the system's, so nothing is copied)."""
    if not (os.path.exists("/usr/bin/python3.11") and os.path.isdir("/usr/lib/python3.11")):
        pytest.skip("needs the system's /usr/bin/python3.11")
    root = tempfile.mkdtemp(prefix="rollart-interp-", dir="/tmp")
    os.chmod(root, 0o755)
    try:
        os.makedirs(os.path.join(root, "bin"))
        os.link("/usr/bin/python3.11", os.path.join(root, "bin", "python3.11"))
        shutil.copytree("/usr/lib/python3.11", os.path.join(root, "lib", "python3.11"), copy_function=os.link,
                        symlinks=True, ignore=shutil.ignore_patterns("site-packages", "dist-packages", "test"))  # fmt: skip
    except OSError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"cannot hard-link the system interpreter here: {exc}")
    yield os.path.join(root, "bin", "python3.11")
    shutil.rmtree(root, ignore_errors=True)


async def test_an_interpreter_under_tmp_still_runs_under_bubblewrap(interpreter_under_tmp):
    if await PythonSandbox(LIMITS).containment() != "bwrap":
        pytest.skip("bubblewrap cannot run here")
    started = time.monotonic()
    sandbox = await _bwrap_sandbox(python=interpreter_under_tmp)
    result = await sandbox.run("import sys\nprint(sys.executable, sys.version_info[:2])")
    assert (result.status, result.containment) == ("ok", "bwrap"), result
    assert result.stdout.startswith(interpreter_under_tmp), result
    assert time.monotonic() - started < 30
