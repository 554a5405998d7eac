"""Issue 14 item 1: every README snippet runs as written; every install command names what it needs.

The Python snippets run here in the current venv (seconds each); `scripts/check_install_alone.py`
(the slow test in test_monorepo.py, `make install-alone`) runs the install commands as written in
empty venvs and the snippets again there.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from readme_snippets import PACKAGES, install_commands, run_snippet, runnable, snippets  # noqa: E402

SNIPPETS = [s for p in PACKAGES for s in runnable(p)]


@pytest.mark.parametrize("snip", SNIPPETS, ids=[f"{s.package}:README.md:{s.line}" for s in SNIPPETS])
def test_readme_python_snippet_runs_as_written(snip):
    res = run_snippet(snip, timeout=600)
    assert res.returncode == 0, f"{snip.package}/README.md:{snip.line} failed:\n{res.stderr[-3000:]}"


def _deps(package: str, extras: set[str]) -> tuple[set[str], bool]:
    """(rollart distributions `package[extras]` needs, transitively; whether torch is among its deps)."""
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    needed, torch = set(), False
    for req in reqs:
        m = re.match(r"(rollart-\w+)(?:\[([\w,]+)\])?", req)
        if m:
            sub, sub_torch = _deps(m[1], set((m[2] or "").split(",")) - {""})
            needed |= {m[1]} | sub
            torch |= sub_torch
        torch |= re.match(r"torch\b", req) is not None
    return needed, torch


@pytest.mark.parametrize("package", PACKAGES)
def test_install_commands_name_every_sibling_and_pin_torch(package):
    commands = install_commands(package)
    assert commands, f"{package}/README.md has no `pip install` command"
    pinned = False
    for cmd in commands:
        args = [a.strip("\"'") for a in cmd.split()[2:]]
        assert all(a == "torch==2.13.0" for a in args if re.match(r"torch\b", a)), f"unpinned torch: {cmd}"
        if cmd.startswith("pip install torch==2.13.0"):
            pinned = True
            continue
        named = {m[1]: set((m[2] or "").split(",")) - {""}
                 for m in re.finditer(r"packages/(rollart-\w+)(?:\[([\w,]+)\])?", cmd)}
        assert package in named, f"{cmd!r} does not install {package}"
        for pkg, extras in named.items():
            needed, torch = _deps(pkg, extras)
            missing = needed - set(named)
            assert not missing, f"{cmd!r}: pip cannot find {sorted(missing)} (not on an index); name them too"
            assert not torch or pinned, f"{cmd!r} pulls torch: `pip install torch==2.13.0` must come first"


def test_every_python_snippet_either_runs_or_says_why_not():
    for package in PACKAGES:
        for snip in snippets(package):
            if snip.lang == "python" and snip.skip_reason is not None:
                assert len(snip.skip_reason) > 10, f"{package}/README.md:{snip.line}: give the reason"
