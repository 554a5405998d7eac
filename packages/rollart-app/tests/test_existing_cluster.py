"""`rollart run` against a Ray cluster the user started (`ray start --head`): it runs and leaves it running."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_processes(marker: str) -> list[int]:
    """Pids of the processes of the cluster whose command lines carry `marker` (its temp dir)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                out.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@pytest.fixture
def head_node(tmp_path_factory):
    """A head node on 127.0.0.1 with 2 logical GPUs tagged H800; stopped by the test (only this cluster)."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray_bin is None:
        pytest.skip("the ray command is not installed next to this python")
    temp_dir = Path("/tmp") / f"rollart-head-{os.getpid()}-{_free_port()}"
    port = _free_port()
    # `ray start` turns on token authentication; drivers that join it say so (the token is in ~/.ray)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "token"}
    cmd = [ray_bin, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", "4",
           "--num-gpus", "2", "--resources", json.dumps({"H800": 2}), "--include-dashboard", "false",
           "--disable-usage-stats", "--temp-dir", str(temp_dir),
           "--dashboard-agent-listen-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
           "--ray-client-server-port", str(_free_port()), "--node-manager-port", str(_free_port()),
           "--object-manager-port", str(_free_port()), "--runtime-env-agent-port", str(_free_port()),
           "--dashboard-agent-grpc-port", str(_free_port())]
    started = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        pytest.fail(f"ray start failed: {started.stderr[-2000:]}")
    yield f"127.0.0.1:{port}", env, str(temp_dir)
    for pid in _cluster_processes(str(temp_dir)):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(1)
    for pid in _cluster_processes(str(temp_dir)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.ray
@pytest.mark.slow
def test_rollart_run_on_an_existing_cluster_leaves_it_running(head_node, tmp_path):
    address, env, temp_dir = head_node
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({
        "run": {"name": "existing", "iterations": 1, "tensorboard": False},
        "cluster": {"ray": address},
        "pipeline": {"mode": "async", "batch_size": 4, "group_size": 4, "redundancy": 1.0, "get_batch_timeout_s": 120},
        "rollout": {"pools": [{"name": "rollout", "hardware": "H800", "devices": 1, "max_num_seqs": 4}]},
        "trainer": {"placement": "driver", "devices": 1, "hardware": "H800"},
        "tasks": [{"env": "frozenlake", "max_turns": 3, "max_tokens": 1}],
    }))
    run_dir = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "rollart.app.cli", "run", str(config), "--run-dir", str(run_dir)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1
    # the cluster is still up: a new driver connects and sees its two H800 devices
    probe = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address='{address}', log_to_driver=False); "
                            "print(ray.cluster_resources().get('H800'))"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0 and probe.stdout.strip().splitlines()[-1] == "2.0", probe.stderr[-2000:]
    # a config asking for more than the cluster has fails before anything starts, naming the field
    config.write_text(config.read_text().replace('"devices": 1, "max_num_seqs"', '"devices": 3, "max_num_seqs"'))
    too_big = subprocess.run([sys.executable, "-m", "rollart.app.cli", "run", str(config), "--run-dir",
                              str(tmp_path / "out2")], env=env, capture_output=True, text=True, timeout=300)
    assert too_big.returncode == 2
    assert "needs 4 GPUs, the Ray cluster has 2" in too_big.stderr or "needs 4 H800" in too_big.stderr, too_big.stderr[-2000:]
