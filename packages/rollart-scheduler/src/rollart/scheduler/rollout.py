"""The RolloutScheduler: keeps EnvManagers running into the SampleBuffer.

Why groups of managers: GRPO needs `group_size` trajectories of the same task (same seed); each
group slot owns `group_size` EnvManagers (one trajectory at a time each, paper Fig. 7) and runs its
members concurrently. Launching `ceil(groups_per_batch * redundancy)` slots at once is the paper's
redundancy (§5.3): the batch fills from the fastest groups and the rest carry over or are aborted.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Protocol

from rollart import checks as check
from rollart.env.manager import EnvManager
from rollart.env.trajectory import Trajectory
from rollart.scheduler.buffer import FINISHED_STATUS, SampleBuffer
from rollart.scheduler.errors import ConfigError, SchedulerError, SchedulerTimeout


class GenerationControl(Protocol):
    """What the scheduler needs from the LLM side (LLMProxy satisfies it)."""

    async def suspend(self) -> None:
        """Pause generation so the weights can be swapped: new requests wait, running ones pause in place.

        Called by `RolloutScheduler.suspend` before every weight update, bounded by
        `pipeline.update_timeout_s` (past it: `SchedulerTimeout`), and when the pipeline closes. On
        return no token is generated until `resume`; paused requests keep the tokens they have.
        """
        ...

    async def resume(self) -> None:
        """Continue generating after `suspend`, with the weights loaded meanwhile.

        Called by `RolloutScheduler.resume` after the update, once the trajectories now out of the
        bound are aborted.
        """
        ...

    async def abort(self, trajectory_id: str, reason: str = "aborted by client") -> int:
        """Answer every in-flight request of `trajectory_id` at once with finish_reason `abort` and `reason`.

        Called by `RolloutScheduler` for each trajectory it aborts (stale at a resume, every one in
        `one_off`, the redundant rest in `sync`), right after cancelling its EnvManager and possibly
        while suspended. Returns how many requests were aborted; 0 (nothing in flight) is not an error.
        """
        ...


def _oldest_so_far(traj: Trajectory) -> int | None:
    versions = [v for t in traj.turns for v in (t.response_weight_versions or [t.weight_version]) if v >= 0]
    return min(versions) if versions else None


def check_slot_shapes(slots: Sequence[Sequence[EnvManager]], slot_tasks: Sequence[str], buffer: SampleBuffer) -> None:
    """Refuse, at construction, slots that can never fill a batch (issue 25: they used to hang silently).

    A slot runs one GRPO group, so it must hold exactly `buffer.group_size` managers (a group of 3
    never completes a group of 4); with a task-balanced buffer, every slot's task must be one of the
    buffer's tasks and every buffer task must have a slot (a task without one never fills its quota).
    """
    # deps: none
    sizes = [len(slot) for slot in slots]
    bad = next((i for i, n in enumerate(sizes) if n != buffer.group_size), None)
    # AST: AST_PRECONDITION(bad is None, got={"slot": bad, "env_managers": sizes[bad], "group_size": buffer.group_size}, msg="each slot holds group_size EnvManagers (it runs one GRPO group)", exc=ConfigError)
    check.precondition(bad is None, "each slot holds group_size EnvManagers (it runs one GRPO group)", got_lazy=lambda: {"slot": bad, "env_managers": sizes[bad], "group_size": buffer.group_size}, exc=ConfigError)  # generated #848f29eca4
    if buffer.tasks:
        # AST: AST_PRECONDITION(set(slot_tasks) == set(buffer.tasks), got={"slot_tasks": sorted(set(slot_tasks)), "buffer_tasks": sorted(buffer.tasks)}, msg="the slots run exactly the task-balanced buffer's tasks", exc=ConfigError)
        check.precondition(set(slot_tasks) == set(buffer.tasks), "the slots run exactly the task-balanced buffer's tasks", got_lazy=lambda: {"slot_tasks": sorted(set(slot_tasks)), "buffer_tasks": sorted(buffer.tasks)}, exc=ConfigError)  # generated #e639f9ad44


class RolloutScheduler:
    """Keeps EnvManagers running into the buffer; suspend/resume, staleness aborts, redundancy."""

    def __init__(
        self,
        slots: Sequence[Sequence[EnvManager]],
        slot_tasks: Sequence[str],
        buffer: SampleBuffer,
        control: GenerationControl,
        carry_over: bool = True,
        seed: int = 0,
        seed_fn: Callable[[str, int], int] | None = None,
        lockstep: bool = False,
        once_per_launch: bool = False,
    ) -> None:
        """`slots[i]` are the group_size managers of group slot i, running task `slot_tasks[i]`.

        `carry_over=False` (one_off mode) aborts every in-flight trajectory at each resume, so no
        trajectory mixes weight versions. `lockstep=True` is the batch-level baseline (paper Fig. 5b,
        design D24): every slot starts together in waves and every turn of the wave waits for all
        generations and all environment steps of the wave (rollart-env's LockstepBarrier).
        `once_per_launch=True` (sync mode) runs each slot's group once per `resume_launches`: a slot
        that finishes early waits for the next iteration instead of starting work that the batch
        boundary would abort.
        """
        if len(slots) != len(slot_tasks) or not slots:
            raise SchedulerError(f"slots and slot_tasks must be non-empty and of equal length, got {len(slots)} and {len(slot_tasks)}")
        self.slots = [list(s) for s in slots]
        self.slot_tasks = list(slot_tasks)
        check_slot_shapes(self.slots, self.slot_tasks, buffer)
        self.buffer = buffer
        self.control = control
        self.carry_over = carry_over
        self._rng = random.Random(seed)
        self._seed_fn = seed_fn or (lambda task, n: self._rng.randrange(1_000_000))
        self._gids = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._gate: asyncio.Event | None = None
        self.aborted_inflight = 0
        self.lockstep = lockstep
        self._stopping = False  # a slot whose managers all swallowed the stop (an abort raced it) exits here
        self.once_per_launch = once_per_launch
        self._launch = asyncio.Event()  # replaced (and the old one set) by every resume_launches
        # D44: a continuously launching slot starts a group only while its task has fewer than
        # (max(1, alpha) + 1) x its slots outstanding (admitted, not yet consumed or aborted)
        self.admission = not once_per_launch and not lockstep
        per_task = collections.Counter(self.slot_tasks)
        share = max(1, buffer.alpha) + 1
        self.room_limits = {t: share * (per_task[t] if buffer.tasks else len(self.slots)) for t in per_task}

    def _managers_inflight(self) -> list[EnvManager]:
        return [m for slot in self.slots for m in slot if m.current is not None and not m.current.ended]

    async def _run_group(self, index: int) -> bool:
        """Run one group on slot `index`; True when every member finished (the group can enter a batch)."""
        managers, task = self.slots[index], self.slot_tasks[index]
        if self.admission:
            await self.buffer.wait_for_room(task, self.room_limits[task])
        n = next(self._gids)
        gid = f"{task}-g{n}"
        seed = self._seed_fn(task, n)
        if self.admission:
            self.buffer.admit(gid)
        try:
            ended = await asyncio.gather(*(m.run_trajectory(seed=seed, group_id=gid) for m in managers))
        except BaseException:  # cancelled (stop) or a manager broke: close the group so its place is given back
            if self.admission:
                self.buffer.abort_group(gid, "its rollout slot stopped")
            raise
        return all(getattr(t.status, "value", t.status) == FINISHED_STATUS for t in ended)

    async def _slot_loop(self, index: int) -> None:
        while not self._stopping:
            assert self._gate is not None
            await self._gate.wait()
            launch = self._launch
            complete = await self._run_group(index)
            # D62: a group that failed or was aborted is replaced within the iteration; waiting for the next
            # launch instead could leave a sync batch short for good (nothing else would refill it)
            if self.once_per_launch and complete:
                await launch.wait()

    async def _wave_loop(self) -> None:
        """Batch-level interaction: all slots as one wave in lockstep; the next wave starts when it has ended."""
        from rollart.env.group import LockstepBarrier

        managers = [m for slot in self.slots for m in slot]
        while not self._stopping:
            assert self._gate is not None
            await self._gate.wait()
            barrier = LockstepBarrier(len(managers), timeout_s=1e9)
            for m in managers:
                m.turn_barrier = barrier
            launch = self._launch
            try:
                complete = await asyncio.gather(*(self._run_group(i) for i in range(len(self.slots))))
            finally:
                for m in managers:
                    m.turn_barrier = None
            if self.once_per_launch and all(complete):  # D62: a wave with a failed group runs again
                await launch.wait()

    async def start(self) -> None:
        """Launch ceil(groups_per_batch * redundancy) groups and keep that many in flight."""
        if self._tasks:
            return
        self._stopping = False
        self._gate = asyncio.Event()
        self._gate.set()
        if self.lockstep:
            self._tasks = [asyncio.create_task(self._wave_loop(), name="rollout-waves")]
            return
        self._tasks = [asyncio.create_task(self._slot_loop(i), name=f"rollout-slot-{i}") for i in range(len(self.slots))]

    def pause_launches(self) -> None:
        """Start no new groups (sync mode, while training); running ones continue unless aborted."""
        if self._gate is not None:
            self._gate.clear()

    def resume_launches(self) -> None:
        """Start groups again (with `once_per_launch`, each slot one more group)."""
        launch, self._launch = self._launch, asyncio.Event()
        launch.set()
        if self._gate is not None:
            self._gate.set()

    async def suspend(self, timeout_s: float) -> None:
        """Pause generation (the proxy holds requests) so weights can be swapped."""
        # VAL: VAL_TIMEOUT(timeout_s, exc=SchedulerError)
        check.timeout("timeout_s", timeout_s, exc=SchedulerError)  # generated #4c6d4a16bf
        try:
            await asyncio.wait_for(self.control.suspend(), timeout_s)
        except TimeoutError:
            raise SchedulerTimeout(f"suspend of the rollout did not finish within {timeout_s}s") from None

    async def _abort(self, managers: list[EnvManager], reason: str) -> list[str]:
        ids = []
        for m in managers:
            traj = m.current
            if traj is not None and m.cancel(reason):
                ids.append(traj.id)
        await asyncio.gather(*(self.control.abort(i, reason) for i in ids))
        self.aborted_inflight += len(ids)
        return ids

    async def resume(self, version: int) -> list[str]:
        """Resume at `version`: abort in-flight trajectories now out of bound (or all, in one_off)."""
        floor = self.buffer.version - self.buffer.alpha
        if self.carry_over:
            stale = [m for m in self._managers_inflight()
                     if (v := _oldest_so_far(m.current)) is not None and v < floor]  # type: ignore[arg-type]
            ids = await self._abort(stale, f"stale: oldest version below {floor} at version {version}")
        else:
            ids = await self._abort(self._managers_inflight(), f"one_off: no carry-over into version {version}")
        await self.control.resume()
        return ids

    async def abort_inflight(self, reason: str) -> list[str]:
        """Abort every in-flight group (sync mode: the redundant rest once the batch is full)."""
        return await self._abort(self._managers_inflight(), reason)

    def inflight(self) -> int:
        """Trajectories running now."""
        return len(self._managers_inflight())

    async def stop(self, timeout_s: float) -> None:
        """Cancel every EnvManager task and wait for them, with a deadline."""
        # VAL: VAL_TIMEOUT(timeout_s, exc=SchedulerError)
        check.timeout("timeout_s", timeout_s, exc=SchedulerError)  # generated #4c6d4a16bf
        tasks, self._tasks = self._tasks, []
        self._stopping = True
        for t in tasks:
            t.cancel()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                raise SchedulerTimeout(f"{len(pending)} rollout slots did not stop within {timeout_s}s")
        await asyncio.gather(*(m.close() for slot in self.slots for m in slot), return_exceptions=True)
