"""Issue 21 item 6: the run directory records what happened (routing, outcomes, the ledger), and item 3's
resume cut: every iteration appears once in the records after a resume."""

from __future__ import annotations

import pytest

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config
from rollart.scheduler.metrics import read_metrics
from rollart.scheduler.records import accounting_problems, read_events, read_ledger, settled


def tiny(**run) -> dict:
    return {
        "run": {"iterations": 3, "tensorboard": False, **run},
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4, "redundancy": 1.5,
                     "get_batch_timeout_s": 120},
        "rollout": {"pools": [{"name": "a", "hardware": "H800", "devices": 1},
                              {"name": "b", "hardware": "H20", "devices": 1}]},
        "routing": {"affinity": {"lake": "H800", "math": "H20"}},
        "tasks": [{"env": "frozenlake", "tag": "lake", "max_turns": 3}, {"env": "math", "tag": "math", "max_turns": 2}],
    }


async def test_metrics_carry_routing_and_outcomes_and_the_ledger_has_every_trajectory_once(tmp_path):
    pipe = await build_pipeline(parse_config(tiny()), tmp_path)
    try:
        await pipe.run(3, progress=False)
    finally:
        await pipe.close()
    records = read_metrics(tmp_path)
    ledger = read_ledger(tmp_path)
    for r in records:
        # affinity held: lake on H800 only, math on H20 only, and tokens are counted where requests are
        assert set(r["routing"]) == {"lake", "math"}
        assert set(r["routing"]["lake"]) == {"H800"} and set(r["routing"]["math"]) == {"H20"}
        assert all(r["routing_tokens"][tag][hw] > 0 for tag in r["routing"] for hw in r["routing"][tag])
        assert r["outcomes"]["consumed"] == r["trajectories"] == 8
    assert accounting_problems(tmp_path) == []
    consumed = [e for e in ledger if e["outcome"] == "consumed"]
    assert len(consumed) == 24
    for e in consumed:
        assert e["n_turns"] >= 1 and e["tokens"] > 0 and e["reward"] is not None
        assert e["turns"] and all(t["hardware"] == {"lake": "H800", "math": "H20"}[e["tag"]] for t in e["turns"])
    assert all(e["reason"] for e in ledger if e["outcome"] in ("aborted", "failed"))
    # what settles after the last record (the closing lines) belongs to the iteration after it (D65)
    assert max(e["iteration"] for e in ledger if e["outcome"] == "consumed") == 3
    assert max(e["iteration"] for e in ledger) == 4


def fail_step(batch):
    raise RuntimeError("simulated crash in iteration 4")


async def test_a_resume_drops_what_the_lost_iterations_wrote(tmp_path):
    cfg = parse_config(tiny(checkpoint_every=2))
    pipe = await build_pipeline(cfg, tmp_path)
    try:
        await pipe.run(3, progress=False)  # a checkpoint after iteration 2 only
        pipe.parts.trainer.inner.train_step = fail_step
        with pytest.raises(RuntimeError, match="simulated crash"):
            await pipe.run(4, progress=False)
    finally:
        await pipe.close()
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2, 3]  # checkpoint after 2 only
    pipe.recorder.events.record("marker", iteration=3)

    again = await build_pipeline(cfg, tmp_path)
    try:
        assert await again.restore()
        assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2]
        assert max(e["iteration"] for e in read_ledger(tmp_path)) <= 2
        assert not [e for e in read_events(tmp_path) if e["kind"] == "marker"]
        await again.run(4, progress=False)
    finally:
        await again.close()
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    # the ledger of the second process accounts for its own launches
    second = [r for r in read_metrics(tmp_path) if r["iteration"] > 2]
    ledger = [e for e in read_ledger(tmp_path) if e["iteration"] > 2]
    assert sum(r["outcomes"]["launched"] for r in second) <= len(ledger)
    assert sum(settled(r["outcomes"]) for r in second) <= len(ledger)


async def test_time_sharing_switches_are_events(tmp_path):
    raw = tiny()
    raw["pipeline"]["mode"] = "time_sharing"
    raw["rollout"]["pools"] = [{"name": "a", "hardware": "H800", "devices": 2}]
    raw["routing"] = {"affinity": {}}
    raw["time_sharing"] = {"policy": "always_shrink", "lend": 1, "slots_per_device": 8}
    pipe = await build_pipeline(parse_config(raw), tmp_path)
    try:
        await pipe.run(2, progress=False)
    finally:
        await pipe.close()
    events = read_events(tmp_path)
    for kind in ("timeshare_shrink", "timeshare_expand"):
        mine = [e for e in events if e["kind"] == kind]
        assert [e["iteration"] for e in mine] == [1, 2] and all(len(e["devices"]) == 1 for e in mine)
