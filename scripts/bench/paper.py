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
IMG = ROOT / "docs" / "img"
TIMELINE = IMG / "timesharing_timeline.png"  # all runs of `timesharing` in one picture (a full run only)

# (scenario, the paper's figure and claim, how "ours" is read from the runs)
EXPERIMENTS = [
    ("fig4_hardware", "Fig 4", "2 H800 vs 6 H20 (Qwen3-8B, 32K): prefill-heavy FrozenLake on H800 in as little as 0.53x of H20's "
     "rollout time; decode-heavy GEM-Math on H20 in 0.49-0.79x of H800's", "pairs"),
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


# One metric per figure, the paper's (app D66): "step" = mean step time (lower is better), "trained" =
# rollout throughput counting only the trained tokens (higher is better). Per scenario: the metric, the
# paper's headline ratio, the paper's baseline run, the policy runs, and the static search that finds
# the best feasible baseline under the same budget (app D67/D68), or why a figure has none.
HEADLINE: dict[str, dict] = {
    "fig4_hardware": {"metric": "step", "paper": {"frozenlake_2xH800": round(1 / 0.53, 2), "gemmath_6xH20": round(1 / 0.49, 2)}, "baseline": "frozenlake_6xH20",
                      "baselines": {"frozenlake_2xH800": "frozenlake_6xH20", "gemmath_6xH20": "gemmath_2xH800"},
                      "policies": ["frozenlake_2xH800", "gemmath_6xH20"],
                      "no_search": "the figure compares two fixed fleets of equal cost (its knob is the hardware)"},
    "fig12a_env_interaction": {"metric": "step", "paper": 2.27, "baseline": "batch_sigma10", "policies": ["trajectory_sigma10"],
                               "no_search": "both sides run one colocated sync layout (8 H800); the figure's knob is the "
                                            "interaction mode, not a layout"},
    "fig12b_redundancy": {"metric": "step", "paper": 1.62, "baseline": "groups1.0x", "policies": ["groups1.25x", "groups1.5x", "groups2.0x"],
                          "search": {"base": "groups1.0x", "granularity": 2, "coarse": 4, "refine": 1}},
    "fig13_alpha": {"metric": "step", "paper": 1.22, "baseline": "alpha1", "policies": ["alpha2", "alpha4", "alpha6"],
                    "search": {"base": "alpha1", "granularity": 2, "coarse": 4, "refine": 1}},
    "fig11a_affinity": {"metric": "step", "paper": 1.37, "baseline": "h800_only", "policies": ["mixed_affinity", "mixed_6xH800_9xH20"],
                        "search": {"base": "mixed_affinity", "budget": "cost", "rollout_hardware": ["H800", "H20"],
                                   "granularity": 4, "coarse": 4, "refine": 1}},
    "fig10_modes": {"metric": "step", "paper": {"async": 2.05}, "baseline": "sync", "policies": ["one_off", "async"],
                    "search": {"base": "one_off", "granularity": 2, "coarse": 4, "refine": 1}},
    "fig10_modes_32b": {"metric": "step", "paper": {"async": 2.05}, "baseline": "sync", "policies": ["one_off", "async"],
                        "search": {"base": "one_off", "granularity": 2, "coarse": 4, "refine": 1}},
    "fig10_paper_setup": {"metric": "step", "paper": {"StreamRL one_off": 1.52, "RollArt async": 2.05}, "baseline": "veRL+ sync", "policies": ["StreamRL one_off", "RollArt async"],
                          "search": {"base": "StreamRL one_off", "granularity": 16, "coarse": 4, "refine": 1}},
    "timesharing": {"metric": "trained", "paper": 3.5, "baseline": "static_128train_32rollout",
                    "policies": ["timesharing_cost_aware", "timesharing_always_shrink"],
                    "search": {"base": "static_128train_32rollout", "metric": "trained_tokens_per_s", "granularity": 8,
                               "coarse": 4, "refine": 0}},
}


def value(metric: str, r: dict) -> float:
    """The figure's metric of one run row, larger is better (inverse step time, or trained tok/s)."""
    if metric == "step":
        return 1.0 / r["iteration_s"] if r["iteration_s"] else 0.0
    return r.get("trained_tokens_per_s", 0.0)


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")  # a row from before the metric existed reads "nan", not a crash


def gains(name: str, entry: dict) -> list[tuple[str, float, float | None]]:
    """Per policy run: (run, ratio over the paper's baseline, ratio over the best feasible static layout or None)."""
    h = HEADLINE[name]
    by = {r["name"]: r for r in entry["runs"]}
    best = ((entry.get("best_static") or {}).get("best") or {}).get("run")
    out = []
    for p in h["policies"]:
        base = by.get(h.get("baselines", {}).get(p, h["baseline"]))
        if p not in by or base is None:
            continue
        mine = value(h["metric"], by[p])
        out.append((p, _ratio(mine, value(h["metric"], base)), _ratio(mine, value(h["metric"], best)) if best else None))
    return out


def search_options(name: str, spec) -> dict | None:
    """The static search of a scenario (HEADLINE), its budget that of the policy runs (devices or cost)."""
    from rollart.resource.hardware import BUILTIN_HARDWARE

    h = HEADLINE[name]
    if "search" not in h:
        return None
    opts = dict(h["search"])
    budget = opts.pop("budget", "devices")
    policy = next(r for r in spec.runs if r.name == h["policies"][-1])
    config = spec.run_config(policy)
    pools = [(p.hardware, p.devices) for p in config.rollout.pools]
    if budget == "cost":
        cost = sum(BUILTIN_HARDWARE[hw].cost * n for hw, n in pools) + BUILTIN_HARDWARE[config.trainer.hardware].cost * config.trainer.devices
        opts["budget_cost"] = round(cost, 6)
    else:
        opts["budget_devices"] = sum(n for _, n in pools) + config.trainer.devices
    return opts


def run_search(name: str, spec, t0: float) -> dict | None:
    from rollart.app.sim.search import search_spec, search_static

    opts = search_options(name, spec)
    if opts is None:
        return None

    def progress(c) -> None:
        what = c.infeasible or f"{c.result.iteration_s:.1f} s/step, {c.result.trained_tokens_per_s:,.0f} trained tok/s"
        print(f"  {name}/search: {c.name}: {what} ({time.perf_counter() - t0:.0f} s wall)", file=sys.stderr, flush=True)

    found = search_static(spec, search_spec(spec, "static", **opts), on_candidate=progress)
    return found.row()


def run(names: list[str], search: bool = True, runs: bool = True, only_runs: list[str] | None = None) -> dict:
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

        # --run: one run at a time, each row kept as soon as it is done (a long run lost nothing before it)
        for subset in ([[n] for n in only_runs] if only_runs else [None]) if runs else []:
            results = run_scenario(spec, progress, only=subset)
            cache = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # another invocation may have written
            rows = {r["name"]: r for r in cache.get(name, {}).get("runs", [])} if subset else {}
            rows.update({r.name: r.row() for r in results})  # --run: replace these runs, keep the others
            cache[name] = {**cache.get(name, {}), "paper": spec.paper,
                           "runs": [rows[r.name] for r in spec.runs if r.name in rows]}
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(cache, indent=1))  # kept before the search starts
            if name == "timesharing" and not subset:
                plot_roles(results, TIMELINE, title="time-sharing vs static split (virtual time, 160 H800)")
            if name == "timesharing":
                for r in results:  # one role timeline per run
                    plot_roles([r], IMG / f"timesharing_{r.name}.png", title=f"{r.name} (virtual time)")
        found = run_search(name, spec, t0) if search and name in HEADLINE else None
        if found is not None:
            cache = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # another invocation may have written
            cache.setdefault(name, {"paper": spec.paper, "runs": []})["best_static"] = found
            RESULTS.write_text(json.dumps(cache, indent=1))
        print(f"{name}: {time.perf_counter() - t0:.0f} s wall", file=sys.stderr, flush=True)
    return cache


