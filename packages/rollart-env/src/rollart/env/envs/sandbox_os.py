"""The operating-system side of the sandbox: per-run uids, bubblewrap command lines, kill sweeps.

Why here and not in `sandbox.py`: these are the parts whose guarantees come from the kernel
(user ids, namespaces, signals), kept apart from the asyncio orchestration so each can be read
and tested on its own. Nothing here trusts the program under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import random
import shutil
import signal
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollart import checks as check
from rollart.env.errors import EnvError

RUN_UID_BASE = 612_000
RUN_UID_COUNT = 4096
SANDBOX_ROOT = "/sandbox"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SHARED_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
# Installed packages (and the task data they may ship) inside the visible system and interpreter
# directories; the sandboxed interpreter runs with -I -S and needs none of them.
_PACKAGE_DIR_GLOBS = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "local/lib/python3*/dist-packages")


@dataclass
class UidLease:
    """A user id held by one run for its whole life (an exclusive `flock` on a root-owned lock file).

    Why a lease per run: two runs under one uid can signal, ptrace and write each other; a uid of
    its own gives each run a private work directory and lets `kill(-1)` as that uid reach every
    process the run left behind (double-forked, `setsid`), and nothing else. The lock is released by
    the kernel if the holder dies, so a crashed worker never leaks uids.
    """

    uid: int
    _fd: int

    def release(self) -> None:
        """Unlock; call only after `kill_uid` left no process of this uid."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def lease_uid(lock_dir: str | None = None) -> UidLease:
    """Take a free uid from [RUN_UID_BASE, RUN_UID_BASE + RUN_UID_COUNT) (root only)."""
    # AST: AST_PRECONDITION(os.geteuid() == 0, got=os.geteuid(), msg="per-run uids need root", exc=EnvError)
    check.precondition(os.geteuid() == 0, "per-run uids need root", got_lazy=lambda: os.geteuid(), exc=EnvError)  # generated #3979b969fe
    directory = Path(lock_dir or os.path.join(tempfile.gettempdir(), "rollart-uid-leases"))
    directory.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if st.st_uid != 0 or st.st_mode & 0o077 or not os.path.isdir(directory) or os.path.islink(directory):
        raise EnvError(f"uid lock directory {directory} must be a root-owned 0700 directory")
    start = random.randrange(RUN_UID_COUNT)
    for i in range(RUN_UID_COUNT):
        uid = RUN_UID_BASE + (start + i) % RUN_UID_COUNT
        fd = os.open(directory / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if live_processes_of(uid):  # a leftover of a crashed worker: not free
            os.close(fd)
            continue
        return UidLease(uid=uid, _fd=fd)
    raise EnvError(f"all {RUN_UID_COUNT} sandbox uids are in use")


def live_processes_of(uid: int) -> list[int]:
    """Pids whose real uid is `uid` and that are not zombies (read from /proc)."""
    needle = f"\nUid:\t{uid}\t".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{entry}/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            status = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        if needle in status:
            state = status.split(b"\nState:\t", 1)[-1][:1]
            if state not in (b"Z", b"X"):
                pids.append(int(entry))
    return pids


async def kill_uid(uid: int, attempts: int = 20) -> bool:
    """SIGKILL every process of `uid` (`kill(-1)` run as that uid); True when none is left.

    `kill(-1)` from a process of uid U reaches exactly the processes U may signal, i.e. this run's,
    wherever they are (another session, another process group, a PID namespace of its own).
    Repeated because a process forking at the instant of the sweep can slip past one pass.
    """
    kill = shutil.which("kill", path="/usr/bin:/bin") or "/bin/kill"
    for _ in range(attempts):
        if not live_processes_of(uid):
            return True
        proc = await asyncio.create_subprocess_exec(
            kill, "-KILL", "-1", user=uid, group=uid, extra_groups=[],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        await proc.wait()
        await asyncio.sleep(0.01)
    return not live_processes_of(uid)


def bwrap_argv(
    bwrap: str, workdir: str, python: str, argv: list[str], env: dict[str, str], disk_bytes: int = 64 * 1024 * 1024
) -> list[str]:
    """The bubblewrap command line: new user/PID/net/IPC/UTS/cgroup namespaces, a read-only system,
    the run's own writable tmpfs at `/sandbox` (also its `/tmp`), no capabilities, no host environment.

    Only the system directories and the interpreter's prefix are visible: the repository, other
    runs' directories and the task data are not in the sandbox's file system at all, and every
    site-/dist-packages directory is an empty read-only tmpfs. Everything the run can write lives in
    one tmpfs of `disk_bytes` (`/sandbox`, with `/tmp` a link into it; `/dev` and bubblewrap's own
    root tmpfs are read-only, so neither `/dev/shm` nor `/var`, `/etc`, ... is a second, unbounded
    store): a run cannot fill the host disk, and its files are
    RAM that vanishes with it. The files of `workdir` (bootstrap, solution) are bound read-only into
    it. The interpreter's prefix is bound after `/tmp` exists, so an interpreter under `/tmp` stays
    visible.
    """
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    args += ["--size", str(disk_bytes), "--tmpfs", SANDBOX_ROOT, "--dir", f"{SANDBOX_ROOT}/.tmp"]
    args += ["--symlink", f"{SANDBOX_ROOT}/.tmp", "/tmp"]
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    if not any(prefix == d or prefix.startswith(d + "/") for d in _SYSTEM_DIRS):
        mount_at = prefix if not (prefix == "/tmp" or prefix.startswith("/tmp/")) else SANDBOX_ROOT + "/.tmp" + prefix[4:]
        args += ["--ro-bind", prefix, mount_at]
    for d in _package_dirs(prefix):  # hidden under an empty read-only tmpfs: no installed task data
        at = d if not d.startswith("/tmp/") else SANDBOX_ROOT + "/.tmp" + d[4:]
        args += ["--tmpfs", at, "--remount-ro", at]
    for name in sorted(os.listdir(workdir)):
        args += ["--ro-bind", os.path.join(workdir, name), f"{SANDBOX_ROOT}/{name}"]
    args += ["--remount-ro", "/"]  # bwrap's root is a tmpfs the run could otherwise fill past the quota
    args += ["--chdir", SANDBOX_ROOT, "--hostname", "sandbox", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return [*args, "--", python, *argv]


def _package_dirs(prefix: str) -> list[str]:
    """The site-/dist-packages directories visible in the sandbox (under /usr and the interpreter's prefix)."""
    found: set[str] = set()
    for base in ("/usr", prefix):
        for pattern in _PACKAGE_DIR_GLOBS:
            found.update(str(p) for p in Path(base).glob(pattern) if p.is_dir() and not p.is_symlink())
    return sorted(found)


def remove_files_of(uid: int, roots: tuple[str, ...] = SHARED_TMP_DIRS) -> list[str]:
    """Delete what `uid` left in the shared temporary directories; return the paths removed.

    Why by owner: a run's uid is leased to that run alone (`lease_uid`), so a file it owns was written
    by this run and nothing else, and another process's file is never touched. Only world-writable
    directories are searched below the roots (the only places that uid could create anything in a
    directory it does not own); symlinks are never followed. Call after `kill_uid`, so nothing of the
    run can write while the sweep runs.
    """
    # AST: AST_PRECONDITION(RUN_UID_BASE <= uid < RUN_UID_BASE + RUN_UID_COUNT, got=uid, msg="only a leased run uid's files are removed", exc=EnvError)
    check.precondition(RUN_UID_BASE <= uid < RUN_UID_BASE + RUN_UID_COUNT, "only a leased run uid's files are removed", got=uid, exc=EnvError)  # generated #4289b3ac79
    removed: list[str] = []
    pending = [r for r in roots if os.path.isdir(r) and not os.path.islink(r)]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == uid:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
                removed.append(entry.path)
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                pending.append(entry.path)
    return removed


def bwrap_returncode(rc: int | None) -> int | None:
    """bubblewrap reports a child killed by signal N as exit 128+N; map it back to -N like Popen."""
    if rc is not None and 128 < rc < 128 + signal.NSIG:
        return -(rc - 128)
    return rc
