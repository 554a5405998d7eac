"""How long past its deadline a shrink runs when a hook swallows cancellation (prepare and commit).

    .venv/bin/python scripts/bench/bench_resource_hook_deadline.py
    PYTHONPATH=<other src> /work/main/.venv/bin/python scripts/bench/bench_resource_hook_deadline.py   # another version

The hook ignores the first cancellation and then works 3 s more. For prepare the shrink's timeout is 0.5 s; for
commit the deadline is max(timeout, the 1 s notify grace). Rows: the shrink's wall time (loop time) and how it
ended (vetoed / completed) and whether a hook_failed event was recorded; 3 repeats each, median and spread.
"""

from __future__ import annotations

import asyncio
import statistics

from rollart.resource.manager import ResourceManager


class Stubborn:
    def __init__(self, phase: str) -> None:
        self.phase = phase

    async def _work(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(3.0)

    async def prepare(self, t) -> None:
        if self.phase == "prepare":
            await self._work()

    async def commit(self, t) -> None:
        if self.phase == "commit":
            await self._work()

    async def abort(self, t) -> None:
        pass


async def one(phase: str) -> tuple[float, str, bool]:
    rm = ResourceManager({"H20": range(4)})
    rm.allocate("gen", "rollout", 3)
    rm.add_transition_hook(Stubborn(phase))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await rm.shrink("rollout", "train", [0], timeout=0.5)
        outcome = "completed"
    except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
        outcome = type(exc).__name__
    elapsed = loop.time() - t0
    failed = any(e.kind == "hook_failed" for e in rm.store.events())
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()
    rm.close()
    return elapsed, outcome, failed


async def main() -> None:
    print("| hook swallows cancellation in | deadline s | median s | min-max s | outcome | hook_failed event |")
    print("|---|---|---|---|---|---|")
    for phase, deadline in (("prepare", 0.5), ("commit", 1.0)):
        runs = [await one(phase) for _ in range(3)]
        times = [r[0] for r in runs]
        print(f"| {phase} | {deadline} | {statistics.median(times):.2f} | {min(times):.2f}-{max(times):.2f} | "
              f"{sorted({r[1] for r in runs})} | {sorted({r[2] for r in runs})} |")


if __name__ == "__main__":
    asyncio.run(main())
