"""Steps 21-24 (D22-D24): `rollart sim` runs the one builder and Pipeline with simulated parts in virtual time.

The parts are simulations, named so: SimEngine workers behind the real LLMProxy, SimTrainer, SimChannel,
synthetic envs in real EnvManagers. Nothing here claims a wall-time figure (those are in scripts/bench).
"""

from __future__ import annotations

import gc
import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.app.sim.runner import SIM_GC_THRESHOLD, RunResult, run_one, run_scenario, simulation_gc
from rollart.app.sim.scenario import parse_scenario
from rollart.proxy.sim_engine import QWEN3_8B, RooflineModel
from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.scheduler.buffer import BUFFERED, CONSUMED, group_task
from rollart.scheduler.errors import ConfigError, SchedulerError
from rollart.sync.sim import transfer_seconds
from rollart.train.sim_trainer import train_step_cost

H800, H20 = BUILTIN_HARDWARE["H800"], BUILTIN_HARDWARE["H20"]


def scenario(**over) -> dict:
    base = {
        "name": "tiny",
        "seed": 1,
        "iterations": 3,
        "warmup": 1,
        "config": {
            "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4, "redundancy": 1.5,
                         "get_batch_timeout_s": 1e6, "update_timeout_s": 600},
            "model": {"sim_model": "Qwen3-8B"},
            "rollout": {"pools": [{"name": "r", "hardware": "H800", "devices": 4, "engine": "sim", "max_num_seqs": 32,
                                   "engine_args": {"decode_quantum_s": 0.5}}]},
            "trainer": {"backend": "sim", "devices": 4, "hardware": "H800"},  # 3 at least hold Qwen3-8B (D61)
            "sync": {"channel": "sim"},
            "tasks": [{"env": "synthetic", "reward": "synthetic", "max_turns": 8, "max_tokens": 512, "env_timeout_s": 10000}],
        },
        "workload": {"turns": {"kind": "gaussian", "mean": 3, "std": 1}, "prompt_tokens": 64, "observation_tokens": 16,
                     "response_tokens": {"kind": "lognormal", "mean": 24, "std": 0.5, "max": 128},
                     "step_latency": {"kind": "gaussian", "mean": 400, "std": 200}},
        "runs": [{"name": "a"}],
    }
    for key, value in over.items():
        if key in base["config"]:
            base["config"][key] = {**base["config"][key], **value}
        else:
            base[key] = value
    return base


def test_an_hour_of_virtual_time_runs_in_seconds_and_is_deterministic_for_a_seed():
    spec = parse_scenario(scenario(iterations=6))
    first, second = run_scenario(spec), run_scenario(spec)
    assert first[0].virtual_s >= 3600  # hours of env latency, a few seconds of wall time for the whole test
    rows = [{k: v for k, v in r.row().items() if k != "wall_s"} for r in (*first, *second)]
    assert rows[0] == rows[1]  # the same table twice
    assert first[0].history == second[0].history
    other = run_one(parse_scenario(scenario(seed=2, iterations=6)), spec.runs[0])
    assert other.virtual_s != first[0].virtual_s


def test_cost_model_matches_hand_computed_roofline_figures():
    # train step: 6 P T / (n F mfu) + ring all-reduce 2 (n-1)/n x 2 P bytes over the NIC beyond one node
    cost = train_step_cost(8.2e9, 1_000_000, 128, H800)
    assert cost.compute_s == pytest.approx(6 * 8.2e9 * 1e6 / (128 * 989.5e12 * 0.4))  # 0.3108 s
    assert cost.allreduce_s == pytest.approx(2 * 127 / 128 * 16.4e9 / 50e9)  # 0.6509 s
    assert train_step_cost(8.2e9, 1000, 8, H800).allreduce_s == pytest.approx(2 * 7 / 8 * 16.4e9 / 400e9)  # NVLink
    # decode step of Qwen3-8B on H20, batch 1, 1000 tokens of context: memory bound
    kv = 2 * 36 * 8 * 128 * 2
    assert RooflineModel(QWEN3_8B, H20.tflops_bf16, H20.hbm_tbps).decode_seconds(1, 1000) == pytest.approx(
        0.002 + (16.4e9 + kv * 1000) / (4.0e12 * 0.7))
    # prefill of 8192 new tokens on H800: compute bound
    assert RooflineModel(QWEN3_8B, H800.tflops_bf16, H800.hbm_tbps).prefill_seconds(8192, 0) == pytest.approx(
        0.002 + (2 * 8.2e9 * 8192 + 4 * 36 * 4096 * 8192 * 4096) / (989.5e12 * 0.5))
    # weight sync: 64 MiB buckets, 1e-4 s each, over the trainer NIC (50 GB/s)
    assert transfer_seconds(16.4e9, 50.0, 64 << 20) == pytest.approx(math.ceil(16.4e9 / (64 << 20)) * 1e-4 + 16.4e9 / 50e9)


