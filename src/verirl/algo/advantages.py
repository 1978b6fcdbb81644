"""Outcome advantages: one scalar reward per response -> one advantage per response."""
from __future__ import annotations

import torch

from verirl.registry import Registry


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """rewards (N,) -> (N / group_size, group_size) float32, one prompt's samples per row."""
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    return rewards.float().view(-1, group_size)


def _zero_constant_groups(adv: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Exactly 0 for every sample of a group whose rewards are all equal. Computed, such a group's
    advantages are float rounding divided by epsilon: eight rewards of -0.4 in float32 have a mean
    3e-8 away from -0.4 and a std of 3e-8, so (r - mean) / (std + 1e-6) = 0.0289, a made-up signal."""
    constant = (r == r[:, :1]).all(dim=1, keepdim=True)  # (G, 1)
    return torch.where(constant, torch.zeros_like(adv), adv)


def _divide_by_std(centred: torch.Tensor, r: torch.Tensor, epsilon: float) -> torch.Tensor:
    """centred / (unbiased std of each group of r + epsilon); 0 where that sum is 0 (a constant group
    with epsilon 0). A group of one sample has std 1."""
    std = r.std(dim=1, keepdim=True) if r.shape[1] > 1 else torch.ones_like(r[:, :1])
    denom = std + epsilon
    return torch.where(denom > 0, centred / denom.clamp(min=torch.finfo(denom.dtype).tiny), 0.0)


def grpo_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = True,
                    epsilon: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages (GRPO).

    rewards: (N,) with N = groups * group_size, the samples of one prompt contiguous.
    Returns (N,): (r - mean(group)) / (std(group) + epsilon), std unbiased (as veRL and TRL);
    without the division when ``norm_by_std`` is False (Dr. GRPO). A group whose rewards
    are all equal gets zero advantage.
    """
    r = _groups(rewards, group_size)  # (G, n)
    centred = r - r.mean(dim=1, keepdim=True)
    adv = _divide_by_std(centred, r, epsilon) if norm_by_std else centred
    return _zero_constant_groups(adv, r).reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = False,
                    epsilon: float = 1e-6) -> torch.Tensor:
    """Leave-one-out advantages (RLOO).

    rewards: (N,) with N = groups * group_size, the samples of one prompt contiguous.
    Returns (N,): r_i - mean(r_j, j != i) over the other samples of i's group, divided by
    (std(group) + epsilon), std unbiased, when ``norm_by_std`` is True (as in `grpo_advantages`).
    A group whose rewards are all equal (a group of one sample too) gets zero advantage.
    """
    r = _groups(rewards, group_size)  # (G, n)
    baseline = (r.sum(dim=1, keepdim=True) - r) / max(group_size - 1, 1)
    centred = r - baseline
    adv = _divide_by_std(centred, r, epsilon) if norm_by_std else centred
    return _zero_constant_groups(adv, r).reshape(-1)


ADVANTAGE_ESTIMATORS = Registry("algo.adv_estimator", {"grpo": grpo_advantages, "rloo": rloo_advantages})
