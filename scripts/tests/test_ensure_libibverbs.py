"""`make test` / `make install` either have libibverbs for the Mooncake tests or say in one line why not.

Shims on PATH stand in for `ldconfig`, `id` and `apt-get`, so each branch of the real script runs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure_libibverbs.sh"


def _shim(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _run(tmp_path: Path, *, lib: bool, uid: int, apt: str | None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "installed"
    if lib:
        state.touch()
    _shim(bin_dir, "ldconfig", f'[ -e {state} ] && echo "libibverbs.so.1 (libc6,x86-64) => /usr/lib/libibverbs.so.1"; exit 0')
    _shim(bin_dir, "id", f"echo {uid}")
    if apt is not None:
        _shim(bin_dir, "apt-get", apt.format(state=state))
    for tool in ("grep", "bash", "sh", "touch"):  # what the script and the shims run, nothing else
        os.symlink(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip(),
                   bin_dir / tool)
    return subprocess.run([str(bin_dir / "bash"), str(SCRIPT)], env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=30)


def test_present_library_prints_nothing(tmp_path):
    run = _run(tmp_path, lib=True, uid=1000, apt=None)
    assert run.returncode == 0 and run.stdout == ""


def test_root_with_apt_installs_it(tmp_path):
    run = _run(tmp_path, lib=False, uid=0, apt='[ "$1" = install ] && touch {state}; exit 0')
    assert run.returncode == 0 and run.stdout.strip() == "make: installed libibverbs1 (needed by the Mooncake tests)"


@pytest.mark.parametrize(("uid", "apt"), [(1000, None), (1000, "exit 0"), (0, None), (0, "exit 100")])
def test_otherwise_one_line_says_the_mooncake_tests_skip(tmp_path, uid, apt):
    run = _run(tmp_path, lib=False, uid=uid, apt=apt)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and len(lines) == 1
    assert "libibverbs.so.1 is missing" in lines[0] and "the Mooncake tests will skip" in lines[0]
