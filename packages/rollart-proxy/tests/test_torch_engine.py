"""Step 2: TorchEngine against transformers' own generate, on the tiny model."""

from __future__ import annotations

import pytest
import torch

from rollart.proxy.errors import ProxyError
from rollart.proxy.testing import prompts_of_mixed_lengths
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0)


@pytest.fixture(scope="module")
def hf_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


@pytest.fixture
def engine(tiny_model_path):
    return TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)


async def run_all(engine, requests, *, add_late=()):
    """Drive the engine to completion; ``add_late`` requests join after two decode steps."""
    for req in requests:
        engine.add_request(req)
    outs, steps = {}, 0
    late = list(add_late)
    while engine.has_work() or late:
        if steps == 3 and late:
            for req in late:
                engine.add_request(req)
            late = []
        for out in await engine.step():
            outs[out.request_id] = out
        steps += 1
    return outs


def hf_greedy_batch(hf_model, prompts, max_new):
    """transformers.generate on the left-padded batch (its own batching)."""
    longest = max(map(len, prompts))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    out = hf_model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                            eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[:, longest:].tolist()
    logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
    return tokens, logprobs


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_greedy_equals_transformers_generate(engine, hf_model, seed):
    prompts = prompts_of_mixed_lengths(6, seed=seed)
    reqs = [EngineRequest(str(i), tuple(p), GREEDY) for i, p in enumerate(prompts)]
    # half join mid-decode: continuous batching must not change any output
    outs = await run_all(engine, reqs[:3], add_late=reqs[3:])
    expected, logprobs = hf_greedy_batch(hf_model, prompts, GREEDY.max_tokens)
    for i in range(len(prompts)):
        out = outs[str(i)]
        assert list(out.token_ids) == expected[i], f"prompt {i} (len {len(prompts[i])})"
        assert out.finish_reason == "length"
        ref = [float(logprobs[i, t, tok]) for t, tok in enumerate(expected[i])]
        assert out.logprobs == pytest.approx(ref, abs=1e-4)
        assert out.token_versions == (0,) * GREEDY.max_tokens


async def test_stop_token_ends_request(engine, hf_model):
    prompt = prompts_of_mixed_lengths(1, seed=5)[0]
    expected, _ = hf_greedy_batch(hf_model, [prompt], 10)
    stop = expected[0][3]
    first = expected[0].index(stop)
    outs = await run_all(engine, [EngineRequest("a", tuple(prompt), SamplingParams(max_tokens=10, temperature=0, stop_token_ids=(stop,)))])
    assert list(outs["a"].token_ids) == expected[0][: first + 1]
    assert outs["a"].finish_reason == "stop"


async def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy(engine, hf_model):
    prompt = tuple(prompts_of_mixed_lengths(1, seed=7)[0])
    hot = SamplingParams(max_tokens=12, temperature=1.5, top_p=0.95, top_k=50, seed=123)
    outs = await run_all(engine, [
        EngineRequest("a", prompt, hot),
        EngineRequest("b", prompt, hot),
        EngineRequest("c", prompt, SamplingParams(max_tokens=12, temperature=1.5, seed=124)),
        EngineRequest("k1", prompt, SamplingParams(max_tokens=12, temperature=1.0, top_k=1, seed=9)),
    ])
    assert outs["a"].token_ids == outs["b"].token_ids
    assert outs["a"].token_ids != outs["c"].token_ids
    expected, _ = hf_greedy_batch(hf_model, [list(prompt)], 12)
    assert list(outs["k1"].token_ids) == expected[0]


async def test_abort_and_resume_keeps_tokens_and_matches_uninterrupted(engine, hf_model):
    prompt = tuple(prompts_of_mixed_lengths(1, seed=11)[0])
    req = EngineRequest("r", prompt, GREEDY)
    engine.add_request(req)
    for _ in range(4):  # prefill + 3 decodes
        await engine.step()
    partial = engine.abort_request("r")
    assert partial.finish_reason == "abort" and len(partial.token_ids) == 4
    assert not engine.has_work()
    outs = await run_all(engine, [partial.resume_request(req)])
    expected, _ = hf_greedy_batch(hf_model, [list(prompt)], GREEDY.max_tokens)
    assert list(outs["r"].token_ids) == expected[0]
    assert outs["r"].token_ids[:4] == partial.token_ids and outs["r"].logprobs[:4] == partial.logprobs


