"""Issue 22 item 1: the engine's roofline against hand-computed step times (D44-D46).

Every expected value below is written out from the catalogue (Table 2 of the paper: H800 989.5
TFLOPS / 3.35 TB/s / NVLink 400 GB/s, H20 148 TFLOPS / 4.0 TB/s / 900 GB/s) and the published
Qwen3 configs, with the engine's defaults mfu 0.5, mbu 0.7, 2 ms step overhead, 10 us per all-reduce.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.proxy.errors import ProxyError
from rollart.proxy.sim_engine import (
    QWEN3_8B,
    QWEN3_30B_A3B,
    QWEN3_32B,
    QWEN3_235B_A22B,
    SIM_MODEL_SPECS,
    RooflineModel,
    SimEngine,
    lookup_hardware,
)

PEAK = {"H800": (989.5e12, 3.35e12, 400e9), "H20": (148e12, 4.0e12, 900e9)}  # FLOP/s, B/s, NVLink B/s


def roofline(model, hw: str, tp: int = 1) -> RooflineModel:
    spec = lookup_hardware(hw)
    return RooflineModel(model, spec.tflops_bf16, spec.hbm_tbps, tp=tp, interconnect_gbps=spec.interconnect_gbps)


def hand(hw: str, flops: float, bytes_moved: float, tp: int = 1, ar_tokens: int = 0, layers: int = 0,
         hidden: int = 0) -> float:
    f, b, link = PEAK[hw]
    ar = 0.0 if tp == 1 else 2 * layers * (2 * (tp - 1) / tp * ar_tokens * hidden * 2 / link + 1e-5)
    return 0.002 + ar + max(bytes_moved / (tp * b * 0.7), flops / (tp * f * 0.5))


# Qwen3-8B: P = 8.2e9, L = 36, 32 heads x 128 = 4096 attention width, KV 2 x 36 x 8 x 128 x 2 = 147,456 B/token
DENSE_KV = 147_456


@pytest.mark.parametrize("hw", ["H800", "H20"])
@pytest.mark.parametrize("tp", [1, 2])
def test_dense_prefill_bound_batch_matches_the_hand_roofline(hw, tp):
    # 4 cold prompts of 4,096 tokens: 2 P n + 4 L a n (n / 2) each; weights read once
    flops = 2 * 8.2e9 * 4 * 4096 + 4 * (4 * 36 * 4096 * 4096 * 2048)
    expected = hand(hw, flops, 16.4e9, tp, ar_tokens=4 * 4096, layers=36, hidden=4096)
    assert roofline(QWEN3_8B, hw, tp).prefill_batch_seconds([(4096, 0)] * 4) == pytest.approx(expected, rel=1e-9)
    assert flops / (PEAK[hw][0] * 0.5) > 16.4e9 / (PEAK[hw][1] * 0.7)  # compute-bound on both


@pytest.mark.parametrize("hw", ["H800", "H20"])
@pytest.mark.parametrize("tp", [1, 2])
def test_dense_decode_bound_batch_matches_the_hand_roofline(hw, tp):
    # 32 sequences of 2,000 tokens: weights + 64,000 tokens of KV per step; 2 P b + 4 L a C FLOPs
    bytes_moved = 16.4e9 + DENSE_KV * 64_000
    flops = 2 * 8.2e9 * 32 + 4 * 36 * 4096 * 64_000
    expected = hand(hw, flops, bytes_moved, tp, ar_tokens=32, layers=36, hidden=4096)
    assert roofline(QWEN3_8B, hw, tp).decode_seconds(32, 64_000) == pytest.approx(expected, rel=1e-9)
    assert bytes_moved / (PEAK[hw][1] * 0.7) > flops / (PEAK[hw][0] * 0.5)  # memory-bound on both


def test_the_roofline_orders_hardware_as_the_paper_does():
    # prefill-bound: H800 (6.7x the FLOPs) far ahead; decode-bound: H20 (1.19x the bandwidth) ahead
    assert roofline(QWEN3_8B, "H800").prefill_seconds(8192, 0) * 5 < roofline(QWEN3_8B, "H20").prefill_seconds(8192, 0)
    assert roofline(QWEN3_8B, "H20").decode_seconds(32, 64_000) < roofline(QWEN3_8B, "H800").decode_seconds(32, 64_000)


# Qwen3-30B-A3B: 30.5e9 total, 3.3e9 active, 128 experts, top 8; L = 48, hidden 2048, 32 heads x 128, 4 KV heads
EXPERTS = (30.5e9 - 3.3e9) * 128 / 120  # all routed experts' parameters
SHARED = 30.5e9 - EXPERTS


@pytest.mark.parametrize("hw", ["H800", "H20"])
@pytest.mark.parametrize("tp", [1, 2])
def test_moe_decode_reads_the_experts_its_batch_touches(hw, tp):
    kv = 2 * 48 * 4 * 128 * 2
    touched = SHARED + EXPERTS * (1 - (120 / 128) ** 16)  # 16 tokens miss an expert with (1 - 8/128)^16
    bytes_moved = 2 * touched + kv * 16 * 3000
    flops = 2 * 3.3e9 * 16 + 4 * 48 * 4096 * 16 * 3000  # FLOPs of the active parameters only
    expected = hand(hw, flops, bytes_moved, tp, ar_tokens=16, layers=48, hidden=2048)
    assert roofline(QWEN3_30B_A3B, hw, tp).decode_seconds(16, 16 * 3000) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("hw", ["H800", "H20"])
@pytest.mark.parametrize("tp", [1, 2])
def test_moe_prefill_costs_active_flops(hw, tp):
    flops = 2 * 3.3e9 * 8192 + 4 * 48 * 4096 * 8192 * 4096
    expected = hand(hw, flops, 2 * (30.5e9 - EXPERTS * (120 / 128) ** 8192), tp, ar_tokens=8192,
                    layers=48, hidden=2048)
    assert roofline(QWEN3_30B_A3B, hw, tp).prefill_seconds(8192, 0) == pytest.approx(expected, rel=1e-9)


def test_moe_memory_is_total_and_one_token_reads_the_active_weights():
    assert QWEN3_30B_A3B.weight_bytes == 2 * 30.5e9
    assert QWEN3_30B_A3B.touched_weight_bytes(1) == pytest.approx(2 * 3.3e9)
    assert QWEN3_235B_A22B.touched_weight_bytes(1) == pytest.approx(2 * 22e9)
    assert QWEN3_8B.touched_weight_bytes(1) == QWEN3_8B.weight_bytes
    assert set(SIM_MODEL_SPECS) == {"Qwen3-8B", "Qwen3-32B", "Qwen3-30B-A3B", "Qwen3-235B-A22B"}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([QWEN3_30B_A3B, QWEN3_235B_A22B]), st.integers(1, 4096), st.integers(1, 4096))
def test_touched_weights_grow_with_the_batch_between_active_and_total(model, a, b):
    lo, hi = sorted((a, b))
    assert 2 * model.active_params * (1 - 1e-9) <= model.touched_weight_bytes(lo) <= model.touched_weight_bytes(hi)
    assert model.touched_weight_bytes(hi) <= model.weight_bytes


def test_tensor_parallel_engine_splits_weights_and_kv():
    # Qwen3-32B on H800: TP 1 keeps (72e9 - 65.6e9) / 262,144 = 24,414 tokens; TP 2 holds half the weights and
    # half of every token's KV (8 KV heads split 2 ways): (72e9 - 32.8e9) / 131,072 = 299,072 tokens
    h800 = lookup_hardware("H800")
    assert SimEngine(QWEN3_32B, h800).kv_capacity_tokens == 24_414
    assert SimEngine(QWEN3_32B, h800, tensor_parallel_size=2).kv_capacity_tokens == 299_072
    # KV splits by heads: 4 KV heads over TP 8 are replicated 2 ways: (72e9 - 470e9 / 8) / (2 x 94 x 4 x 128 x 2 / 4)
    big = SimEngine(QWEN3_235B_A22B, h800, tensor_parallel_size=8)
    assert big.kv_capacity_tokens == int((72e9 - 470e9 / 8) // (2 * 94 * 4 * 128 * 2 / 4))


def test_weights_that_do_not_fit_name_tensor_parallel_size():
    with pytest.raises(ProxyError, match="tensor_parallel_size"):
        SimEngine(QWEN3_235B_A22B, lookup_hardware("H800"), tensor_parallel_size=4)
    with pytest.raises(ProxyError, match="tensor_parallel_size"):
        SimEngine(QWEN3_8B, lookup_hardware("H800"), tensor_parallel_size=0)