def test_the_builder_wires_the_cost_models_into_the_pipeline():
    result = run_one(parse_scenario(scenario(iterations=2)), parse_scenario(scenario()).runs[0])
    rec = result.history[-1]
    publish = transfer_seconds(16.4e9, H800.network_gbps, 64 << 20)
    load = 16.4e9 / 25e9  # SimEngine.load_weights over its host link
    assert rec["sync_s"] == pytest.approx(publish + load)
    assert rec["sync_bytes"] == pytest.approx(16.4e9)
    assert 0 < rec["train_s"] < 60 and result.rollout_devices == 4 and result.train_devices == 4


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["sync", "one_off", "async", "time_sharing"]), alpha=st.integers(1, 3),
       group=st.sampled_from([2, 4]), redundancy=st.sampled_from([1.0, 1.5, 2.0]), fail=st.sampled_from([0.0, 0.1]),
       batch_level=st.booleans(), seed=st.integers(0, 100))
@example(mode="sync", alpha=1, group=4, redundancy=2.0, fail=0.1, batch_level=True, seed=4)  # stalled before D62
@example(mode="sync", alpha=1, group=4, redundancy=2.0, fail=0.1, batch_level=False, seed=4)
def test_every_trajectory_is_accounted_once_and_the_bound_holds(mode, alpha, group, redundancy, fail, batch_level, seed):
    alpha = {"sync": 0, "one_off": 1}.get(mode, alpha)
    spec = parse_scenario(scenario(
        seed=seed, iterations=3,
        pipeline={"mode": mode, "alpha": alpha, "group_size": group, "redundancy": redundancy,
                  "env_interaction": "batch" if batch_level else "trajectory"},
        workload={"turns": {"kind": "gaussian", "mean": 2, "std": 1}, "prompt_tokens": 32, "observation_tokens": 8,
                  "response_tokens": {"kind": "lognormal", "mean": 12, "std": 0.5, "max": 64},
                  "step_latency": {"kind": "lognormal", "mean": 20, "std": 1.0, "max": 600}, "failure_prob": fail}))
    r = run_one(spec, spec.runs[0])
    assert r.collected == 3 * 8  # exactly the batches; a FAILED trajectory is never collected
    assert r.seen == r.collected + r.aborted + r.failed + r.in_buffer  # each trajectory in exactly one bucket
    assert r.staleness_max <= alpha
    assert all(h["trajectories"] == 8 and h["staleness_max"] <= alpha for h in r.history)
    generated = sum(h["tokens_per_s"] * h["step_time_s"] for h in r.history)
    assert 0 < sum(h["trained_tokens"] for h in r.history) <= generated + 1e-6  # trained ones were generated first


def test_trained_tokens_count_only_the_batches_and_exclude_discarded_rollouts():
    """Scheduler D58 / app D66: the time-sharing metric. Redundant groups (2x) are generated and then
    discarded, so the trained-token rate is below the generated one; before, only the generated one existed."""
    spec = parse_scenario(scenario(iterations=4, pipeline={"redundancy": 2.0}))
    r = run_one(spec, spec.runs[0])
    assert r.aborted > 0
    assert 0 < r.trained_tokens_per_s < r.tokens_per_s
    window = r.history[spec.warmup:]
    span = r.virtual_s - r.history[spec.warmup - 1]["t_end"]
    assert r.trained_tokens_per_s == pytest.approx(sum(h["trained_tokens"] for h in window) / span)
    assert all(h["trained_tokens"] >= h["trajectories"] for h in r.history)  # every trajectory answered once or more


