"""Mixture-of-experts families as transformers defines them: the routing rule read from a config
(`routing`), the router's top-k choice and weights (`route`), the weights of given experts from live
logits (`reweight`, for routing replay), the sparse blocks of a loaded model (`moe_blocks`) and the
active / total parameter counts (`active_parameters`).

Families (docs/moe.md):
- ``softmax`` (qwen2_moe, qwen3_moe, mixtral): softmax over the experts in float32, top-k, the top-k
  weights renormalised to sum 1 when ``norm_topk_prob`` (mixtral always).
- ``sigmoid_group`` (deepseek_v3): sigmoid scores; the choice adds ``e_score_correction_bias``, keeps the
  ``topk_group`` of ``n_group`` groups ranked by the sum of each group's top 2, then takes the top-k; the
  weights are the uncorrected scores at the chosen experts, renormalised when ``norm_topk_prob``, times
  ``routed_scaling_factor``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from verirl.core.errors import ModelError

SOFTMAX, SIGMOID_GROUP = "softmax", "sigmoid_group"
# model_type -> (family, the config key of the number of routed experts)
FAMILIES = {"qwen2_moe": (SOFTMAX, "num_experts"), "qwen3_moe": (SOFTMAX, "num_experts"),
            "mixtral": (SOFTMAX, "num_local_experts"), "deepseek_v3": (SIGMOID_GROUP, "n_routed_experts")}
# config keys that mark a MoE config of a model_type not in FAMILIES
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class Routing:
    """A MoE family's routing rule, read from a transformers config."""
    family: str  # SOFTMAX (qwen2_moe, qwen3_moe, mixtral) / SIGMOID_GROUP (deepseek_v3)
    num_experts: int
    top_k: int
    norm_topk_prob: bool  # renormalise the top-k weights to sum 1 (mixtral: always True)
    scaling: float = 1.0  # deepseek_v3 routed_scaling_factor
    n_group: int = 1  # deepseek_v3 group routing: the experts split in n_group groups ...
    topk_group: int = 1  # ... of which the choice keeps topk_group


def text_config(config):
    """The language model's config of ``config`` (itself for a text-only model)."""
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def routing(config) -> Optional[Routing]:
    """The rule of a transformers config (its text config), None for a dense model. A MoE config of a
    model_type outside `FAMILIES` raises ModelError naming the supported ones."""
    c = text_config(config)
    mt = getattr(c, "model_type", "")
    if mt not in FAMILIES:
        if any((getattr(c, k, 0) or 0) > 0 for k in _EXPERT_KEYS):
            raise ModelError(f"model_type {mt!r} is a mixture-of-experts model whose routing verirl does not know; "
                             f"supported MoE families: {', '.join(sorted(FAMILIES))} (docs/moe.md).")
        return None
    family, key = FAMILIES[mt]
    e = int(getattr(c, key, 0) or 0)
    if e <= 0:
        return None
    k = int(c.num_experts_per_tok)
    if family == SIGMOID_GROUP:
        return Routing(family, e, k, bool(c.norm_topk_prob), float(c.routed_scaling_factor),
                       int(c.n_group or 1), int(c.topk_group or 1))
    return Routing(family, e, k, True if mt == "mixtral" else bool(c.norm_topk_prob))


def route(logits: torch.Tensor, r: Routing, bias: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, E) router logits -> (weights (T, k) float32, ids (T, k) int64), as the family's transformers
    router computes them. ``bias``: deepseek_v3's e_score_correction_bias (E,), used for the choice only."""
    x = logits.float()
    if r.family == SOFTMAX:
        probs = torch.softmax(x, dim=-1)  # (T, E)
        w, ids = torch.topk(probs, r.top_k, dim=-1)
        if r.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return w, ids
    scores = x.sigmoid()  # (T, E)
    choice = scores if bias is None else scores + bias.float()
    if r.n_group > 1:
        per = r.num_experts // r.n_group
        group = choice.view(-1, r.n_group, per).topk(2, dim=-1)[0].sum(dim=-1)  # (T, n_group)
        keep = torch.topk(group, k=r.topk_group, dim=-1, sorted=False)[1]
        mask = torch.zeros_like(group).scatter_(1, keep, 1).bool()
        choice = choice.masked_fill(~mask.repeat_interleave(per, dim=1), float("-inf"))
    ids = torch.topk(choice, k=r.top_k, dim=-1, sorted=False)[1]
    return _sigmoid_weights(scores, ids, r), ids


def _sigmoid_weights(scores: torch.Tensor, ids: torch.Tensor, r: Routing) -> torch.Tensor:
    w = scores.gather(1, ids)
    if r.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * r.scaling


def reweight(logits: torch.Tensor, ids: torch.Tensor, r: Routing) -> torch.Tensor:
    """The weights (T, k) float32 the family gives to the experts ``ids`` (T, k) from the live (T, E)
    ``logits`` (routing replay); differentiable in ``logits``."""
    x = logits.float()
    ids = ids.long()
    if r.family == SOFTMAX:
        w = torch.softmax(x, dim=-1).gather(1, ids)
        return w / w.sum(dim=-1, keepdim=True) if r.norm_topk_prob else w
    return _sigmoid_weights(x.sigmoid(), ids, r)


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a loaded transformers causal LM (``model.model.layers`` or the like)."""
    for name in ("model.layers", "model.language_model.layers", "model.model.layers", "layers"):
        m = model
        for part in name.split("."):
            m = getattr(m, part, None)
        if isinstance(m, torch.nn.ModuleList):
            return m
    raise ModelError(f"{type(model).__name__} has no decoder layers at model.layers; verirl's MoE support "
                     f"covers transformers' {', '.join(sorted(FAMILIES))} models.")


def is_moe_block(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a sparse MoE block: a ``gate`` router and ``experts`` with fused 3-D weights."""
    experts = getattr(module, "experts", None)
    return hasattr(module, "gate") and isinstance(getattr(experts, "gate_up_proj", None), torch.Tensor)


def moe_blocks(model) -> list[tuple[int, torch.nn.Module]]:
    """(decoder layer index, its sparse MoE block) for every sparse layer of a loaded transformers model,
    in order; empty for a dense model."""
    if routing(model.config) is None:
        return []
    out = []
    for i, layer in enumerate(decoder_layers(model)):
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and is_moe_block(mlp):
            out.append((i, mlp))
    return out


def active_parameters(config) -> tuple[int, int]:
    """(active, total) parameters per token of a MoE config (embeddings counted once each: tied ones once,
    untied input and output embeddings both). Active counts top_k of the routed experts of each sparse
    layer and everything else (attention, norms, routers, shared experts, dense layers, embeddings).
    Counted on a model built on the meta device (no memory); a dense config gives (total, total)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(text_config(config))
    total = sum(p.numel() for p in model.parameters())
    r = routing(model.config)
    if r is None:
        return total, total
    idle = 0
    for _, block in moe_blocks(model):
        routed = sum(p.numel() for p in block.experts.parameters())
        idle += routed // r.num_experts * (r.num_experts - r.top_k)
    return total - idle, total
