"""Properties of TorchTrainer: masked positions never reach the gradients, and the weight
version only moves by successful steps or an explicit checkpoint restore (design/000-overview.md §5:
versions seen downstream never go backwards unless the run is restored)."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rollart.train import (
    LossConfig,
    TorchTrainer,
    TrainerConfig,
    TrainError,
    TrainSample,
    build_causal_lm,
    build_train_batch,
    tiny_llama_config,
)

MICRO_CONFIG = tiny_llama_config(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)


def _batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(4):
        n = 4 + i
        ids = torch.randint(1, 32, (n,), generator=gen).tolist()
        mask = [0] + [int(x) for x in (torch.rand(n - 1, generator=gen) < 0.6).tolist()]
        mask[1] = 1
        lps = (-torch.rand(n, generator=gen) * 2).tolist()
        samples.append(TrainSample(ids, mask, lps, float(i % 2), i // 2, reference_log_probs=lps))
    return build_train_batch(samples)


@settings(max_examples=15)
@given(st.integers(0, 10_000), st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]))
def test_garbage_at_masked_positions_never_reaches_gradients(seed, aggregation):
    batch = _batch(seed)
    config = TrainerConfig(micro_batch_size=3, loss=LossConfig(aggregation=aggregation, kl_coef=0.1, entropy_coef=0.01))
    model = build_causal_lm(MICRO_CONFIG, seed=0)
    clean = TorchTrainer(model, config)
    clean.accumulate_gradients(batch)
    reference_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    garbage = torch.where(batch.loss_mask, 0.0, float("nan"))
    dirty = dataclasses.replace(
        batch,
        behaviour_log_probs=batch.behaviour_log_probs + garbage,
        reference_log_probs=batch.reference_log_probs - garbage.nan_to_num(nan=float("inf")),
    )
    TorchTrainer(model, config).accumulate_gradients(dirty)
    for name, param in model.named_parameters():
        assert torch.equal(param.grad, reference_grads[name]), name


class TrainerVersionMachine(RuleBasedStateMachine):
    """Steps, failing steps, checkpoints and restores in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.trainer = TorchTrainer(build_causal_lm(MICRO_CONFIG, seed=0), TrainerConfig(lr=1e-3, micro_batch_size=2))
        self.expected_version = 0
        self.saved: dict[int, tuple[int, dict[str, torch.Tensor]]] = {}
        self.batch = _batch(1)

    @rule()
    def good_step(self):
        metrics = self.trainer.train_step(self.batch)
        self.expected_version += 1
        assert metrics["version"] == self.expected_version

    @rule()
    def failing_step(self):
        bad = self.batch.behaviour_log_probs.clone()
        row = int(torch.nonzero(self.batch.advantages > 0)[0])
        col = int(torch.nonzero(self.batch.loss_mask[row])[0])
        bad[row, col] = float("-inf")  # ratio inf on a token whose (negated) advantage is < 0
        before = self.trainer.named_tensors()
        with pytest.raises(TrainError, match="loss is finite"):
            self.trainer.train_step(dataclasses.replace(self.batch, behaviour_log_probs=bad, advantages=-self.batch.advantages))
        for name, tensor in self.trainer.named_tensors().items():
            assert torch.equal(tensor, before[name]), name

    @rule(slot=st.integers(0, 1))
    def save(self, slot):
        self.trainer.save_checkpoint(f"{self.tmp.name}/{slot}.pt")
        self.saved[slot] = (self.trainer.version, self.trainer.named_tensors())

    @precondition(lambda self: bool(self.saved))
    @rule(data=st.data())
    def restore(self, data):
        slot = data.draw(st.sampled_from(sorted(self.saved)))
        self.trainer.load_checkpoint(f"{self.tmp.name}/{slot}.pt")
        version, weights = self.saved[slot]
        self.expected_version = version
        for name, tensor in self.trainer.named_tensors().items():
            assert torch.equal(tensor, weights[name]), name

    @invariant()
    def version_matches_successful_steps(self):
        assert self.trainer.version == self.expected_version

    def teardown(self):
        self.tmp.cleanup()


TestTrainerVersionMachine = TrainerVersionMachine.TestCase
TestTrainerVersionMachine.settings = settings(max_examples=10, stateful_step_count=8, deadline=None)
