"""Step 5: LLMProxy routing, back-pressure, abort, suspend/resume and weight updates."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
import torch

from rollart.proxy.errors import ProxyError, ProxyTimeoutError
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import prompts_of_mixed_lengths, run_virtual
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker


async def sim_pool(hardware: list[str], **kw) -> list[InferenceWorker]:
    workers = [
        InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware(hw), **kw), hardware=hw, devices=(i,))
        for i, hw in enumerate(hardware)
    ]
    for w in workers:
        await w.start()
    return workers


def req(n=8, max_tokens=20, **kw) -> GenerateRequest:
    return GenerateRequest(tuple(range(1, n + 1)), SamplingParams(max_tokens=max_tokens), **kw)


def test_affinity_routes_by_tag():
    async def go():
        proxy = LLMProxy(await sim_pool(["H800", "H800", "H20", "H20"]), affinity={"FrozenLake": "H800", "default": "H20"})
        lake = [proxy.generate(req(tag="FrozenLake", trajectory_id=f"l{i}")) for i in range(6)]
        math = [proxy.generate(req(tag="math", trajectory_id=f"m{i}")) for i in range(6)]
        out = await asyncio.gather(*lake, *math)
        await proxy.close()
        return out

    out = run_virtual(go())
    assert {r.worker_ids[0] for r in out[:6]} == {"w0", "w1"}  # H800, balanced over both
    assert {r.worker_ids[0] for r in out[6:]} == {"w2", "w3"}  # H20 by default


def test_unknown_tag_without_default_and_bad_input_are_rejected():
    async def go():
        proxy = LLMProxy(await sim_pool(["H800"]), affinity={"FrozenLake": "H800"})
        errors = []
        for bad in (
            req(tag="math"),
            GenerateRequest((), SamplingParams(max_tokens=4), tag="FrozenLake"),
            GenerateRequest((1, 2), SamplingParams(max_tokens=0), tag="FrozenLake"),
            GenerateRequest((1, -2), SamplingParams(max_tokens=4), tag="FrozenLake"),
            GenerateRequest((1, 2), SamplingParams(top_p=1.5), tag="FrozenLake"),
        ):
            with pytest.raises(ProxyError) as info:
                await proxy.generate(bad)
            errors.append(str(info.value))
        await proxy.close()
        return errors

    errors = run_virtual(go())
    assert errors[0] == "tag must be one of ['FrozenLake'], got 'math'"
    assert errors[1] == "request.prompt_ids must not be empty, got ()"
    assert errors[2] == "params.max_tokens must be an integer in [1, 1048576], got 0"
    assert "request.prompt_ids must contain only integers" in errors[3] and "-2" in errors[3]
    assert "params.top_p <= 1, got 1.5" in errors[4]


def test_least_outstanding_tokens_and_trajectory_stickiness():
    async def go():
        proxy = LLMProxy(await sim_pool(["H20", "H20"]))
        big = asyncio.create_task(proxy.generate(req(n=4000, max_tokens=400, trajectory_id="big")))
        await asyncio.sleep(0)
        small = await asyncio.gather(*(proxy.generate(req(trajectory_id=f"s{i}")) for i in range(4)))
        # second turn of "big" sticks to its worker although that one holds more tokens
        first = await big
        second = await proxy.generate(req(n=4000 + 400 + 5, max_tokens=5, trajectory_id="big"))
        await proxy.close()
        return first, small, second

    first, small, second = run_virtual(go())
    assert {r.worker_ids[0] for r in small} == {"w1"}  # all away from the loaded worker
    assert second.worker_ids == first.worker_ids == ("w0",)


def test_back_pressure_bounds_inflight_per_worker_and_waits_have_deadlines():
    async def go():
        workers = await sim_pool(["H20"])
        proxy = LLMProxy(workers, max_inflight_per_worker=2)
        peak = 0

        async def watch():
            nonlocal peak
            for _ in range(100_000):
                s = workers[0].stats()
                peak = max(peak, s.running + s.waiting)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        out = await asyncio.gather(*(proxy.generate(req(trajectory_id=f"t{i}")) for i in range(7)))
        watcher.cancel()
        tasks = [asyncio.create_task(proxy.generate(req(max_tokens=10_000))) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(ProxyTimeoutError, match="back-pressure"):
            await proxy.generate(req(), timeout_s=1.0)
        for t in tasks:
            t.cancel()
        await proxy.close()
        return out, peak

    out, peak = run_virtual(go())
    assert all(r.finish_reason == "length" for r in out)
    assert peak == 2


def test_waiting_requests_get_room_in_arrival_order_and_one_that_leaves_keeps_no_place():
    """D54: a freed place goes to the oldest waiting request, which is routed by the change that freed
    it; a waiter that times out, is cancelled, or is cancelled just after being routed leaves no place taken."""

    async def go():
        workers = await sim_pool(["H20"])
        proxy = LLMProxy(workers, max_inflight_per_worker=1)
        slot = proxy.slots[0]
        done: list[str] = []

        async def ask(name: str, max_tokens: int = 20, timeout_s: float | None = None):
            out = await proxy.generate(req(max_tokens=max_tokens, trajectory_id=name), timeout_s=timeout_s)
            done.append(name)
            return out

        first = asyncio.create_task(ask("a", max_tokens=400))
        await asyncio.sleep(0)
        waiting = {}
        for name in ("b", "c", "d", "e"):
            waiting[name] = asyncio.create_task(ask(name, timeout_s=0.001 if name == "e" else None))
            await asyncio.sleep(0)
        assert len(proxy._waiters) == 4 and len(slot.inflight) == 1
        waiting["c"].cancel()
        with pytest.raises(ProxyTimeoutError, match="back-pressure"):
            await waiting["e"]
        await asyncio.sleep(0)
        assert [w.track.request.trajectory_id for w in proxy._waiters] == ["b", "d"]
        await asyncio.gather(first, waiting["b"], waiting["d"])
        # routed and cancelled before it ran: its place is given back
        blocker = asyncio.create_task(ask("x", max_tokens=400))
        await asyncio.sleep(0)
        late = asyncio.create_task(ask("y"))
        await asyncio.sleep(0)
        blocker.cancel()
        await asyncio.sleep(0)  # the blocker's cancel frees the place and routes "y" to it
        assert late in asyncio.all_tasks() and not proxy._waiters and "y" not in done
        late.cancel()
        await asyncio.gather(blocker, late, return_exceptions=True)
        leftover = dict(slot.inflight)
        after = await asyncio.wait_for(proxy.generate(req(trajectory_id="z")), 60)
        await proxy.close()
        return done, leftover, after

    done, leftover, after = run_virtual(go())
    assert done == ["a", "b", "d"]
    assert leftover == {}
    assert after.finish_reason == "length"


def test_abort_trajectory_answers_abort_with_partial_tokens_once():
    async def go():
        proxy = LLMProxy(await sim_pool(["H20", "H20"]))
        doomed = [asyncio.create_task(proxy.generate(req(max_tokens=1000, trajectory_id="doomed"))) for _ in range(3)]
        other = asyncio.create_task(proxy.generate(req(max_tokens=50, trajectory_id="ok")))
        await asyncio.sleep(0.5)
        n = await proxy.abort("doomed", reason="trajectory exceeded the asynchronous bound")
        out = await asyncio.gather(*doomed, other)
        assert await proxy.abort("doomed") == 0
        counters = dict(proxy.counters)
        await proxy.close()
        return n, out, counters

    n, out, counters = run_virtual(go())
    assert n == 3
    for r in out[:3]:
        assert r.finish_reason == "abort" and r.abort_reason == "trajectory exceeded the asynchronous bound"
        assert 0 < len(r.token_ids) < 1000 and len(r.logprobs) == len(r.token_ids)
    assert out[3].finish_reason == "length" and len(out[3].token_ids) == 50
    assert counters["submitted"] == counters["finished"] + counters["aborted"] == 4


def test_inflight_requests_survive_suspend_update_resume():
    async def go():
        proxy = LLMProxy(await sim_pool(["H20", "H20"]))
        running = [asyncio.create_task(proxy.generate(req(max_tokens=300, trajectory_id=f"t{i}"))) for i in range(6)]
        await asyncio.sleep(0.5)
        await proxy.suspend()
        late = asyncio.create_task(proxy.generate(req(max_tokens=10, trajectory_id="late")))
        await asyncio.sleep(1.0)
        assert not late.done()
        await proxy.update_weights({}, 1)
        await proxy.resume()
        out = await asyncio.gather(*running, late)
        with pytest.raises(ProxyError, match="versions never go backwards"):
            await proxy.update_weights({}, 0)
        await proxy.close()
        return out

    out = run_virtual(go())
    for r in out[:6]:
        assert r.finish_reason == "length" and len(r.token_ids) == 300  # nothing lost to the update
        assert r.versions == (0, 1)
    assert out[6].versions == (1,)


async def test_torch_workers_serve_real_greedy_and_real_weight_updates(tiny_model_path):
    workers = [InferenceWorker(f"t{i}", partial(TorchEngine.from_pretrained, tiny_model_path)) for i in range(2)]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers)
    prompts = prompts_of_mixed_lengths(6, seed=31)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    first = await asyncio.gather(*(proxy.generate(GenerateRequest(tuple(p), greedy, trajectory_id=f"t{i}")) for i, p in enumerate(prompts)))
    reference = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)
    for p, r in zip(prompts, first):
        reference.add_request(EngineRequest("x", tuple(p), greedy))
        ref = None
        while reference.has_work():
            ref = next(iter(await reference.step()), ref)
        assert r.token_ids == ref.token_ids and r.versions == (0,)
    torch.manual_seed(5)
    new_head = torch.randn_like(reference.model.lm_head.weight)
    await proxy.suspend()
    await proxy.update_weights({"lm_head.weight": new_head}, 1)
    await proxy.resume()
    second = await asyncio.gather(*(proxy.generate(GenerateRequest(tuple(p), greedy)) for p in prompts))
    await proxy.close()
    assert all(r.versions == (1,) for r in second)
    assert [r.token_ids for r in second] != [r.token_ids for r in first]


def test_duplicate_request_id_and_request_deadline():
    async def go():
        workers = await sim_pool(["H20"])
        proxy = LLMProxy(workers)
        long = asyncio.ensure_future(proxy.generate(GenerateRequest((1, 2, 3), SamplingParams(max_tokens=100_000), "dup", "t")))
        await asyncio.sleep(0.1)
        with pytest.raises(ProxyError, match="request id not in flight, got 'dup'"):
            await proxy.generate(GenerateRequest((1, 2), SamplingParams(max_tokens=2), "dup", "t2"))
        with pytest.raises(ProxyTimeoutError, match="'late' not answered within its deadline on worker w0"):
            await proxy.generate(GenerateRequest((1, 2), SamplingParams(max_tokens=100_000), "late", "t3"), timeout_s=2.0)
        stats = workers[0].stats()
        long.cancel()
        await proxy.close()
        return stats

    stats = run_virtual(go())
    assert stats.running == 1  # the timed-out request was aborted on its worker; only "dup" runs


def test_close_answers_in_flight_requests_as_aborted_at_once_and_refuses_new_ones():
    async def go():
        proxy = LLMProxy(await sim_pool(["H800", "H20"]), request_timeout_s=3600.0)
        loop = asyncio.get_running_loop()
        pending = [asyncio.ensure_future(proxy.generate(req(max_tokens=100_000, trajectory_id=f"t{i}"))) for i in range(4)]
        await asyncio.sleep(0.05)
        await proxy.suspend()  # a suspended proxy must not keep them waiting either
        start = loop.time()
        await proxy.close()
        out = await asyncio.gather(*pending)
        waited = loop.time() - start
        with pytest.raises(ProxyError, match="the proxy is closed"):
            await proxy.generate(req())
        return out, waited, proxy.counters

    out, waited, counters = run_virtual(go())
    assert [r.finish_reason for r in out] == ["abort"] * 4
    assert {r.abort_reason for r in out} == {"proxy closed"}
    assert all(len(r.token_ids) > 0 for r in out)  # tokens generated before the close are returned
    assert waited < 1.0  # virtual seconds: answered at close, not at the 3600 s deadline
    assert counters["failures"] == 0  # stopping workers at close is not a failure to recover from