def runs_table(runs: list[dict]) -> list[str]:
    head = ("| run | iter s | batch wait s | tok/s | trained tok/s | rollout util | train util | collected | aborted | "
            "failed | timeouts | switch s | max stale | wall s |")
    lines = [head, "|" + "---|" * 14]
    for r in runs:
        lines.append(f"| {r['name']} | {r['iteration_s']:.1f} | {r['rollout_s']:.1f} | {r['tokens_per_s']:,.0f} | "
                     f"{r.get('trained_tokens_per_s', float('nan')):,.0f} | "
                     f"{r['util_rollout']:.0%} | {r['util_train']:.0%} | {r['collected']} | {r['aborted']} | {r['failed']} | "
                     f"{r['timeouts']} | {r['switch_s']:.2f} | {r['staleness_max']} | {r['wall_s']:.0f} |")
    return lines


def search_table(found: dict) -> list[str]:
    """Every layout the static search tried (app D67), best first marked."""
    budget = f"{found['budget_devices']} devices" if found.get("budget_devices") else f"cost {found['budget_cost']:.2f}/h"
    best = (found.get("best") or {}).get("name")
    lines = [f"Best static layout searched from `{found['base']}` under {budget}, by {found['metric']}:", "",
             "| layout | devices | cost/h | iter s | trained tok/s | |", "|---|---|---|---|---|---|"]
    for c in found["candidates"]:
        r = c.get("run")
        cells = (f"{r['iteration_s']:.1f} | {r.get('trained_tokens_per_s', 0):,.0f}" if r else "- | -")
        mark = "**best**" if c["name"] == best else (f"infeasible: {c['infeasible']}" if c["infeasible"] else "")
        lines.append(f"| {c['name']} | {c['devices']} | {c['cost']:.2f} | {cells} | {mark} |")
    return lines


