"""Steps 20-22 (issue 12 item 8): the proxy fails fast when no worker can serve, restarts within a
budget per time window with backoff, replaces removed workers through a factory, logs failed
restarts, and finds dead idle workers with a periodic health check. All in virtual time (SimEngine)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollart.proxy.errors import NoWorkerAvailableError, WorkerFailedError
from rollart.proxy.proxy import ACTIVE, REMOVED, LLMProxy, restart_delay
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import run_virtual
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker


class Device:
    """A device whose loss makes every later engine build fail (a restart on it cannot succeed)."""

    def __init__(self) -> None:
        self.lost = False

    def engine(self) -> SimEngine:
        if self.lost:
            raise RuntimeError("device lost")
        return SimEngine(QWEN3_8B, lookup_hardware("H20"))


async def pool(n: int) -> tuple[list[Device], list[InferenceWorker]]:
    devices = [Device() for _ in range(n)]
    workers = [InferenceWorker(f"w{i}", d.engine, hardware="H20", devices=(i,)) for i, d in enumerate(devices)]
    for w in workers:
        await w.start()
    return devices, workers


def req(i: int, max_tokens: int = 40) -> GenerateRequest:
    return GenerateRequest(tuple(range(1, 20 + i)), SamplingParams(max_tokens=max_tokens), f"r{i}", f"t{i}")


class Events(list):
    def __call__(self, kind, data):
        self.append((asyncio.get_running_loop().time(), kind, data))

    def times(self, kind):
        return [t for t, k, _ in self if k == kind]


def test_with_every_worker_gone_requests_fail_fast_instead_of_waiting_out_the_deadline():
    async def go():
        devices, workers = await pool(2)
        proxy = LLMProxy(workers)  # the default request deadline: 600 s
        assert (await proxy.generate(req(0))).finish_reason == "length"
        for device, worker in zip(devices, workers):  # kill every worker: its loop ends, its device is gone
            device.lost = True
            await worker.stop()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        out = await asyncio.gather(*(proxy.generate(req(i)) for i in range(1, 5)), return_exceptions=True)
        elapsed = loop.time() - t0
        t1 = loop.time()
        with pytest.raises(NoWorkerAvailableError) as late:
            await proxy.generate(req(9))
        late_elapsed = loop.time() - t1
        states = [s.state for s in proxy.slots]
        counters = dict(proxy.counters)
        await proxy.close()
        return out, elapsed, str(late.value), late_elapsed, states, counters

    out, elapsed, late, late_elapsed, states, counters = run_virtual(go())
    assert elapsed < 60.0 and late_elapsed < 1.0, (elapsed, late_elapsed)  # generous; before the fix: 600 s each
    assert all(isinstance(r, NoWorkerAvailableError) for r in out), out
    assert "2 of 2 workers are removed" in str(out[0]) and "worker_factory" in str(out[0])
    assert "no worker can serve request 'r9'" in late
    assert states == [REMOVED, REMOVED]
    assert counters["failures"] == 2 and counters["removed"] == 2


def test_restart_budget_is_per_time_window_with_backoff():
    async def go():
        _, workers = await pool(1)
        events = Events()
        proxy = LLMProxy(workers, max_restarts=2, restart_window_s=100.0, restart_backoff_s=1.0, on_event=events,
                         health_check_interval_s=None)
        loop = asyncio.get_running_loop()
        fail_times, tasks = [], []

        async def crash(i: int) -> None:
            tasks.append(asyncio.create_task(proxy.generate(req(i, max_tokens=200))))
            await asyncio.sleep(0.2)
            assert workers[0].engine.has_work()
            workers[0].engine.inject_fault(0)
            fail_times.append(loop.time())
            for _ in range(100):  # bounded: until the failure is handled (restarted after any backoff, or removed)
                await asyncio.sleep(0.1)
                if proxy.counters["failures"] == len(fail_times) and proxy.slots[0].state in (ACTIVE, REMOVED):
                    break

        await crash(1)  # restarted at once
        await crash(2)  # restarted after the backoff (1 s)
        done_early = await asyncio.gather(*tasks)
        await asyncio.sleep(200.0)  # both restarts leave the window: the budget is back
        tasks.clear()
        await crash(3)  # restarted at once (a lifetime budget of 2 would remove the worker here)
        await crash(4)  # restarted after the backoff
        await crash(5)  # a third failure within 100 s: removed
        late = await asyncio.gather(*tasks, return_exceptions=True)
        slot = proxy.slots[0]
        result = (fail_times, events.times("worker_restarted"), events.times("worker_removed"), done_early, late,
                  slot.state, slot.restarts, dict(proxy.counters))
        await proxy.close()
        return result

    fail_times, restarted, removed, done_early, late, state, restarts, counters = run_virtual(go())
    assert all(r.finish_reason == "length" and len(r.token_ids) == 200 for r in done_early)
    assert len(restarted) == 4 and len(removed) == 1 and state == REMOVED and restarts == 4
    assert restarted[0] - fail_times[0] < 0.5  # the first restart in a window is immediate
    assert restarted[1] - fail_times[1] >= 1.0  # the next one waits the backoff
    assert restarted[2] - fail_times[2] < 0.5 and restarted[2] > restarted[1] + 100  # budget renewed by the window
    assert restarted[3] - fail_times[3] >= 1.0
    assert removed[0] >= fail_times[4]
    assert counters["failures"] == 5 and counters["removed"] == 1
    assert any(isinstance(r, NoWorkerAvailableError) for r in late)  # the pool is gone: fail fast


def test_removed_worker_is_replaced_through_the_factory_and_failed_restarts_are_logged(caplog):
    built = []

    async def factory(rank: int) -> InferenceWorker:
        built.append(rank)
        if len(built) == 1:
            raise RuntimeError("no capacity yet")  # the first replacement attempt fails: retried with backoff
        worker = InferenceWorker(f"w{rank}-new{len(built)}", Device().engine, hardware="H20", devices=(7,))
        await worker.start()
        return worker

    async def go():
        devices, workers = await pool(1)
        events = Events()
        proxy = LLMProxy(workers, max_restarts=2, restart_backoff_s=0.5, worker_factory=factory, on_event=events,
                         health_check_interval_s=None)
        devices[0].lost = True
        await workers[0].stop()
        first = await asyncio.gather(proxy.generate(req(1)), return_exceptions=True)
        for _ in range(100):  # bounded wait (virtual time) for the replacement
            if proxy.slots[0].state == ACTIVE:
                break
            await asyncio.sleep(0.5)
        after = await proxy.generate(req(2))
        result = (first, after, proxy.slots[0].state, proxy.slots[0].handle.worker_id, dict(proxy.counters),
                  [k for _, k, _ in events])
        await proxy.close()
        return result

    with caplog.at_level(logging.WARNING, logger="rollart.proxy.proxy"):
        first, after, state, worker_id, counters, kinds = run_virtual(go())
    assert after.finish_reason == "length" and after.worker_ids == ("w0-new2",)
    assert state == ACTIVE and worker_id == "w0-new2" and counters["replaced"] == 1 and built == [0, 0]
    assert kinds.count("worker_replaced") == 1 and "worker_removed" in kinds
    messages = [r.getMessage() for r in caplog.records if r.name == "rollart.proxy.proxy"]
    assert any("restart of worker w0 (rank 0) failed" in m for m in messages), messages
    assert any("replacing worker of rank 0 failed" in m for m in messages), messages
    failed = [r for r in caplog.records if "restart of worker w0" in r.getMessage()]
    assert failed[0].exc_info and "device lost" in str(failed[0].exc_info[1])  # the cause is in the log
    # the request in flight waited for the first replacement attempt, then failed fast when it failed
    assert isinstance(first[0], NoWorkerAvailableError) and "replacements are retried" in str(first[0])


def test_health_check_finds_a_dead_idle_worker():
    async def go(interval):
        _, workers = await pool(2)
        events = Events()
        proxy = LLMProxy(workers, health_check_interval_s=interval, on_event=events)
        await workers[0].stop()  # the worker's loop dies with nothing in flight
        await asyncio.sleep(10.0)
        result = ([(s.state, s.restarts) for s in proxy.slots], dict(proxy.counters), [k for _, k, _ in events],
                  await workers[0].probe() is not None)
        await proxy.close()
        return result

    slots, counters, kinds, probe_ok = run_virtual(go(1.0))
    assert slots == [(ACTIVE, 1), (ACTIVE, 0)] and counters["failures"] == 1  # found and restarted, no request
    assert "health_check_failed" in kinds and "worker_restarted" in kinds and probe_ok


def test_health_check_is_configurable_and_off_means_no_probe():
    async def go():
        _, workers = await pool(1)
        proxy = LLMProxy(workers, health_check_interval_s=None)
        await workers[0].stop()
        await asyncio.sleep(30.0)
        state = (proxy.slots[0].state, proxy.slots[0].restarts)
        checked = await proxy.check_health()  # an explicit round still works
        after = (proxy.slots[0].state, proxy.slots[0].restarts)
        await proxy.close()
        return state, checked, after

    state, checked, after = run_virtual(go())
    assert state == (ACTIVE, 0) and checked == {0: "failed"} and after == (ACTIVE, 1)


@given(
    gaps=st.lists(st.floats(0.0, 300.0), min_size=1, max_size=40),
    window=st.floats(1.0, 500.0),
    max_restarts=st.integers(0, 5),
    backoff=st.floats(0.0, 10.0),
    backoff_max=st.floats(0.0, 60.0),
)
def test_restart_budget_never_exceeded_in_any_window(gaps, window, max_restarts, backoff, backoff_max):
    """Failures at arbitrary times: within any window there are at most max_restarts restarts, the first
    one in a window is immediate, and each later one waits its exponential backoff."""
    times: list[float] = []
    restarts: list[float] = []
    now = 0.0
    for gap in gaps:
        now = max(now + gap, restarts[-1] if restarts else 0.0)  # a failure is seen after the last restart
        in_window_before = len([t for t in restarts if now - t < window])
        delay = restart_delay(times, now, window_s=window, max_restarts=max_restarts, backoff_s=backoff,
                              backoff_max_s=backoff_max)
        if delay is None:
            assert in_window_before >= max_restarts
            continue
        assert in_window_before < max_restarts
        expected = 0.0 if in_window_before == 0 else min(backoff_max, backoff * 2 ** (in_window_before - 1))
        assert delay == pytest.approx(expected)
        times.append(now + delay)
        restarts.append(now + delay)
    for r in restarts:
        assert len([t for t in restarts if r - window < t <= r]) <= max(max_restarts, 0)


class DeadActorHandle:
    """A worker in another process whose process was SIGKILLed: from `dead` on, every call raises
    WorkerFailedError (what a Ray handle makes of an ActorDiedError), `restart` included."""

    def __init__(self, inner: InferenceWorker) -> None:
        self.inner = inner
        self.worker_id, self.hardware, self.devices = inner.worker_id, inner.hardware, inner.devices
        self.dead = False

    def _check(self, method: str) -> None:
        if self.dead:
            raise WorkerFailedError(f"ray worker {self.worker_id} died during {method}: ActorDiedError")

    def submit(self, request):
        if self.dead:
            future = asyncio.get_running_loop().create_future()
            future.set_exception(WorkerFailedError(f"ray worker {self.worker_id} died during submit"))
            return future
        return self.inner.submit(request)

    def __getattr__(self, method):
        async def call(*args):
            self._check(method)
            return await getattr(self.inner, method)(*args)
        return call


def test_a_dead_actor_does_not_fail_suspend_resume_or_the_update_and_is_replaced_with_the_new_weights():
    """D40 (issue 21 item 1): before, suspend/resume raised past a dead actor's error and the update failed."""
    built = []

    async def factory(rank: int) -> InferenceWorker:
        worker = InferenceWorker(f"w{rank}-new{len(built)}", Device().engine, hardware="H20", devices=(5,))
        built.append(worker)
        await worker.start()
        return worker

    async def go():
        _, workers = await pool(2)
        dying = DeadActorHandle(workers[0])
        events = Events()
        proxy = LLMProxy([dying, workers[1]], max_restarts=1, worker_factory=factory, on_event=events,
                         health_check_interval_s=None)
        assert (await proxy.generate(req(0))).finish_reason == "length"
        dying.dead = True
        await workers[0].stop()
        await proxy.suspend()
        await proxy.update_weights({"w": torch.ones(2)}, 1)
        await proxy.resume()
        for _ in range(100):  # bounded wait (virtual time): restart fails on the dead actor, the factory replaces it
            if proxy.slots[0].handle is not dying and proxy.slots[0].state == ACTIVE:
                break
            await asyncio.sleep(0.5)
        answers = await asyncio.gather(*(proxy.generate(req(i)) for i in range(1, 7)))
        result = (answers, proxy.slots[0].state, proxy.slots[0].version, proxy.version, events)
        await proxy.close()
        return result

    answers, state, slot_version, version, events = run_virtual(go())
    assert state == ACTIVE and slot_version == version == 1
    assert built and built[0].engine.version == 1  # the replacement loaded the current weights
    assert all(a.finish_reason == "length" for a in answers)
    assert {w for a in answers for w in a.worker_ids} >= {"w0-new0"}
    failed = [d for _, k, d in events if k == "worker_failed"]
    assert failed and failed[0]["worker"] == "w0" and "died" in failed[0]["cause"]
    assert [k for _, k, _ in events].count("worker_replaced") == 1


