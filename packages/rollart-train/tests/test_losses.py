"""PPO-clip, k3 KL, aggregation and the assembled policy loss: hand values and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollart.train.batch import TrainBatch
from rollart.train.errors import TrainError
from rollart.train.losses import (
    AGGREGATIONS,
    LossConfig,
    kl_k3,
    masked_aggregate,
    policy_loss,
    ppo_clip_loss,
    token_entropy,
    token_log_probs,
)


def test_ppo_clip_hand_computed():
    behaviour = torch.zeros(1, 4)
    log_probs = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, ratio, clipped = ppo_clip_loss(log_probs, behaviour, adv, mask, 0.2, 0.2)
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, 0.8, 1.5]]), atol=1e-6)
    assert torch.allclose(ratio, torch.tensor([[1.5, 0.5, 0.5, 1.5]]), atol=1e-6)
    assert clipped.tolist() == [[True, False, True, False]]


def test_ppo_clip_higher_uses_its_own_upper_bound():
    loss, _, clipped = ppo_clip_loss(
        torch.log(torch.tensor([[1.25]])), torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1, dtype=torch.bool), 0.2, 0.28
    )
    assert torch.allclose(loss, torch.tensor([[-1.25]])) and not clipped.any()


def test_kl_k3_hand_computed_and_masked():
    log_probs = torch.tensor([[0.0, 0.0, 0.3]])
    ref = torch.tensor([[math.log(2.0), 0.0, float("nan")]])
    mask = torch.tensor([[True, True, False]])
    kl = kl_k3(log_probs, ref, mask)
    assert torch.allclose(kl, torch.tensor([[2.0 - math.log(2.0) - 1.0, 0.0, 0.0]]), atol=1e-6)


def test_masked_aggregate_modes_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("inf")]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert masked_aggregate(values, mask, "token_mean", 4, 2).item() == pytest.approx(2.5)
    assert masked_aggregate(values, mask, "seq_mean_token_mean", 4, 2).item() == pytest.approx(3.0)
    assert masked_aggregate(values, mask, "seq_mean_token_sum", 4, 2).item() == pytest.approx(5.0)
    with pytest.raises(TrainError, match="mode must be one of"):
        masked_aggregate(values, mask, "sum", 4, 2)


def test_token_log_probs_and_entropy_of_uniform_logits():
    logits = torch.zeros(2, 3, 4)
    ids = torch.tensor([[0, 1, 2], [3, 3, 3]])
    lp = token_log_probs(logits, ids)
    assert torch.allclose(lp, torch.tensor([[0.0, math.log(0.25), math.log(0.25)]] * 2))
    assert torch.allclose(token_entropy(logits), torch.tensor([[0.0, math.log(4), math.log(4)]] * 2))


def test_token_log_probs_picks_the_next_token_of_each_position():
    logits = torch.full((1, 3, 5), -1e4)
    logits[0, 0, 2] = 0.0  # position 0 predicts token 2 with certainty
    logits[0, 1, 4] = 0.0
    lp = token_log_probs(logits, torch.tensor([[1, 2, 3]]))
    assert lp[0, 1].item() == pytest.approx(0.0) and lp[0, 2].item() < -1e3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_token_log_probs_and_entropy_keep_float32_or_wider_dtypes(dtype):
    logits = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(3)).to(dtype)
    ids = torch.tensor([[0, 1, 2, 3], [5, 4, 3, 2]])
    expected = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    assert token_log_probs(logits, ids).dtype == expected
    assert token_entropy(logits).dtype == expected


def test_token_log_probs_and_entropy_pass_float64_gradcheck():
    # a silent float32 cast made the numerical and analytical gradients disagree
    logits = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4), requires_grad=True)
    ids = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1]])
    assert torch.autograd.gradcheck(lambda x: token_log_probs(x, ids), (logits,))
    assert torch.autograd.gradcheck(token_entropy, (logits,))


def test_loss_config_rejects_bad_values():
    with pytest.raises(TrainError, match="aggregation must be one of"):
        LossConfig(aggregation="mean")
    with pytest.raises(TrainError, match="clip_eps_low must be > 0"):
        LossConfig(clip_eps_low=0.0)
    with pytest.raises(TrainError, match="kl_coef must be >= 0"):
        LossConfig(kl_coef=-1.0)


def _batch(ids, mask, behaviour, adv, ref=None):
    b = ids.shape[0]
    return TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(mask),
        loss_mask=mask,
        behaviour_log_probs=behaviour,
        advantages=adv,
        rewards=torch.zeros(b),
        group_ids=torch.zeros(b, dtype=torch.long),
        reference_log_probs=ref,
    )


@st.composite
def masked_problem(draw):
    b = draw(st.integers(1, 4))
    t = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=gen) < 0.6
    mask[:, 0] = False
    mask[:, 1] = True  # at least one policy token per sequence
    log_probs = -torch.rand(b, t, generator=gen) * 3
    behaviour = log_probs + (torch.rand(b, t, generator=gen) - 0.5)
    ref = log_probs + (torch.rand(b, t, generator=gen) - 0.5)
    adv = torch.randn(b, generator=gen)
    mode = draw(st.sampled_from(AGGREGATIONS))
    return mask, log_probs, behaviour, ref, adv, mode


def _token_loss(log_probs, behaviour, ref, adv, mask, mode):
    pg, _, _ = ppo_clip_loss(log_probs, behaviour, adv, mask, 0.2, 0.3)
    n_tok, n_seq = int(mask.sum()), mask.shape[0]
    return masked_aggregate(pg, mask, mode, n_tok, n_seq) + 0.1 * masked_aggregate(
        kl_k3(log_probs, ref, mask), mask, mode, n_tok, n_seq
    )


@given(masked_problem())
def test_masked_tokens_never_affect_loss_or_gradients(problem):
    mask, log_probs, behaviour, ref, adv, mode = problem
    lp = log_probs.clone().requires_grad_(True)
    loss = _token_loss(lp, behaviour, ref, adv, mask, mode)
    loss.backward()
    assert torch.all(lp.grad[~mask] == 0)
    # garbage (nan, inf, huge) at masked positions changes nothing, and the gradient stays finite
    garbage = torch.where(mask, torch.zeros_like(log_probs), torch.full_like(log_probs, float("nan")))
    lp2 = torch.where(mask, log_probs, torch.full_like(log_probs, 1e9)).requires_grad_(True)
    loss2 = _token_loss(lp2, behaviour + garbage, ref - garbage.nan_to_num(nan=float("inf")), adv, mask, mode)
    loss2.backward()
    assert torch.allclose(loss, loss2)
    assert torch.allclose(lp.grad, lp2.grad) and torch.isfinite(lp2.grad).all()


@given(masked_problem())
def test_ratio_one_means_no_clip_and_minus_advantage_weighted_mean(problem):
    mask, log_probs, _, _, adv, mode = problem
    pg, ratio, clipped = ppo_clip_loss(log_probs, log_probs.clone(), adv, mask, 0.2, 0.2)
    assert not clipped.any() and torch.all(ratio == 1)
    loss = masked_aggregate(pg, mask, mode, int(mask.sum()), mask.shape[0])
    n_i = mask.sum(-1).float()
    if mode == "token_mean":
        expected = -(adv * n_i).sum() / n_i.sum()
    elif mode == "seq_mean_token_mean":
        expected = -adv.mean()
    else:
        expected = -(adv * n_i).mean()
    assert torch.allclose(loss, expected, atol=1e-5)


@given(masked_problem(), st.integers(1, 3))
def test_micro_batch_losses_add_up_to_the_batch_loss(problem, split):
    mask, log_probs, behaviour, ref, adv, mode = problem
    full = _token_loss(log_probs, behaviour, ref, adv, mask, mode)
    n_tok, n_seq = int(mask.sum()), mask.shape[0]
    total = torch.zeros(())
    for start in range(0, n_seq, split):
        s = slice(start, start + split)
        pg, _, _ = ppo_clip_loss(log_probs[s], behaviour[s], adv[s], mask[s], 0.2, 0.3)
        total = total + masked_aggregate(pg, mask[s], mode, n_tok, n_seq)
        total = total + 0.1 * masked_aggregate(kl_k3(log_probs[s], ref[s], mask[s]), mask[s], mode, n_tok, n_seq)
    assert torch.allclose(full, total, atol=1e-5)


@given(st.floats(-5, 5), st.floats(-5, 5))
def test_kl_k3_is_never_negative(a, b):
    assert kl_k3(torch.tensor([[a]]), torch.tensor([[b]]), torch.ones(1, 1, dtype=torch.bool)).item() >= 0


def test_policy_loss_assembles_terms_and_needs_reference_for_kl():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    ids = torch.tensor([[1, 2, 3, 4], [5, 4, 3, 2]])
    mask = torch.tensor([[False, True, True, False], [False, False, True, True]])
    lp = token_log_probs(logits, ids).detach()
    batch = _batch(ids, mask, lp.clone(), torch.tensor([1.0, -2.0]), ref=lp.clone())
    loss, metrics = policy_loss(logits, batch, LossConfig(kl_coef=0.5, entropy_coef=0.01), 4, 2)
    entropy = token_entropy(logits)
    expected = -(1.0 * 2 + -2.0 * 2) / 4 - 0.01 * entropy[mask].sum() / 4  # kl = 0 at equal log-probs
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["policy_tokens"] == 4 and metrics["ratio_sum"] == pytest.approx(4.0)
    assert metrics["kl_sum"] == pytest.approx(0.0, abs=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    with pytest.raises(TrainError, match="reference_log_probs must be set"):
        policy_loss(logits, _batch(ids, mask, lp, torch.ones(2)), LossConfig(kl_coef=0.1), 4, 2)
