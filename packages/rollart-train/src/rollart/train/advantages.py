"""GRPO group-normalized advantages.

GRPO (DeepSeekMath) replaces a learned critic by the statistics of a group of responses to the
same prompt: A_i = (r_i - mean_g(r)) / (std_g(r) + eps). One advantage per sequence, broadcast
over the sequence's policy tokens by the loss.
"""

from __future__ import annotations

import torch

from rollart.train.errors import TrainError


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-sequence advantages: reward minus its group's mean, optionally over the group's std.

    The std is the population std (divide by n, not n-1) so a group of one is defined (its
    advantage is 0) instead of NaN. `normalize_std=False` gives the Dr.GRPO variant, which
    avoids up-weighting groups whose rewards barely differ.
    """
    # VAL: VAL_POSITIVE(eps, exc=TrainError)
    # >>> generated VAL_POSITIVE #fae1f4a830 (edit the annotation, not this block)
    if not eps > 0:
        raise TrainError(f"eps must be > 0, got {eps!r}")
    # <<< generated
    # AST: AST_PRECONDITION(rewards.dim() == 1 and rewards.shape == group_ids.shape, got=(tuple(rewards.shape), tuple(group_ids.shape)), msg="rewards and group_ids are 1-D of the same length", exc=TrainError)
    # >>> generated AST_PRECONDITION #362a28aa43 (edit the annotation, not this block)
    if not (rewards.dim() == 1 and rewards.shape == group_ids.shape):
        raise TrainError(f"Pre-condition: rewards and group_ids are 1-D of the same length, got {(tuple(rewards.shape), tuple(group_ids.shape))!r}")
    # <<< generated
    rewards = rewards.to(torch.float32)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.shape[0]
    sums = torch.zeros(num_groups, dtype=torch.float32).index_add_(0, inverse, rewards)
    means = sums / counts.to(torch.float32)
    centered = rewards - means[inverse]
    if not normalize_std:
        return centered
    sq = torch.zeros(num_groups, dtype=torch.float32).index_add_(0, inverse, centered * centered)
    stds = torch.sqrt(sq / counts.to(torch.float32))
    return centered / (stds[inverse] + eps)
