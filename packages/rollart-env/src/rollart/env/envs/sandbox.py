"""Run untrusted Python in a contained subprocess: CPU, memory, output, process and time limits.

Layers (defence in depth, see design D7):
1. a fresh network namespace (`unshare(CLONE_NEWNET)` in the child) when the kernel allows it,
   so only a downed loopback exists;
2. an audit hook installed before the user code runs that refuses sockets, fork/exec/spawn,
   subprocess and ctypes (this is the network guard when no namespace can be made);
3. `resource` rlimits (CPU seconds, address space, file size, open files, processes, no core),
   and, when started as root, the child drops to uid/gid 65534 so RLIMIT_NPROC binds;
4. a new session whose whole process group is SIGKILLed on the wall deadline and after exit;
5. a temporary working directory removed afterwards, `-I -S` interpreter flags (no env, no site).
"""

from __future__ import annotations

import asyncio
import ctypes
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

from rollart.env import checks as check
from rollart.env.errors import EnvError

SANDBOX_STATUSES = frozenset({"ok", "error", "timeout", "cpu_limit", "memory_limit", "output_limit", "blocked", "killed"})
NOBODY = 65534
_CLONE_NEWNET = 0x40000000

_BOOTSTRAP = r'''
import sys
_GUARD = %s
_BLOCKED_PREFIXES = ("socket.", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
                     "subprocess.", "ctypes.", "os.kill", "os.killpg", "pty.")
_BLOCKED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing", "_socket", "socket"}
def _rollart_guard(event, args):
    if event.startswith(_BLOCKED_PREFIXES) or (event == "import" and args and args[0] in _BLOCKED_IMPORTS):
        raise PermissionError("sandbox: " + event + " is not allowed")
_path = sys.argv[1]
with open(_path) as _f:
    _src = _f.read()
_code = compile(_src, "solution.py", "exec")
sys.argv = sys.argv[1:]
if _GUARD:
    sys.addaudithook(_rollart_guard)
del _f, _src, _path
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
        pass


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended, with its (truncated) output."""

    status: str  # one of SANDBOX_STATUSES
    returncode: int | None
    stdout: str
    stderr: str
    network_isolation: str  # "netns" or "audit-hook"


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
    """Runs code strings under `SandboxLimits`; probes once whether a network namespace is possible."""

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None, audit_guard: bool = True) -> None:
        """Pick the interpreter (one the sandbox uid can execute) and whether to drop privileges.

        `audit_guard=False` removes layer 2 (only tests use it, to show the namespace alone holds).
        """
        self.limits = limits or SandboxLimits()
        self.audit_guard = audit_guard
        self._drop_to = NOBODY if os.geteuid() == 0 else None
        self.python = python or self._pick_interpreter()
        self._netns: bool | None = None

    def _pick_interpreter(self) -> str:
        if self._drop_to is None or _reachable_by_others(sys.executable):
            return sys.executable
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
            if os.path.exists(candidate) and _reachable_by_others(candidate):
                return candidate
        self._drop_to = None  # no interpreter the sandbox uid can run: keep uid, rely on the other layers
        return sys.executable

    async def network_isolation(self) -> str:
        """'netns' when the child can get its own network namespace, else 'audit-hook'."""
        if self._netns is None:
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.python, "-I", "-S", "-c", "pass",
                    preexec_fn=lambda: _child_setup(self.limits, True, self._drop_to),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                self._netns = (await asyncio.wait_for(proc.wait(), timeout=self.limits.wall_s + 5)) == 0
            except (subprocess.SubprocessError, OSError):
                self._netns = False
        return "netns" if self._netns else "audit-hook"

    async def run(self, code: str) -> SandboxResult:
        """Run `code` to completion or to a limit; never raises for anything the code does."""
        # deps: PythonSandbox.network_isolation, _child_setup
        isolation = await self.network_isolation()
        workdir, boot, sol = self._prepare_workdir(code)
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-I", "-S", "-B", str(boot), str(sol),
                cwd=workdir, env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=lambda: _child_setup(self.limits, isolation == "netns", self._drop_to),
            )  # fmt: skip
            return await self._collect(proc, isolation)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _prepare_workdir(self, code: str) -> tuple[str, Path, Path]:
        workdir = tempfile.mkdtemp(prefix="rollart-sandbox-")
        os.chmod(workdir, 0o777)
        boot, sol = Path(workdir, "_boot.py"), Path(workdir, "solution.py")
        boot.write_text(_BOOTSTRAP % bool(self.audit_guard))
        sol.write_text(code)
        for f in (boot, sol):
            os.chmod(f, 0o644)
        return workdir, boot, sol

    async def _collect(self, proc: asyncio.subprocess.Process, isolation: str) -> SandboxResult:
        limits = self.limits
        buffers = {"out": bytearray(), "err": bytearray()}
        overflow = asyncio.Event()

        async def pump(stream: asyncio.StreamReader, key: str) -> None:
            # Keep draining (and discarding) past the limit until EOF: a reader that stops leaves the
            # transport paused on a full buffer, and then `proc.wait()` never sees the pipes close.
            while chunk := await stream.read(65536):
                buf = buffers[key]
                if len(buf) <= limits.output_bytes:
                    buf.extend(chunk[: limits.output_bytes + 1 - len(buf)])
                    if len(buf) > limits.output_bytes:
                        overflow.set()

        pumps = [asyncio.ensure_future(pump(proc.stdout, "out")), asyncio.ensure_future(pump(proc.stderr, "err"))]
        waiter = asyncio.ensure_future(proc.wait())
        overflow_task = asyncio.ensure_future(overflow.wait())
        done, _ = await asyncio.wait({waiter, overflow_task}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not done
        if not waiter.done():
            self._kill_group(proc.pid)
        try:
            await asyncio.wait_for(waiter, timeout=5.0)
        finally:
            self._kill_group(proc.pid)  # stragglers that escaped the parent
            overflow_task.cancel()
            for p in pumps:
                p.cancel()
        stdout = buffers["out"][: limits.output_bytes].decode("utf-8", "replace")
        stderr = buffers["err"][: limits.output_bytes].decode("utf-8", "replace")
        rc = proc.returncode
        if overflow.is_set():
            status = "output_limit"
        elif timed_out:
            status = "timeout"
        elif rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and "MemoryError" not in stderr):
            status = "cpu_limit" if rc == -signal.SIGXCPU else "killed"
        elif "MemoryError" in stderr:
            status = "memory_limit"
        elif "PermissionError: sandbox:" in stderr:
            status = "blocked"
        elif rc == 0:
            status = "ok"
        elif rc is not None and rc < 0:
            status = "killed"
        else:
            status = "error"
        # AST: AST_POSTCONDITION(status in SANDBOX_STATUSES, got=status, exc=EnvError)
        check.postcondition(status in SANDBOX_STATUSES, "status in SANDBOX_STATUSES", got=status, exc=EnvError)  # generated #7e63a5bc5e
        return SandboxResult(status=status, returncode=rc, stdout=stdout, stderr=stderr, network_isolation=isolation)

    @staticmethod
    def _kill_group(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
