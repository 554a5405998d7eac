"""`rollart-reward serve SPEC` (design D25): the command, run for real, answers the README's request
with the README's response; bad options fail before binding with one line naming the option."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from rollart.reward import cli

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "packages" / "rollart-reward"
TOKEN = "test-token-123456"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def readme_serve_section() -> dict[str, object]:
    """The README's "Serve a function" section, parsed: the command, the curl request, the response.

    The test sends exactly this, so the README cannot drift from what the service does."""
    text = (PACKAGE / "README.md").read_text()
    section = text.split("\n## Serve a function\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", section, re.M | re.S)
    command = next(code for lang, code in blocks if lang == "bash" and "rollart-reward serve" in code)
    curl = next(code for lang, code in blocks if lang == "bash" and code.lstrip().startswith("curl"))
    response = next(code for lang, code in blocks if lang == "json")
    env_token, *argv = shlex.split(command)
    return {
        "token": env_token.removeprefix("ROLLART_REWARD_TOKEN="),
        "argv": argv,
        "url_path": re.search(r"http://127\.0\.0\.1:\d+(/\S+)", curl)[1],
        "authorization": re.search(r'-H "Authorization: ([^"]+)"', curl)[1],
        "body": json.loads(re.search(r"-d '(.*?)'", curl, re.S)[1]),
        "response": json.loads(response),
    }


def test_the_console_script_is_the_cli_main():
    scripts = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["rollart-reward"].partition(":")
    assert getattr(importlib.import_module(module), attr) is cli.main


def test_version_and_a_missing_command(capsys):
    assert cli.main(["--version"]) == 0
    assert re.fullmatch(r"rollart-reward \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)
    assert cli.main([]) == 2
    assert "a COMMAND is required (choose from 'serve')" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "env_token", "message"), [
    (["serve", "examples/user_env.py:guess_reward"], None,
     "--token-env: set ROLLART_REWARD_TOKEN to a bearer token of at least 8 characters (clients send it)"),
    (["serve", "examples/user_env.py:guess_reward"], "short",
     "--token-env: set ROLLART_REWARD_TOKEN to a bearer token of at least 8 characters (clients send it)"),
    (["serve", "examples/user_env.py:guess_reward", "--token-env", ""], TOKEN, "--token-env must not be empty, got ''"),
    (["serve", "examples/user_env.py:guess_reward", "--port", "70000"], TOKEN,
     "--port must be an integer in [0, 65535], got 70000"),
    (["serve", "examples/user_env.py:guess_reward", "--workers", "0"], TOKEN,
     "--workers must be an integer in [1, 64], got 0"),
    (["serve", "examples/user_env.py"], TOKEN,
     "SPEC: Pre-condition: the spec is module:attr or file.py:attr, got 'examples/user_env.py'"),
    (["serve", "examples/user_env.py:no_such_reward"], TOKEN,
     "SPEC: cannot load 'examples/user_env.py:no_such_reward': 'examples/user_env.py' has no attribute 'no_such_reward'"),
    (["serve", "no_such_module_q:fn"], TOKEN, "SPEC: cannot load 'no_such_module_q:fn': No module named 'no_such_module_q'"),
])
def test_bad_input_is_one_line_naming_the_option_before_anything_binds(argv, env_token, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    if env_token is None:
        monkeypatch.delenv("ROLLART_REWARD_TOKEN", raising=False)
    else:
        monkeypatch.setenv("ROLLART_REWARD_TOKEN", env_token)
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == message + "\n"
    assert captured.out == ""


def test_rollart_reward_serve_answers_the_readme_request_with_the_readme_response(tmp_path):
    readme = readme_serve_section()
    argv = readme["argv"]
    assert argv[:2] == ["rollart-reward", "serve"] and "--port" in argv
    port = free_port()
    argv = [str(port) if prev == "--port" else arg for prev, arg in zip(["", *argv], argv)]
    # the console script is `rollart.reward.cli:main`; run as a module, the same code needs no install
    command = [sys.executable, "-m", "rollart.reward.cli", *argv[1:], "--cache-path", str(tmp_path / "cache.sqlite")]
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "ROLLART_REWARD_TOKEN": readme["token"]},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "rollart-reward serve did not come up"
            time.sleep(0.2)
        assert httpx.get(f"{url}/health").json()["rewards"] == ["guess_reward"]
        assert readme["authorization"] == f"Bearer {readme['token']}"

        answer = httpx.post(url + readme["url_path"], json=readme["body"], timeout=30,
                            headers={"Authorization": readme["authorization"]})
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == readme["response"]

        refused = httpx.post(url + readme["url_path"], json=readme["body"], timeout=30,
                             headers={"Authorization": "Bearer not-the-token"})
        assert refused.status_code == 401 and set(refused.json()["error"]) >= {"code", "message"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0
    assert (f"serving reward 'guess_reward' from examples/user_env.py:guess_reward on {url} (POST /v1/score)"
            in proc.stderr.read())
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=1)
