"""Outcome advantages: one scalar reward per response -> one advantage per response."""
from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = True,
                    epsilon: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages (GRPO).

    rewards: (N,) with N = groups * group_size, the samples of one prompt contiguous.
    Returns (N,): (r - mean(group)) / (std(group) + epsilon), std unbiased (as veRL and TRL);
    without the division when ``norm_by_std`` is False (Dr. GRPO). A group whose rewards
    are all equal gets zero advantage.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(rewards.shape)}")
    r = rewards.float().view(-1, group_size)  # (G, n)
    centred = r - r.mean(dim=1, keepdim=True)
    if norm_by_std:
        std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.ones_like(r[:, :1])
        denom = std + epsilon
        centred = torch.where(denom > 0, centred / denom.clamp(min=torch.finfo(denom.dtype).tiny), 0.0)
    return centred.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int, norm_by_std: bool = False,
                    epsilon: float = 1e-6) -> torch.Tensor:
    """Leave-one-out baseline: r_i - mean(r_j, j != i). rewards: (N,) -> (N,)."""
    r = rewards.float().view(-1, group_size)
    baseline = (r.sum(dim=1, keepdim=True) - r) / max(group_size - 1, 1)
    return (r - baseline).reshape(-1)


ADVANTAGE_ESTIMATORS = {"grpo": grpo_advantages, "rloo": rloo_advantages}
