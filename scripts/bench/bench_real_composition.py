"""Benchmark the real composition (trainer actors + a sync channel) against the demo composition.

    .venv/bin/python scripts/bench/bench_real_composition.py            # 220 MB model, 5 repeats
    .venv/bin/python scripts/bench/bench_real_composition.py --quick    # 55 MB model, 3 repeats

What runs, in one process and one local Ray cluster on 127.0.0.1, interleaved repeat by repeat:

* `demo`: the trainer in the driver, weights through rollart.sync's LocalChannel and the proxy,
  shipped to each Ray rollout actor through Ray's object store (today's `make demo` wiring);
* `torch_dist`: one trainer actor publishes into TorchDistributedChannel (gloo), every rollout
  actor receives and verifies, then the proxy loads the version each actor holds;
* `mooncake` (where its package loads): the same through the Mooncake store over TCP;
* `tcp floor`: the same bytes over one loopback TCP socket between two processes.

Each update is measured end to end as the pipeline sees it (`Pipeline._update`: snapshot, pack,
transfer, verify, load into the engine), with one rollout actor so the floor moves the same bytes
once. The first `--warmup` rounds (default 3) are not counted: a receiver retains two versions
and receives the third into fresh memory, so only from the fourth update on does every update
reuse buffers, as every update of a long run does; the first (cold) update of each composition is
printed on its own line. The `vs floor` column is the median of per-round ratios (floor and
update of the same round), with its spread. A second table breaks the update into its phases
(rollart-app D40: medians over the counted rounds). A second table runs whole iterations (rollout + train + update) of the tiny model in both
compositions and reports the median step time and its spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def make_checkpoint(path: Path, hidden: int, layers: int, vocab: int) -> str:
    """A random-init Llama of the given size with the tiny chat tokenizer, written with save_pretrained."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rollart.proxy.testing import build_tiny_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64),
                      max_position_embeddings=256, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


def config(checkpoint: str | None, channel: str, iterations: int = 1) -> dict:
    placement = "driver" if channel == "local" else "actors"
    return {
        "run": {"tensorboard": False, "iterations": iterations, "checkpoint_every": 1000},
        "cluster": {"ray": "local"},
        "model": {"path": checkpoint} if checkpoint else {},
        "pipeline": {"mode": "async", "alpha": 1, "batch_size": 8, "group_size": 4, "redundancy": 1.0,
                     "update_timeout_s": 300},
        "rollout": {"pools": [{"name": f"r-{channel}", "hardware": "H800", "devices": 1, "max_num_seqs": 8}]},
        "trainer": {"placement": placement, "devices": 1, "hardware": "H800", "micro_batch_size": 8},
        "sync": {"channel": channel, "bucket_mb": 64},
        "tasks": [{"env": "frozenlake", "max_turns": 3, "max_tokens": 1}] if checkpoint is None else
                 [{"env": "math", "prompts": "chat_template", "max_turns": 2, "max_tokens": 8}],
    }


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


PHASES = ("sync_snapshot_s", "sync_pack_s", "sync_wire_s", "sync_receive_s", "sync_transfer_s", "sync_load_s")


async def updates(checkpoint: str, variants: list[str], repeats: int, warmup: int) -> dict[str, list[float]]:
    from bench_sync_channels import TcpFloor

    from rollart.app.builder import build_pipeline
    from rollart.app.config import parse_config

    pipes = {}
    times: dict[str, list[float]] = {v: [] for v in [*variants, "tcp floor"]}
    times.update({f"{v} {k}": [] for v in variants for k in (*PHASES, "cold")})
    nbytes = 0
    floor_link = TcpFloor()
    with tempfile.TemporaryDirectory() as d:
        try:
            for v in variants:
                pipes[v] = await build_pipeline(parse_config(config(checkpoint, v)), Path(d) / v)
            version = 0
            for r in range(repeats + warmup):  # the first `warmup` rounds are not counted
                order = variants[r % len(variants):] + variants[: r % len(variants)]
                version += 1
                for v in order:
                    stats = await pipes[v]._update(version)
                    nbytes = int(stats["sync_bytes"])
                    if r == 0:
                        times[f"{v} cold"].append(stats["sync_s"])
                    if r >= warmup:
                        times[v].append(stats["sync_s"])
                        for k in PHASES:
                            if k in stats:
                                times[f"{v} {k}"].append(stats[k])
                floor = min(floor_link.send(nbytes) for _ in range(2))
                if r >= warmup:
                    times["tcp floor"].append(floor)
        finally:
            for p in pipes.values():
                await p.close()
            floor_link.close()
    times["_bytes"] = [float(nbytes)]
    return times


