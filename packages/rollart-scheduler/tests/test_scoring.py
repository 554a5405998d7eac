"""ScoringSink: every trajectory reaches on_put and the buffer exactly once, scored or failed.

The state machine runs on a virtual-clock loop, so hanging scorers hit their deadline at once.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollart.env.trajectory import Trajectory, TrajectoryStatus, Turn
from rollart.resource.virtual_time import VirtualTimeLoop
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.errors import SchedulerError
from rollart.scheduler.scoring import ScoringSink

DEADLINE = 1.0
KINDS = ("ok", "raise", "hang", "nan", "unfinished", "prescored")


def _traj(i: int, kind: str) -> Trajectory:
    status = TrajectoryStatus.ABORTED if kind == "unfinished" else TrajectoryStatus.FINISHED
    return Trajectory(id=f"t{i}", group_id=f"g{i}", status=status, reason="aborted upstream" if kind == "unfinished" else "",
                      reward=0.5 if kind == "prescored" else None,
                      turns=[Turn(prompt_ids=[1], response_ids=[2], response_logprobs=[0.0], response_weight_versions=[0])])


class ScoringMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.buffer = SampleBuffer(alpha=10**6, group_size=1)
        self.seen: list[str] = []
        self.plan: dict[str, tuple[str, float]] = {}
        self.put_ids: list[str] = []
        self.closed = False
        self.delivered: dict[str, Trajectory] = {}
        self.sink = ScoringSink(self.buffer, self.scorer, on_put=self.on_put, deadline_s=DEADLINE)
        self.n = 0
        self.put_at: dict[str, float] = {}
        self.close_by: float | None = None  # virtual time at which close cancels what is left

    def on_put(self, trajectory: Trajectory) -> None:
        self.seen.append(trajectory.id)
        self.delivered[trajectory.id] = trajectory

    async def scorer(self, trajectory: Trajectory) -> float:
        kind, delay = self.plan[trajectory.id]
        await asyncio.sleep(delay)
        if kind == "raise":
            raise RuntimeError("judge down")
        if kind == "hang":
            await asyncio.get_running_loop().create_future()
        if kind == "nan":
            return math.nan
        return float(int(trajectory.id[1:]))

    def expected(self, tid: str) -> str:
        kind, delay = self.plan[tid]
        if kind in ("unfinished",):
            return "aborted"
        if kind == "prescored":
            return "passed"
        in_time = self.close_by is None or self.put_at[tid] + delay < self.close_by
        if kind == "ok" and delay < DEADLINE and in_time:
            return "scored"
        return "failed"

    @rule(kind=st.sampled_from(KINDS), delay=st.sampled_from([0.0, 0.3, 0.9, 2.5]))
    def put(self, kind: str, delay: float) -> None:
        tid = f"t{self.n}"
        self.n += 1
        self.plan[tid] = (kind, delay)
        self.put_at[tid] = self.loop.time() if not self.closed else math.inf  # after close: never scored
        traj = _traj(int(tid[1:]), kind)

        async def put() -> None:
            self.sink.put_nowait(traj)

        self.loop.run_until_complete(put())
        self.put_ids.append(tid)

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.5]))
    def advance(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    @precondition(lambda self: self.put_ids)
    @rule()
    def put_again_is_refused(self) -> None:
        async def put() -> None:
            self.sink.put_nowait(_traj(int(self.put_ids[0][1:]), "ok"))

        with pytest.raises(SchedulerError, match="put at most once"):
            self.loop.run_until_complete(put())

    @precondition(lambda self: not self.closed)
    @rule(timeout=st.sampled_from([0.5, 3.0]))
    def close(self, timeout: float) -> None:
        self.close_by = self.loop.time() + timeout
        self.loop.run_until_complete(self.sink.aclose(timeout_s=timeout))
        self.closed = True
        assert self.sink.pending == 0

    @invariant()
    def exactly_once(self) -> None:
        assert len(self.seen) == len(set(self.seen))
        pending = {t for t in self.put_ids if t not in self.seen}
        assert len(pending) == self.sink.pending
        assert set(self.buffer.records()) == set(self.seen)
        assert self.sink.scored + self.sink.failed + self.sink.passed == len(self.seen)

    @invariant()
    def outcomes(self) -> None:
        records = self.buffer.records()
        for tid in self.seen:
            rec = records[tid]
            want = self.expected(tid)
            if want == "scored":
                assert rec.state == "buffered" and self.delivered[tid].reward == float(tid[1:])
            elif want == "passed":
                assert rec.state == "buffered"
            else:  # failed and aborted ones are never collected
                assert rec.state == "aborted" and rec.reason, (tid, want, rec)
        collected = [t for t, r in records.items() if r.state == "buffered"]
        assert all(self.expected(t) in ("scored", "passed") for t in collected)

    def teardown(self) -> None:
        if not self.closed:
            self.close_by = self.loop.time() + 0.1
            self.loop.run_until_complete(self.sink.aclose(timeout_s=0.1))
            self.outcomes()
        assert self.sink.pending == 0
        assert sorted(self.seen) == sorted(self.put_ids)
        self.loop.close()


TestScoringMachine = ScoringMachine.TestCase


def test_scores_failures_and_close_on_a_real_loop():
    """Rewards land on the trajectory; a raising, a hanging and a NaN scorer become failed ones with a reason."""
    buffer = SampleBuffer(alpha=10, group_size=1)
    seen: list[Trajectory] = []

    async def scorer(t: Trajectory) -> float:
        if t.id == "t1":
            raise ValueError("bad answer format")
        if t.id == "t2":
            await asyncio.sleep(3600)
        if t.id == "t3":
            return float("nan")
        return 0.75

    async def main() -> int:
        sink = ScoringSink(buffer, scorer, on_put=seen.append, deadline_s=0.2)
        for i in range(5):
            sink.put_nowait(_traj(i, "ok"))
        await asyncio.sleep(0.05)
        assert sink.pending == 1  # only the hanging one
        return await sink.aclose(timeout_s=0.01)

    assert asyncio.run(main()) == 1
    by_id = {t.id: t for t in seen}
    assert by_id["t0"].reward == 0.75 and by_id["t4"].reward == 0.75 and by_id["t0"].status == TrajectoryStatus.FINISHED
    assert by_id["t1"].status == TrajectoryStatus.FAILED and "ValueError: bad answer format" in by_id["t1"].reason
    assert by_id["t2"].status == TrajectoryStatus.FAILED and "cancelled" in by_id["t2"].reason
    assert by_id["t3"].status == TrajectoryStatus.FAILED and "not finite" in by_id["t3"].reason
    states = {t: r.state for t, r in buffer.records().items()}
    assert states == {"t0": "buffered", "t1": "aborted", "t2": "aborted", "t3": "aborted", "t4": "buffered"}
