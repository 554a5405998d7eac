"""TorchDistributedChannel without CRC-32 (D42) and with the wire overlapping the pack (D41), over real gloo.

Two spawned processes on 127.0.0.1: rank 0 publishes three versions of many small buckets (so the
collective thread waits for buckets the publisher is still copying), rank 1 fetches each; the bytes
must be the published ones and the receiver must learn from the header that no checksums come.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import socket

import torch
import torch.multiprocessing as mp


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    out = {f"layer.{i}.w": torch.randn(257, generator=g) for i in range(12)}
    out["emb"] = torch.randn(1000, 3, generator=g).to(torch.bfloat16)
    out["step"] = torch.tensor([version])
    return out


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from rollart.sync.errors import ChecksumMismatchError
    from rollart.sync.torch_dist import TorchDistributedChannel

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))

    async def run() -> dict:
        # only the source's flag decides (the receiver's own is ignored: it reads the header)
        channel = TorchDistributedChannel(src_rank=0, bucket_bytes=2048, keep_last=1, checksums=rank == 1)
        got = {}
        for v in (1, 2, 3):
            if rank == 0:
                await channel.publish(weights(v), v).wait(30)
            else:
                snap = await channel.fetch(v, timeout=30)
                got[v] = ({k: t.clone() for k, t in snap.tensors.items()}, [b.checksum for b in snap.manifest.buckets],
                          snap.attempts)
                snap.release()
        # a copy that fails half-way (a tensor on the meta device has no bytes): nothing is applied anywhere
        if rank == 0:
            torn = {**weights(4), "layer.5.w": torch.empty(257, device="meta")}
            try:
                channel.publish(torn, 4)
            except NotImplementedError:
                got["publish_raised"] = True
            # the broadcast of the voted-corrupt buckets still runs on the collective thread: let it end
            await asyncio.get_running_loop().run_in_executor(channel._executor, lambda: None)
        else:
            try:
                await channel.fetch(4, timeout=30)
            except ChecksumMismatchError as exc:
                got["torn"] = str(exc)
        await channel.close()
        return got

    result = asyncio.run(run())
    dist.destroy_process_group()
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))


def test_without_checksums_the_broadcast_is_bit_exact_and_says_so_in_the_header(tmp_path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "rank1.pt")
    for v in (1, 2, 3):
        tensors, sums, attempts = got[v]
        expected = weights(v)
        assert sorted(tensors) == sorted(expected) and attempts == 1
        for name, t in expected.items():
            assert torch.equal(tensors[name].view(torch.uint8), t.view(torch.uint8)), (v, name)
        assert len(sums) > 4 and set(sums) == {0}  # many buckets, and no CRC computed or sent
    assert torch.load(tmp_path / "rank0.pt") == {"publish_raised": True}
    assert "corrupt on all" in got["torn"]  # the half-copied version was voted corrupt, never applied