def headline_cells(name: str, entry: dict) -> tuple[str, str]:
    """'ours over the paper's baseline' and 'ours over the best feasible static layout', in the figure's metric."""
    h = HEADLINE[name]
    unit = "step" if h["metric"] == "step" else "trained tok/s"
    rows = gains(name, entry)
    pairs = h.get("baselines")
    over_base = ", ".join(f"{p}: {b:.2f}x {unit}" + (f" over {pairs[p]}" if pairs else "") for p, b, _ in rows)
    over_base += "" if pairs else f" (over {h['baseline']})"
    found = entry.get("best_static")
    if "no_search" in h:
        over_best = f"n/a: {h['no_search']}"
    elif not found:
        over_best = "not run"
    elif not found.get("best"):
        over_best = "no feasible static layout"
    else:
        over_best = ", ".join(f"{p}: {x:.2f}x {unit}" for p, _, x in rows) + f" (over {found['best']['name']})"
    return over_base, over_best


def render(cache: dict, notes: dict[str, str]) -> str:
    out = [Path(__file__).with_name("paper_intro.md").read_text().rstrip(), "",
           "| experiment | paper's figure | ours over the paper's baseline | ours over the best feasible static layout | plot | "
           "why they differ |", "|---|---|---|---|---|---|"]
    for name, fig, claim, _kind in EXPERIMENTS:
        if name not in cache or not cache[name].get("runs"):
            out.append(f"| {name} | {fig}: {claim} | not run | not run | | {notes.get(name, '')} |")
            continue
        over_base, over_best = headline_cells(name, cache[name])
        if any("cost_per_hour" not in r for r in cache[name]["runs"]):  # rows from before issue 22's cost model
            over_base += " (**stale**: cached before issue 22's cost model; not re-run yet)"
        plot = f"![{name}](img/paper_{name}.png)" if (IMG / f"paper_{name}.png").exists() else ""
        out.append(f"| `{name}` | {fig}: {claim} | {over_base} | {over_best} | {plot} | {notes.get(name, '')} |")
    out += ["", "## Every run", ""]
    for name, fig, _, _ in EXPERIMENTS:
        if name in cache and cache[name].get("runs"):
            out += [f"### `{name}` ({fig})", "", f"`rollart sim examples/scenarios/{name}.yaml`", "",
                    *runs_table(cache[name]["runs"]), ""]
            if cache[name].get("best_static"):
                opts = HEADLINE[name].get("search", {})
                out += [*search_table(cache[name]["best_static"]), "",
                        f"`python scripts/bench/paper.py --only {name} --search-only` (search options: `{json.dumps(opts)}`)", ""]
    scale = Path(__file__).with_name("sim_scale_table.md")
    if scale.exists():
        out += ["## Scale: one multi-turn iteration, 100 -> 3,000 GPUs", "",
                "`python scripts/bench/bench_sim_scale.py --write scripts/bench/sim_scale_table.md` (one iteration of the whole "
                "pipeline: build, every env plays a 3-turn episode, the batch is 80% of the envs, 10% of the GPUs train; "
                "rollout GPUs half H800, half H20; ~3.3 envs per GPU, so 10,000 envs at 3,000 GPUs). Wall time includes "
                "building the pipeline and closing it.", "", scale.read_text().rstrip(), ""]
    shown = [r["name"] for r in cache.get("timesharing", {}).get("runs", []) if (IMG / f"timesharing_{r['name']}.png").exists()]
    if shown:
        out += ["## Device roles, time-sharing vs static split", "",
                "One role timeline per run of `timesharing` (`rollart sim examples/scenarios/timesharing.yaml --run NAME "
                "--timeline PNG`):", ""]
        out += [f"![{n}](img/timesharing_{n}.png)\n" for n in shown]
    return "\n".join(out) + "\n"


