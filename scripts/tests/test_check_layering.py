"""`make layering` checks the tree it runs in: a deliberate break in a copy of the tree fails.

Before, `lint-imports` imported `rollart.<pkg>` from the checkout the virtualenv was installed
from, so a layering break in another checkout (a worktree sharing the venv) reported green.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of this tree's package sources, contract and layering script: a separate checkout."""
    for src in sorted((ROOT / "packages").glob("*/src")):
        shutil.copytree(src, tmp_path / src.relative_to(ROOT), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check_layering.py", tmp_path / "scripts" / "check_layering.py")
    return tmp_path


def _layering(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(tree / "scripts" / "check_layering.py")], cwd=tree,
                          capture_output=True, text=True, timeout=300)


def test_a_clean_copy_is_kept_and_analysed_where_it_is(tree_copy):
    run = _layering(tree_copy)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"lint-imports on {tree_copy}" in run.stdout and "0 broken" in run.stdout


def test_a_deliberate_break_in_the_checked_tree_fails(tree_copy):
    env_init = tree_copy / "packages" / "rollart-env" / "src" / "rollart" / "env" / "__init__.py"
    env_init.write_text(env_init.read_text() + "\nimport rollart.scheduler  # deliberate layering break\n")
    run = _layering(tree_copy)
    assert run.returncode != 0
    assert "rollart.env imports no other rollart package BROKEN" in run.stdout, run.stdout + run.stderr
