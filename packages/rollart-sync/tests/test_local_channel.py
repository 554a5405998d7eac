"""LocalChannel and the shared fetch/verify logic: publish returns at once, fetch waits with a deadline."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollart.sync.bucket import pack_buckets
from rollart.sync.channel import PublishHandle, WeightChannel, fetch_verified
from rollart.sync.errors import (
    ChannelClosedError,
    ChecksumMismatchError,
    StaleVersionError,
    SyncTimeoutError,
    SyncValidationError,
    VersionNotAvailableError,
)
from rollart.sync.local import LocalChannel
from rollart.sync.versioning import RetainedVersions, VersionLedger


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(16, 8, generator=g),
        "norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "step": torch.tensor(seed, dtype=torch.int64),
    }


async def test_publish_returns_done_handle_and_fetch_latest_is_bit_exact():
    channel = LocalChannel(keep_last=2)
    assert isinstance(channel, WeightChannel)
    handle = channel.publish(_weights(1), 1)
    assert isinstance(handle, PublishHandle) and handle.done()
    assert await handle.wait(1.0) == 1
    channel.publish(_weights(2), 2)
    snap = await channel.fetch()
    assert snap.version == 2
    for name, t in _weights(2).items():
        assert torch.equal(snap.tensors[name], t)
    assert (await channel.fetch(1, timeout=1.0)).version == 1


async def test_retention_keeps_last_k_and_reports_evicted_versions():
    channel = LocalChannel(keep_last=2)
    for v in (1, 2, 5):
        channel.publish(_weights(v), v)
    assert channel.versions == (2, 5)
    with pytest.raises(VersionNotAvailableError, match="version 1 is not retained"):
        await channel.fetch(1, timeout=1.0)
    with pytest.raises(VersionNotAvailableError, match="version 3"):
        await channel.fetch(3, timeout=1.0)


async def test_versions_never_go_backwards_on_publish():
    channel = LocalChannel()
    channel.publish(_weights(3), 3)
    with pytest.raises(StaleVersionError, match="must be > the current version 3 .* got 3"):
        channel.publish(_weights(3), 3)
    with pytest.raises(StaleVersionError):
        channel.publish(_weights(2), 2)


async def test_fetch_waits_for_a_publish_and_times_out_without_one():
    channel = LocalChannel()
    waiter = asyncio.create_task(channel.fetch(4, timeout=5.0))
    await asyncio.sleep(0)
    assert not waiter.done()
    channel.publish(_weights(4), 4)
    assert (await waiter).version == 4
    with pytest.raises(SyncTimeoutError, match="version 5 not published within 0.05 s"):
        await channel.fetch(5, timeout=0.05)
    with pytest.raises(SyncValidationError, match="timeout must be a finite timeout > 0"):
        await channel.fetch(timeout=0)


async def test_snapshot_is_independent_of_later_trainer_writes():
    channel = LocalChannel()
    live = _weights(7)
    channel.publish(live, 7)
    live["embed.weight"].add_(1.0)  # the next train step overwrites parameters in place
    snap = await channel.fetch()
    assert torch.equal(snap.tensors["embed.weight"], _weights(7)["embed.weight"])


async def test_closed_channel_refuses_work():
    channel = LocalChannel()
    await channel.close()
    with pytest.raises(ChannelClosedError):
        channel.publish(_weights(1), 1)
    with pytest.raises(ChannelClosedError):
        await channel.fetch(timeout=0.1)


async def test_fetch_verified_refetches_a_torn_transfer_and_never_returns_it():
    packed = pack_buckets(_weights(9), 9, bucket_bytes=64)
    reads = 0

    async def flaky_read():
        nonlocal reads
        reads += 1
        buffers = [b.clone() for b in packed.buffers]
        if reads == 1:
            buffers[-1].view(torch.uint8)[0] ^= 0x10  # a torn first transfer
        return packed.manifest, buffers

    loop = asyncio.get_running_loop()
    snap = await fetch_verified(flaky_read, 3, loop.time() + 5.0)
    assert snap.attempts == 2 and reads == 2
    assert torch.equal(snap.tensors["embed.weight"], _weights(9)["embed.weight"])

    async def always_corrupt():
        buffers = [b.clone() for b in packed.buffers]
        buffers[0].view(torch.uint8)[3] ^= 0x01
        return packed.manifest, buffers

    with pytest.raises(ChecksumMismatchError, match="every one of 2 fetch attempts was corrupt"):
        await fetch_verified(always_corrupt, 2, loop.time() + 5.0)


async def test_local_channel_with_verify_checks_checksums():
    channel = LocalChannel(verify=True)
    channel.publish(_weights(1), 1)
    assert (await channel.fetch(timeout=1.0)).attempts == 1


def test_ledger_and_retention_validation():
    ledger = VersionLedger()
    assert ledger.is_newer(0)
    ledger.advance(0)
    assert not ledger.is_newer(0)
    with pytest.raises(StaleVersionError, match="version must be > the current version"):
        ledger.advance(0)
    with pytest.raises(SyncValidationError, match=r"keep_last must be an integer in \[1, 1024\], got 0"):
        RetainedVersions(0)
