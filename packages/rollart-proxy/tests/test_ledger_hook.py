"""Step 7: the proxy inside rollart.resource's two-phase shrink/expand, with the real ResourceManager."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from rollart.proxy.ledger_hook import ProxyTransitionHook
from rollart.proxy.proxy import ACTIVE, OFFLOADED, LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import run_virtual
from rollart.proxy.types import GenerateRequest, SamplingParams
from rollart.proxy.worker import InferenceWorker
from rollart.resource.ledger import TransitionHook, TransitionVetoed
from rollart.resource.manager import ResourceManager
from rollart.resource.testing import RecordingHook


async def setup(extra_hook=None):
    manager = ResourceManager({"H20": range(6)})
    alloc = manager.allocate("rollout-cluster", "rollout", 6, "H20")
    workers = [
        InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware("H20")), devices=alloc.devices[2 * i : 2 * i + 2])
        for i in range(3)
    ]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers)
    hook = ProxyTransitionHook(proxy)
    assert isinstance(hook, TransitionHook)
    manager.add_transition_hook(hook)
    if extra_hook is not None:
        manager.add_transition_hook(extra_hook)
    return manager, proxy


def requests(proxy, n=6):
    return [asyncio.ensure_future(proxy.generate(GenerateRequest((1, 2, 3, 4), SamplingParams(max_tokens=300), f"r{i}", f"t{i}"))) for i in range(n)]


def test_ledger_shrink_migrates_and_expand_restores():
    async def go():
        manager, proxy = await setup()
        tasks = requests(proxy)
        await asyncio.sleep(0.5)
        shrunk = await manager.shrink("rollout", "train", [2, 3])
        roles_after_shrink = {d: r.role for d, r in manager.devices().items()}
        states_after_shrink = [s.state for s in proxy.slots]
        expanded = await manager.expand("train", "rollout", [2, 3])
        out = await asyncio.gather(*tasks)
        states = [s.state for s in proxy.slots]
        await proxy.close()
        return shrunk, roles_after_shrink, states_after_shrink, expanded, out, states

    shrunk, roles, mid_states, expanded, out, states = run_virtual(go())
    assert shrunk.phase == expanded.phase == "completed"
    assert roles[2] == roles[3] == "train" and roles[0] == "rollout"
    assert mid_states == [ACTIVE, OFFLOADED, ACTIVE]
    assert states == [ACTIVE, ACTIVE, ACTIVE]
    assert all(r.finish_reason == "length" and len(r.token_ids) == 300 for r in out)


def test_veto_after_prepare_rolls_the_proxy_back():
    async def go():
        manager, proxy = await setup(extra_hook=RecordingHook(veto="trainer not ready"))
        tasks = requests(proxy)
        await asyncio.sleep(0.5)
        with pytest.raises(TransitionVetoed, match="trainer not ready"):
            await manager.shrink("rollout", "train", [4, 5])
        states = [s.state for s in proxy.slots]
        roles = {d: r.role for d, r in manager.devices().items()}
        out = await asyncio.gather(*tasks)
        await proxy.close()
        return states, roles, out

    states, roles, out = run_virtual(go())
    assert states == [ACTIVE, ACTIVE, ACTIVE]  # the proxy's prepare was undone by abort
    assert set(roles.values()) == {"rollout"}
    assert all(len(r.token_ids) == 300 for r in out)


def test_proxy_vetoes_devices_that_split_a_worker():
    async def go():
        manager, proxy = await setup()
        with pytest.raises(TransitionVetoed) as info:
            await manager.shrink("rollout", "train", [1, 2])
        states = [s.state for s in proxy.slots]
        await proxy.close()
        return str(info.value), states

    message, states = run_virtual(go())
    assert "rollart.proxy: transition_devices must be a subset of []; not allowed: [1, 2]" in message
    assert states == [ACTIVE, ACTIVE, ACTIVE]
