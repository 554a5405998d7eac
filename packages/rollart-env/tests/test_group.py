"""The batch-level baseline: EnvGroup steps its managers in lockstep; independent managers do not."""

from __future__ import annotations

import asyncio

import pytest

from rollart.env.envs.latency import LatencyDistribution, LatencyWrapper
from rollart.env.errors import EnvError
from rollart.env.group import EnvGroup, LockstepBarrier, run_redundant
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.stubs import CountdownStubEnv, ListSink, StubLLMClient
from rollart.env.trajectory import TrajectoryStatus
from rollart.resource.virtual_time import run_virtual as run_virtual_timed


def run_virtual(coro):
    """rollart-resource's virtual-time runtime (env D11), returning just the result."""
    return run_virtual_timed(coro).result


def _managers(prompts, step_latencies, sink):
    out = []
    for i, latency in enumerate(step_latencies):
        env_factory = lambda latency=latency: LatencyWrapper(  # noqa: E731
            CountdownStubEnv(length=3), step_latency=LatencyDistribution("fixed", latency)
        )
        llm = StubLLMClient(lambda s: [5, 6], ["x"], latency_s=1.0)
        out.append(EnvManager(env_factory, llm, prompts, sink, EnvManagerConfig(max_turns=10), name=f"m{i}"))
    return out


def test_env_group_waits_for_the_slowest_env_every_turn(prompts):
    sink = ListSink()
    group = EnvGroup(_managers(prompts, [1.0, 5.0], sink))
    trajs = run_virtual(group.run_batch([0, 1]))
    fast, slow = trajs
    assert all(t.status == TrajectoryStatus.FINISHED for t in trajs)
    for k in range(1, 3):  # the fast env's next generation starts only after the slow step ended
        assert fast.turns[k].t_generate_start >= slow.turns[k - 1].t_step_end
    assert fast.t_end == pytest.approx(slow.t_end - 0.0, abs=5.0)
    assert slow.t_end == pytest.approx(3 * (1.0 + 5.0))
    assert all(m.turn_barrier is None for m in group.managers)


def test_trajectory_level_managers_do_not_wait_for_each_other(prompts):
    sink = ListSink()
    managers = _managers(prompts, [1.0, 5.0], sink)

    async def main():
        return await asyncio.gather(*(m.run_trajectory(seed=i) for i, m in enumerate(managers)))

    fast, slow = run_virtual(main())
    assert fast.t_end == pytest.approx(3 * (1.0 + 1.0))
    assert slow.t_end == pytest.approx(3 * (1.0 + 5.0))


def test_barrier_releases_when_a_party_leaves():
    async def main():
        barrier = LockstepBarrier(3, timeout_s=100)
        waiter = asyncio.create_task(barrier.wait())
        waiter2 = asyncio.create_task(barrier.wait())
        await asyncio.sleep(1)
        assert not waiter.done()
        barrier.leave()
        await asyncio.sleep(0)
        await asyncio.gather(waiter, waiter2)
        return barrier.parties

    assert run_virtual(main()) == 2
    with pytest.raises(asyncio.TimeoutError):
        run_virtual(LockstepBarrier(2, timeout_s=3).wait())
    with pytest.raises(EnvError, match="parties must be an integer"):
        LockstepBarrier(0)


def test_group_rejects_mismatched_seeds(prompts):
    group = EnvGroup(_managers(prompts, [1.0], ListSink()))
    with pytest.raises(EnvError, match="one seed per manager"):
        run_virtual(group.run_batch([0, 1]))


def test_redundant_rollouts_keep_the_fastest_and_abort_the_rest_once(prompts):
    sink = ListSink()
    managers = _managers(prompts, [1.0, 2.0, 3.0, 50.0, 60.0], sink)

    async def main():
        loop = asyncio.get_running_loop()
        kept = await run_redundant(managers, target=3, seeds=[0, 1, 2, 3, 4], group_id="g")
        return kept, loop.time()

    kept, t_return = run_virtual(main())
    assert [t.env_name for t in kept] == ["m0", "m1", "m2"]
    assert all(t.status == TrajectoryStatus.FINISHED for t in kept)
    aborted = [t for t in sink.items if t.status == TrajectoryStatus.ABORTED]
    assert sorted(t.env_name for t in aborted) == ["m3", "m4"]
    assert all(t.reason == "cancelled:redundant" for t in aborted)
    assert len(sink.items) == 5 == len({t.id for t in sink.items})  # every start ended exactly once
    assert t_return < 3 * (1.0 + 50.0)  # did not wait for the slow environments
    with pytest.raises(EnvError, match=r"target must be an integer in \[1, 5\], got 6"):
        run_virtual(run_redundant(managers, target=6, seeds=[0] * 5))
