"""The shared retry policy (issue 14, item 5): jittered exponential backoff on tenacity, loop time only."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.resource.errors import ResourceError
from rollart.resource.retry import Backoff, retrying
from rollart.resource.virtual_time import run_virtual


@given(attempt=st.integers(1, 80), base=st.floats(0.0, 5.0), cap=st.floats(0.0, 30.0), seed=st.integers(0, 2**16),
       jitter=st.sampled_from(["full", "equal"]))
def test_the_pause_is_jittered_under_the_exponential_cap(attempt, base, cap, seed, jitter):
    delay = Backoff(base, cap, jitter).delay(attempt, random.Random(seed))
    ceiling = min(cap, base * 2 ** min(attempt - 1, 60))
    assert (0.0 if jitter == "full" else ceiling / 2) <= delay <= ceiling


def test_two_clients_that_failed_together_do_not_retry_together():
    policy = Backoff(1.0, 60.0, "equal")
    a, b = random.Random(1), random.Random(2)
    assert [policy.delay(k, a) for k in range(1, 6)] != [policy.delay(k, b) for k in range(1, 6)]


def test_a_bad_policy_names_the_field():
    with pytest.raises(ResourceError, match="jitter must be one of"):
        Backoff(jitter="none")  # type: ignore[arg-type]


class Flaky(Exception):
    pass


def test_retries_on_the_loop_clock_then_gives_up_with_the_callers_error():
    calls: list[float] = []

    async def go():
        loop = asyncio.get_running_loop()
        async for attempt in retrying(Backoff(1.0, 8.0, "equal"), random.Random(0), retry_on=(Flaky,), max_attempts=4,
                                      give_up=lambda n, err: ResourceError(f"gave up after {n} attempts: {err}")):
            with attempt:
                calls.append(loop.time())
                raise Flaky("down")

    with pytest.raises(ResourceError, match="gave up after 4 attempts: down"):
        run_virtual(go())
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(calls) == 4 and all(0.5 * 2 ** k <= gap <= 2 ** k for k, gap in enumerate(gaps))  # virtual seconds


def test_a_pause_never_runs_past_the_deadline_and_other_errors_propagate_at_once():
    seen: list[float] = []

    async def go():
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3.0
        async for attempt in retrying(Backoff(10.0, 10.0, "equal"), random.Random(0), retry_on=(Flaky,),
                                      deadline=deadline, min_pause=lambda err: 100.0):
            with attempt:
                seen.append(loop.time())
                if len(seen) == 2:
                    raise KeyError("not retried")
                raise Flaky("down")
        return seen

    with pytest.raises(KeyError, match="not retried"):
        run_virtual(go())
    assert len(seen) == 2 and seen[1] - seen[0] == pytest.approx(3.0)  # min_pause 100 s, cut at the deadline
