"""Every package logs through `logging` under its own name, and libraries do not print (issue 14, item 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "src").is_dir())
# the command lines and the demo are user interfaces: they write to the terminal
INTERFACES = {"rollart/app/cli.py", "rollart/app/demo.py", "rollart/reward/cli.py"}
# the validation runtime only raises the caller's exception: it has nothing of its own to log
SILENT = {"rollart-checks"}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / "packages" / package / "src").rglob("*.py"))


@pytest.mark.parametrize("package", [p for p in PACKAGES if p not in SILENT])
def test_the_package_has_named_loggers(package):
    named = [f for f in _sources(package) if "logging.getLogger(__name__)" in f.read_text()]
    assert named, f"{package} logs nothing through a named logger"


@pytest.mark.parametrize("package", PACKAGES)
def test_library_code_does_not_print(package):
    printing = []
    for f in _sources(package):
        rel = f.relative_to(ROOT / "packages" / package / "src").as_posix()
        if rel in INTERFACES:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                printing.append(f"{rel}:{node.lineno}")
    assert printing == []
