"""The demo's deployment: rollout workers as Ray actors on logical GPUs, devices from the ledger."""

from __future__ import annotations

import pytest

from rollart.scheduler.builder import build_pipeline
from rollart.scheduler.config import parse_config


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
