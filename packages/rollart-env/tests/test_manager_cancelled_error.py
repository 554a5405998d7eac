"""An env's own `CancelledError` is an env fault, not a shutdown of its manager (issue 12, item 7).

Before the fix every `CancelledError` was read as "the manager is being shut down": the trajectory
ended `cancelled:shutdown` and `EnvManager.run` stopped, so with 8 managers and 320 seeds, 6
managers stopped and 133 seeds never ran. A real cancel of the manager's task must still stop it.
"""

from __future__ import annotations

import asyncio

import pytest

from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.protocols import ResetResult, StepResult
from rollart.env.retry import RetryPolicy
from rollart.env.stubs import CountdownStubEnv, ListSink, StubLLMClient
from rollart.env.trajectory import TrajectoryStatus
from rollart.resource.virtual_time import run_virtual

MANAGERS, SEEDS = 8, 320


def raises_in_reset(seed: int) -> bool:
    return seed % 7 == 3


def raises_in_step(seed: int) -> bool:
    return seed % 5 == 0


class CancelRaisingEnv(CountdownStubEnv):
    """Raises `CancelledError` itself (as a buggy env or a library it wraps can) on chosen seeds."""

    async def reset(self, seed: int | None = None) -> ResetResult:
        self.seed = seed
        if raises_in_reset(seed):
            raise asyncio.CancelledError("env-internal")
        return await super().reset(seed)

    async def step(self, action: str) -> StepResult:
        if raises_in_step(self.seed):
            await asyncio.sleep(0.5)
            raise asyncio.CancelledError("env-internal")
        return await super().step(action)


def _managers(tokenizer, prompts, n: int, llm=None):
    sink = ListSink()
    llm = llm or StubLLMClient(lambda s: tokenizer.encode(s, add_special_tokens=False), ["ok"], latency_s=1.0)
    config = EnvManagerConfig(
        step_policy=RetryPolicy(timeout_s=5), reset_policy=RetryPolicy(timeout_s=5), max_restarts=0
    )
    managers = [
        EnvManager(lambda: CancelRaisingEnv(length=3), llm, prompts, sink, config, name=f"m{i}") for i in range(n)
    ]
    return managers, sink


def test_env_cancelled_errors_fail_their_trajectory_and_every_seed_still_runs(tokenizer, prompts):
    managers, sink = _managers(tokenizer, prompts, MANAGERS)
    seeds = [list(range(i, SEEDS, MANAGERS)) for i in range(MANAGERS)]

    async def main():
        return await asyncio.gather(*(m.run(s) for m, s in zip(managers, seeds)))

    ran = run_virtual(main()).result
    assert ran == [SEEDS // MANAGERS] * MANAGERS, "a manager stopped early"
    by_seed = {t.seed: t for t in sink.items}
    assert len(sink.items) == SEEDS and sorted(by_seed) == list(range(SEEDS))
    for seed, traj in by_seed.items():
        if raises_in_reset(seed) or raises_in_step(seed):
            assert traj.status == TrajectoryStatus.FAILED and traj.reason.startswith("env_crash:"), traj.reason
            assert "CancelledError" in traj.reason
        else:
            assert traj.status == TrajectoryStatus.FINISHED, (seed, traj.reason)
    assert not any(t.reason == "cancelled:shutdown" for t in sink.items)


def test_an_llm_client_raising_cancelled_error_fails_the_trajectory_not_the_manager(tokenizer, prompts):
    class CancelRaisingLLM(StubLLMClient):
        async def generate(self, request):
            raise asyncio.CancelledError("client-internal")

    llm = CancelRaisingLLM(lambda s: [1], ["x"])
    (manager,), sink = _managers(tokenizer, prompts, 1, llm=llm)
    assert run_virtual(manager.run([1, 2, 4])).result == 3
    assert [t.reason.split(":")[0] for t in sink.items] == ["llm_error"] * 3


@pytest.mark.parametrize("during", ["generate", "env_step"])
def test_a_real_cancel_of_the_manager_task_still_stops_it(tokenizer, prompts, during):
    managers, sink = _managers(tokenizer, prompts, 1)
    seed = 5 if during == "env_step" else 1  # seed 5 sleeps in step before raising

    async def main():
        task = asyncio.create_task(managers[0].run([seed, seed + 1]))
        await asyncio.sleep(0.5 if during == "generate" else 1.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_virtual(main())
    assert [t.reason for t in sink.items] == ["cancelled:shutdown"]


def test_cancel_with_a_reason_still_aborts_and_the_loop_goes_on(tokenizer, prompts):
    managers, sink = _managers(tokenizer, prompts, 1)

    async def main():
        task = asyncio.create_task(managers[0].run([1, 2]))
        await asyncio.sleep(0.5)
        assert managers[0].cancel("stale")
        return await task

    assert run_virtual(main()).result == 2
    assert [t.reason for t in sink.items] == ["cancelled:stale", "terminated"]
