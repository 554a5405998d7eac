"""Shrink/expand latency with in-flight requests, and migration that keeps tokens vs regenerating.

Real TorchEngine workers (tiny local Llama, CPU) in-process, W workers, R greedy requests of T tokens
each. When about half the tokens are decoded, half the workers are released:

  keep tokens (ours)   - LLMProxy.shrink: evict -> re-add prompt + generated tokens elsewhere (KV
                         recomputed, nothing decoded twice), then offload
  regenerate (ROLL)    - the baseline in the same run: abort the released workers' requests, shrink,
                         and generate those requests again from scratch on the remaining workers

Reported: shrink latency (call to return), expand latency, tokens decoded twice, and the time from
the shrink to the last answer (the straggler tail the migration policy controls).

    .venv/bin/python scripts/bench/bench_proxy_shrink_expand.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from functools import partial

import torch
from rich.console import Console
from rich.table import Table

from rollart.proxy.proxy import LLMProxy
from rollart.proxy.testing import build_tiny_model, prompts_of_mixed_lengths
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker


async def one_run(path: str, n_workers: int, n_requests: int, tokens: int, regenerate: bool) -> dict:
    workers = [InferenceWorker(f"w{i}", partial(TorchEngine.from_pretrained, path, offload_to_thread=False), devices=(i,))
               for i in range(n_workers)]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers)
    params = SamplingParams(max_tokens=tokens, temperature=0)
    prompts = prompts_of_mixed_lengths(n_requests, seed=3)
    reqs = [GenerateRequest(tuple(p), params, f"r{i}", f"t{i}") for i, p in enumerate(prompts)]
    tasks = {r.request_id: asyncio.ensure_future(proxy.generate(r)) for r in reqs}
    release = list(range(n_workers // 2))
    for _ in range(100_000):  # until about half the tokens are decoded on the released workers
        if all(w.stats().steps >= tokens // 2 for w in workers):
            break
        await asyncio.sleep(0.001)
    wasted = 0
    start = time.perf_counter()
    if regenerate:
        victims = [rid for r in release for rid in proxy.slots[r].inflight]
        for rid in victims:
            await proxy.abort(f"t{rid[1:]}", reason="regenerate")
        aborted = {rid: await tasks[rid] for rid in victims}
        wasted = sum(len(a.token_ids) for a in aborted.values())
        await proxy.shrink(release)
        shrink_s = time.perf_counter() - start
        by_id = {r.request_id: r for r in reqs}
        for rid in victims:
            tasks[rid] = asyncio.ensure_future(proxy.generate(by_id[rid]))
    else:
        await proxy.shrink(release)
        shrink_s = time.perf_counter() - start
    out = await asyncio.gather(*tasks.values())
    tail_s = time.perf_counter() - start
    assert all(len(r.token_ids) == tokens for r in out)
    t0 = time.perf_counter()
    await proxy.expand(release)
    expand_s = time.perf_counter() - t0
    migrated = proxy.counters["migrated"]
    await proxy.close()
    return {"shrink_s": shrink_s, "expand_s": expand_s, "tail_s": tail_s, "wasted": wasted, "migrated": migrated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n_workers, n_requests, tokens = (2, 8, 64) if args.quick else (4, 32, 160)
    path = build_tiny_model(tempfile.mkdtemp(prefix="rollart-bench-"))
    results = {}
    for name, regen in (("regenerate (ROLL baseline)", True), ("keep tokens (ours)", False)):
        results[name] = asyncio.run(one_run(path, n_workers, n_requests, tokens, regen))
    table = Table(title=f"Shrink {n_workers // 2} of {n_workers} TorchEngine workers mid-generation ({n_requests} requests x {tokens} tokens)")
    for col in ("migration", "shrink ms", "expand ms", "requests moved", "tokens decoded twice", "shrink -> last answer s", "tail vs baseline"):
        table.add_column(col, justify="right")
    base = results["regenerate (ROLL baseline)"]["tail_s"]
    for name, r in results.items():
        moved = r["migrated"] if "keep" in name else "(aborted)"
        table.add_row(name, f"{r['shrink_s'] * 1e3:.1f}", f"{r['expand_s'] * 1e3:.1f}", str(moved), str(r["wasted"]),
                      f"{r['tail_s']:.2f}", f"{r['tail_s'] / base:.2f}x")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
