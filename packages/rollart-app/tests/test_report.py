"""Issue 21 item 6 (app D58): `rollart report RUN_DIR` prints a summary and writes report.html with PNG plots
from metrics.jsonl, trajectories.jsonl, events.jsonl and timeline.jsonl, tolerating absent files."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.scheduler.records import EventLog, read_ledger

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
    EventLog(run_dir).record("reward_outage", iteration=1, service="http://127.0.0.1:1")  # as the builder logs one
    ledger = read_ledger(run_dir)
    assert ledger, "the pipeline writes the trajectory ledger (scheduler D48-D50)"

    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"run {run_dir}: 2 iterations" in out
    assert re.search(r"reward: first -?\d\.\d{3}, last -?\d\.\d{3}; frozenlake -?\d\.\d{3}; math -?\d\.\d{3}", out), out
    outcomes = Counter(line["outcome"] for line in ledger)
    assert "trajectories: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()) in out
    lake = sum(len(line["turns"]) for line in ledger if line["tag"] == "lake")
    math = sum(len(line["turns"]) for line in ledger if line["tag"] == "math")
    assert f"routing lake: H800 {lake}" in out and f"routing math: H20 {math}" in out  # affinity held
    assert "reward_outage 1" in out
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
