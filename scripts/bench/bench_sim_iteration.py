"""Wall and CPU time of one iteration of one run of a scenario, this tree against a baseline revision.

Why: a full run of the time-sharing scenario took more than 30 min of wall time on the shared
machine (issue 22), so a speed-up of the simulator is stated on one iteration of one run (app D77),
with the run's row printed too: a speed-up that moves a number shows here. Each variant runs in a
fresh interpreter (this tree, and with `--baseline REV` the `packages/` of revision REV extracted with
`git archive`); variants are interleaved per repeat. Reported: wall seconds of the run (build and
close included, imports excluded), CPU seconds of the process (imports included), and the run's
virtual seconds, tokens/s and trained tokens/s.

    python scripts/bench/bench_sim_iteration.py examples/scenarios/timesharing.yaml static_128train_32rollout --baseline e63432f
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_sim_command import ROOT, tree_at

CODE = """
import json, sys, time
from pathlib import Path
from rollart.app.sim.runner import run_scenario
from rollart.app.sim.scenario import load_scenario
spec = load_scenario(Path(sys.argv[1])).model_copy(update={"iterations": int(sys.argv[3]), "warmup": 0})
t0 = time.perf_counter()
[result] = run_scenario(spec, only=[sys.argv[2]])
wall = time.perf_counter() - t0
print("RESULT", json.dumps({"wall_s": wall, "cpu_s": time.process_time(), "virtual_s": result.virtual_s,
                            "tokens_per_s": result.tokens_per_s, "trained_tokens_per_s": result.trained_tokens_per_s}))
"""


def run(tree: Path, scenario: Path, name: str, iterations: int) -> dict:
    """One run of `name` cut to `iterations` iterations, in a fresh interpreter on `tree`'s packages."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((tree / "packages").glob("*/src")))}
    out = subprocess.run([sys.executable, "-c", CODE, str(scenario), name, str(iterations)], env=env,
                         cwd=tempfile.gettempdir(), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    [line] = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", type=Path)
    ap.add_argument("run", help="the run's name in the scenario")
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--baseline", default="", help="git revision to compare with")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    variants = {"this tree": ROOT}
    if args.baseline:
        variants[args.baseline] = tree_at(args.baseline)
    rows: dict[str, list[dict]] = {name: [] for name in variants}
    for rep in range(args.repeats):
        for name, tree in variants.items():
            rows[name].append(run(tree, args.scenario.resolve(), args.run, args.iterations))
            print(f"repeat {rep + 1}: {name}: {rows[name][-1]}", file=sys.stderr, flush=True)
    print(f"`{args.scenario}` run `{args.run}`, {args.iterations} iteration(s), {args.repeats} repeat(s) interleaved\n")
    print("| variant | wall s | CPU s | virtual s | tok/s | trained tok/s |")
    print("|---|---|---|---|---|---|")
    for name, xs in rows.items():
        for x in xs:
            print(f"| {name} | {x['wall_s']:.1f} | {x['cpu_s']:.1f} | {x['virtual_s']:.4f} | {x['tokens_per_s']:.4f} | "
                  f"{x['trained_tokens_per_s']:.4f} |")


if __name__ == "__main__":
    main()
