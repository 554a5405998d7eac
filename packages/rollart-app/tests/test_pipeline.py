"""End to end on the tiny model: two iterations in each mode, and resume after a crash mid-iteration."""

from __future__ import annotations

import json

import pytest
import torch

from rollart.app.builder import build_pipeline
from rollart.app.config import parse_config
from rollart.scheduler.metrics import REQUIRED_KEYS, read_metrics
from rollart.scheduler.pipeline import Pipeline


def tiny_config(mode: str, **pipeline) -> dict:
    return {
        "run": {"iterations": 2, "tensorboard": False},
        "pipeline": {"mode": mode, "alpha": 0 if mode == "sync" else 1, "batch_size": 8, "group_size": 4,
                     "redundancy": 1.5, "get_batch_timeout_s": 120, **pipeline},
        "rollout": {"pools": [{"name": "rollout", "devices": 2}]},
        "time_sharing": {"policy": "always_shrink", "lend": 1, "slots_per_device": 8},
        "tasks": [{"env": "frozenlake", "max_turns": 4}, {"env": "math", "max_turns": 3}],
    }


@pytest.mark.parametrize("mode", ["sync", "one_off", "async", "time_sharing"])
async def test_two_iterations_each_mode(tmp_path, mode):
    cfg = parse_config(tiny_config(mode))
    pipe = await build_pipeline(cfg, tmp_path)
    try:
        recs = await pipe.run(2)
    finally:
        await pipe.close()
    assert [r["iteration"] for r in recs] == [1, 2] and recs[-1]["version"] == 2
    lines = read_metrics(tmp_path)
    assert len(lines) == 2 and REQUIRED_KEYS <= set(lines[0])
    for r in recs:
        assert r["trajectories"] == 8 and -1.0 <= r["reward_mean"] <= 1.0
        assert r["staleness_max"] <= cfg.pipeline.alpha
    if mode == "time_sharing":
        assert all(r["lent_devices"] == 1 for r in recs) and all(r["switch_cost_s"] > 0 for r in recs)
    # every trajectory the buffer saw is accounted once, aborted ones with a reason
    records = pipe.parts.buffer.records()
    assert sum(1 for r in records.values() if r.state == "consumed") == 16
    assert all(r.reason for r in records.values() if r.state == "aborted")
    roles = {json.loads(x)["role"] for x in (tmp_path / "timeline.jsonl").read_text().splitlines()}
    assert {"rollout", "train"} <= roles


async def test_resume_after_crash(tmp_path):
    cfg = parse_config(tiny_config("async"))
    pipe = await build_pipeline(cfg, tmp_path)
    real_step = pipe.parts.trainer.train_step

    async def crashing_step(batch):
        if pipe.parts.trainer.version == 2:
            raise RuntimeError("simulated crash in iteration 3")
        return await real_step(batch)

    pipe.parts.trainer.train_step = crashing_step
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            await pipe.run(4)
        weights_at_crash = await pipe.parts.trainer.named_tensors()
    finally:
        await pipe.close()
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2]

    again = await build_pipeline(cfg, tmp_path)
    try:
        assert await again.restore()
        assert again.iteration == 2 and again.parts.trainer.version == 2
        restored = await again.parts.trainer.named_tensors()
        assert all(torch.equal(weights_at_crash[k], restored[k]) for k in weights_at_crash)
        await again.run(4)
    finally:
        await again.close()
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert again.parts.trainer.version == 4


async def test_a_hand_built_pipeline_counts_tokens_shows_progress_and_draws_a_timeline(tmp_path):
    """Parts composed without the builder's help: the Pipeline itself observes the buffer (tokens/s),
    prints the `rollart run` progress line and opens a timeline in the metrics' run directory."""
    import io

    from rich.console import Console

    cfg = parse_config(tiny_config("async"))
    built = await build_pipeline(cfg, tmp_path / "built")
    parts = built.parts
    parts.timeline.close()
    parts.timeline = None  # as a hand-built PipelineParts leaves it
    hand = Pipeline(cfg, parts)
    out = io.StringIO()
    try:
        recs = await hand.run(2, progress=Console(file=out, width=200, force_terminal=False))
    finally:
        await hand.close()
    assert all(r["tokens_per_s"] > 0 for r in recs), [r["tokens_per_s"] for r in recs]
    assert hand.seen_trajectories >= 16
    line = out.getvalue()
    assert "2/2" in line and "traj 16" in line and "tok/s" in line and "v2" in line
    roles = {json.loads(x)["role"] for x in (tmp_path / "built" / "timeline.jsonl").read_text().splitlines()}
    assert {"rollout", "train"} <= roles


async def test_metrics_carry_prefix_cache_fields(tmp_path):
    """The rollout engines' prefix-cache hit rate, reused tokens and prefill share reach metrics.jsonl."""
    from rollart.scheduler.metrics import engine_metrics

    cfg = parse_config(tiny_config("async"))
    pipe = await build_pipeline(cfg, tmp_path)
    try:
        await pipe.run(2)
    finally:
        await pipe.close()
    recs = read_metrics(tmp_path)
    for r in recs:
        assert 0.0 < r["prefix_hit_rate"] <= 1.0  # FrozenLake's later turns extend their own context
        assert r["prefix_reused_tokens"] > 0 and 0.0 < r["prefill_share"] < 1.0
    # a rebuilt engine restarts its counters: those count from zero (prefill 1.0 s, decode +1.0 s), never negative
    before = {"prefix_lookups": 10, "prefix_hits": 5, "prompt_tokens_reused": 50, "prefill_s": 2.0, "decode_s": 2.0}
    after = {"prefix_lookups": 4, "prefix_hits": 3, "prompt_tokens_reused": 7, "prefill_s": 1.0, "decode_s": 3.0}
    assert engine_metrics(before, after) == {"prefix_hit_rate": 0.75, "prefix_reused_tokens": 7, "prefill_share": 0.5}


@pytest.mark.slow
async def test_megatron_trainer_in_the_driver(tmp_path):
    """`trainer.backend: megatron` with `placement: driver`: megatron's parallel state is created over a
    one-rank world, the trainer starts from the engines' weights and two asynchronous iterations update them."""
    pytest.importorskip("megatron.core")
    cfg = tiny_config("async")
    cfg["trainer"] = {"backend": "megatron"}
    pipe = await build_pipeline(parse_config(cfg), tmp_path)
    try:
        recs = await pipe.run(2)
        trained = pipe.parts.trainer.inner.named_tensors()
        served = pipe.parts.workers[0].engine.model.state_dict()
    finally:
        await pipe.close()
    assert [r["version"] for r in recs] == [1, 2]
    assert type(pipe.parts.trainer.inner).__name__ == "MegatronTrainer"
    assert all(torch.equal(trained[k], served[k]) for k in trained)
    assert not torch.distributed.is_initialized()  # closing the pipeline released the one-rank world
