"""verirl's own batched sampler on a Hugging Face causal LM with a KV cache.

* Each distinct prompt is prefilled once; its cache is then repeated n times.
* One forward per new token for the still-running rows only: a finished row leaves the
  batch (its cache rows are dropped), so it stops costing compute.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import torch
from transformers import DynamicCache

from verirl.rollout.base import SamplingParams, build_rollout, left_pad
from verirl.rollout.sampling import sample_next
from verirl.types import Rollout


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV cache argument ``cache``; earlier releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class NativeEngine:
    def __init__(self, model, pad_id: int, stop_ids: Sequence[int]):
        self.model, self.pad_id, self.stop_ids = model, pad_id, list(stop_ids)

    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams) -> Rollout:
        model = self.model
        device = next(model.parameters()).device
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=device).manual_seed(params.seed)
        ids, mask = left_pad(prompt_ids, self.pad_id, device)  # (B, P)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        was_training = model.training
        model.eval()
        cache = DynamicCache()  # filled in place by the forward passes
        kw = _cache_kwarg(model)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                    **{kw: cache})
        logits = out.logits[:, -1]  # (B, V)
        if n > 1:  # expand each prompt's cache to its n samples
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            mask = mask.repeat_interleave(n, dim=0)
            pos = pos.repeat_interleave(n, dim=0)
        N, R = logits.shape[0], params.max_new_tokens
        tokens = torch.full((N, R), self.pad_id, dtype=torch.long, device=device)
        active = torch.arange(N, device=device)  # rows of the full batch still running
        next_pos = pos[:, -1] + 1  # (N,)
        stops = torch.as_tensor(self.stop_ids, device=device)
        for t in range(R):
            tok = sample_next(logits, params.temperature, params.top_k, params.top_p, gen)  # (A,)
            tokens[active, t] = tok
            keep = ~torch.isin(tok, stops)
            if t == R - 1 or not bool(keep.any()):
                break
            if not bool(keep.all()):
                idx = keep.nonzero().squeeze(-1)
                cache.batch_select_indices(idx)
                active, tok, mask, next_pos = active[idx], tok[idx], mask[idx], next_pos[idx]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            out = model(input_ids=tok.unsqueeze(-1), attention_mask=mask, position_ids=next_pos.unsqueeze(-1),
                        use_cache=True, **{kw: cache})
            logits = out.logits[:, -1]
            next_pos = next_pos + 1
        model.train(was_training)
        full_ids, full_mask = left_pad(prompt_ids, self.pad_id, device)
        return build_rollout(full_ids.repeat_interleave(n, 0), full_mask.repeat_interleave(n, 0), tokens,
                             self.stop_ids, self.pad_id)
