"""A real reward service process on 127.0.0.1 (started, killed and restarted by the tests)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

TOKEN = "test-token-123456"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m rollart.reward.service` in its own session, so the whole worker tree can be killed."""

    def __init__(self, tmp_path, workers=2, **overrides):
        self.port = free_port()
        self.cache_path = str(tmp_path / "cache.sqlite")
        self.log_path = str(tmp_path / "scored.log")
        self.config = {
            "token": TOKEN, "port": self.port, "workers": workers, "cache_path": self.cache_path,
            "registry": "rollart.reward.testing:test_registry", **overrides,
        }  # fmt: skip
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout=60.0):
        env = {**os.environ, "ROLLART_REWARD_TEST_LOG": self.log_path}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rollart.reward.service", "--config-json", json.dumps(self.config)],
            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"reward service not healthy within {timeout} s")

    def kill(self):
        """SIGKILL the master and every worker (no graceful shutdown: a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def scored_log(self):
        try:
            with open(self.log_path) as f:
                return [line.strip() for line in f if line.strip()]
        except FileNotFoundError:
            return []


@pytest.fixture
def server(tmp_path):
    srv = ServerProcess(tmp_path).start()
    yield srv
    srv.stop()


@pytest.fixture
def server_factory(tmp_path):
    made = []

    def make(**kw):
        srv = ServerProcess(tmp_path, **kw)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for a module's tests: 2 workers, a 64 KiB body limit, at most 50 items, and a 2 s item
    deadline, so that a request the fuzzer sends for a `hang` reward ends in 3 s, far inside the client's
    timeout, however loaded the machine (issue 26)."""
    srv = ServerProcess(tmp_path_factory.mktemp("svc"), workers=2, max_body_bytes=64 * 1024, max_items=50,
                        item_timeout_s=2.0).start()
    yield srv
    srv.stop()
