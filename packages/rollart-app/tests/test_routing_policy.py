"""Step 73 (D74): `routing.policy` picks hard or soft affinity (rollart-proxy D51) for the built proxy."""

from __future__ import annotations

import pytest

from rollart.app.config import parse_config
from rollart.app.sim.runner import run_one
from rollart.app.sim.scenario import parse_scenario
from rollart.scheduler.errors import ConfigError


def test_a_bad_policy_names_the_field_and_the_choices():
    with pytest.raises(ConfigError) as exc:
        parse_config({"routing": {"policy": "sloppy"}})
    msg = str(exc.value)
    assert "routing.policy" in msg and "'sloppy'" in msg and "'hard'" in msg and "'soft'" in msg
    assert parse_config({}).routing.policy == "hard"  # the paper's Listing 1 stays the default


def _run(policy: str):
    """Every request prefers the one H20; one slot per device, so the two H800 help only if work spills."""
    pool = {"engine": "sim", "max_num_seqs": 8, "engine_args": {"decode_quantum_s": 0.5}}
    scenario = parse_scenario({
        "name": "spill", "seed": 1, "iterations": 2, "warmup": 0,
        "config": {
            "pipeline": {"mode": "sync", "alpha": 0, "batch_size": 6, "group_size": 2, "redundancy": 1.0,
                         "get_batch_timeout_s": 1e6, "update_timeout_s": 600},
            "model": {"sim_model": "Qwen3-8B"},
            "time_sharing": {"slots_per_device": 1},
            "rollout": {"pools": [{"name": "a", "hardware": "H800", "devices": 2, **pool},
                                  {"name": "b", "hardware": "H20", "devices": 1, **pool}]},
            "routing": {"affinity": {"default": "H20"}, "policy": policy},
            "trainer": {"backend": "sim", "devices": 4, "hardware": "H800"},
            "sync": {"channel": "sim"},
            "tasks": [{"env": "synthetic", "reward": "synthetic", "max_turns": 4, "max_tokens": 256, "env_timeout_s": 10000}],
        },
        "workload": {"turns": 2, "prompt_tokens": 64, "observation_tokens": 16, "response_tokens": 128, "step_latency": 0.1},
        "runs": [{"name": policy}],
    })
    return run_one(scenario, scenario.runs[0])


def test_soft_affinity_puts_the_idle_hardware_to_work_and_hard_affinity_does_not():
    hard, soft = _run("hard"), _run("soft")
    assert hard.collected == soft.collected == 12
    assert hard.util_rollout < 0.4  # only the H20 of three devices ever serves
    assert soft.util_rollout > hard.util_rollout * 1.5
    assert soft.rollout_s < hard.rollout_s
