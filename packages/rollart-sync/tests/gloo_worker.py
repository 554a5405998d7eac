"""One rank of the gloo broadcast test, run as a spawned process: `python gloo_worker.py RANK WORLD INIT OUTDIR`.

Rank 0 is the trainer (publishes v1, v2, then v3 and v4 once rank 1 has timed out once); the other ranks
fetch. Rank 2 corrupts its first receive of v2, so every rank must see v2 delivered on attempt 2.
Then each receiver asks for the evicted v1, which must fail at once. Each rank saves what it received to OUTDIR/rank<R>.pt for the test to compare bit for bit.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rollart.sync.errors import SyncTimeoutError, VersionNotAvailableError
from rollart.sync.torch_dist import TorchDistributedChannel


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "layers.0.weight": torch.randn(64, 32, generator=g),
        "layers.0.bias": torch.randn(64, generator=g).to(torch.bfloat16),
        "embed": torch.randn(300, 16, generator=g).to(torch.float16),
        "step": torch.tensor([version], dtype=torch.int64),
        "mask": torch.rand(7, generator=g) > 0.5,
    }


class CorruptSecondUpdateOnce:
    """A receive hook that flips a byte in the first attempt of the second update this rank receives."""

    def __init__(self) -> None:
        self.first_attempts = 0

    def __call__(self, attempt: int, buffers) -> None:
        if attempt == 1:
            self.first_attempts += 1
            if self.first_attempts == 2:
                buffers[0].view(torch.uint8)[5] ^= 0xFF


async def main(rank: int, out: Path) -> None:
    hook = CorruptSecondUpdateOnce() if rank == 2 else None
    channel = TorchDistributedChannel(src_rank=0, bucket_bytes=4096, receive_hook=hook)
    received: dict[int, dict] = {}
    if rank == 0:
        await channel.publish(weights(1), 1).wait(60)
        await channel.publish(weights(2), 2).wait(60)
        signal = out / "rank1-timed-out"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not signal.exists() and loop.time() < deadline:  # noqa: ASYNC110 - the signal is a file from another process
            await asyncio.sleep(0.05)
        await channel.publish(weights(3), 3).wait(60)
        await channel.publish(weights(4), 4).wait(60)
    else:
        snap1 = await channel.fetch(timeout=60)
        snap2 = await channel.fetch(2, timeout=60)
        received[1] = {"tensors": {k: v.clone() for k, v in snap1.tensors.items()}, "attempts": snap1.attempts}
        received[2] = {"tensors": {k: v.clone() for k, v in snap2.tensors.items()}, "attempts": snap2.attempts}
        v1_storages = {t.untyped_storage().data_ptr() for t in snap1.tensors.values()}
        snap1.release()  # copied: v1's buffers may be received into once v1 is evicted
        snap2.release()
        if rank == 1:
            try:
                await channel.fetch(timeout=0.3)
                received["timeout"] = "no timeout"
            except SyncTimeoutError as exc:
                received["timeout"] = str(exc)
            (out / "rank1-timed-out").touch()
        snap3 = await channel.fetch(timeout=60)
        received[3] = {"tensors": {k: v.clone() for k, v in snap3.tensors.items()}, "attempts": snap3.attempts}
        snap4 = await channel.fetch(timeout=60)  # v1 was evicted when v3 arrived: v4 lands in its memory
        received[4] = {"tensors": dict(snap4.tensors), "attempts": snap4.attempts}
        received["v4_reused_v1_memory"] = bool(v1_storages & {t.untyped_storage().data_ptr() for t in snap4.tensors.values()})
        received["retained"] = channel.versions
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:  # v1 was evicted: no broadcast will carry it again, so the fetch must fail at once
            await channel.fetch(1, timeout=10)
            received["evicted"] = ("no error", 0.0, channel._pending is None)
        except (VersionNotAvailableError, SyncTimeoutError) as exc:
            received["evicted"] = (type(exc).__name__, loop.time() - started, channel._pending is None)
    await channel.close()
    torch.save(received, out / f"rank{rank}.pt")


if __name__ == "__main__":
    rank, world, init, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    try:
        asyncio.run(main(rank, outdir))
    finally:
        dist.destroy_process_group()
