"""`rollart reward serve module:function` runs a real reward service; configs score through it over HTTP.

It is an alias of rollart-reward's own `rollart-reward serve` (rollart-reward D25): same options, same
defaults, same messages and exit codes, because both call `rollart.reward.cli.serve_command`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.app.config import parse_config
from rollart.app.task_factory import build_task
from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.reward import cli as reward_cli
from rollart.reward.client import RewardClient

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "test-token-123456"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _traj(tid: str, success: bool, **info) -> Trajectory:
    return Trajectory(id=tid, status=TrajectoryStatus.FINISHED, success=success, info=info)


@pytest.mark.slow
def test_serve_a_plain_function_from_a_file_and_score_over_http(tmp_path):
    port = _free_port()
    env = {**os.environ, "ROLLART_REWARD_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollart.app.cli", "reward", "serve", "examples/user_env.py:guess_reward",
         "--port", str(port), "--name", "guess", "--cache-path", str(tmp_path / "cache.sqlite")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "reward service did not come up"
            time.sleep(0.2)
        assert httpx.get(f"{url}/health").json()["rewards"] == ["guess"]

        async def score() -> tuple[float, float]:
            client = RewardClient(url, token=TOKEN)
            try:
                hit = await client.score("guess", _traj("a", True), deadline_s=10)
                near = await client.score("guess", _traj("b", False, best_gap=4, high=16), deadline_s=10)
                return hit.score, near.score
            finally:
                await client.aclose()

        assert asyncio.run(score()) == (1.0, pytest.approx(0.5 * (1 - 4 / 16)))
        # a config task whose reward is the service scores through it (token from the named env var)
        os.environ["H10B_REWARD_TOKEN"] = TOKEN
        try:
            cfg = parse_config({"tasks": [{"env": "frozenlake", "reward": {"service": url, "name": "guess", "token_env": "H10B_REWARD_TOKEN"}}]})
            from rollart.app.tasks import build_demo_tokenizer

            parts = build_task(cfg.tasks[0], 0, cfg, build_demo_tokenizer())
        finally:
            del os.environ["H10B_REWARD_TOKEN"]
        assert parts.reward_origin == f"reward service {url} (guess)"

        async def via_config() -> float:
            try:
                return await parts.scorer(_traj("c", False, best_gap=8, high=16))
            finally:
                for close in parts.closers:
                    await close()

        assert asyncio.run(via_config()) == pytest.approx(0.25)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode is not None
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/health", timeout=1)


def test_serve_refuses_bad_input_before_binding(monkeypatch):
    runner = CliRunner()
    monkeypatch.delenv("ROLLART_REWARD_TOKEN", raising=False)
    res = runner.invoke(app, ["reward", "serve", "examples/user_env.py:guess_reward"])
    assert res.exit_code == 2 and "--token-env: set ROLLART_REWARD_TOKEN" in res.output
    monkeypatch.setenv("ROLLART_REWARD_TOKEN", TOKEN)
    res = runner.invoke(app, ["reward", "serve", str(ROOT / "examples/user_env.py") + ":no_such_reward"])
    assert res.exit_code == 2 and "has no attribute 'no_such_reward'" in res.output
    res = runner.invoke(app, ["reward", "serve", "no_such_module_q:fn"])
    assert res.exit_code == 2 and "No module named 'no_such_module_q'" in res.output


def _serve_options_of_the_alias() -> dict[str, object]:
    command = typer.main.get_command(app).commands["reward"].commands["serve"]
    return {(p.name.upper() if p.param_type_name == "argument" else p.opts[0]): p.default for p in command.params}


def _serve_options_of_rollart_reward() -> dict[str, object]:
    parser = reward_cli.build_parser()
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    return {(a.option_strings[0] if a.option_strings else a.metavar): a.default
            for a in serve._actions if not isinstance(a, argparse._HelpAction)}


def test_the_alias_takes_the_same_options_with_the_same_defaults():
    assert _serve_options_of_the_alias() == _serve_options_of_rollart_reward() == {
        "SPEC": None, "--name": None, "--host": None, "--port": 8000, "--token-env": "ROLLART_REWARD_TOKEN",
        "--workers": 1, "--cache-path": None}


@pytest.mark.parametrize(("args", "env_token"), [
    (["examples/user_env.py:guess_reward"], None),
    (["examples/user_env.py:guess_reward", "--port", "70000"], TOKEN),
    (["examples/user_env.py:guess_reward", "--workers", "65"], TOKEN),
    (["examples/user_env.py:guess_reward", "--token-env", ""], TOKEN),
    (["examples/user_env.py:no_such_reward"], TOKEN),
    (["examples/user_env.py"], TOKEN),
])
def test_the_alias_says_what_rollart_reward_serve_says(args, env_token, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    if env_token is None:
        monkeypatch.delenv("ROLLART_REWARD_TOKEN", raising=False)
    else:
        monkeypatch.setenv("ROLLART_REWARD_TOKEN", env_token)
    code = reward_cli.main(["serve", *args])
    said = capsys.readouterr().err
    alias = CliRunner().invoke(app, ["reward", "serve", *args])
    assert code == alias.exit_code == 2
    assert said.count("\n") == 1 and said.split(" ")[0] in ("--token-env:", "--port", "--workers", "--token-env", "SPEC:")
    assert alias.stderr == said
