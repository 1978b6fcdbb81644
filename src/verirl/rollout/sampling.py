"""Turning next-token logits into tokens: temperature, top-k, top-p, greedy."""
from __future__ import annotations

from typing import Optional

import torch


def sample_next(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """logits: (B, V) -> tokens (B,)."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    # inverse CDF: one uniform number per row and a binary search in the cumulative weights, where
    # the Gumbel or exponential tricks draw one random number per vocabulary entry (151k per row
    # and step for Qwen's vocabulary). A token of probability 0 spans an empty interval and is
    # never picked.
    weights = torch.exp(logits - logits.max(-1, keepdim=True).values)
    cdf = weights.cumsum_(-1)
    u = torch.rand((logits.shape[0], 1), generator=generator, device=logits.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
