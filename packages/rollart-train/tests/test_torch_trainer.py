"""TorchTrainer on the tiny Llama: learning signal, checkpoints, exact gradient accumulation."""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import pickle

import pytest
import torch

from rollart.train import (
    LossConfig,
    PolicyTrainer,
    TorchTrainer,
    TrainerConfig,
    TrainError,
    TrainSample,
    build_causal_lm,
    build_train_batch,
    tiny_llama_config,
)

PROMPT, GOOD, BAD = [1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23]


def _model(seed: int = 0) -> torch.nn.Module:
    return build_causal_lm(tiny_llama_config(vocab_size=64), seed=seed)


def _preference_batch():
    """Two GRPO groups, each with a rewarded and an unrewarded answer to the same prompt."""

    def sample(answer, reward, group):
        return TrainSample(PROMPT + answer, [0] * 3 + [1] * 4, [0.0] * 7, reward, group)

    return build_train_batch([sample(GOOD, 1.0, 0), sample(BAD, 0.0, 0), sample(GOOD, 1.0, 1), sample(BAD, 0.0, 1)])


def _on_policy(trainer, batch):
    lp = trainer.compute_log_probs(batch)
    return dataclasses.replace(batch, behaviour_log_probs=torch.where(batch.loss_mask, lp, 0.0))


def _varied_batch(seed: int = 0, n: int = 6):
    """Sequences of different lengths with observation tokens inside, in 3 groups."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        length = 5 + (i * 3) % 7
        ids = torch.randint(4, 64, (length,), generator=gen).tolist()
        mask = [0, 0] + [int(x) for x in (torch.rand(length - 2, generator=gen) < 0.7).tolist()]
        mask[2] = 1
        lps = (-torch.rand(length, generator=gen) * 4).tolist()
        samples.append(TrainSample(ids, mask, lps, float(i % 3 == 0) + 0.1 * i, i % 3))
    return build_train_batch(samples)


def test_trainer_satisfies_the_policy_trainer_protocol():
    assert isinstance(TorchTrainer(_model()), PolicyTrainer)


def test_rl_signal_reduces_loss():
    trainer = TorchTrainer(_model(), TrainerConfig(lr=3e-3, micro_batch_size=4))
    batch = _on_policy(trainer, _preference_batch())
    start = trainer.compute_log_probs(batch)
    # PPO surrogate on a fixed batch: 0 at ratio 1, then down to the clip bound -eps * mean|A|
    losses = [trainer.train_step(batch)["loss"] for _ in range(4)]
    assert abs(losses[0]) < 1e-5
    assert min(losses[1:]) < -0.15
    # on-policy GRPO steps: the rewarded answer gains and the other loses probability
    for _ in range(8):
        metrics = trainer.train_step(_on_policy(trainer, batch))
        assert metrics["clip_frac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    end = trainer.compute_log_probs(batch)
    good_gain = float((end[0] - start[0])[batch.loss_mask[0]].sum())
    bad_gain = float((end[1] - start[1])[batch.loss_mask[1]].sum())
    assert good_gain > 5.0 and bad_gain < -5.0
    assert trainer.version == 12


def test_checkpoint_round_trip(tmp_path):
    config = TrainerConfig(lr=1e-3, micro_batch_size=2, weight_decay=0.01)
    trainer = TorchTrainer(_model(seed=0), config)
    batch = _varied_batch()
    trainer.train_step(batch)
    trainer.train_step(batch)
    path = tmp_path / "ckpt" / "trainer"
    trainer.save_checkpoint(path)
    trainer.save_checkpoint(path)  # over an existing checkpoint: swapped in whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["trainer"]
    assert sorted(p.name for p in path.iterdir()) == ["model.json", "model.safetensors", "optimizer.json",
                                                      "optimizer.safetensors", "trainer.json"]

    restored = TorchTrainer(_model(seed=1), config)
    restored.load_checkpoint(path)
    assert restored.version == 2
    for name, tensor in trainer.named_tensors().items():
        assert torch.equal(tensor, restored.named_tensors()[name]), name
    saved_opt, loaded_opt = trainer.optimizer.state_dict(), restored.optimizer.state_dict()
    assert saved_opt["param_groups"] == loaded_opt["param_groups"]
    for key, state in saved_opt["state"].items():
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[field], loaded_opt["state"][key][field])
    # the next step is bit-identical too, so nothing the optimizer needs was lost
    trainer.train_step(batch)
    restored.train_step(batch)
    for name, tensor in trainer.named_tensors().items():
        assert torch.equal(tensor, restored.named_tensors()[name]), name
    assert restored.version == trainer.version == 3


def test_load_checkpoint_rejects_unknown_format(tmp_path):
    path = tmp_path / "bad"
    path.mkdir()
    (path / "trainer.json").write_text(json.dumps({"format": 99, "version": 3}))
    with pytest.raises(TrainError, match=r"checkpoint_format must be one of \[2\], got 99"):
        TorchTrainer(_model()).load_checkpoint(path)


class _Hostile:
    """Unpickling this runs `marker.write_text(...)`: what a tampered checkpoint could do."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (self.marker, "code ran on load"))


