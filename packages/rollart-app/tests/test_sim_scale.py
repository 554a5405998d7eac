"""Issue 22 part B: the simulator's path imports no model libraries, its results do not move with the
optimisations of the hot paths, and they do not depend on the simulation's granularity (D64, D65)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from rollart.app.sim.runner import run_one
from rollart.app.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = ROOT / "examples" / "scenarios"


def test_rollart_sim_imports_no_transformers(tmp_path):
    """`rollart sim` on a small scenario, in a fresh interpreter: transformers (3 s of imports) stays out (D64)."""
    data = yaml.safe_load((SCENARIOS / "scale_3000.yaml").read_text())
    data["config"]["rollout"]["pools"][0]["devices"] = 2
    data["config"]["rollout"]["pools"][1]["devices"] = 2
    data["config"]["trainer"]["devices"] = 1
    data["config"]["pipeline"].update(batch_size=16, redundancy=1.5)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    code = ("import sys\nfrom rollart.app.cli import app\nsys.argv = ['rollart', 'sim', sys.argv[1]]\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = [line for line in out.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED []"], loaded


def _row(result) -> dict:
    row = result.row()
    row.pop("wall_s")
    return row


def test_committed_results_reproduce_to_the_digit():
    """The buffer's ledger and counters, and the hot-path changes, leave every committed number as it was."""
    committed = json.loads((ROOT / "docs" / "simulator-results.json").read_text())
    for scenario, run in (("fig12a_env_interaction", "batch_sigma1"), ("fig10_modes_32b", "async")):
        spec = load_scenario(SCENARIOS / f"{scenario}.yaml")
        [spec_run] = [r for r in spec.runs if r.name == run]
        [want] = [r for r in committed[scenario]["runs"] if r["name"] == run]
        want = dict(want)
        want.pop("wall_s")
        assert _row(run_one(spec, spec_run)) == want, scenario

