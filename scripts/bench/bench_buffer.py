"""SampleBuffer put+get throughput against the backlog of part-filled groups (design D16).

One cycle = `group_size` (4) puts that complete a fresh group + one get of that group (5 ops).
The backlog is W groups holding 1 of their 4 members, in bound, waiting the whole run (the groups a
slow environment keeps open). Rows, interleaved and repeated (median, min-max spread):
  indexed (get_batch) - SampleBuffer: put_nowait x 4 + `await get_batch(4)` (the real API)
  indexed (core)      - SampleBuffer: put_nowait x 4 + the synchronous core of get_batch
                        (_evict_stale, can_take, _take) - same work as the reference row
  brute force (core)  - the pre-D16 buffer (tests/test_buffer_index.py::ReferenceBuffer), same core
Every get must return exactly the group just completed, or the run fails.

    .venv/bin/python scripts/bench/bench_buffer.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages/rollart-scheduler/tests"))

from test_buffer_index import FakeTraj, ReferenceBuffer  # noqa: E402

from rollart.scheduler.buffer import SampleBuffer  # noqa: E402

GS = 4


def fill_backlog(buf, waiting: int) -> None:
    for g in range(waiting):
        buf.put_nowait(FakeTraj(f"w{g}", f"wait-g{g}", [0]))


def core_cycles(buf, cycles: int) -> float:
    t0 = time.perf_counter()
    for c in range(cycles):
        for m in range(GS):
            buf.put_nowait(FakeTraj(f"c{c}-{m}", f"c-g{c}", [0]))
        buf._evict_stale()
        assert buf.can_take(GS)
        batch = buf._take(GS)
        assert len(batch) == GS and batch[0].group_id == f"c-g{c}"
    return cycles * (GS + 1) / (time.perf_counter() - t0)


async def api_cycles(buf: SampleBuffer, cycles: int) -> float:
    t0 = time.perf_counter()
    for c in range(cycles):
        for m in range(GS):
            buf.put_nowait(FakeTraj(f"c{c}-{m}", f"c-g{c}", [0]))
        batch = await buf.get_batch(GS, timeout_s=1.0)
        assert len(batch) == GS and batch[0].group_id == f"c-g{c}"
    return cycles * (GS + 1) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeats = 3 if args.quick else 5
    backlogs = [0, 100, 1000]
    print("| variant | waiting groups | put+get ops/s (median) | spread (min-max) | repeats |")
    print("|---|---|---|---|---|")
    for waiting in backlogs:
        cycles = 2000 if waiting == 0 else 1000
        ref_cycles = max(50, cycles // (1 + waiting // 20))  # the brute force is slow: fewer cycles, same rate
        rows: dict[str, list[float]] = {"indexed (get_batch)": [], "indexed (core)": [], "brute force (core)": []}
        for _ in range(repeats):
            b = SampleBuffer(alpha=2, group_size=GS)
            fill_backlog(b, waiting)
            rows["indexed (get_batch)"].append(asyncio.run(api_cycles(b, cycles)))
            b = SampleBuffer(alpha=2, group_size=GS)
            fill_backlog(b, waiting)
            rows["indexed (core)"].append(core_cycles(b, cycles))
            r = ReferenceBuffer(alpha=2, group_size=GS)
            fill_backlog(r, waiting)
            rows["brute force (core)"].append(core_cycles(r, ref_cycles))
        for name, xs in rows.items():
            print(f"| {name} | {waiting} | {statistics.median(xs):,.0f} | {min(xs):,.0f}-{max(xs):,.0f} | {repeats} |")


if __name__ == "__main__":
    main()
