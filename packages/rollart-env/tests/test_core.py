"""Trajectory records, retry policy and backoff, the virtual clock."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.env.errors import EnvError, EnvTimeoutError, TransientEnvError
from rollart.env.retry import RetryPolicy, backoff_delay, call_with_retries
from rollart.env.trajectory import Trajectory, Turn
from rollart.resource.virtual_time import run_virtual as run_virtual_timed


def run_virtual(coro):
    """rollart-resource's virtual-time runtime (env D11), returning just the result."""
    return run_virtual_timed(coro).result


def test_trajectory_flattening_aligns_ids_mask_and_logprobs():
    traj = Trajectory(
        id="t",
        turns=[
            Turn(prompt_ids=[1, 2, 3], response_ids=[4, 5], response_logprobs=[-0.1, -0.2], weight_version=3),
            Turn(prompt_ids=[6], response_ids=[7], response_logprobs=[-0.3], weight_version=4),
        ],
    )
    assert traj.token_ids() == [1, 2, 3, 4, 5, 6, 7]
    assert traj.policy_mask() == [0, 0, 0, 1, 1, 0, 1]
    assert traj.logprobs() == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3]
    assert traj.weight_versions() == [3, 4]
    assert traj.num_response_tokens() == 3
    again = Trajectory.model_validate_json(traj.model_dump_json())
    assert again == traj


def test_retry_policy_errors_name_field_and_value():
    with pytest.raises(EnvError, match=r"timeout_s must be a finite timeout > 0 seconds, got -1"):
        RetryPolicy(timeout_s=-1)
    with pytest.raises(EnvError, match=r"max_attempts must be an integer in \[1, 100\], got 0"):
        RetryPolicy(max_attempts=0)


@given(attempt=st.integers(1, 10), base=st.floats(0, 5), cap=st.floats(0, 60), seed=st.integers(0, 99))
def test_backoff_delay_is_full_jitter_within_the_exponential_cap(attempt, base, cap, seed):
    policy = RetryPolicy(max_attempts=10, base_delay_s=base, max_delay_s=cap)
    delay = backoff_delay(policy, attempt, random.Random(seed))
    assert 0.0 <= delay <= min(cap, base * 2 ** (attempt - 1)) + 1e-12


def test_call_with_retries_retries_transient_errors_then_succeeds():
    calls = []

    async def flaky():
        calls.append(asyncio.get_running_loop().time())
        if len(calls) < 3:
            raise TransientEnvError("busy")
        return "ok"

    retried = []
    policy = RetryPolicy(timeout_s=1, max_attempts=3, base_delay_s=1.0, max_delay_s=10)
    assert run_virtual(call_with_retries(flaky, policy, random.Random(0), retried.append)) == "ok"
    assert len(calls) == 3 and len(retried) == 2


def test_call_with_retries_gives_up_with_the_last_error():
    async def always():
        raise TransientEnvError("down")

    with pytest.raises(TransientEnvError):
        run_virtual(call_with_retries(always, RetryPolicy(timeout_s=1, max_attempts=2), random.Random(0)))


def test_timeout_becomes_env_timeout_error_and_is_not_retried_when_disallowed():
    calls = []

    async def hang():
        calls.append(1)
        await asyncio.sleep(100)

    policy = RetryPolicy(timeout_s=5, max_attempts=3)
    with pytest.raises(EnvTimeoutError, match="timed out after 5"):
        run_virtual(call_with_retries(hang, policy, random.Random(0), retry_on_timeout=False))
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(EnvTimeoutError):
        run_virtual(call_with_retries(hang, policy, random.Random(0), retry_on_timeout=True))
    assert len(calls) == 3


def test_virtual_clock_jumps_instead_of_sleeping():
    async def main():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(asyncio.sleep(1000), asyncio.sleep(500))
        return loop.time() - t0

    assert run_virtual(main()) == pytest.approx(1000)
