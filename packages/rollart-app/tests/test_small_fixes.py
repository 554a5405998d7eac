"""Issue 21 item 8 (app D59): `python -m rollart.app.demo --no-ray` runs without Ray, and a run that fails
validation leaves no run directory behind (the reward service's cache: rollart-reward D31)."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from rollart.app.cli import app

NO_RAY_DEMO = """
import sys
from rollart.app import demo
code = demo.main(["--no-ray", "--iterations", "1", "--run-dir", sys.argv[1]])
started = "ray" in sys.modules and sys.modules["ray"].is_initialized()
print("RAY_STARTED", started)
sys.exit(code)
"""


def test_the_demo_without_ray_runs_one_iteration_and_never_starts_ray(tmp_path):
    """Before: --no-ray set a field the config does not have, and the demo started a local Ray cluster."""
    res = subprocess.run([sys.executable, "-c", NO_RAY_DEMO, str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=500)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "RAY_STARTED False" in res.stdout, res.stdout[-2000:]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


def test_a_run_that_fails_validation_leaves_no_run_directory(tmp_path):
    """Before: the builder made the run directory, then failed on the env name: an empty directory stayed."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: {name: bad, tensorboard: false}\npipeline: {batch_size: 8, group_size: 4}\n"
                   "rollout: {pools: [{name: r, devices: 1}]}\ntasks:\n  - {env: no_such_env_xyz}\n")
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(cfg), "--run-dir", str(run_dir)])
    assert result.exit_code == 2, result.output
    assert "tasks.0.env" in result.output and "no_such_env_xyz" in result.output
    assert not run_dir.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "note.txt").write_text("mine")
    result = CliRunner().invoke(app, ["run", str(cfg), "--run-dir", str(kept)])
    assert result.exit_code == 2 and (kept / "note.txt").read_text() == "mine"  # a directory that existed stays
