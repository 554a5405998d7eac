"""The code sandbox: an infinite loop, a memory bomb, a fork bomb, network access, output floods
and hangs are each contained and reported; the host is unaffected. Real subprocesses, no mocks."""

from __future__ import annotations

import os
import socket
import tempfile
import threading

import pytest

from rollart.env.envs.code_sandbox import CodeSandboxEnv, build_harness, extract_code, parse_test
from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits

LIMITS = SandboxLimits(cpu_s=1, wall_s=4.0, memory_bytes=128 * 1024 * 1024, output_bytes=4096)


@pytest.fixture
def sandbox():
    return PythonSandbox(LIMITS)


async def test_plain_code_runs_and_reports_output(sandbox):
    result = await sandbox.run("print(sum(range(10)))")
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "45\n")
    assert result.network_isolation in ("netns", "audit-hook")


async def test_infinite_loop_is_stopped_by_the_cpu_limit():
    # a wide wall deadline so that even on a loaded CI box the 1 s CPU limit is what ends it
    result = await PythonSandbox(SandboxLimits(cpu_s=1, wall_s=30.0)).run("while True:\n    pass")
    assert result.status == "cpu_limit"


async def test_sleeping_forever_is_killed_at_the_wall_deadline():
    result = await PythonSandbox(SandboxLimits(cpu_s=1, wall_s=1.0)).run("import time\ntime.sleep(1000)")
    assert result.status == "timeout" and result.returncode == -9


async def test_memory_bomb_is_contained(sandbox):
    result = await sandbox.run("x = []\nwhile True:\n    x.append(' ' * 10**7)")
    assert result.status == "memory_limit" and "MemoryError" in result.stderr


async def test_fork_bomb_is_contained_and_leaves_no_process(sandbox):
    result = await sandbox.run("import os\nwhile True:\n    os.fork()")
    assert result.status == "blocked" and "os.fork" in result.stderr
    result = await sandbox.run("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])")
    assert result.status == "blocked"


async def test_network_attempt_is_refused(sandbox):
    result = await sandbox.run("import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=1)")
    assert result.status == "blocked" and "not allowed" in result.stderr


async def test_network_namespace_alone_blocks_a_host_listener():
    """With the audit-hook layer off, the namespace must still keep the code off the host's loopback."""
    sandbox = PythonSandbox(LIMITS, audit_guard=False)
    if await sandbox.network_isolation() != "netns":
        pytest.skip("no network namespace available here (the audit hook is the guard)")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')"
    result = await sandbox.run(code)
    server.close()
    assert "CONNECTED" not in result.stdout and result.status == "error"
    assert not accepted


async def test_output_flood_is_cut_at_the_limit(sandbox):
    result = await sandbox.run("while True:\n    print('x' * 1000)")
    assert result.status == "output_limit" and len(result.stdout) <= LIMITS.output_bytes


async def test_host_is_unaffected_after_the_bombs(sandbox):
    pid_before = os.getpid()
    for code in ("import os\nos.fork()", "x = ' ' * 10**10", "while True: pass"):
        await sandbox.run(code)
    assert os.getpid() == pid_before
    assert (await sandbox.run("print('still fine')")).stdout == "still fine\n"
    # the sandbox removed its working directories
    assert [d for d in os.listdir(tempfile.gettempdir()) if d.startswith("rollart-sandbox-")] == []


def test_code_extraction_and_harness():
    assert extract_code("here:\n```python\ndef f():\n    return 1\n```\n") == "def f():\n    return 1\n"
    assert extract_code("no code") is None
    harness = build_harness("def add(a, b): return a + b", [parse_test("assert add(1, 2) == 3")], "n0nce")
    assert "'add(1, 2)'" in harness and "'n0nce'" in harness


async def test_code_env_scores_tests_in_the_sandbox():
    env = CodeSandboxEnv(LIMITS, max_attempts=2)
    reset = await env.reset(seed=0)
    assert "add(a, b)" in reset.observation
    wrong = await env.step("```python\ndef add(a, b):\n    return 3\n```")
    assert not wrong.terminated and wrong.reward == pytest.approx(1 / 3) and "1/3" in wrong.observation
    right = await env.step("```python\ndef add(a, b):\n    return a + b\n```")
    # the reward is the improvement of the best score, so the episode's return is the best score
    assert right.terminated and right.reward == pytest.approx(2 / 3) and right.info["success"]
    await env.reset(seed=0)
    evil = await env.step("```python\nimport os\nos.fork()\n```")
    assert evil.reward == 0.0 and evil.info["sandbox_status"] == "blocked"
