"""The task factory's user env and reward from a file, through an EnvManager and the scoring sink."""

from __future__ import annotations

import asyncio

import pytest

from rollart.env.trajectory import Trajectory, TrajectoryStatus
from rollart.scheduler.buffer import SampleBuffer
from rollart.scheduler.scoring import ScoringSink


def test_user_env_from_a_file_through_an_env_manager_and_the_scoring_sink(tmp_path):
    """The user env and reward of examples/user_env.py, built by the task factory, run with a real
    tiny checkpoint (transformers) through an EnvManager; every trajectory reaches the buffer once,
    scored by the file's reward."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollart.app.config import parse_config
    from rollart.app.task_factory import build_task
    from rollart.env.hf_client import TransformersLLMClient
    from rollart.env.manager import EnvManager, EnvManagerConfig
    from rollart.proxy.testing import build_tiny_model

    examples = Path(__file__).resolve().parents[3] / "examples"
    path = build_tiny_model(tmp_path / "ckpt")
    tok = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    cfg = parse_config({"model": {"path": path}, "tasks": [
        {"env": "../user_env.py:GuessNumberEnv", "reward": "../user_env.py:guess_reward", "env_args": {"high": 4, "max_guesses": 2}}]})
    parts = build_task(cfg.tasks[0], 0, cfg, tok, base_dir=examples / "configs")
    buffer = SampleBuffer(alpha=10, group_size=1)
    seen: list[Trajectory] = []

    async def main() -> None:
        sink = ScoringSink(buffer, parts.scorer, on_put=seen.append, deadline_s=30)
        manager = EnvManager(parts.env_factory, TransformersLLMClient(model, tok.eos_token_id, tok.pad_token_id), parts.prompts_factory(),
                             sink, EnvManagerConfig(max_turns=2, max_tokens_per_turn=4))
        for seed in range(4):
            await manager.run_trajectory(seed=seed, group_id=f"g{seed}")
        assert await sink.aclose(timeout_s=10) == 0

    asyncio.run(main())
    assert sorted(t.id for t in seen) == sorted(buffer.records()) and len(seen) == 4
    for t in seen:
        assert t.status == TrajectoryStatus.FINISHED
        info = t.info
        want = 1.0 if t.success else 0.5 * max(0.0, 1.0 - int(info.get("best_gap", info.get("high", 4))) / 4)
        assert t.reward == pytest.approx(want)
        first = tok.decode(t.turns[0].prompt_ids)
        assert "Guess the secret number" in first and "I picked a number between 1 and 4" in first and first.endswith("<|assistant|>")
