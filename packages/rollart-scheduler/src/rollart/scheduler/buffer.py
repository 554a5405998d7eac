"""The SampleBuffer: finished trajectories wait here until a train step takes them.

Why a dedicated structure: the asynchronous bound alpha (paper §5.3) must hold for every batch,
and GRPO needs complete groups. Both are enforced here *by construction* (design D1-D3): groups are
the unit of eligibility, eviction and consumption; eviction and selection happen in one critical
section of the event loop, and a postcondition re-checks every batch.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollart import checks as check
from rollart.scheduler.errors import SchedulerError, SchedulerTimeout

if TYPE_CHECKING:
    from rollart.scheduler.settings import PipelineConfig

BUFFERED = "buffered"
CONSUMED = "consumed"
ABORTED = "aborted"
FINISHED_STATUS = "finished"


@runtime_checkable
class BufferedTrajectory(Protocol):
    """What the buffer needs from a trajectory: identity, group, status and token versions.

    `rollart.env.Trajectory` satisfies it; the buffer never looks at tokens or rewards.
    """

    id: str
    """Unique per trajectory: the buffer accounts each id exactly once, and a second put of it is an error."""

    group_id: str
    """The GRPO group (`TASK-gN` from the RolloutScheduler); `""` makes the trajectory a group of its own."""

    status: str
    """Read once, at `put_nowait`: anything but `finished` (or its enum) aborts the trajectory and its group."""

    def weight_versions(self) -> list[int]:
        """The weight versions that produced the trajectory's tokens (one per turn will do); read once per put.

        Its minimum decides staleness: the trajectory is trainable at trainer version v only while
        that minimum is at least v - alpha (D1). Empty (no tokens) counts as version -1; `None`
        entries are skipped. Must be cheap: it runs on every put, on the event loop.
        """
        ...


@dataclass
class TrajectoryRecord:
    """The accounting entry of one trajectory id: its state and, when aborted, why."""

    group_id: str
    state: str
    oldest_version: int
    reason: str = ""


NO_VERSION = 2**62


@dataclass
class _Group:
    seq: int
    members: list[BufferedTrajectory] = field(default_factory=list)
    oldest: int = NO_VERSION  # min of the members' oldest versions, kept as members arrive (D20)

    def min_version(self) -> int:
        return self.oldest


_Entry = tuple[int, int, str]  # (oldest version, group seq, group id): the order of eviction and of batches


def group_task(group_id: str) -> str:
    """The task of a RolloutScheduler group id `TASK-gN` (the whole id when it has no `-g`)."""
    return group_id.rsplit("-g", 1)[0]


def oldest_version(trajectory: BufferedTrajectory) -> int:
    """The oldest weight version that produced any token (D1); -1 when none is known."""
    # deps: BufferedTrajectory.weight_versions
    versions = trajectory.weight_versions()
    if None in versions:  # rare: filter only then (this runs on every put)
        versions = [v for v in versions if v is not None]
    return min(versions) if versions else -1


class SampleBuffer:
    """Group-aware store of finished trajectories that enforces the asynchronous bound alpha.

    A trajectory whose oldest token came from version k may be trained at trainer version v only if
    k >= v - alpha. Every id put is accounted exactly once in `records()`: buffered, consumed, or
    aborted with a reason.

    With `tasks` given, batches are task-balanced (design D13): a batch of g groups holds
    g // len(tasks) groups of every task (the remainder goes to the first tasks), so the batch mix,
    and with it the reward curve, does not depend on which groups happen to finish first, and a slow
    task is waited for instead of starved.
    """

    def __init__(self, alpha: int, group_size: int, version: int = 0, tasks: Sequence[str] = (),
                 task_of: Callable[[str], str] | None = None) -> None:
        """Start empty at trainer `version`; alpha = 0 means strictly on-policy.

        `tasks` (optional) turns on task-balanced batches; `task_of` maps a group id to its task
        (default `group_task`: the part before `-g`, as in the RolloutScheduler's `TASK-gN` ids).
        """
        # VAL: VAL_INT_RANGE(alpha, min=0, max=1_000_000, exc=SchedulerError)
        check.int_range("alpha", alpha, min=0, max=1_000_000, exc=SchedulerError)  # generated #e5160b4fa7
        # VAL: VAL_INT_RANGE(group_size, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("group_size", group_size, min=1, max=1_000_000, exc=SchedulerError)  # generated #c7c5acde15
        # VAL: VAL_INT_RANGE(version, min=0, max=2**62, exc=SchedulerError)
        check.int_range("version", version, min=0, max=2**62, exc=SchedulerError)  # generated #73edfee2eb
        # AST: AST_PRECONDITION(len(set(tasks)) == len(tasks), got=list(tasks), msg="tasks are distinct", exc=SchedulerError)
        check.precondition(len(set(tasks)) == len(tasks), "tasks are distinct", got_lazy=lambda: list(tasks), exc=SchedulerError)  # generated #940c2c2703
        self.alpha = alpha
        self.group_size = group_size
        self.tasks = list(tasks)
        self.task_of = task_of or group_task
        self._version = version
        self._records: dict[str, TrajectoryRecord] = {}
        self._groups: dict[str, _Group] = {}
        self._closed_groups: dict[str, str] = {}  # group id -> "consumed" or the abort reason
        self._seq = 0
        self._changed: asyncio.Event | None = None
        self._by_version: list[_Entry] = []  # every open group, lazily invalidated (D20)
        self._ready: dict[str | None, list[_Entry]] = {}  # complete groups per task (None: unbalanced)
        self._buffered = 0
        self._observers: list[Callable[[BufferedTrajectory], None]] = []
        self._settled: list[Callable[[BufferedTrajectory, str, str], None]] = []  # (trajectory, state, reason): D50
        self._admitted: dict[str, str | None] = {}  # group id -> task key, from admit() until the group closes (D44)
        self._outstanding: dict[str | None, int] = {}  # admitted, still open groups per task key
        self._room: dict[str | None, collections.deque[tuple[int, asyncio.Future[None]]]] = {}  # wait_for_room, FIFO

    @classmethod
    def from_config(cls, config: PipelineConfig, tasks: Sequence[str] = (), version: int = 0) -> SampleBuffer:
        """The buffer a run config asks for: its pipeline's alpha and group size (what `Pipeline` checks)."""
        return cls(alpha=config.pipeline.alpha, group_size=config.pipeline.group_size, version=version, tasks=tasks)

    def observe(self, callback: Callable[[BufferedTrajectory], None]) -> None:
        """Call `callback(trajectory)` for every trajectory put, before it is accounted (kept or not)."""
        self._observers.append(callback)

    def observe_settled(self, callback: Callable[[BufferedTrajectory, str, str], None]) -> None:
        """Call `callback(trajectory, state, reason)` once per trajectory when it is consumed or aborted (D50)."""
        self._settled.append(callback)

    def _settle(self, trajectory: BufferedTrajectory, state: str, reason: str) -> None:
        for callback in self._settled:
            callback(trajectory, state, reason)

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
        self._release(group_id)
        ids: list[str] = []
        if group is not None:
            self._buffered -= len(group.members)
            for t in group.members:
                rec = self._records[t.id]
                rec.state = ABORTED
                rec.reason = reason
                ids.append(t.id)
                self._settle(t, ABORTED, reason)
        return ids

    def _live(self, entry: _Entry) -> bool:
        group = self._groups.get(entry[2])
        return group is not None and group.seq == entry[1] and group.oldest == entry[0]

    def _compact(self, heap: list[_Entry]) -> list[_Entry]:
        """A heap without its dead entries: called when it holds more than twice the open groups
        (plus 64), so memory stays O(groups) and the rebuild is amortised O(1) per entry."""
        live = [e for e in heap if self._live(e)]
        heapq.heapify(live)
        return live

    def _evict_stale(self) -> list[str]:
        """Abort every group whose oldest version is below the floor: pops the version heap, O(log n) each."""
        floor = self._version - self.alpha
        heap = self._by_version
        stale: list[_Entry] = []
        while heap and heap[0][0] < floor:
            entry = heapq.heappop(heap)
            if self._live(entry):
                stale.append(entry)
        evicted: list[str] = []
        for _, _, gid in sorted(stale, key=lambda e: e[1]):  # arrival order, as the scan did
            evicted += self._abort_group(gid, f"stale: oldest version below {floor} (version {self._version}, alpha {self.alpha})")
        return evicted

    def put_nowait(self, trajectory: BufferedTrajectory) -> None:
        """Accept a trajectory (env's TrajectorySink); never blocks, never raises on staleness.

        A trajectory that did not finish, arrives stale, or belongs to a group already closed is
        recorded as aborted at once (and an unfinished member aborts its whole group, D2).
        """
        # deps: oldest_version, SampleBuffer._abort_group
        # AST: AST_PRECONDITION(trajectory.id not in self._records, got=trajectory.id, msg="a trajectory is put at most once", exc=SchedulerError)
        check.precondition(trajectory.id not in self._records, "a trajectory is put at most once", got=trajectory.id, exc=SchedulerError)  # generated #cc18eb38ec
        for observe in self._observers:
            observe(trajectory)
        gid = trajectory.group_id or trajectory.id
        version = oldest_version(trajectory)
        record = TrajectoryRecord(group_id=gid, state=BUFFERED, oldest_version=version)
        self._records[trajectory.id] = record
        status = getattr(trajectory.status, "value", trajectory.status)
        if gid in self._closed_groups:
            record.state, record.reason = ABORTED, f"group {gid} already closed ({self._closed_groups[gid]})"
            self._settle(trajectory, ABORTED, record.reason)
            return
        if status != FINISHED_STATUS:
            record.state = ABORTED
            record.reason = f"trajectory {status}: {getattr(trajectory, 'reason', '') or 'no reason given'}"
            self._settle(trajectory, ABORTED, record.reason)
            self._abort_group(gid, f"member {trajectory.id} {status}")
            self._notify()
            return
        group = self._groups.get(gid)
        if group is None:
            self._seq += 1
            group = self._groups[gid] = _Group(seq=self._seq)
        if len(group.members) >= self.group_size:
            record.state, record.reason = ABORTED, f"group {gid} already has {self.group_size} members"
            self._settle(trajectory, ABORTED, record.reason)
            return
        group.members.append(trajectory)
        self._buffered += 1
        limit = 2 * len(self._groups) + 64
        if version < group.oldest:
            group.oldest = version
            heapq.heappush(self._by_version, (version, group.seq, gid))
            if len(self._by_version) > limit:
                self._by_version = self._compact(self._by_version)
        if len(group.members) == self.group_size:
            key = self.task_of(gid) if self.tasks else None
            heap = self._ready.setdefault(key, [])
            heapq.heappush(heap, (group.oldest, group.seq, gid))
            if len(heap) > limit:
                self._ready[key] = self._compact(heap)
        if self._by_version[0][0] < self._version - self.alpha:
            self._evict_stale()
        self._notify()

    def set_version(self, version: int) -> list[str]:
        """The trainer moved to `version`: evict every group now outside the bound; return evicted ids."""
        # deps: SampleBuffer._evict_stale
        # VAL: VAL_VERSION_MONOTONIC(version, self._version, strict=False, exc=SchedulerError)
        check.version_monotonic("version", version, self._version, strict=False, exc=SchedulerError)  # generated #1681162dd7
        self._version = version
        evicted = self._evict_stale()
        self._notify()
        return evicted

    def abort_group(self, group_id: str, reason: str) -> list[str]:
        """Abort a group from outside (a member failed in flight); later members are aborted on arrival."""
        # VAL: VAL_NON_EMPTY(reason, exc=SchedulerError)
        check.non_empty("reason", reason, exc=SchedulerError)  # generated #063038851c
        if group_id in self._closed_groups:
            return []
        ids = self._abort_group(group_id, reason)
        self._notify()
        return ids

    def _quotas(self, groups: int) -> dict[str, int]:
        k = len(self.tasks)
        return {task: groups // k + (1 if i < groups % k else 0) for i, task in enumerate(self.tasks)}

    def _oldest_ready(self, key: str | None, quota: int) -> list[tuple[str, _Group]]:
        """Up to `quota` complete in-bound groups of a task, oldest first; the heap is left as it was
        (minus dead entries). O(quota log n) plus the out-of-bound groups not yet evicted."""
        heap = self._ready.get(key, [])
        if len(heap) < quota:  # the heap holds every ready group (and some dead entries): too few, O(1)
            return []
        floor = self._version - self.alpha
        popped: list[_Entry] = []
        chosen: list[tuple[str, _Group]] = []
        while heap and len(chosen) < quota:
            entry = heapq.heappop(heap)
            if not self._live(entry):
                continue
            popped.append(entry)
            if entry[0] >= floor:
                chosen.append((entry[2], self._groups[entry[2]]))
        for entry in popped:
            heapq.heappush(heap, entry)
        return chosen

    def _select(self, n: int) -> list[tuple[str, _Group]] | None:
        """The groups a batch of n would take now (oldest first, per task when balanced), or None."""
        groups = n // self.group_size
        if not self.tasks:
            ready = self._oldest_ready(None, groups)
            return ready if len(ready) >= groups else None
        chosen: list[tuple[str, _Group]] = []
        for task, quota in self._quotas(groups).items():
            mine = self._oldest_ready(task, quota)
            if len(mine) < quota:
                return None
            chosen += mine
        return chosen

    def can_take(self, n: int) -> bool:
        """Whether get_batch(n) could return now: enough complete, in-bound groups (per task when balanced)."""
        return self._select(n) is not None

    def _take(self, n: int, chosen: list[tuple[str, _Group]] | None = None) -> list[BufferedTrajectory]:
        batch: list[BufferedTrajectory] = []
        for gid, group in (chosen if chosen is not None else self._select(n)) or []:
            del self._groups[gid]
            self._buffered -= len(group.members)
            self._closed_groups[gid] = CONSUMED
            self._release(gid)
            for t in group.members:
                self._records[t.id].state = CONSUMED
                self._settle(t, CONSUMED, "")
            batch.extend(group.members)
        return batch

    async def get_batch(self, n: int, timeout_s: float) -> list[BufferedTrajectory]:
        """Wait until n trajectories of complete, in-bound groups exist; take them oldest first.

        When balanced (`tasks`), each task contributes its quota of groups, oldest first. Evictions while waiting are refilled by later groups, so the batch has exactly n items.

        Raises:
            SchedulerTimeout: the batch was not complete within `timeout_s` seconds.
        """
        # deps: SampleBuffer._evict_stale, SampleBuffer._take
        # VAL: VAL_INT_RANGE(n, min=1, max=1_000_000, exc=SchedulerError)
        check.int_range("n", n, min=1, max=1_000_000, exc=SchedulerError)  # generated #88e567b856
        # AST: AST_PRECONDITION(n % self.group_size == 0, got=n, msg="n is a multiple of group_size", exc=SchedulerError)
        check.precondition(n % self.group_size == 0, "n is a multiple of group_size", got=n, exc=SchedulerError)  # generated #f9ab13e8ec
        # VAL: VAL_TIMEOUT(timeout_s, exc=SchedulerError)
        check.timeout("timeout_s", timeout_s, exc=SchedulerError)  # generated #4c6d4a16bf
        loop = asyncio.get_running_loop()
        if self._changed is None:
            self._changed = asyncio.Event()
        deadline = loop.time() + timeout_s
        while True:
            self._evict_stale()
            chosen = self._select(n)  # can_take, without selecting twice
            if chosen is not None:
                batch = self._take(n, chosen)
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SchedulerTimeout(
                    f"get_batch({n}) waited {timeout_s}s; only {self.ready_count()} trajectories in complete in-bound groups"
                )
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=remaining)
            except TimeoutError:
                pass
        # AST: AST_POSTCONDITION(len(batch) == n, got=len(batch), msg="batch refilled to exactly n", exc=SchedulerError)
        check.postcondition(len(batch) == n, "batch refilled to exactly n", got_lazy=lambda: len(batch), exc=SchedulerError)  # generated #10b2b120c0
        # AST: AST_POSTCONDITION(all([oldest_version(t) >= self._version - self.alpha for t in batch]), got=[oldest_version(t) for t in batch], msg="no trajectory violates the bound", exc=SchedulerError)
        check.postcondition(all([oldest_version(t) >= self._version - self.alpha for t in batch]), "no trajectory violates the bound", got_lazy=lambda: [oldest_version(t) for t in batch], exc=SchedulerError)  # generated #464f018ca6
        return batch

    def _release(self, group_id: str) -> None:
        """An admitted group closed (consumed or aborted): give back its place to the longest waiter."""
        if group_id not in self._admitted:  # put from outside a RolloutScheduler: never counted
            return
        key = self._admitted.pop(group_id)
        self._outstanding[key] -= 1
        self._wake_one(key)

    def _wake_one(self, key: str | None) -> None:
        """Wake the first live waiter of `key` if there is room for it. One per freed place: the woken slot
        admits its group before anyone else runs, so waking more would only send them back to the queue."""
        waiters = self._room.get(key)
        while waiters:
            limit, future = waiters[0]
            if future.done():  # its slot was cancelled while waiting
                waiters.popleft()
                continue
            if self._outstanding.get(key, 0) < limit:
                waiters.popleft()
                future.set_result(None)
            return

    def outstanding(self, task: str | None = None) -> int:
        """Admitted groups of `task` not yet consumed or aborted (all tasks when unbalanced): in flight, being
        scored, or buffered. O(1)."""
        return self._outstanding.get(task if self.tasks else None, 0)

    async def wait_for_room(self, task: str | None, limit: int) -> None:
        """Return once fewer than `limit` groups of `task` are outstanding (D44: a slot's admission).

        Why the buffer counts: a group stays outstanding from `admit` until it is consumed or aborted
        (evicted as stale included), and only the buffer sees that; it wakes the waiters that have room
        when the count drops, one per freed place, with no polling: amortised O(1) per admission.
        """
        # deps: SampleBuffer.outstanding
        key = task if self.tasks else None
        while self._outstanding.get(key, 0) >= limit:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._room.setdefault(key, collections.deque()).append((limit, future))
            try:
                await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():  # woken, then cancelled: hand the place on
                    self._wake_one(key)
                raise

    def admit(self, group_id: str) -> None:
        """Count `group_id` as outstanding until it closes: the RolloutScheduler calls it as a slot starts the group."""
        # AST: AST_PRECONDITION(group_id not in self._admitted and group_id not in self._closed_groups and group_id not in self._groups, got=group_id, msg="a group is admitted once, before any member arrives", exc=SchedulerError)
        check.precondition(group_id not in self._admitted and group_id not in self._closed_groups and group_id not in self._groups, "a group is admitted once, before any member arrives", got=group_id, exc=SchedulerError)  # generated #d2b00a5190
        key = self.task_of(group_id) if self.tasks else None
        self._admitted[group_id] = key
        self._outstanding[key] = self._outstanding.get(key, 0) + 1

    def ready_count(self) -> int:
        """Trajectories in complete, in-bound groups (what get_batch could take now)."""
        floor = self._version - self.alpha
        return sum(len(g.members) for g in self._groups.values() if len(g.members) == self.group_size and g.min_version() >= floor)

    def buffered_count(self) -> int:
        """Trajectories held (complete groups or not)."""
        return self._buffered

    def records(self) -> dict[str, TrajectoryRecord]:
        """Every id ever put, with its state and abort reason (the accounting invariant)."""
        return dict(self._records)
