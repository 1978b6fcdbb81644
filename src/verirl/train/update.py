"""The policy's side of a step: token log-probs of responses, and the policy-loss update.

Batches are split by the config's counting rules: mini-batches by PROMPT groups (one
optimizer step each), micro-batches by SEQUENCES (gradient accumulation) or, with a token
budget, by TOKENS (balanced bins that never exceed the budget). Each micro-batch loss is
aggregated with the whole mini-batch's token / sequence counts as denominators, so the
accumulated gradient equals the gradient of the full mini-batch however it is split.

Two ways to run the model over a micro-batch, with the same results:
* packed (``remove_padding``, the default): one padding-free row, each prompt computed
  once for its samples, output layer in chunks on response positions (`verirl.train.packing`);
* padded: the rows left/right padded as in the rollout, pads trimmed per micro-batch (the
  reference path, and the fallback for models packing does not support).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from verirl.core.algo import (POLICY_LOSSES, PolicyLossParams, aggregate, entropy_from_logits, high_entropy_mask,
                         kl_penalty, logprobs_from_logits, rollout_correction)
from verirl.core.errors import ConfigError
from verirl.models import eval_mode, router_tap
from verirl.train.distributed import Dist
from verirl.models.pipeline import from_last, pipeline_backward, pipeline_grad_norm, pipeline_logprobs, sum_tied_grads
from verirl.train.packing import PackCache, packed_logprobs, supports_packing
from verirl.train.pipelined import at_least, micro_batches, pipeline_of, scatter
from verirl.train.record import response_positions, silenced
from verirl.train.strategy import grad_norm, is_sharded, on_device_for, optimizer_state_on_device, reshard
from verirl.core.types import Rollout, TrainBatch


@dataclass(frozen=True)
class LogprobPass:
    """How a log-prob pass runs over a rollout: how it is cut into micro-batches, and how each
    forward runs (see the module docstring)."""
    micro_batch_size: int = 64  # sequences per forward when max_tokens is 0
    max_tokens: int = 0  # token budget per forward (a shared prompt counted once); 0 = micro_batch_size
    temperature: float = 1.0  # log-probs of the distribution the rollout sampled from
    remove_padding: bool = True  # packed rows (when the model supports it), else padded rows
    share_prompt: bool = True  # packed: each prompt computed once for its samples
    chunk: int = 0  # output-layer rows per chunk; 0 = auto_chunk (4M logits on a CPU, 64M on an accelerator)
    offload: bool = False  # the model waits on the host between passes (ref.offload)
    compute_dtype: Optional[torch.dtype] = None  # model.compute_dtype: the forward under torch.autocast in it

    @property
    def prompt_once(self) -> bool:
        """Whether a prompt is computed once for all its samples in a micro-batch."""
        return self.remove_padding and self.share_prompt


@dataclass(frozen=True)
class Correction:
    """The train/inference mismatch guard's settings (algo.rollout_correction; `verirl.core.algo.correction`)."""
    rollout_is: Optional[str] = None  # token / sequence / None: truncated importance weights
    is_threshold: float = 2.0
    rollout_rs: Optional[str] = "sequence"  # token / sequence / geometric / None: rejection
    rs_threshold: float = 3.0
    rs_threshold_lower: float = 0.0  # 0 = no lower bound

    def apply(self, trainer_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor):
        """(weights (B, T), rejected (B, T) bool) for the pair of log-probs of the same tokens."""
        return rollout_correction(trainer_logp, rollout_logp, mask, self.rollout_is, self.is_threshold,
                                  self.rollout_rs, self.rs_threshold, self.rs_threshold_lower)


