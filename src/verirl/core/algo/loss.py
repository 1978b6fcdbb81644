"""Policy losses (per token, before masking) and named loss-aggregation modes.

A policy loss is ``fn(logp (B, T), old_logp (B, T), advantages (B,) or (B, T), mask (B, T) float,
p: PolicyLossParams) -> (loss (B, T), clipped (B, T) bool)``: ``loss`` is the per-token loss
before masking and aggregation, ``clipped`` the tokens counted in the clip fraction (always
False where mask == 0). `aggregate` then reduces ``loss`` under the mask.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from verirl.core.registry import Registry

_LOG_RATIO_BOUND = 20.0  # log ratios are clamped to [-20, 20] before exp, as veRL's vanilla loss


def _ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """(B, T) pi / pi_old = exp(clamp(logp - old_logp, -20, 20))."""
    return torch.exp(torch.clamp(logp - old_logp, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND))


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """advantages (B,) -> (B, 1); (B, T) unchanged."""
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        clip_low: float = 0.2, clip_high: float = 0.2
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO/GRPO clipped surrogate, per token.

    logp, old_logp: (B, T); advantages: (B,) or (B, T).
    Returns (loss (B, T), clipped (B, T) bool): loss = -min(ratio * A, clip(ratio, 1 - low, 1 + high) * A).
    """
    advantages = _per_token(advantages)
    ratio = _ratio(logp, old_logp)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped)


@dataclass(frozen=True)
class PolicyLossParams:
    """The scalars the policy losses read; defaults are veRL's (``ActorConfig`` / ``PolicyLossConfig``)."""

    clip_low: float = 0.2  # ratio clipped below at 1 - clip_low
    clip_high: float = 0.2  # ratio clipped above at 1 + clip_high
    clip_ratio_c: float = 3.0  # dual-clip: for A < 0 the loss is at most -A * clip_ratio_c (arXiv:1912.09729)
    clip_ratio_max: float = 5.0  # CISPO's cap on the importance weight (MiniMax-M1 / ScaleRL epsilon_max;
    #                              TRL's epsilon_high when loss_type="cispo")
    clip_cov_ratio: float = 0.0002  # Clip-Cov: fraction of valid tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # Clip-Cov: a token is a candidate when lb < its covariance term < ub
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # KL-Cov: fraction of valid tokens given the |log ratio| penalty
    ppo_kl_coef: float = 0.1  # KL-Cov: coefficient of that penalty (veRL PolicyLossConfig default)


CLIP_DEFAULTS: dict[str, tuple[float, float]] = {
    "vanilla": (0.2, 0.2),
    "dual_clip": (0.2, 0.2),
    "gspo": (3e-4, 4e-4),  # GSPO paper (arXiv:2507.18071): a sequence ratio moves far less than a token's
    "cispo": (0.2, 0.2),  # unused: CISPO caps the weight at clip_ratio_max and has no lower clip
    "clip_cov": (0.2, 0.2),
    "kl_cov": (0.2, 0.2),
}
"""(clip_low, clip_high) per policy loss when the user sets neither."""


def _vanilla(logp, old_logp, advantages, mask, p: PolicyLossParams):
    """PPO clipped surrogate (`clipped_policy_loss`): -min(r A, clip(r, 1 - low, 1 + high) A);
    TRL loss_type grpo/bnpo/dapo. (veRL's "vanilla" also applies the dual clip: see `dual_clip`.)"""
    loss, clipped = clipped_policy_loss(logp, old_logp, advantages, p.clip_low, p.clip_high)
    return loss, clipped & (mask > 0)


def _dual_clip(logp, old_logp, advantages, mask, p: PolicyLossParams):
    """Dual-clip PPO (Ye et al., arXiv:1912.09729; veRL ``compute_policy_loss_vanilla``): the vanilla
    loss, and for A < 0 at most -A * clip_ratio_c. ``clipped``: the union of veRL's pg_clipfrac
    (the PPO clip acts) and pg_clipfrac_lower (A < 0 and the dual clip acts)."""
    if p.clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {p.clip_ratio_c}")
    adv = _per_token(advantages)  # (B, 1) or (B, T)
    loss, clipped = clipped_policy_loss(logp, old_logp, advantages, p.clip_low, p.clip_high)  # (B, T)
    lower = -adv * p.clip_ratio_c
    dual = (adv < 0) & (loss > lower)  # (B, T)
    loss = torch.where(adv < 0, torch.minimum(loss, lower), loss)
    return loss, (clipped | dual) & (mask > 0)


