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
from dataclasses import dataclass
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


@dataclass(slots=True)
class TrajectoryRecord:
    """The accounting entry of one trajectory id: its state and, when aborted, why."""

    group_id: str
    state: str
    oldest_version: int
    reason: str = ""


FAILED_PREFIX = "trajectory failed"


@dataclass(frozen=True)
class BufferCounts:
    """Every trajectory id put, by bucket, kept as counters (D55): what the pipeline and `rollart sim` report.

    `consumed + aborted + buffered` is the number of puts; `failed` (a member that did not finish because
    it failed: env crash, LLM error, deadline) is a subset of `aborted`, and `timeouts` a subset of `failed`.
    """

    buffered: int
    consumed: int
    aborted: int
    failed: int
    timeouts: int

    @property
    def total(self) -> int:
        """Ids put so far (each in exactly one of buffered, consumed, aborted)."""
        return self.buffered + self.consumed + self.aborted


RecordLedger = Callable[[str, TrajectoryRecord], None]
"""Where a closed record goes when the buffer forgets it (D55): called once per id, with its final state."""


NO_VERSION = 2**62


class _Group:
    __slots__ = ("members", "oldest", "seq")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.members: list[BufferedTrajectory] = []
        self.oldest = NO_VERSION  # min of the members' oldest versions, kept as members arrive (D20)

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
                 task_of: Callable[[str], str] | None = None, ledger: RecordLedger | None = None) -> None:
        """Start empty at trainer `version`; alpha = 0 means strictly on-policy.

        `tasks` (optional) turns on task-balanced batches; `task_of` maps a group id to its task
        (default `group_task`: the part before `-g`, as in the RolloutScheduler's `TASK-gN` ids).
        `ledger` (D55): without it every record is kept (`records()` lists every id ever put); with it
        a record is handed to `ledger(id, record)` once its group closes and forgotten, so memory follows
        the open backlog, not the run's length (`counts()` keeps the totals either way).
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
        self._records: dict[str, TrajectoryRecord] = {}  # with a ledger: the ids of open groups only (D55)
        self._groups: dict[str, _Group] = {}
        self._closed_groups: dict[str, str] = {}  # group id -> "consumed" or the abort reason
        self._ledger = ledger
        self._expected: dict[str, int] = {}  # with a ledger: closed group -> members still to arrive (D55)
        self._consumed = 0
        self._aborted = 0
        self._failed = 0
        self._timeouts = 0
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
    def from_config(cls, config: PipelineConfig, tasks: Sequence[str] = (), version: int = 0,
                    ledger: RecordLedger | None = None) -> SampleBuffer:
        """The buffer a run config asks for: its pipeline's alpha and group size (what `Pipeline` checks)."""
        return cls(alpha=config.pipeline.alpha, group_size=config.pipeline.group_size, version=version, tasks=tasks,
                   ledger=ledger)

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

    def _close(self, tid: str, record: TrajectoryRecord, state: str, reason: str = "") -> None:
        """Move one record to its final state: count it and, with a ledger, hand it over and forget it (D55)."""
        record.state = state
        if state == CONSUMED:
            self._consumed += 1
        else:
            record.reason = reason
            self._aborted += 1
            if reason.startswith(FAILED_PREFIX):
                self._failed += 1
                self._timeouts += "timeout" in reason
        if self._ledger is not None:
            del self._records[tid]
            self._ledger(tid, record)

    def _closed(self, group_id: str, reason: str, arrived: int) -> None:
        """Remember a closed group: for ever without a ledger; with one, only until its missing members arrive."""
        if self._ledger is None:
            self._closed_groups[group_id] = reason
        elif arrived < self.group_size:
            self._closed_groups[group_id] = reason
            self._expected[group_id] = self.group_size - arrived

    def _late_member(self, group_id: str) -> None:
        """A member of a closed group arrived; with a ledger, forget the group once none is missing."""
        left = self._expected.get(group_id)
        if left is not None:
            if left <= 1:
                del self._expected[group_id], self._closed_groups[group_id]
            else:
                self._expected[group_id] = left - 1

    def _abort_group(self, group_id: str, reason: str, arrived_extra: int = 0) -> list[str]:
        group = self._groups.pop(group_id, None)
        self._closed(group_id, reason, arrived_extra + (len(group.members) if group is not None else 0))
        self._release(group_id)
        ids: list[str] = []
        if group is not None:
            self._buffered -= len(group.members)
            records = self._records
            for t in group.members:
                self._close(t.id, records[t.id], ABORTED, reason)
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
        if self._observers:
            for observe in self._observers:
                observe(trajectory)
        tid = trajectory.id
        gid = trajectory.group_id or tid
        versions = trajectory.weight_versions()  # oldest_version, inlined: this is the hot path (D56)
        if None in versions:
            versions = [v for v in versions if v is not None]
        version = min(versions) if versions else -1
        record = TrajectoryRecord(gid, BUFFERED, version)
        self._records[tid] = record
        status = trajectory.status
        status = getattr(status, "value", status)
        if gid in self._closed_groups:
            reason = f"group {gid} already closed ({self._closed_groups[gid]})"
            self._late_member(gid)
            self._close(tid, record, ABORTED, reason)
            self._settle(trajectory, ABORTED, reason)
            return
        if status != FINISHED_STATUS:
            reason = f"trajectory {status}: {getattr(trajectory, 'reason', '') or 'no reason given'}"
            self._close(tid, record, ABORTED, reason)
            self._settle(trajectory, ABORTED, reason)
            self._abort_group(gid, f"member {tid} {status}", arrived_extra=1)
            self._notify()
            return
        group = self._groups.get(gid)
        if group is None:
            self._seq += 1
            group = self._groups[gid] = _Group(seq=self._seq)
        members = group.members
        if len(members) >= self.group_size:
            reason = f"group {gid} already has {self.group_size} members"
            self._close(tid, record, ABORTED, reason)
            self._settle(trajectory, ABORTED, reason)
            return
        members.append(trajectory)
        self._buffered += 1
        if version < group.oldest:
            group.oldest = version
            heapq.heappush(self._by_version, (version, group.seq, gid))
            if len(self._by_version) > 2 * len(self._groups) + 64:
                self._by_version = self._compact(self._by_version)
        if len(members) == self.group_size:
            key = self.task_of(gid) if self.tasks else None
            heap = self._ready.get(key)
            if heap is None:
                heap = self._ready[key] = []
            heapq.heappush(heap, (group.oldest, group.seq, gid))
            if len(heap) > 2 * len(self._groups) + 64:
                self._ready[key] = self._compact(heap)
        if version < self._version - self.alpha:  # only a member older than the floor can be stale (D20)
            self._evict_stale()
        if self._changed is not None:
            self._changed.set()

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

    def _oldest_ready(self, key: str | None, quota: int, popped: list[tuple[list[_Entry], _Entry]]) -> list[tuple[str, _Group]]:
        """Up to `quota` complete in-bound groups of a task, oldest first, popped from its heap; the live
        entries popped are listed in `popped` for `_select` to push back (dead ones are dropped).
        O(quota log n) plus the out-of-bound groups not yet evicted."""
        heap = self._ready.get(key)
        if heap is None or len(heap) < quota:  # the heap holds every ready group (and dead entries): too few, O(1)
            return []
        floor = self._version - self.alpha
        groups = self._groups
        chosen: list[tuple[str, _Group]] = []
        while heap and len(chosen) < quota:
            entry = heapq.heappop(heap)
            group = groups.get(entry[2])
            if group is None or group.seq != entry[1] or group.oldest != entry[0]:
                continue  # dead: its group closed or got an older member (pushed again then)
            popped.append((heap, entry))
            if entry[0] >= floor:
                chosen.append((entry[2], group))
        return chosen

    def _select(self, n: int, take: bool = False) -> list[tuple[str, _Group]] | None:
        """The groups a batch of n would take now (oldest first, per task when balanced), or None.

        The heaps are left as they were (minus dead entries), except with `take` and a full selection:
        then the chosen groups' entries stay popped, since `_take` closes them at once (D56)."""
        groups = n // self.group_size
        popped: list[tuple[list[_Entry], _Entry]] = []
        if not self.tasks:
            chosen: list[tuple[str, _Group]] | None = self._oldest_ready(None, groups, popped)
            if chosen is not None and len(chosen) < groups:
                chosen = None
        else:
            chosen = []
            for task, quota in self._quotas(groups).items():
                mine = self._oldest_ready(task, quota, popped)
                if len(mine) < quota:
                    chosen = None
                    break
                chosen += mine
        if take and chosen is not None:
            for heap, entry in popped:
                if entry[0] < self._version - self.alpha:  # out of bound, not taken: stays indexed
                    heapq.heappush(heap, entry)
        else:
            for heap, entry in popped:
                heapq.heappush(heap, entry)
        return chosen

    def can_take(self, n: int) -> bool:
        """Whether get_batch(n) could return now: enough complete, in-bound groups (per task when balanced)."""
        return self._select(n) is not None

    def _take(self, n: int, chosen: list[tuple[str, _Group]] | None = None) -> list[BufferedTrajectory]:
        batch: list[BufferedTrajectory] = []
        records, ledger = self._records, self._ledger
        for gid, group in (chosen if chosen is not None else self._select(n, take=True)) or []:
            del self._groups[gid]
            members = group.members
            self._buffered -= len(members)
            self._consumed += len(members)
            self._closed(gid, CONSUMED, len(members))
            if gid in self._admitted:
                self._release(gid)
            if ledger is None:  # `_close` for CONSUMED, inlined: a batch closes thousands of records (D56)
                for t in members:
                    records[t.id].state = CONSUMED
            else:
                for t in members:
                    record = records.pop(t.id)
                    record.state = CONSUMED
                    ledger(t.id, record)
            if self._settled:
                for t in members:
                    self._settle(t, CONSUMED, "")
            batch.extend(members)
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
        deadline = -1.0  # read the clock only when the batch is not there at once (D56)
        while True:
            if self._by_version and self._by_version[0][0] < self._version - self.alpha:
                self._evict_stale()
            chosen = self._select(n, take=True)  # can_take, without selecting twice
            if chosen is not None:
                oldest = min([group.oldest for _, group in chosen])
                batch = self._take(n, chosen)
                break
            if deadline < 0:
                deadline = loop.time() + timeout_s
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
        # AST: AST_POSTCONDITION(oldest >= self._version - self.alpha, got=oldest, msg="no trajectory violates the bound (the taken groups' oldest version, kept per put)", exc=SchedulerError)
        check.postcondition(oldest >= self._version - self.alpha, "no trajectory violates the bound (the taken groups' oldest version, kept per put)", got=oldest, exc=SchedulerError)  # generated #549364efb1
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
        """Every id ever put, with its state and abort reason (the accounting invariant).

        With a ledger (D55), only the ids still held (open groups): the closed ones went to the ledger."""
        return dict(self._records)

    def retained(self) -> int:
        """Records and closed-group marks held in memory: with a ledger, bounded by the open backlog (D55)."""
        return len(self._records) + len(self._closed_groups)

    def counts(self) -> BufferCounts:
        """Every id put, by bucket, in O(1) (D55): what `records()` would sum, kept as counters."""
        return BufferCounts(buffered=self._buffered, consumed=self._consumed, aborted=self._aborted,
                            failed=self._failed, timeouts=self._timeouts)
