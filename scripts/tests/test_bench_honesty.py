"""The benchmark helpers count what they claim: interleaved rounds, and failed trajectories never collected."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import bench_stats  # noqa: E402


def test_rounds_run_every_variant_once_per_round_in_rotating_order():
    order = bench_stats.rounds(["a", "b", "c"], 3)
    assert [r for r, _ in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [v for _, v in order] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_fmt_gives_median_and_spread_and_ratios_pair_rounds():
    assert bench_stats.fmt([3.0, 1.0, 2.0]) == "2.00 (1.00-3.00)"
    # per-round ratios: a load spike in round 2 hits both variants and cancels
    assert bench_stats.ratio_fmt([2.0, 8.0, 2.2], [1.0, 4.0, 1.0]) == "2.00 (2.00-2.20)x"


def test_env_benchmark_never_counts_failed_trajectories_as_collected():
    import bench_env_trajectory_vs_batch as bench

    from rollart.env.prompts import ChatTemplatePromptBuilder
    from rollart.env.tiny_tokenizer import build_tiny_chat_tokenizer
    from rollart.resource.virtual_time import run_virtual

    tokenizer = build_tiny_chat_tokenizer()
    prompts = ChatTemplatePromptBuilder(tokenizer)
    # env steps of N(10, 40) s against the manager's 30 s step timeout: many trajectories fail
    managers = bench.make_managers(prompts, tokenizer, 6, 3, 10.0, 40.0, 1.0, bench.CountingSink(), 7)
    seconds, finished, failed = run_virtual(bench.trajectory_level(managers, 2)).result
    assert failed > 0 and finished + failed == 12 and seconds > 0
    sink = bench.CountingSink()
    managers = bench.make_managers(prompts, tokenizer, 6, 3, 10.0, 40.0, 1.0, sink, 8)
    seconds, finished, failed = run_virtual(bench.continuous(managers, 2, sink)).result
    assert finished >= 12 and failed > 0  # ran until 12 *finished*, failures on top
    done = [t for t in sink.items if t.status.value == "finished"]
    assert len(done) >= 12
