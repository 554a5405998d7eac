"""Step 7: a dead worker is restarted once on the same devices, then removed and its devices freed."""

from __future__ import annotations

import asyncio

import pytest

from rollart.resource.cluster import Cluster
from rollart.resource.decorators import register
from rollart.resource.errors import WorkerFailedError
from rollart.resource.manager import ResourceManager
from rollart.resource.worker import Worker


class Echo(Worker):
    @register(mode="execute_all")
    def who(self):
        return self.rank, self.devices


async def test_restart_then_remove_local():
    rm = ResourceManager({"H20": range(0, 4)})
    events = []
    rm.subscribe(events.append)
    cluster = await Cluster.create(rm, Echo, role="rollout", num_workers=3, name="echo")
    runtime = cluster._runtime
    devices_of_1 = cluster._members[1].devices

    await runtime.kill(cluster._members[1].handle)
    with pytest.raises(WorkerFailedError, match="echo/1 died and was restarted") as err:
        await cluster.who()
    assert err.value.action == "restarted" and err.value.rank == 1
    assert await cluster.who() == [(0, (0,)), (1, devices_of_1), (2, (2,))]  # same devices after restart
    rec = {w.rank: w for w in rm.store.workers("echo")}[1]
    assert (rec.health, rec.restarts, rec.devices) == ("alive", 1, devices_of_1)
    assert await cluster.check_health() == {0: "ok", 1: "ok", 2: "ok"}

    await runtime.kill(cluster._members[1].handle)
    assert await cluster.check_health() == {0: "ok", 1: "removed", 2: "ok"}
    assert cluster.ranks == (0, 2)
    assert await cluster.who() == [(0, (0,)), (2, (2,))]
    assert rm.devices()[devices_of_1[0]].role == "free" and rm.devices()[devices_of_1[0]].owner is None
    rec = {w.rank: w for w in rm.store.workers("echo")}[1]
    assert (rec.health, rec.restarts) == ("removed", 1)
    order = [e.kind for e in events if e.payload.get("worker") == "echo/1" or e.kind == "released"]
    assert order[-5:] == ["worker_dead", "worker_alive", "worker_dead", "released", "worker_removed"]
    assert [e.payload["devices"] for e in events if e.kind == "released"] == [list(devices_of_1)]
    # a removed rank is reported as such; the freed device can be allocated again
    with pytest.raises(WorkerFailedError, match="removed"):
        await cluster._call(1, "who", (), {})
    assert rm.allocate("other", "train", 1).devices == devices_of_1
    await cluster.shutdown()


async def test_concurrent_failures_repaired_once():
    rm = ResourceManager({"H20": range(0, 2)})
    cluster = await Cluster.create(rm, Echo, role="rollout", num_workers=1, name="one")
    await cluster._runtime.kill(cluster._members[0].handle)
    results = await asyncio.gather(cluster.check_health(), cluster.check_health(), cluster.who(),
                                   return_exceptions=True)
    # one death, one restart: every caller sees the same repair
    assert {0: "restarted"} in results
    assert {w.restarts for w in rm.store.workers("one")} == {1}
    assert await cluster.who() == [(0, (0,))]
    await cluster.shutdown()
