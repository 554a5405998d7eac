"""Reward functions for tests and benchmarks of the service (named as such; not for training).

`test_registry` adds, on top of the rule rewards:
- `slow`: sleeps `trajectory.info["sleep_s"]` (default 0.05 s), appends the trajectory id to the
  file named by `ROLLART_REWARD_TEST_LOG` (so a test can count real scorings), scores len(id);
- `hang`: never returns (only the service's deadline ends it);
- `boom`: raises;
- `block`: an `async def score` that blocks in `time.sleep(info["sleep_s"])` (default 40 s), what a
  careless user function looks like; it does not declare `runs_on_loop`, so the service runs it in a thread;
- `stubborn`: swallows the first cancellation and goes on for a minute (only the batch deadline of
  the service ends the request).
"""

from __future__ import annotations

import asyncio
import os
import time

from rollart.env.trajectory import Trajectory
from rollart.reward.protocol import RewardRegistry, RewardResult
from rollart.reward.service import default_registry

LOG_ENV = "ROLLART_REWARD_TEST_LOG"


class SlowRecordingReward:
    """Sleeps, records that it scored, returns len(trajectory.id)."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    name = "slow"

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Sleep `info['sleep_s']`, then append the id to the log file."""
        await asyncio.sleep(float(trajectory.info.get("sleep_s", 0.05)))
        path = os.environ.get(LOG_ENV)
        if path:
            await asyncio.to_thread(_append, path, trajectory.id)
        return RewardResult(score=float(len(trajectory.id)), details={"pid": os.getpid()})


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


class HangingReward:
    """Never returns."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    name = "hang"

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Wait forever."""
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class StubbornReward:
    """Ignores the first cancellation: what a reward that catches every exception looks like."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    name = "stubborn"

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Wait, swallow one cancellation, wait a minute more."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(60)
        return RewardResult(score=0.0)


class FailingReward:
    """Always raises."""

    runs_on_loop = True  # never blocks the event loop (service D29)

    name = "boom"

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Raise."""
        raise ValueError("reward function bug")


class BlockingReward:
    """Blocks its thread in `time.sleep`: never cancellable, never on the service's loop."""

    name = "block"

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """Sleep `info['sleep_s']` (default 40 s) without yielding, then score 1."""
        time.sleep(float(trajectory.info.get("sleep_s", 40.0)))  # noqa: ASYNC251 - the point of this reward
        return RewardResult(score=1.0)


def test_registry() -> RewardRegistry:
    """The default rule rewards plus `slow`, `hang`, `stubborn`, `boom` and `block`."""
    registry = default_registry()
    for fn in (SlowRecordingReward(), HangingReward(), StubbornReward(), FailingReward(), BlockingReward()):
        registry.register(fn)
    return registry


test_registry.__test__ = False  # not a pytest test
