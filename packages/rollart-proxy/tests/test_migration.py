"""Step 6: shrink/expand with request migration, worker failure, and the stateful invariants."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollart.proxy.errors import ProxyError
from rollart.proxy.proxy import ACTIVE, DRAINING, OFFLOADED, REMOVED, LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import VirtualLoop, run_virtual
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker


async def sim_pool(n: int, **kw) -> list[InferenceWorker]:
    workers = [
        InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware("H20"), **kw), devices=(2 * i, 2 * i + 1))
        for i in range(n)
    ]
    for w in workers:
        await w.start()
    return workers


def req(i: int, max_tokens: int = 200) -> GenerateRequest:
    return GenerateRequest(tuple(range(1, 30 + i)), SamplingParams(max_tokens=max_tokens), f"r{i}", f"t{i}")


async def gather_within(aws: list, timeout: float, return_exceptions: bool = False) -> list:
    """gather on the running loop, with a deadline."""
    return await asyncio.wait_for(asyncio.gather(*aws, return_exceptions=return_exceptions), timeout)


class HandBacks:
    """Records the tokens each request carried when a worker handed it back."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[int, ...]] = {}
        self.count = 0

    def __call__(self, kind: str, data: dict) -> None:
        if kind == "handed_back":
            self.kept[data["request_id"]] = data["token_ids"]
            self.count += 1


def test_shrink_keeps_tokens():
    async def go():
        workers = await sim_pool(3)
        log = HandBacks()
        proxy = LLMProxy(workers, on_event=log)
        tasks = [asyncio.create_task(proxy.generate(req(i))) for i in range(12)]
        await asyncio.sleep(0.5)
        devices = await proxy.shrink([0, 2])
        states = [s.state for s in proxy.slots]
        out = await asyncio.gather(*tasks)
        await proxy.close()
        return devices, states, out, log, [w.stats() for w in workers]

    devices, states, out, log, stats = run_virtual(go())
    assert devices == [0, 1, 4, 5]
    assert states == [OFFLOADED, ACTIVE, OFFLOADED]
    assert log.count == 8  # the requests of two of three workers moved
    for r in out:
        assert r.finish_reason == "length" and len(r.token_ids) == 200
        kept = log.kept.get(r.request_id, ())
        assert r.token_ids[: len(kept)] == kept
        if kept:
            assert 0 < len(kept) < 200 and r.worker_ids[-1] == "w1"
    assert all(s.adds_refused == 0 for s in stats)


def test_shrink_validation_names_the_ranks():
    async def go():
        proxy = LLMProxy(await sim_pool(3))
        messages = []
        task = asyncio.create_task(proxy.generate(req(0, max_tokens=1000)))
        await asyncio.sleep(0.1)
        for ranks in ([3], [1, 1], [], [0, 1, 2]):
            with pytest.raises(ProxyError) as info:
                await proxy.shrink(ranks)
            messages.append(str(info.value))
        await proxy.shrink([2])
        with pytest.raises(ProxyError) as info:
            await proxy.shrink([2])
        messages.append(str(info.value))
        with pytest.raises(ProxyError) as info:
            await proxy.expand([1])
        messages.append(str(info.value))
        task.cancel()
        await proxy.close()
        return messages

    m = run_virtual(go())
    assert m[0] == "ranks must contain only integers in [0, 2], got 3 in [3]"
    assert m[1] == "ranks must have unique elements, duplicates [1] in [1, 1]"
    assert m[2] == "ranks must not be empty, got []"
    assert m[3].startswith("Pre-condition: the pool keeps a worker while requests are in flight, got ([0, 1, 2], [0, 1, 2], 1)")
    assert m[4] == "ranks must be a subset of [0, 1]; not allowed: [2]"
    assert m[5] == "ranks must be a subset of [2]; not allowed: [1]"


def test_expand_reloads_latest_weights_and_rebalances():
    async def go():
        workers = await sim_pool(2)
        log = HandBacks()
        proxy = LLMProxy(workers, on_event=log)
        await proxy.update_weights({}, 1)
        await proxy.shrink([1])
        await proxy.update_weights({}, 2)  # the offloaded worker misses this one
        tasks = [asyncio.create_task(proxy.generate(req(i, max_tokens=400))) for i in range(8)]
        await asyncio.sleep(0.3)
        before = log.count
        await proxy.expand([1])
        version_after_expand = workers[1].stats().version
        out = await asyncio.gather(*tasks)
        await proxy.close()
        return version_after_expand, before, log, out

    version, before, log, out = run_virtual(go())
    assert version == 2
    assert before == 0 and log.count == 4  # half the requests moved to the expanded worker
    assert sorted(r.worker_ids[-1] for r in out) == ["w0"] * 4 + ["w1"] * 4
    assert all(len(r.token_ids) == 400 and r.versions == (2,) for r in out)


