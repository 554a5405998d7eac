"""`EnvGroup`: the batch-level baseline (paper Fig. 5b) — N environments stepped in lockstep.

Why keep a baseline: the benchmark compares trajectory-level interaction (independent
`EnvManager`s) against batch-level interaction on the *same* managers, environments and LLM, so
the only difference is the barrier: every generation of a turn waits for the slowest environment
step, and every environment step waits for the slowest generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rollart import checks as check
from rollart.env.errors import EnvError
from rollart.env.manager import EnvManager
from rollart.env.trajectory import Trajectory, TrajectoryStatus


class LockstepBarrier:
    """A reusable barrier whose parties can leave (a finished trajectory no longer holds the batch)."""

    def __init__(self, parties: int, timeout_s: float = 3600.0) -> None:
        """Create a barrier for `parties` participants; each wait is bounded by `timeout_s`."""
        # VAL: VAL_INT_RANGE(parties, min=1, max=1_000_000, exc=EnvError)
        check.int_range("parties", parties, min=1, max=1_000_000, exc=EnvError)  # generated #2eeca1ce20
        # VAL: VAL_TIMEOUT(timeout_s, exc=EnvError)
        check.timeout("timeout_s", timeout_s, exc=EnvError)  # generated #41ad1d0a8c
        self._parties = parties
        self._arrived = 0
        self._timeout_s = timeout_s
        self._event = asyncio.Event()

    @property
    def parties(self) -> int:
        """How many participants are still in the batch."""
        return self._parties

    async def wait(self) -> None:
        """Block until every remaining party has arrived (or raise `TimeoutError` after `timeout_s`)."""
        self._arrived += 1
        if self._arrived >= self._parties:
            self._release()
            return
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout=self._timeout_s)
        except BaseException:
            if not event.is_set():
                self._arrived -= 1
            raise

    def leave(self) -> None:
        """Remove one party for good; releases the others if they were only waiting for it."""
        self._parties -= 1
        if self._parties > 0 and self._arrived >= self._parties:
            self._release()

    def _release(self) -> None:
        event, self._event, self._arrived = self._event, asyncio.Event(), 0
        event.set()


class EnvGroup:
    """Runs one trajectory on each of N managers with a lockstep barrier between phases."""

    def __init__(self, managers: Sequence[EnvManager], barrier_timeout_s: float = 3600.0) -> None:
        """Group existing managers (they keep their own env, LLM client and sink)."""
        # VAL: VAL_NON_EMPTY(managers, exc=EnvError)
        check.non_empty("managers", managers, exc=EnvError)  # generated #ee7d257633
        # VAL: VAL_TIMEOUT(barrier_timeout_s, exc=EnvError)
        check.timeout("barrier_timeout_s", barrier_timeout_s, exc=EnvError)  # generated #47d7da7833
        self.managers = list(managers)
        self.barrier_timeout_s = barrier_timeout_s

    async def run_batch(self, seeds: Sequence[int | None], group_id: str = "") -> list[Trajectory]:
        """Run one batch: manager i plays seed i; returns when the slowest trajectory has ended."""
        # deps: LockstepBarrier.wait, EnvManager.run_trajectory
        # AST: AST_PRECONDITION(len(seeds) == len(self.managers), got=(len(seeds), len(self.managers)), msg="one seed per manager", exc=EnvError)
        check.precondition(len(seeds) == len(self.managers), "one seed per manager", got_lazy=lambda: (len(seeds), len(self.managers)), exc=EnvError)  # generated #7e3e533522
        barrier = LockstepBarrier(len(self.managers), self.barrier_timeout_s)
        for manager in self.managers:
            manager.turn_barrier = barrier
        try:
            return list(
                await asyncio.gather(
                    *(m.run_trajectory(seed=s, group_id=group_id) for m, s in zip(self.managers, seeds))
                )
            )
        finally:
            for manager in self.managers:
                manager.turn_barrier = None


async def run_redundant(
    managers: Sequence[EnvManager], target: int, seeds: Sequence[int | None], group_id: str = ""
) -> list[Trajectory]:
    """Redundant env rollouts (paper §4.2): start one trajectory per manager, keep the first `target`
    that finish, abort the rest with reason `cancelled:redundant`.

    Why: launching more environments than needed hides fail-slow and fail-stop environments; the
    aborted trajectories still end exactly once (they reach the sink ABORTED). Returns fewer than
    `target` only when not enough trajectories finished (failures); all started ones have ended.
    """
    # deps: EnvManager.run_trajectory, EnvManager.cancel
    # VAL: VAL_INT_RANGE(target, min=1, max=len(managers), exc=EnvError)
    check.int_range("target", target, min=1, max=len(managers), exc=EnvError)  # generated #6231c613e9
    # AST: AST_PRECONDITION(len(seeds) == len(managers), got=(len(seeds), len(managers)), msg="one seed per manager", exc=EnvError)
    check.precondition(len(seeds) == len(managers), "one seed per manager", got_lazy=lambda: (len(seeds), len(managers)), exc=EnvError)  # generated #896ab423d3
    tasks = [asyncio.ensure_future(m.run_trajectory(seed=s, group_id=group_id)) for m, s in zip(managers, seeds)]
    finished: list[Trajectory] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            traj = await next_done
            if traj.status == TrajectoryStatus.FINISHED:
                finished.append(traj)
                if len(finished) >= target:
                    break
    finally:
        for manager in managers:
            manager.cancel("redundant")
        await asyncio.gather(*tasks, return_exceptions=True)
    return finished
