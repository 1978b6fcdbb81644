"""Train/inference mismatch: importance weights and rejection of tokens sampled by a rollout engine
whose log-probs differ from the trainer's (Yao et al., "Your efficient RL framework secretly brings
you off-policy RL training"; veRL ``rollout_corr_helper``; TRL ``vllm_importance_sampling_*``)."""
from __future__ import annotations

from typing import Optional

import torch

MODES_IS = (None, "token", "sequence")
"""rollout_is: no weight, a truncated per-token ratio, or a truncated per-sequence ratio."""
MODES_RS = (None, "token", "sequence", "geometric")
"""rollout_rs: reject nothing, tokens, or whole sequences by their ratio product / geometric mean."""

_BOUND = 20.0  # log ratios are clamped to [-20, 20] before exp (veRL's SAFETY_BOUND, as kl.py)


def _exp(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(log_ratio, min=-_BOUND, max=_BOUND))


def rollout_correction(trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       rollout_is: Optional[str], is_threshold: float, rollout_rs: Optional[str],
                       rs_threshold: float, rs_threshold_lower: float = 0.0
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights and rejection for the rollout/trainer mismatch.

    trainer_logp, rollout_logp, mask: (B, T); lr_t = trainer_logp - rollout_logp (both detached;
    NaN, a log-prob the engine did not return, counts as lr 0 as in TRL), clamped to [-20, 20]
    before every exp. Returns (weights (B, T) float32 detached, rejected (B, T) bool).

    rollout_is: None (w = 1) | "token" (w_t = min(exp(lr_t), is_threshold)) | "sequence"
    (w = min(exp(sum_t lr_t), is_threshold) on every token of the sequence); truncated IS (TIS).
    rollout_rs: None | "token" (reject t when exp(lr_t) is outside [rs_threshold_lower, rs_threshold])
    | "sequence" (reject every token of a sequence whose exp(sum_t lr_t) is outside)
    | "geometric" (the same with exp(mean lr over the sequence's masked tokens)).
    rs_threshold_lower 0 is no lower bound (TRL's clip_min default; veRL's old rollout_rs_threshold_lower
    defaults to 1 / rs_threshold instead: pass that for veRL's behaviour).
    weights are 0 on rejected tokens and where mask == 0; ``rejected`` is False where mask == 0.
    What a rejected token does to the loss denominator is the caller's choice: veRL removes it from
    the response mask (it leaves the token-mean denominator), TRL multiplies its loss by 0 (it stays).

    TRL's vllm_importance_sampling_mode maps as: token_truncate = ("token", C, None); token_mask =
    ("token", C, "token", C); sequence_truncate = ("sequence", C, None); sequence_mask =
    ("sequence", C, "sequence", C), with C = vllm_importance_sampling_clip_max, and
    rs_threshold_lower = clip_min for the *_mask modes (TRL's *_truncate clip_min raises small
    weights instead, which has no equivalent here).
    """
    if rollout_is not in MODES_IS:
        raise ValueError(f"rollout_is must be one of {MODES_IS}, got {rollout_is!r}")
    if rollout_rs not in MODES_RS:
        raise ValueError(f"rollout_rs must be one of {MODES_RS}, got {rollout_rs!r}")
    if rollout_is is not None and not is_threshold > 0:
        raise ValueError(f"is_threshold must be > 0, got {is_threshold}")
    if rollout_rs is not None and not 0.0 <= rs_threshold_lower < rs_threshold:
        raise ValueError(f"need 0 <= rs_threshold_lower < rs_threshold, got {rs_threshold_lower}, {rs_threshold}")
    valid = mask.bool()  # (B, T)
    diff = trainer_logp.detach().float() - rollout_logp.detach().float()
    lr = torch.where(valid, torch.nan_to_num(diff, nan=0.0), torch.zeros_like(diff))  # (B, T), 0 off the mask
    seq_sum = lr.sum(-1, keepdim=True)  # (B, 1)
    seq_mean = seq_sum / valid.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)

    if rollout_is == "token":
        weights = torch.clamp(_exp(lr), max=is_threshold)  # (B, T)
    elif rollout_is == "sequence":
        weights = torch.clamp(_exp(seq_sum), max=is_threshold).expand_as(lr)  # (B, T)
    else:
        weights = torch.ones_like(lr)

    if rollout_rs is None:
        rejected = torch.zeros_like(valid)
    else:
        stat = {"token": lr, "sequence": seq_sum, "geometric": seq_mean}[rollout_rs]
        ratio = _exp(stat)  # (B, T) or (B, 1)
        outside = (ratio > rs_threshold) | (ratio < rs_threshold_lower)
        rejected = outside.expand_as(valid) & valid
    weights = torch.where(valid & ~rejected, weights, torch.zeros_like(weights))
    return weights.contiguous(), rejected
