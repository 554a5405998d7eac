"""TorchEngine batched prefill and prefix cache (design D27, D28) against the engine with both off.

Two multi-turn workloads, driven straight into one engine (no worker, no proxy: this measures the
engine), greedy so every variant must produce the same tokens (checked: a run whose outputs differ
from the baseline's, or that does not finish every turn, aborts the benchmark):

  demo     the demo's model (rollart.app demo config: vocab 42, 2 layers, hidden 64, 128
           positions) and the demo's request shape: groups of 8 trajectories sharing a 2-token first
           prompt, 4-8 turns, 2 generated tokens and a 1-3 token observation per turn, at most 16
           requests in the engine (the demo's slots per device)
  growing  the tiny proxy model (512 positions): groups of 4 sharing a 24-48 token instruction,
           each turn adds a 16-32 token observation; two shapes: 6 turns of 16-token answers
           (contexts grow to ~340 tokens) and 8 turns of 4-token actions (an agent's tool call or
           move; contexts grow to ~300 tokens); 16 requests in the engine

Variants, interleaved (the order rotates every repeat) and repeated: both off (the step-11 engine:
one forward per admitted request, every turn recomputed), batched prefill only, prefix cache only,
both on. Reported per variant: generated tokens/s of the whole run (median and min-max over
repeats), the ratio to "both off" (median of per-repeat ratios), prefill share of engine time,
prefix-cache hit rate (requests that reused >= 1 token) and reused share of prompt tokens.

    .venv/bin/python scripts/bench/bench_torch_engine_prefill.py [--quick] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, SamplingParams

VARIANTS = {
    "both off (baseline)": {"batched_prefill": False, "prefix_cache": False},
    "batched prefill": {"batched_prefill": True, "prefix_cache": False},
    "prefix cache": {"batched_prefill": False, "prefix_cache": True},
    "both on": {"batched_prefill": True, "prefix_cache": True},
}


@dataclass
class Trajectory:
    """One multi-turn conversation: the first prompt, then one observation per later turn."""

    prompt: list[int]
    observations: list[list[int]]  # observations[t] follows the answer of turn t
    max_tokens: int


@dataclass
class Workload:
    name: str
    model: torch.nn.Module
    trajectories: list[Trajectory]
    concurrency: int


def demo_workload(n_groups: int, seed: int = 0) -> Workload:
    from rollart.app.builder import model_config
    from rollart.app.demo import demo_config
    from rollart.train.models import build_causal_lm

    model = build_causal_lm(model_config(demo_config()), seed=0).eval()
    vocab = model.config.vocab_size
    rng = random.Random(seed)
    trajs = []
    for _ in range(n_groups):
        prompt = [1, rng.randrange(5, vocab)]  # `<s> c<cell>` / `<s> math`
        for _ in range(8):
            turns = rng.randint(4, 8)
            obs = [[rng.randrange(5, vocab) for _ in range(rng.randint(1, 3))] for _ in range(turns - 1)]
            trajs.append(Trajectory(prompt, obs, max_tokens=2))
    return Workload("demo", model, trajs, concurrency=16)


def growing_workload(n_groups: int, answer_tokens: int, turns: int, seed: int = 0) -> Workload:
    from transformers import AutoModelForCausalLM

    from rollart.proxy.testing import build_tiny_model

    path = build_tiny_model(tempfile.mkdtemp(prefix="rollart-bench-"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    vocab = model.config.vocab_size
    rng = random.Random(seed)
    trajs = []
    for _ in range(n_groups):
        prompt = [1] + [rng.randrange(5, vocab) for _ in range(rng.randint(24, 48))]
        for _ in range(4):
            obs = [[rng.randrange(5, vocab) for _ in range(rng.randint(16, 32))] for _ in range(turns - 1)]
            trajs.append(Trajectory(prompt, obs, max_tokens=answer_tokens))
    return Workload(f"growing, {answer_tokens}-token answers", model, trajs, concurrency=16)


@dataclass
class Result:
    seconds: float
    tokens: int
    outputs: dict[str, tuple[int, ...]]
    stats: object


async def drive(engine: TorchEngine, work: Workload) -> tuple[int, dict[str, tuple[int, ...]]]:
    """Keep ``concurrency`` trajectories in the engine; each finished turn launches the next at once."""
    contexts = [list(t.prompt) for t in work.trajectories]
    turn = [0] * len(work.trajectories)
    todo = list(range(len(work.trajectories)))[::-1]
    outputs: dict[str, tuple[int, ...]] = {}
    tokens = 0

    def launch(i: int) -> None:
        params = SamplingParams(max_tokens=work.trajectories[i].max_tokens, temperature=0.0)
        engine.add_request(EngineRequest(f"{i}/{turn[i]}", tuple(contexts[i]), params, trajectory_id=str(i)))

    for _ in range(min(work.concurrency, len(todo))):
        launch(todo.pop())
    while engine.has_work():
        for out in await engine.step():
            i = int(out.request_id.split("/")[0])
            assert out.finish_reason == "length" and len(out.token_ids) == work.trajectories[i].max_tokens
            outputs[out.request_id] = out.token_ids
            tokens += len(out.token_ids)
            obs = work.trajectories[i].observations
            if turn[i] < len(obs):
                contexts[i] += list(out.token_ids) + obs[turn[i]]
                turn[i] += 1
                launch(i)
            elif todo:
                launch(todo.pop())
    expected = sum(len(t.observations) + 1 for t in work.trajectories)
    assert len(outputs) == expected, f"{len(outputs)} of {expected} turns finished"
    return tokens, outputs


def run_once(work: Workload, flags: dict[str, bool]) -> Result:
    engine = TorchEngine(work.model, max_num_seqs=work.concurrency, max_prefills_per_step=work.concurrency,
                         offload_to_thread=False, **flags)
    start = time.perf_counter()
    tokens, outputs = asyncio.run(drive(engine, work))
    return Result(time.perf_counter() - start, tokens, outputs, engine.stats())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trajectories and 2 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = args.repeats or (2 if args.quick else 5)
    workloads = [demo_workload(2 if args.quick else 16),
                 growing_workload(1 if args.quick else 8, answer_tokens=16, turns=6),
                 growing_workload(2 if args.quick else 8, answer_tokens=4, turns=8)]
    names = list(VARIANTS)
    table = Table(title=f"TorchEngine prefill: {repeats} interleaved repeats, 1 thread, greedy (median, min-max)")
    for col in ("workload", "variant", "tokens/s", "vs both off", "prefill share", "hit rate", "reused prompt share",
                "forwards (prefill/decode)"):
        table.add_column(col, justify="right")
    for work in workloads:
        runs: dict[str, list[Result]] = {n: [] for n in names}
        for rep in range(repeats):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                runs[name].append(run_once(work, VARIANTS[name]))
        base = runs[names[0]]
        for name in names:
            rs = runs[name]
            for r, b in zip(rs, base):
                assert r.outputs == b.outputs, f"{work.name}/{name}: output differs from the baseline"
            tps = [r.tokens / r.seconds for r in rs]
            ratio = statistics.median(r.tokens / r.seconds / (b.tokens / b.seconds) for r, b in zip(rs, base))
            s = rs[-1].stats
            computed, reused = s.prompt_tokens_computed, s.prompt_tokens_reused
            table.add_row(
                f"{work.name} ({len(work.trajectories)} traj, {rs[0].tokens} tok)", name,
                f"{statistics.median(tps):.0f} ({min(tps):.0f}-{max(tps):.0f})", f"{ratio:.2f}x",
                f"{statistics.median(r.stats.prefill_share for r in rs):.2f}",
                f"{s.prefix_hit_rate:.2f}", f"{reused / (computed + reused):.2f}",
                f"{s.prefill_forwards}/{s.decode_forwards}",
            )
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
