"""Issue 22 item 1-2 (D60-D63): tensor-parallel pools, MoE presets, trainer memory, cost per run.

The parts are simulations (SimEngine, SimTrainer); nothing here asserts a wall time.
"""

from __future__ import annotations

import pytest

from rollart.app.config import SIM_MODELS, parse_config
from rollart.scheduler.errors import ConfigError


def sim_config(**over) -> dict:
    data = {
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4},
        "model": {"sim_model": "Qwen3-8B"},
        "rollout": {"pools": [{"name": "r", "hardware": "H800", "devices": 4, "engine": "sim", "tensor_parallel_size": 2}]},
        "trainer": {"backend": "sim", "devices": 4, "hardware": "H800"},
        "sync": {"channel": "sim"},
        "tasks": [{"env": "synthetic", "reward": "synthetic"}],
    }
    for key, value in over.items():
        data[key] = {**data[key], **value}
    return data


def test_tensor_parallel_size_must_divide_the_pool_and_needs_a_multi_device_engine():
    with pytest.raises(ConfigError, match=r"rollout.pools.0.*devices must be a multiple of tensor_parallel_size=2.*got 3"):
        parse_config(sim_config(rollout={"pools": [{"name": "r", "devices": 3, "engine": "sim", "tensor_parallel_size": 2}]}))
    with pytest.raises(ConfigError, match=r"tensor_parallel_size: engine 'torch' runs on one device.*allowed"):
        parse_config({"rollout": {"pools": [{"name": "r", "devices": 2, "tensor_parallel_size": 2}]}})
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        parse_config(sim_config(rollout={"pools": [{"name": "r", "devices": 2, "engine": "sim", "tensor_parallel_size": 0}]}))


def test_moe_presets_are_sim_models():
    assert {"Qwen3-30B-A3B", "Qwen3-235B-A22B"} <= set(SIM_MODELS)
    config = parse_config(sim_config(model={"sim_model": "Qwen3-30B-A3B"}))
    from rollart.app.model_source import ModelSpec

    spec = ModelSpec.from_config(config).sim_spec()
    assert (spec.n_params, spec.active_params, spec.n_experts) == (30.5e9, 3.3e9, 128)


