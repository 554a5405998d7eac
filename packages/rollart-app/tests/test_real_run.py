"""Real runs from one config: a Hugging Face checkpoint directory, rollout pools on two hardware types
with affinity, data-parallel trainer actors, weights moved by a sync channel, a user env loaded by
import path and a reward scored by the reward service over HTTP (design D16, D17).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config

USER_ENV = textwrap.dedent('''
    from rollart.env.protocols import ResetResult, StepResult

    class ChatterEnv:
        """Two turns of free text; the episode always finishes (the reward service scores it)."""

        name = "chatter"
        system_prompt = "Answer briefly."

        def __init__(self, turns: int = 2) -> None:
            self.turns, self.t = turns, 0

        async def reset(self, seed=None):
            self.t = 0
            return ResetResult(observation=f"Say something about {seed}.")

        async def step(self, action):
            self.t += 1
            return StepResult(observation="Go on.", reward=0.0, terminated=self.t >= self.turns, truncated=False)

        async def close(self):
            pass
''')

USER_REWARD = textwrap.dedent('''
    from rollart.reward.protocol import RewardRegistry, RewardResult

    class LengthReward:
        """Longer answers score higher, up to 1 (a service-side reward the policy cannot see)."""

        name = "length"

        async def score(self, trajectory):
            n = sum(len(t.response_ids) for t in trajectory.turns)
            return RewardResult(score=min(1.0, n / 8.0))

    def registry():
        r = RewardRegistry()
        r.register(LengthReward())
        return r
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny Llama checkpoint directory: config, safetensors, tokenizer with a chat template."""
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def user_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("user")
    (d / "chatter_env.py").write_text(USER_ENV)
    (d / "user_reward.py").write_text(USER_REWARD)
    return d


@pytest.fixture(scope="module")
def reward_service(user_files):
    """The reward service as a real process on 127.0.0.1, serving the user's registry."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{user_files}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "ROLLART_TEST_REWARD_TOKEN": "secret-token"}
    proc = subprocess.Popen([sys.executable, "-m", "rollart.reward.service", "--token", "secret-token", "--port", str(port),
                             "--workers", "1", "--registry", "user_reward:registry",
                             "--cache-path", str(user_files / "cache.sqlite")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code < 500:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail(f"reward service did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    os.environ["ROLLART_TEST_REWARD_TOKEN"] = "secret-token"
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def real_config(checkpoint: str, user_files: Path, service: str, engine: str, channel: str) -> dict:
    return {
        "run": {"tensorboard": False, "seed": 0},
        "cluster": {"ray": "local"},
        "model": {"path": checkpoint},
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4, "redundancy": 1.0,
                     "get_batch_timeout_s": 300, "update_timeout_s": 120},
        "rollout": {"pools": [
            {"name": "prefill", "hardware": "H800", "devices": 1, "engine": engine, "max_num_seqs": 8,
             **({"engine_args": {"max_model_len": 256}} if engine == "vllm" else {})},
            {"name": "decode", "hardware": "H20", "devices": 1, "engine": engine, "max_num_seqs": 8,
             **({"engine_args": {"max_model_len": 256}} if engine == "vllm" else {})},
        ]},
        "routing": {"affinity": {"short": "H800", "long": "H20"}},
        "trainer": {"placement": "actors", "devices": 2, "hardware": "H800", "lr": 1e-3, "micro_batch_size": 4},
        "sync": {"channel": channel, "bucket_mb": 1},
        "tasks": [
            {"env": f"{user_files}/chatter_env.py:ChatterEnv", "env_args": {"turns": 1}, "tag": "short",
             "max_tokens": 4, "max_turns": 1,
             "reward": {"service": service, "name": "length", "token_env": "ROLLART_TEST_REWARD_TOKEN"}},
            {"env": f"{user_files}/chatter_env.py:ChatterEnv", "env_args": {"turns": 2}, "tag": "long",
             "max_tokens": 6, "max_turns": 2,
             "reward": {"service": service, "name": "length", "token_env": "ROLLART_TEST_REWARD_TOKEN"}},
        ],
    }


async def _run_and_check(cfg_dict: dict, tmp_path: Path, iterations: int = 2) -> None:
    cfg = parse_config(cfg_dict)
    pipe = await build_pipeline(cfg, tmp_path / "run")
    p = pipe.parts
    try:
        await p.rollout.start()
        for _ in range(iterations):
            rec = await pipe.step()
            assert rec["sync_bytes"] > 0 and rec["sync_s"] > 0
            # every rollout worker holds exactly the trainer's weights, under the trainer's version
            replicas = await p.trainer.checksums()
            assert all(r == replicas[0] for r in replicas[1:]), "data-parallel replicas diverged"
            version = p.trainer.version
            assert all(s.version == version for s in p.proxy.slots)
            for w in p.workers:
                held = await w.call("checksums")
                assert held["version"] == version and held["loaded_version"] == version
                assert held["loaded"] == replicas[0]
                if held["engine"] is not None:  # torch engines expose their model: it is the trainer's
                    assert held["engine"] == replicas[0]
    finally:
        await pipe.close()
    # every request of a tag ran on its pool's hardware
    counts = p.routing_log.counts
    assert set(counts) == {"short", "long"}
    assert set(counts["short"]) == {"H800"} and set(counts["long"]) == {"H20"}
    # every trajectory is accounted exactly once: buffered/consumed or aborted with a reason
    records = p.buffer.records()
    assert sum(1 for r in records.values() if r.state == "consumed") == iterations * cfg.pipeline.batch_size
    assert all(r.reason for r in records.values() if r.state == "aborted")
    assert pipe.seen_trajectories == len(records)


@pytest.mark.ray
@pytest.mark.slow
async def test_real_run_torch_engines_torch_dist(ray_cluster, checkpoint, user_files, reward_service, tmp_path):
    await _run_and_check(real_config(checkpoint, user_files, reward_service, "torch", "torch_dist"), tmp_path)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.vllm
async def test_real_run_vllm_pools_affinity_gloo_trainer(ray_cluster, checkpoint, user_files, reward_service, tmp_path):
    pytest.importorskip("vllm")
    await _run_and_check(real_config(checkpoint, user_files, reward_service, "vllm", "torch_dist"), tmp_path)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.mooncake
async def test_real_run_mooncake_channel(ray_cluster, checkpoint, user_files, reward_service, tmp_path):
    from rollart.sync.mooncake import mooncake_unavailable_reason

    reason = mooncake_unavailable_reason()
    if reason is not None:
        pytest.skip(f"Mooncake unavailable: {reason}")
    await _run_and_check(real_config(checkpoint, user_files, reward_service, "torch", "mooncake"), tmp_path)


@pytest.mark.ray
@pytest.mark.slow
async def test_real_run_megatron_trainer_actors(ray_cluster, checkpoint, user_files, reward_service, tmp_path):
    """megatron-core GPTModel replicas (CPU shims, TP = PP = 1) as data-parallel actors: the engines load
    the HF-named weights they export, checksum for checksum."""
    pytest.importorskip("megatron.core")
    cfg = real_config(checkpoint, user_files, reward_service, "torch", "torch_dist")
    cfg["trainer"]["backend"] = "megatron"
    await _run_and_check(cfg, tmp_path)
