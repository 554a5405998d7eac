"""Cost of one modelled engine step: the roofline before issue 22 vs now (rollart-proxy D44-D46).

Why: `RooflineModel.decode_seconds` runs once per modelled decode step of every SimEngine, the
simulator's hot path; the MoE, tensor-parallel and memory-bound-prefill terms must not make it
slower. The baseline is the file at a git revision (default: the commit before issue 22's part A),
loaded as its own module. Rows: nanoseconds per call (interleaved rounds; median and min-max spread).

    .venv/bin/python scripts/bench/bench_sim_roofline.py [--base 6449aed] [--repeats 9] [--calls 100000]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stats import fmt, ratio_fmt, rounds  # noqa: E402

from rollart.proxy import sim_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PATH = "packages/rollart-proxy/src/rollart/proxy/sim_engine.py"


def load_base(rev: str) -> object:
    """The sim_engine module as it was at `rev`, imported under another name."""
    source = subprocess.run(["git", "show", f"{rev}:{PATH}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="rollart-bench-")) / "sim_engine_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sim_engine_base", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="6449aed")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    base = load_base(args.base)
    models = {
        "base dense": base.RooflineModel(base.QWEN3_8B, 989.5, 3.35),
        "now dense": sim_engine.RooflineModel(sim_engine.QWEN3_8B, 989.5, 3.35),
        "now MoE TP2": sim_engine.RooflineModel(sim_engine.QWEN3_30B_A3B, 989.5, 3.35, tp=2),
    }
    calls = {
        "decode": lambda m: m.decode_seconds(64, 64_000),
        "prefill": lambda m: m.prefill_batch_seconds([(512, 2000)] * 8),
    }
    for op, call in calls.items():
        times: dict[str, list[float]] = {name: [] for name in models}
        for _, name in rounds(list(models), args.repeats):
            step = partial(call, models[name])
            times[name].append(timeit.timeit(step, number=args.calls) / args.calls)
        for name, values in times.items():
            print(f"{op:8s} {name:12s} {fmt(values, '.0f', 1e9)} ns/call")
        print(f"{op:8s} now/base dense {ratio_fmt(times['now dense'], times['base dense'])}")


if __name__ == "__main__":
    main()
