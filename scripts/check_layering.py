"""Run the layering contract (`lint-imports`) on the tree this script lives in, not the venv's checkout.

The virtualenv holds editable installs of one checkout (`.pth` files pointing at its
packages/*/src). Run bare from another checkout (a git worktree sharing the venv),
`lint-imports` imports `rollart.<pkg>` from the *installed* checkout and reports on it, so a
layering break in the tree being checked passes. This script puts this tree's packages/*/src
first on PYTHONPATH, verifies that every root package of the contract now resolves inside this
tree (and fails loudly if not), then runs `lint-imports` without its cache.

    python scripts/check_layering.py        # == make layering
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import importlib.util, json, sys
out = {}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    out[name] = None if spec is None or spec.origin is None else spec.origin
print(json.dumps(out))
"""


def tree_pythonpath(root: Path) -> str:
    """This tree's package sources first, then whatever PYTHONPATH held."""
    srcs = [str(p) for p in sorted((root / "packages").glob("*/src"))]
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(srcs + ([rest] if rest else []))


def outside_tree(root: Path, env: dict[str, str], names: list[str]) -> list[str]:
    """Root packages that would be imported from somewhere other than `root` (empty when all is well)."""
    import json

    probe = subprocess.run([sys.executable, "-c", PROBE, *names], env=env, capture_output=True, text=True, check=True)
    found = json.loads(probe.stdout)
    return [f"{name} -> {origin}" for name, origin in found.items()
            if origin is None or not Path(origin).resolve().is_relative_to(root)]


def main(argv: list[str] | None = None) -> int:
    root = Path(argv[0]).resolve() if argv else ROOT
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    env = {**os.environ, "PYTHONPATH": tree_pythonpath(root)}
    stray = outside_tree(root, env, list(config["root_packages"]))
    if stray:
        print(f"layering: these packages would not be analysed from {root}: {stray}", file=sys.stderr)
        return 1
    lint_imports = Path(sys.executable).parent / "lint-imports"
    cmd = [str(lint_imports), "--config", str(root / "pyproject.toml"), "--no-cache"]
    print(f"layering: lint-imports on {root}")
    return subprocess.run(cmd, cwd=root, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