@dataclass(frozen=True)
class UpdateParams:
    """Plain arguments for `update_policy` (built from the config by the trainer)."""
    group_size: int  # rollout.n
    mini_batch_prompts: int  # prompts per optimizer step
    forward: LogprobPass = LogprobPass()  # how the policy's forward + backward runs
    epochs: int = 1
    policy_loss: str = "vanilla"  # a name in `verirl.core.algo.POLICY_LOSSES`
    loss: PolicyLossParams = PolicyLossParams()  # its clip ratios and coefficients
    kl_coef: float = 0.0
    kl_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0  # the policy loss only on this top share of tokens by entropy (1 = all)
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: Optional[float] = None  # seq-mean-token-sum-norm's divisor (None: the batch's width)
    mask_truncated: bool = False  # responses without a stop token get no loss and leave the token count (not the
    # sequence count, as TRL)
    correction: Optional[Correction] = None  # the mismatch guard; None (or no sampled log-probs): off
    grad_clip: float = 1.0
    offload_optimizer: bool = False  # the optimizer state waits on the host between updates (actor.offload)
    # a mixture-of-experts model's load-balancing loss (`RouterTap.aux_loss`) added times this (moe/aux_loss);
    # needs a `RouterTap` with keep_logits around the update
    moe_aux_loss_coef: float = 0.0


Rows = Union[slice, Sequence[int]]


def _rows(rollout: Rollout, idx: Rows) -> list[int]:
    return list(range(rollout.response_ids.shape[0]))[idx] if isinstance(idx, slice) else [int(i) for i in idx]


def _prompt_groups(rollout: Rollout, rows: Sequence[int], share_prompt: bool) -> list[tuple[list[int], int]]:
    """(rows, prompt tokens) items: with a shared prompt, consecutive rows with the same prompt form
    one item (the prompt is computed once for them); otherwise every row is its own item."""
    p_len = rollout.prompt_lengths.tolist()
    items: list[tuple[list[int], int]] = []
    prev = None
    for i in rows:
        key = tuple(rollout.prompt_ids[i, rollout.prompt_ids.shape[1] - int(p_len[i]):].tolist()) \
            if share_prompt else None
        if share_prompt and items and key == prev:
            items[-1][0].append(i)
        else:
            items.append(([i], int(p_len[i])))
        prev = key
    return items


