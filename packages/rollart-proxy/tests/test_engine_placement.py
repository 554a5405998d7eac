"""Engines on their assigned devices (D48), TorchEngine's refusal of tensor parallelism (D49), and the
vLLM pool knobs validated before vLLM is imported (D50). The CUDA runs are the `gpu` tier's."""

from __future__ import annotations

import pytest

from rollart.proxy.errors import ProxyError
from rollart.proxy.torch_engine import TorchEngine
from rollart.proxy.types import EngineRequest, SamplingParams


def test_torch_engine_refuses_tensor_parallel_naming_the_field_and_the_way_out(tiny_model_path) -> None:
    with pytest.raises(ProxyError, match=r"tensor_parallel_size must be 1 \(use engine: vllm"):
        TorchEngine.from_pretrained(tiny_model_path, tensor_parallel_size=2)


def test_torch_engine_moves_its_model_to_the_given_device(tiny_model_path) -> None:
    engine = TorchEngine.from_pretrained(tiny_model_path, device="meta", offload_to_thread=False)
    assert {p.device.type for p in engine.model.parameters()} == {"meta"}


async def test_an_engine_given_the_cpu_device_generates_what_the_default_one_does(tiny_model_path) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0)
    outs = []
    for kwargs in ({}, {"device": "cpu"}):
        engine = TorchEngine.from_pretrained(tiny_model_path, offload_to_thread=False, **kwargs)
        engine.add_request(EngineRequest("r", (5, 6, 7), params))
        engine.add_request(EngineRequest("s", (9, 10), params))
        done = {}
        while engine.has_work():
            for out in await engine.step():
                done[out.request_id] = out.token_ids
        outs.append(done)
    assert outs[0] == outs[1] and all(len(v) == 6 for v in outs[0].values())


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
])
def test_vllm_pool_knobs_are_refused_before_vllm_starts(kwargs, field) -> None:
    from rollart.proxy.vllm_engine import VLLMEngine

    with pytest.raises(ProxyError, match=field):
        VLLMEngine("/nonexistent-model", **kwargs)