def _gspo(logp, old_logp, advantages, mask, p: PolicyLossParams):
    """GSPO (Zheng et al., arXiv:2507.18071; veRL ``compute_policy_loss_gspo``; TRL
    importance_sampling_level="sequence"): s_i = exp(mean over i's tokens of (logp - old)); per token
    s_i,t = sg[s_i] * exp(logp_t - sg[logp_t]) (value s_i, gradient s_i * d logp_t);
    loss = -min(s A, clip(s, 1 - low, 1 + high) A). Equals TRL's (B, 1) loss broadcast over the tokens,
    in value and gradient, under token-mean and seq-mean-token-mean. The log ratio is clamped to
    [-20, 20] (veRL clamps it at 10 above, TRL not at all: only an extreme ratio tells them apart)."""
    maskf = mask.to(logp.dtype)
    seq = ((logp - old_logp) * maskf).sum(-1) / maskf.sum(-1).clamp(min=1.0)  # (B,)
    log_s = logp - logp.detach() + seq.detach().unsqueeze(-1)  # (B, T)
    s = torch.exp(torch.clamp(log_s, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND))  # (B, T)
    adv = _per_token(advantages)
    unclipped = -s * adv
    clipped = -torch.clamp(s, 1.0 - p.clip_low, 1.0 + p.clip_high) * adv
    return torch.maximum(unclipped, clipped), (clipped > unclipped) & (mask > 0)