def test_a_tensor_parallel_pool_runs_one_engine_per_group_of_devices(tmp_path):
    from rollart.app.builder import build_pipeline
    from rollart.resource.virtual_time import run_virtual

    config = parse_config(sim_config())

    async def go():
        pipe = await build_pipeline(config, tmp_path, tensorboard=False)
        try:
            return [(w.devices, w.engine.tensor_parallel_size, w.engine.kv_capacity_tokens) for w in pipe.parts.workers]
        finally:
            await pipe.close()

    workers = run_virtual(go(), seed=0).result
    assert [w[0] for w in workers] == [(0, 1), (2, 3)]
    assert {w[1] for w in workers} == {2}
    # Qwen3-8B on 2 x H800: (72e9 - 8.2e9) / (147,456 / 2) tokens per engine
    assert {w[2] for w in workers} == {int((72e9 - 8.2e9) // (147_456 / 2))}


def test_plan_and_the_simulator_refuse_a_trainer_that_does_not_fit(tmp_path):
    from rollart.app.builder import build_pipeline
    from rollart.app.plan import make_plan
    from rollart.app.sim.scenario import parse_scenario
    from rollart.resource.virtual_time import run_virtual

    data = sim_config(model={"sim_model": "Qwen3-235B-A22B"}, trainer={"devices": 32},
                      rollout={"pools": [{"name": "r", "hardware": "H800", "devices": 8, "engine": "sim",
                                          "tensor_parallel_size": 8}]})
    data["tasks"] = [{"env": "synthetic", "reward": "synthetic", "max_context_tokens": 65_536}]
    config = parse_config(data)
    message = r"trainer: Qwen3-235B-A22B at 65,536 tokens needs 4.63 TB on 32 x H800 \(80 GB, 72 GB usable\): 2.32 TB short; at least 72 devices"
    with pytest.raises(ConfigError, match=message):
        make_plan(config)
    with pytest.raises(ConfigError, match=message):
        run_virtual(build_pipeline(config, tmp_path, tensorboard=False))
    with pytest.raises(ConfigError, match=message + r".*\(run 'split'\)"):
        parse_scenario({"name": "s", "config": data, "runs": [{"name": "split"}]})
    data["trainer"]["devices"] = 72
    plan = make_plan(parse_config(data))
    per_device = 18 * 235e9 / 72 + 65_536 * (2 * 4096 * 94 + 34 * 4096 + 4 * 151_936) / 8
    assert plan.trainer.memory.total == pytest.approx(per_device, rel=1e-6)
    assert not plan.trainer.memory.over
    assert plan.pools[0].memory.weights == pytest.approx(470e9 / 8)


def test_the_sim_trainer_prices_the_forward_passes_and_active_parameters(tmp_path):
    from rollart.app.builder import start_trainer
    from rollart.app.model_source import ModelSpec
    from rollart.resource.virtual_time import run_virtual

    for passes, expected in ((["old_policy", "reference"], 2), ([], 0)):
        config = parse_config(sim_config(model={"sim_model": "Qwen3-30B-A3B"}, trainer={"devices": 8, "forward_passes": passes}))
        trainer = run_virtual(start_trainer(config, ModelSpec.from_config(config), None, None)).result.inner
        assert (trainer.forward_passes, trainer.active_params, trainer.n_params) == (expected, 3.3e9, 30.5e9)
    with pytest.raises(ConfigError, match=r"trainer.forward_passes.*allowed: old_policy, reference"):
        parse_config(sim_config(trainer={"forward_passes": ["reference", "reference"]}))


def _tiny_scenario(mode: str) -> dict:
    config = sim_config(pipeline={"mode": mode, "alpha": 0 if mode == "sync" else 1, "get_batch_timeout_s": 1e6},
                        rollout={"pools": [{"name": "a", "hardware": "H800", "devices": 4, "engine": "sim"},
                                           {"name": "b", "hardware": "H20", "devices": 3, "engine": "sim"}]})
    config["tasks"] = [{"env": "synthetic", "reward": "synthetic", "max_turns": 4, "max_tokens": 64, "env_timeout_s": 1e4}]
    return {"name": "c", "iterations": 3, "warmup": 1, "config": config,
            "workload": {"turns": 2, "prompt_tokens": 64, "observation_tokens": 16, "response_tokens": 16},
            "runs": [{"name": mode}]}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_every_row_reports_its_cost_and_tokens_per_cost(mode):
    from rollart.app.sim.runner import run_one
    from rollart.app.sim.scenario import parse_scenario

    spec = parse_scenario(_tiny_scenario(mode))
    r = run_one(spec, spec.runs[0])
    # async: 4 H800 + 3 H20 roll out, 4 more H800 train; sync: the trainer is colocated, nothing counted twice
    expected = (8 if mode == "async" else 4) + 3 / 2.85
    assert r.cost_per_hour == pytest.approx(expected)
    window = sum(h["step_time_s"] for h in r.history[spec.warmup:])
    assert r.cost == pytest.approx(expected * window / 3600, rel=1e-6)
    assert r.tokens_per_cost == pytest.approx(r.tokens_per_s * 3600 / expected)
    assert r.tokens_per_cost > 0 and {"cost_per_hour", "cost", "tokens_per_cost"} <= set(r.row())


@pytest.mark.parametrize(("name", "groups"), [
    ("fig4_hardware", [("frozenlake_2xH800", "frozenlake_6xH20"), ("gemmath_2xH800", "gemmath_6xH20")]),
    ("fig11a_affinity", [("h800_only", "h20_only", "mixed_affinity", "mixed_6xH800_9xH20")]),
])
def test_equal_cost_scenarios_are_equal_cost(name, groups):
    """D63: the runs a figure compares hold rollout devices of equal cost (within 6%: the paper's own 2 H800 vs 6 H20 differ by 5%), same trainer."""
    from pathlib import Path

    from rollart.app.sim.scenario import load_scenario
    from rollart.resource.hardware import HardwareCatalogue

    root = Path(__file__).resolve().parents[3]
    spec = load_scenario(root / "examples" / "scenarios" / f"{name}.yaml")
    configs = {r.name: spec.run_config(r) for r in spec.runs}
    for group in groups:
        costs = []
        for run in group:
            pools: dict[str, int] = {}
            for p in configs[run].rollout.pools:
                pools[p.hardware] = pools.get(p.hardware, 0) + p.devices
            costs.append(HardwareCatalogue().cost_per_hour(pools))
        assert max(costs) / min(costs) < 1.06, (group, costs)
        assert len({(configs[r].trainer.devices, configs[r].trainer.hardware) for r in group}) == 1
