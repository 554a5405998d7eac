"""Step 18: the virtual-time runtime (D13): sleeps jump, threads take zero virtual time, runs repeat."""

from __future__ import annotations

import asyncio
import time

import pytest

from rollart.resource.errors import ResourceError
from rollart.resource.virtual_time import VirtualTimeLoop, run_virtual


def test_one_hour_of_sleeps_jumps_the_clock_exactly():
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = []
        for _ in range(3600):
            await asyncio.sleep(1.0)
            seen.append(loop.time())
        await asyncio.sleep(300)
        return seen

    run = run_virtual(main())
    assert run.result == [float(i) for i in range(1, 3601)]  # exact: the clock jumps to each deadline
    assert run.virtual_s == 3900.0
    assert run.wall_s < run.virtual_s  # (a sanity bound, not a timing claim)


def test_executor_work_takes_zero_virtual_time():
    def blocking() -> str:
        time.sleep(0.05)  # real work in a thread
        return "done"

    async def main() -> tuple[str, float, float]:
        loop = asyncio.get_running_loop()
        ticker = asyncio.create_task(asyncio.sleep(10))  # a pending timer must not be jumped to meanwhile
        t0 = loop.time()
        out = await asyncio.to_thread(blocking)
        t1 = loop.time()
        await ticker
        return out, t1 - t0, loop.time()

    out, during, end = run_virtual(main()).result
    assert (out, during, end) == ("done", 0.0, 10.0)


def test_same_seed_same_trace():
    async def main() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        trace: list[tuple[float, str]] = []

        async def agent(name: str) -> None:
            for _ in range(50):
                await asyncio.sleep(loop.rng.expovariate(1.0))
                trace.append((loop.time(), name))

        await asyncio.gather(*(agent(f"a{i}") for i in range(20)))
        return trace

    a, b, c = run_virtual(main(), seed=7), run_virtual(main(), seed=7), run_virtual(main(), seed=8)
    assert a.result == b.result and a.virtual_s == b.virtual_s
    assert a.result != c.result


def test_timeouts_and_events_behave_as_on_a_real_loop():
    async def main() -> tuple[bool, float, str]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        timed_out = False
        try:
            await asyncio.wait_for(event.wait(), 600)
        except TimeoutError:
            timed_out = True
        t_timeout = loop.time()
        loop.call_later(5, event.set)
        await asyncio.wait_for(event.wait(), 600)
        loop.advance(100)
        return timed_out, t_timeout, f"{loop.time():.1f}"

    assert run_virtual(main()).result == (True, 600.0, "705.0")
    with pytest.raises(ResourceError, match="seconds"):
        VirtualTimeLoop().advance(-1)
    with pytest.raises(ResourceError, match="seed"):
        VirtualTimeLoop(seed=-1)
