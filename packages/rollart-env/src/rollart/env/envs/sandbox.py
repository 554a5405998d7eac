"""Run untrusted Python in a contained subprocess: the containment comes from the OS, not from trust.

Two containment modes (design D7, threat model in design/rollart-env.md and docs/security.md):

* `bwrap` (preferred; Debian package `bubblewrap`): the run gets new user, PID, network, IPC, UTS
  and cgroup namespaces, sees only the read-only system directories and one tmpfs of
  `disk_bytes` for all it writes (its work directory and `/tmp`, design D27), and holds no capability. Every descendant dies with the namespace's init when
  the run ends (double-forked `setsid` children included); only a downed-by-default loopback exists.
* `process` (fallback when bubblewrap is missing or cannot create namespaces): a plain child in a
  new session, with a network namespace when the kernel allows (root), rlimits, and, as root, a
  uid of its own per run (see `sandbox_os.UidLease`): a 0700 work directory no other run can
  write and a `kill(-1)` sweep as that uid that reaches every process the run left behind.

In both modes, when started as root each run executes under a uid leased for that run only, with
rlimits on CPU, memory, file size, open files and processes. The in-process audit hook is a
tripwire that makes common escapes fail loudly; the program can remove it, so nothing relies on it.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollart import checks as check
from rollart.env.envs.sandbox_os import (
    SANDBOX_ROOT,
    UidLease,
    bwrap_argv,
    bwrap_returncode,
    kill_uid,
    lease_uid,
    remove_files_of,
)
from rollart.env.errors import EnvError

log = logging.getLogger(__name__)
SANDBOX_STATUSES = frozenset(
    {"ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit", "disk_limit", "blocked", "killed"}
)
SANDBOX_MODES = ("auto", "bwrap", "process")
NOBODY = 65534
_CLONE_NEWNET = 0x40000000
_READ_CHUNK = 65536

_BOOTSTRAP = r'''
import sys
def _rollart_install_guard(prefixes, imports):
    # a tripwire, not a wall: the program can remove it (it runs in the same interpreter)
    def guard(event, args):
        if event.startswith(prefixes) or (event == "import" and args and args[0] in imports):
            raise PermissionError("sandbox: " + event + " is not allowed")
    sys.addaudithook(guard)
with open(sys.argv[1]) as _f:
    _code = compile(_f.read(), "solution.py", "exec")
sys.argv = sys.argv[1:]
if %s:
    _rollart_install_guard(
        ("socket.", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
         "subprocess.", "ctypes.", "os.kill", "os.killpg", "pty."),
        frozenset({"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing", "_socket", "socket"}),
    )
del _f, _rollart_install_guard
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    cpu_s: int = 2
    wall_s: float = 5.0
    memory_bytes: int = 256 * 1024 * 1024
    output_bytes: int = 64 * 1024
    file_bytes: int = 1024 * 1024
    disk_bytes: int = 64 * 1024 * 1024  # all a bwrap run writes (work dir, /tmp): one tmpfs, i.e. RAM
    max_processes: int = 64
    open_files: int = 64

    def __post_init__(self) -> None:
        # VAL: VAL_INT_RANGE(self.cpu_s, min=1, max=3600, exc=EnvError)
        check.int_range("cpu_s", self.cpu_s, min=1, max=3600, exc=EnvError)  # generated #a13af700b3
        # VAL: VAL_TIMEOUT(self.wall_s, exc=EnvError)
        check.timeout("wall_s", self.wall_s, exc=EnvError)  # generated #eb4a87b96c
        # VAL: VAL_INT_RANGE(self.memory_bytes, min=32 * 1024 * 1024, max=2**40, exc=EnvError)
        check.int_range("memory_bytes", self.memory_bytes, min=32 * 1024 * 1024, max=2**40, exc=EnvError)  # generated #445ff7b598
        # VAL: VAL_INT_RANGE(self.output_bytes, min=1, max=2**30, exc=EnvError)
        check.int_range("output_bytes", self.output_bytes, min=1, max=2**30, exc=EnvError)  # generated #a32bafeee0
        # VAL: VAL_INT_RANGE(self.disk_bytes, min=1024 * 1024, max=2**40, exc=EnvError)
        check.int_range("disk_bytes", self.disk_bytes, min=1024 * 1024, max=2**40, exc=EnvError)  # generated #43d756dc61
        pass


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended, with its (truncated) output and the containment it ran under."""

    status: str  # one of SANDBOX_STATUSES
    returncode: int | None
    stdout: str
    stderr: str
    network_isolation: str  # "netns" or "audit-hook"
    containment: str = "process"  # "bwrap" or "process"
    run_uid: int | None = None  # the uid leased for this run (root only), else None


def _reachable_by_others(path: str) -> bool:
    p = Path(path).resolve()
    for parent in p.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    mode = p.stat().st_mode
    return bool(mode & stat.S_IXOTH and mode & stat.S_IROTH)


def _child_setup(limits: SandboxLimits, new_netns: bool, drop_to: int | None) -> None:
    """Runs in the forked child before exec (must not touch asyncio or locks)."""
    if new_netns:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if drop_to is not None:
        os.setgroups([])
        os.setgid(drop_to)
        os.setuid(drop_to)