def plan_micro_batches(rollout: Rollout, rows: Sequence[int], micro_batch_size: int, max_tokens: int = 0,
                       share_prompt: bool = False) -> list[list[int]]:
    """Micro-batches (lists of rows) for one forward/backward each.

    ``max_tokens`` 0: consecutive chunks of ``micro_batch_size`` sequences. Otherwise bins of at
    most ``max_tokens`` tokens (prompt + response; a shared prompt counted once per bin), as few
    as the budget allows, filled largest-first into the lightest bin so they come out balanced."""
    rows = list(rows)
    if max_tokens <= 0:
        return [rows[s:s + micro_batch_size] for s in range(0, len(rows), micro_batch_size)]
    r_len = rollout.response_lengths.tolist()
    pieces: list[tuple[list[int], int]] = []  # (rows, tokens) that must go together
    for group, P in _prompt_groups(rollout, rows, share_prompt):
        cur, cost = [], P
        for i in group:
            need = P + int(r_len[i])
            if need > max_tokens:
                raise ConfigError(f"sequence {i} has {need} tokens ({P} prompt + {int(r_len[i])} response), more than "
                                 f"the micro-batch token budget {max_tokens}; raise actor.max_token_len_per_device "
                                 f"(or ref.log_prob_max_token_len_per_device) to at least data.max_prompt_length + "
                                 f"rollout.max_new_tokens.")
            if cur and cost + int(r_len[i]) > max_tokens:
                pieces.append((cur, cost))
                cur, cost = [], P
            cur.append(i)
            cost += int(r_len[i])
        pieces.append((cur, cost))
    total = sum(c for _, c in pieces)
    k = max(1, -(-total // max_tokens))
    order = sorted(range(len(pieces)), key=lambda j: -pieces[j][1])
    while True:
        bins: list[list[int]] = [[] for _ in range(k)]
        load = [0] * k
        for j in order:
            b = min(range(k), key=load.__getitem__)
            bins[b].extend(pieces[j][0])
            load[b] += pieces[j][1]
        if max(load) <= max_tokens:
            return [sorted(b) for b in bins if b]
        k += 1


def _slice(r: Rollout, idx: Rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of a rollout, trimmed of all-pad columns: (input_ids, attention_mask, response_ids, resp_mask)."""
    if not isinstance(idx, slice):
        idx = torch.as_tensor(list(idx), dtype=torch.long, device=r.response_ids.device)
    pm, rm = r.prompt_mask[idx], r.response_mask[idx]
    p_width = int(pm.sum(-1).max())
    r_width = max(int(rm.sum(-1).max()), 1)
    pi, pm = r.prompt_ids[idx][:, -p_width:], pm[:, -p_width:]
    ri, rm = r.response_ids[idx][:, :r_width], rm[:, :r_width]
    return torch.cat([pi, ri], 1), torch.cat([pm, rm], 1), ri, rm


def response_logprobs(model, rollout: Rollout, idx: Rows = slice(None), temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """Log-probs (and entropy) of the response tokens of rows ``idx``, on the padded rows.

    Returns (logp (b, r), entropy (b, r) or None, response mask (b, r)), r = the longest
    response in these rows. Positions restart at each sequence's first real token."""
    input_ids, attn, resp_ids, resp_mask = _slice(rollout, idx)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    b, width = input_ids.shape
    r = resp_ids.shape[1]
    rows, cols = resp_mask.nonzero(as_tuple=True)  # column width - r - 1 + t predicts response token t
    tap = router_tap.current()  # routing replay and the MoE metrics: the routes sliced like the token ids
    if tap is not None:
        Pw, lo = rollout.prompt_ids.shape[1], rollout.prompt_ids.shape[1] - (width - r)
        sel = idx if isinstance(idx, slice) else torch.as_tensor(list(idx), dtype=torch.long)
        tap.begin(None if tap.routed is None else tap.routed[sel][:, lo:Pw + r].reshape((b * width,) + tap.routed.shape[2:]),
                  tap.replaying)
    with response_positions(rows * width + width - r - 1 + cols, cols == 0):
        logits = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=False,
                       logits_to_keep=r + 1).logits[:, :-1]  # (b, r, V): position t predicts response token t
    if tap is not None:
        real = attn.bool().reshape(-1)
        tap.end(real)
        if tap.store is not None and tap.counting:
            used = torch.stack(tap.last_ids, 1).masked_fill(~real.to(tap.last_ids[0].device)[:, None, None], -1)
            tap.store[sel.to(tap.store.device) if not isinstance(sel, slice) else sel, lo:Pw + r] = \
                used.view((b, width) + used.shape[1:]).to(tap.store.device, tap.store.dtype)
    logp = logprobs_from_logits(logits, resp_ids, temperature)
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits / temperature if temperature != 1.0 else logits)
    return logp, ent, resp_mask.float()


def sequence_logprobs(model, rollout: Rollout, rows: Rows, forward: LogprobPass = LogprobPass(),
                      with_entropy: bool = False, layouts: Optional[PackCache] = None, sp_group=None):
    """(logp (b, r), entropy (b, r) or None, response mask (b, r)) for ``rows``, r = their longest
    response, by the packed path when ``forward.remove_padding`` (and the model allows it), else padded.
    ``layouts`` keeps the packed layouts of this rollout for the next pass over the same rows. ``sp_group``:
    the packed row's tokens split over this sequence-parallel group (`packed_logprobs`).

    ``forward.compute_dtype`` (mixed precision): the forward runs under `torch.autocast` in that dtype, the
    weights staying in theirs; the backward, called after this returns, follows the forward's dtypes.
    The packed path computes the output layer and the log-probs in the weights' dtype (`packed_logprobs`)."""
    with mixed_precision(rollout.response_ids.device, forward.compute_dtype):
        if forward.remove_padding and supports_packing(model)[0]:
            return packed_logprobs(model, rollout, _rows(rollout, rows), forward.temperature, with_entropy,
                                   forward.share_prompt, forward.chunk, layouts, sp_group)
        return response_logprobs(model, rollout, rows, forward.temperature, with_entropy)


def mixed_precision(device: torch.device, dtype: Optional[torch.dtype]):
    """`torch.autocast` in ``dtype`` on ``device``'s type (where the pass computes: the rollout's tensors
    are there, also when the parameters wait on the host); nothing when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def same_count(micro_batches: list[list[int]], model, dist: Dist) -> list[Optional[list[int]]]:
    """The micro-batches to run, padded with empty ones (None) to the most any rank has when the model
    is sharded: each forward gathers weights, so every rank must run as many."""
    if not (dist.active and is_sharded(model)):
        return list(micro_batches)
    n = int(dist.all_max([len(micro_batches)])[0])
    return list(micro_batches) + [None] * (n - len(micro_batches))


@torch.no_grad()
def compute_logprobs(model, rollout: Rollout, forward: LogprobPass = LogprobPass(),
                     layouts: Optional[PackCache] = None, dist: Optional[Dist] = None) -> torch.Tensor:
    """(N, R) log-probs of every response under ``model`` (old or reference pass), micro-batched."""
    N, R = rollout.response_ids.shape
    dist = dist or Dist.single()
    out = torch.zeros((N, R), dtype=torch.float32, device=rollout.response_ids.device)
    planned = plan_micro_batches(rollout, range(N), forward.micro_batch_size, forward.max_tokens, forward.prompt_once)
    pipe = pipeline_of(model)
    if pipe is not None:  # the stages' forward alone; the log-probs sent from the last stage
        layouts = layouts or PackCache(rollout)
        if len(pipe.stages) > 1:  # the forward runs interleaved: whole rounds of micro-batches
            planned = at_least(planned, 1, "interleaved_1f1b", torch.distributed.get_world_size(pipe.group))
        pbs = [layouts.get(rollout, mb, forward.prompt_once) for mb in planned]
        with eval_mode(model), mixed_precision(out.device, forward.compute_dtype):
            results = pipeline_logprobs(pipe.stages, micro_batches(model, pbs, dist.sp_group), pipe.group,
                                        forward.max_tokens // dist.sp_world, forward.temperature, forward.chunk)
        pipe.reshard()
        for mb, pb, (lp, _) in zip(planned, pbs, results):
            logp = scatter(pb, lp)
            out[torch.as_tensor(mb, device=out.device), :logp.shape[1]] = logp.float()
        return out
    with eval_mode(model), on_device_for(model, out.device, forward.offload):
        for mb in same_count(planned, model, dist):
            with (silenced() if mb is None else contextlib.nullcontext()), router_tap.uncounted(mb is None):
                logp, _, _ = sequence_logprobs(model, rollout, mb or planned[0][:1], forward, layouts=layouts,
                                               sp_group=dist.sp_group)
            if mb is not None:  # an empty micro-batch only joins the other ranks' collectives
                out[torch.as_tensor(mb, device=out.device), :logp.shape[1]] = logp
    reshard(model)
    return out


def update_policy(model, optimizer, scheduler, batch: TrainBatch, p: UpdateParams,
                  layouts: Optional[PackCache] = None, dist: Optional[Dist] = None,
                  on_policy_out: Optional[torch.Tensor] = None,
                  entropy_out: Optional[torch.Tensor] = None) -> dict[str, float]:
    """One pass of the policy-loss update over a step's rollouts. Returns mean statistics, and
    ``actor/nonfinite_updates``: the mini-batches whose loss or grad norm was not finite, for which
    no optimizer or scheduler step was taken.

    With several ranks (``dist``), ``batch`` is this rank's share of the global batch: the losses are
    divided by the mini-batch's global token and sequence counts and the gradients are summed over
    the ranks before the step, so the update and the returned statistics are the global batch's.

    ``on_policy_out`` (N, R), on-policy only (no old-log-prob pass): filled with the log-probs the
    update computed before its (single) optimizer step, the trainer's side of the rollout engine's
    log-prob check. ``entropy_out`` (N,): filled with each response's token entropy summed over its loss
    mask (first epoch).

    The mismatch guard (``p.correction``, when the rollout has the engine's log-probs) multiplies each
    token's policy loss by its weight: 0 for a rejected token, which still counts in the loss's token
    and sequence denominators (as TRL's masked importance sampling), so the split into micro-batches
    keeps the accumulated gradient exact."""
    with optimizer_state_on_device(optimizer, p.offload_optimizer):  # actor.offload=optimizer
        update = _update if pipeline_of(model) is None else _pipelined_update
        return update(model, optimizer, scheduler, batch, p, layouts, dist or Dist.single(),
                      on_policy_out if batch.old_logprobs is None else None, entropy_out)


def trained_mask(r: Rollout, p: UpdateParams) -> torch.Tensor:
    """(N, R) float: the tokens the policy loss, the KL and the entropy are taken over: the rollout's
    loss mask, less the tokens of truncated responses with ``mask_truncated`` (TRL's
    mask_truncated_completions)."""
    mask = r.loss_mask.float()
    return mask * r.stopped[:, None].to(mask.dtype) if p.mask_truncated else mask


def _micro_loss(logp, ent, mask, sel, batch: TrainBatch, p: UpdateParams, old, n_tokens, n_seqs):
    """One micro-batch's loss and its statistics' shares. logp, ent, mask, old: (b, w)."""
    w = logp.shape[1]
    adv = batch.advantages[sel]  # (b,), or (b, R) per token (on-policy distillation)
    pg, clipped = POLICY_LOSSES[p.policy_loss](logp, old, adv[:, :w] if adv.dim() == 2 else adv, mask, p.loss)
    roll_logp = batch.rollout.sample_logprobs
    if p.correction is not None and roll_logp is not None:
        weights, _ = p.correction.apply(old, roll_logp[sel, :w].to(old.dtype), mask)
        pg = pg * weights
    if p.top_entropy_quantile < 1.0:
        pg = pg * high_entropy_mask(ent.detach(), mask, p.top_entropy_quantile)
    pg_loss = aggregate(pg, mask, p.loss_agg_mode, n_tokens, n_seqs, p.loss_scale_factor)
    loss, shares = pg_loss, {"pg_loss": float(pg_loss.detach())}
    if batch.ref_logprobs is not None and p.kl_coef > 0:
        kl_loss = aggregate(kl_penalty(logp, batch.ref_logprobs[sel, :w], p.kl_type), mask, p.loss_agg_mode,
                            n_tokens, n_seqs, p.loss_scale_factor)
        loss = loss + p.kl_coef * kl_loss
        shares["kl"] = float(kl_loss.detach())
    ent_loss = aggregate(ent, mask, p.loss_agg_mode, n_tokens, n_seqs, p.loss_scale_factor)
    if p.entropy_coef > 0:
        loss = loss - p.entropy_coef * ent_loss
    shares["entropy"] = float(ent_loss.detach())
    shares["pg_clipfrac"] = float((clipped.float() * mask).sum()) / max(n_tokens, 1.0)
    return loss, shares


def _trained_loss(logp, ent, sel, epoch: int, batch: TrainBatch, p: UpdateParams, trained, n_tokens, n_seqs,
                  sums: dict, on_policy_out, entropy_out) -> torch.Tensor:
    """A micro-batch's loss from its rows' log-probs and entropies (b, w): the on-policy log-probs and the
    entropies written out, the statistics' shares added to ``sums``."""
    r, w = batch.rollout, logp.shape[1]
    old = logp.detach() if batch.old_logprobs is None else batch.old_logprobs[sel, :w]
    if on_policy_out is not None:
        on_policy_out[sel, :w] = old.to(on_policy_out.dtype)
    if entropy_out is not None and epoch == 0:
        entropy_out[sel] = (ent.detach() * r.loss_mask[sel, :w].to(ent.dtype)).sum(-1).to(entropy_out.dtype)
    loss, shares = _micro_loss(logp, ent, trained[sel, :w], sel, batch, p, old, n_tokens, n_seqs)
    tap = router_tap.current()
    aux = tap.aux_loss(tap.last_real) if tap is not None and p.moe_aux_loss_coef > 0 else None
    if aux is not None:  # a micro-batch's mean over its tokens, weighted by its share of the mini-batch's
        aux = aux * (float(trained[sel, :w].sum()) / max(n_tokens, 1.0))
        loss = loss + p.moe_aux_loss_coef * aux
        sums["moe_aux_loss"] += float(aux.detach())
    for k, v in shares.items():
        sums[k] += v
    return loss


def _optimizer_step(optimizer, scheduler, gn: torch.Tensor, sums: dict, stats: dict) -> bool:
    """The mini-batch's optimizer and scheduler step and its statistics; False (no step at all, so that the
    weights, the optimizer state and the schedule stay good) when the loss or the grad norm is not finite."""
    stats["lr"].append(optimizer.param_groups[0]["lr"])
    finite = bool(torch.isfinite(gn)) and all(math.isfinite(v) for v in sums.values())
    if finite:
        optimizer.step()
        scheduler.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    stats["grad_norm"].append(float(gn))
    for k, v in sums.items():
        stats[k].append(v)
    return finite


def _update_metrics(stats: dict, batch: TrainBatch, p: UpdateParams, nonfinite: int) -> dict[str, float]:
    if batch.ref_logprobs is None or p.kl_coef <= 0:
        stats.pop("kl")  # no reference pass: say nothing rather than a made-up zero
    aux = stats.pop("moe_aux_loss", None)
    out = {**{f"actor/{k}": sum(v) / len(v) for k, v in stats.items() if v},
           "actor/nonfinite_updates": float(nonfinite)}
    if aux:
        out["moe/aux_loss"] = sum(aux) / len(aux)
    return out


def _update(model, optimizer, scheduler, batch: TrainBatch, p: UpdateParams, layouts: Optional[PackCache],
            dist: Dist, on_policy_out: Optional[torch.Tensor], entropy_out: Optional[torch.Tensor]) -> dict[str, float]:
    """`update_policy` with the optimizer state on its device."""
    model.train()
    r = batch.rollout
    N = r.response_ids.shape[0]
    mb_seqs = p.mini_batch_prompts * p.group_size
    aux = ("moe_aux_loss",) if p.moe_aux_loss_coef > 0 else ()  # `_trained_loss` adds its share
    stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "kl", "entropy", "pg_clipfrac", "grad_norm", "lr")
                                     + aux}
    params = [q for q in model.parameters() if q.requires_grad]
    trained = trained_mask(r, p)
    nonfinite = 0  # mini-batches whose loss or grad norm was not finite: skipped
    for epoch in range(p.epochs):
        for m0 in range(0, N, mb_seqs):
            m1 = min(m0 + mb_seqs, N)
            n_tokens, n_seqs = dist.all_sum([float(trained[m0:m1].sum()), float(m1 - m0)])  # of the global mini-batch
            optimizer.zero_grad(set_to_none=True)
            sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "pg_clipfrac": 0.0, **{k: 0.0 for k in aux}}
            planned = plan_micro_batches(r, range(m0, m1), p.forward.micro_batch_size, p.forward.max_tokens,
                                         p.forward.prompt_once)
            for mb in same_count(planned, model, dist):
                if mb is None:  # an empty micro-batch: only the other ranks' all-gathers and reduce-scatters
                    with silenced(), router_tap.uncounted():
                        logp, _, _ = sequence_logprobs(model, r, planned[0][:1], p.forward, True, layouts,
                                                       dist.sp_group)
                        (logp.sum() * 0.0).backward()
                    continue
                sel = torch.as_tensor(mb, dtype=torch.long, device=r.response_ids.device)
                logp, ent, _ = sequence_logprobs(model, r, mb, p.forward, with_entropy=True, layouts=layouts,
                                                 sp_group=dist.sp_group)
                _trained_loss(logp, ent, sel, epoch, batch, p, trained, n_tokens, n_seqs, sums, on_policy_out,
                              entropy_out).backward()
            if not is_sharded(model):  # a sharded model's backward reduce-scattered the gradients already
                dist.sum_gradients(params)
            sums = dict(zip(sums, dist.all_sum(list(sums.values()))))
            nonfinite += not _optimizer_step(optimizer, scheduler, grad_norm(params, p.grad_clip), sums, stats)
    return _update_metrics(stats, batch, p, nonfinite)


