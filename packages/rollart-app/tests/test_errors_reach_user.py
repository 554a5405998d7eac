"""Issue 21 item 4 (app D56): every error reaches the user. A run whose env always raises stops at once
with one line naming the task and the env's error, the traceback is in RUN_DIR/logs/driver.log, and an
actor that died is explained by the first exception in its own log, copied to RUN_DIR/logs/."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.app.run_logs import collect_actor_logs, first_exception, root_cause

BROKEN_ENV = '''
from rollart.env.protocols import ResetResult


class BrokenLake:
    name = "broken"
    system_prompt = "Go."

    async def reset(self, seed=None):
        return ResetResult(observation="start", info={})

    async def step(self, action):
        return self.lookup(action)

    def lookup(self, action):
        return {}[("cell", action)]

    async def close(self):
        return None


def zero(trajectory):
    return 0.0
'''

CONFIG = """
run: {name: broken, iterations: 2, tensorboard: false}
model: {path: MODEL}
pipeline: {mode: async, alpha: 1, batch_size: 8, group_size: 4, get_batch_timeout_s: 30}
rollout: {pools: [{name: rollout, devices: 1}]}
tasks:
  - {env: broken_env.py:BrokenLake, reward: broken_env.py:zero, tag: lake, max_turns: 2, prompts: chat_template}
"""


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> str:
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-ckpt"))


def test_an_env_that_always_raises_fails_the_run_in_one_line_with_the_traceback_in_the_logs(tmp_path, tiny_ckpt):
    """Before: no line about the env; after get_batch_timeout_s a SchedulerTimeout traceback (426 s in the issue)."""
    (tmp_path / "broken_env.py").write_text(BROKEN_ENV)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("MODEL", str(tiny_ckpt)))
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--run-dir", str(run_dir)])
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("run failed: TaskFailingError: task BrokenLake: the last 16 trajectories failed on an env error")
    assert "step:KeyError" in last and f"logs: {run_dir / 'logs'}" in last
    driver = (run_dir / "logs" / "driver.log").read_text()
    assert "task BrokenLake: env BrokenLake-0-0: step raised KeyError" in driver
    assert "in lookup" in driver  # the env's own traceback, first occurrence
    assert "the run failed" in driver and "TaskFailingError" in driver


def test_first_exception_is_the_line_that_ends_the_first_traceback():
    text = ("INFO starting\nTraceback (most recent call last):\n  File \"x.py\", line 3, in f\n    g()\n"
            "ValueError: head size 72 is not supported by the FLASH_ATTN backend\n\nDuring handling...\n"
            "Traceback (most recent call last):\n  File \"y.py\", line 1\nRuntimeError: later\n")
    assert first_exception(text) == "ValueError: head size 72 is not supported by the FLASH_ATTN backend"
    assert first_exception("no traceback here\n") is None


@pytest.mark.ray
def test_a_dead_actor_is_explained_by_the_first_exception_of_its_own_log(ray_cluster, tmp_path):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self, head_size: int) -> None:
            if head_size not in (64, 128):
                raise ValueError(f"head size {head_size} is not supported (supported: [64, 128])")

        def ping(self) -> str:
            return "pong"

    actor = Engine.remote(72)
    with pytest.raises(Exception) as info:
        ray.get(actor.ping.remote(), timeout=120)
    logs = collect_actor_logs(tmp_path)
    assert logs and all(p.parent == tmp_path / "logs" for p in logs)
    cause = root_cause(info.value, logs)
    assert cause.line == "ValueError: head size 72 is not supported (supported: [64, 128])", cause
    assert cause.log is not None and cause.log.parent == tmp_path / "logs"


async def test_reward_client_retries_and_outages_reach_the_run_metrics_and_events(tmp_path):
    """The builder wires each service reward's client: its stats summed for metrics.jsonl, its outages to events.jsonl."""
    import socket
    from types import SimpleNamespace

    from rollart.app.builder import reward_stats
    from rollart.env.trajectory import Trajectory
    from rollart.reward.client import RewardClient
    from rollart.reward.errors import RewardTimeoutError
    from rollart.scheduler.records import read_events

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = RewardClient(dead, "token-123456789", backoff_max_s=0.05, seed=0)
    total = reward_stats([SimpleNamespace(reward_client=None), SimpleNamespace(reward_client=client)], tmp_path)
    assert total() == {"retries": 0, "outage_s": 0.0}
    with pytest.raises(RewardTimeoutError):
        await client.score("any", Trajectory(id="t0"), deadline_s=0.4)
    await client.aclose()
    assert total()["retries"] >= 1
    assert [e["kind"] for e in read_events(tmp_path)] == ["reward_outage"]
    assert reward_stats([SimpleNamespace(reward_client=None)], tmp_path) is None
