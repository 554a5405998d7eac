"""Ray tests on the session's local cluster (8 logical GPUs: 4 tagged H800, 4 tagged H20)."""

from __future__ import annotations

import sys

import pytest
from rollart.resource.runtime import RayRuntime, WorkerContext
from rollart.resource.worker import Worker

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_rt(ray_cluster):
    # test modules are imported by path (importlib mode): ship their classes to Ray by value
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return RayRuntime()


class Probe(Worker):
    def where(self):
        return self.rank, self.hw, self.devices


async def test_workers_land_on_right_hardware(ray_rt, ray_cluster):
    from ray.util.placement_group import placement_group_table

    handles = []
    for rank, (hw, dev) in enumerate([("H800", 0), ("H20", 4), ("H20", 5)]):
        handles.append(await ray_rt.spawn(Probe, WorkerContext("probe", rank, 3, hw, (dev,)), (), {}, timeout=60))
    try:
        for h in handles:
            granted = await ray_rt.call(h, "rollart_assigned_resources", (), {})
            assert granted.get(h.context.hw) == 1.0 and granted.get("GPU") == 1.0, granted
            other = "H20" if h.context.hw == "H800" else "H800"
            assert other not in granted
            table = placement_group_table(h.placement_group)
            assert table["bundles"][0] == {"GPU": 1.0, h.context.hw: 1.0}
            assert table["strategy"] == "STRICT_PACK"
            assert await ray_rt.call(h, "where", (), {}) == (h.context.rank, h.context.hw, h.context.devices)
    finally:
        for h in handles:
            await ray_rt.remove(h)
