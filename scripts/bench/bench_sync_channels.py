"""Benchmark rollart-sync channels: end-to-end GB/s per model size against floors interleaved in the same run.

    .venv/bin/python scripts/bench/bench_sync_channels.py                      # 64 MB, 256 MB
    .venv/bin/python scripts/bench/bench_sync_channels.py --sizes-mb 64,256,1024
    .venv/bin/python scripts/bench/bench_sync_channels.py --quick              # 8 MB, 32 MB

The headline of every channel is end to end as the pipeline sees it: the trainer-side snapshot
(pack + CRC-32) + transfer + the receiver's fetch and verification, i.e. publish + fetch; for gloo
also the load (ModelUpdateGroup.update into a loader that serves straight from the received
buffers), with and without CRC-32 (sync D42).
Parts (publish only, the wire time after the pack, Mooncake's own `batch_get_into`) are listed
below the headline, never instead of it.

Floors, each measured in the same loop as its channel, alternating with it on every repeat (so
the machine's load hits both alike; the ratio is the median of the per-repeat ratios):
  local     - a torch copy of the same bytes (memcpy);
  gloo      - a raw gloo broadcast of one buffer of the same bytes between the same two processes
              (the transport alone: no pack, manifest, CRC or vote);
  Mooncake  - a raw loopback TCP socket to another process (Mooncake runs over TCP here).
One warm-up, then `--repeats` timed repeats; median and min-max spread. Needs ~5x the largest size
in free memory.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MiB = 1024 * 1024
SCRIPT = Path(__file__).resolve()


def make_model(nbytes: int) -> dict[str, torch.Tensor]:
    """A fake model of `nbytes`: 16 MiB tensors, every fourth one bfloat16 (two dtypes, several buckets)."""
    out: dict[str, torch.Tensor] = {}
    remaining, i = nbytes, 0
    while remaining > 0:
        dtype = torch.bfloat16 if i % 4 == 3 else torch.float32
        chunk = min(16 * MiB, remaining)
        n = chunk // torch.empty((), dtype=dtype).element_size()
        out[f"layers.{i}.weight"] = torch.full((n,), float(i % 7) + 0.5, dtype=dtype)
        remaining -= n * out[f"layers.{i}.weight"].element_size()
        i += 1
    return out


# ---- floors -------------------------------------------------------------------------------------------


def tcp_receiver(port: int) -> None:
    """Child: receive framed payloads into a preallocated buffer, ack each with one byte."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = None
        while True:
            header = conn.recv(8, socket.MSG_WAITALL)
            if len(header) < 8:
                return
            (size,) = struct.unpack("!Q", header)
            if buf is None or len(buf) < size:
                buf = bytearray(size)
            view = memoryview(buf)[:size]
            got = 0
            while got < size:
                got += conn.recv_into(view[got:], size - got)
            conn.sendall(b"k")


class TcpFloor:
    """A raw loopback TCP socket to a child process: one framed payload out, one byte back."""

    def __init__(self) -> None:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            self.child = subprocess.Popen([sys.executable, str(SCRIPT), "--worker", "tcp", str(server.getsockname()[1])])
            self.conn, _ = server.accept()
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.payloads: dict[int, memoryview] = {}

    def send(self, size: int) -> float:
        """Seconds to move `size` bytes and get the acknowledgement."""
        payload = self.payloads.setdefault(size, memoryview(torch.ones(size, dtype=torch.uint8).numpy()))
        t0 = time.perf_counter()
        self.conn.sendall(struct.pack("!Q", size))
        self.conn.sendall(payload)
        assert self.conn.recv(1) == b"k"
        return time.perf_counter() - t0

    def close(self) -> None:
        self.conn.close()
        self.child.wait(timeout=30)


# ---- channels -----------------------------------------------------------------------------------------


