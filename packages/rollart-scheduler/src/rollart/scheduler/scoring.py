"""`ScoringSink`: env's `TrajectorySink` that scores finished trajectories as tasks, then buffers them.

Why a task per trajectory: a reward scored by a service (or an LLM judge) takes milliseconds to
seconds; `put_nowait` is called from the EnvManager's loop and must not block it, and one slow
score must not hold back the others. Why a deadline and a failed status: a scorer that raises or
hangs would otherwise lose the trajectory (never buffered, never counted) or stall the run. Here
every trajectory reaches `on_put` and the buffer exactly once: scored, or turned into a `failed`
trajectory with the reason (the buffer records it as aborted, so it is never counted as collected).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from rollart import checks as check
from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.scheduler.errors import SchedulerError

log = logging.getLogger(__name__)

Scorer = Callable[[Trajectory], Awaitable[float]]


class ScoringSink:
    """Score each finished, unscored trajectory with a deadline, then hand it on exactly once.

    Trajectories that are not finished, or already carry a reward, are handed on at once. The
    counters `scored`, `failed` and `passed` add up to the trajectories handed on.
    """

    def __init__(self, buffer: Any, scorer: Scorer, on_put: Callable[[Trajectory], None] | None = None,
                 deadline_s: float = 60.0, max_concurrency: int = 64) -> None:
        """`buffer` needs `put_nowait`; `on_put` observes every trajectory just before the buffer does."""
        # VAL: VAL_TIMEOUT(deadline_s, exc=SchedulerError)
        check.timeout("deadline_s", deadline_s, exc=SchedulerError)  # generated #30945f3280
        # VAL: VAL_INT_RANGE(max_concurrency, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("max_concurrency", max_concurrency, min=1, max=1_000_000, exc=SchedulerError)  # generated #e695c4034e
        self.buffer = buffer
        self.scorer = scorer
        self.on_put = on_put
        self.deadline_s = deadline_s
        self._slots = asyncio.Semaphore(max_concurrency)
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._delivered: set[str] = set()
        self._closed = False
        self.scored = 0
        self.failed = 0
        self.passed = 0

    @property
    def pending(self) -> int:
        """Trajectories whose score is still being computed."""
        return len(self._pending)

    def put_nowait(self, trajectory: Trajectory) -> None:
        """Never blocks: start scoring (needs a running loop) or hand the trajectory on at once."""
        # deps: ScoringSink._deliver, ScoringSink._score
        # AST: AST_PRECONDITION(trajectory.id not in self._pending and trajectory.id not in self._delivered, got=trajectory.id, msg="a trajectory is put at most once", exc=SchedulerError)
        check.precondition(trajectory.id not in self._pending and trajectory.id not in self._delivered, "a trajectory is put at most once", got=trajectory.id, exc=SchedulerError)  # generated #ced9de6f7a
        finished = getattr(trajectory.status, "value", trajectory.status) == TrajectoryStatus.FINISHED.value
        if not finished or trajectory.reward is not None:
            self.passed += 1
            self._deliver(trajectory)
            return
        if self._closed:
            self._fail(trajectory, "reward not scored: the scoring sink is closed")
            return
        task = asyncio.get_running_loop().create_task(self._score(trajectory), name=f"score-{trajectory.id}")
        self._pending[trajectory.id] = task

    async def _score(self, trajectory: Trajectory) -> None:
        try:
            async with self._slots:
                value = float(await asyncio.wait_for(self.scorer(trajectory), timeout=self.deadline_s))
            if not math.isfinite(value):
                raise ValueError(f"the reward is not finite: {value!r}")
        except asyncio.CancelledError:
            self._pending.pop(trajectory.id, None)
            self._fail(trajectory, "reward cancelled: the scoring sink closed before the score arrived")
            raise
        except TimeoutError:
            self._pending.pop(trajectory.id, None)
            log.warning("reward of trajectory %s timed out after %.3g s", trajectory.id, self.deadline_s)
            self._fail(trajectory, f"reward timed out after {self.deadline_s:.3g} s", kind="timeout")
            return
        except Exception as err:  # noqa: BLE001 - any scorer failure becomes a failed trajectory
            log.warning("reward of trajectory %s failed: %s: %s", trajectory.id, type(err).__name__, err)
            self._pending.pop(trajectory.id, None)
            self._fail(trajectory, f"reward failed: {type(err).__name__}: {err}"[:500], kind=type(err).__name__)
            return
        self._pending.pop(trajectory.id, None)
        trajectory.reward = value
        self.scored += 1
        self._deliver(trajectory)

    def _fail(self, trajectory: Trajectory, reason: str, kind: str = "") -> None:
        trajectory.status = TrajectoryStatus.FAILED
        trajectory.reason = reason
        if kind:  # counted by kind in the iteration's `reward_errors` (D52)
            trajectory.info["reward_error"] = {"kind": kind, "message": reason}
        trajectory.reward = None
        self.failed += 1
        self._deliver(trajectory)

    def _deliver(self, trajectory: Trajectory) -> None:
        self._delivered.add(trajectory.id)
        if self.on_put is not None:
            self.on_put(trajectory)
        self.buffer.put_nowait(trajectory)

    async def aclose(self, timeout_s: float = 30.0) -> int:
        """Stop taking scores; wait up to `timeout_s` for pending ones, cancel the rest (they fail).

        Returns how many were cancelled. Every trajectory put before has reached the buffer on return.
        """
        # VAL: VAL_TIMEOUT(timeout_s, exc=SchedulerError)
        check.timeout("timeout_s", timeout_s, exc=SchedulerError)  # generated #4c6d4a16bf
        self._closed = True
        tasks = list(self._pending.values())
        cancelled = 0
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
            cancelled = len(late)
            if late:
                await asyncio.gather(*late, return_exceptions=True)
        # AST: AST_POSTCONDITION(not self._pending, got=sorted(self._pending), msg="every trajectory is handed on at close", exc=SchedulerError)
        check.postcondition(not self._pending, "every trajectory is handed on at close", got_lazy=lambda: sorted(self._pending), exc=SchedulerError)  # generated #61b862b93b
        return cancelled
