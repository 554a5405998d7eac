"""Step 3: the simulated roofline engine."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.proxy.errors import ProxyError
from rollart.proxy.sim_engine import QWEN3_8B, RooflineModel, SimEngine, _TokenStream, lookup_hardware
from rollart.proxy.testing import VirtualLoop
from rollart.proxy.types import EngineRequest, SamplingParams


def roofline(hw: str) -> RooflineModel:
    spec = lookup_hardware(hw)
    return RooflineModel(QWEN3_8B, spec.tflops_bf16, spec.hbm_tbps)


def test_decode_is_bandwidth_bound_and_batching_amortises():
    model = roofline("H800")
    one = model.decode_seconds(1, 1000)
    weights_only = QWEN3_8B.weight_bytes / (3.35e12 * 0.7)
    assert one == pytest.approx(0.002 + weights_only + QWEN3_8B.kv_bytes_per_token * 1000 / (3.35e12 * 0.7))
    batch = model.decode_seconds(64, 64 * 1000)
    assert batch / 64 < one / 10  # per-token cost falls by > 10x with a batch of 64


def test_hardware_affinity_follows_the_roofline():
    # prefill is compute bound: H800 (989 TFLOPS) beats H20 (148); decode is bandwidth bound: H20 (4.0 TB/s) wins
    assert roofline("H800").prefill_seconds(4096, 0) < roofline("H20").prefill_seconds(4096, 0) / 4
    assert roofline("H20").decode_seconds(8, 8 * 2000) < roofline("H800").decode_seconds(8, 8 * 2000)


def test_prefill_cost_grows_with_cached_context_and_prefix_hits_cut_it():
    model = roofline("H20")
    assert model.prefill_seconds(100, 4000) > model.prefill_seconds(100, 0)
    assert model.prefill_seconds(100, 4000) < model.prefill_seconds(4100, 0)


def run_engine(engine: SimEngine, requests: list[EngineRequest]) -> tuple[dict, float]:
    loop = VirtualLoop()

    async def go():
        for req in requests:
            engine.add_request(req)
        outs = {}
        while engine.has_work():
            for out in await engine.step():
                outs[out.request_id] = out
        return outs

    try:
        start = loop.time()
        outs = loop.run_until_complete(go())
        return outs, loop.time() - start
    finally:
        loop.close()


def test_engine_runs_in_virtual_time_and_charges_its_roofline():
    engine = SimEngine(QWEN3_8B, lookup_hardware("H20"))
    reqs = [EngineRequest(f"r{i}", tuple(range(1, 500)), SamplingParams(max_tokens=200), f"t{i}") for i in range(8)]
    outs, elapsed = run_engine(engine, reqs)
    assert all(len(o.token_ids) == 200 and o.finish_reason == "length" for o in outs.values())
    assert elapsed == pytest.approx(engine.stats["prefill_s"] + engine.stats["decode_s"])
    assert engine.stats["steps"] == 200  # one batched prefill, 199 batched decodes
    assert elapsed > 1.0  # seconds of simulated time


def test_multi_turn_prompt_hits_the_prefix_cache():
    engine = SimEngine(QWEN3_8B, lookup_hardware("H20"))
    first, _ = run_engine(engine, [EngineRequest("a", tuple(range(1, 2000)), SamplingParams(max_tokens=50), "traj")])
    second_prompt = tuple(range(1, 2000)) + first["a"].token_ids + (7, 8, 9)
    before = engine.stats["prefill_s"]
    run_engine(engine, [EngineRequest("b", second_prompt, SamplingParams(max_tokens=5), "traj")])
    assert engine.stats["prefix_hit_tokens"] == 1999 + 50
    cold = engine.roofline.prefill_seconds(len(second_prompt), 0)
    assert engine.stats["prefill_s"] - before < cold / 10


def test_weight_update_keeps_tokens_and_tags_versions():
    engine = SimEngine(QWEN3_8B, lookup_hardware("H20"))
    loop = VirtualLoop()

    async def go():
        engine.add_request(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=10)))
        for _ in range(4):
            await engine.step()
        await engine.load_weights({}, 3)
        outs = []
        while engine.has_work():
            outs += await engine.step()
        return outs[0]

    out = loop.run_until_complete(go())
    loop.close()
    assert out.token_versions == (0,) * 4 + (3,) * 6
    with pytest.raises(ProxyError, match="versions never go backwards"):
        VirtualLoop().run_until_complete(engine.load_weights({}, 2))


def test_injected_fault_raises_and_unknown_hardware_is_rejected():
    engine = SimEngine(QWEN3_8B, lookup_hardware("H20"), time_scale=0)
    engine.add_request(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=10)))
    engine.inject_fault(1)
    loop = VirtualLoop()
    loop.run_until_complete(engine.step())
    with pytest.raises(Exception, match="injected fault"):
        loop.run_until_complete(engine.step())
    assert len(engine.abort_request("a").token_ids) == 1  # state survives for migration
    loop.close()
    with pytest.raises(ProxyError, match="name must be one of .*'H20'.*got 'TPU'"):
        lookup_hardware("TPU")


def test_kv_capacity_from_the_catalogue_matches_hand_computation():
    """Design Section 4 (D17): (HBM x 0.9 - weights) / per-token KV bytes, by hand."""
    from rollart.proxy.sim_engine import QWEN3_32B

    assert QWEN3_8B.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert SimEngine(QWEN3_8B, lookup_hardware("H800")).kv_capacity_tokens == 377_061
    assert SimEngine(QWEN3_32B, lookup_hardware("H20")).kv_capacity_tokens == 79_345
    with pytest.raises(ProxyError, match="prefix_cache_tokens"):
        SimEngine(QWEN3_8B, lookup_hardware("H20"), prefix_cache_tokens=-1)


def test_second_turn_prefills_only_the_new_suffix():
    """The Section-4 example: 1,000 cached + 200 new tokens on an H800 = 9.06 ms (memory-bound since D46:
    the weights and the cached KV are read once, 7.06 ms > 6.89 ms of compute); 42.6 ms cold."""
    model = roofline("H800")
    assert model.prefill_seconds(200, 1000) == pytest.approx(0.002 + (16.4e9 + 1000 * 147_456) / (3.35e12 * 0.7), abs=2e-6)
    assert model.prefill_seconds(1200, 0) == pytest.approx(0.042636, abs=2e-6)
    engine = SimEngine(QWEN3_8B, lookup_hardware("H800"), step_overhead_s=0.002)
    first_prompt = tuple(range(1, 1000))
    first, _ = run_engine(engine, [EngineRequest("a", first_prompt, SamplingParams(max_tokens=1), "traj")])
    context = first_prompt + first["a"].token_ids  # 1,000 tokens
    assert engine.cached_prefix_tokens() == 1000
    before = engine.stats["prefill_s"]
    run_engine(engine, [EngineRequest("b", context + tuple(range(5, 205)), SamplingParams(max_tokens=1), "traj")])
    assert engine.stats["prefill_s"] - before == pytest.approx(model.prefill_seconds(200, 1000))
    other = SimEngine(QWEN3_8B, lookup_hardware("H800"))  # no first turn: a cold prefill of all 1,200
    run_engine(other, [EngineRequest("b", context + tuple(range(5, 205)), SamplingParams(max_tokens=1), "traj")])
    assert other.stats["prefill_s"] == pytest.approx(model.prefill_seconds(1200, 0))


def test_prefix_cache_is_lru_in_tokens_and_yields_to_running_sequences():
    engine = SimEngine(QWEN3_8B, lookup_hardware("H20"), prefix_cache_tokens=2500)
    # three trajectories of 1,000-token contexts: the cache (2,500 tokens) keeps the two most recent
    for t in ("t0", "t1", "t2"):
        run_engine(engine, [EngineRequest(f"{t}-1", tuple(range(1, 1000)), SamplingParams(max_tokens=1), t)])
    assert engine.cached_prefix_tokens() == 2000
    assert list(engine._prefix_cache) == ["t1", "t2"]  # t0, least recently used, went first
    # running sequences take precedence: a reservation that needs nearly all KV evicts the cache
    cap = engine.kv_capacity_tokens
    run_engine(engine, [EngineRequest("t1-2", tuple(range(1, 1000)) + (9,), SamplingParams(max_tokens=1), "t1"),
                        EngineRequest("big", (5,) * (cap - 1200), SamplingParams(max_tokens=1), "big")])
    assert engine.stats["prefix_hit_tokens"] == 999  # t1's second turn reused its 999-token prefix
    assert engine.cached_prefix_tokens() <= 2500 and "t2" not in engine._prefix_cache  # evicted for "big"
    assert engine._reserved == 0  # every reservation was returned


def test_admission_is_bounded_by_kv_capacity():
    engine = SimEngine(QWEN3_8B, lookup_hardware("H20"), time_scale=0)
    cap = engine.kv_capacity_tokens
    half = cap // 2 - 10
    for i in range(3):  # each reserves ~half of the KV: only two run at once
        engine.add_request(EngineRequest(f"r{i}", tuple(range(1, 11)), SamplingParams(max_tokens=half), f"t{i}"))
    loop = VirtualLoop()
    loop.run_until_complete(engine.step())
    loop.close()
    assert (len(engine._running), len(engine._waiting)) == (2, 1)
    assert engine._reserved <= cap


def test_decode_quantum_keeps_tokens_and_finish_times_with_fewer_steps():
    """D19: one sleep per quantum gives the tokens and finish times of one step per token."""

    def run(quantum: float):
        engine = SimEngine(QWEN3_8B, lookup_hardware("H20"), decode_quantum_s=quantum)
        loop = VirtualLoop()

        async def go():
            for i in range(6):
                engine.add_request(EngineRequest(f"r{i}", tuple(range(1, 300 + 50 * i)), SamplingParams(max_tokens=20 + 15 * i), f"t{i}"))
            done = {}
            while engine.has_work():
                for out in await engine.step():
                    done[out.request_id] = (out.token_ids, out.finish_reason, round(loop.time(), 9))
            return done

        try:
            return loop.run_until_complete(go()), engine.stats["steps"]
        finally:
            loop.close()

    exact, exact_steps = run(0.0)
    fast, fast_steps = run(0.5)
    assert fast == exact
    assert fast_steps < exact_steps / 5
    with pytest.raises(ProxyError, match="decode_quantum_s"):
        SimEngine(QWEN3_8B, lookup_hardware("H20"), decode_quantum_s=-1.0)


def test_decode_quantum_keeps_stop_tokens_and_finish_times():
    """D30: with sampled stop tokens too, a quantum finishes each request at the token and time of one
    step per token (the stop positions come from the sequence's stream, not from the chunking)."""

    def run(quantum: float):
        engine = SimEngine(QWEN3_8B, lookup_hardware("H800"), decode_quantum_s=quantum, stop_prob=0.01, seed=7)
        loop = VirtualLoop()

        async def go():
            for i in range(8):
                params = SamplingParams(max_tokens=40 + 30 * i, stop_token_ids=(2, 5))
                engine.add_request(EngineRequest(f"r{i}", tuple(range(10, 200 + 40 * i)), params, f"t{i}"))
            done = {}
            while engine.has_work():
                for out in await engine.step():
                    done[out.request_id] = (out.token_ids, out.logprobs, out.finish_reason, round(loop.time(), 9))
            return done

        try:
            return loop.run_until_complete(go())
        finally:
            loop.close()

    exact, fast = run(0.0), run(1.0)
    assert fast == exact
    reasons = [reason for _, _, reason, _ in exact.values()]
    assert "stop" in reasons and "length" in reasons  # both ways of finishing were exercised
    for tokens, logprobs, reason, _ in exact.values():
        assert len(tokens) == len(logprobs) and all(-3.0 <= lp <= 0.0 for lp in logprobs)
        assert all(0 <= t < QWEN3_8B.vocab_size for t in tokens)
        stops_at = [i for i, t in enumerate(tokens) if t in (2, 5)]
        assert stops_at == ([len(tokens) - 1] if reason == "stop" else [])  # a stop token only where it stopped


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=12),
       st.integers(min_value=1, max_value=3000), st.floats(min_value=0.0, max_value=0.2))
