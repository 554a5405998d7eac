"""The trainer side of the Mooncake cross-process test, run as its own process.

    python mooncake_publisher.py MASTER METADATA MODEL

Publishes versions 1 and 2 of `weights(v)`, prints "published 2", then keeps its store client (and
so the memory segment holding the buckets) alive until a line arrives on stdin.
"""

from __future__ import annotations

import asyncio
import sys

import torch

from rollart.sync.mooncake import MooncakeChannel, MooncakeConfig


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {
        "model.embed_tokens.weight": torch.randn(512, 256, generator=g),  # 512 KiB: several buckets
        "model.layers.0.mlp.up_proj.weight": torch.randn(256, 256, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(256, generator=g).to(torch.float16),
        "lm_head.bias": torch.zeros(0),
        "step": torch.tensor(version, dtype=torch.int64),
    }


async def main(master: str, metadata: str, model: str) -> None:
    config = MooncakeConfig(master_address=master, metadata_server=metadata, global_segment_bytes=64 * 1024 * 1024)
    channel = await MooncakeChannel.connect(config, model=model, keep_last=2, bucket_bytes=192 * 1024, timeout=30)
    for version in (1, 2):
        await channel.publish(weights(version), version).wait(30)
    print(f"published {version}", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await channel.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
