"""The policy's side of a step: token log-probs of responses, and the clipped-loss update.

Batches are split by the config's counting rules: mini-batches by PROMPT groups (one
optimizer step each), micro-batches by SEQUENCES (gradient accumulation). Each micro-batch
loss is aggregated with the whole mini-batch's token / sequence counts as denominators,
so the accumulated gradient equals the gradient of the full mini-batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from verirl.algo import aggregate, clipped_policy_loss, entropy_from_logits, kl_penalty, logprobs_from_logits
from verirl.types import Rollout, TrainBatch


@dataclass
class UpdateParams:
    """Plain arguments for `update_policy` (built from the config by the trainer)."""
    group_size: int  # rollout.n
    mini_batch_prompts: int
    micro_batch_size: int  # sequences
    epochs: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    grad_clip: float = 1.0
    temperature: float = 1.0


def _slice(r: Rollout, idx: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of a rollout, trimmed of all-pad columns: (input_ids, attention_mask, response_ids, resp_mask)."""
    pm, rm = r.prompt_mask[idx], r.response_mask[idx]
    p_width = int(pm.sum(-1).max())
    r_width = max(int(rm.sum(-1).max()), 1)
    pi, pm = r.prompt_ids[idx][:, -p_width:], pm[:, -p_width:]
    ri, rm = r.response_ids[idx][:, :r_width], rm[:, :r_width]
    return torch.cat([pi, ri], 1), torch.cat([pm, rm], 1), ri, rm


def response_logprobs(model, rollout: Rollout, idx: slice = slice(None), temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Log-probs (and entropy) of the response tokens of rows ``idx``.

    Returns (logp (b, r), entropy (b, r) or None, response mask (b, r)), r = the longest
    response in these rows. Positions restart at each sequence's first real token."""
    input_ids, attn, resp_ids, resp_mask = _slice(rollout, idx)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    r = resp_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False,
                   logits_to_keep=r + 1).logits[:, :-1]  # (b, r, V): position t predicts response token t
    logp = logprobs_from_logits(logits, resp_ids, temperature)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits / temperature if temperature != 1.0 else logits)
    return logp, ent, resp_mask.float()


@torch.no_grad()
def compute_logprobs(model, rollout: Rollout, micro_batch_size: int, temperature: float = 1.0) -> torch.Tensor:
    """(N, R) log-probs of every response under ``model`` (old or reference pass), micro-batched."""
    was_training = model.training
    model.eval()
    N, R = rollout.response_ids.shape
    out = torch.zeros((N, R), dtype=torch.float32, device=rollout.response_ids.device)
    for s in range(0, N, micro_batch_size):
        logp, _, _ = response_logprobs(model, rollout, slice(s, min(s + micro_batch_size, N)), temperature)
        out[s:s + logp.shape[0], :logp.shape[1]] = logp
    model.train(was_training)
    return out


def update_policy(model, optimizer, scheduler, batch: TrainBatch, p: UpdateParams) -> dict[str, float]:
    """One pass of the clipped-loss update over a step's rollouts. Returns mean statistics."""
    model.train()
    r = batch.rollout
    N = r.response_ids.shape[0]
    mb_seqs = p.mini_batch_prompts * p.group_size
    stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "kl", "entropy", "pg_clipfrac", "grad_norm", "lr")}
    params = [q for q in model.parameters() if q.requires_grad]
    for _ in range(p.epochs):
        for m0 in range(0, N, mb_seqs):
            m1 = min(m0 + mb_seqs, N)
            mask_all = r.response_mask[m0:m1].float()
            n_tokens, n_seqs = float(mask_all.sum()), float(m1 - m0)
            optimizer.zero_grad(set_to_none=True)
            sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "pg_clipfrac": 0.0}
            for s in range(m0, m1, p.micro_batch_size):
                e = min(s + p.micro_batch_size, m1)
                logp, ent, mask = response_logprobs(model, r, slice(s, e), p.temperature,
                                                    with_entropy=True)
                w = logp.shape[1]
                old = logp.detach() if batch.old_logprobs is None else batch.old_logprobs[s:e, :w]
                pg, clipped = clipped_policy_loss(logp, old, batch.advantages[s:e], p.clip_low, p.clip_high)
                pg_loss = aggregate(pg, mask, p.loss_agg_mode, n_tokens, n_seqs)
                loss = pg_loss
                if batch.ref_logprobs is not None and p.kl_coef > 0:
                    kl = kl_penalty(logp, batch.ref_logprobs[s:e, :w], p.kl_type)
                    kl_loss = aggregate(kl, mask, p.loss_agg_mode, n_tokens, n_seqs)
                    loss = loss + p.kl_coef * kl_loss
                    sums["kl"] += float(kl_loss.detach())
                ent_loss = aggregate(ent, mask, p.loss_agg_mode, n_tokens, n_seqs)
                if p.entropy_coef > 0:
                    loss = loss - p.entropy_coef * ent_loss
                loss.backward()
                sums["pg_loss"] += float(pg_loss.detach())
                sums["entropy"] += float(ent_loss.detach())
                sums["pg_clipfrac"] += float((clipped.float() * mask).sum()) / max(n_tokens, 1.0)
            if p.grad_clip > 0:
                gn = torch.nn.utils.clip_grad_norm_(params, p.grad_clip)
            else:
                gn = torch.linalg.vector_norm(torch.stack([q.grad.norm() for q in params if q.grad is not None]))
            stats["lr"].append(optimizer.param_groups[0]["lr"])
            if torch.isfinite(gn):
                optimizer.step()
            scheduler.step()
            stats["grad_norm"].append(float(gn))
            for k, v in sums.items():
                stats[k].append(v)
    if batch.ref_logprobs is None or p.kl_coef <= 0:
        stats.pop("kl")  # no reference pass: say nothing rather than a made-up zero
    return {f"actor/{k}": sum(v) / len(v) for k, v in stats.items() if v}


def build_optimizer(model, lr: float, betas: tuple[float, float], weight_decay: float, warmup_steps: int):
    """AdamW with linear warm-up from 0 to ``lr`` over ``warmup_steps`` optimizer steps."""
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=lr, betas=tuple(betas),
                            weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0)
    return opt, sched
