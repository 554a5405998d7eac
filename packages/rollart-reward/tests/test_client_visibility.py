"""Issue 21 item 4 (reward share, D30/D31): reward errors, retries and outages are logged and counted,
and `rollart-reward serve` removes the temporary cache directory it made when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rollart.env.trajectory import Trajectory, Turn
from rollart.reward.client import RewardClient
from rollart.reward.errors import RewardTimeoutError

TOKEN = "test-token-123456"  # the conftest's server token
ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_traj(i: int) -> Trajectory:
    return Trajectory(id=f"vis-{i}", info={"ground_truth": "4"},
                      turns=[Turn(prompt_ids=[1], response_ids=[3], response_logprobs=[-0.1], response_text="4")])


async def test_an_outage_that_recovers_within_the_deadline_is_logged_counted_and_announced(server_factory, caplog):
    srv = await asyncio.to_thread(server_factory(workers=1).start)
    events: list[tuple[str, dict]] = []
    client = RewardClient(srv.url, TOKEN, seed=0, on_event=lambda kind, detail: events.append((kind, detail)))
    caplog.set_level(logging.WARNING, logger="rollart.reward.client")
    try:
        await client.score("slow", make_traj(0), deadline_s=20.0)
        assert client.stats.snapshot() == {"errors": {}, "retries": 0, "outages": 0, "outage_s": 0.0}
        await asyncio.to_thread(srv.kill)
        task = asyncio.create_task(client.score("slow", make_traj(1), deadline_s=40.0))
        await asyncio.sleep(1.5)
        await asyncio.to_thread(srv.start)
        result = await asyncio.wait_for(task, 60)
    finally:
        srv.stop()
        await client.aclose()
    assert result.score == float(len("vis-1"))
    stats = client.stats.snapshot()
    assert stats["outages"] == 1 and stats["retries"] >= 1 and stats["errors"] == {}
    assert stats["outage_s"] > 0.5
    assert [kind for kind, _ in events] == ["reward_outage", "reward_recovered"]
    assert events[1][1]["outage_s"] == pytest.approx(stats["outage_s"])
    lines = [r.getMessage() for r in caplog.records]
    assert any("is not answering" in line for line in lines), lines
    assert any("answers again after" in line for line in lines), lines


async def test_a_call_that_fails_is_logged_and_counted_by_kind(caplog):
    client = RewardClient(f"http://127.0.0.1:{free_port()}", TOKEN, seed=0, backoff_max_s=0.05)
    caplog.set_level(logging.WARNING, logger="rollart.reward.client")
    try:
        with pytest.raises(RewardTimeoutError):
            await client.score("any", make_traj(2), deadline_s=0.5)
    finally:
        await client.aclose()
    assert client.stats.errors == {"RewardTimeoutError": 1}
    assert client.stats.retries >= 1 and client.stats.outages == 1
    assert any("scoring failed: RewardTimeoutError" in r.getMessage() for r in caplog.records)


def _healthy_within(seconds: float, url: str, proc: subprocess.Popen) -> bool:
    """Poll `url` every 0.2 s until it answers 200 (True), the process exits or `seconds` pass (False)."""
    end = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < end:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        time.sleep(0.2)
    return False


def test_serve_removes_its_temporary_cache_directory_on_exit(tmp_path):
    """Before: `rollart-reward serve` without --cache-path left /tmp/rollart-reward-*/cache.sqlite behind."""
    port = free_port()
    env = {**os.environ, "ROLLART_REWARD_TOKEN": TOKEN, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "rollart.reward.cli", "serve", "examples/user_env.py:guess_reward",
                             "--port", str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert _healthy_within(60.0, f"http://127.0.0.1:{port}/health", proc), proc.stderr.read()
        made = list(tmp_path.glob("rollart-reward-*"))
        assert len(made) == 1 and made[0].is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert list(tmp_path.glob("rollart-reward-*")) == []
