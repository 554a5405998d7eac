"""One user function served as Reward-as-a-Service: wrapping, loading by import path, the worker registry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.reward.errors import RewardError
from rollart.reward.function_service import FUNCTION_ENV, FunctionReward, function_registry, load_reward
from rollart.reward.protocol import RewardResult
from rollart.reward.service import ServiceConfig, create_app

USER_FILE = Path(__file__).resolve().parents[3] / "examples" / "user_env.py"


def _traj(tid: str, success: bool, **info) -> Trajectory:
    return Trajectory(id=tid, status=TrajectoryStatus.FINISHED, success=success, info=info)


def test_function_reward_wraps_functions_and_reward_fns():
    async def slow(t):
        await asyncio.sleep(0)
        return 0.5

    assert asyncio.run(FunctionReward("s", slow).score(_traj("x", True))).score == 0.5
    assert asyncio.run(FunctionReward("r", lambda t: RewardResult(score=0.25, details={"a": 1})).score(_traj("x", True))).details == {"a": 1}
    with pytest.raises(RewardError, match="non-finite"):
        asyncio.run(FunctionReward("n", lambda t: float("nan")).score(_traj("x", True)))
    with pytest.raises(RewardError, match="name must not be empty"):
        FunctionReward("", slow)
    fn = load_reward("rollart.reward.rules:EnvSuccessReward", "ok")
    assert fn.name == "ok" and asyncio.run(fn.score(_traj("x", True))).score == 1.0
    fn = load_reward(f"{USER_FILE}:guess_reward")
    assert fn.name == "guess_reward" and asyncio.run(fn.score(_traj("y", False, best_gap=2, high=8))).score == pytest.approx(0.375)
    for spec, pattern in (("nomodule_zz:f", "No module named 'nomodule_zz'"), (f"{USER_FILE}:nope", "has no attribute 'nope'"),
                          ("/no/such/file.py:f", "not found"), ("no_colon", "module:attr or file.py:attr"),
                          ("rollart.reward.function_service:FUNCTION_ENV", "is not a reward")):
        with pytest.raises(RewardError, match=pattern):
            load_reward(spec)


async def test_worker_registry_serves_the_function_over_the_app(tmp_path, monkeypatch):
    monkeypatch.setenv(FUNCTION_ENV, json.dumps({"spec": f"{USER_FILE}:guess_reward", "name": "guess"}))
    registry = function_registry()
    assert registry.names() == ["guess"]
    app = create_app(registry, ServiceConfig(token="t" * 12, cache_path=str(tmp_path / "c.sqlite")))
    body = {"reward": "guess", "items": [{"key": "k1", "trajectory": _traj("a", True).model_dump(mode="json")},
                                         {"key": "k2", "trajectory": _traj("b", False, best_gap=4, high=8).model_dump(mode="json")}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        resp = await client.post("/v1/score", json=body, headers={"Authorization": "Bearer " + "t" * 12})
    assert resp.status_code == 200
    assert [(r["status"], r["score"]) for r in resp.json()["results"]] == [("ok", 1.0), ("ok", 0.25)]
    monkeypatch.delenv(FUNCTION_ENV)
    with pytest.raises(RewardError, match="the function spec is set in the environment"):
        function_registry()
