"""SampleBuffer put+get throughput against the backlog of part-filled groups, and what it keeps (D16, D55, D56).

One cycle = `group_size` (4) puts that complete a fresh group + one get of that group (5 ops).
The backlog is W groups holding 1 of their 4 members, in bound, waiting the whole run (the groups a
slow environment keeps open). The trajectories are built before the clock starts and the clock is this
process's CPU time (the machine is shared): the rate is the buffer's alone (before D56 the harness
timed building them and the wall clock too).
Rows, interleaved and repeated (median, min-max spread):
  get_batch            - SampleBuffer keeping every record: put_nowait x 4 + `await get_batch(4)` (the real API)
  get_batch + ledger   - the same with a ledger (D55): closed records handed over and forgotten
  core                 - SampleBuffer: put_nowait x 4 + the synchronous core of get_batch
                         (_evict_stale, can_take, _take) - same work as the reference row
  brute force (core)   - the pre-D16 buffer (tests/test_buffer_index.py::ReferenceBuffer), same core
                         (backlogs up to 1,000 only: it scans every group on every put)
  <rev> get_batch      - with `--baseline REV`: the SampleBuffer of git revision REV (its buffer.py loaded
                         from git), same harness, interleaved with the rows above
`kept` is `retained()` at the end of the row's last run: records and closed-group marks in memory.
Every get must return exactly the group just completed, or the run fails.

    .venv/bin/python scripts/bench/bench_buffer.py [--quick] [--baseline 6449aed]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages/rollart-scheduler/tests"))

from test_buffer_index import FakeTraj, ReferenceBuffer  # noqa: E402

from rollart.scheduler.buffer import SampleBuffer  # noqa: E402

GS = 4


def buffer_at(rev: str) -> type:
    """SampleBuffer as of git revision `rev`: its buffer.py, loaded as a module of its own."""
    root = Path(__file__).resolve().parents[2]
    src = subprocess.run(["git", "show", f"{rev}:packages/rollart-scheduler/src/rollart/scheduler/buffer.py"], cwd=root,
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="bench-buffer-")) / "buffer_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("buffer_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["buffer_baseline"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.SampleBuffer


def fill_backlog(buf, waiting: int) -> None:
    for g in range(waiting):
        buf.put_nowait(FakeTraj(f"w{g}", f"wait-g{g}", [0]))


def trajectories(cycles: int) -> list[list[FakeTraj]]:
    return [[FakeTraj(f"c{c}-{m}", f"c-g{c}", [0]) for m in range(GS)] for c in range(cycles)]


def core_cycles(buf, cycles: int) -> float:
    work = trajectories(cycles)
    t0 = time.process_time()
    for c, group in enumerate(work):
        for t in group:
            buf.put_nowait(t)
        buf._evict_stale()
        assert buf.can_take(GS)
        batch = buf._take(GS)
        assert len(batch) == GS and batch[0].group_id == f"c-g{c}"
    return cycles * (GS + 1) / (time.process_time() - t0)


async def api_cycles(buf: SampleBuffer, cycles: int) -> float:
    work = trajectories(cycles)
    t0 = time.process_time()
    for group in work:
        for t in group:
            buf.put_nowait(t)
        batch = await buf.get_batch(GS, timeout_s=1.0)
        assert len(batch) == GS and batch[0] is group[0]
    return cycles * (GS + 1) / (time.process_time() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--baseline", default="", help="also time the SampleBuffer of this git revision")
    args = ap.parse_args()
    old = buffer_at(args.baseline) if args.baseline else None
    repeats = 3 if args.quick else 7
    backlogs = [0, 1000, 10_000]
    print("| variant | waiting groups | put+get ops/s (median) | spread (min-max) | repeats | kept |")
    print("|---|---|---|---|---|---|")
    for waiting in backlogs:
        cycles = 4000
        ref_cycles = max(50, cycles // (1 + waiting // 20))  # the brute force is slow: fewer cycles, same rate
        rows: dict[str, list[float]] = {"get_batch": [], "get_batch + ledger": [], "core": []}
        if old is not None:
            rows[f"{args.baseline} get_batch"] = []
        if waiting <= 1000:
            rows["brute force (core)"] = []
        kept: dict[str, int] = {}
        for _ in range(repeats):
            b = SampleBuffer(alpha=2, group_size=GS)
            fill_backlog(b, waiting)
            rows["get_batch"].append(asyncio.run(api_cycles(b, cycles)))
            kept["get_batch"] = b.retained()
            b = SampleBuffer(alpha=2, group_size=GS, ledger=lambda tid, rec: None)
            fill_backlog(b, waiting)
            rows["get_batch + ledger"].append(asyncio.run(api_cycles(b, cycles)))
            kept["get_batch + ledger"] = b.retained()
            b = SampleBuffer(alpha=2, group_size=GS)
            fill_backlog(b, waiting)
            rows["core"].append(core_cycles(b, cycles))
            kept["core"] = b.retained()
            if old is not None:
                b = old(alpha=2, group_size=GS)
                fill_backlog(b, waiting)
                rows[f"{args.baseline} get_batch"].append(asyncio.run(api_cycles(b, cycles)))
                kept[f"{args.baseline} get_batch"] = len(b.records()) + len(b._closed_groups)
            if "brute force (core)" in rows:
                r = ReferenceBuffer(alpha=2, group_size=GS)
                fill_backlog(r, waiting)
                rows["brute force (core)"].append(core_cycles(r, ref_cycles))
                kept["brute force (core)"] = len(r.records()) + len(r._closed_groups)
        for name, xs in rows.items():
            print(f"| {name} | {waiting:,} | {statistics.median(xs):,.0f} | {min(xs):,.0f}-{max(xs):,.0f} | {repeats} | "
                  f"{kept[name]:,} |", flush=True)


if __name__ == "__main__":
    main()
