"""Issue 22 item 1 (D24): trainer memory against hand computations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollart.resource.hardware import BUILTIN_HARDWARE
from rollart.train.errors import TrainError
from rollart.train.sim_memory import trainer_memory

H800, H20 = BUILTIN_HARDWARE["H800"], BUILTIN_HARDWARE["H20"]
# Qwen3-235B-A22B: 94 layers, hidden 4096, vocab 151,936; per token 2 h L + 34 h + 4 V bytes of activations
ACT_235B_64K = 65_536 * (2 * 4096 * 94 + 34 * 4096 + 4 * 151_936)


def big(devices: int, hw=H800, context: int = 65_536):
    return trainer_memory("Qwen3-235B-A22B", 235e9, 94, 4096, 151_936, context, devices, hw)


def test_the_blogs_model_does_not_fit_a_32_device_trainer_and_the_message_names_the_shortfall():
    m = big(32)
    per_device = 18 * 235e9 / 32 + ACT_235B_64K / 8  # states fully sharded, activations over 8 in a node
    assert m.per_device == pytest.approx(per_device)
    assert not m.fits
    least = -(-18 * 235e9 // (72e9 - ACT_235B_64K / 8))  # 72 GB usable of 80
    assert m.min_devices == least == 72
    short = (per_device - 72e9) * 32
    assert m.shortfall() == (f"trainer: Qwen3-235B-A22B at 65,536 tokens needs {per_device * 32 / 1e12:.2f} TB on 32 x H800 "
                             f"(80 GB, 72 GB usable): {short / 1e12:.2f} TB short; at least 72 devices")
    assert big(72).fits and not big(71).fits
    assert big(128).fits


def test_a_small_trainer_counts_activations_over_its_own_devices():
    # Qwen3-8B at 32K on 2 x H20: 18 x 8.2e9 / 2 + 32,768 x (2 x 4096 x 36 + 34 x 4096 + 4 x 151,936) / 2
    m = trainer_memory("Qwen3-8B", 8.2e9, 36, 4096, 151_936, 32_768, 2, H20)
    assert m.per_device == pytest.approx(18 * 8.2e9 / 2 + 32_768 * (2 * 4096 * 36 + 34 * 4096 + 4 * 151_936) / 2)
    assert m.fits is False and m.min_devices == 3
    assert trainer_memory("Qwen3-8B", 8.2e9, 36, 4096, 151_936, 32_768, 3, H20).fits


def test_a_context_no_device_count_holds_says_so():
    m = big(1024, context=1 << 24)
    assert m.min_devices is None and "no device count holds" in m.shortfall()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4096), st.sampled_from([1024, 32_768, 65_536]))
def test_min_devices_is_the_least_count_that_fits(n, context):
    m = big(n, context=context)
    assert m.fits == (m.min_devices is not None and n >= m.min_devices)
    if m.min_devices and m.min_devices > 1:
        assert not big(m.min_devices - 1, context=context).fits


def test_bad_figures_name_the_field():
    with pytest.raises(TrainError, match="context_tokens"):
        big(8, context=0)
