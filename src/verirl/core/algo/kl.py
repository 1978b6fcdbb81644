"""Per-token KL estimators between the policy and a frozen reference (Schulman's k1/k2/k3)."""
from __future__ import annotations

import torch

from verirl.core.registry import Registry


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def _abs(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()


def _k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp).square()


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance KL: exp(ref - logp) - (ref - logp) - 1 >= 0, clamped to [-10, 10] as veRL does."""
    log_ratio = torch.clamp(ref_logp - logp, min=-20.0, max=20.0)
    kl = torch.exp(log_ratio) - log_ratio - 1.0
    return torch.clamp(kl, min=-10.0, max=10.0)


KL_ESTIMATORS = Registry("algo.kl_type", {"kl": _k1, "k1": _k1, "abs": _abs, "mse": _k2, "k2": _k2,
                                           "low_var_kl": _k3, "k3": _k3})


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """logp, ref_logp: (B, T) token log-probs -> (B, T) per-token KL estimate."""
    return KL_ESTIMATORS[kind](logp, ref_logp)