def test_worker_failure_restarts_once_then_removes_and_nothing_is_lost():
    async def go():
        workers = await sim_pool(2)
        log = HandBacks()
        proxy = LLMProxy(workers, on_event=log)
        tasks = [asyncio.create_task(proxy.generate(req(i, max_tokens=300))) for i in range(6)]
        await asyncio.sleep(0.3)
        workers[0].engine.inject_fault(0)
        await asyncio.sleep(0.3)
        states = [s.state for s in proxy.slots]
        # the handed-back requests moved on to rank 1 without waiting for the restart (D53): new ones
        # go to the restarted (least loaded) worker, whose engine then fails too
        tasks += [asyncio.create_task(proxy.generate(req(i, max_tokens=300))) for i in range(6, 10)]
        await asyncio.sleep(0.3)
        workers[0].engine.inject_fault(0)
        out = await asyncio.gather(*tasks)
        await proxy.close()
        return states, [s.state for s in proxy.slots], out, dict(proxy.counters), log

    states, final_states, out, counters, log = run_virtual(go())
    assert states == [ACTIVE, ACTIVE] and final_states == [REMOVED, ACTIVE]
    assert counters["failures"] == 2 and counters["removed"] == 1
    assert counters["finished"] == 10 and counters["aborted"] == 0
    for r in out:
        assert r.finish_reason == "length" and len(r.token_ids) == 300
        kept = log.kept.get(r.request_id, ())
        assert r.token_ids[: len(kept)] == kept