def test_a_token_stream_reads_the_same_in_any_chunks(chunks, budget, stop_prob):
    """D30: position i of a sequence's stream does not depend on how many tokens each step took."""
    whole = _TokenStream(random.Random(3), 151_936, (0,), stop_prob, budget)
    pieces = _TokenStream(random.Random(3), 151_936, (0,), stop_prob, budget)
    total = sum(chunks)
    expected = whole.take(total)
    got_tokens, got_logprobs = [], []
    for n in chunks:
        assert pieces.until_stop(n) == _first_stop(expected[0][len(got_tokens):len(got_tokens) + n], n)
        tokens, logprobs = pieces.take(n)
        got_tokens += tokens
        got_logprobs += logprobs
    assert (got_tokens, got_logprobs) == expected


def _first_stop(tokens: list[int], limit: int) -> int:
    return next((i + 1 for i, t in enumerate(tokens) if t == 0), limit)


def test_a_batched_prefill_costs_each_sequence_its_own_attention():
    """16 cold 8K prompts admitted together: one step overhead plus 16 times one prompt's FLOPs, not the
    attention of one 128K sequence (the batch's sequences never attend to each other)."""
    model = roofline("H800")
    one = model.prefill_seconds(8192, 0) - model.step_overhead_s
    assert model.prefill_batch_seconds([(8192, 0)] * 16) == pytest.approx(model.step_overhead_s + 16 * one)
    engine = SimEngine(QWEN3_8B, lookup_hardware("H800"), max_num_seqs=16)
    prompts = [EngineRequest(f"r{i}", tuple(range(1 + i, 8193 + i)), SamplingParams(max_tokens=1), f"t{i}")
               for i in range(16)]
    run_engine(engine, prompts)
    assert engine.stats["prefill_s"] == pytest.approx(model.step_overhead_s + 16 * one)
