"""Token log-probabilities and entropy from logits, and the high-entropy token mask."""
from __future__ import annotations

import torch


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits: (B, T, V), labels: (B, T) -> (B, T) log p(label)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """logits: (B, T, V) -> (B, T) entropy of the softmax, in nats."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """Keep the top ``quantile`` fraction of tokens by entropy (Wang et al., "Beyond the 80/20 rule",
    arXiv:2506.01939; TRL ``top_entropy_quantile`` / ``GRPOTrainer.get_high_entropy_mask``).

    entropy, mask: (B, T). Returns (B, T) bool: entropy >= torch.quantile(masked entropies, 1 - quantile)
    (linear interpolation); quantile 1.0 keeps every masked token. Always False where mask == 0 and
    everywhere when no token is masked in. The quantile is over the tokens passed in (TRL gathers
    them from every process first: pass the global tokens for the same threshold).
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    keep = mask.bool()
    values = entropy[keep].float()  # (K,)
    if values.numel() == 0:
        return torch.zeros_like(keep)
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropy.float() >= threshold) & keep