def _pipelined_update(model, optimizer, scheduler, batch: TrainBatch, p: UpdateParams, layouts: Optional[PackCache],
                      dist: Dist, on_policy_out: Optional[torch.Tensor],
                      entropy_out: Optional[torch.Tensor]) -> dict[str, float]:
    """`_update` through the pipeline's stages: each mini-batch's micro-batches (at least one per stage)
    forward and backward under the schedule, the loss of each on the last stage; the tied embedding's
    gradient summed over its two copies, the gradients summed over the data-parallel ranks, the grad norm
    over the whole pipeline; the statistics and the on-policy log-probs and entropies sent from the last
    stage."""
    pipe = pipeline_of(model)
    model.train()
    r = batch.rollout
    N = r.response_ids.shape[0]
    device = r.response_ids.device
    layouts = layouts or PackCache(r)
    mb_seqs = p.mini_batch_prompts * p.group_size
    stats: dict[str, list[float]] = {k: [] for k in ("pg_loss", "kl", "entropy", "pg_clipfrac", "grad_norm", "lr")}
    params = [q for q in model.parameters() if q.requires_grad]
    trained = trained_mask(r, p)
    nonfinite = 0
    pp_ranks = torch.distributed.get_world_size(pipe.group)
    stages = len(pipe.stages) * pp_ranks
    for epoch in range(p.epochs):
        for m0 in range(0, N, mb_seqs):
            m1 = min(m0 + mb_seqs, N)
            n_tokens, n_seqs = dist.all_sum([float(trained[m0:m1].sum()), float(m1 - m0)])
            optimizer.zero_grad(set_to_none=True)
            sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "pg_clipfrac": 0.0}
            planned = plan_micro_batches(r, range(m0, m1), p.forward.micro_batch_size, p.forward.max_tokens,
                                         p.forward.prompt_once)
            if pipe.schedule != "gpipe":
                planned = at_least(planned, stages, pipe.schedule, pp_ranks)
            pbs = [layouts.get(r, mb, p.forward.prompt_once) for mb in planned]

            def loss_fn(lp, ent, i, planned=planned, pbs=pbs, sums=sums, n_tokens=n_tokens, n_seqs=n_seqs):
                sel = torch.as_tensor(planned[i], dtype=torch.long, device=device)
                return _trained_loss(scatter(pbs[i], lp), scatter(pbs[i], ent), sel, epoch, batch, p, trained,
                                     n_tokens, n_seqs, sums, on_policy_out, entropy_out)

            with mixed_precision(device, p.forward.compute_dtype):
                pipeline_backward(pipe.stages, micro_batches(model, pbs, dist.sp_group), loss_fn, pipe.group,
                                  pipe.schedule, p.forward.max_tokens // dist.sp_world, p.forward.temperature,
                                  p.forward.chunk, with_entropy=True)
            sum_tied_grads(pipe.stages, pipe.tied_group)
            if not pipe.sharded:  # FSDP2 inside the stages reduce-scattered them at the schedule's end
                dist.sum_gradients(params)
            shared = from_last(torch.tensor(list(sums.values()), dtype=torch.float64, device=device), pipe.group)
            sums = dict(zip(sums, dist.all_sum(shared.tolist())))
            gn = pipeline_grad_norm(pipe.stages, pipe.group, p.grad_clip)
            nonfinite += not _optimizer_step(optimizer, scheduler, gn, sums, stats)
    for out in (on_policy_out, entropy_out):  # filled on the last stage
        if out is not None:
            from_last(out, pipe.group)
    return _update_metrics(stats, batch, p, nonfinite)


def build_optimizer(model, lr: float, betas: tuple[float, float], weight_decay: float, warmup_steps: int):
    """AdamW with linear warm-up from 0 to ``lr`` over ``warmup_steps`` optimizer steps. On CPU and
    CUDA, torch's fused AdamW (one kernel over all parameters; docs/performance.md has its cost);
    elsewhere the default (for-each) implementation. A tensor-parallel model holds split parameters
    (DTensors) beside whole ones (its norms), which no multi-tensor kernel takes together: there
    AdamW updates one parameter at a time."""
    from torch.distributed.tensor import DTensor

    params = [q for q in model.parameters() if q.requires_grad]
    mixed = len({isinstance(q, DTensor) for q in params}) > 1
    fused = bool(params) and not mixed and all(q.device.type in ("cpu", "cuda") and q.dtype.is_floating_point
                                               for q in params)
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=fused or None,
                            foreach=False if mixed else None)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0)
    return opt, sched