async def iterations(variants: list[str], n: int) -> dict[str, list[float]]:
    from rollart.app.builder import build_pipeline
    from rollart.app.config import parse_config

    out: dict[str, list[float]] = {f"{v} {k}": [] for v in variants for k in ("step", "update")}
    with tempfile.TemporaryDirectory() as d:
        pipes = {v: await build_pipeline(parse_config(config(None, v, n)), Path(d) / v) for v in variants}
        try:
            for p in pipes.values():
                await p.parts.rollout.start()
            for i in range(n + 1):
                for v in variants[i % len(variants):] + variants[: i % len(variants)]:
                    rec = await pipes[v].step()
                    if i:
                        out[f"{v} step"].append(rec["step_time_s"])
                        out[f"{v} update"].append(rec["update_s"])
        finally:
            for p in pipes.values():
                await p.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3, help="uncounted first rounds (receive buffers warm up)")
    parser.add_argument("--worker", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import ray

    from rollart.sync.mooncake import mooncake_unavailable_reason

    repeats = args.repeats or (3 if args.quick else 5)
    hidden, layers = (512, 4) if args.quick else (1024, 8)
    variants = ["local", "torch_dist"] + ([] if mooncake_unavailable_reason() else ["mooncake"])
    ray.init(num_gpus=8, resources={"H800": 8.0}, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False)
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as d:
            ckpt = make_checkpoint(Path(d) / "ckpt", hidden, layers, vocab=8192)
            up = asyncio.run(updates(ckpt, variants, repeats, args.warmup))
        it = asyncio.run(iterations(["local", "torch_dist"], repeats))
    finally:
        ray.shutdown()
    nbytes = up.pop("_bytes")[0]
    print(f"\nweight update end to end, {nbytes / 2**20:.0f} MB fp32, 1 rollout actor, {repeats} interleaved repeats "
          f"after {args.warmup} warm-up rounds")
    print("| composition | update s, median [min-max] | GB/s | vs loopback TCP floor (per round) |")
    print("|---|---|---|---|")
    for v in [*variants, "tcp floor"]:
        xs = up[v]
        gbps = nbytes / statistics.median(xs) / 1e9
        print(f"| {'floor (raw TCP)' if v == 'tcp floor' else v} | {spread(xs)} | {gbps:.2f} | "
              f"{spread([f / x for f, x in zip(up['tcp floor'], xs)])} |")
    print("first (cold) update: " + ", ".join(f"{v} {up[f'{v} cold'][0]:.3f} s" for v in variants))
    print("\nphases of the update, s, median [min-max] (rollart-app D40; receive starts with the publish)")
    print("| composition | " + " | ".join(k.removeprefix("sync_").removesuffix("_s") for k in PHASES) + " |")
    print("|---|" + "---|" * len(PHASES))
    for v in variants:
        if up[f"{v} sync_wire_s"]:
            print(f"| {v} | " + " | ".join(spread(up[f"{v} {k}"]) for k in PHASES) + " |")
    print(f"\nwhole iterations of the tiny model (batch 8), {repeats} interleaved repeats")
    print("| composition | step s, median [min-max] | update s |")
    print("|---|---|---|")
    for v in ("local", "torch_dist"):
        print(f"| {v} | {spread(it[f'{v} step'])} | {spread(it[f'{v} update'])} |")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