class PythonSandbox:
    """Runs code strings under `SandboxLimits` in the strongest containment this host offers."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        python: str | None = None,
        audit_guard: bool = True,
        mode: str = "auto",
        bwrap: str = "bwrap",
    ) -> None:
        """Pick the containment mode, the interpreter (one a per-run uid can execute) and the bwrap binary.

        `mode`: 'auto' (bubblewrap when it works here, else the process fallback), 'bwrap' (refuse
        to run without it) or 'process'. `audit_guard=False` removes the in-process tripwire (tests
        use it to show that the OS layers alone hold).
        """
        # VAL: VAL_ONE_OF(mode, choices=SANDBOX_MODES, exc=EnvError)
        check.one_of("mode", mode, SANDBOX_MODES, exc=EnvError)  # generated #3a5cb203e4
        self.limits = limits or SandboxLimits()
        self.audit_guard = audit_guard
        self.mode = mode
        self._per_run_uid = os.geteuid() == 0
        self._bwrap = shutil.which(bwrap, path="/usr/bin:/bin:/usr/local/bin") if bwrap else None
        self.python = python or self._pick_interpreter()
        self._netns: bool | None = None
        self._containment: str | None = None

    def _pick_interpreter(self) -> str:
        if not self._per_run_uid or _reachable_by_others(sys.executable):
            return sys.executable
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
            if os.path.exists(candidate) and _reachable_by_others(candidate):
                return candidate
        log.warning("no interpreter a sandbox uid can execute: runs keep the parent's uid (weaker, see design D7)")
        self._per_run_uid = False
        return sys.executable

    async def containment(self) -> str:
        """'bwrap' when bubblewrap can build its namespaces on this host, else 'process' (probed once).

        Why probe at run time: bubblewrap needs user namespaces, which a container or a kernel
        setting may forbid; the fallback is logged so a deployment sees what it actually got.
        """
        # deps: PythonSandbox._execute
        if self._containment is None:
            works = False
            if self.mode != "process" and self._bwrap is not None:
                probe = await self._execute("pass", "bwrap", "netns")
                works = probe.status == "ok"
                if not works:
                    log.warning("bubblewrap cannot run here (%s): %s", probe.status, probe.stderr.strip()[-300:])
            if not works and self.mode == "bwrap":
                raise EnvError(f"mode='bwrap' but bubblewrap ({self._bwrap or 'not installed'}) cannot run here")
            if not works and self.mode == "auto":
                log.warning("sandbox falls back to the process mode (no PID namespace, no private file system)")
            self._containment = "bwrap" if works else "process"
        return self._containment

    async def network_isolation(self) -> str:
        """'netns' when the run gets its own network namespace (always under bwrap), else 'audit-hook'."""
        if await self.containment() == "bwrap":
            return "netns"
        if self._netns is None:
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.python, "-I", "-S", "-c", "pass",
                    preexec_fn=lambda: _child_setup(self.limits, True, None),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                self._netns = (await asyncio.wait_for(proc.wait(), timeout=self.limits.wall_s + 5)) == 0
            except (subprocess.SubprocessError, OSError, TimeoutError):
                self._netns = False
        return "netns" if self._netns else "audit-hook"

    async def run(self, code: str) -> SandboxResult:
        """Run `code` to completion or to a limit; never raises for anything the code does."""
        # deps: PythonSandbox.containment, PythonSandbox.network_isolation, PythonSandbox._execute
        containment = await self.containment()
        isolation = await self.network_isolation()
        return await self._execute(code, containment, isolation)

    async def _execute(self, code: str, containment: str, isolation: str) -> SandboxResult:
        lease: UidLease | None = lease_uid() if self._per_run_uid else None
        run_uid = lease.uid if lease is not None else None
        workdir: str | None = None
        try:
            workdir, boot, sol = self._prepare_workdir(code, run_uid)
            env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}
            if containment == "bwrap":
                env["HOME"] = SANDBOX_ROOT
                script = [f"{SANDBOX_ROOT}/{boot.name}", f"{SANDBOX_ROOT}/{sol.name}"]
                argv = bwrap_argv(
                    self._bwrap or "bwrap", workdir, self.python, ["-I", "-S", "-B", *script], env, self.limits.disk_bytes
                )
            else:
                env["TMPDIR"] = workdir  # `tempfile` and most tools write here, removed with the run
                argv = [self.python, "-I", "-S", "-B", str(boot), str(sol)]
            new_netns = containment == "process" and isolation == "netns"
            r_out, w_out = os.pipe()
            r_err, w_err = os.pipe()
            try:
                try:
                    proc = await asyncio.create_subprocess_exec(
                        *argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=w_out, stderr=w_err,
                        start_new_session=True, preexec_fn=lambda: _child_setup(self.limits, new_netns, run_uid),
                    )  # fmt: skip
                finally:
                    os.close(w_out)
                    os.close(w_err)
                status, rc, stdout, stderr = await self._collect(proc, r_out, r_err, run_uid)
            finally:
                os.close(r_out)
                os.close(r_err)
            if containment == "bwrap":
                rc = bwrap_returncode(rc)
                status = self._classify(rc, stderr, status)
            return SandboxResult(status, rc, stdout, stderr, isolation, containment, run_uid)
        finally:
            if lease is not None:
                if await kill_uid(lease.uid):
                    remove_files_of(lease.uid)  # what it wrote in /tmp, /var/tmp, /dev/shm (process mode)
                    lease.release()
                else:  # keep the uid leased (the lock stays held) rather than hand a live process to the next run
                    log.error("sandbox uid %d still has processes after the kill sweep; uid withheld", lease.uid)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _prepare_workdir(self, code: str, run_uid: int | None) -> tuple[str, Path, Path]:
        """A fresh 0700 directory owned by the run's own uid (or by us): no other run can write it."""
        workdir = tempfile.mkdtemp(prefix="rollart-sandbox-")
        boot, sol = Path(workdir, "_boot.py"), Path(workdir, "solution.py")
        boot.write_text(_BOOTSTRAP % bool(self.audit_guard))
        sol.write_text(code)
        for f in (boot, sol):
            os.chmod(f, 0o444)
        if run_uid is not None:
            os.chown(workdir, run_uid, run_uid)
        os.chmod(workdir, 0o700)
        return workdir, boot, sol

    async def _collect(
        self, proc: asyncio.subprocess.Process, r_out: int, r_err: int, run_uid: int | None
    ) -> tuple[str, int | None, str, str]:
        """Wait for the process (not for its pipes: a detached child may hold them), then kill the rest.

        The end of the run is the exit of the process we started, or a limit. Output is read from
        pipes we own, so a descendant that keeps them open can neither delay nor fail the result.
        """
        loop = asyncio.get_running_loop()
        limits = self.limits
        buffers = {r_out: bytearray(), r_err: bytearray()}
        open_fds = {r_out, r_err}
        overflow, eof = asyncio.Event(), asyncio.Event()

        def on_readable(fd: int) -> None:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                loop.remove_reader(fd)
                open_fds.discard(fd)
                if not open_fds:
                    eof.set()
                return
            buf = buffers[fd]  # keep draining past the limit (discarding), so the writer never blocks
            if len(buf) <= limits.output_bytes:
                buf.extend(chunk[: limits.output_bytes + 1 - len(buf)])
                if len(buf) > limits.output_bytes:
                    overflow.set()

        for fd in open_fds:
            os.set_blocking(fd, False)
            loop.add_reader(fd, on_readable, fd)
        waiter = asyncio.ensure_future(proc.wait())
        overflow_task = asyncio.ensure_future(overflow.wait())
        try:
            done, _ = await asyncio.wait({waiter, overflow_task}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
            timed_out = not done
            self._kill_group(proc.pid)  # the started process (under bwrap: the namespace's parent) and its group
            await asyncio.wait({waiter}, timeout=5.0)
            if run_uid is not None:
                await kill_uid(run_uid)  # everything the run left behind, in any session or group
            try:
                await asyncio.wait_for(eof.wait(), timeout=1.0)  # the rest of what was written before the end
            except TimeoutError:
                pass  # a writer escaped the kill (non-root fallback only): stop listening to it
        finally:
            if proc.returncode is None:  # cancelled by our caller: the run must not outlive the call
                self._kill_group(proc.pid)
            for fd in list(open_fds):
                loop.remove_reader(fd)
            waiter.cancel()
            overflow_task.cancel()
        stdout = buffers[r_out][: limits.output_bytes].decode("utf-8", "replace")
        stderr = buffers[r_err][: limits.output_bytes].decode("utf-8", "replace")
        rc = proc.returncode
        if overflow.is_set():
            status = "output_limit"
        elif timed_out:
            status = "timeout"
        else:
            status = self._classify(rc, stderr, "")
        return status, rc, stdout, stderr

    @staticmethod
    def _classify(rc: int | None, stderr: str, status: str) -> str:
        """Name how the run ended; `status` already set to output_limit or timeout wins."""
        if status in ("output_limit", "timeout"):
            return status
        if rc == -signal.SIGXCPU:
            status = "cpu_limit"
        elif "MemoryError" in stderr:
            status = "memory_limit"
        elif "No space left on device" in stderr or "File too large" in stderr:
            status = "disk_limit"  # the run's tmpfs quota (bwrap) or the per-file cap (RLIMIT_FSIZE)
        elif rc is None or rc == -signal.SIGKILL:
            status = "killed"
        elif "PermissionError: sandbox:" in stderr:
            status = "blocked"
        elif rc == 0:
            status = "ok"
        elif rc < 0:
            status = "killed"
        else:
            status = "error"
        # AST: AST_POSTCONDITION(status in SANDBOX_STATUSES, got=status, exc=EnvError)
        check.postcondition(status in SANDBOX_STATUSES, "status in SANDBOX_STATUSES", got=status, exc=EnvError)  # generated #7e63a5bc5e
        return status

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