async def test_load_weights_changes_output_tags_versions_and_recomputes_kv(engine):
    prompt = tuple(prompts_of_mixed_lengths(1, seed=3)[0])
    before = (await run_all(engine, [EngineRequest("a", prompt, GREEDY)]))["a"]
    engine.add_request(EngineRequest("b", prompt, GREEDY))
    for _ in range(3):
        await engine.step()
    head = engine.model.lm_head.weight
    torch.manual_seed(99)
    await engine.load_weights({"lm_head.weight": torch.randn_like(head)}, version=1)
    after = (await run_all(engine, []))["b"]
    assert after.token_ids[:3] == before.token_ids[:3]  # tokens from version 0 kept
    assert after.token_versions == (0, 0, 0) + (1,) * 7
    assert after.token_ids[3:] != before.token_ids[3:]
    with pytest.raises(ProxyError, match="version must be >= the current version"):
        await engine.load_weights({}, version=0)
    with pytest.raises(ProxyError, match="not allowed: \\['nope'\\]"):
        await engine.load_weights({"nope": torch.zeros(1)}, version=2)


async def test_offload_refuses_steps_until_reload(engine):
    prompt = tuple(prompts_of_mixed_lengths(1, seed=4)[0])
    before = (await run_all(engine, [EngineRequest("a", prompt, GREEDY)]))["a"]
    await engine.offload()
    engine.add_request(EngineRequest("b", prompt, GREEDY))
    with pytest.raises(ProxyError, match="offloaded"):
        await engine.step()
    await engine.reload()
    assert (await run_all(engine, []))["b"].token_ids == before.token_ids


async def test_bad_requests_are_rejected(engine):
    with pytest.raises(ProxyError, match="request.prompt_ids must not be empty"):
        engine.add_request(EngineRequest("a", (), GREEDY))
    with pytest.raises(ProxyError, match="request.remaining_tokens must be > 0"):
        engine.add_request(EngineRequest("a", (5,), SamplingParams(max_tokens=0)))
    with pytest.raises(ProxyError, match="request_id must be one of"):
        engine.abort_request("missing")


async def test_kv_budget_limits_admission(tiny_model_path):
    engine = TorchEngine.from_pretrained(tiny_model_path, max_kv_tokens=30, offload_to_thread=False)
    engine.add_request(EngineRequest("a", tuple(range(10, 20)), GREEDY))
    engine.add_request(EngineRequest("b", tuple(range(10, 20)), GREEDY))
    await engine.step()
    load = engine.load()
    assert (load.running, load.waiting) == (1, 1)  # each reserves 10 prompt + 10 new tokens: one fits in 30
    with pytest.raises(ProxyError, match="needed must be an integer in"):
        engine.add_request(EngineRequest("c", tuple(range(10, 35)), GREEDY))


async def test_request_resumed_after_weight_update_is_readmitted(engine):
    """Issue 13 item 2: prompt 10, max_tokens 50, max_kv_tokens 64, update after 11 tokens -> must finish."""
    engine = TorchEngine(engine.model, max_kv_tokens=64, offload_to_thread=False)
    req = EngineRequest("r", tuple(range(10, 20)), SamplingParams(max_tokens=50, temperature=0))
    engine.add_request(req)
    for _ in range(11):  # prefill + 10 decodes = 11 tokens
        await engine.step()
    await engine.load_weights({}, version=1)
    outs, steps = {}, 0
    while engine.has_work() and steps < 200:
        for out in await engine.step():
            outs[out.request_id] = out
        steps += 1
    assert "r" in outs, f"not re-admitted after {steps} steps: {engine.load()}"
    assert len(outs["r"].token_ids) == 50 and outs["r"].token_versions == (0,) * 11 + (1,) * 39


async def test_load_reports_free_kv_of_prompt_plus_max_tokens(engine):
    """The reservation is prompt + max_tokens for the request's whole life, not growing as it decodes."""
    engine = TorchEngine(engine.model, max_kv_tokens=64, offload_to_thread=False)
    engine.add_request(EngineRequest("r", tuple(range(10, 20)), SamplingParams(max_tokens=50, temperature=0)))
    assert engine.load().free_kv_tokens == 64
    for n in range(1, 12):
        await engine.step()
        load = engine.load()
        assert (load.running, load.free_kv_tokens, load.tokens_in_flight) == (1, 4, 60), f"after {n} tokens"


async def test_batched_prefill_runs_one_forward_per_step(tiny_model_path, hf_model):
    prompts = prompts_of_mixed_lengths(6, seed=4)
    reqs = [EngineRequest(str(i), tuple(p), GREEDY) for i, p in enumerate(prompts)]
    counts = {}
    for batched in (True, False):
        engine = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False, max_prefills_per_step=8,
                                             batched_prefill=batched, prefix_cache=False)
        for req in reqs:
            engine.add_request(req)
        await engine.step()
        counts[batched] = (engine.stats().prefill_forwards, engine.load().running)
        outs = await run_all(engine, [])
        expected, _ = hf_greedy_batch(hf_model, prompts, GREEDY.max_tokens)
        assert [list(outs[str(i)].token_ids) for i in range(6)] == expected
        stats = engine.stats()
        assert stats.prompt_tokens_computed == sum(map(len, prompts)) and stats.prompt_tokens_reused == 0
        assert stats.decode_forwards == GREEDY.max_tokens - 1 and 0 < stats.prefill_share < 1
    assert counts == {True: (1, 6), False: (6, 6)}