def _cispo(logp, old_logp, advantages, mask, p: PolicyLossParams):
    """CISPO (MiniMax-M1, arXiv:2506.13585; TRL loss_type="cispo"): loss = -sg[min(r, clip_ratio_max)] * A * logp.
    ``clipped``: r > clip_ratio_max and A > 0, as TRL's cispo_clip_ratio. clip_low / clip_high are unused
    (veRL's compute_policy_loss_cispo instead clamps r to [1 - clip_low, 1 + clip_high])."""
    adv = _per_token(advantages)
    ratio = _ratio(logp, old_logp)  # (B, T)
    weight = torch.clamp(ratio, max=p.clip_ratio_max).detach()
    loss = -weight * adv * logp
    return loss, (ratio > p.clip_ratio_max) & (adv > 0) & (mask > 0)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """veRL's masked_mean: sum(values * mask) / (sum(mask) + 1e-8)."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _clip_cov(logp, old_logp, advantages, mask, p: PolicyLossParams):
    """Clip-Cov (Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617; veRL
    ``compute_policy_loss_clip_cov``): the PPO clipped loss, with the gradient cut (loss set to 0) on
    up to max(int(clip_cov_ratio * valid tokens), 1) tokens drawn at random among the valid tokens
    that the PPO clip leaves alone and whose centred covariance term
    (A_t - mean A) * (logp_t - mean logp), means over the valid tokens, lies in (clip_cov_lb, clip_cov_ub).
    ``clipped``: the tokens cut (veRL's pg_clipfrac for clip_cov counts only these).
    The means and the draw are over the tokens of the batch passed in (in the trainer one micro-batch,
    as veRL), so this is not exact under gradient accumulation. veRL draws with the global torch RNG;
    here a private generator is seeded from the candidates' own values (their float bits), so the same
    batch always cuts the same tokens and no global random state is read or advanced."""
    maskf = mask.to(logp.dtype)
    valid = maskf > 0
    adv = _per_token(advantages).expand_as(logp)  # (B, T)
    loss, by_clip = clipped_policy_loss(logp, old_logp, adv, p.clip_low, p.clip_high)
    with torch.no_grad():
        lp = logp.detach()
        cov = (adv - _masked_mean(adv, maskf)) * (lp - _masked_mean(lp, maskf))  # (B, T)
        candidates = valid & ~by_clip & (cov > p.clip_cov_lb) & (cov < p.clip_cov_ub)
        idx = torch.nonzero(candidates)  # (K, 2)
        num = max(int(p.clip_cov_ratio * float(maskf.sum())), 1)
        if len(idx) > num:
            seed = int(cov[candidates].float().view(torch.int32).to(torch.int64).sum()) % (2 ** 63)
            perm = torch.randperm(len(idx), generator=torch.Generator().manual_seed(seed))
            idx = idx[perm[:num].to(idx.device)]
        cut = torch.zeros_like(valid)
        cut[idx[:, 0], idx[:, 1]] = True
    return torch.where(cut, torch.zeros_like(loss), loss), cut


def _kl_cov(logp, old_logp, advantages, mask, p: PolicyLossParams):
    """KL-Cov (arXiv:2505.22617; veRL ``compute_policy_loss_kl_cov``): the unclipped surrogate -r A, plus
    ppo_kl_coef * |logp - old| on the max(int(kl_cov_ratio * valid tokens), 1) valid tokens with the
    largest centred covariance term (A_t - mean A) * (logp_t - mean logp) (plain means over the valid
    tokens; ties broken by torch.topk). ``clipped``: those tokens (veRL logs no clip fraction here).
    Over the tokens of the batch passed in: not exact under gradient accumulation."""
    valid = mask > 0
    adv = _per_token(advantages).expand_as(logp)  # (B, T)
    log_ratio = torch.clamp(logp - old_logp, min=-_LOG_RATIO_BOUND, max=_LOG_RATIO_BOUND)
    loss = -adv * torch.exp(log_ratio)  # (B, T)
    chosen = torch.zeros_like(valid)
    if valid.any():
        with torch.no_grad():
            a, lp = adv[valid].detach(), logp[valid].detach()  # (K,)
            cov = (a - a.mean()) * (lp - lp.mean())
            top = torch.topk(cov, max(1, int(len(cov) * p.kl_cov_ratio)), largest=True).indices
            flat = torch.zeros(len(cov), dtype=torch.bool, device=cov.device)
            flat[top] = True
            chosen[valid] = flat
        loss = torch.where(chosen, loss + p.ppo_kl_coef * log_ratio.abs(), loss)
    return loss, chosen


POLICY_LOSSES = Registry("algo.policy_loss", {
    "vanilla": _vanilla,
    "dual_clip": _dual_clip,
    "gspo": _gspo,
    "cispo": _cispo,
    "clip_cov": _clip_cov,
    "kl_cov": _kl_cov,
})


def policy_loss(name: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, p: PolicyLossParams = PolicyLossParams()
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``POLICY_LOSSES[name]``: logp, old_logp (B, T), advantages (B,) or (B, T), mask (B, T)
    -> (loss (B, T) before masking, clipped (B, T) bool)."""
    return POLICY_LOSSES[name](logp, old_logp, advantages, mask, p)


def _token_mean(values, mask, num_tokens, num_seqs, scale_factor):
    denom = mask.sum() if num_tokens is None else num_tokens
    return (values * mask).sum() / max(float(denom), 1.0)


def _seq_mean_token_mean(values, mask, num_tokens, num_seqs, scale_factor):
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    denom = mask.shape[0] if num_seqs is None else num_seqs
    return per_seq.sum() / max(float(denom), 1.0)


def _seq_mean_token_sum(values, mask, num_tokens, num_seqs, scale_factor):
    per_seq = (values * mask).sum(-1)  # (B,)
    denom = mask.shape[0] if num_seqs is None else num_seqs
    return per_seq.sum() / max(float(denom), 1.0)


def _seq_mean_token_sum_norm(values, mask, num_tokens, num_seqs, scale_factor):
    seqs = mask.shape[0] if num_seqs is None else num_seqs
    factor = mask.shape[-1] if scale_factor is None else scale_factor
    return (values * mask).sum() / (max(float(seqs), 1.0) * float(factor))


AGGREGATIONS = Registry("algo.loss_agg_mode", {
    "token-mean": _token_mean,  # every token of the mini-batch weighs the same (DAPO, veRL default)
    "seq-mean-token-mean": _seq_mean_token_mean,  # each sequence weighs the same (original GRPO, TRL "grpo")
    "seq-mean-token-sum": _seq_mean_token_sum,  # sum over tokens, mean over sequences
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,  # Dr. GRPO: sum / (sequences * constant length)
})


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              num_tokens: Optional[float] = None, num_seqs: Optional[float] = None,
              scale_factor: Optional[float] = None) -> torch.Tensor:
    """Reduce a (B, T) per-token quantity to a scalar under ``mask`` (B, T).

    ``num_tokens`` / ``num_seqs`` are the totals of the whole mini-batch when this is one
    micro-batch of it: summing the micro-batch results then equals the full mini-batch
    value exactly, which makes gradient accumulation exact. Default: this batch's own.
    "seq-mean-token-sum-norm" (Dr. GRPO, arXiv:2503.20783) is sum(values * mask) / (num_seqs *
    scale_factor), scale_factor default mask.shape[-1]; pass a constant (the maximum response
    length) to keep it exact across micro-batches of different widths. With scale_factor =
    max_completion_length it is TRL's loss_type="dr_grpo". (veRL divides by scale_factor only,
    and its actor then scales each micro-batch by micro/mini batch size: a constant factor of the
    micro-batch size apart.) The other modes ignore scale_factor.
    """
    return AGGREGATIONS[mode](values, mask.to(values.dtype), num_tokens, num_seqs, scale_factor)
