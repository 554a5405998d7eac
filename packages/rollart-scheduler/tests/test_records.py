"""The run's records: events, the trajectory ledger, per-iteration outcomes that add up, the resume cut."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollart.scheduler.errors import SchedulerError
from rollart.scheduler.records import (
    EventLog,
    LedgerEntry,
    OutcomeTally,
    TrajectoryLedger,
    TurnServed,
    add_routing,
    outcomes_add_up,
    read_events,
    read_ledger,
    settled,
    truncate_after,
)


def test_an_event_is_one_line_with_time_iteration_kind_and_detail(tmp_path):
    log = EventLog(tmp_path, clock=lambda: 123.5)
    log.record("actor_died", iteration=3, worker="h20/0", cause="SIGKILL")
    log.record("pool_lost")
    events = read_events(tmp_path)
    assert events == [
        {"t": 123.5, "iteration": 3, "kind": "actor_died", "worker": "h20/0", "cause": "SIGKILL"},
        {"t": 123.5, "iteration": None, "kind": "pool_lost"},
    ]
    with pytest.raises(SchedulerError, match="kind"):
        log.record("")


def test_the_ledger_writes_the_documented_line_once_per_id(tmp_path):
    ledger = TrajectoryLedger(tmp_path)
    entry = LedgerEntry(id="math-g0-1", iteration=2, task="math", tag="math", outcome="consumed",
                        turns=[TurnServed("h800/0", "H800", 1)], versions=[1], reward=0.5, n_turns=1, tokens=12)
    ledger.record(entry)
    assert read_ledger(tmp_path) == [{
        "id": "math-g0-1", "iteration": 2, "task": "math", "tag": "math", "outcome": "consumed",
        "turns": [{"worker": "h800/0", "hardware": "H800", "version": 1}], "versions": [1],
        "reason": None, "reward": 0.5, "n_turns": 1, "tokens": 12}]
    with pytest.raises(SchedulerError, match="one ledger line"):
        ledger.record(entry)
    with pytest.raises(SchedulerError, match="consumed"):
        ledger.record(LedgerEntry(id="x", iteration=2, task="t", tag="t", outcome="lost"))


def test_truncate_after_keeps_the_checkpointed_iterations_and_lines_without_one(tmp_path):
    for name in ("metrics.jsonl", "events.jsonl", "trajectories.jsonl"):
        lines = [{"iteration": i, "x": i} for i in (1, 2, 3, 4)] + [{"iteration": None, "x": 0}]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"iteration": 5, "x"')
    dropped = truncate_after(tmp_path, 2)
    assert dropped == {"metrics.jsonl": 3, "events.jsonl": 3, "trajectories.jsonl": 3}
    for name in ("metrics.jsonl", "events.jsonl", "trajectories.jsonl"):
        kept = [json.loads(x)["iteration"] for x in (tmp_path / name).read_text().splitlines()]
        assert kept == [1, 2, None]
    assert truncate_after(tmp_path, 2) == {"metrics.jsonl": 0, "events.jsonl": 0, "trajectories.jsonl": 0}


@given(st.lists(st.tuples(st.integers(1, 6), st.booleans()), max_size=60), st.integers(0, 7))
def test_truncate_after_drops_exactly_the_later_iterations(tmp_path_factory, lines, cut):
    d = tmp_path_factory.mktemp("run")
    (d / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i if has else None}) + "\n" for i, has in lines))
    truncate_after(d, cut, files=("metrics.jsonl",))
    kept = [json.loads(x)["iteration"] for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert kept == [i if has else None for i, has in lines if not has or i <= cut]


def test_routing_counts_per_tag_and_hardware():
    routing: dict[str, dict[str, int]] = {}
    add_routing(routing, "math", "H800")
    add_routing(routing, "math", "H800", 2)
    add_routing(routing, "lake", "H20")
    assert routing == {"math": {"H800": 3}, "lake": {"H20": 1}}


class OutcomeMachine(RuleBasedStateMachine):
    """Launches, endings (some twice, some of unknown ids) and iteration cuts: the records add up."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = OutcomeTally()
        self.next_id = 0
        self.open: list[str] = []
        self.done: list[str] = []
        self.buffered_before = 0
        self.records: list[dict] = []

    @rule(n=st.integers(1, 4))
    def launch(self, n):
        for _ in range(n):
            tid = f"t{self.next_id}"
            self.next_id += 1
            self.tally.launched(tid)
            self.open.append(tid)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), outcome=st.sampled_from(["consumed", "aborted", "failed"]),
          reason=st.sampled_from(["stale", "worker_died", "env_error", None]))
    def end(self, data, outcome, reason):
        tid = self.open.pop(data.draw(st.integers(0, len(self.open) - 1)))
        assert self.tally.ended(tid, outcome, reason)
        self.done.append(tid)

    @precondition(lambda self: self.done)
    @rule(data=st.data())
    def end_again_is_not_counted(self, data):
        tid = data.draw(st.sampled_from(self.done))
        assert not self.tally.ended(tid, "aborted", "again")
        assert not self.tally.ended("never-launched", "consumed")

    @rule()
    def iteration_ends(self):
        rec = self.tally.take()
        assert outcomes_add_up(rec, self.buffered_before), (rec, self.buffered_before)
        assert rec["buffered"] == len(self.open)
        self.buffered_before = rec["buffered"]
        self.records.append(rec)

    @invariant()
    def totals_match(self):
        launched = sum(r["launched"] for r in self.records)
        ended = sum(settled(r) for r in self.records)
        last = self.records[-1]["buffered"] if self.records else 0
        assert launched == ended + last
        assert self.tally.open_ids == set(self.open)


TestOutcomes = OutcomeMachine.TestCase
TestOutcomes.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
