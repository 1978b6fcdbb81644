"""The engine protocol and the helpers every engine shares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import torch

from verirl.core.types import Rollout


@dataclass
class SamplingParams:
    max_new_tokens: int = 32
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: Optional[int] = None  # keys the sampling uniforms (see verirl.rollout.sampling); None = unseeded
    step: Optional[int] = None  # the training step being sampled (the replay engine's key); None outside training


class Engine(Protocol):
    """What the step asks of a rollout engine. ``reads_live_model``: whether `generate` reads the
    trainer's own parameters (native, hf: a sharded model is made whole while it decodes) or a copy
    of its own (vllm, fed by `sync_weights`; replay, which reads a dump)."""
    reads_live_model: bool

    def sync_weights(self, model) -> Optional[dict[str, float]]:
        """Make the next `generate` sample from ``model``'s current weights (called after every update).
        Engines that read the live model (native, hf) have nothing to do; the vLLM engine pushes the
        weights into its own copy and returns the push check's metric (``rollout/push_max_abs_diff``)."""
        ...

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams,
                 prompt_index: Optional[Sequence[int]] = None) -> Rollout:
        """Sample n responses per prompt; the n samples of a prompt are contiguous in the result.

        ``prompt_index``: each prompt's position in the step's GLOBAL batch (default
        ``range(len(prompt_ids))``). With ``params.seed`` set, sample j of the prompt at global
        position g is a function of (seed, g, j) and the model alone, whatever else is in the
        call, so a step split into chunks, or across ranks, samples what one call samples (the
        ``native`` engine; ``hf`` accepts the argument but samples from torch's global generator)."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond the model (vLLM: its workers and process groups, before
        the launcher's process group goes). Idempotent; nothing for the engines that read the live model."""
        ...


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids (B, P) left-padded with pad_id, mask (B, P) 1 on real tokens."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids.to(device), mask.to(device)


def right_pad(seqs: Sequence[Sequence], value, dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """-> values (N, R) right-padded with ``value`` (R at least 1), mask (N, R) long, 1 on real entries."""
    width = max(1, max((len(s) for s in seqs), default=0))
    out = torch.full((len(seqs), width), value, dtype=dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, :len(s)] = torch.as_tensor(list(s), dtype=dtype)
            mask[i, :len(s)] = 1
    return out, mask


def build_rollout(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, tokens: torch.Tensor,
                  stop_ids: Sequence[int], pad_id: int, lengths: Optional[Sequence[int]] = None) -> Rollout:
    """From raw sampled tokens (N, R) (anything after a stop is ignored) build the Rollout.

    The response mask covers positions up to and including the FIRST stop token; it is
    decided by position, never by comparing ids with the pad id (EOS may equal pad). Every
    token was sampled, so the loss mask equals it. ``lengths``: the tokens each row has (an engine that
    ended a row early without a stop, e.g. at its context length); default R."""
    N, R = tokens.shape
    if lengths is not None:  # positions past a row's own length are not tokens: a stop there means nothing
        have = torch.as_tensor([min(int(k), R) for k in lengths], dtype=torch.long, device=tokens.device)
        beyond = torch.arange(R, device=tokens.device)[None] >= have[:, None]
        tokens = tokens.masked_fill(beyond, pad_id)
    if R == 0:
        empty = tokens.new_zeros((N, 0))
        return Rollout(prompt_ids, prompt_mask, empty, empty, empty.clone(), torch.zeros(N, dtype=torch.bool))
    is_stop = torch.isin(tokens, torch.as_tensor(list(stop_ids), device=tokens.device))
    if lengths is not None:
        is_stop &= ~beyond
    stopped = is_stop.any(-1)
    end = have if lengths is not None else torch.full((N,), R, dtype=torch.long, device=tokens.device)
    first = torch.where(stopped, is_stop.float().argmax(-1), end - 1)
    lengths = first + 1  # (N,)
    pos = torch.arange(R, device=tokens.device).unsqueeze(0)
    mask = (pos < lengths.unsqueeze(1)).long()
    width = int(lengths.max())
    response = torch.where(mask.bool(), tokens, torch.full_like(tokens, pad_id))[:, :width]
    return Rollout(prompt_ids, prompt_mask, response, mask[:, :width], mask[:, :width].clone(), stopped)


def concat_rollouts(parts: Sequence[Rollout], pad_id: int) -> Rollout:
    """Join rollouts generated in chunks: prompts re-left-padded, responses re-right-padded (the routed
    experts' columns with them; kept only when every part has them)."""
    if len(parts) == 1:
        return parts[0]
    P = max(r.prompt_ids.shape[1] for r in parts)
    R = max(r.response_ids.shape[1] for r in parts)

    def pad(t: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
        extra = width - t.shape[1]
        if extra == 0:
            return t
        fill = t.new_full((t.shape[0], extra), value)
        return torch.cat([fill, t] if left else [t, fill], dim=1)

    with_logprobs = all(r.sample_logprobs is not None for r in parts)
    routed = None
    if all(r.routed_experts is not None for r in parts):  # prompt columns re-left-padded, response ones right-padded
        routed = torch.cat([torch.cat([_pad_routes(r.routed_experts[:, :r.prompt_ids.shape[1]], P, True),
                                       _pad_routes(r.routed_experts[:, r.prompt_ids.shape[1]:], R, False)], 1)
                            for r in parts])
    return Rollout(
        prompt_ids=torch.cat([pad(r.prompt_ids, P, pad_id, True) for r in parts]),
        prompt_mask=torch.cat([pad(r.prompt_mask, P, 0, True) for r in parts]),
        response_ids=torch.cat([pad(r.response_ids, R, pad_id, False) for r in parts]),
        response_mask=torch.cat([pad(r.response_mask, R, 0, False) for r in parts]),
        loss_mask=torch.cat([pad(r.loss_mask, R, 0, False) for r in parts]),
        stopped=torch.cat([r.stopped for r in parts]),
        sample_logprobs=torch.cat([pad(r.sample_logprobs, R, 0, False) for r in parts]) if with_logprobs else None,
        routed_experts=routed,
    )


def _pad_routes(t: torch.Tensor, width: int, left: bool) -> torch.Tensor:
    """Route columns (N, W, L, k) padded with -1 to ``width`` columns, on the left or the right."""
    fill = t.new_full((t.shape[0], width - t.shape[1]) + t.shape[2:], -1)
    return torch.cat([fill, t] if left else [t, fill], dim=1)