@pytest.mark.parametrize("mode", ["async", "one_off"])
def test_slots_start_no_group_while_their_task_has_enough_outstanding(mode, tmp_path):
    """D44, with fast envs and a slow train step. Before, every slot kept starting groups: complete groups piled
    up (15 for a task whose limit is 4) and went stale (136 of 204 trajectories in async; 32 of 72 now)."""
    from collections import Counter

    from rollart.app.builder import build_pipeline
    from rollart.app.sim.runner import _cancel_leftovers
    from rollart.resource.virtual_time import run_virtual

    data = scenario(
        iterations=4,
        pipeline={"mode": mode, "alpha": 1, "batch_size": 8, "group_size": 4, "redundancy": 1.5},
        # a slow train step that fits (rollart-app D61: one H800 cannot hold Qwen3-32B's trainer; 9 H20 can)
        model={"sim_model": "Qwen3-32B"}, trainer={"backend": "sim", "devices": 9, "hardware": "H20"},
        workload={"turns": 1, "prompt_tokens": 2000, "observation_tokens": 8, "response_tokens": 8, "step_latency": 0.01})
    data["config"]["tasks"] = [{"env": "synthetic", "reward": "synthetic", "tag": t, "max_turns": 2, "max_tokens": 64,
                                "env_timeout_s": 600} for t in ("a", "b")]
    spec = parse_scenario(data)
    config = spec.run_config(spec.runs[0])

    async def go():
        pipe = await build_pipeline(config, tmp_path, tensorboard=False)
        buffer, rollout = pipe.parts.buffer, pipe.parts.rollout
        limits = dict(rollout.room_limits)
        peak_complete, peak_outstanding = Counter(), Counter()

        def watch(_):
            members = Counter(r.group_id for r in buffer.records().values() if r.state == BUFFERED)
            complete = Counter(group_task(g) for g, n in members.items() if n == buffer.group_size)
            for t in limits:
                peak_complete[t] = max(peak_complete[t], complete[t])
                peak_outstanding[t] = max(peak_outstanding[t], buffer.outstanding(t))

        buffer.observe(watch)
        try:
            await pipe.run(config.run.iterations)
            watch(None)
            records = buffer.records()
        finally:
            rollout.pause_launches()
            await rollout.abort_inflight("test over")
            await pipe.close()
        await _cancel_leftovers()
        return limits, peak_complete, peak_outstanding, records

    limits, peak_complete, peak_outstanding, records = run_virtual(go(), seed=1).result
    assert len(limits) == 2 and all(peak_complete[t] >= 1 for t in limits)
    assert sum(1 for r in records.values() if r.state == CONSUMED) == 4 * 8  # every batch was still filled
    assert all(peak_complete[t] <= peak_outstanding[t] <= limits[t] for t in limits), (peak_complete, peak_outstanding, limits)


def test_batch_level_interaction_waits_for_the_slowest_env_every_turn():
    spec = parse_scenario(scenario(
        iterations=3, pipeline={"mode": "sync", "alpha": 0, "redundancy": 1.0, "batch_size": 16, "group_size": 2},
        workload={"turns": 3, "prompt_tokens": 32, "observation_tokens": 8, "response_tokens": 16,
                  "step_latency": {"kind": "gaussian", "mean": 100, "std": 100}},
        runs=[{"name": "trajectory"}, {"name": "batch", "set": {"pipeline.env_interaction": "batch"}}]))
    traj, batch = run_scenario(spec)
    assert batch.rollout_s > 1.15 * traj.rollout_s  # E[sum of per-turn maxima] > E[max of per-trajectory sums]


@pytest.mark.parametrize("over, field", [
    ({"iteratons": 3}, "iteratons"),
    ({"workload": {"step_latecy": 1}}, "workload.step_latecy"),
    ({"workload": {"turns": {"kind": "poisson", "mean": 3}}}, "workload.turns"),
    ({"pipeline": {"modee": "async"}}, "config.pipeline.modee"),
    ({"trainer": {"backend": "torch"}}, "trainer.backend"),
    ({"runs": [{"name": "a", "set": {"pipeline.alpha": -1}}]}, "config.pipeline.alpha"),
    ({"runs": [{"name": "a", "set": {"workload.turns.sdt": 1}}]}, "runs.a.set.workload.turns"),
    ({"runs": [{"name": "a", "sett": {}}]}, "runs.0.sett"),
    ({"tasks": [{"env": "synthetic", "reward": "synthetic", "env_args": {"latency": 3}}]}, "config.tasks.0.env_args.latency"),
])
def test_scenario_errors_name_the_field(over, field):
    data = scenario()
    for key, value in over.items():
        if key in ("pipeline", "trainer"):
            data["config"][key].update(value)
        elif key == "tasks":
            data["config"]["tasks"] = value
        else:
            data[key] = value
    with pytest.raises(ConfigError) as err:
        parse_scenario(data)
    assert field in str(err.value)


