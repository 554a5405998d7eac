"""Steps 11-12 (D14): the simulated channel charges bytes / bandwidth + per-bucket latency in virtual time."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Mapping

import pytest
import torch

from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.resource.virtual_time import run_virtual
from rollart.sync.bucket import SUPPORTED_DTYPES
from rollart.sync.channel import WeightChannel
from rollart.sync.errors import StaleVersionError, SyncTimeoutError, SyncValidationError
from rollart.sync.model_update import ModelUpdateGroup
from rollart.sync.sim import SimChannel, transfer_seconds

QWEN3_8B_BYTES = 16.4e9


def test_transfer_time_matches_the_hand_computed_example():
    """D14: 16.4 GB in 32 MiB buckets (489 of them) over a 50 GB/s NIC, 100 us per bucket."""
    nic = BUILTIN_HARDWARE["H800"].network_gbps
    assert transfer_seconds(QWEN3_8B_BYTES, nic) == pytest.approx(489 * 1e-4 + 0.328)
    assert transfer_seconds(QWEN3_8B_BYTES, nic) == pytest.approx(0.3769)
    assert transfer_seconds(0, nic) == 0.0
    with pytest.raises(SyncValidationError, match="link_gbps"):
        transfer_seconds(1.0, 0)
    with pytest.raises(SyncValidationError, match="weight_bytes"):
        SimChannel(0, 50)


def test_publish_and_fetch_take_their_modelled_time_in_virtual_time():
    async def go():
        loop = asyncio.get_running_loop()
        channel = SimChannel(QWEN3_8B_BYTES, 50, fetch_link_gbps=25)
        assert isinstance(channel, WeightChannel)
        big = {"w": torch.zeros(4)}  # whatever is published, only a token is retained
        t0 = loop.time()
        handle = channel.publish(big, 1)
        assert not handle.done()
        await handle.wait()
        t_pub = loop.time() - t0
        snap = await channel.fetch()
        t_fetch = loop.time() - t0 - t_pub
        await channel.close()
        return t_pub, t_fetch, snap.version, dict(snap.tensors)

    t_pub, t_fetch, version, tensors = run_virtual(go()).result
    assert t_pub == pytest.approx(transfer_seconds(QWEN3_8B_BYTES, 50))
    assert t_fetch == pytest.approx(transfer_seconds(QWEN3_8B_BYTES, 25))
    assert version == 1 and tensors == {}  # the version moves, not tensors (D45)


def test_the_sim_channel_and_the_package_names_import_no_torch():
    """D45: a fresh interpreter publishes and fetches through SimChannel with torch never imported; the
    package's names still resolve (lazily) and `SUPPORTED_DTYPES` knows its names without torch."""
    code = (
        "import sys, asyncio\n"
        "import rollart.sync as sync\n"
        "from rollart.sync.sim import SimChannel\n"
        "from rollart.sync.bucket import SUPPORTED_DTYPES\n"
        "async def go():\n"
        "    ch = SimChannel(1e9, 50)\n"
        "    await ch.publish({}, 3).wait()\n"
        "    snap = await ch.fetch()\n"
        "    await ch.close()\n"
        "    return snap.version\n"
        "assert asyncio.run(go()) == 3\n"
        "assert 'bfloat16' in SUPPORTED_DTYPES and len(SUPPORTED_DTYPES) == 10\n"
        "assert sync.LocalChannel.__name__ == 'LocalChannel' and 'torch' not in sys.modules\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["TORCH", "False"]
    assert SUPPORTED_DTYPES["bfloat16"] is torch.bfloat16 and dict(SUPPORTED_DTYPES)["bool"] is torch.bool


class VersionWorker:
    def __init__(self) -> None:
        self.versions: list[int] = []

    async def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.versions.append(version)


def test_versions_deadlines_and_model_update_group_work_as_with_real_channels():
    async def go():
        loop = asyncio.get_running_loop()
        channel = SimChannel(QWEN3_8B_BYTES, 50, fetch_link_gbps=1)  # fetch: 16.4 s
        workers = [VersionWorker(), VersionWorker()]
        group = ModelUpdateGroup(channel, workers, timeout=60)
        t0 = loop.time()
        report = await group.model_update({"x": torch.ones(1)}, 1)
        took = loop.time() - t0
        with pytest.raises(StaleVersionError):
            channel.publish({}, 1)
        await channel.publish({}, 2).wait()
        with pytest.raises(SyncTimeoutError, match="deadline"):
            await channel.fetch(2, timeout=5.0)  # 16.4 s of fetch does not fit 5 s
        waited = loop.time() - t0 - took
        await channel.close()
        return report, took, waited, [w.versions for w in workers]

    report, took, waited, versions = run_virtual(go()).result
    assert report.version == 1 and versions == [[1], [1]]
    assert took == pytest.approx(transfer_seconds(QWEN3_8B_BYTES, 50) + transfer_seconds(QWEN3_8B_BYTES, 1))
    assert waited == pytest.approx(transfer_seconds(QWEN3_8B_BYTES, 50) + 5.0)
