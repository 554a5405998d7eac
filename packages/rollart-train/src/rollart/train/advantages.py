"""GRPO group-normalized advantages.

GRPO (DeepSeekMath) replaces a learned critic by the statistics of a group of responses to the
same prompt: A_i = (r_i - mean_g(r)) / (std_g(r) + eps). One advantage per sequence, broadcast
over the sequence's policy tokens by the loss.

The statistics are computed in float64: in float32 a group of equal rewards (seven of 0.7) has a
mean one ulp off, and dividing that residue by `std + eps` turned it into advantages of 0.056;
float32 also rounds 1e6 + 0.01 to 1e6, erasing a real difference. A group whose std is below a
tolerance relative to its rewards' magnitude is "all equal" and gets exactly zero advantage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollart import checks as check
from rollart.train.errors import TrainError

if TYPE_CHECKING:
    import torch  # annotations only: the simulator imports this module without torch (D31)


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
    zero_std_tol: float = 1e-9,
) -> torch.Tensor:
    """Per-sequence advantages: reward minus its group's mean, optionally over the group's std.

    The std is the population std (divide by n, not n-1) so a group of one is defined (its
    advantage is 0) instead of NaN. `normalize_std=False` gives the Dr.GRPO variant, which
    avoids up-weighting groups whose rewards barely differ. A group whose std is at most
    `zero_std_tol * max(1, |group mean|)` carries no signal (equal rewards up to rounding) and
    gets exactly 0 in both variants. Computed in float64, returned in the rewards' floating dtype
    (float64 for integer rewards).
    """
    import torch

    # VAL: VAL_POSITIVE(eps, exc=TrainError)
    check.positive("eps", eps, exc=TrainError)  # generated #83a4215c6a
    # VAL: VAL_NON_NEGATIVE(zero_std_tol, exc=TrainError)
    check.non_negative("zero_std_tol", zero_std_tol, exc=TrainError)  # generated #d07f500a78
    # AST: AST_PRECONDITION(rewards.dim() == 1 and rewards.shape == group_ids.shape, got=(tuple(rewards.shape), tuple(group_ids.shape)), msg="rewards and group_ids are 1-D of the same length", exc=TrainError)
    check.precondition(rewards.dim() == 1 and rewards.shape == group_ids.shape, "rewards and group_ids are 1-D of the same length", got_lazy=lambda: (tuple(rewards.shape), tuple(group_ids.shape)), exc=TrainError)  # generated #307cfc34bd
    rewards_dtype, rewards = rewards.dtype, rewards.to(torch.float64)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.shape[0]
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, rewards)
    means = sums / counts.to(torch.float64)
    centered = rewards - means[inverse]
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, centered * centered)
    stds = torch.sqrt(sq / counts.to(torch.float64))
    scale = means.abs().clamp(min=1.0)  # the rounding residue of equal rewards scales with their value
    flat = (stds <= zero_std_tol * scale)[inverse]
    advantages = centered / (stds[inverse] + eps) if normalize_std else centered
    out_dtype = rewards_dtype if rewards_dtype.is_floating_point else torch.float64
    return torch.where(flat, torch.zeros_like(advantages), advantages).to(out_dtype)