def test_rollart_sim_cli_prints_json_and_writes_the_timeline(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(scenario(iterations=2, runs=[{"name": "async"}, {"name": "ts", "set": {
        "pipeline.mode": "time_sharing", "time_sharing.policy": "always_shrink"}}])))
    png = tmp_path / "t.png"
    out = CliRunner().invoke(app, ["sim", str(path), "--json", "--timeline", str(png)])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout[out.stdout.index("{"):])
    assert [r["name"] for r in data["runs"]] == ["async", "ts"] and png.stat().st_size > 1000
    assert data["runs"][1]["switch_s"] > 0 and data["runs"][0]["switch_s"] == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nruns: [{name: a}]\nconfig: {}\nbogus: 1\n")
    out = CliRunner().invoke(app, ["sim", str(bad)])
    assert out.exit_code == 2 and "bogus" in out.output


def _result(name: str, iteration_s: float, tokens_per_s: float) -> RunResult:
    return RunResult(name=name, iterations=1, virtual_s=iteration_s, wall_s=0.5, iteration_s=iteration_s,
                     rollout_s=iteration_s / 2, tokens_per_s=tokens_per_s, util_rollout=0.97, util_train=0.43,
                     collected=512, aborted=3, failed=1, timeouts=2, in_buffer=0, switch_s=5.25, rollout_devices=32,
                     train_devices=128, staleness_max=1, alpha=1)


@pytest.mark.parametrize("width", [80, 250])
def test_the_run_table_shows_every_cell_whole_in_a_narrow_or_a_wide_terminal(width):
    """Row per run where it fits; transposed where it does not. Before, an 80-column terminal got "…" cells."""
    import io

    from rich.console import Console

    from rollart.app.sim.runner import COLUMNS, render

    spec = parse_scenario(scenario(paper="Fig X: 2.00x"))
    console = Console(file=io.StringIO(), width=width, record=True)
    render(spec, [_result("static", 300.0, 1000.0), _result("shared", 100.0, 3000.0)], console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    for head in [h for _, h, _ in COLUMNS] + ["x iter (vs first)", "x tok/s (vs first)"]:
        assert head in text
    for cell in ("static", "shared", "3.00x", "3,000", "97%", "43%", "5.25", "512"):
        assert cell in text
    shared_line = next(line for line in text.splitlines() if "shared" in line)
    # wide: the run's own row carries its numbers; narrow: the run names head the columns
    assert ("3.00x" in shared_line) == (width == 250) and ("static" in shared_line) == (width == 80)


def test_rollart_sim_seed_overrides_the_scenarios_and_stays_deterministic(tmp_path):
    """`--seed N` runs the scenario under another seed: the same table for the same seed, another for another."""
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(scenario(iterations=2)))

    def rows(*extra: str) -> list[dict]:
        out = CliRunner().invoke(app, ["sim", str(path), "--json", *extra])
        assert out.exit_code == 0, out.output
        runs = json.loads(out.stdout[out.stdout.index("{"):])["runs"]
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in runs]

    assert rows("--seed", "5") == rows("--seed", "5")
    assert rows("--seed", "5") != rows()  # the scenario's own seed is 1
    assert CliRunner().invoke(app, ["sim", str(path), "--seed", "-1"]).exit_code == 2


def test_the_documented_scenario_parses_and_every_run_builds_a_config():
    """The "Write your own scenario" example of docs/simulator.md (rendered from scripts/bench/paper_intro.md)."""
    import re
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[3]
    for doc in (root / "scripts" / "bench" / "paper_intro.md", root / "docs" / "simulator.md"):
        block = re.search(r"## Write your own scenario.*?```yaml\n(.*?)```", doc.read_text(), re.S)
        assert block is not None, doc
        spec = parse_scenario(yaml.safe_load(block.group(1)))
        configs = [spec.run_config(run) for run in spec.runs]
        assert [c.rollout.pools[0].devices for c in configs] == [8, 16, 8]
        assert [c.pipeline.alpha for c in configs] == [1, 1, 2]


def test_committed_scenarios_parse():
    from pathlib import Path

    from rollart.app.sim.scenario import load_scenario

    root = Path(__file__).resolve().parents[3] / "examples" / "scenarios"
    names = sorted(p.stem for p in root.glob("*.yaml"))
    assert len(names) >= 6
    for name in names:
        spec = load_scenario(root / f"{name}.yaml")
        assert spec.paper and len(spec.runs) >= (1 if name.startswith("scale_") else 2)


