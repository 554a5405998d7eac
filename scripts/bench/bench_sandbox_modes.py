"""Cost of the sandbox's containment: wall time of one run per mode, end to end.

Each row is one `PythonSandbox.run` of a trivial program (`print(1)`), measured from the call to the
returned result: work directory, uid lease (as root), process start, wait, kill sweep, cleanup.
Modes are interleaved within every repetition (bubblewrap, the process fallback) so load on the
shared machine hits them alike; a failed run (status other than `ok`) is counted as a failure and
left out of the timings. Median and spread (p10-p90) over the repetitions.

    .venv/bin/python scripts/bench/bench_sandbox_modes.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from rich.console import Console
from rich.table import Table

from rollart.env.envs.sandbox import PythonSandbox, SandboxLimits


async def main(reps: int) -> None:
    limits = SandboxLimits(cpu_s=2, wall_s=10.0)
    sandboxes = {"bwrap": PythonSandbox(limits, mode="auto"), "process": PythonSandbox(limits, mode="process")}
    got = {name: await sb.containment() for name, sb in sandboxes.items()}
    if got["bwrap"] != "bwrap":
        del sandboxes["bwrap"]  # bubblewrap cannot run here: measure the fallback alone
    times: dict[str, list[float]] = {name: [] for name in sandboxes}
    failures = dict.fromkeys(sandboxes, 0)
    for sb in sandboxes.values():  # warm-up: probes and first interpreter start
        await sb.run("print(1)")
    for _ in range(reps):
        for name, sb in sandboxes.items():
            t0 = time.perf_counter()
            result = await sb.run("print(1)")
            dt = time.perf_counter() - t0
            if result.status == "ok" and result.stdout == "1\n":
                times[name].append(dt)
            else:
                failures[name] += 1
    table = Table(title=f"one sandbox run of print(1), end to end ({reps} repetitions, interleaved)")
    for col in ("mode", "median ms", "p10 ms", "p90 ms", "ok", "failed"):
        table.add_column(col, justify="right")
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=10) if len(ts) >= 2 else [float("nan")] * 9
        table.add_row(name, f"{1000 * statistics.median(ts):.1f}", f"{1000 * q[0]:.1f}", f"{1000 * q[-1]:.1f}",
                      str(len(ts)), str(failures[name]))  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(10 if args.quick else 40))
