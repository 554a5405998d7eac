"""EnvManager driving a real (tiny, random-init, locally built) transformers model."""

from __future__ import annotations

import pytest

from rollart.env.envs.math_calc import MathCalcEnv
from rollart.env.hf_client import TransformersLLMClient
from rollart.env.manager import EnvManager, EnvManagerConfig
from rollart.env.protocols import GenerationRequest, SamplingParams
from rollart.env.stubs import ListSink


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


async def test_env_manager_with_a_real_tiny_model_is_token_exact(tokenizer, prompts, tiny_model):
    import torch

    client = TransformersLLMClient(tiny_model, tokenizer.eos_token_id, tokenizer.pad_token_id, weight_version=3)
    sink = ListSink()
    cfg = EnvManagerConfig(max_turns=3, max_tokens_per_turn=12, sampling=SamplingParams(temperature=1.0, seed=1))
    manager = EnvManager(lambda: MathCalcEnv(), client, prompts, sink, cfg, name="hf")
    traj = await manager.run_trajectory(seed=0)
    assert traj.status.value == "finished" and traj.reason in ("max_turns", "terminated")
    assert traj.weight_versions() == [3] * len(traj.turns)
    ids = torch.tensor([traj.token_ids()])
    with torch.no_grad():
        logits = tiny_model(ids).logits.log_softmax(-1)[0]
    # the recorded log-probs are the model's own log-probs of the recorded ids (temperature 1)
    pos = 0
    for turn in traj.turns:
        pos += len(turn.prompt_ids)
        for j, (tok, lp) in enumerate(zip(turn.response_ids, turn.response_logprobs)):
            assert logits[pos + j - 1, tok].item() == pytest.approx(lp, abs=1e-3)
        pos += len(turn.response_ids)
    assert sink.items == [traj]


def test_generate_sync_reports_length_finish_and_versions(tokenizer, tiny_model):
    client = TransformersLLMClient(tiny_model, eos_token_id=None, pad_token_id=0, weight_version=1)
    req = GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=5, sampling=SamplingParams(temperature=0.0), trajectory_id="t")
    result = client.generate_sync(req)
    assert len(result.token_ids) == 5 == len(result.logprobs) and result.finish_reason == "length"
    assert result.weight_versions == [1] * 5