async def local_channel(nbytes: int, repeats: int) -> tuple[list[float], list[float]]:
    """(channel seconds, copy-floor seconds) per repeat, alternating."""
    from rollart.sync.local import LocalChannel

    model = make_model(nbytes)
    channel = LocalChannel(keep_last=1)
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    got: list[float] = []
    floor: list[float] = []
    for v in range(repeats + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        t1 = time.perf_counter()
        await channel.publish(model, v).wait(120)
        snap = await channel.fetch(v, timeout=120)
        t2 = time.perf_counter()
        assert snap.version == v
        if v > 0:  # the first round is the warm-up
            floor.append(t1 - t0)
            got.append(t2 - t1)
    return got, floor


class BindingLoader:
    """Loads a version straight from the received buffers (zero copy), as a loader may under D44."""

    def __init__(self) -> None:
        self.params: dict[str, torch.Tensor] = {}

    async def load_weights(self, weights, version: int) -> None:
        self.params = dict(weights)


def gloo_worker(rank: int, init: str, sizes: list[int], repeats: int) -> None:
    """Child: rank 0 publishes, rank 1 fetches and loads, a raw broadcast floor between; rank 0 prints JSON.

    Two variants per repeat, interleaved with the floor: the channel with CRC-32 per bucket (the
    default) and without (`checksums=False`, for a reliable transport, sync D42).
    """
    import torch.distributed as dist

    from rollart.sync.model_update import ModelUpdateGroup
    from rollart.sync.torch_dist import TorchDistributedChannel

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # as the trainer and rollout actors run (rollart-app actors)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))

    async def run() -> dict[int, dict[str, list[float]]]:
        channels = {"crc": TorchDistributedChannel(src_rank=0, keep_last=1),
                    "nocrc": TorchDistributedChannel(src_rank=0, keep_last=1, checksums=False)}
        groups = {k: ModelUpdateGroup(c, [BindingLoader()] if rank else [], timeout=300) for k, c in channels.items()}
        out: dict[int, dict[str, list[float]]] = {}
        version = 0
        for size in sizes:
            model = make_model(size) if rank == 0 else None
            raw = torch.ones(size, dtype=torch.uint8) if rank == 0 else torch.empty(size, dtype=torch.uint8)
            ack = torch.zeros(1, dtype=torch.int64)
            out[size] = {"total": [], "wire": [], "floor": [], "total_nocrc": [], "wire_nocrc": []}
            for rep in range(repeats + 1):
                # the floor: the same bytes as one raw broadcast, acknowledged by an all_reduce like the vote
                t0 = time.perf_counter()
                dist.broadcast(raw, 0)
                dist.all_reduce(ack)
                t_floor = time.perf_counter() - t0
                for variant, suffix in (("crc", ""), ("nocrc", "_nocrc")):
                    version += 1
                    if rank == 0:
                        t0 = time.perf_counter()
                        handle = groups[variant].publish(model, version)  # returns once the snapshot is packed
                        t1 = time.perf_counter()
                        await handle.wait(300)
                        dist.all_reduce(ack)  # the receiver loaded it
                        t2 = time.perf_counter()
                        if rep > 0:
                            out[size]["total" + suffix].append(t2 - t0)
                            out[size]["wire" + suffix].append(t2 - t1)
                    else:
                        report = await groups[variant].update(version, timeout=300)  # fetch + load
                        assert report.version == version
                        dist.all_reduce(ack)
                if rank == 0 and rep > 0:
                    out[size]["floor"].append(t_floor)
            del model, raw
        for channel in channels.values():
            await channel.close()
        return out

    result = asyncio.run(run())
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({str(k): v for k, v in result.items()}), flush=True)


