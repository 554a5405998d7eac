"""Metrics lines, the role timeline picture and atomic checkpoints."""

from __future__ import annotations

import json

import pytest

from rollart.scheduler.checkpoint import Checkpointer
from rollart.scheduler.errors import SchedulerError
from rollart.scheduler.metrics import MetricsWriter, RoleTimeline, read_metrics
from rollart.scheduler.timeline import plot_timeline

RECORD = {"iteration": 1, "version": 1, "reward_mean": 0.5, "step_time_s": 1.0, "tokens_per_s": 10.0,
          "trajectories": 8, "aborted": 0, "switch_cost_s": 0.0, "sync_s": 0.01, "sync_bytes": 1024}


def test_metrics_and_timeline(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=True)
    w.write(RECORD)
    w.write({**RECORD, "iteration": 2, "reward_mean": float("nan")})
    w.close()
    recs = read_metrics(tmp_path)
    assert [r["iteration"] for r in recs] == [1, 2] and recs[1]["reward_mean"] is None
    assert any((tmp_path / "tensorboard").iterdir())
    with pytest.raises(SchedulerError, match="aborted"):
        MetricsWriter(tmp_path, tensorboard=False).write({k: v for k, v in RECORD.items() if k != "aborted"})

    now = [0.0]
    tl = RoleTimeline(tmp_path / "timeline.jsonl", [0, 1], clock=lambda: now[0])
    now[0] = 1.0
    tl.set_role([0, 1], "rollout")
    now[0] = 2.0
    tl.set_role([1], "transfer")
    now[0] = 2.5
    tl.set_role([1], "train")
    with pytest.raises(SchedulerError, match="role must be one of"):
        tl.set_role([0], "sleeping")
    now[0] = 4.0
    tl.close()
    rows = [json.loads(x) for x in (tmp_path / "timeline.jsonl").read_text().splitlines()]
    dev1 = [(r["role"], r["t0"], r["t1"]) for r in rows if r["device"] == 1]
    assert dev1 == [("idle", 0.0, 1.0), ("rollout", 1.0, 2.0), ("transfer", 2.0, 2.5), ("train", 2.5, 4.0)]
    out = plot_timeline(tmp_path, tmp_path / "t.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"


def test_checkpoints_are_atomic_and_pruned(tmp_path):
    ck = Checkpointer(tmp_path, keep=2)
    assert ck.latest() is None
    for i in range(1, 4):
        tmp = ck.begin(i)
        (tmp / "trainer").mkdir()
        ck.commit(tmp, i, i + 10, {"w": i})
    (tmp_path / ".tmp-00000004").mkdir()  # a crash while writing iteration 4 leaves only a temp dir
    info = ck.latest()
    assert (info.iteration, info.version, info.config) == (3, 13, {"w": 3})
    assert info.path == tmp_path / "ckpt-00000003" and (info.path / "trainer").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-")) == ["ckpt-00000002", "ckpt-00000003"]
