"""Issue 21 item 5 (app D57): everything `rollart plan` can know is checked before Ray starts, by one
function that `plan` and `run` share; a config's paths are taken from its folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from rollart.app import cli
from rollart.app.cli import app
from rollart.app.overrides import load_config_with
from rollart.app.preflight import preflight

TOKEN = "preflight-token-123"


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> str:
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-ckpt"))


def _config(tmp_path, model_path: str, extra_task: str = "", pool: str = "engine: torch") -> str:
    path = tmp_path / "cfg" / "run.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""
run: {{name: pre, iterations: 1, tensorboard: false}}
pipeline: {{mode: async, alpha: 1, batch_size: 4, group_size: 4}}
model: {{path: {model_path}}}
rollout: {{pools: [{{name: rollout, devices: 1, {pool}}}]}}
tasks:
  - {{env: frozenlake, prompts: chat_template, max_turns: 2{extra_task}}}
""")
    return str(path)


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


def test_model_path_is_taken_from_the_config_folder_not_the_working_directory(tmp_path, tiny_ckpt, monkeypatch):
    """Before: `model.path: ckpt` next to the config failed unless run from that folder."""
    shutil.copytree(tiny_ckpt, tmp_path / "cfg" / "ckpt")
    config = _config(tmp_path, "ckpt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_config_with(config).model.path == str(tmp_path / "cfg" / "ckpt")
    assert load_config_with(config, [f"model.path={tiny_ckpt}"]).model.path == tiny_ckpt  # --set: as typed
    code, out = _cli("plan", config)
    assert code == 0, out


def test_a_checkpoint_without_weights_is_one_problem_in_plan_and_in_run_before_ray(tmp_path, tiny_ckpt, monkeypatch):
    """Before: plan said nothing; run started Ray and the engine failed to load."""
    bare = tmp_path / "bare"
    shutil.copytree(tiny_ckpt, bare)
    for weights in bare.glob("*.safetensors"):
        weights.unlink()
    config = _config(tmp_path, str(bare))
    code, out = _cli("plan", config)
    assert code == 2
    line = f"model.path: {str(bare)!r} has config.json but no weights"
    assert line in out, out
    run_dir = tmp_path / "run"
    started: list[str] = []
    monkeypatch.setattr(cli, "init_ray", lambda cfg: started.append(cfg.cluster.ray))  # records, starts nothing
    code, out = _cli("run", config, "--run-dir", str(run_dir), "--set", "cluster.ray=local")
    assert code == 2 and line in out, out
    assert started == [] and not run_dir.exists()  # refused before Ray would start; nothing left behind


def test_a_vllm_head_size_the_backend_does_not_take_is_found_from_the_model_config(tmp_path, tiny_ckpt):
    """Before: the vLLM actor died after minutes with only ActorDiedError."""
    odd = tmp_path / "odd-heads"
    shutil.copytree(tiny_ckpt, odd)
    hf = json.loads((odd / "config.json").read_text())
    hf.update(hidden_size=72 * 2, num_attention_heads=2, head_dim=72)
    (odd / "config.json").write_text(json.dumps(hf))
    config = _config(tmp_path, str(odd), pool="engine: vllm, engine_args: {attention_backend: CPU_ATTN}")
    code, out = _cli("plan", config)
    assert code == 2
    assert "rollout.pools.0.engine: vllm's CPU_ATTN attention backend does not support head size 72" in out, out
    assert "supported: [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]" in " ".join(out.split())
    flash = _config(tmp_path, str(odd), pool="engine: vllm, engine_args: {attention_backend: FLASH_ATTN}")
    assert not [p for p in preflight(load_config_with(flash)).problems if "head size" in p.message]


@pytest.fixture
def reward_service(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {"token": TOKEN, "port": port, "workers": 1, "cache_path": str(tmp_path / "cache.sqlite"),
              "registry": "rollart.reward.testing:test_registry"}
    proc = subprocess.Popen([sys.executable, "-m", "rollart.reward.service", "--config-json", json.dumps(config)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            try:
                names = httpx.get(f"{url}/health", timeout=1).json()["rewards"]
                break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            pytest.fail(f"reward service did not start: {proc.stderr.read()[-2000:]!r}")
        yield url, names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_reward_service_is_checked_reachable_serving_the_reward_and_accepting_the_token(tmp_path, tiny_ckpt,
                                                                                          reward_service, monkeypatch):
    """Before: an unreachable service or a refused token surfaced as failed trajectories after Ray started."""
    url, names = reward_service
    monkeypatch.setenv("PRE_TOKEN", TOKEN)
    monkeypatch.setenv("WRONG_TOKEN", "not-the-token-at-all")

    def problems(service: str, name: str, token_env: str) -> list[str]:
        reward = f", reward: {{service: '{service}', name: {name}, token_env: {token_env}}}"
        return [str(p) for p in preflight(load_config_with(_config(tmp_path, tiny_ckpt, reward))).problems]

    assert problems(url, names[0], "PRE_TOKEN") == []
    refused = problems(url, names[0], "WRONG_TOKEN")
    assert refused == [f"tasks.0.reward.token_env: {url} refuses the token in WRONG_TOKEN (401 unauthorized)"]
    assert problems(url, "no_such_reward", "PRE_TOKEN") == [
        f"tasks.0.reward.name: 'no_such_reward' is not served by {url} (it serves {names})"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    [unreachable] = problems(dead, names[0], "PRE_TOKEN")
    assert unreachable.startswith(f"tasks.0.reward.service: {dead} is not reachable: ConnectError")
    monkeypatch.delenv("PRE_TOKEN")
    [unset] = problems(url, names[0], "PRE_TOKEN")
    assert unset == "tasks.0.reward.token_env: environment variable 'PRE_TOKEN' is not set"
