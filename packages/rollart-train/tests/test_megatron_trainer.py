"""MegatronTrainer on CPU as far as megatron-core 0.16 really runs there.

Runs: GPTModel construction (TP=1, a gloo group of world size 1 on 127.0.0.1), forward with the
CPU shims, the PPO loss, backward, clipping, a torch AdamW step, HF-named export and checkpoints.
Not run (GPU-only): megatron's DDP wrapper and distributed optimizer, which allocate CUDA grad
buffers; see design/rollart-train.md D7.
"""

from __future__ import annotations

import copy
import dataclasses
import socket

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the [megatron] extra)")

from rollart.train import (  # noqa: E402
    LossConfig,
    TorchTrainer,
    TrainerConfig,
    TrainError,
    TrainSample,
    build_causal_lm,
    build_train_batch,
    tiny_llama_config,
)

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def megatron_parallel_state():
    """A gloo process group of one rank on loopback and megatron's TP=1/PP=1 parallel state."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialized by another test in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    yield parallel_state
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _batch():
    prompt = [1, 2, 3]
    samples = [
        TrainSample(prompt + [10, 11, 12], [0, 0, 0, 1, 1, 1], [0.0] * 6, 1.0, 0),
        TrainSample(prompt + [20, 5, 21, 22], [0, 0, 0, 1, 0, 1, 1], [0.0] * 7, 0.0, 0),
        TrainSample(prompt + [10, 11], [0, 0, 0, 1, 1], [0.0] * 5, 1.0, 1),
        TrainSample(prompt + [30, 31, 32], [0, 0, 0, 1, 1, 1], [0.0] * 6, 0.0, 1),
    ]
    return build_train_batch(samples)


def _on_policy(trainer, batch):
    lp = trainer.compute_log_probs(batch)
    return dataclasses.replace(batch, behaviour_log_probs=torch.where(batch.loss_mask, lp, 0.0))


def test_megatron_trainer_requires_parallel_state():
    from megatron.core import parallel_state

    from rollart.train import MegatronTrainer

    if parallel_state.model_parallel_is_initialized():
        pytest.skip("parallel state already initialized in this process")
    with pytest.raises(TrainError, match="megatron parallel state is initialized"):
        MegatronTrainer(tiny_llama_config(vocab_size=64))


def test_megatron_logits_match_hf_after_export(megatron_parallel_state):
    from rollart.train import MegatronTrainer

    hf_config = tiny_llama_config(vocab_size=64)
    hf_model = build_causal_lm(hf_config, seed=3)
    trainer = MegatronTrainer(hf_config, hf_state_dict=hf_model.state_dict())
    batch = _batch()
    with torch.no_grad():
        megatron_logits = trainer.forward_logits(batch.input_ids, batch.attention_mask)
        hf_logits = hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    real = batch.attention_mask
    assert torch.allclose(megatron_logits[real], hf_logits[real], atol=1e-4)
    # export: HF names and shapes, and a fresh HF model loaded from it gives the same logits
    exported = trainer.named_tensors()
    assert {k: tuple(v.shape) for k, v in exported.items()} == {
        k: tuple(v.shape) for k, v in hf_model.state_dict().items()
    }
    fresh = build_causal_lm(hf_config, seed=4)
    fresh.load_state_dict(exported, strict=True)
    with torch.no_grad():
        fresh_logits = fresh(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    assert torch.allclose(fresh_logits[real], megatron_logits[real], atol=1e-4)


def test_megatron_train_step_runs_on_cpu(megatron_parallel_state, tmp_path):
    from rollart.train import MegatronTrainer
    from rollart.train.megatron_convert import megatron_to_hf_state_dict

    hf_config = tiny_llama_config(vocab_size=64)
    hf_model = build_causal_lm(hf_config, seed=3)
    config = TrainerConfig(lr=3e-3, micro_batch_size=2, loss=LossConfig(entropy_coef=0.01))
    trainer = MegatronTrainer(hf_config, config, hf_state_dict=hf_model.state_dict())
    torch_trainer = TorchTrainer(copy.deepcopy(hf_model), config)
    batch = _on_policy(trainer, _batch())
    before = trainer.named_tensors()

    # same weights, same batch: megatron and the HF torch path give the same gradient
    trainer.optimizer.zero_grad()
    torch_trainer.optimizer.zero_grad()
    m_sums = trainer.accumulate_gradients(batch)
    t_sums = torch_trainer.accumulate_gradients(batch)
    assert m_sums["loss"] == pytest.approx(t_sums["loss"], abs=1e-5)
    m_grads = {n: p.grad for n, p in trainer.model.named_parameters()}
    hf_grads = megatron_to_hf_state_dict(m_grads, hf_config)
    for name, param in torch_trainer.model.named_parameters():
        assert torch.allclose(param.grad, hf_grads[name], atol=1e-5, rtol=1e-3), name

    metrics = trainer.train_step(batch)
    assert metrics["version"] == 1.0 and metrics["grad_norm"] > 0
    after = trainer.named_tensors()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # a few on-policy steps raise the probability of the rewarded answers
    start = trainer.compute_log_probs(batch)
    for _ in range(5):
        trainer.train_step(_on_policy(trainer, batch))
    end = trainer.compute_log_probs(batch)
    gain = (end - start)[batch.loss_mask]
    rewarded = torch.tensor([1.0, 0.0, 1.0, 0.0])[:, None].expand_as(batch.loss_mask)[batch.loss_mask] > 0
    assert float(gain[rewarded].mean()) > float(gain[~rewarded].mean()) + 0.5
    assert trainer.version == 6

    # checkpoint round trip on the megatron model
    path = tmp_path / "megatron-ckpt"
    trainer.save_checkpoint(path)
    restored = MegatronTrainer(hf_config, config, seed=9)
    restored.load_checkpoint(path)
    assert restored.version == 6
    for name, tensor in trainer.named_tensors().items():
        assert torch.equal(tensor, restored.named_tensors()[name]), name

