"""Step 4: the InferenceWorker command loop, with real (TorchEngine) and simulated engines."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from rollart.proxy.errors import ProxyError, ProxyTimeoutError
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import prompts_of_mixed_lengths, run_virtual
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker, WorkerState

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def sim_worker(name="w", **kw) -> InferenceWorker:
    return InferenceWorker(name, partial(SimEngine, QWEN3_8B, lookup_hardware("H20"), **kw), devices=(0,))


async def test_add_during_decode_does_not_stall_batch(tiny_model_path):
    worker = InferenceWorker("w", partial(TorchEngine.from_pretrained, tiny_model_path))
    reference = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)
    await worker.start()
    prompts = prompts_of_mixed_lengths(2, seed=21)
    long_req = EngineRequest("long", tuple(prompts[0]), SamplingParams(max_tokens=30, temperature=0))
    short_req = EngineRequest("short", tuple(prompts[1]), SamplingParams(max_tokens=3, temperature=0))
    finished: list[str] = []
    long_task = asyncio.ensure_future(worker.submit(long_req))
    long_task.add_done_callback(lambda _: finished.append("long"))
    for _ in range(10_000):  # bounded wait for the long request to be decoding
        if worker.stats().steps >= 5:
            break
        await asyncio.sleep(0.001)
    short = await worker.submit(short_req)
    finished.append("short")
    long = await long_task
    await worker.stop()
    # the short request joined the running batch and left it while the long one kept decoding
    assert finished == ["short", "long"]
    for req, out in ((long_req, long), (short_req, short)):
        reference.add_request(req)
        ref = None
        while reference.has_work():
            ref = next(iter(await reference.step()), ref)
        assert out.token_ids == ref.token_ids and out.finish_reason == "length"


def test_callback_fires_once_and_abort_evict_hand_back_partial_output():
    async def go():
        worker = sim_worker(time_scale=1.0)
        await worker.start()
        got = []
        worker.add_request(EngineRequest("cb", (1, 2, 3), SamplingParams(max_tokens=3)), got.append)
        a = asyncio.ensure_future(worker.submit(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=500))))
        b = asyncio.ensure_future(worker.submit(EngineRequest("b", (4, 5, 6), SamplingParams(max_tokens=500))))
        await asyncio.sleep(0.2)
        assert await worker.abort("a") is True
        assert await worker.abort("nope") is False
        assert await worker.evict(None) == ["b"]
        out_a, out_b = await a, await b
        await worker.stop()
        return got, out_a, out_b

    got, out_a, out_b = run_virtual(go())
    assert len(got) == 1 and got[0].finish_reason == "length" and len(got[0].token_ids) == 3
    assert out_a.finish_reason == "abort" and 0 < len(out_a.token_ids) < 500
    assert out_b.finish_reason == "migrated" and 0 < len(out_b.token_ids) < 500
    assert len(out_b.logprobs) == len(out_b.token_versions) == len(out_b.token_ids)


def test_suspend_stops_stepping_but_serves_commands_then_resume_finishes():
    async def go():
        worker = sim_worker(time_scale=1.0)
        await worker.start()
        task = asyncio.ensure_future(worker.submit(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=100))))
        await asyncio.sleep(0.1)
        await worker.suspend()
        steps = worker.stats().steps
        await asyncio.sleep(5.0)
        assert worker.stats().steps == steps and worker.state is WorkerState.SUSPENDED
        await worker.load_weights({}, 1)  # commands are still served
        with pytest.raises(ProxyError, match="versions never go backwards"):
            await worker.load_weights({}, 0)
        await worker.resume()
        out = await task
        await worker.stop()
        return out

    out = run_virtual(go())
    assert out.finish_reason == "length" and len(out.token_ids) == 100
    assert out.token_versions[0] == 0 and out.token_versions[-1] == 1


def test_offload_hands_back_requests_and_refuses_adds_until_reload():
    async def go():
        worker = sim_worker(time_scale=1.0)
        await worker.start()
        task = asyncio.ensure_future(worker.submit(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=100))))
        await asyncio.sleep(0.1)
        await worker.offload()
        handed = await task
        refused = await worker.submit(EngineRequest("b", (1, 2), SamplingParams(max_tokens=5)))
        stats = worker.stats()
        await worker.reload()
        done = await worker.submit(EngineRequest("c", (1, 2), SamplingParams(max_tokens=5)))
        await worker.stop()
        return handed, refused, stats, done

    handed, refused, stats, done = run_virtual(go())
    assert handed.finish_reason == "migrated" and handed.token_ids
    assert refused.finish_reason == "migrated" and refused.token_ids == ()
    assert stats.state == "offloaded" and stats.adds_refused == 1
    assert done.finish_reason == "length"


def test_engine_failure_hands_back_and_restart_gives_a_fresh_engine():
    async def go():
        worker = sim_worker(time_scale=1.0)
        await worker.start()
        task = asyncio.ensure_future(worker.submit(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=100))))
        await asyncio.sleep(0.05)
        first_engine = worker.engine
        first_engine.inject_fault(0)
        out = await task
        state = worker.state
        await worker.restart()
        again = await worker.submit(out.resume_request(EngineRequest("a", (1, 2, 3), SamplingParams(max_tokens=100))))
        fresh = worker.engine is not first_engine
        await worker.stop()
        return out, state, again, fresh, worker.stats()

    out, state, again, fresh, stats = run_virtual(go())
    assert out.finish_reason == "worker_failed" and len(out.token_ids) > 0
    assert state is WorkerState.FAILED and fresh and stats.restarts == 1
    assert again.finish_reason == "length" and again.token_ids[: len(out.token_ids)] == out.token_ids


def test_command_waits_have_a_deadline():
    async def go():
        # one 8B prefill of 100k tokens takes minutes of simulated time; the command deadline is 1 s
        worker = InferenceWorker("w", partial(SimEngine, QWEN3_8B, lookup_hardware("H20")), command_timeout_s=1.0)
        await worker.start()
        asyncio.ensure_future(worker.submit(EngineRequest("a", tuple(range(100_000)), SamplingParams(max_tokens=5))))
        await asyncio.sleep(0.01)
        with pytest.raises(ProxyTimeoutError, match="SUSPEND not done within command_timeout_s=1.0"):
            await worker.suspend()
        await worker.stop()

    run_virtual(go())
    with pytest.raises(ProxyError, match="command_timeout_s must be a finite timeout"):
        InferenceWorker("w", lambda: None, command_timeout_s=0)


class _StalledEngine(TorchEngine):
    """A real TorchEngine whose ``has_work`` over-approximates (as any engine's may, D26): it says
    yes while its only request waits for a weight update, and counts the steps the loop asks for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_calls = 0
        self.blocked = True

    def has_work(self) -> bool:
        return self.blocked or super().has_work()

    async def step(self):
        self.step_calls += 1
        if self.blocked:
            return []
        return await super().step()


async def test_idle_worker_waits_instead_of_spinning(tiny_model_path):
    engine = _StalledEngine(TorchEngine.from_pretrained(tiny_model_path).model)
    worker = InferenceWorker("w", lambda: engine)
    await worker.start()
    await asyncio.sleep(0.5)
    spun = engine.step_calls
    assert spun <= 20, f"{spun} empty steps in 0.5 s"
    engine.blocked = False  # the engine can progress again: a command wakes the loop
    prompt = tuple(prompts_of_mixed_lengths(1, seed=2)[0])
    out = await asyncio.wait_for(worker.submit(EngineRequest("a", prompt, GREEDY)), 10)
    await worker.stop()
    assert len(out.token_ids) == GREEDY.max_tokens and out.finish_reason == "length"


async def test_weight_update_through_worker_readmits_and_finishes(tiny_model_path):
    """Issue 13 item 2 end to end: the resumed request fits its KV budget and finishes."""
    model = TorchEngine.from_pretrained(tiny_model_path).model
    worker = InferenceWorker("w", lambda: TorchEngine(model, max_kv_tokens=64))
    await worker.start()
    fut = worker.submit(EngineRequest("r", tuple(range(10, 20)), SamplingParams(max_tokens=50, temperature=0)))
    for _ in range(10_000):
        if worker.stats().steps >= 11:
            break
        await asyncio.sleep(0.001)
    await worker.suspend()
    await worker.load_weights({}, version=1)
    await worker.resume()
    out = await asyncio.wait_for(fut, 20)
    steps = worker.stats().steps
    await worker.stop()
    assert len(out.token_ids) == 50 and out.token_versions[-1] == 1
    assert steps <= 60, f"{steps} steps for 50 tokens"
