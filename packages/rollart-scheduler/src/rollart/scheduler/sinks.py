"""The TrajectorySink that scores each finished trajectory with its task's reward, then buffers it.

Why asynchronous: a reward may be a service over HTTP (seconds) or a sandboxed program; an
EnvManager's `put_nowait` must never wait for it (the env's next trajectory starts at once). Each
score runs as its own task with a deadline; whatever happens, the trajectory reaches the buffer
exactly once: scored, or failed with the reason (a failed one is never collected as a sample).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.scheduler.errors import SchedulerError

Scorer = Callable[[Trajectory], Awaitable[float]]


class _TaskSink:
    def __init__(self, owner: ScoringSink, key: str, scorer: Scorer) -> None:
        self.owner, self.key, self.scorer = owner, key, scorer

    def put_nowait(self, trajectory: Trajectory) -> None:
        self.owner.submit(trajectory, self.scorer)


class ScoringSink:
    """Scores finished trajectories concurrently and puts every trajectory into the buffer once."""

    def __init__(self, buffer: Any, deadline_s: float = 120.0) -> None:
        """`deadline_s` bounds one score; past it the trajectory fails with reason `reward_timeout`."""
        # VAL: VAL_TIMEOUT(deadline_s, exc=SchedulerError)
        # >>> generated VAL_TIMEOUT #2cc288b3a5 (edit the annotation, not this block)
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not (deadline_s - deadline_s == 0) or not deadline_s > 0:
            raise SchedulerError(f"deadline_s must be a finite timeout > 0 seconds, got {deadline_s!r}")
        # <<< generated
        self.buffer = buffer
        self.deadline_s = deadline_s
        self._observers: list[Callable[[Trajectory], None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self.scored = 0
        self.failed = 0

    def observe(self, callback: Callable[[Trajectory], None]) -> None:
        """Call `callback(trajectory)` for every trajectory just before it is buffered."""
        self._observers.append(callback)

    def for_task(self, key: str, scorer: Scorer) -> _TaskSink:
        """The sink one task's EnvManagers write to."""
        return _TaskSink(self, key, scorer)

    def submit(self, trajectory: Trajectory, scorer: Scorer) -> None:
        """Score (if finished and unscored) in the background, then buffer; never blocks."""
        if trajectory.status != TrajectoryStatus.FINISHED or trajectory.reward is not None:
            self._put(trajectory)
            return
        task = asyncio.get_running_loop().create_task(self._score(trajectory, scorer))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _score(self, trajectory: Trajectory, scorer: Scorer) -> None:
        try:
            reward = await asyncio.wait_for(scorer(trajectory), self.deadline_s)
            if reward != reward or reward in (float("inf"), float("-inf")):
                raise ValueError(f"reward is not finite: {reward!r}")
            trajectory.reward = float(reward)
            self.scored += 1
        except asyncio.CancelledError:
            trajectory.status, trajectory.reason = TrajectoryStatus.FAILED, "reward cancelled at shutdown"
            self.failed += 1
            self._put(trajectory)
            raise
        except TimeoutError:
            trajectory.status, trajectory.reason = TrajectoryStatus.FAILED, f"reward_timeout after {self.deadline_s} s"
            self.failed += 1
        except Exception as err:  # noqa: BLE001 - a reward error fails the trajectory, not the run
            trajectory.status, trajectory.reason = TrajectoryStatus.FAILED, f"reward_error: {type(err).__name__}: {err}"
            self.failed += 1
        self._put(trajectory)

    def _put(self, trajectory: Trajectory) -> None:
        for cb in self._observers:
            cb(trajectory)
        self.buffer.put_nowait(trajectory)

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Wait for pending scores up to `timeout_s`, then cancel the rest (each still buffered once)."""
        if self._pending:
            _, pending = await asyncio.wait(set(self._pending), timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
