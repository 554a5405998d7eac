"""No mode shows the answers, no mode leaves files behind (issue 23, item B). Real runs, no mocks.

The process fallback cannot keep world-readable files from the run: a program that opens the
installed task file reads every test and its expected value and scores 1.0 without solving
anything. The code env therefore refuses that mode unless the caller opts in by name
(`allow_unisolated=True`) and warns when it does. Files a run writes in /tmp, /var/tmp and /dev/shm
must not outlive it in any mode.
"""

from __future__ import annotations

import logging
import os
import secrets
from importlib import resources
from pathlib import Path

import pytest

from rollart.env.envs.code_sandbox import CodeSandboxEnv
from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits
from rollart.env.errors import EnvError

LIMITS = SandboxLimits(cpu_s=2, wall_s=6.0, output_bytes=64 * 1024)
ROOT = os.geteuid() == 0
TASK_FILE = str(resources.files("rollart.env.envs").joinpath("data/code_tasks.jsonl"))

# Solves nothing: reads the task file and answers each `add(a, b)` from its expected values.
CHEAT = """
import json, re
TABLE = {}
try:
    for line in open(TASK_FILE_PATH):
        for t in json.loads(line)["tests"]:
            m = re.match(r"assert add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)", t)
            if m:
                TABLE[int(m[1]), int(m[2])] = int(m[3])
except OSError as exc:
    print("NO TASK FILE", exc)
def add(a, b):
    return TABLE.get((a, b), -1)
""".replace("TASK_FILE_PATH", repr(TASK_FILE))


def _block(code: str) -> str:
    return f"```python\n{code}\n```"


async def _has_bwrap() -> bool:
    return await PythonSandbox(LIMITS).containment() == "bwrap"


@pytest.fixture
def readable_task_file():
    """A world-readable copy of the installed task file, under /tmp (mode 1777: every uid can reach it).

    As root the run gets a uid of its own, and a checkout under a 0700 directory (what `mktemp -d` makes,
    where CI clones) hides the installed file from that uid: the cheat would fail for a reason that has
    nothing to do with isolation."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="rollart-public-", dir="/tmp"))
    folder.chmod(0o755)
    copy = folder / "code_tasks.jsonl"
    copy.write_bytes(Path(TASK_FILE).read_bytes())
    copy.chmod(0o644)
    yield str(copy)
    shutil.rmtree(folder, ignore_errors=True)


async def test_the_cheat_really_reads_the_answers_when_the_file_is_readable(readable_task_file):
    """The cheat is not a straw man: with the file readable it answers all three tests."""
    env = CodeSandboxEnv(LIMITS, allow_unisolated=True)
    env.sandbox = PythonSandbox(LIMITS, mode="process")
    await env.reset(seed=0)
    result = await env.step(_block(CHEAT.replace(repr(TASK_FILE), repr(readable_task_file))))
    assert result.info["success"] and result.reward == 1.0, result.info


async def test_process_mode_refuses_code_tasks_unless_the_caller_opts_in(caplog):
    env = CodeSandboxEnv(LIMITS)
    env.sandbox = PythonSandbox(LIMITS, mode="process")
    with pytest.raises(EnvError, match="allow_unisolated"):
        await env.reset(seed=0)
    with pytest.raises(EnvError, match="allow_unisolated"):
        await env.step(_block(CHEAT))
    opted = CodeSandboxEnv(LIMITS, allow_unisolated=True)
    opted.sandbox = PythonSandbox(LIMITS, mode="process")
    with caplog.at_level(logging.WARNING, logger="rollart.env.envs.code_sandbox"):
        await opted.reset(seed=0)
    assert any(r.levelno == logging.WARNING and "task data" in r.getMessage() for r in caplog.records)


async def test_under_bubblewrap_the_task_data_is_not_in_the_file_system():
    if not await _has_bwrap():
        pytest.skip("bubblewrap cannot run here")
    env = CodeSandboxEnv(LIMITS)
    await env.reset(seed=0)
    result = await env.step(_block(CHEAT + "print(len(TABLE))\n"))
    assert result.reward == 0.0 and result.info["containment"] == "bwrap"
    # where an installed (not editable) package would put it: the interpreter's and the system's package dirs
    probe = await env.sandbox.run(
        "import glob, sys\n"
        "pkgs = [sys.prefix + '/lib/python3*/site-packages', '/usr/lib/python3*/dist-packages',\n"
        "        '/usr/local/lib/python3*/dist-packages', '/usr/lib/python3*/site-packages']\n"
        "print(sorted(f for p in pkgs for f in glob.glob(p + '/*'))[:5])\n"
        f"print(sorted(glob.glob({TASK_FILE!r})))\n"
    )
    assert probe.stdout == "[]\n[]\n", probe


def _writer(tag: str) -> str:
    return (
        "import os\n"
        f"for d in ('/tmp', '/var/tmp', '/dev/shm'):\n"
        f"    try:\n"
        f"        os.makedirs(d + '/{tag}-dir/sub', exist_ok=True)\n"
        f"        open(d + '/{tag}-dir/sub/f', 'w').write('x')\n"
        f"        open(d + '/{tag}', 'w').write('x')\n"
        f"        print('WROTE', d)\n"
        f"    except OSError as exc:\n"
        f"        print('NO', d, exc)\n"
    )


SHARED = ("/tmp", "/var/tmp", "/dev/shm")


def _plant_bystanders(tag: str) -> list[Path]:
    paths = [Path(d, tag + "-bystander") for d in SHARED if os.path.isdir(d)]
    for path in paths:  # another process's files, created while the run lives: they must stay
        path.write_text("mine")
    return paths


def _leftovers(tag: str) -> list[str]:
    return [str(p) for d in SHARED for p in Path(d).glob(tag + "*") if not p.name.endswith("-bystander")]


@pytest.mark.parametrize("mode", ["bwrap", "process"])
async def test_files_a_run_writes_in_tmp_var_tmp_and_dev_shm_do_not_outlive_it(mode):
    if mode == "process" and not ROOT:
        pytest.skip("without root the process fallback has no uid of its own to tell its files by")
    if mode == "bwrap" and not await _has_bwrap():
        pytest.skip("bubblewrap cannot run here")
    tag = "rollart-leak-" + secrets.token_hex(4)
    bystanders = _plant_bystanders(tag)
    try:
        result = await PythonSandbox(LIMITS, mode=mode, audit_guard=False).run(_writer(tag))
        assert result.status == "ok" and result.stdout.count("WROTE") >= 1, result
        assert _leftovers(tag) == []
        assert [p.read_text() for p in bystanders] == ["mine"] * len(bystanders)
    finally:
        for path in bystanders:
            path.unlink(missing_ok=True)
