"""The clipped policy loss and named loss-aggregation modes."""
from __future__ import annotations

from typing import Optional

import torch

from verirl.registry import Registry


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        clip_low: float = 0.2, clip_high: float = 0.2
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO/GRPO clipped surrogate, per token.

    logp, old_logp: (B, T); advantages: (B,) or (B, T).
    Returns (loss (B, T), clipped (B, T) bool): loss = -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(torch.clamp(logp - old_logp, min=-20.0, max=20.0))
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped)


def _token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: Optional[float], num_seqs: Optional[float]):
    denom = mask.sum() if num_tokens is None else num_tokens
    return (values * mask).sum() / max(float(denom), 1.0)


def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs):
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    denom = mask.shape[0] if num_seqs is None else num_seqs
    return per_seq.sum() / max(float(denom), 1.0)


def _seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, num_tokens, num_seqs):
    per_seq = (values * mask).sum(-1)  # (B,)
    denom = mask.shape[0] if num_seqs is None else num_seqs
    return per_seq.sum() / max(float(denom), 1.0)


AGGREGATIONS = Registry("algo.loss_agg_mode", {
    "token-mean": _token_mean,  # every token of the mini-batch weighs the same (DAPO, veRL default)
    "seq-mean-token-mean": _seq_mean_token_mean,  # each sequence weighs the same (original GRPO, TRL "grpo")
    "seq-mean-token-sum": _seq_mean_token_sum,  # Dr. GRPO-style sum over tokens, mean over sequences
})


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              num_tokens: Optional[float] = None, num_seqs: Optional[float] = None) -> torch.Tensor:
    """Reduce a (B, T) per-token quantity to a scalar under ``mask`` (B, T).

    ``num_tokens`` / ``num_seqs`` are the totals of the whole mini-batch when this is one
    micro-batch of it: summing the micro-batch results then equals the full mini-batch
    value exactly, which makes gradient accumulation exact. Default: this batch's own.
    """
    return AGGREGATIONS[mode](values, mask.to(values.dtype), num_tokens, num_seqs)
