"""Step 1: the data model and the tiny-model factory."""

from __future__ import annotations

from rollart.proxy.engine import Engine
from rollart.proxy.types import EngineOutput, EngineRequest, GenerateResponse, SamplingParams


def test_resume_request_keeps_generated_tokens_and_budget():
    req = EngineRequest("r", (5, 6, 7), SamplingParams(max_tokens=10))
    out = EngineOutput("r", (11, 12), (-0.5, -0.25), (3, 4), "migrated")
    resumed = out.resume_request(req)
    assert resumed.generated_ids == (11, 12)
    assert resumed.generated_logprobs == (-0.5, -0.25)
    assert resumed.generated_versions == (3, 4)
    assert resumed.context_ids == (5, 6, 7, 11, 12)
    assert resumed.remaining_tokens == 8
    assert resumed.prompt_ids == req.prompt_ids


def test_response_versions_are_distinct_in_order():
    resp = GenerateResponse("r", "t", (1, 2, 3, 4), (0.0,) * 4, (2, 2, 3, 3), "length")
    assert resp.versions == (2, 3)


def test_tiny_model_factory_builds_tokenizer_with_chat_template(tiny_model_path):
    from transformers import AutoConfig, AutoTokenizer

    from rollart.proxy.testing import TINY_LLAMA_CONFIG, TINY_VOCAB_SIZE

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    text = tok.apply_chat_template([{"role": "user", "content": "move left"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|user|>move left</s><|assistant|>"
    ids = tok("Move left, right")["input_ids"]
    assert ids and max(ids) < TINY_VOCAB_SIZE
    assert tok.decode(ids) == "Move left, right"
    config = AutoConfig.from_pretrained(tiny_model_path)
    assert config.hidden_size == TINY_LLAMA_CONFIG["hidden_size"] and config.vocab_size == TINY_VOCAB_SIZE


def test_engines_satisfy_the_protocol(tiny_model_path):
    from rollart.proxy.sim_engine import TINY_SIM_MODEL, SimEngine, lookup_hardware
    from rollart.proxy.torch_engine import TorchEngine

    assert isinstance(TorchEngine.from_pretrained(tiny_model_path), Engine)
    assert isinstance(SimEngine(TINY_SIM_MODEL, lookup_hardware("H20")), Engine)