class ProxyMachine(RuleBasedStateMachine):
    """Random generate / abort / suspend / resume / update / shrink / expand / failure sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualLoop()
        self.log = HandBacks()
        self.workers = self.loop.run_until_complete(sim_pool(3, stop_prob=0.02))
        self.proxy = LLMProxy(self.workers, max_inflight_per_worker=4, on_event=self.log)
        self.tasks: dict[str, asyncio.Task] = {}
        self.max_tokens: dict[str, int] = {}
        self.answers: dict[str, int] = {}
        self.trajectory_of: dict[str, str] = {}
        self.version = 0
        self.suspended = False
        self.n = 0

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def _active(self) -> list[int]:
        return self.proxy.active_ranks()

    def _inflight(self) -> int:
        return sum(not t.done() for t in self.tasks.values())

    @rule(count=st.integers(1, 4), max_tokens=st.integers(1, 300))
    def generate(self, count: int, max_tokens: int) -> None:
        for _ in range(count):
            rid = f"r{self.n}"
            request = GenerateRequest(tuple(range(1, 20 + self.n % 50)), SamplingParams(max_tokens=max_tokens, stop_token_ids=(7,)),
                                      rid, f"t{self.n % 5}")
            self.n += 1
            self.max_tokens[rid] = max_tokens
            self.trajectory_of[rid] = request.trajectory_id
            task = self.loop.create_task(self.proxy.generate(request, timeout_s=1e6))
            task.add_done_callback(lambda _t, rid=rid: self.answers.__setitem__(rid, self.answers.get(rid, 0) + 1))
            self.tasks[rid] = task

    @rule(seconds=st.floats(0.01, 2.0))
    def advance(self, seconds: float) -> None:
        self._run(asyncio.sleep(seconds))

    @rule(trajectory=st.integers(0, 4))
    def abort(self, trajectory: int) -> None:
        """An abort reaches exactly the requests of that trajectory still in flight (D31's index)."""

        async def go() -> tuple[int, int]:
            in_flight = sum(1 for rid, task in self.tasks.items()
                            if not task.done() and self.trajectory_of[rid] == f"t{trajectory}")
            return in_flight, await self.proxy.abort(f"t{trajectory}", reason="test abort")

        in_flight, aborted = self._run(go())
        assert aborted == in_flight

    @precondition(lambda self: not self.suspended)
    @rule()
    def suspend(self) -> None:
        self._run(self.proxy.suspend())
        self.suspended = True

    @precondition(lambda self: self.suspended)
    @rule()
    def update_and_resume(self) -> None:
        self.version += 1
        self._run(self.proxy.update_weights({}, self.version))
        self._run(self.proxy.resume())
        self.suspended = False

    @precondition(lambda self: len(self.proxy.active_ranks()) > 1)
    @rule(data=st.data())
    def shrink(self, data) -> None:
        rank = data.draw(st.sampled_from(self._active()))
        try:
            self._run(self.proxy.shrink([rank]))
        except ProxyError:
            # pending coroutines ran first (a failure handled, requests arrived): the proxy must
            # then refuse because the rank is no longer active or it is the last one in use
            assert rank not in self._active() or (self._active() == [rank] and self.proxy.inflight_count() > 0)

    @precondition(lambda self: any(s.state == OFFLOADED for s in self.proxy.slots))
    @rule(data=st.data())
    def expand(self, data) -> None:
        rank = data.draw(st.sampled_from([s.rank for s in self.proxy.slots if s.state == OFFLOADED]))
        self._run(self.proxy.expand([rank]))

    @precondition(lambda self: not self.suspended and len(self.proxy.active_ranks()) > 1)
    @rule(data=st.data())
    def fail(self, data) -> None:
        """Crash a busy worker's engine now and let the proxy handle it before the next rule."""
        busy = [r for r in self._active() if self.workers[r].engine.has_work()]
        if not busy:
            return
        engine = self.workers[data.draw(st.sampled_from(busy))].engine
        engine.inject_fault(0)
        self._run(asyncio.sleep(0.5))  # many steps of virtual time: the crash fires and is handled
        engine.inject_fault(None)  # if its requests all finished first, nothing crashed

    @invariant()
    def pool_never_empty_while_in_flight(self) -> None:
        if self._inflight():
            assert any(s.state in (ACTIVE, DRAINING) for s in self.proxy.slots)

    @invariant()
    def nothing_routed_to_offloaded_or_dead_workers(self) -> None:
        assert sum(w.stats().adds_refused for w in self.workers) == 0

    @invariant()
    def every_request_answered_at_most_once_and_tokens_survive(self) -> None:
        assert all(n == 1 for n in self.answers.values())
        for rid, task in self.tasks.items():
            if task.done():
                r = task.result()
                kept = self.log.kept.get(rid, ())
                assert r.token_ids[: len(kept)] == kept
                assert len(r.token_ids) == len(r.logprobs) == len(r.token_versions) <= self.max_tokens[rid]
                assert list(r.token_versions) == sorted(r.token_versions)  # versions never go backwards

    def teardown(self) -> None:
        try:
            if self.suspended:
                self._run(self.proxy.resume())
            offloaded = [s.rank for s in self.proxy.slots if s.state == OFFLOADED]
            if offloaded:  # a pipeline always expands again; requests may be waiting for a worker
                self._run(self.proxy.expand(offloaded))
            self._run(gather_within(list(self.tasks.values()), timeout=1e5))
            for rid, task in self.tasks.items():
                r = task.result()
                assert self.answers[rid] == 1
                if r.finish_reason == "abort":
                    assert r.abort_reason == "test abort"
                elif r.finish_reason == "length":
                    assert len(r.token_ids) == self.max_tokens[rid]
                else:
                    assert r.finish_reason == "stop" and r.token_ids[-1] == 7
            counters = self.proxy.counters
            assert counters["submitted"] == counters["finished"] + counters["aborted"] == len(self.tasks)
            assert [self._run(self.proxy.abort(f"t{t}")) for t in range(5)] == [0] * 5  # nothing left indexed
        finally:
            for task in self.tasks.values():
                task.cancel()
            # close() also ends the proxy's health-check task, which otherwise dies pending with the loop
            self._run(gather_within([self.proxy.close(), *(w.stop() for w in self.workers), *self.tasks.values()],
                                    timeout=1e5, return_exceptions=True))
            self.loop.close()


TestProxyMachine = ProxyMachine.TestCase
TestProxyMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_shrink_by_count_picks_the_least_loaded_workers():
    async def go():
        proxy = LLMProxy(await sim_pool(3))
        tasks = [asyncio.ensure_future(proxy.generate(req(i, max_tokens=300))) for i in range(2)]
        await asyncio.sleep(0.2)
        loaded = sorted(r for r in proxy.active_ranks() if proxy.slots[r].inflight)
        devices = await proxy.shrink(count=1)
        released = [s.rank for s in proxy.slots if s.state == OFFLOADED]
        out = await asyncio.gather(*tasks)
        await proxy.close()
        return loaded, released, devices, out

    loaded, released, devices, out = run_virtual(go())
    assert released == [r for r in range(3) if r not in loaded] and len(released) == 1
    assert devices == [2 * released[0], 2 * released[0] + 1]
    assert all(len(r.token_ids) == 300 for r in out)


class _RestartFails(InferenceWorker):
    """A real worker whose device is lost: its restart raises."""

    async def restart(self) -> None:
        raise RuntimeError("device 0 lost")


def test_a_failed_restart_is_logged_with_its_cause_and_the_worker_removed(caplog):
    async def go():
        broken = _RestartFails("w0", partial(SimEngine, QWEN3_8B, lookup_hardware("H20")), devices=(0,))
        healthy = InferenceWorker("w1", partial(SimEngine, QWEN3_8B, lookup_hardware("H20")), devices=(1,))
        for w in (broken, healthy):
            await w.start()
        proxy = LLMProxy([broken, healthy])
        tasks = [asyncio.create_task(proxy.generate(req(i, max_tokens=200))) for i in range(4)]
        await asyncio.sleep(0.2)
        broken.engine.inject_fault(0)
        out = await asyncio.gather(*tasks)
        await proxy.close()
        return [s.state for s in proxy.slots], out

    with caplog.at_level("INFO", logger="rollart.proxy"):
        states, out = run_virtual(go())
    assert states == [REMOVED, ACTIVE] and all(len(r.token_ids) == 200 for r in out)
    failed = [r for r in caplog.records if "failed; removing it" in r.getMessage()]
    assert len(failed) == 1 and failed[0].name == "rollart.proxy.proxy" and failed[0].levelname == "WARNING"
    assert isinstance(failed[0].exc_info[1], RuntimeError) and "device 0 lost" in str(failed[0].exc_info[1])
    assert any("worker 0 removed" in r.getMessage() for r in caplog.records)
