"""CPU time of the whole `rollart sim SCENARIO` command, imports included, against a baseline revision.

Why a command-level bench: the scale target (issue 22) is the CPU of the command a user types, and a
quarter of it was importing torch and transformers, which `bench_sim_scale.py` (one process, many
runs) pays once and hides. Each repeat runs every variant once (interleaved), each in a fresh
interpreter: this tree, and with `--baseline REV` the same command on the tree of git revision REV
(its `packages/` extracted with `git archive` into a temporary directory). Reported per variant:
CPU seconds (user + system of the child, median and min-max), wall seconds, and whether torch /
transformers were imported.

    python scripts/bench/bench_sim_command.py examples/scenarios/scale_3000.yaml --baseline 6449aed --repeats 3
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("import sys\nfrom rollart.app.cli import app\nsys.argv = ['rollart', 'sim', sys.argv[1]]\n"
        "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print('IMPORTED', ','.join(m for m in ('torch', 'transformers') if m in sys.modules) or '-', file=sys.stderr)\n")


def tree_at(rev: str) -> Path:
    """The `packages/` of revision `rev`, extracted into a temporary directory."""
    out = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    archive = subprocess.run(["git", "archive", rev, "packages"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def run(tree: Path, scenario: Path) -> tuple[float, float, str]:
    """(CPU s, wall s, imported) of one `rollart sim` in a fresh interpreter on `tree`'s packages."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((tree / "packages").glob("*/src")))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CODE, str(scenario)], env=env, cwd=tempfile.gettempdir(),
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    imported = [line.split()[1] for line in out.stderr.splitlines() if line.startswith("IMPORTED")]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, imported[-1] if imported else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--baseline", default="", help="git revision to compare with")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    variants = {"this tree": ROOT}
    if args.baseline:
        variants[args.baseline] = tree_at(args.baseline)
    rows: dict[str, list[tuple[float, float, str]]] = {name: [] for name in variants}
    for rep in range(args.repeats):
        for name, tree in variants.items():
            rows[name].append(run(tree, args.scenario.resolve()))
            print(f"repeat {rep + 1}: {name}: {rows[name][-1][0]:.1f} s CPU", file=sys.stderr, flush=True)
    print(f"`rollart sim {args.scenario}`, {args.repeats} repeats interleaved\n")
    print("| variant | CPU s (median) | CPU s (min-max) | wall s (median) | imported |")
    print("|---|---|---|---|---|")
    for name, xs in rows.items():
        cpus, walls = [x[0] for x in xs], [x[1] for x in xs]
        print(f"| {name} | {statistics.median(cpus):.1f} | {min(cpus):.1f}-{max(cpus):.1f} | "
              f"{statistics.median(walls):.1f} | {xs[-1][2]} |")


if __name__ == "__main__":
    main()
