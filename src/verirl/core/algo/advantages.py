"""Outcome advantages: one scalar reward per response -> one advantage per response.

Every estimator is ``fn(rewards (N,), group_size, scale="group", epsilon=1e-6, lengths=None) -> (N,)``
float32, with the ``group_size`` samples of one prompt contiguous. Quantities over "the batch" are
over the N rewards passed in: the caller passes the whole (global) batch.
"""
from __future__ import annotations

from typing import Optional

import torch

from verirl.core.registry import Registry

SCALES = ("group", "batch", "none")
"""What the centred rewards are divided by: the group's std (GRPO), the std of all N rewards
(TRL ``scale_rewards="batch"``), or nothing (Dr. GRPO)."""


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


def _std(r: torch.Tensor, scale: str) -> torch.Tensor:
    """The unbiased std that ``scale`` divides by, broadcastable to r (G, n); a single value has std 1."""
    if scale == "group":
        return r.std(dim=1, keepdim=True) if r.shape[1] > 1 else torch.ones_like(r[:, :1])  # (G, 1)
    if scale == "batch":
        return r.std().reshape(1, 1) if r.numel() > 1 else torch.ones_like(r[:1, :1])  # (1, 1)
    raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")


def _scale(centred: torch.Tensor, r: torch.Tensor, scale: str, epsilon: float) -> torch.Tensor:
    """centred (G, n) / (std + epsilon) per ``scale``; 0 where that sum is 0 (a zero std with epsilon 0)."""
    if scale == "none":
        return centred
    denom = _std(r, scale) + epsilon
    return torch.where(denom > 0, centred / denom.clamp(min=torch.finfo(denom.dtype).tiny), 0.0)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", epsilon: float = 1e-6,
                    lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Group-relative advantages: A_i = (r_i - mean(group)) / (std + epsilon).

    rewards: (N,) with N = groups * group_size, the samples of one prompt contiguous.
    ``scale``: "group" divides by the unbiased std of i's group (GRPO, DeepSeekMath; veRL
    ``compute_grpo_outcome_advantage``; TRL ``scale_rewards="group"``), "batch" by the unbiased
    std of all N rewards (TRL ``scale_rewards="batch"``), "none" not at all (Dr. GRPO,
    arXiv:2503.20783; veRL ``norm_adv_by_std_in_grpo=False``). A group whose rewards are all equal
    gets exactly 0 under every scale. ``lengths`` is unused. Returns (N,) float32.
    """
    r = _groups(rewards, group_size)  # (G, n)
    centred = r - r.mean(dim=1, keepdim=True)
    return _zero_constant_groups(_scale(centred, r, scale, epsilon), r).reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", epsilon: float = 1e-6,
                    lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Leave-one-out advantages (RLOO, arXiv:2402.14740; veRL ``compute_rloo_outcome_advantage``):
    A_i = r_i - mean(r_j, j != i over i's group), then divided as ``scale`` says (see `grpo_advantages`).

    rewards: (N,) with N = groups * group_size, the samples of one prompt contiguous.
    A group whose rewards are all equal (a group of one sample too) gets exactly 0.
    ``lengths`` is unused. Returns (N,) float32.
    """
    r = _groups(rewards, group_size)  # (G, n)
    baseline = (r.sum(dim=1, keepdim=True) - r) / max(group_size - 1, 1)
    centred = r - baseline
    return _zero_constant_groups(_scale(centred, r, scale, epsilon), r).reshape(-1)


_WHITEN_EPS = 1e-8  # veRL's masked_mean / masked_whiten constants


def reinforce_plus_plus_baseline_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group",
                                            epsilon: float = 1e-6,
                                            lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
    """REINFORCE++-baseline (arXiv:2501.03262; veRL
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``): c_i = r_i - mean(group), then
    whitened over the batch's response tokens: A_i = (c_i - m) / sqrt(v + 1e-8).

    veRL repeats c_i over the L_i tokens of response i and applies ``masked_whiten``, so each
    response weighs its length: with M = sum_i L_i, m = sum_i L_i c_i / (M + 1e-8) and
    v = sum_i L_i (c_i - m)^2 / (M + 1e-8) * M / (M - 1) (Bessel over tokens).
    rewards: (N,), the samples of one prompt contiguous; lengths: (N,) response lengths in tokens
    (None: every response weighs 1). A response of length 0 gets 0 (it has no token).
    As veRL: ``scale`` and ``epsilon`` are ignored (the 1e-8 above is veRL's); a group of one
    sample has baseline 0; a group whose rewards are all equal is NOT forced to 0 (its c_i = 0
    becomes -m / sqrt(v)); fewer than two tokens in all raises, as veRL's masked_var does.
    Returns (N,) float32.
    """
    r = _groups(rewards, group_size)  # (G, n)
    centred = (r - r.mean(dim=1, keepdim=True) if group_size > 1 else r).reshape(-1)  # (N,)
    if lengths is None:
        weight = torch.ones_like(centred)  # (N,)
    else:
        if lengths.shape != centred.shape:
            raise ValueError(f"lengths must have shape {tuple(centred.shape)}, got {tuple(lengths.shape)}")
        weight = lengths.to(centred.device, torch.float32)  # (N,)
    total = weight.sum()
    if float(total) <= 1.0:
        raise ValueError(f"whitening needs at least two response tokens in the batch, got {float(total):g}")
    mean = (weight * centred).sum() / (total + _WHITEN_EPS)
    var = (weight * (centred - mean).square()).sum() / (total + _WHITEN_EPS) * (total / (total - 1))
    adv = (centred - mean) * torch.rsqrt(var + _WHITEN_EPS)
    return torch.where(weight > 0, adv, torch.zeros_like(adv))


ADVANTAGE_ESTIMATORS = Registry("algo.adv_estimator", {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
})
