"""Mooncake master and HTTP metadata server as subprocesses on 127.0.0.1: tests, benchmarks, the demo.

Not for production (there the cluster runs its own Mooncake services). Both services bind the given
host only; see the design doc (D7) for the client-side listeners Mooncake opens on its own.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from rollart import checks as check
from rollart.sync.errors import SyncError, SyncTimeoutError, SyncValidationError
from rollart.sync.mooncake import MooncakeConfig


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _master_binary() -> str:
    local = Path(sys.executable).with_name("mooncake_master")
    found = str(local) if local.exists() else shutil.which("mooncake_master")
    if not found:
        raise SyncError("mooncake_master not found next to the Python interpreter or on PATH")
    return found


class MooncakeServices:
    """A Mooncake master and an HTTP metadata server as subprocesses bound to `host`."""

    def __init__(self, host: str = "127.0.0.1", log_dir: str | None = None) -> None:
        self._host = host
        self._log_dir = Path(log_dir) if log_dir else None
        self._procs: list[subprocess.Popen] = []
        self._logs: list = []

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = subprocess.DEVNULL
        if self._log_dir is not None:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self._log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
            self._logs.append(out)
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._procs.append(proc)
        return proc

    async def _wait_listening(self, proc: subprocess.Popen, port: int, what: str, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if proc.poll() is not None:
                raise SyncError(f"{what} exited with code {proc.returncode} before listening on {self._host}:{port}")
            try:
                _reader, writer = await asyncio.wait_for(asyncio.open_connection(self._host, port), 1.0)
                writer.close()
                await writer.wait_closed()
                return
            except (TimeoutError, OSError):
                if loop.time() > deadline:
                    raise SyncTimeoutError(f"{what} not listening on {self._host}:{port} before the deadline") from None
                await asyncio.sleep(0.05)

    async def start(self, timeout: float = 30.0) -> MooncakeConfig:
        """Start both services on free ports and wait until they accept connections."""
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        rpc, http, metrics = _free_port(self._host), _free_port(self._host), _free_port(self._host)
        metadata = self._spawn(
            "metadata",
            [sys.executable, "-m", "mooncake.http_metadata_server", "--host", self._host, "--port", str(http),
             "--log-level", "WARNING"],
        )
        master = self._spawn(
            "master",
            [_master_binary(), f"--rpc_port={rpc}", f"--rpc_address={self._host}", f"--metrics_host={self._host}",
             f"--metrics_port={metrics}", "--default_kv_lease_ttl=30000", "--minloglevel=1"],
        )
        try:
            await self._wait_listening(metadata, http, "Mooncake HTTP metadata server", deadline)
            await self._wait_listening(master, rpc, "mooncake_master", deadline)
        except BaseException:
            await self.stop()
            raise
        return MooncakeConfig(
            master_address=f"{self._host}:{rpc}",
            metadata_server=f"http://{self._host}:{http}/metadata",
            local_hostname=self._host,
        )

    async def stop(self, timeout: float = 10.0) -> None:
        """Terminate both services (kill after the deadline)."""
        # VAL: VAL_TIMEOUT(timeout, exc=SyncValidationError)
        check.timeout("timeout", timeout, exc=SyncValidationError)  # generated #fcfdcac0bb
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            while proc.poll() is None and loop.time() < deadline:  # noqa: ASYNC110 - polling a child process
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        self._procs.clear()
        self._logs.clear()
