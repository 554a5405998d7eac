"""Cross-package rules of the monorepo: namespace, metadata, declared dependencies follow layering."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("checks", "resource", "env", "reward", "proxy", "sync", "train", "scheduler", "app")
# single-module distributions: src/rollart/<name>.py instead of a package folder
MODULES = {"checks"}
# design/000-overview.md §2: which rollart distributions each one may depend on
# (rollart-checks, the validation runtime, is at the bottom: every package may depend on it)
ALLOWED = {
    "checks": set(),
    "resource": {"checks"},
    "env": {"checks"},
    "reward": {"checks", "env", "resource"},
    "proxy": {"checks", "resource"},
    "sync": {"checks", "resource"},
    "train": {"checks", "resource"},
    "scheduler": {"checks", "resource", "env", "proxy", "train"},
    "app": {"checks", "resource", "env", "reward", "proxy", "sync", "train", "scheduler"},
}


def _pyproject(pkg: str) -> dict:
    return tomllib.loads((ROOT / "packages" / f"rollart-{pkg}" / "pyproject.toml").read_text())


def test_no_rollart_init_anywhere_pep420():
    offenders = [p for p in ROOT.glob("packages/*/src/rollart/__init__.py")]
    assert offenders == []


@pytest.mark.parametrize("pkg", PACKAGES)
def test_package_layout_and_metadata(pkg):
    base = ROOT / "packages" / f"rollart-{pkg}"
    meta = _pyproject(pkg)["project"]
    assert meta["name"] == f"rollart-{pkg}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", meta["version"])
    if pkg in MODULES:  # one module in the namespace: no folder, so no py.typed (PEP 561 marks packages)
        required: tuple[str, ...] = ("README.md", "CHANGELOG.md", f"src/rollart/{pkg}.py")
        init_path = base / "src" / "rollart" / f"{pkg}.py"
    else:
        required = ("README.md", "CHANGELOG.md", f"src/rollart/{pkg}/py.typed", f"src/rollart/{pkg}/__init__.py")
        init_path = base / "src" / "rollart" / pkg / "__init__.py"
    for rel in required:
        assert (base / rel).is_file(), f"rollart-{pkg} lacks {rel}"
    assert (base / "tests").is_dir()
    init = init_path.read_text()
    assert f'__version__ = "{meta["version"]}"' in init, "package __version__ must match pyproject version"


@pytest.mark.parametrize("pkg", PACKAGES)
def test_declared_rollart_dependencies_follow_layering_with_ranges(pkg):
    deps = _pyproject(pkg)["project"].get("dependencies", [])
    rollart = {}
    for dep in deps:
        m = re.match(r"rollart-(\w+)(\[[\w,]+\])?(.*)", dep)
        if m:
            rollart[m[1]] = m[3]
    assert set(rollart) <= ALLOWED[pkg], f"rollart-{pkg} depends on {set(rollart) - ALLOWED[pkg]}"
    for name, spec in rollart.items():
        assert ">=" in spec and "<" in spec.replace("<=", ""), f"rollart-{name} needs a version range, got {spec!r}"


def test_heavy_backends_are_optional_extras_only():
    heavy = {"vllm", "megatron-core", "mooncake-transfer-engine"}
    for pkg in PACKAGES:
        deps = {re.split(r"[<>=\[ ;]", d)[0] for d in _pyproject(pkg)["project"].get("dependencies", [])}
        assert not deps & heavy, f"rollart-{pkg} must keep {deps & heavy} behind an extra"


def test_layering_contract_holds():
    # through the script `make layering` runs: it analyses this checkout, not the venv's (issue 13)
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layering.py")], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_each_package_installs_alone_into_an_empty_venv():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_install_alone.py")],
                         capture_output=True, text=True, cwd=ROOT, timeout=3600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert res.stdout.count(" ok ") == len(PACKAGES) + 1, res.stdout  # + the wheelhouse route


def test_repository_stands_alone_no_outside_references():
    """Issue 14 item 2: docs and source cite design/000-overview.md, never a file outside the repo."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    needles = ("../" + "shared", "ARCHITECTURE" + ".md", "ARCHITECTURE" + " §", "ARCHITECTURE" + " section")
    offenders = []
    for rel in listed.split():
        path = ROOT / rel
        if path.is_symlink() or path.suffix not in {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg"}:
            continue
        text = path.read_text(errors="replace")
        offenders += [f"{rel}: {n}" for n in needles if n in text]
    assert offenders == []
