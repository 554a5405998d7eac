"""MooncakeChannel over TCP on 127.0.0.1: cross-process bit-exactness, GC of old versions, corruption.

Needs `mooncake-transfer-engine(-non-cuda)` (and Debian's libibverbs1); skips with the import error
otherwise. The fixture starts a master and a metadata server bound to 127.0.0.1 and stops them after.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rollart.sync.errors import ChecksumMismatchError, SyncTimeoutError, VersionNotAvailableError
from rollart.sync.model_update import ModelUpdateGroup
from rollart.sync.mooncake import MooncakeChannel, MooncakeConfig, mooncake_unavailable_reason

pytestmark = pytest.mark.mooncake

REASON = mooncake_unavailable_reason()
PUBLISHER = Path(__file__).with_name("mooncake_publisher.py")


def _publisher_weights():
    spec = importlib.util.spec_from_file_location("mooncake_publisher", PUBLISHER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.weights


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory) -> MooncakeConfig:
    if REASON is not None:
        pytest.skip(REASON)
    from rollart.sync.mooncake_services import MooncakeServices

    services = MooncakeServices(host="127.0.0.1", log_dir=str(tmp_path_factory.mktemp("mooncake-logs")))
    config = asyncio.run(services.start(timeout=30))
    yield config
    asyncio.run(services.stop(timeout=10))


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bytes(a.reshape(-1).view(torch.uint8).numpy()) == bytes(
        b.reshape(-1).view(torch.uint8).numpy()
    )


async def test_publish_in_one_process_fetch_in_another_is_bit_exact(mooncake: MooncakeConfig):
    publisher = subprocess.Popen(  # noqa: ASYNC220 - starting a child is quick; its waits are threaded
        [sys.executable, str(PUBLISHER), mooncake.master_address, mooncake.metadata_server, "xproc"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "GLOG_minloglevel": "2"},
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(publisher.stdout.readline), 60)
        assert line.strip() == "published 2", line
        fetch_only = MooncakeConfig(mooncake.master_address, mooncake.metadata_server, global_segment_bytes=0)
        channel = await MooncakeChannel.connect(fetch_only, model="xproc", timeout=30)
        try:
            weights = _publisher_weights()
            latest = await channel.fetch(timeout=30)
            older = await channel.fetch(1, timeout=30)
            assert latest.version == 2 and older.version == 1
            assert latest.attempts == 1
            for snap in (latest, older):
                expected = weights(snap.version)
                assert sorted(snap.tensors) == sorted(expected)
                for name, t in expected.items():
                    assert _bits_equal(snap.tensors[name], t), name
            assert len(latest.manifest.buckets) > 2  # really bucketed: several batched objects
        finally:
            await channel.close()
    finally:
        publisher.stdin.write("done\n")
        publisher.stdin.flush()
        await asyncio.wait_for(asyncio.to_thread(publisher.wait), 30)
    assert publisher.returncode == 0


async def test_old_versions_are_collected_and_fetch_waits_with_a_deadline(mooncake: MooncakeConfig):
    channel = await MooncakeChannel.connect(mooncake, model="gc", keep_last=2, bucket_bytes=4096, timeout=30)
    try:
        with pytest.raises(SyncTimeoutError, match="not published to rollart/gc within 0.2 s"):
            await channel.fetch(timeout=0.2)
        handles = [channel.publish({"w": torch.full((3000,), float(v))}, v) for v in (1, 2, 3)]
        assert handles[0].done() is False  # publish returned before the transfer finished
        for h in handles:
            await h.wait(30)
        assert await channel.latest_version() == 3
        assert not channel.store.is_exist(channel.manifest_key(1))
        assert not channel.store.is_exist(channel.bucket_key(1, 0))
        assert channel.store.is_exist(channel.manifest_key(2))
        with pytest.raises(VersionNotAvailableError, match="version 1"):
            await channel.fetch(1, timeout=5)
        assert torch.equal((await channel.fetch(timeout=5)).tensors["w"], torch.full((3000,), 3.0))
        # sequential publishes recycle the previous snapshot's buffers: stored versions stay intact
        await channel.publish({"w": torch.full((3000,), 4.0)}, 4).wait(30)
        await channel.publish({"w": torch.full((3000,), 5.0)}, 5).wait(30)
        assert torch.equal((await channel.fetch(4, timeout=5)).tensors["w"], torch.full((3000,), 4.0))
        assert torch.equal((await channel.fetch(5, timeout=5)).tensors["w"], torch.full((3000,), 5.0))
    finally:
        await channel.close()


class RecordingWorker:
    def __init__(self) -> None:
        self.loaded: list[int] = []

    async def load_weights(self, weights, version: int) -> None:
        self.loaded.append(version)


async def test_a_corrupt_stored_bucket_is_refetched_then_refused_never_applied(mooncake: MooncakeConfig):
    channel = await MooncakeChannel.connect(mooncake, model="corrupt", max_attempts=2, bucket_bytes=4096, timeout=30)
    worker = RecordingWorker()
    group = ModelUpdateGroup(channel, [worker], timeout=30)
    try:
        await group.model_update({"w": torch.arange(2000, dtype=torch.float32)}, 1)
        assert worker.loaded == [1]
        await group.publish({"w": torch.arange(2000, dtype=torch.float32) * 2}, 2).wait(30)
        key = channel.bucket_key(2, 0)
        stored = bytearray(channel.store.get(key))
        stored[17] ^= 0x40  # a flipped bit in the stored object: every fetch of v2 now reads a torn bucket
        assert channel.store.upsert(key, bytes(stored)) == 0
        with pytest.raises(ChecksumMismatchError, match="every one of 2 fetch attempts was corrupt"):
            await group.update(timeout=30)
        assert worker.loaded == [1] and group.worker_versions() == (1,)
    finally:
        await channel.close()


async def test_released_snapshot_buffers_are_received_into_again(mooncake: MooncakeConfig):
    channel = await MooncakeChannel.connect(mooncake, model="recycle", keep_last=3, bucket_bytes=4096, timeout=30)
    try:
        for v in (1, 2, 3):
            await channel.publish({"w": torch.full((3000,), float(v)), "i": torch.arange(10) * v}, v).wait(30)
        kept = await channel.fetch(1, timeout=10)  # never released: its memory must never be reused
        kept_ptrs = {t.untyped_storage().data_ptr() for t in kept.tensors.values()}
        first = await channel.fetch(2, timeout=10)
        first_ptrs = {t.untyped_storage().data_ptr() for t in first.tensors.values()}
        first.release()
        second = await channel.fetch(3, timeout=10)
        second_ptrs = {t.untyped_storage().data_ptr() for t in second.tensors.values()}
        assert second_ptrs == first_ptrs and not (second_ptrs & kept_ptrs)
        assert torch.equal(second.tensors["w"], torch.full((3000,), 3.0))
        assert torch.equal(second.tensors["i"], torch.arange(10) * 3)
        assert torch.equal(kept.tensors["w"], torch.full((3000,), 1.0))
    finally:
        await channel.close()


class KeepingLoader:
    """Keeps the mapping it was given, as LLMProxy.update_weights does for workers that come back later."""

    def __init__(self) -> None:
        self.kept: dict[str, torch.Tensor] | None = None
        self.kept_version: int | None = None
        self.intact_at_next_load: list[bool] = []

    async def load_weights(self, weights, version: int) -> None:
        if self.kept is not None:  # the next version was fetched: what we kept must still be the old version
            expected = _weights_of(self.kept_version)
            self.intact_at_next_load.append(all(_bits_equal(self.kept[k], expected[k]) for k in expected))
        self.kept, self.kept_version = dict(weights), version


def _weights_of(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3000,), float(version)), "i": torch.arange(10) * version}


async def test_a_loader_that_keeps_the_views_sees_them_unchanged_until_the_next_version_is_loaded(mooncake: MooncakeConfig):
    """D44: the group holds the last loaded snapshot, so a fetch never receives into views a loader still keeps."""
    channel = await MooncakeChannel.connect(mooncake, model="keepviews", keep_last=2, bucket_bytes=4096, timeout=30)
    loader = KeepingLoader()
    group = ModelUpdateGroup(channel, [loader], timeout=30)
    try:
        for v in (1, 2, 3, 4):
            await group.model_update(_weights_of(v), v)
        assert loader.intact_at_next_load == [True, True, True]
        assert all(_bits_equal(loader.kept[k], t) for k, t in _weights_of(4).items())
    finally:
        await channel.close()
