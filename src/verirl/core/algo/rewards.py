"""Reward shaping, multi-rule aggregation and group filtering: scores (N,) -> rewards (N,) or a group mask.

As in `verirl.core.algo.advantages`, the ``group_size`` samples of one prompt are contiguous.
"""
from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO overlong reward shaping (arXiv:2503.14476, eq. 13; veRL's DAPO reward manager):
    -factor * min(1, (L - (max_len - buffer)) / buffer) when L > max_len - buffer, else 0.

    lengths: (N,) response lengths in tokens. Returns (N,) float32 <= 0, to add to the reward.
    (veRL does not cap at -factor; the two agree for every L <= max_len, which generation ensures.)
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"overlong buffer must be in [1, max_len={max_len}], got {buffer}")
    exceed = lengths.float() - (max_len - buffer)  # (N,)
    return -factor * torch.clamp(exceed / buffer, min=0.0, max=1.0)


def _nanstd(x: torch.Tensor) -> torch.Tensor:
    """(G, n, K) -> (G, 1, K) unbiased std over dim 1 ignoring NaN (NaN with fewer than two values)."""
    mean = torch.nanmean(x, dim=1, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=1, keepdim=True).float()
    var = torch.nansum((x - mean).square(), dim=1, keepdim=True) / (count - 1).clamp(min=1.0)
    return torch.where(count > 1, var.sqrt(), torch.full_like(var, float("nan")))


def normalize_then_sum(per_rule: dict[str, torch.Tensor], weights: dict[str, float], group_size: int,
                       epsilon: float = 1e-4) -> torch.Tensor:
    """Normalise each rule's scores within each group, then sum with weights (GDPO; TRL
    multi_objective_aggregation="normalize_then_sum"): reward_i = nansum_k w_k (s_ik - nanmean_g s_k) /
    (nanstd_g s_k + epsilon), nanstd unbiased.

    per_rule: name -> (N,) scores, NaN where the rule does not apply to that sample (it then adds 0);
    weights: name -> w_k (a rule without a weight weighs 1). Returns (N,) float32. A rule whose
    applicable scores in a group are all equal (or fewer than two) adds exactly 0 there: TRL adds
    float rounding / epsilon for equal values (and NaN -> 0 for a single one), which is 0 whenever the
    group mean is exact. A sample that no rule applies to gets 0 (TRL leaves it out of its batch
    statistics and gives it advantage 0). TRL then whitens this sum over the batch; as each rule's
    normalised scores sum to 0 within a group, that is `grpo_advantages` with scale="batch" (epsilon 1e-4).
    """
    if not per_rule:
        raise ValueError("normalize_then_sum needs at least one rule")
    unknown = sorted(set(weights) - set(per_rule))
    if unknown:
        raise ValueError(f"weights name rules that have no scores: {unknown}; rules: {sorted(per_rule)}")
    names = list(per_rule)
    scores = torch.stack([per_rule[k].float() for k in names], dim=-1)  # (N, K)
    if scores.dim() != 2 or scores.shape[0] % group_size:
        raise ValueError(f"each rule needs (N,) scores with N a multiple of group_size={group_size}, "
                         f"got {tuple(scores.shape[:-1])}")
    grouped = scores.view(-1, group_size, len(names))  # (G, n, K)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)  # (G, 1, K)
    normed = (grouped - mean) / (_nanstd(grouped) + epsilon)  # (G, n, K)
    applicable = ~torch.isnan(grouped)
    first = torch.where(applicable, grouped, float("inf")).amin(dim=1, keepdim=True)
    last = torch.where(applicable, grouped, float("-inf")).amax(dim=1, keepdim=True)
    constant = first >= last  # (G, 1, K): all applicable scores equal, or none / one applicable
    normed = torch.where(constant & applicable, torch.zeros_like(normed), normed)
    w = torch.tensor([float(weights.get(k, 1.0)) for k in names], device=scores.device)  # (K,)
    return torch.nansum(normed * w, dim=-1).reshape(-1)


def informative_groups(metric: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO dynamic sampling (arXiv:2503.14476; veRL's DAPO trainer keeps a prompt when its metric's
    std > 0 or it has a single sample): True for the groups whose metric is not all equal, and for
    every group when group_size is 1.

    metric: (N,), the samples of one prompt contiguous. Returns (G,) bool, G = N / group_size.
    Compares values exactly (veRL's np.std can be a rounding-size positive for equal values).
    """
    if metric.dim() != 1 or metric.numel() % group_size:
        raise ValueError(f"metric must be 1-D with a multiple of group_size={group_size} entries, "
                         f"got shape {tuple(metric.shape)}")
    m = metric.view(-1, group_size)  # (G, n)
    if group_size == 1:
        return torch.ones(m.shape[0], dtype=torch.bool, device=metric.device)
    return (m != m[:, :1]).any(dim=1)
