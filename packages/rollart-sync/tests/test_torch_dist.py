"""TorchDistributedChannel over gloo across spawned processes: identical tensors, refetch on corruption."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("gloo_worker.py")
WORLD = 3


def _load_weights_fn():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gloo_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.weights


def test_gloo_broadcast_delivers_identical_tensors(tmp_path: Path):
    init = f"file://{tmp_path / 'rendezvous'}"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(r), str(WORLD), init, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=150)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)

    weights = _load_weights_fn()
    for rank in range(1, WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for version in (1, 2, 3, 4):
            expected = weights(version)
            tensors = got[version]["tensors"]
            assert sorted(tensors) == sorted(expected)
            for name, t in expected.items():
                assert tensors[name].dtype == t.dtype
                assert tensors[name].shape == t.shape
                assert tensors[name].reshape(-1).view(torch.uint8).tolist() == t.reshape(-1).view(torch.uint8).tolist()
        # rank 2 corrupted its first receive of v2: every rank re-received it, none applied the torn copy
        assert got[2]["attempts"] == 2
        assert got[1]["attempts"] == 1 and got[3]["attempts"] == 1 and got[4]["attempts"] == 1
        assert got["retained"] == (3, 4)
        assert got["v4_reused_v1_memory"]  # released and evicted buffers are received into again (D12)
        # asking for the evicted v1 fails at once, as LocalChannel does, and starts no receive
        error, waited, no_pending = got["evicted"]
        assert error == "VersionNotAvailableError" and waited < 2.0 and no_pending
    assert "no broadcast of version 'latest' arrived within 0.3 s" in torch.load(tmp_path / "rank1.pt")["timeout"]
