"""GRPO advantages and the batch builder: hand-computed values, properties, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollart.train.advantages import grpo_advantages
from rollart.train.batch import TrainSample, build_train_batch
from rollart.train.errors import TrainError


def test_grpo_advantages_hand_computed():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +-1
    # group 7: rewards 2, 4 -> mean 3, std 1 -> -1, +1
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.0, 4.0, 1.0])
    groups = torch.tensor([0, 0, 7, 0, 7, 0])
    adv = grpo_advantages(rewards, groups, eps=1e-12)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0]), atol=1e-6)


def test_grpo_advantages_without_std_is_centered_reward():
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 5.0]), torch.tensor([1, 1, 2]), normalize_std=False)
    assert adv.tolist() == [1.0, -1.0, 0.0]


def test_grpo_singleton_and_constant_groups_get_zero_advantage():
    adv = grpo_advantages(torch.tensor([5.0, 2.0, 2.0]), torch.tensor([0, 1, 1]))
    assert adv.tolist() == [0.0, 0.0, 0.0]


@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False, allow_subnormal=False)),
        min_size=1,
        max_size=24,
    ),
    st.booleans(),
)
def test_grpo_advantages_have_zero_mean_per_group(pairs, normalize_std):
    groups = torch.tensor([g for g, _ in pairs])
    rewards = torch.tensor([r for _, r in pairs], dtype=torch.float32)
    adv = grpo_advantages(rewards, groups, normalize_std=normalize_std)
    for g in groups.unique():
        sel = adv[groups == g]
        assert abs(float(sel.mean())) < 1e-3 * max(1.0, float(sel.abs().max()))
        if normalize_std and sel.numel() > 1 and float(rewards[groups == g].std(unbiased=False)) > 1e-3:
            # normalized to unit population std
            assert math.isclose(float(sel.std(unbiased=False)), 1.0, rel_tol=1e-3)


def test_grpo_rejects_mismatched_shapes():
    with pytest.raises(TrainError, match="rewards and group_ids"):
        grpo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))


def _sample(tokens, mask, reward=1.0, group=0, ref=None):
    return TrainSample(tokens, mask, [-0.5 * m for m in mask], reward, group, ref)


def test_build_train_batch_pads_right_and_aligns():
    batch = build_train_batch(
        [_sample([5, 6, 7, 8], [0, 0, 1, 1], 1.0, 0), _sample([9, 10, 11], [0, 1, 0], 0.0, 0)], pad_token_id=3
    )
    assert batch.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 11, 3]]
    assert batch.attention_mask.tolist() == [[True] * 4, [True, True, True, False]]
    assert batch.loss_mask.tolist() == [[False, False, True, True], [False, True, False, False]]
    assert batch.behaviour_log_probs.tolist() == [[0.0, 0.0, -0.5, -0.5], [0.0, -0.5, 0.0, 0.0]]
    assert batch.num_policy_tokens == 3 and batch.num_sequences == 2
    assert torch.allclose(batch.advantages, torch.tensor([1.0, -1.0]), atol=1e-5)
    assert batch.reference_log_probs is None
    assert batch.select(slice(1, 2)).input_ids.tolist() == [[9, 10, 11, 3]]


def test_build_train_batch_bad_input_names_the_field():
    with pytest.raises(TrainError, match="samples must not be empty"):
        build_train_batch([])
    with pytest.raises(TrainError, match=r"samples\[0\].policy_mask must have len\(token_ids\)=3"):
        build_train_batch([TrainSample([1, 2, 3], [0, 1], [0.0, 0.0, 0.0], 1.0, 0)])
    with pytest.raises(TrainError, match=r"samples\[0\].policy_mask\[0\] must be 0"):
        build_train_batch([_sample([1, 2], [1, 1])])
    with pytest.raises(TrainError, match="only 0 or 1"):
        build_train_batch([_sample([1, 2], [0, 2])])
    with pytest.raises(TrainError, match="at least one policy token"):
        build_train_batch([_sample([1, 2], [0, 0])])
    with pytest.raises(TrainError, match="reference_log_probs must be given for all samples or none"):
        build_train_batch([_sample([1, 2], [0, 1], ref=[0.0, 0.0]), _sample([1, 2], [0, 1])])
    with pytest.raises(TrainError, match="pad_token_id must be an integer"):
        build_train_batch([_sample([1, 2], [0, 1])], pad_token_id=-1)


@given(
    st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False),
    st.integers(1, 16),
    st.booleans(),
)
def test_grpo_group_of_equal_rewards_gets_exactly_zero(reward, size, normalize_std):
    # float32 statistics gave 0.0563 for seven rewards of 0.7 and 0.884 for seven of 100.1
    adv = grpo_advantages(torch.full((size,), reward, dtype=torch.float64), torch.zeros(size, dtype=torch.long),
                          normalize_std=normalize_std)
    assert adv.tolist() == [0.0] * size


@pytest.mark.parametrize("reward", [0.7, 100.1])
def test_grpo_seven_equal_rewards_from_float32_input_get_zero(reward):
    adv = grpo_advantages(torch.full((7,), reward, dtype=torch.float32), torch.zeros(7, dtype=torch.long))
    assert adv.tolist() == [0.0] * 7


@given(
    st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False),
    st.floats(1e-2, 10.0, allow_nan=False),
    st.integers(1, 7),
)
def test_grpo_small_real_difference_on_a_large_reward_is_kept(base, delta, ups):
    # float32 rounds 1e6 + 0.01 to 1e6 and the difference vanished; float64 keeps it
    rewards = torch.tensor([base + delta] * ups + [base] * (8 - ups), dtype=torch.float64)
    adv = grpo_advantages(rewards, torch.zeros(8, dtype=torch.long))
    assert adv.dtype == torch.float64
    assert all(a > 0.3 for a in adv[:ups].tolist()) and all(a < -0.3 for a in adv[ups:].tolist())
    assert math.isclose(float(adv.std(unbiased=False)), 1.0, rel_tol=1e-3)


def _one_turn_sample(reward: float, group: int) -> TrainSample:
    return TrainSample(token_ids=[1, 2, 3], policy_mask=[False, True, True], behaviour_log_probs=[0.0, -0.5, -0.5],
                       reward=reward, group_id=group)


def test_build_train_batch_equal_rewards_give_zero_and_close_rewards_stay_apart():
    batch = build_train_batch([_one_turn_sample(0.7, 0) for _ in range(8)] + [_one_turn_sample(1e6 + 0.01, 1), _one_turn_sample(1e6, 1)])
    assert batch.advantages[:8].tolist() == [0.0] * 8  # was 0.0563 each
    assert batch.advantages[8] > 0.99 and batch.advantages[9] < -0.99  # was 0, 0
    assert batch.advantages.dtype == torch.float32


def test_grpo_rejects_a_negative_zero_std_tolerance():
    with pytest.raises(TrainError, match="zero_std_tol"):
        grpo_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), zero_std_tol=-1.0)
