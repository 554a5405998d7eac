"""Issue 21 item 6 (app D58): `rollart report RUN_DIR` prints a summary and writes report.html with PNG plots
from metrics.jsonl, trajectories.jsonl, events.jsonl and timeline.jsonl, tolerating absent files."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.scheduler.records import EventLog, LedgerEntry, TrajectoryLedger, TurnServed

CONFIG = """
run: {name: report, iterations: 2, tensorboard: false}
pipeline: {mode: async, alpha: 1, batch_size: 8, group_size: 4}
rollout:
  pools:
    - {name: h800, hardware: H800, devices: 1, engine: torch, max_num_seqs: 8}
    - {name: h20, hardware: H20, devices: 1, engine: torch, max_num_seqs: 8}
routing: {affinity: {lake: H800, math: H20}}
tasks:
  - {env: frozenlake, tag: lake, max_turns: 4}
  - {env: math, tag: math, max_turns: 2}
"""


def _real_run(tmp_path) -> Path:
    """Two iterations of CONFIG with `rollart run` (in process, two pools, affinity by tag)."""
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = CliRunner().invoke(app, ["run", str(tmp_path / "c.yaml"), "--run-dir", str(tmp_path / "run")])
    assert done.exit_code == 0, done.output
    return tmp_path / "run"


def test_report_of_a_real_run_prints_the_summary_and_writes_the_page_with_plots(tmp_path):
    """Before: there was no `rollart report` (exit 2, no such command)."""
    run_dir = _real_run(tmp_path)
    # the records part A's pipeline writes, in their documented format (scheduler D48)
    ledger = TrajectoryLedger(run_dir)
    ledger.record(LedgerEntry(id="a", iteration=1, task="frozenlake", tag="lake", outcome="consumed",
                              turns=[TurnServed("h800-0", "H800", 0)], versions=[0], reward=1.0, n_turns=1, tokens=2))
    ledger.record(LedgerEntry(id="b", iteration=2, task="math", tag="math", outcome="aborted", reason="stale",
                              turns=[TurnServed("h20-0", "H20", 0), TurnServed("h20-0", "H20", 1)], n_turns=2))
    EventLog(run_dir).record("reward_outage", iteration=1, service="http://127.0.0.1:1")

    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"run {run_dir}: 2 iterations" in out
    assert re.search(r"reward: first -?\d\.\d{3}, last -?\d\.\d{3}; frozenlake -?\d\.\d{3}; math -?\d\.\d{3}", out), out
    assert "trajectories: consumed 1, aborted 1" in out
    assert "routing lake: H800 1" in out and "routing math: H20 2" in out
    assert "events: reward_outage 1" in out
    page = (run_dir / "report.html").read_text()
    for name in ("reward", "throughput", "staleness", "failures", "timeline"):
        png = run_dir / f"report-{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG", name
        assert f'src="report-{name}.png"' in page
    assert out.strip().endswith(f"report: {run_dir / 'report.html'}")


def test_report_tolerates_absent_files_and_refuses_a_missing_directory(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, ["report", str(empty)])
    assert result.exit_code == 0, result.output
    assert "0 iterations" in result.output
    assert "not in the run directory: metrics.jsonl, trajectories.jsonl, events.jsonl, timeline.jsonl" in result.output
    assert "no data in this run directory" in (empty / "report.html").read_text()
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "is not a directory" in result.output
