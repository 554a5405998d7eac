"""Step 12 (D20): the indexed buffer evicts and selects exactly like the brute-force scans it replaced."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rollart.scheduler.buffer import (
    ABORTED,
    BUFFERED,
    CONSUMED,
    FINISHED_STATUS,
    BufferedTrajectory,
    SampleBuffer,
    TrajectoryRecord,
    group_task,
    oldest_version,
)


@dataclass
class FakeTraj:
    id: str
    group_id: str
    versions: list[int]
    status: str = "finished"
    reason: str = ""

    def weight_versions(self) -> list[int]:
        return list(self.versions)


@dataclass
class _RefGroup:
    seq: int
    members: list[BufferedTrajectory] = field(default_factory=list)

    def min_version(self) -> int:
        return min((oldest_version(t) for t in self.members), default=2**62)


class ReferenceBuffer:
    """The pre-D20 buffer: scans every group on every put and sorts every group on every take."""

    def __init__(self, alpha: int, group_size: int, version: int = 0, tasks: Sequence[str] = (),
                 task_of: Callable[[str], str] | None = None) -> None:
        """Start empty at trainer `version`; alpha = 0 means strictly on-policy.

        `tasks` (optional) turns on task-balanced batches; `task_of` maps a group id to its task
        (default `group_task`: the part before `-g`, as in the RolloutScheduler's `TASK-gN` ids).
        """
        self.alpha = alpha
        self.group_size = group_size
        self.tasks = list(tasks)
        self.task_of = task_of or group_task
        self._version = version
        self._records: dict[str, TrajectoryRecord] = {}
        self._groups: dict[str, _RefGroup] = {}
        self._closed_groups: dict[str, str] = {}  # group id -> "consumed" or the abort reason
        self._seq = 0
        self._changed: asyncio.Event | None = None

    @property
    def version(self) -> int:
        """The trainer version the bound is measured against."""
        return self._version

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _abort_group(self, group_id: str, reason: str) -> list[str]:
        group = self._groups.pop(group_id, None)
        self._closed_groups[group_id] = reason
        ids: list[str] = []
        if group is not None:
            for t in group.members:
                rec = self._records[t.id]
                rec.state = ABORTED
                rec.reason = reason
                ids.append(t.id)
        return ids

    def _evict_stale(self) -> list[str]:
        floor = self._version - self.alpha
        evicted: list[str] = []
        for gid in [g for g, grp in self._groups.items() if grp.min_version() < floor]:
            evicted += self._abort_group(gid, f"stale: oldest version below {floor} (version {self._version}, alpha {self.alpha})")
        return evicted

    def put_nowait(self, trajectory: BufferedTrajectory) -> None:
        """Accept a trajectory (env's TrajectorySink); never blocks, never raises on staleness.

        A trajectory that did not finish, arrives stale, or belongs to a group already closed is
        recorded as aborted at once (and an unfinished member aborts its whole group, D2).
        """
        # deps: oldest_version, SampleBuffer._abort_group
        gid = trajectory.group_id or trajectory.id
        version = oldest_version(trajectory)
        record = TrajectoryRecord(group_id=gid, state=BUFFERED, oldest_version=version)
        self._records[trajectory.id] = record
        status = getattr(trajectory.status, "value", trajectory.status)
        if gid in self._closed_groups:
            record.state, record.reason = ABORTED, f"group {gid} already closed ({self._closed_groups[gid]})"
            return
        if status != FINISHED_STATUS:
            record.state = ABORTED
            record.reason = f"trajectory {status}: {getattr(trajectory, 'reason', '') or 'no reason given'}"
            self._abort_group(gid, f"member {trajectory.id} {status}")
            self._notify()
            return
        group = self._groups.get(gid)
        if group is None:
            self._seq += 1
            group = self._groups[gid] = _RefGroup(seq=self._seq)
        if len(group.members) >= self.group_size:
            record.state, record.reason = ABORTED, f"group {gid} already has {self.group_size} members"
            return
        group.members.append(trajectory)
        self._evict_stale()
        self._notify()

    def set_version(self, version: int) -> list[str]:
        """The trainer moved to `version`: evict every group now outside the bound; return evicted ids."""
        # deps: SampleBuffer._evict_stale
        self._version = version
        evicted = self._evict_stale()
        self._notify()
        return evicted

    def abort_group(self, group_id: str, reason: str) -> list[str]:
        """Abort a group from outside (a member failed in flight); later members are aborted on arrival."""
        if group_id in self._closed_groups:
            return []
        ids = self._abort_group(group_id, reason)
        self._notify()
        return ids

    def _ready_groups(self) -> list[tuple[str, _RefGroup]]:
        ready = [(gid, g) for gid, g in self._groups.items() if len(g.members) == self.group_size]
        ready.sort(key=lambda item: (item[1].min_version(), item[1].seq))
        return ready

    def _quotas(self, groups: int) -> dict[str, int]:
        k = len(self.tasks)
        return {task: groups // k + (1 if i < groups % k else 0) for i, task in enumerate(self.tasks)}

    def _select(self, n: int) -> list[tuple[str, _RefGroup]] | None:
        """The groups a batch of n would take now (oldest first, per task when balanced), or None."""
        ready = [(gid, g) for gid, g in self._ready_groups() if g.min_version() >= self._version - self.alpha]
        groups = n // self.group_size
        if not self.tasks:
            return ready[:groups] if len(ready) >= groups else None
        chosen: list[tuple[str, _RefGroup]] = []
        for task, quota in self._quotas(groups).items():
            mine = [item for item in ready if self.task_of(item[0]) == task][:quota]
            if len(mine) < quota:
                return None
            chosen += mine
        return chosen

    def can_take(self, n: int) -> bool:
        """Whether get_batch(n) could return now: enough complete, in-bound groups (per task when balanced)."""
        return self._select(n) is not None

    def _take(self, n: int) -> list[BufferedTrajectory]:
        batch: list[BufferedTrajectory] = []
        for gid, group in self._select(n) or []:
            del self._groups[gid]
            self._closed_groups[gid] = CONSUMED
            for t in group.members:
                self._records[t.id].state = CONSUMED
            batch.extend(group.members)
        return batch


    def ready_count(self) -> int:
        """Trajectories in complete, in-bound groups (what get_batch could take now)."""
        floor = self._version - self.alpha
        return sum(len(g.members) for g in self._groups.values() if len(g.members) == self.group_size and g.min_version() >= floor)

    def buffered_count(self) -> int:
        """Trajectories held (complete groups or not)."""
        return sum(len(g.members) for g in self._groups.values())

    def records(self) -> dict[str, TrajectoryRecord]:
        """Every id ever put, with its state and abort reason (the accounting invariant)."""
        return dict(self._records)


TASKS = ["a", "b"]


class IndexMatchesReference(RuleBasedStateMachine):
    """The indexed buffer and the brute-force reference get the same operations; their records,
    counts and batches must be identical after every rule (eviction identical to brute force)."""

    @initialize(alpha=st.integers(0, 2), group_size=st.integers(1, 3), balanced=st.booleans())
    def setup(self, alpha, group_size, balanced):
        tasks = TASKS if balanced else ()
        self.buf = SampleBuffer(alpha=alpha, group_size=group_size, tasks=tasks)
        self.ref = ReferenceBuffer(alpha=alpha, group_size=group_size, tasks=tasks)
        self.gs = group_size
        self.n = 0
        self.groups: list[str] = []

    @rule(new_group=st.booleans(), lag=st.integers(0, 4), extra=st.integers(0, 2), failed=st.integers(0, 12), pick=st.integers(0, 50))
    def put(self, new_group, lag, extra, failed, pick):
        if new_group or not self.groups:
            self.groups.append(f"{TASKS[pick % 2]}-g{len(self.groups)}")
            gid = self.groups[-1]
        else:
            gid = self.groups[pick % len(self.groups)]
        self.n += 1
        v = self.buf.version
        versions = [max(0, v - lag)] + [max(0, v - lag + extra)] * extra
        status = "failed" if failed == 0 else "finished"
        for b in (self.buf, self.ref):
            b.put_nowait(FakeTraj(f"t{self.n}", gid, versions, status=status))

    @rule(step=st.integers(0, 2))
    def bump_version(self, step):
        v = self.buf.version + step
        assert self.buf.set_version(v) == self.ref.set_version(v)

    @rule(pick=st.integers(0, 50))
    def abort(self, pick):
        if self.groups:
            gid = self.groups[pick % len(self.groups)]
            assert self.buf.abort_group(gid, "test abort") == self.ref.abort_group(gid, "test abort")

    @rule(k=st.integers(1, 4))
    def take(self, k):
        n = k * self.gs
        assert self.buf.can_take(n) == self.ref.can_take(n)
        self.ref._evict_stale()
        if self.ref.can_take(n):
            want = [t.id for t in self.ref._take(n)]
            got = [t.id for t in asyncio.run(self.buf.get_batch(n, timeout_s=1.0))]
            assert got == want

    @invariant()
    def same_records_and_counts(self):
        if not hasattr(self, "buf"):
            return
        assert self.buf.records() == self.ref.records()
        assert self.buf.ready_count() == self.ref.ready_count()
        assert self.buf.buffered_count() == self.ref.buffered_count()


TestIndexMatchesReference = IndexMatchesReference.TestCase
TestIndexMatchesReference.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
