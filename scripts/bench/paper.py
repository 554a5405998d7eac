"""Run the committed paper scenarios with `rollart sim` and write the comparison table to docs/simulator.md.

Every scenario runs the real builder and Pipeline in virtual time with the simulated parts (SimEngine
workers behind the real LLMProxy, SimTrainer, SimChannel, synthetic envs); cost constants come from
the hardware catalogue and the formulas of design/rollart-app.md D22, never tuned per scenario.

    python scripts/bench/paper.py                       # all scenarios (~20-40 min on 2 busy cores)
    python scripts/bench/paper.py --only fig10_modes    # one
    python scripts/bench/paper.py --render-only         # re-write the markdown from docs/simulator-results.json

Results are cached per scenario in docs/simulator-results.json (so a partial run keeps what finished).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "simulator-results.json"
DOC = ROOT / "docs" / "simulator.md"
TIMELINE = ROOT / "docs" / "img" / "timesharing_timeline.png"

# (scenario, the paper's figure and claim, how "ours" is read from the runs)
EXPERIMENTS = [
    ("fig12a_env_interaction", "Fig 12a", "trajectory- vs batch-level env interaction, N(10, sigma): 1.23x (sigma=1) -> 2.27x (sigma=10)",
     "pairs"),
    ("fig12b_redundancy", "Fig 12b", "redundant env rollouts: up to 1.62x", "vs_first_iter"),
    ("fig13_alpha", "Fig 13", "async bound alpha 1..6: at most 1.22x over alpha=1, then flat", "vs_first_iter"),
    ("fig11a_affinity", "Fig 11a", "mixed H800+H20 with affinity: 1.12-1.37x over H800-only, 1.30-1.68x over H20-only",
     "vs_last_iter"),
    ("fig10_modes", "Fig 10", "sync vs one_off vs async: async 2.05x faster per step than sync", "vs_first_iter"),
    ("fig10_modes_32b", "Fig 10 (Qwen3-32B)", "the same comparison on the paper's Fig 10a model, long-tailed turns", "vs_first_iter"),
    ("fig10_paper_setup", "Fig 10a (the paper's setup)", "Qwen3-32B on 128 GPUs: RollArt async (32 H800 train; 64 H800 + 32 H20 "
     "rollout with affinity) 2.05x shorter steps than veRL+ (sync, 128 H800) and 1.35x than StreamRL (one_off); StreamRL 1.52x "
     "over veRL+", "vs_first_and_previous"),
    ("timesharing", "time-sharing blog", "160 GPUs, time-sharing vs static 128 train / 32 rollout: 3.5x rollout throughput, "
     "timeouts eliminated", "vs_first_tps"),
]


def run(names: list[str]) -> dict:
    from rollart.app.sim.runner import plot_roles, run_scenario
    from rollart.app.sim.scenario import load_scenario

    cache = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name, *_ in EXPERIMENTS:
        if names and name not in names:
            continue
        spec = load_scenario(ROOT / "examples" / "scenarios" / f"{name}.yaml")
        t0 = time.perf_counter()

        def progress(run: str, rec: dict, name: str = name, t0: float = t0) -> None:
            print(f"  {name}/{run}: iteration {rec['iteration']} at {rec['t_end']:.0f} virtual s "
                  f"({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr, flush=True)

        results = run_scenario(spec, progress)
        cache = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # another invocation may have written
        cache[name] = {"paper": spec.paper, "runs": [r.row() for r in results]}
        if name == "timesharing":
            plot_roles(results, TIMELINE, title="time-sharing vs static split (virtual time, 160 H800)")
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(cache, indent=1))
        print(f"{name}: {time.perf_counter() - t0:.0f} s wall", file=sys.stderr, flush=True)
    return cache


def ours(kind: str, runs: list[dict]) -> str:
    """The scenario's headline ratios, read the same way as the paper's figure."""
    if kind == "pairs":  # trajectory vs batch at each sigma: batch wait time ratio
        by = {r["name"]: r for r in runs}
        parts = []
        for r in runs:
            if r["name"].startswith("trajectory_"):
                sigma = r["name"].removeprefix("trajectory_")
                b = by.get(f"batch_{sigma}")
                if b:
                    parts.append(f"{sigma.replace('sigma', 'sigma=')}: {b['rollout_s'] / r['rollout_s']:.2f}x")
        return ", ".join(parts)
    if kind == "vs_first_iter":
        base = runs[0]
        return ", ".join(f"{r['name']}: {base['iteration_s'] / r['iteration_s']:.2f}x" for r in runs[1:])
    if kind == "vs_last_iter":
        last = runs[-1]
        return ", ".join(f"over {r['name']}: {r['iteration_s'] / last['iteration_s']:.2f}x step, "
                         f"{last['tokens_per_s'] / r['tokens_per_s']:.2f}x tok/s" for r in runs[:-1])
    if kind == "vs_first_and_previous":  # Fig 10a: each run over the baseline, and the last over the one before it
        base, parts = runs[0], []
        for r in runs[1:]:
            parts.append(f"{r['name']}: {base['iteration_s'] / r['iteration_s']:.2f}x step, "
                         f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x tok/s over {base['name']}")
        if len(runs) > 2:
            last, prev = runs[-1], runs[-2]
            parts.append(f"{last['name']} over {prev['name']}: {prev['iteration_s'] / last['iteration_s']:.2f}x step")
        return "; ".join(parts)
    base = runs[0]
    return ", ".join(f"{r['name']}: {r['tokens_per_s'] / base['tokens_per_s']:.2f}x tok/s, timeouts {r['timeouts']} "
                     f"(static {base['timeouts']})" for r in runs[1:])


def runs_table(runs: list[dict]) -> list[str]:
    head = ("| run | iter s | batch wait s | tok/s | rollout util | train util | collected | aborted | failed | "
            "timeouts | switch s | max stale | wall s |")
    lines = [head, "|" + "---|" * 13]
    for r in runs:
        lines.append(f"| {r['name']} | {r['iteration_s']:.1f} | {r['rollout_s']:.1f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['util_rollout']:.0%} | {r['util_train']:.0%} | {r['collected']} | {r['aborted']} | {r['failed']} | "
                     f"{r['timeouts']} | {r['switch_s']:.2f} | {r['staleness_max']} | {r['wall_s']:.0f} |")
    return lines


def render(cache: dict, notes: dict[str, str]) -> str:
    out = [Path(__file__).with_name("paper_intro.md").read_text().rstrip(), "",
           "| experiment | paper's figure | ours | why they differ |", "|---|---|---|---|"]
    for name, fig, claim, kind in EXPERIMENTS:
        if name not in cache:
            out.append(f"| {name} | {fig}: {claim} | not run | {notes.get(name, '')} |")
            continue
        out.append(f"| `{name}` | {fig}: {claim} | {ours(kind, cache[name]['runs'])} | {notes.get(name, '')} |")
    out += ["", "## Every run", ""]
    for name, fig, _, _ in EXPERIMENTS:
        if name in cache:
            out += [f"### `{name}` ({fig})", "", f"`rollart sim examples/scenarios/{name}.yaml`", "",
                    *runs_table(cache[name]["runs"]), ""]
    scale = Path(__file__).with_name("sim_scale_table.md")
    if scale.exists():
        out += ["## Scale: one multi-turn iteration, 100 -> 3,000 GPUs", "",
                "`python scripts/bench/bench_sim_scale.py --write scripts/bench/sim_scale_table.md` (one iteration of the whole "
                "pipeline: build, every env plays a 3-turn episode, the batch is 80% of the envs, 10% of the GPUs train; "
                "rollout GPUs half H800, half H20; ~3.3 envs per GPU, so 10,000 envs at 3,000 GPUs). Wall time includes "
                "building the pipeline and closing it.", "", scale.read_text().rstrip(), ""]
    if TIMELINE.exists():
        out += ["## Device roles, time-sharing vs static split", "",
                "![device roles over virtual time](img/timesharing_timeline.png)", ""]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], help="scenario name (repeatable)")
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    cache = json.loads(RESULTS.read_text()) if args.render_only and RESULTS.exists() else run(args.only)
    notes_path = Path(__file__).with_name("paper_notes.json")
    notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    DOC.write_text(render(cache, notes))
    print(DOC)


if __name__ == "__main__":
    main()
