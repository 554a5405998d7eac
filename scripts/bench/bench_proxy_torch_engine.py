"""TorchEngine tokens/s with continuous batching against transformers.generate, same prompts, same model.

The tiny local Llama (rollart.proxy.testing), float32 on CPU, greedy. Workloads: N prompts of mixed
lengths (3-24 tokens), all submitted at once, with output budgets either uniform in 8-64 or long-tailed
(one request in eight asks for 256 tokens, the others for 16: the agentic-RL straggler pattern).

Rows:
  hf generate, one by one   - transformers.generate per prompt (no batching)
  hf generate, static batch - transformers.generate on the left-padded batch; every row decodes until
                              the longest budget, so short requests waste decode slots
  TorchEngine               - continuous batching: finished requests leave the batch at once
Useful tokens/s counts only the tokens each request asked for.

The three ways run in rounds (one of each per round, the order rotated each round) and the table
gives the median over rounds with the min-max spread; ratios are medians of per-round ratios, so
load that drifts between rounds on a shared machine cancels.

    .venv/bin/python scripts/bench/bench_proxy_torch_engine.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time

import torch
from bench_stats import fmt, ratio_fmt, rounds
from rich.console import Console
from rich.table import Table

from rollart.proxy.testing import build_tiny_model, prompts_of_mixed_lengths
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, SamplingParams

WAYS = ("hf generate, one by one", "hf generate, static batch", "TorchEngine (continuous)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per workload (default 3, quick 2)")
    args = parser.parse_args()
    n = 8 if args.quick else 32
    repeats = args.repeats or (2 if args.quick else 3)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tempfile.mkdtemp(prefix="rollart-bench-"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = prompts_of_mixed_lengths(n, seed=0)
    rng = random.Random(1)
    workloads = {
        "uniform 8-64": [rng.randint(8, 64) for _ in range(n)],
        "long tail (1 in 8 asks 256, others 16)": [256 if i % 8 == 0 else 16 for i in range(n)],
    }
    table = Table(title=f"TorchEngine vs transformers.generate ({n} prompts of 3-24 tokens, greedy, 1 thread; "
                        f"median (min-max) of {repeats} interleaved rounds)")
    for col in ("output budgets", "engine", "seconds", "useful tokens/s", "vs hf one by one", "vs hf static batch"):
        table.add_column(col, justify="right")
    for label, budgets in workloads.items():
        seconds: dict[str, list[float]] = {w: [0.0] * repeats for w in WAYS}
        for r, way in rounds(WAYS, repeats):
            seconds[way][r] = time_one(way, model, prompts, budgets, n)
        for way in WAYS:
            t = seconds[way]
            table.add_row(label, way, fmt(t), fmt([sum(budgets) / x for x in t], ".0f"),
                          ratio_fmt(seconds[WAYS[0]], t), ratio_fmt(seconds[WAYS[1]], t))
    Console(width=200).print(table)


def time_one(way, model, prompts, budgets, n) -> float:
    """Seconds of one way on one workload."""
    if way == WAYS[0]:
        start = time.perf_counter()
        for p, b in zip(prompts, budgets):
            model.generate(torch.tensor([p]), max_new_tokens=b, do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - start
    if way == WAYS[1]:
        longest = max(map(len, prompts))
        ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=max(budgets), do_sample=False, eos_token_id=None,
                       pad_token_id=0)
        return time.perf_counter() - start
    engine = TorchEngine(model, max_num_seqs=n, offload_to_thread=False, max_prefills_per_step=n)

    async def run() -> int:
        for i, (p, b) in enumerate(zip(prompts, budgets)):
            engine.add_request(EngineRequest(str(i), tuple(p), SamplingParams(max_tokens=b, temperature=0)))
        tokens = 0
        while engine.has_work():
            tokens += sum(len(o.token_ids) for o in await engine.step())
        return tokens

    start = time.perf_counter()
    produced = asyncio.run(run())
    elapsed = time.perf_counter() - start
    assert produced == sum(budgets)
    return elapsed


if __name__ == "__main__":
    main()
