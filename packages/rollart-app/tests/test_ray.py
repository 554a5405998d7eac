"""The demo's deployment: rollout workers as Ray actors on logical GPUs, devices from the ledger."""

from __future__ import annotations

import pytest

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config


@pytest.mark.ray
@pytest.mark.slow
async def test_ray_workers_two_iterations(ray_cluster, tmp_path):
    cfg = parse_config({
        "run": {"tensorboard": False},
        "pipeline": {"mode": "time_sharing", "alpha": 1, "batch_size": 8, "group_size": 4},
        "time_sharing": {"policy": "always_shrink"},
        "cluster": {"ray": "local"}, "rollout": {"pools": [{"name": "rollout", "hardware": "H800", "devices": 2}]},
        "tasks": [{"env": "frozenlake", "max_turns": 4}],
    })
    pipe = await build_pipeline(cfg, tmp_path)
    try:
        workers = [s.handle for s in pipe.parts.rollout.control.slots]
        assert all(type(w).__name__ == "RayWorkerHandle" for w in workers)
        # the proxy's health check reaches inside each actor (a handle without probe would say no_probe)
        assert set((await pipe.parts.proxy.check_health()).values()) == {"ok"}
        recs = await pipe.run(2)
        ledger = pipe.parts.controller.pool.ledger
        roles = {d: rec.role for d, rec in ledger.devices().items()}
    finally:
        await pipe.close()
    assert [r["version"] for r in recs] == [1, 2]
    # the engines' prefix-cache counters come back from inside the actors
    assert all(r["prefix_reused_tokens"] > 0 and 0.0 < r["prefix_hit_rate"] <= 1.0 for r in recs)
    assert all(r["lent_devices"] == 1 for r in recs)
    # after every train step the lent device is back in the rollout role in the ledger
    assert sorted(roles.values()) == ["rollout", "rollout", "train"]


BROKEN_ENV = '''
from rollart.env.protocols import ResetResult, StepResult


class NamelessEnv:
    """Breaks the Env protocol (no `name`): the EnvManager refuses it when the pipeline is built."""

    system_prompt = ""

    async def reset(self, seed=None):
        return ResetResult(observation="hi")

    async def step(self, action):
        return StepResult(observation="", reward=0.0, terminated=True, truncated=False)

    async def close(self):
        pass
'''


@pytest.mark.ray
@pytest.mark.slow
async def test_a_pipeline_that_fails_to_build_leaves_no_actor_behind(ray_cluster, tmp_path):
    """Rollout actors, trainer actors and their world are started before the envs are built; when an env
    breaks its protocol the build fails and every device is free again for the next run."""
    import asyncio

    import ray

    from rollart.env.errors import EnvProtocolError
    from rollart.proxy.testing import build_tiny_model

    (tmp_path / "broken_env.py").write_text(BROKEN_ENV)
    cfg = parse_config({
        "run": {"tensorboard": False},
        "model": {"path": build_tiny_model(tmp_path / "ckpt")},
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 4, "group_size": 4},
        "cluster": {"ray": "local"},
        "rollout": {"pools": [{"name": "rollout", "hardware": "H800", "devices": 1}]},
        "trainer": {"placement": "actors", "devices": 1, "hardware": "H800"},
        "sync": {"channel": "torch_dist"},
        "tasks": [{"env": f"{tmp_path}/broken_env.py:NamelessEnv", "reward": "math_answer", "prompts": "chat_template"}],
    })
    total = ray.cluster_resources()["GPU"]
    with pytest.raises(EnvProtocolError, match="NamelessEnv.name is missing"):
        await build_pipeline(cfg, tmp_path / "run")
    for _ in range(100):  # placement groups are released asynchronously
        if ray.available_resources().get("GPU", 0) == total:
            break
        await asyncio.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == total, "a failed build left devices taken"
