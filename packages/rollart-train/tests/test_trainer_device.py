"""The trainer lives on the device it is given (D27): model, reference model, micro-batches, reductions.

CPU has one real device, so the move is checked on torch's `meta` device (shapes without storage);
a real CUDA step is the `gpu` tier's (tests/gpu/test_gpu_tier.py).
"""

from __future__ import annotations

import dataclasses

import torch

from rollart.train import (
    TorchTrainer,
    TrainerConfig,
    TrainSample,
    build_causal_lm,
    build_train_batch,
    tiny_llama_config,
)


def _batch():
    samples = [TrainSample([5, 6, 7, 8], [0, 1, 1, 1], [-0.5, -0.5, -0.5, -0.5], 1.0, 0),
               TrainSample([5, 9, 10], [0, 1, 1], [-0.5, -0.5, -0.5], 0.0, 0)]
    return build_train_batch(samples)


def test_the_model_and_the_reference_model_move_to_the_given_device() -> None:
    policy, reference = build_causal_lm(tiny_llama_config()), build_causal_lm(tiny_llama_config())
    trainer = TorchTrainer(policy, TrainerConfig(lr=1e-3), reference_model=reference, device="meta")
    assert trainer.device == torch.device("meta")
    assert {p.device.type for p in trainer.model.parameters()} == {"meta"}
    assert {p.device.type for p in reference.parameters()} == {"meta"}


def test_without_a_device_the_model_stays_where_it_was_built() -> None:
    trainer = TorchTrainer(build_causal_lm(tiny_llama_config()), TrainerConfig(lr=1e-3))
    assert trainer.device == torch.device("cpu")


def test_a_batch_follows_the_trainer_device_field_by_field() -> None:
    batch = _batch()
    moved = batch.to("meta")
    for f in dataclasses.fields(batch):
        value = getattr(moved, f.name)
        assert value is None or (value.device.type == "meta" and value.shape == getattr(batch, f.name).shape)
    assert batch.to("cpu") is batch  # already there: no copy


def test_a_cpu_trainer_given_its_device_steps_as_before() -> None:
    torch.manual_seed(0)
    a = TorchTrainer(build_causal_lm(tiny_llama_config()), TrainerConfig(lr=1e-3), device="cpu")
    torch.manual_seed(0)
    b = TorchTrainer(build_causal_lm(tiny_llama_config()), TrainerConfig(lr=1e-3))
    assert a.train_step(_batch())["loss"] == b.train_step(_batch())["loss"]
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
