"""Records passed between rooms. Shapes: N = prompts * n sequences, P = prompt width, R = response width."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class Prompt:
    """One training or evaluation problem."""
    messages: list[dict[str, str]]  # chat messages, rendered by the tokenizer's chat template
    label: str  # ground truth, passed to the verifiers
    task: str  # routes the sample to its reward rules
    ids: list[int] = field(default_factory=list)  # templated prompt token ids
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rollout:
    """Sampled responses for a batch of prompts, n per prompt, the samples of a prompt contiguous."""
    prompt_ids: torch.Tensor  # (N, P) left-padded with pad id
    prompt_mask: torch.Tensor  # (N, P) 1 on real prompt tokens
    response_ids: torch.Tensor  # (N, R) right-padded with pad id
    response_mask: torch.Tensor  # (N, R) 1 up to AND including the first stop token (by position, never by id)
    # (N, R) 1 on the response tokens the policy sampled and is trained on (loss, KL, entropy), 0 on padding
    # and on tokens it did not sample (a multi-turn rollout's tool and environment output); within
    # response_mask, which marks the tokens that exist (lengths, the stop, packing). Every engine today
    # samples every response token: the two are equal.
    loss_mask: torch.Tensor
    stopped: torch.Tensor  # (N,) bool: ended on a stop token (False: cut at max_new_tokens)
    # (N, R) float32: each sampled token's log-prob as the engine computed it, after temperature (native:
    # before top-k / top-p; vllm: after, renormalised over the kept tokens); None for engines that do not
    # return them (hf, replay, and greedy decoding)
    sample_logprobs: Optional[torch.Tensor] = None
    # (N, P + R, L_moe, k) int16: of a mixture-of-experts model, the experts the engine routed each token to in
    # each sparse layer (layer order), columns aligned with cat(prompt_ids, response_ids); -1 where not recorded
    # (pads, a token never fed to the model). None: not recorded (a dense model, an engine that does not return
    # them). Read by routing replay (algo.router_replay=R3) and moe/router_disagreement.
    routed_experts: Optional[torch.Tensor] = None

    @property
    def response_lengths(self) -> torch.Tensor:  # (N,)
        return self.response_mask.sum(-1)

    @property
    def loss_lengths(self) -> torch.Tensor:  # (N,) tokens trained on
        return self.loss_mask.sum(-1)

    @property
    def prompt_lengths(self) -> torch.Tensor:  # (N,)
        return self.prompt_mask.sum(-1)


@dataclass(frozen=True)
class TrainBatch:
    """What the policy update consumes: a rollout plus per-sequence advantages and reference quantities."""
    rollout: Rollout
    advantages: torch.Tensor  # (N,) per response, or (N, R) per token
    old_logprobs: Optional[torch.Tensor] = None  # (N, R); None = on-policy, use current log-probs detached
    ref_logprobs: Optional[torch.Tensor] = None  # (N, R); None = no KL term
