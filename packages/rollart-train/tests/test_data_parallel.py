"""Data-parallel TorchTrainer (gloo, two processes on 127.0.0.1) takes exactly the single-device step (D12)."""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rollart.train import (
    TorchTrainer,
    TrainerConfig,
    TrainSample,
    build_causal_lm,
    build_train_batch,
    tiny_llama_config,
)


def _batch(n: int = 7) -> object:
    """Uneven lengths and groups, an odd count so the shards differ in size and token count."""
    gen = torch.Generator().manual_seed(3)
    samples = []
    for i in range(n):
        length = 4 + (i * 5) % 9
        ids = torch.randint(4, 64, (length,), generator=gen).tolist()
        mask = [0, 0] + [1] * (length - 2)
        samples.append(TrainSample(ids, mask, (-torch.rand(length, generator=gen)).tolist(), float(i % 2) + 0.1 * i, i % 3))
    return build_train_batch(samples)


def _config() -> TrainerConfig:
    return TrainerConfig(lr=1e-2, micro_batch_size=2, max_grad_norm=0.5)


def _replica(rank: int, port: int, out: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                         timeout=datetime.timedelta(seconds=60))
    try:
        trainer = TorchTrainer(build_causal_lm(tiny_llama_config(vocab_size=64), seed=0), _config(),
                               process_group=torch.distributed.group.WORLD)
        batch = _batch()
        half = (batch.num_sequences + 1) // 2
        shard = batch.select(slice(0, half) if rank == 0 else slice(half, batch.num_sequences))
        metrics = trainer.train_step(shard)
        torch.save({"weights": trainer.named_tensors(), "metrics": metrics}, f"{out}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_replicas_take_the_single_device_step(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_replica, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    single = TorchTrainer(build_causal_lm(tiny_llama_config(vocab_size=64), seed=0), _config())
    expected = single.train_step(_batch())
    reference = single.named_tensors()
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for res in results:
        for name, tensor in reference.items():
            torch.testing.assert_close(res["weights"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
        for key in ("loss", "policy_tokens", "sequences", "grad_norm", "entropy"):
            assert res["metrics"][key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    # the step moved the weights (the comparison is not vacuous)
    initial = build_causal_lm(tiny_llama_config(vocab_size=64), seed=0).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in reference.items())
