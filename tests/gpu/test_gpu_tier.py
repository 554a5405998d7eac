"""The GPU tier (app D73): a real run of the CUDA-only lines on 1-2 GPUs. `make test-gpu` runs it.

Without a CUDA device every test here skips with one line saying why; `pytest -m gpu --collect-only`
lists them anyway. Written on a machine without a GPU: none of these has run yet (docs/gpu-cluster.md
keeps the table of what has run where). Each test names the decision whose CUDA lines it covers.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import socket
from pathlib import Path

import pytest
import torch

from rollart.resource.accelerators import cuda_device_count

GPUS = cuda_device_count()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="no CUDA device here (torch.cuda.device_count() == 0): run `make test-gpu` on a GPU node"),
]
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA devices, this node has {GPUS}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from rollart.proxy.testing import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("gpu-tier") / "tiny"))


def _batch():
    from rollart.train import TrainSample, build_train_batch

    return build_train_batch([TrainSample([5, 6, 7, 8], [0, 1, 1, 1], [-0.5] * 4, 1.0, 0),
                              TrainSample([5, 9, 10], [0, 1, 1], [-0.5] * 3, 0.0, 0)])


async def test_torch_engine_generates_on_cuda(tiny_model) -> None:
    """proxy D48: model, inputs and KV on cuda:0, sampling on the host."""
    from rollart.proxy.torch_engine import TorchEngine
    from rollart.proxy.types import EngineRequest, SamplingParams

    engine = TorchEngine.from_pretrained(tiny_model, device="cuda:0", offload_to_thread=False)
    assert {p.device.type for p in engine.model.parameters()} == {"cuda"}
    params = SamplingParams(max_tokens=8, temperature=0.0)
    engine.add_request(EngineRequest("a", (5, 6, 7), params))
    engine.add_request(EngineRequest("b", (9, 10), params))
    done = {}
    while engine.has_work():
        for out in await engine.step():
            done[out.request_id] = out.token_ids
    assert sorted(done) == ["a", "b"] and all(len(t) == 8 for t in done.values())
    await engine.offload()  # frees the device memory: parameters go to the host
    assert all(p.numel() == 0 for p in engine.model.parameters())
    await engine.reload()
    assert {p.device.type for p in engine.model.parameters()} == {"cuda"}


def test_torch_trainer_steps_on_cuda() -> None:
    """train D27: model, micro-batches and the step on cuda:0."""
    from rollart.train import TorchTrainer, TrainerConfig, build_causal_lm, tiny_llama_config

    trainer = TorchTrainer(build_causal_lm(tiny_llama_config()), TrainerConfig(lr=1e-3), device="cuda:0")
    metrics = trainer.train_step(_batch())
    assert trainer.version == 1 and torch.isfinite(torch.tensor(metrics["loss"]))
    assert {t.device.type for t in trainer.named_tensors().values()} == {"cuda"}


def test_a_ray_actor_with_a_gpu_is_placed_on_cuda() -> None:
    """resource D35: Ray's GPU id becomes cuda:0 inside the actor."""
    import ray

    from rollart.resource.accelerators import assigned_placement

    started = not ray.is_initialized()
    if started:
        ray.init(num_gpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", namespace="rollart-gpu-tier")
    try:
        probe = ray.remote(num_gpus=1)(lambda: (assigned_placement("probe").device, torch.cuda.device_count()))
        device, visible = ray.get(probe.remote(), timeout=120)
    finally:
        if started:
            ray.shutdown()
    assert device == "cuda:0" and visible == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nccl_rank(rank: int, port: int, out: str) -> None:
    """One rank of the NCCL sync test: rank 0 trains one step and publishes, rank 1 fetches; both save bytes."""
    import torch.distributed as dist

    from rollart.sync.torch_dist import TorchDistributedChannel
    from rollart.train import TorchTrainer, TrainerConfig, build_causal_lm, tiny_llama_config

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))

    async def run() -> dict[str, torch.Tensor]:
        got: dict[str, torch.Tensor] = {}
        for checksums in (True, False):  # sync D42: both paths on NCCL
            channel = TorchDistributedChannel(src_rank=0, device=f"cuda:{rank}", checksums=checksums, bucket_bytes=1 << 16)
            if rank == 0:
                trainer = TorchTrainer(build_causal_lm(tiny_llama_config()), TrainerConfig(lr=1e-3), device="cuda:0")
                trainer.train_step(_batch())
                named = trainer.named_tensors(copy=False)
                await channel.publish(named, 1 + int(not checksums)).wait(60)
                got = {k: v.cpu() for k, v in named.items()}
            else:
                snap = await channel.fetch(1 + int(not checksums), timeout=60)
                assert {t.device.type for t in snap.tensors.values()} == {"cuda"}  # sync D43: no host staging
                got = {k: v.cpu() for k, v in snap.tensors.items()}
            await channel.close()
        return got

    tensors = asyncio.run(run())
    dist.destroy_process_group()
    torch.save(tensors, os.path.join(out, f"rank{rank}.pt"))


@two_gpus
def test_nccl_weight_sync_is_bit_exact_against_the_trainer(tmp_path: Path) -> None:
    """sync D41-D43 + resource D36: trainer on cuda:0 publishes over NCCL, cuda:1 receives the same bytes."""
    import torch.multiprocessing as mp

    mp.spawn(_nccl_rank, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    sent, received = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert sorted(sent) == sorted(received)
    for name, t in sent.items():
        assert received[name].dtype == t.dtype and received[name].shape == t.shape
        assert torch.equal(received[name].view(torch.uint8), t.view(torch.uint8)), name


def _vllm_generates(path: str, tp: int) -> None:
    pytest.importorskip("vllm", reason="the vllm package (CUDA build) is not installed")
    from rollart.proxy.types import EngineRequest, SamplingParams
    from rollart.proxy.vllm_engine import VLLMEngine

    async def run() -> list[int]:
        engine = VLLMEngine(path, tensor_parallel_size=tp, gpu_memory_utilization=0.3, dtype="bfloat16", max_model_len=128)
        engine.add_request(EngineRequest("a", (5, 6, 7), SamplingParams(max_tokens=8, temperature=0.0)))
        outs = []
        while engine.has_work():
            outs += await engine.step()
        return list(outs[0].token_ids)

    assert len(asyncio.run(run())) == 8


def test_a_vllm_gpu_pool_with_tensor_parallel_1(tiny_model) -> None:
    """proxy D50: tensor_parallel_size, gpu_memory_utilization and dtype reach vLLM on a GPU."""
    _vllm_generates(tiny_model, 1)


@two_gpus
def test_a_vllm_gpu_pool_with_tensor_parallel_2(tiny_model) -> None:
    """proxy D50 / app D71: one engine over 2 GPUs (vLLM's multiprocess executor)."""
    _vllm_generates(tiny_model, 2)