def test_a_hostile_pickle_in_a_checkpoint_is_never_executed(tmp_path):
    """Issue 14 item 8: loading a checkpoint never unpickles, so a planted pickle cannot run code."""
    marker = tmp_path / "pwned"
    trainer = TorchTrainer(_model())
    good = tmp_path / "ckpt"
    trainer.save_checkpoint(good)
    # 1. the weights file replaced by a pickle: refused as not safetensors, nothing runs
    (good / "model.safetensors").write_bytes(pickle.dumps(_Hostile(marker)))
    with pytest.raises(TrainError, match="model.safetensors"):
        TorchTrainer(_model()).load_checkpoint(good)
    # 2. a format-1 file checkpoint (a torch.save pickle), as written before D19: refused, nothing runs
    legacy = tmp_path / "trainer.pt"
    torch.save({"format": 1, "model": _Hostile(marker)}, legacy)
    with pytest.raises(TrainError, match="a checkpoint directory written by save_checkpoint"):
        TorchTrainer(_model()).load_checkpoint(legacy)
    assert not marker.exists()


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_gradient_accumulation_equivalence(aggregation):
    batch = _varied_batch()
    model = _model()
    grads = {}
    for size in (6, 4, 2, 1):
        trainer = TorchTrainer(
            copy.deepcopy(model), TrainerConfig(micro_batch_size=size, loss=LossConfig(aggregation=aggregation))
        )
        sums = trainer.accumulate_gradients(batch)
        assert sums["micro_batches"] == -(-6 // size)
        grads[size] = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    for size in (4, 2, 1):
        for name, grad in grads[6].items():
            assert torch.allclose(grad, grads[size][name], rtol=1e-4, atol=1e-6), (size, name)


def test_non_finite_loss_raises_and_leaves_weights_and_version():
    trainer = TorchTrainer(_model())
    batch = _preference_batch()
    bad = batch.behaviour_log_probs.clone()
    bad[0, 4] = float("-inf")  # a policy token with log-prob -inf: ratio inf
    before = trainer.named_tensors()
    with pytest.raises(TrainError, match="the step's loss is finite"):
        trainer.train_step(dataclasses.replace(batch, behaviour_log_probs=bad, advantages=-batch.advantages))
    assert trainer.version == 0
    for name, tensor in trainer.named_tensors().items():
        assert torch.equal(tensor, before[name])


def test_kl_to_reference_model_and_named_tensor_export():
    model = _model()
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-2, loss=LossConfig(kl_coef=0.5)), reference_model=copy.deepcopy(model))
    batch = _on_policy(trainer, _preference_batch())
    first = trainer.train_step(batch)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    second = trainer.train_step(batch)
    assert second["kl"] > 0.0 and second["version"] == 2.0
    exported = trainer.named_tensors()
    assert set(exported) == set(model.state_dict())
    exported["lm_head.weight"].zero_()  # a copy: the trainer's weights are untouched
    assert model.lm_head.weight.abs().sum() > 0


def test_named_tensors_export_tied_weights_once():
    config = dataclasses.replace(tiny_llama_config(vocab_size=64), tie_word_embeddings=True)
    model = build_causal_lm(config)
    exported = TorchTrainer(model).named_tensors()
    assert set(exported) == {name for name, _ in model.named_parameters()}
    assert "lm_head.weight" not in exported and "model.embed_tokens.weight" in exported


def test_named_tensors_copies_unless_told_not_to():
    """copy=False hands out views of the live weights (a channel's pack snapshots them); the default copies."""
    model = build_causal_lm(tiny_llama_config(vocab_size=64))
    trainer = TorchTrainer(model)
    live = dict(model.named_parameters())
    copies, views = trainer.named_tensors(), trainer.named_tensors(copy=False)
    assert set(copies) == set(views)
    for name, view in views.items():
        assert view.data_ptr() == live[name].data_ptr() and not view.requires_grad
        assert copies[name].data_ptr() != live[name].data_ptr() and torch.equal(copies[name], view)


def test_trainer_config_rejects_bad_values():
    with pytest.raises(TrainError, match="micro_batch_size must be an integer in"):
        TrainerConfig(micro_batch_size=0)
    with pytest.raises(TrainError, match="lr must be > 0"):
        TrainerConfig(lr=0.0)
    with pytest.raises(TrainError, match="loss must be of type LossConfig"):
        TrainerConfig(loss={"kl_coef": 0.1})


def test_build_causal_lm_is_deterministic_and_keeps_the_caller_rng():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a, b = _model(seed=5), _model(seed=5)
    assert torch.equal(torch.rand(1), expected)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_a_trainer_restored_from_an_older_checkpoint_continues_at_the_runs_version(tmp_path):
    """D22: the rebuilt trainer has the checkpoint's weights and optimizer but the run's version counter."""
    config = TrainerConfig(lr=1e-3, micro_batch_size=2)
    trainer = TorchTrainer(_model(seed=0), config)
    batch = _varied_batch()
    trainer.train_step(batch)
    trainer.save_checkpoint(tmp_path / "trainer")
    trainer.train_step(batch)
    trainer.train_step(batch)  # version 3; the checkpoint holds version 1

    rebuilt = TorchTrainer(_model(seed=1), config)
    rebuilt.load_checkpoint(tmp_path / "trainer")
    weights = {k: v.clone() for k, v in rebuilt.named_tensors().items()}
    rebuilt.continue_at(trainer.version)
    assert rebuilt.version == 3
    assert all(torch.equal(weights[k], v) for k, v in rebuilt.named_tensors().items())  # only the number moved
    assert rebuilt.train_step(batch)["version"] == 4.0 and rebuilt.version == 4
    with pytest.raises(TrainError, match=r"version must be an integer in \[4, "):
        rebuilt.continue_at(2)  # versions never go back
    assert rebuilt.version == 4
