"""Issue 21 item 7: a run that survives faults and accounts for every trajectory.

Eight iterations of the two-pool affinity layout on Ray (logical GPUs H800 and H20, torch engines on
the tiny model). Meanwhile: rollout actors are SIGKILLed at random moments (the same actor twice, so
the second death spends its restart budget and a new actor replaces it), the reward service (a real
process on 127.0.0.1) is stopped and started again on the same port, and one env hangs in `step`.
The run must finish every iteration, and every launched trajectory must have exactly one ledger line.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config
from rollart.proxy.testing import build_tiny_model
from rollart.scheduler.metrics import read_metrics
from rollart.scheduler.records import accounting_problems, read_events, read_ledger

HANGING_ENV = textwrap.dedent('''
    import asyncio

    from rollart.env.protocols import ResetResult, StepResult


    class SometimesHangs:
        """Two short turns; the episode of seed 3 (mod 5) hangs in its first step until cancelled."""

        name = "hangs"
        system_prompt = "Answer briefly."

        def __init__(self, hang: bool = True) -> None:
            self.seed, self.t, self.hang = None, 0, hang

        async def reset(self, seed=None):
            self.seed, self.t = seed, 0
            return ResetResult(observation=f"Say something about {seed}.")

        async def step(self, action):
            self.t += 1
            if self.hang and self.seed is not None and self.seed % 5 == 3 and self.t == 1:
                await asyncio.Event().wait()
            return StepResult(observation="Go on.", reward=1.0, terminated=self.t >= 2, truncated=False)

        async def close(self):
            pass
''')


class RewardService:
    """`rollart.reward.service` as a process on a fixed 127.0.0.1 port that a test can stop and start."""

    def __init__(self, cache_dir) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cache = cache_dir / "cache.sqlite"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "rollart.reward.service", "--token", "chaos-token",
                                      "--port", str(self.port), "--workers", "1", "--cache-path", str(self.cache)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(240):  # bounded wait for /health
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code < 500:
                    return
            except httpx.HTTPError:
                time.sleep(0.25)
        raise RuntimeError("reward service did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


async def kill_actor(worker) -> int:
    """SIGKILL the OS process of a rollout actor; returns its pid."""
    pid = await worker.handle.actor.__ray_call__.remote(lambda self: os.getpid())
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.ray
@pytest.mark.slow
async def test_chaos_run_finishes_and_the_ledger_accounts_for_every_trajectory(ray_cluster, tmp_path):
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "hanging_env.py").write_text(HANGING_ENV)
    service = RewardService(tmp_path / "user")
    service.start()
    os.environ["ROLLART_CHAOS_REWARD_TOKEN"] = "chaos-token"
    cfg = parse_config({
        "run": {"name": "chaos", "tensorboard": False, "seed": 0},
        "model": {"path": build_tiny_model(tmp_path / "model")},
        "cluster": {"ray": "local"},
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 16, "group_size": 4, "redundancy": 1.5,
                     "get_batch_timeout_s": 240},
        "rollout": {"pools": [{"name": "h800", "hardware": "H800", "devices": 1, "engine": "torch", "max_num_seqs": 16},
                              {"name": "h20", "hardware": "H20", "devices": 1, "engine": "torch", "max_num_seqs": 16}]},
        "routing": {"affinity": {"lake": "H800", "talk": "H20"}},
        "trainer": {"placement": "driver", "hardware": "H800", "entropy_coef": 0.01},
        "tasks": [
            {"env": f"{tmp_path / 'user'}/hanging_env.py:SometimesHangs", "env_args": {"hang": False}, "tag": "lake",
             "max_turns": 2, "max_tokens": 6, "prompts": "chat_template", "reward": "env_success"},
            {"env": f"{tmp_path / 'user'}/hanging_env.py:SometimesHangs", "tag": "talk", "max_turns": 2,
             "prompts": "chat_template",
             "max_tokens": 6, "env_timeout_s": 2.0,
             "reward": {"service": service.url, "name": "env_success", "token_env": "ROLLART_CHAOS_REWARD_TOKEN",
                        "deadline_s": 20.0}},
        ],
    })
    rng = random.Random(21)
    pipe = await build_pipeline(cfg, tmp_path / "run")
    chaos: list[asyncio.Task] = []
    done: list[str] = []

    async def kill_soon(hardware: str) -> None:
        await asyncio.sleep(rng.uniform(0.0, 2.0))  # at a random moment of the iteration
        for _ in range(120):  # bounded: a worker of this hardware may still be coming back from the last kill
            live = [s.handle for s in pipe.parts.proxy.slots if s.handle.hardware == hardware and s.state == "active"]
            if live:
                break
            await asyncio.sleep(0.5)
        worker = live[0]
        await kill_actor(worker)
        done.append(f"killed {worker.worker_id}")

    async def outage() -> None:
        await asyncio.sleep(rng.uniform(0.0, 1.0))
        await asyncio.to_thread(service.stop)
        await asyncio.sleep(3.0)
        await asyncio.to_thread(service.start)
        done.append("reward service restarted")

    plan = {1: lambda: kill_soon("H20"), 3: outage, 4: lambda: kill_soon("H800"), 5: lambda: kill_soon("H20")}

    def on_iteration(rec):
        if rec["iteration"] in plan:
            chaos.append(asyncio.ensure_future(plan[rec["iteration"]]()))

    try:
        recs = await pipe.run(8, progress=False, on_iteration=on_iteration)
        await asyncio.gather(*chaos)
        for _ in range(600):  # bounded: the last killed actor's restart or replacement may still be starting
            kinds = [e["kind"] for e in read_events(tmp_path / "run")]
            if kinds.count("actor_replaced") >= 3 and all(s.state == "active" for s in pipe.parts.proxy.slots):
                break
            await asyncio.sleep(0.5)
        states = [s.state for s in pipe.parts.proxy.slots]
    finally:
        await pipe.close()
        service.stop()
    assert [r["iteration"] for r in recs] == list(range(1, 9))
    assert len(done) == 4, done
    assert states == ["active", "active"]
    events = read_events(tmp_path / "run")
    kinds = [e["kind"] for e in events]
    assert kinds.count("actor_died") >= 3 and kinds.count("actor_replaced") >= 3, kinds
    assert any(e["kind"] == "actor_replaced" and e["how"] == "new actor" for e in events), kinds  # budget spent
    assert accounting_problems(tmp_path / "run") == []
    ledger = read_ledger(tmp_path / "run")
    assert {e["outcome"] for e in ledger} >= {"consumed", "failed"}
    # the hanging env's trajectories fail by timeout, counted by kind
    assert any("env_timeout" in (r["outcomes"]["failed"]) for r in read_metrics(tmp_path / "run"))
