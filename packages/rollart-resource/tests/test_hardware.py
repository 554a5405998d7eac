"""Step 1: the hardware catalogue."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollart.resource.errors import ResourceError, UnknownHardwareError
from rollart.resource.hardware import BUILTIN_HARDWARE, HardwareCatalogue, HardwareSpec


def test_builtin_table2_values():
    h800, h20 = BUILTIN_HARDWARE["H800"], BUILTIN_HARDWARE["H20"]
    assert (h800.tflops_bf16, h800.hbm_gb, h800.hbm_tbps, h800.interconnect_gbps) == (989.5, 80, 3.35, 400)
    assert (h20.tflops_bf16, h20.hbm_gb, h20.hbm_tbps, h20.interconnect_gbps) == (148, 96, 4.0, 900)
    assert h800.cost == 1.0
    # Table 2: H800 costs 2.85 H20s
    assert math.isclose(h800.cost / h20.cost, 2.85)
    assert set(BUILTIN_HARDWARE) >= {"H800", "H20", "H100", "H200", "A100", "CPU"}
    assert BUILTIN_HARDWARE["CPU"].hbm_gb == 0
    assert BUILTIN_HARDWARE["CPU"].tflops_bf16 < BUILTIN_HARDWARE["A100"].tflops_bf16
    with pytest.raises(TypeError):
        BUILTIN_HARDWARE["X"] = h800  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        h800.cost = 2.0  # type: ignore[misc]


def test_unknown_type_names_known_ones():
    cat = HardwareCatalogue()
    with pytest.raises(UnknownHardwareError) as err:
        cat.get("B200")
    msg = str(err.value)
    assert "'B200'" in msg and "'H800'" in msg and "'H20'" in msg and "name" in msg
    assert isinstance(err.value, ValueError)


def test_register_user_type():
    mine = HardwareSpec("MI300X", tflops_bf16=1307, hbm_gb=192, hbm_tbps=5.3, interconnect_gbps=896, cost=1.1)
    cat = HardwareCatalogue([mine])
    assert cat.get("MI300X") is mine
    assert "MI300X" in cat and "MI300X" in cat.names()
    cat.register(mine)  # same spec again: no-op
    with pytest.raises(ResourceError, match="one spec only"):
        cat.register(dataclasses.replace(mine, cost=2.0))
    with pytest.raises(ResourceError, match="one spec only"):
        cat.register(dataclasses.replace(BUILTIN_HARDWARE["H800"], cost=3.0))
    # another catalogue is not affected: no global registry
    assert "MI300X" not in HardwareCatalogue()
    with pytest.raises(ResourceError, match="spec must be of type HardwareSpec"):
        cat.register({"name": "X"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field, value",
    [("tflops_bf16", 0.0), ("tflops_bf16", float("nan")), ("hbm_gb", -1.0), ("hbm_tbps", -0.1),
     ("interconnect_gbps", float("nan")), ("cost", 0.0), ("name", ""), ("name", 3)],
)
def test_bad_spec_rejected(field, value):
    with pytest.raises(ResourceError) as err:
        dataclasses.replace(BUILTIN_HARDWARE["H20"], **{field: value})
    assert field in str(err.value) and repr(value) in str(err.value)


@given(st.floats(min_value=0.001, max_value=1e6), st.floats(min_value=0, max_value=1e4))
def test_valid_specs_roundtrip(tflops, hbm):
    spec = HardwareSpec("X", tflops_bf16=tflops, hbm_gb=hbm, hbm_tbps=1.0, interconnect_gbps=1.0, cost=1.0)
    assert HardwareCatalogue([spec]).get("X") == spec


def test_collective_bandwidth_is_nvlink_inside_a_node_and_the_nic_beyond():
    h800 = BUILTIN_HARDWARE["H800"]
    assert (h800.network_gbps, h800.gpus_per_node) == (50, 8)
    assert h800.collective_gbps(8) == 400  # one node: NVLink (Table 2)
    assert h800.collective_gbps(9) == 50  # the ring crosses a NIC
    assert BUILTIN_HARDWARE["A100"].collective_gbps(64) == 25
    old_style = HardwareSpec("X1", 100.0, 40, 1.0, 300, 0.5)  # written before D14: defaults apply
    assert (old_style.network_gbps, old_style.gpus_per_node) == (25.0, 8)
    with pytest.raises(ResourceError, match="network_gbps"):
        HardwareSpec("X2", 100.0, 40, 1.0, 300, 0.5, network_gbps=0)
    with pytest.raises(ResourceError, match="gpus_per_node"):
        HardwareSpec("X3", 100.0, 40, 1.0, 300, 0.5, gpus_per_node=0)
    with pytest.raises(ResourceError, match="devices"):
        h800.collective_gbps(0)


def test_cost_per_hour_is_the_catalogues_relative_cost():
    """D34: Table 2's equal-cost proportions, in H800-hours (H20 = 1/2.85)."""
    cat = HardwareCatalogue()
    assert cat.cost_per_hour({"H800": 72}) == pytest.approx(72)
    assert cat.cost_per_hour({"H20": 208}) == pytest.approx(208 / 2.85)
    assert cat.cost_per_hour({"H800": 64, "H20": 24}) == pytest.approx(64 + 24 / 2.85)
    with pytest.raises(UnknownHardwareError, match="B200"):
        cat.cost_per_hour({"B200": 1})
    with pytest.raises(ResourceError, match="count"):
        cat.cost_per_hour({"H800": -1})