def second_turns(prompts, outs, seed):
    """Each next-turn prompt is the previous context (prompt + answer) plus an observation of 1-9
    tokens; prompt 0 starts a brand-new conversation; prompt 1 diverges inside its first answer."""
    extra = prompts_of_mixed_lengths(len(prompts) + 1, seed=seed, min_len=1, max_len=9)
    turns = [list(p) + list(outs[str(i)].token_ids) + extra[i] for i, p in enumerate(prompts)]
    turns[0] = prompts_of_mixed_lengths(1, seed=seed + 100, min_len=5, max_len=20)[0]
    turns[1] = list(prompts[1]) + list(outs["1"].token_ids[:3]) + extra[-1]
    return turns


@pytest.mark.parametrize("seed", [0, 1])
async def test_multi_turn_hits_the_cache_and_equals_generate(engine, hf_model, seed):
    prompts = prompts_of_mixed_lengths(6, seed=seed + 20)
    first = await run_all(engine, [EngineRequest(str(i), tuple(p), GREEDY) for i, p in enumerate(prompts)])
    before = engine.stats()
    turns = second_turns(prompts, first, seed)
    reqs = [EngineRequest(f"t{i}", tuple(p), GREEDY) for i, p in enumerate(turns)]
    outs = await run_all(engine, reqs[:4], add_late=reqs[4:])  # mixed lengths, two join mid-decode
    expected, logprobs = hf_greedy_batch(hf_model, turns, GREEDY.max_tokens)
    for i in range(len(turns)):
        assert list(outs[f"t{i}"].token_ids) == expected[i], f"turn 2 of prompt {i}"
        ref = [float(logprobs[i, t, tok]) for t, tok in enumerate(expected[i])]
        assert outs[f"t{i}"].logprobs == pytest.approx(ref, abs=1e-4)
    stats = engine.stats()
    # prompts 2-5 reuse their whole first turn (prompt + answer but the last, never-fed token), prompt 1
    # its prompt + 3 answer tokens; prompt 0 may share a token or two by chance with another context
    full = sum(len(prompts[i]) + GREEDY.max_tokens - 1 for i in range(2, 6)) + len(prompts[1]) + 3
    reused = stats.prompt_tokens_reused - before.prompt_tokens_reused
    assert full <= reused <= full + 2
    assert stats.prefix_hits - before.prefix_hits >= 5 and stats.prefix_lookups - before.prefix_lookups == 6
    assert stats.prompt_tokens_computed - before.prompt_tokens_computed == sum(map(len, turns)) - reused


async def test_prefix_cache_counts_in_load_and_is_evicted_for_admission(tiny_model_path):
    engine = TorchEngine.from_pretrained(tiny_model_path, max_kv_tokens=60, offload_to_thread=False)
    await run_all(engine, [EngineRequest("a", tuple(range(10, 20)), GREEDY)])
    assert engine.stats().cached_tokens == 19  # 10 prompt + 10 generated, the last never fed
    assert engine.load().free_kv_tokens == 60 - 19
    big = SamplingParams(max_tokens=30, temperature=0)
    engine.add_request(EngineRequest("b", tuple(range(100, 120)), big))  # needs 50 > 41 free
    await engine.step()
    assert engine.load().running == 1 and engine.stats().evicted_tokens == 19
    assert engine.load().free_kv_tokens == 10
    await run_all(engine, [])
    assert engine.stats().cached_tokens == 49 and engine.load().free_kv_tokens == 11


async def test_weight_update_empties_the_prefix_cache(engine):
    prompt = tuple(prompts_of_mixed_lengths(1, seed=8)[0])
    first = (await run_all(engine, [EngineRequest("a", prompt, GREEDY)]))["a"]
    assert engine.stats().cached_tokens == len(prompt) + GREEDY.max_tokens - 1
    torch.manual_seed(5)
    await engine.load_weights({"lm_head.weight": torch.randn_like(engine.model.lm_head.weight)}, version=1)
    assert engine.stats().cached_tokens == 0 and engine.load().free_kv_tokens == 8192
    hits = engine.stats().prefix_hits
    await run_all(engine, [EngineRequest("b", prompt + first.token_ids, GREEDY)])
    assert engine.stats().prefix_hits == hits  # the old version's KV was not reused
    assert engine.stats().cached_tokens > 0
    await engine.offload()
    assert engine.stats().cached_tokens == 0
