"""The `rollart` command: run a tiny config end to end, draw the timeline; config errors exit 2."""

from __future__ import annotations

from typer.testing import CliRunner

from rollart.app.cli import app
from rollart.scheduler.metrics import read_metrics

CONFIG = """
run: {name: cli, iterations: 2, tensorboard: false}
pipeline: {mode: time_sharing, alpha: 1, batch_size: 8, group_size: 4}
time_sharing: {policy: always_shrink}
rollout: {pools: [{name: rollout, devices: 2}]}
tasks:
  - {env: frozenlake, max_turns: 4}
"""


def test_run_and_timeline(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(cfg), "--run-dir", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2]
    assert (run_dir / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    out = tmp_path / "t.png"
    result = CliRunner().invoke(app, ["timeline", str(run_dir), "-o", str(out)])
    assert result.exit_code == 0 and out.exists()

    # D30: resuming the run dir under another config is refused, naming the field, unless asked
    changed = ["run", str(cfg), "--run-dir", str(run_dir), "-n", "3", "--set", "pipeline.batch_size=4"]
    result = CliRunner().invoke(app, changed)
    assert result.exit_code == 2, result.output
    assert "pipeline.batch_size: 8 -> 4" in result.output and "--allow-config-change" in result.output
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2]
    result = CliRunner().invoke(app, [*changed, "--allow-config-change"])
    assert result.exit_code == 0, result.output
    assert "resumed from checkpoint at iteration 2" in result.output
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2, 3]


def test_bad_config_names_the_field(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("pipeline: {mode: turbo}\n")
    result = CliRunner().invoke(app, ["run", str(cfg)])
    assert result.exit_code == 2
    assert "pipeline.mode" in result.output and "time_sharing" in result.output
    result = CliRunner().invoke(app, ["timeline", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "timeline.jsonl" in result.output


def test_a_bad_iteration_count_fails_in_one_line_before_anything_starts(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    run_dir = tmp_path / "run"
    for n in ("-3", "0"):
        result = CliRunner().invoke(app, ["run", str(cfg), "--run-dir", str(run_dir), "-n", n])
        assert result.exit_code == 2, result.output
        assert result.output.strip() == f"--iterations must be an integer in [1, 10000000], got {n}"
        assert not run_dir.exists()  # nothing was built, no worker started
