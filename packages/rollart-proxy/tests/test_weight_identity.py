"""Step 17: a weight version names one set of weights, at the proxy, the workers and the engines.

Before this step every layer checked only `version >= current` (`strict=False`), so different
weights re-sent under the version already served were loaded while every token kept the old tag.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rollart.proxy.errors import ProxyError
from rollart.proxy.proxy import LLMProxy
from rollart.proxy.sim_engine import QWEN3_8B, SimEngine, lookup_hardware
from rollart.proxy.testing import VirtualLoop, prompts_of_mixed_lengths, run_virtual
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, GenerateRequest, SamplingParams
from rollart.proxy.weight_identity import holds_weights, same_payload, weights_digest
from rollart.proxy.worker import InferenceWorker

GREEDY = SamplingParams(max_tokens=6, temperature=0)
REFUSED = "re-sent only with the"


def _head(engine: TorchEngine, seed: int) -> torch.Tensor:
    return torch.randn(engine.model.lm_head.weight.shape, generator=torch.Generator().manual_seed(seed))


def test_digest_is_bit_exact_and_order_independent():
    a = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.tensor([True, False])}
    assert weights_digest(a) == weights_digest({"y": a["y"].clone(), "x": a["x"].clone()})
    flipped = a["x"].clone()
    flipped.view(torch.int32)[0, 0] ^= 1  # one bit
    assert weights_digest({**a, "x": flipped}) != weights_digest(a)
    assert weights_digest({**a, "x": a["x"].double()}) != weights_digest(a)  # dtype is part of it
    assert weights_digest({**a, "x": a["x"].reshape(3, 2)}) != weights_digest(a)  # so is the shape
    assert same_payload(None, {}) and not same_payload(None, a) and same_payload(weights_digest(a), a)
    assert holds_weights(a, {"x": a["x"].clone()}) and not holds_weights(a, {"x": flipped})
    assert not holds_weights(a, {"z": a["x"]})


async def test_torch_engine_refuses_other_weights_under_the_served_version(tiny_model_path):
    engine = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)
    factory = engine.model.lm_head.weight.detach().clone()
    await engine.load_weights({"lm_head.weight": factory.clone()}, version=0)  # the same weights: a no-op
    with pytest.raises(ProxyError, match=REFUSED):
        await engine.load_weights({"lm_head.weight": _head(engine, 1)}, version=0)
    assert torch.equal(engine.model.lm_head.weight, factory) and engine.version == 0
    head = _head(engine, 2)
    await engine.load_weights({"lm_head.weight": head}, version=1)
    prompt = tuple(prompts_of_mixed_lengths(1, seed=7)[0])
    engine.add_request(EngineRequest("a", prompt, GREEDY))
    await engine.step()
    await engine.load_weights({"lm_head.weight": head.clone()}, version=1)  # idempotent, KV kept
    assert engine.load().running == 1
    with pytest.raises(ProxyError, match=REFUSED):
        await engine.load_weights({"lm_head.weight": _head(engine, 3)}, version=1)
    assert torch.equal(engine.model.lm_head.weight, head)
    outs = []
    while engine.has_work():
        outs += await engine.step()
    assert outs[0].token_versions == (1,) * GREEDY.max_tokens


async def test_torch_engine_compares_with_offloaded_weights(tiny_model_path):
    engine = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)
    head = _head(engine, 4)
    await engine.load_weights({"lm_head.weight": head}, version=1)
    await engine.offload()
    await engine.load_weights({"lm_head.weight": head.clone()}, version=1)
    with pytest.raises(ProxyError, match=REFUSED):
        await engine.load_weights({"lm_head.weight": head + 1}, version=1)


def test_sim_engine_keeps_the_digest_of_the_served_version():
    async def go():
        engine = SimEngine(QWEN3_8B, lookup_hardware("H20"), time_scale=0.0)
        await engine.load_weights({}, 0)  # the construction version: only an empty payload again
        with pytest.raises(ProxyError, match=REFUSED):
            await engine.load_weights({"w": torch.ones(2)}, 0)
        await engine.load_weights({"w": torch.ones(2)}, 1)
        await engine.load_weights({"w": torch.ones(2)}, 1)
        await engine.load_weights({}, 1)
        with pytest.raises(ProxyError, match=REFUSED):
            await engine.load_weights({"w": torch.zeros(2)}, 1)
        return engine.version

    assert run_virtual(go()) == 1


async def test_worker_refuses_and_keeps_serving(tiny_model_path):
    worker = InferenceWorker("w0", partial(TorchEngine.from_pretrained, tiny_model_path))
    await worker.start()
    head = _head(TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False), 5)
    try:
        await worker.load_weights({"lm_head.weight": head}, 1)
        await worker.load_weights({"lm_head.weight": head.clone()}, 1)
        with pytest.raises(ProxyError, match=REFUSED):
            await worker.load_weights({"lm_head.weight": head * 2}, 1)
        out = await worker.submit(EngineRequest("a", (1, 2, 3), GREEDY))
        assert out.token_versions == (1,) * GREEDY.max_tokens
    finally:
        await worker.stop()


async def test_proxy_refuses_other_weights_under_a_pushed_version(tiny_model_path):
    workers = [InferenceWorker(f"t{i}", partial(TorchEngine.from_pretrained, tiny_model_path)) for i in range(2)]
    for w in workers:
        await w.start()
    proxy = LLMProxy(workers)
    probe = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False)
    try:
        # before any push the proxy does not know version 0's weights: the workers refuse for it
        with pytest.raises(ProxyError, match=REFUSED):
            await proxy.update_weights({"lm_head.weight": _head(probe, 6)}, 0)
        head = _head(probe, 7)
        await proxy.update_weights({"lm_head.weight": head}, 1)
        prompt = tuple(prompts_of_mixed_lengths(1, seed=8)[0])
        first = await proxy.generate(GenerateRequest(prompt, GREEDY))
        await proxy.update_weights({"lm_head.weight": head.clone()}, 1)  # identical: accepted, a no-op
        with pytest.raises(ProxyError, match=REFUSED):
            await proxy.update_weights({"lm_head.weight": _head(probe, 9)}, 1)
        again = await proxy.generate(GenerateRequest(prompt, GREEDY))
        assert proxy.version == 1 and again.versions == (1,) and again.token_ids == first.token_ids
    finally:
        await proxy.close()


PAYLOADS = [{}, {"w": torch.zeros(3)}, {"w": torch.ones(3)}, {"w": torch.ones(3), "b": torch.zeros(1)}]


class VersionIdentityMachine(RuleBasedStateMachine):
    """Any sequence of (version, payload) pushes through a proxy of SimEngine workers.

    Model: a push is accepted iff its version is newer, or it is the served version with the
    payload pushed under it (or an empty one; the construction version accepts only empty ones).
    Invariant: the proxy and every worker agree with the model's served version and payload.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualLoop()
        self.workers = [InferenceWorker(f"w{i}", partial(SimEngine, QWEN3_8B, lookup_hardware("H20"), time_scale=0.0))
                        for i in range(2)]
        for w in self.workers:
            self.loop.run_until_complete(w.start())
        self.proxy = LLMProxy(self.workers)
        self.version, self.payload = 0, None  # None: the construction weights

    @rule(step=st.integers(0, 2), which=st.integers(0, len(PAYLOADS) - 1))
    def push(self, step: int, which: int) -> None:
        version, payload = self.version + step, PAYLOADS[which]
        same = not payload or (self.payload is not None and weights_digest(payload) == weights_digest(self.payload))
        accept = version > self.version or same
        try:
            self.loop.run_until_complete(self.proxy.update_weights(payload, version))
            accepted = True
        except ProxyError:
            accepted = False
        assert accepted == accept, (version, payload, self.version, self.payload)
        if accepted and version > self.version:
            self.version, self.payload = version, payload

    @invariant()
    def everyone_serves_the_model_version(self) -> None:
        assert self.proxy.version == self.version
        assert all(w.stats().version == self.version for w in self.workers)

    def teardown(self) -> None:
        self.loop.run_until_complete(self.proxy.close())
        self.loop.close()


TestVersionIdentityMachine = VersionIdentityMachine.TestCase
TestVersionIdentityMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)