def test_the_scale_scenario_is_the_scale_benchmarks_largest_row():
    """examples/scenarios/scale_3000.yaml and bench_sim_scale.py's 3,000-GPU row measure the same run."""
    import importlib.util
    from pathlib import Path

    from rollart.app.sim.scenario import load_scenario

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("bench_sim_scale", root / "scripts" / "bench" / "bench_sim_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    committed = load_scenario(root / "examples" / "scenarios" / "scale_3000.yaml")
    generated = parse_scenario(bench.scenario(3000, 10_000))
    assert committed.run_config(committed.runs[0]) == generated.run_config(generated.runs[0])
    assert committed.workload == generated.workload


def test_sync_mode_starts_no_group_the_batch_boundary_would_abort():
    spec = parse_scenario(scenario(iterations=3, pipeline={"mode": "sync", "alpha": 0, "redundancy": 1.0}))
    r = run_one(spec, spec.runs[0])
    assert r.collected == 24 and r.aborted == 0 and r.in_buffer == 0  # each slot ran exactly one group per iteration


def test_the_simulation_collects_less_often_and_restores_the_process_settings():
    """D25: inside a run the collector's threshold is the simulation's and what existed is frozen;
    afterwards the process has its own threshold back and nothing stays frozen, even on an error."""
    before = gc.get_threshold()
    with pytest.raises(RuntimeError):
        with simulation_gc():
            assert gc.get_threshold() == SIM_GC_THRESHOLD
            assert gc.get_freeze_count() > 0
            raise RuntimeError("a run that fails")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_static_search_keeps_the_best_feasible_layout_under_the_budget_and_runs_each_once():
    """App D67. Trainers below the memory model's floor (app D61: 3 H800 here) are not run; a layout refused
    while it runs is listed with its reason and never best; no layout runs twice; time-sharing is searched as
    its static counterpart (async)."""
    from rollart.app.sim.runner import run_one as real_run
    from rollart.app.sim.search import search_spec, search_static

    spec = parse_scenario(scenario(iterations=3, runs=[{"name": "ts", "set": {"pipeline.mode": "time_sharing"}}],
                                   search={"budget_devices": 10, "granularity": 1, "coarse": 4, "refine": 2}))
    seen: list[str] = []

    def run(sc, run_spec):
        seen.append(json.dumps(run_spec.set, sort_keys=True))
        assert sc.iterations == 3 and run_spec.set["pipeline.mode"] == "async"
        if run_spec.set["rollout.pools"][0]["devices"] == 1:  # stands in for a refusal during the run
            raise SchedulerError("rollout: one device cannot serve the batch (stand-in)")
        return real_run(sc, run_spec)

    found = search_static(spec, search_spec(spec, "static"), run=run)
    assert len(seen) == len(set(seen)) == len(found.candidates) >= 3
    assert all(3 <= c.train_devices and c.devices <= 10 for c in found.candidates)
    refused = [c for c in found.candidates if c.infeasible]
    assert refused and all("stand-in" in c.infeasible and c is not found.best for c in refused)
    ok = [c for c in found.candidates if c.feasible]
    assert found.best is not None and found.best.result.iteration_s == min(c.result.iteration_s for c in ok)
    assert found.row()["best"]["run"]["iteration_s"] == found.best.result.iteration_s


def test_static_search_under_a_cost_budget_prices_each_hardware():
    from rollart.app.sim.search import search_spec, search_static

    spec = parse_scenario(scenario(iterations=2))
    options = search_spec(spec, "static", budget_cost=6.0, rollout_hardware=["H20"], granularity=1, coarse=3, refine=0,
                          metric="trained_tokens_per_s")
    found = search_static(spec, options)
    # t H800 trainers (1.0 each, at least 3 hold the model) leave 6 - t for H20 at 1/2.85 each: 3 -> 8, 4 -> 5, 5 -> 2
    assert sorted((c.train_devices, c.rollout["h20"]) for c in found.candidates) == [(3, 8), (4, 5), (5, 2)]
    assert all(c.cost <= 6.0 + 1e-9 and c.feasible for c in found.candidates)
    assert found.best.result.trained_tokens_per_s == max(c.result.trained_tokens_per_s for c in found.candidates)


@pytest.mark.parametrize("over, field", [
    ({"search": {"budget_devices": 1}}, "search.budget_devices"),
    ({"search": {"budget_devices": 8, "budget_cost": 2}}, "budget_cost"),
    ({"search": {"rollout_hardware": ["H900"]}}, "H800"),
    ({"search": {"base": "nope"}}, "search.base"),
    ({"search": {"metric": "speed"}}, "trained_tokens_per_s"),
    ({"search": {"coarse": 1}}, "search.coarse"),
])
def test_search_section_errors_name_the_field_and_the_allowed_values(over, field):
    with pytest.raises(ConfigError) as err:
        parse_scenario(scenario(**over))
    assert field in str(err.value)


def test_rollart_sim_search_static_cli(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(scenario(iterations=2)))
    out = CliRunner().invoke(app, ["sim", str(path), "--search", "static", "--budget-devices", "4", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout[out.stdout.index("{"):])
    best = data["search"]["best"]
    assert best["devices"] <= 4 and best["run"]["iteration_s"] > 0
    out = CliRunner().invoke(app, ["sim", str(path), "--search", "dynamic"])
    assert out.exit_code == 2 and "--search" in out.output and "static" in out.output


def test_a_time_shared_trainer_fits_with_the_devices_it_always_borrows():
    """App D69 / scheduler D59: on the blog's model the trainer's own 32 H800 cannot hold Qwen3-235B-A22B at 64K
    (at least 72), so a static 32-device trainer is refused, while time-sharing borrows the 40 it lacks every step."""
    from pathlib import Path

    from rollart.app.plan import required_lend
    from rollart.app.sim.scenario import RunSpec, load_scenario

    root = Path(__file__).resolve().parents[3]
    spec = load_scenario(root / "examples" / "scenarios" / "timesharing.yaml")
    shared = {r.name: spec.run_config(r) for r in spec.runs}
    assert required_lend(shared["timesharing_cost_aware"]) == required_lend(shared["timesharing_always_shrink"]) == 40
    assert required_lend(shared["static_128train_32rollout"]) == 0
    with pytest.raises(ConfigError, match="at least 72 devices"):
        spec.run_config(RunSpec(name="static32", set={"pipeline.mode": "async", "trainer.devices": 32,
                                                      "rollout.pools.0.devices": 128}))
    with pytest.raises(ConfigError, match="at least 72 devices"):  # lending 8 of 128 is not enough either
        spec.run_config(RunSpec(name="ts8", set={"pipeline.mode": "time_sharing", "trainer.devices": 32,
                                                 "rollout.pools.0.devices": 128, "time_sharing.policy": "always_shrink",
                                                 "time_sharing.lend": 8}))


def _paper_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "bench" / "paper.py"
    spec = importlib.util.spec_from_file_location("paper_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paper_table_reads_one_metric_per_figure_and_every_search_is_valid():
    """App D66/D68: step time for the figures (Fig 12a read the batch wait before), trained tokens/s for time-sharing
    (tokens/s counted discarded tokens before); every figure has a valid static search or says why it has none."""
    from rollart.app.sim.scenario import load_scenario
    from rollart.app.sim.search import search_spec

    paper = _paper_module()
    row = {"iteration_s": 100.0, "rollout_s": 10.0, "tokens_per_s": 1000.0, "trained_tokens_per_s": 500.0}
    runs = [{**row, "name": "batch_sigma10"}, {**row, "name": "trajectory_sigma10", "iteration_s": 50.0, "rollout_s": 9.0}]
    assert paper.gains("fig12a_env_interaction", {"runs": runs}) == [("trajectory_sigma10", 2.0, None)]
    ts = [{**row, "name": "static_128train_32rollout"},
          {**row, "name": "timesharing_cost_aware", "tokens_per_s": 9000.0, "trained_tokens_per_s": 750.0}]
    best = {"best": {"name": "static x", "run": {**row, "trained_tokens_per_s": 600.0}}}
    (name, over_base, over_best), = paper.gains("timesharing", {"runs": ts, "best_static": best})
    assert (name, over_base, over_best) == ("timesharing_cost_aware", 1.5, 1.25)
    root = paper.ROOT / "examples" / "scenarios"
    for name, *_ in paper.EXPERIMENTS:
        h = paper.HEADLINE[name]
        assert ("search" in h) != ("no_search" in h), name
        spec = load_scenario(root / f"{name}.yaml")
        assert {h["baseline"], *h["policies"]} <= {r.name for r in spec.runs}, name
        if "search" in h:
            assert search_spec(spec, "static", **paper.search_options(name, spec)).base in {r.name for r in spec.runs}
