"""Time from a rollout actor's SIGKILL to its successor serving (issue 21 item 1, rollart-app D51).

The example two-pool layout (`examples/configs/two_pools_affinity.yaml`: torch engines on the tiny
model, one H800 and one H20 rollout actor on Ray with logical GPUs) is built once per repeat; then,
twice, the H20 actor's process is SIGKILLed while `math` requests (affinity H20) keep arriving every 50 ms,
and the time until a request is answered by an H20 worker again is measured. The proxy's budget is
one restart and one replacement per window, so the two kills take the two recovery paths:
  restart  - a new actor in the dead one's placement group (same device), then the current weights
  replace  - budget spent: the worker is removed and `worker_factory` starts a new actor on a free
             H20 device of the ledger, then the current weights
  baseline - one `math` request with nothing killed (the floor of the measurement), between kills
Rows are interleaved in one run; each reports the median and the min-max spread.

    .venv/bin/python scripts/bench/bench_actor_replacement.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config
from rollart.proxy.types import GenerateRequest, SamplingParams

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "configs" / "two_pools_affinity.yaml"


def request(i: int) -> GenerateRequest:
    return GenerateRequest(tuple(range(1, 12)), SamplingParams(max_tokens=4), f"bench-{i}", f"bench-t{i}", tag="math")


async def serve_once(proxy, i: int) -> tuple[float, tuple[str, ...]]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    resp = await proxy.generate(request(i), timeout_s=120)
    return loop.time() - t0, tuple(resp.worker_ids)


async def recovery(proxy, counter: list[int]) -> tuple[float, str]:
    """SIGKILL the H20 actor; seconds until an H20 worker answers again, and which path recovered it."""
    loop = asyncio.get_running_loop()
    slot = next(s for s in proxy.slots if s.handle.hardware == "H20")
    handle = slot.handle
    pid = await handle.handle.actor.__ray_call__.remote(lambda self: os.getpid())
    restarts_before = proxy.counters["replaced"]
    os.kill(pid, signal.SIGKILL)
    t0 = loop.time()
    while True:
        counter[0] += 1
        try:
            _, workers = await serve_once(proxy, counter[0])
        except Exception:  # noqa: BLE001 - a request may fail while no worker serves; keep probing
            workers = ()
        if slot.state == "active" and slot.handle.hardware == "H20" and workers and workers[-1] == slot.handle.worker_id \
                and (slot.handle is not handle or slot.restarts > 0):
            break
        await asyncio.sleep(0.05)
    return loop.time() - t0, "replace" if proxy.counters["replaced"] > restarts_before else "restart"


async def main(repeats: int) -> None:
    import ray

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["run"]["tensorboard"] = False
    cfg = parse_config(raw)
    ray.init(num_gpus=3, resources={"H800": 2.0, "H20": 2.0}, _node_ip_address="127.0.0.1", include_dashboard=False,
             log_to_driver=False)
    rows: dict[str, list[float]] = {"restart": [], "replace": [], "baseline": []}
    try:
        for repeat in range(repeats):  # a fresh pipeline each time: the budget allows one replacement per window
            with tempfile.TemporaryDirectory() as run_dir:
                pipe = await build_pipeline(cfg, Path(run_dir))
                proxy = pipe.parts.proxy
                counter = [0]
                try:
                    await serve_once(proxy, 0)  # warm
                    for _ in range(2):  # the first kill is restarted, the second (budget spent) replaced
                        counter[0] += 1
                        rows["baseline"].append((await serve_once(proxy, counter[0]))[0])
                        seconds, path = await recovery(proxy, counter)
                        rows[path].append(seconds)
                        print(f"  repeat {repeat}: {path} {seconds:.2f} s", flush=True)
                finally:
                    await pipe.close()
    finally:
        ray.shutdown()
    print(f"\nkill -> serving again on H20, {repeats} repeats per path (median, min-max):")
    for name, values in rows.items():
        print(f"  {name:9s} {statistics.median(values):7.2f} s   [{min(values):.2f} - {max(values):.2f}]  n={len(values)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.repeats)))
