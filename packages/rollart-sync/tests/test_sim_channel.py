"""Steps 11-12 (D14): the simulated channel charges bytes / bandwidth + per-bucket latency in virtual time."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
import torch

from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.resource.virtual_time import run_virtual
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
    assert version == 1 and list(tensors) == ["sim.version"] and tensors["sim.version"].tolist() == [1]


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
