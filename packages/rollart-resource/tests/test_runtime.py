"""Step 4: runtimes (the local one here; Ray in test_ray.py)."""

from __future__ import annotations

import pytest

from rollart.resource.errors import ResourceError, WorkerDiedError
from rollart.resource.runtime import LocalRuntime, WorkerContext, WorkerRuntime, bundle_for
from rollart.resource.worker import Worker


class Counter(Worker):
    def __init__(self, context, start=0):
        super().__init__(context)
        self.value = start

    def bump(self, by=1):
        self.value += by
        return self.value

    async def abump(self, by=1):
        return self.bump(by)


def test_bundle_for():
    assert bundle_for("H800", 1) == {"GPU": 1.0, "H800": 1.0}
    assert bundle_for("H20", 2, cpus=1) == {"GPU": 2.0, "H20": 2.0, "CPU": 1.0}
    assert bundle_for("CPU", 4) == {"CPU": 4.0}
    with pytest.raises(ResourceError, match="num_devices must be an integer in"):
        bundle_for("H800", 0)
    with pytest.raises(ResourceError, match="hw must not be empty"):
        bundle_for("", 1)


async def test_local_runtime_kill_and_restart():
    rt = LocalRuntime()
    assert isinstance(rt, WorkerRuntime)
    ctx = WorkerContext("c", 1, 2, "H20", (5,))
    h = await rt.spawn(Counter, ctx, (10,), {}, timeout=1.0)
    assert await rt.call(h, "bump", (), {}) == 11
    assert await rt.call(h, "abump", (), {"by": 5}) == 16
    assert await rt.call(h, "rollart_ping", (), {}) == 1
    assert await rt.call(h, "rollart_assigned_resources", (), {}) == {"H20": 1.0}
    w = h.worker
    assert (w.rank, w.world_size, w.hw, w.devices) == (1, 2, "H20", (5,))
    await rt.kill(h)
    with pytest.raises(WorkerDiedError, match="c/1 is dead"):
        await rt.call(h, "bump", (), {})
    fresh = await rt.restart(h, timeout=1.0)
    assert fresh.context == ctx
    assert await rt.call(fresh, "bump", (), {}) == 11  # a new instance, same constructor args
    await rt.remove(fresh)
    with pytest.raises(WorkerDiedError):
        await rt.call(fresh, "bump", (), {})
    with pytest.raises(ResourceError, match="timeout"):
        await rt.spawn(Counter, ctx, (), {}, timeout=-1)
    with pytest.raises(ResourceError, match="name must not be empty"):
        await rt.call(fresh := await rt.spawn(Counter, ctx, (), {}, timeout=1), "rollart_set_attribute", ("", 1), {})
