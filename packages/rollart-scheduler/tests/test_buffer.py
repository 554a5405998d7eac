"""SampleBuffer: the bound alpha and the accounting invariant (design/000-overview.md §5), as a state machine."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rollart.env.trajectory import Trajectory, TrajectoryStatus, Turn
from rollart.scheduler.buffer import ABORTED, BUFFERED, CONSUMED, SampleBuffer, oldest_version
from rollart.scheduler.errors import SchedulerError, SchedulerTimeout


@dataclass
class FakeTraj:
    id: str
    group_id: str
    versions: list[int]
    status: str = "finished"
    reason: str = ""
    extra: dict = field(default_factory=dict)

    def weight_versions(self) -> list[int]:
        return list(self.versions)


def env_traj(tid: str, gid: str, versions: list[int]) -> Trajectory:
    turns = [Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[0.0], weight_version=v) for v in versions]
    return Trajectory(id=tid, group_id=gid, turns=turns, status=TrajectoryStatus.FINISHED)


def test_env_trajectory_satisfies_protocol_and_oldest_counts_every_turn():
    t = env_traj("a", "g", [3, 2, 4])
    assert oldest_version(t) == 2
    buf = SampleBuffer(alpha=1, group_size=1, version=3)
    buf.put_nowait(t)
    assert buf.records()["a"].state == BUFFERED
    buf.set_version(4)  # 2 < 4 - 1: the oldest token makes it stale even though its last turn is fresh
    assert buf.records()["a"].state == ABORTED and "stale" in buf.records()["a"].reason


async def test_get_batch_times_out():
    buf = SampleBuffer(alpha=0, group_size=2)
    buf.put_nowait(FakeTraj("a", "g", [0]))  # half a group is never eligible
    with pytest.raises(SchedulerTimeout, match="get_batch"):
        await buf.get_batch(2, timeout_s=0.05)
    assert buf.records()["a"].state == BUFFERED


async def test_batch_is_refilled_after_eviction():
    buf = SampleBuffer(alpha=0, group_size=2)
    buf.put_nowait(FakeTraj("s1", "old", [0]))
    buf.put_nowait(FakeTraj("s2", "old", [0]))
    buf.set_version(1)  # the complete group "old" is now stale

    async def producer():
        await asyncio.sleep(0.01)
        buf.put_nowait(FakeTraj("f1", "new", [1]))
        await asyncio.sleep(0.01)
        buf.put_nowait(FakeTraj("f2", "new", [1]))

    task = asyncio.create_task(producer())
    batch = await buf.get_batch(2, timeout_s=5)
    await task
    assert sorted(t.id for t in batch) == ["f1", "f2"]
    assert buf.records()["s1"].state == ABORTED


async def test_balanced_batch_waits_for_the_slow_task():
    """Four finished `fast` groups do not make a batch of two groups: one `slow` group must come."""
    buf = SampleBuffer(alpha=1, group_size=1, tasks=["fast", "slow"])
    for i in range(4):
        buf.put_nowait(FakeTraj(f"f{i}", f"fast-g{i}", [0]))
    assert buf.ready_count() == 4 and not buf.can_take(2)
    with pytest.raises(SchedulerTimeout):
        await buf.get_batch(2, timeout_s=0.05)
    buf.put_nowait(FakeTraj("s0", "slow-g9", [0]))
    batch = await buf.get_batch(2, timeout_s=1.0)
    assert [t.id for t in batch] == ["f0", "s0"]  # oldest fast group, then the slow one
    unbalanced = SampleBuffer(alpha=1, group_size=1)
    for i in range(2):
        unbalanced.put_nowait(FakeTraj(f"f{i}", f"fast-g{i}", [0]))
    assert [t.id for t in await unbalanced.get_batch(2, timeout_s=1.0)] == ["f0", "f1"]


async def test_a_slot_waits_for_room_and_every_way_a_group_closes_gives_it_back():
    """D44: consumed, aborted and evicted groups each free their place; a task with room never waits."""
    buf = SampleBuffer(alpha=1, group_size=1, tasks=["a", "b"])
    for gid in ("a-g0", "a-g1", "b-g2"):
        buf.admit(gid)
    assert (buf.outstanding("a"), buf.outstanding("b")) == (2, 1)
    await asyncio.wait_for(buf.wait_for_room("b", 2), 1)  # room: returns at once

    async def waits(task, limit):
        waiter = asyncio.ensure_future(buf.wait_for_room(task, limit))
        await asyncio.sleep(0)
        return waiter

    waiter = await waits("a", 2)
    assert not waiter.done()
    buf.abort_group("a-g0", "failed in flight")  # aborted
    await asyncio.wait_for(waiter, 1)
    waiter = await waits("a", 1)
    buf.put_nowait(FakeTraj("t1", "a-g1", [0]))
    buf.set_version(2)  # evicted as stale
    await asyncio.wait_for(waiter, 1)
    buf.admit("a-g3")
    buf.put_nowait(FakeTraj("t3", "a-g3", [2]))
    buf.put_nowait(FakeTraj("t2", "b-g2", [2]))
    waiter = await waits("a", 1)
    assert len(await buf.get_batch(2, timeout_s=1)) == 2  # consumed
    await asyncio.wait_for(waiter, 1)
    assert (buf.outstanding("a"), buf.outstanding("b")) == (0, 0)
    with pytest.raises(SchedulerError, match="admitted once"):
        buf.admit("a-g3")


async def test_one_freed_place_wakes_one_waiter_and_a_cancelled_one_hands_it_on():
    """D44: a release wakes the longest waiter only (no herd); woken and then cancelled, it passes the place on."""
    buf = SampleBuffer(alpha=1, group_size=1, tasks=["a"])
    buf.admit("a-g0")
    buf.admit("a-g1")
    first, second, third = (asyncio.ensure_future(buf.wait_for_room("a", 2)) for _ in range(3))
    await asyncio.sleep(0)
    buf.abort_group("a-g0", "failed in flight")
    first.cancel()  # woken by the release, cancelled before it could start its group
    await asyncio.wait_for(second, 1)
    assert first.cancelled() and not third.done()
    buf.admit("a-g2")  # what `second`'s slot does next
    buf.abort_group("a-g1", "failed in flight")
    await asyncio.wait_for(third, 1)


def test_bad_arguments_name_the_field():
    with pytest.raises(SchedulerError, match="alpha"):
        SampleBuffer(alpha=-1, group_size=1)
    buf = SampleBuffer(alpha=0, group_size=4)
    with pytest.raises(SchedulerError, match="multiple of group_size"):
        asyncio.run(buf.get_batch(6, timeout_s=0.1))
    buf.set_version(3)
    with pytest.raises(SchedulerError, match="versions never go backwards"):
        buf.set_version(2)


TASKS = ["a", "b"]


class BufferMachine(RuleBasedStateMachine):
    """Random puts (fresh, stale, failed, duplicate-group), version bumps, aborts and batches."""

    @initialize(alpha=st.integers(0, 2), group_size=st.integers(1, 3), balanced=st.booleans())
    def setup(self, alpha, group_size, balanced):
        self.buf = SampleBuffer(alpha=alpha, group_size=group_size, tasks=TASKS if balanced else ())
        self.alpha, self.gs, self.balanced = alpha, group_size, balanced
        self.put_ids: list[str] = []
        self.consumed: list[str] = []
        self.n = 0
        self.open_groups: list[str] = []
        self.admitted: set[str] = set()
        self.aborted: set[str] = set()  # groups closed by the abort rule (an admitted group may have no member yet)

    @rule(pick=st.integers(0, 50))
    def admit(self, pick):
        """A slot starts a group (D44): it counts as outstanding until it is consumed or aborted."""
        gid = f"{TASKS[pick % 2]}-g{self.n}"
        self.n += 1
        self.buf.admit(gid)
        self.admitted.add(gid)
        self.open_groups.append(gid)

    @rule(new_group=st.booleans(), lag=st.integers(0, 3), mixed=st.booleans(), failed=st.integers(0, 9), pick=st.integers(0, 50),
          admitted=st.booleans())
    def put(self, new_group, lag, mixed, failed, pick, admitted):
        if new_group or not self.open_groups:
            gid = f"{TASKS[pick % 2]}-g{self.n}"
            self.open_groups.append(gid)
            if admitted:  # as a RolloutScheduler slot does before the first member arrives (D44)
                self.buf.admit(gid)
                self.admitted.add(gid)
        else:
            gid = self.open_groups[pick % len(self.open_groups)]
        self.n += 1
        start = max(0, self.buf.version - lag)
        versions = [start, self.buf.version] if mixed else [start]
        tid = f"t{self.n}"
        status = "failed" if failed == 0 else "finished"
        self.buf.put_nowait(FakeTraj(tid, gid, versions, status=status))
        self.put_ids.append(tid)

    @rule(step=st.integers(0, 2))
    def bump_version(self, step):
        self.buf.set_version(self.buf.version + step)

    @rule(pick=st.integers(0, 50))
    def abort(self, pick):
        if self.open_groups:
            gid = self.open_groups[pick % len(self.open_groups)]
            self.buf.abort_group(gid, "test abort")
            self.aborted.add(gid)

    @precondition(lambda self: self.buf.can_take(self.gs))
    @rule(k=st.integers(1, 4))
    def get_batch(self, k):
        groups = max(g for g in range(1, k + 1) if g == 1 or self.buf.can_take(g * self.gs))
        batch = asyncio.run(self.buf.get_batch(groups * self.gs, timeout_s=1.0))
        assert len(batch) == groups * self.gs
        for t in batch:
            assert oldest_version(t) >= self.buf.version - self.alpha, "batch violates alpha"
        by_group: dict[str, int] = {}
        for t in batch:
            by_group[t.group_id] = by_group.get(t.group_id, 0) + 1
        assert all(c == self.gs for c in by_group.values()), "partial group in a batch"
        if self.balanced:  # task-balanced: the per-task group counts differ by at most one, first task first
            per_task = [sum(1 for g in by_group if g.startswith(f"{task}-g")) for task in TASKS]
            assert per_task == [groups // 2 + groups % 2, groups // 2], per_task
        self.consumed += [t.id for t in batch]

    @invariant()
    def every_trajectory_accounted_once(self):
        if not hasattr(self, "buf"):
            return
        recs = self.buf.records()
        assert sorted(recs) == sorted(self.put_ids)
        assert len(self.consumed) == len(set(self.consumed))
        assert {i for i, r in recs.items() if r.state == CONSUMED} == set(self.consumed)
        for r in recs.values():
            assert r.state in (BUFFERED, CONSUMED, ABORTED)
            if r.state == ABORTED:
                assert r.reason
        assert sum(1 for r in recs.values() if r.state == BUFFERED) == self.buf.buffered_count()

    @invariant()
    def outstanding_counts_the_admitted_groups_not_yet_closed(self):
        if not hasattr(self, "buf"):
            return
        # a record that is not buffered closed its group, except an extra member refused by a full group
        closed = {r.group_id for r in self.buf.records().values()
                  if r.state != BUFFERED and "members" not in r.reason} | self.aborted
        still_open = [g for g in self.admitted if g not in closed]
        if self.balanced:
            for task in TASKS:
                assert self.buf.outstanding(task) == sum(1 for g in still_open if g.startswith(f"{task}-g"))
        else:
            assert self.buf.outstanding() == len(still_open)

    @invariant()
    def nothing_buffered_is_out_of_bound(self):
        if not hasattr(self, "buf"):
            return
        for r in self.buf.records().values():
            if r.state == BUFFERED:
                assert r.oldest_version >= self.buf.version - self.alpha


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


class LedgerBufferMachine(RuleBasedStateMachine):
    """D55: a buffer with a ledger keeps only the open backlog, and loses no id.

    It runs in lockstep with a buffer that keeps every record (the reference): each id ends up exactly
    once in the ledger or still held, with the reference's state and reason; `counts()` equals the
    reference's buckets; and what is held in memory never exceeds the members of open groups plus one
    mark per group still expecting members, however long the run. Groups get at most `group_size`
    members (as from a RolloutScheduler); late members of aborted groups arrive.
    """

    @initialize(alpha=st.integers(0, 2), group_size=st.integers(1, 3), balanced=st.booleans())
    def setup(self, alpha, group_size, balanced):
        tasks = TASKS if balanced else ()
        self.ledger: dict[str, object] = {}

        def spill(tid, record):
            assert tid not in self.ledger, "an id reaches the ledger once"
            self.ledger[tid] = record

        self.buf = SampleBuffer(alpha=alpha, group_size=group_size, tasks=tasks, ledger=spill)
        self.ref = SampleBuffer(alpha=alpha, group_size=group_size, tasks=tasks)
        self.gs = group_size
        self.left: dict[str, int] = {}  # group -> members still to come
        self.n = 0

    def _both(self, call):
        a, b = call(self.buf), call(self.ref)
        assert a == b
        return a

    @rule(lag=st.integers(0, 3), failed=st.integers(0, 9), pick=st.integers(0, 50), new=st.booleans(),
          admitted=st.booleans())
    def put(self, lag, failed, pick, new, admitted):
        live = [g for g, k in self.left.items() if k > 0]
        if new or not live:
            gid = f"{TASKS[pick % 2]}-g{self.n}"
            self.left[gid] = self.gs
            if admitted:
                self._both(lambda b: b.admit(gid))
        else:
            gid = live[pick % len(live)]
        self.left[gid] -= 1
        self.n += 1
        tid = f"t{self.n}"
        version = max(0, self.ref.version - lag)
        status = "failed" if failed == 0 else "finished"
        self._both(lambda b: b.put_nowait(FakeTraj(tid, gid, [version], status=status, reason="timeout" if pick % 2 else "")))

    @rule(step=st.integers(0, 2))
    def bump_version(self, step):
        v = self.ref.version + step
        self._both(lambda b: b.set_version(v))

    @rule(pick=st.integers(0, 50))
    def abort(self, pick):
        live = [g for g, k in self.left.items() if k > 0]
        if live:
            gid = live[pick % len(live)]
            self._both(lambda b: b.abort_group(gid, "test abort"))

    @precondition(lambda self: self.ref.can_take(self.gs))
    @rule()
    def get_batch(self):
        assert self.buf.can_take(self.gs)
        got = [t.id for t in asyncio.run(self.buf.get_batch(self.gs, timeout_s=1.0))]
        assert got == [t.id for t in asyncio.run(self.ref.get_batch(self.gs, timeout_s=1.0))]

    @invariant()
    def no_id_lost_and_memory_follows_the_backlog(self):
        if not hasattr(self, "buf"):
            return
        held, ref = self.buf.records(), self.ref.records()
        assert not set(held) & set(self.ledger)
        mine = {**held, **self.ledger}
        assert {i: (r.state, r.reason) for i, r in mine.items()} == {i: (r.state, r.reason) for i, r in ref.items()}
        c = self.buf.counts()
        assert c == self.ref.counts()
        assert c.total == len(ref) and c.buffered == self.ref.buffered_count()
        assert c.consumed == sum(r.state == CONSUMED for r in ref.values())
        assert c.aborted == sum(r.state == ABORTED for r in ref.values())
        assert c.failed == sum(r.state == ABORTED and r.reason.startswith("trajectory failed") for r in ref.values())
        assert len(held) == self.buf.buffered_count()  # only members of open groups are held
        expecting = sum(1 for k in self.left.values() if k > 0)
        assert self.buf.retained() <= self.buf.buffered_count() + expecting


TestLedgerBufferMachine = LedgerBufferMachine.TestCase
TestLedgerBufferMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


def test_a_long_run_with_a_ledger_holds_only_its_backlog():
    """D55: 20,000 groups put and taken; memory stays at the one group in the making, the counts are exact."""
    spilled = [0]
    buf = SampleBuffer(alpha=1, group_size=4, ledger=lambda tid, rec: spilled.__setitem__(0, spilled[0] + 1))

    async def go():
        for g in range(20_000):
            for m in range(4):
                buf.put_nowait(FakeTraj(f"g{g}-{m}", f"g{g}", [0]))
            await buf.get_batch(4, timeout_s=1.0)
            assert buf.retained() == 0

    asyncio.run(go())
    assert buf.counts().consumed == 80_000 == spilled[0] and buf.records() == {}