def gloo_channel(sizes: list[int], repeats: int) -> dict[int, dict[str, list[float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/rendezvous"
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
        argv = [sys.executable, str(SCRIPT), "--worker", "gloo", init, json.dumps(sizes), str(repeats)]
        procs = [subprocess.Popen([*argv, str(r)], env=env, stdout=subprocess.PIPE, text=True) for r in range(2)]
        out = procs[0].communicate(timeout=600)[0]
        procs[1].wait(timeout=60)
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def raw_get_seconds(channel, snap) -> float:
    """Mooncake alone: one batch_get_into of the same buckets into warm, pre-registered buffers."""
    buffers = [t for t in _flat_buffers(snap)]
    keys = [channel.bucket_key(snap.version, b.index) for b in snap.manifest.buckets]
    ptrs = [b.data_ptr() for b in buffers]
    sizes = [b.nbytes for b in snap.manifest.buckets]
    for ptr, size in zip(ptrs, sizes):
        channel.store.register_buffer(ptr, size)
    t0 = time.perf_counter()
    codes = channel.store.batch_get_into(keys, ptrs, sizes)
    elapsed = time.perf_counter() - t0
    for ptr in ptrs:
        channel.store.unregister_buffer(ptr)
    assert codes == sizes, codes
    return elapsed


def _flat_buffers(snap):
    """The received flat buffers behind a snapshot (each bucket's first tensor view starts its buffer)."""
    out = []
    for bucket in snap.manifest.buckets:
        first = snap.tensors[bucket.entries[0].name]
        out.append(torch.empty(0, dtype=first.dtype).set_(first.untyped_storage(), 0, (bucket.numel,)))
    return out


def mooncake_fetcher(master: str, metadata: str) -> None:
    """Child: for each line "version", fetch it and print the fetch seconds."""
    from rollart.sync.mooncake import MooncakeChannel, MooncakeConfig

    async def run() -> None:
        config = MooncakeConfig(master, metadata, global_segment_bytes=0)
        channel = await MooncakeChannel.connect(config, model="bench", timeout=60)
        print("ready", flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            version = int(line)
            t0 = time.perf_counter()
            snap = await channel.fetch(version, timeout=300)
            elapsed = time.perf_counter() - t0
            assert snap.version == version
            raw = await asyncio.to_thread(raw_get_seconds, channel, snap)
            snap.release()  # as ModelUpdateGroup does once the loaders copied the weights
            print(elapsed, raw, flush=True)
        await channel.close()

    asyncio.run(run())


async def mooncake_channel(sizes: list[int], repeats: int) -> dict[int, dict[str, list[float]]]:
    """Seconds per repeat and size: publish (total, wire), fetch, publish+fetch (total, wire), raw get, TCP floor."""
    from rollart.sync.mooncake import MooncakeChannel, MooncakeConfig
    from rollart.sync.mooncake_services import MooncakeServices

    services = MooncakeServices()
    config = await services.start(timeout=60)
    env = {**os.environ, "GLOG_minloglevel": "2"}
    stderr_log = open(Path(tempfile.gettempdir()) / "bench_sync_mooncake_fetcher.log", "w")  # noqa: SIM115, ASYNC230
    child = subprocess.Popen(  # noqa: ASYNC220 - a quick spawn; all waits on the child are threaded
        [sys.executable, str(SCRIPT), "--worker", "mooncake", config.master_address, config.metadata_server],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr_log, text=True, env=env,
    )
    tcp = TcpFloor()
    results: dict[int, dict[str, list[float]]] = {}
    try:
        assert (await asyncio.to_thread(child.stdout.readline)).strip() == "ready"
        segment = 2 * max(sizes) + 256 * MiB  # room for the new version before the old one is collected
        pub_config = MooncakeConfig(config.master_address, config.metadata_server, global_segment_bytes=segment)
        channel = await MooncakeChannel.connect(pub_config, model="bench", keep_last=1, timeout=60)
        version = 0
        for size in sizes:
            model = make_model(size)
            got: dict[str, list[float]] = {k: [] for k in ("publish", "publish_wire", "fetch", "total", "total_wire",
                                                            "raw_get", "floor")}
            for rep in range(repeats + 1):
                t_floor = tcp.send(size)  # the floor, in the same loop as the channel
                version += 1
                t0 = time.perf_counter()
                handle = channel.publish(model, version)  # returns after the snapshot (pack + CRC)
                t1 = time.perf_counter()
                await handle.wait(300)
                t_pub, t_wire = time.perf_counter() - t0, time.perf_counter() - t1
                child.stdin.write(f"{version}\n")
                child.stdin.flush()
                reply = await asyncio.to_thread(child.stdout.readline)
                if not reply.strip():
                    raise RuntimeError(f"Mooncake fetcher died; see {stderr_log.name}")
                t_fetch, t_raw = (float(x) for x in reply.split())
                now = {"publish": t_pub, "publish_wire": t_wire, "fetch": t_fetch, "total": t_pub + t_fetch,
                       "total_wire": t_wire + t_fetch, "raw_get": t_raw, "floor": t_floor}
                if rep > 0:
                    for k, v in now.items():
                        got[k].append(v)
            results[size] = got
            del model
        await channel.close()
    finally:
        tcp.close()
        try:
            if child.stdin:
                child.stdin.close()  # may raise BrokenPipeError when the fetcher died
            await asyncio.to_thread(child.wait, 60)
        except (OSError, subprocess.TimeoutExpired):
            child.kill()
        finally:
            stderr_log.close()
            await services.stop()
    return results


# ---- report -------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MB and 32 MB only")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per size (after one warm-up)")
    parser.add_argument("--channels", default="local,gloo,mooncake")
    parser.add_argument("--sizes-mb", default=None, help="comma-separated sizes in MB (overrides --quick)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "tcp":
            tcp_receiver(int(rest[0]))
        elif kind == "gloo":
            gloo_worker(int(rest[3]), rest[0], json.loads(rest[1]), int(rest[2]))
        elif kind == "mooncake":
            mooncake_fetcher(rest[0], rest[1])
        return

    from bench_stats import fmt
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(1)
    sizes = [8 * MiB, 32 * MiB] if args.quick else [64 * MiB, 256 * MiB]
    if args.sizes_mb:
        sizes = [int(x) * MiB for x in args.sizes_mb.split(",")]
    repeats = args.repeats or (2 if args.quick else 3)
    channels = set(args.channels.split(","))
    rows: list[tuple] = []  # (channel, size, seconds per repeat, floor name, floor seconds per repeat)
    started = time.perf_counter()

    if "local" in channels:
        for size in sizes:
            got, floor = asyncio.run(local_channel(size, repeats))
            rows.append(("local publish+fetch, end to end", size, got, "torch copy", floor))
    if "gloo" in channels:
        for size, g in gloo_channel(sizes, repeats).items():
            rows.append(("gloo publish+fetch+load, CRC-32, end to end", size, g["total"], "raw gloo broadcast", g["floor"]))
            rows.append(("  part: after publish returned (wire + verify + load)", size, g["wire"], "raw gloo broadcast",
                         g["floor"]))
            rows.append(("gloo publish+fetch+load, no CRC (D42), end to end", size, g["total_nocrc"], "raw gloo broadcast",
                         g["floor"]))
            rows.append(("  part: after publish returned (wire + load)", size, g["wire_nocrc"], "raw gloo broadcast",
                         g["floor"]))
    if "mooncake" in channels:
        from rollart.sync.mooncake import mooncake_unavailable_reason

        reason = mooncake_unavailable_reason()
        if reason:
            print(f"mooncake skipped: {reason}")
        else:
            for size, b in asyncio.run(mooncake_channel(sizes, repeats)).items():
                rows.append(("mooncake publish+fetch, end to end", size, b["total"], "loopback TCP", b["floor"]))
                rows.append(("  part: mooncake publish (pack + put)", size, b["publish"], "loopback TCP", b["floor"]))
                rows.append(("  part: mooncake fetch, other proc", size, b["fetch"], "loopback TCP", b["floor"]))
                rows.append(("  part: mooncake raw batch_get_into", size, b["raw_get"], "loopback TCP", b["floor"]))

    table = Table(title=f"rollart-sync channels, GB/s, median (min-max) of {repeats} repeats with the floor "
                        f"interleaved ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    for col in ("channel", "size", "GB/s", "floor", "floor GB/s", "ratio to floor"):
        table.add_column(col, justify="left" if col in ("channel", "floor") else "right")
    for name, size, seconds, floor_name, floor_s in rows:
        table.add_row(name, f"{size // MiB} MB", fmt([size / t / 1e9 for t in seconds]), floor_name,
                      fmt([size / t / 1e9 for t in floor_s]), fmt([f / t for t, f in zip(seconds, floor_s)]))
    Console(width=170).print(table)
    print("end to end = trainer-side pack + CRC + transfer + the receiver's fetch and verification; 'part' rows are")
    print("components of it, never a headline. Ratios are medians of per-repeat ratios to the floor measured in the same loop.")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
