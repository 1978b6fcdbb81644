"""Reference engine: transformers' ``generate``. Slower, but the yardstick for the native engine.

Its sampling draws from torch's global generator, seeded at each call from ``params.seed`` and the
global position of the call's first prompt (so two chunks of one step draw different numbers).
Unlike the native engine's, its sampled tokens therefore depend on the batch layout: the call's
size, its order, the chunking and the number of ranks."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from verirl.models.modes import eval_mode
from verirl.rollout.base import SamplingParams, build_rollout, left_pad
from verirl.rollout.sampling import stream_seed
from verirl.core.types import Rollout


class HFEngine:
    reads_live_model = True  # generate decodes with the trainer's parameters

    def __init__(self, model, pad_id: int, stop_ids: Sequence[int]):
        self.model, self.pad_id, self.stop_ids = model, pad_id, list(stop_ids)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Nothing to do: this engine reads the live model."""

    def close(self) -> None:
        """Nothing to release: the model is the trainer's."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams,
                 prompt_index: Optional[Sequence[int]] = None, sample_index: Optional[Sequence[int]] = None,
                 offset: Optional[Sequence[int]] = None) -> Rollout:
        """``sample_index`` / ``offset`` (a multi-turn episode's rows): mixed into the generator's seed only;
        this engine samples from torch's global generator, so its rows are not keyed one by one."""
        device = next(self.model.parameters()).device
        if params.seed is not None:
            first = 0 if prompt_index is None or not len(prompt_index) else int(prompt_index[0])
            later = (sum(offset) if offset else 0) + (sum(sample_index) if sample_index else 0)
            torch.manual_seed(stream_seed(params.seed + later, first))  # generate() samples from the global generator
        ids, mask = left_pad(prompt_ids, self.pad_id, device)
        ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        greedy = params.temperature <= 0
        kwargs = {} if greedy else {"temperature": params.temperature, "top_p": params.top_p,
                                    "top_k": params.top_k or None}
        with eval_mode(self.model):
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=not greedy,
                                      max_new_tokens=params.max_new_tokens, eos_token_id=self.stop_ids,
                                      pad_token_id=self.pad_id, **kwargs)
        return build_rollout(ids, mask, out[:, ids.shape[1]:], self.stop_ids, self.pad_id)
