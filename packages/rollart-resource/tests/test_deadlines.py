"""Step 16: every Cluster call has a deadline (issue 12 item 8): a worker method that never returns
ends with CallTimeout naming the method, the worker and the deadline, instead of waiting forever."""

from __future__ import annotations

import asyncio

import pytest

from rollart.resource.cluster import Cluster
from rollart.resource.decorators import hw_mapping, register
from rollart.resource.errors import CallTimeout, ResourceError
from rollart.resource.manager import ResourceManager
from rollart.resource.runtime import LocalRuntime, WorkerContext
from rollart.resource.worker import Worker


class Stuck(Worker):
    """A worker whose `hang` never returns (a deadlock, a lost collective, a stuck device)."""

    @register(mode="execute_all")
    async def hang(self):
        await asyncio.Event().wait()

    @register(mode="execute_rank0", timeout=0.2)
    async def hang_short(self):
        await asyncio.Event().wait()

    @hw_mapping({"default": "H20"}, timeout=0.2)
    async def hang_routed(self, tag_name="default"):
        await asyncio.Event().wait()

    @register(mode="execute_all")
    async def nap(self, seconds):
        await asyncio.sleep(seconds)
        return self.rank

    def rollart_ping(self):
        return self.rank


async def _bounded(coro, bound=30.0):
    """A generous outer bound: before the fix these calls never return at all."""
    return await asyncio.wait_for(coro, bound)


async def test_a_call_that_never_returns_ends_at_the_cluster_deadline():
    rm = ResourceManager({"H20": range(0, 2)})
    events = []
    rm.subscribe(events.append)
    cluster = await Cluster.create(rm, Stuck, role="rollout", num_workers=2, name="stuck", call_timeout=0.5)
    with pytest.raises(CallTimeout) as err:
        await _bounded(cluster.hang())
    exc = err.value
    assert (exc.method, exc.owner, exc.timeout) == ("hang", "stuck", 0.5) and exc.rank in (0, 1)
    assert "hang" in str(exc) and f"stuck/{exc.rank}" in str(exc) and "0.5" in str(exc)
    assert [e.payload["method"] for e in events if e.kind == "worker_call_timeout"]  # recorded in the store
    # the worker is not declared dead by a timeout: it is still in the cluster and answers other calls
    assert cluster.ranks == (0, 1)
    assert await _bounded(cluster.nap(0.0)) == [0, 1]
    await cluster.shutdown()


async def test_deadline_overridable_per_method_and_per_call():
    rm = ResourceManager({"H20": range(0, 2)})
    cluster = await Cluster.create(rm, Stuck, role="rollout", num_workers=1, name="s2", call_timeout=600.0)
    with pytest.raises(CallTimeout, match=r"hang_short.*0\.2"):  # the method's own deadline wins over 600 s
        await _bounded(cluster.hang_short())
    with pytest.raises(CallTimeout, match=r"hang_routed.*0\.2"):
        await _bounded(cluster.hang_routed())
    with pytest.raises(CallTimeout, match=r"'hang'.*0\.3"):  # a per-call deadline
        await _bounded(cluster.hang(rollart_timeout=0.3))
    with pytest.raises(CallTimeout, match=r"nap.*0\.1"):
        await _bounded(cluster.execute_all("nap", 5.0, rollart_timeout=0.1))
    assert await _bounded(cluster.nap(0.01, rollart_timeout=5.0)) == [0]  # the keyword is not passed on
    with pytest.raises(ResourceError, match="rollart_timeout must be a finite timeout"):
        await cluster.nap(0.0, rollart_timeout=-1)
    with pytest.raises(ResourceError, match="call_timeout must be a finite timeout"):
        await Cluster.create(rm, Stuck, role="rollout", num_workers=1, name="bad", call_timeout=0)
    with pytest.raises(ResourceError, match="timeout must be a finite timeout"):
        register(mode="execute_all", timeout=float("inf"))
    await cluster.shutdown()


async def test_check_health_reports_a_hung_worker_as_unresponsive_without_waiting_forever():
    class Frozen(Stuck):
        async def rollart_ping(self):
            await asyncio.Event().wait()

    rm = ResourceManager({"H20": range(0, 1)})
    cluster = await Cluster.create(rm, Frozen, role="rollout", num_workers=1, name="frozen", call_timeout=600.0)
    assert await _bounded(cluster.check_health(timeout=0.2)) == {0: "unresponsive"}
    assert cluster.ranks == (0,)  # unresponsive is reported, not repaired (it may be busy)
    await cluster.shutdown()


async def test_local_runtime_call_deadline():
    rt = LocalRuntime()
    h = await rt.spawn(Stuck, WorkerContext("rt", 0, 1, "H20", (0,)), (), {}, timeout=1.0)
    with pytest.raises(CallTimeout, match=r"rt/0.*'hang'.*0\.1"):
        await _bounded(rt.call(h, "hang", (), {}, timeout=0.1))
    assert await rt.call(h, "nap", (0.0,), {}) == 0  # no timeout: as before