def plot_all(cache: dict) -> None:
    """Per figure, bars of the paper's ratio, ours over the paper's baseline and ours over the best static layout."""
    for name, *_ in EXPERIMENTS:
        if name in cache and name in HEADLINE and gains(name, cache[name]):
            plot_figure(name, cache[name])


def plot_figure(name: str, entry: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = HEADLINE[name]
    rows = gains(name, entry)
    fig, ax = plt.subplots(figsize=(2.4 + 1.9 * max(len(rows), 1), 3.4))
    width = 0.26
    for i, (run_name, over_base, over_best) in enumerate(rows):
        claim = h["paper"].get(run_name) if isinstance(h["paper"], dict) else h["paper"]
        if claim is not None:
            ax.bar(i - width, claim, width, color="#999999", label="paper" if i == 0 else None)
        ax.bar(i, over_base, width, color="#1f77b4", label="ours / paper's baseline" if i == 0 else None)
        if over_best is not None:
            ax.bar(i + width, over_best, width, color="#ff7f0e", label="ours / best static" if i == 0 else None)
        for x, v in ((i - width, claim), (i, over_base), (i + width, over_best)):
            if v is not None and v == v:
                ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.set_ylabel("x step time" if h["metric"] == "step" else "x trained tok/s")
    stale = any("cost_per_hour" not in r for r in entry["runs"])
    ax.set_title(f"{name}: higher is better" + (" (STALE: before issue 22's cost model)" if stale else ""), fontsize=9)
    ax.margins(y=0.15)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    fig.tight_layout()
    out = IMG / f"paper_{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], help="scenario name (repeatable)")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--run", action="append", default=[], help="only this run of the scenario (repeatable; "
                        "replaces its row in the cache, keeps the others)")
    parser.add_argument("--no-search", action="store_true", help="skip the best-static-layout search")
    parser.add_argument("--search-only", action="store_true", help="run only the search (keep the cached runs)")
    args = parser.parse_args()
    if args.render_only:
        cache = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    else:
        cache = run(args.only, search=not args.no_search and not args.run, runs=not args.search_only, only_runs=args.run)
    plot_all(cache)
    notes_path = Path(__file__).with_name("paper_notes.json")
    notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    DOC.write_text(render(cache, notes))
    print(DOC)


if __name__ == "__main__":
    main()