def test_every_worker_dead_fails_the_update_in_one_error():
    async def go():
        _, workers = await pool(1)
        dying = DeadActorHandle(workers[0])
        proxy = LLMProxy([dying], health_check_interval_s=None)
        dying.dead = True
        try:
            await proxy.update_weights({"w": torch.ones(2)}, 1)
        except WorkerFailedError as exc:
            return proxy.version, str(exc)
        finally:
            await proxy.close()
        return None

    version, message = run_virtual(go())
    assert version == 0 and "died during load_weights" in message


class SlowRestartHandle(DeadActorHandle):
    """A dead actor whose restart takes `restart_s` (a Ray actor importing torch and loading weights)."""

    def __init__(self, inner: InferenceWorker, restart_s: float) -> None:
        super().__init__(inner)
        self.restart_s = restart_s
        self.restarted = 0

    async def restart(self) -> None:
        await asyncio.sleep(self.restart_s)
        self.dead = False
        await self.inner.restart()
        self.restarted += 1


def test_cancelling_the_request_that_found_a_dead_worker_does_not_cancel_its_restart():
    """D53 (issue 21): the failure was handled inside the request's task; a trajectory cancelled while
    the restart ran (staleness, redundancy, shutdown) cancelled the restart and left the slot draining at
    its old version for good (the flaky SIGKILL test of the application)."""

    async def go():
        _, workers = await pool(1)
        slow = SlowRestartHandle(workers[0], restart_s=5.0)
        proxy = LLMProxy([slow], health_check_interval_s=None)
        slow.dead = True
        task = asyncio.create_task(proxy.generate(req(0, max_tokens=400)))
        for _ in range(20):  # bounded: until the failure is being handled
            await asyncio.sleep(0.1)
            if proxy.slots[0].state != ACTIVE:
                break
        draining = proxy.slots[0].state
        task.cancel()  # the trajectory is aborted by cancellation while the restart runs
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(10.0)
        await proxy.update_weights({"w": torch.ones(2)}, 1)
        result = (draining, proxy.slots[0].state, proxy.slots[0].version, slow.restarted)
        await proxy.close()
        return result

    draining, state, version, restarted = run_virtual(go())
    assert draining == "draining"
    assert (state, version, restarted) == (ACTIVE, 1, 1)
