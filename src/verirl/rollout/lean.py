"""A lean forward for decoding Llama-family models (Llama, Qwen2, Mistral, SmolLM2).

Generation is one small forward per token, so on a small model the time goes to Python
and dispatch rather than arithmetic: transformers' forward builds masks, walks cache
objects and calls ~30 modules per layer. This forward reads the same weights and runs
the same arithmetic (the model's RMSNorm formula, its rotary table and rotate-half
products, attention) with
* q/k/v and gate/up projections fused into one matmul each (weights concatenated once
  per generate call), the rotary applied to q and k together from a table built once,
* a preallocated KV cache written in place, masks as additive key biases sliced per step,
* short attention as two matmuls (`verirl.core.ops.attention`), long prefills through SDPA,
* nothing but tensors between the layers,
* a LoRA-adapted layer's weight merged (W + scale x B A, `verirl.models.lora.merged_weight`) when the
  weights are laid out: the adapters cost nothing per decoding step.
With ``low`` (model.compute_dtype, mixed precision) the four products of each layer multiply in that
dtype from weights cast once per generate call; the norms, rotary, attention, residual stream,
output layer and sampling stay in the model's dtype.
Its logits equal the model's own to float rounding (a test checks it, and that greedy
decoding gives the same tokens as ``transformers.generate``).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from verirl.core.ops.attention import small_attention, small_enough
from verirl.core.ops.linear import PackedLinear
from verirl.models.lora import merged_weight as W

SUPPORTED = {"llama", "qwen2", "mistral"}


def lean_supported(model) -> bool:
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    window = getattr(cfg, "sliding_window", None) if (
        cfg.model_type == "mistral" or getattr(cfg, "use_sliding_window", False)) else None
    if window is not None:
        return False  # a window changes which keys each token sees: left to transformers' forward
    act = getattr(cfg, "hidden_act", "silu")
    return act == "silu" and hasattr(sys.modules[type(model).__module__], "apply_rotary_pos_emb")


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    eps1: float
    eps2: float
    qkv: PackedLinear
    o: PackedLinear
    gu: PackedLinear
    down: PackedLinear


def _cat(*ts):
    if any(t is None for t in ts):
        return None if all(t is None for t in ts) else torch.cat([t if t is not None else
                                                                 torch.zeros_like(ts[0]) for t in ts])
    return torch.cat(ts)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm of Llama-family models. float32: torch's fused rms_norm (the same arithmetic, one
    call); other dtypes: their formula (normalise in float32, round, then scale)."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], w, eps)
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


class LeanDecoder:
    """Weights of ``model`` arranged for decoding, and a KV cache for one generate call."""

    def __init__(self, model, low: Optional[torch.dtype] = None):
        dec = model.get_decoder()
        cfg = model.config
        self.rotary = dec.rotary_emb
        self.embed = model.get_input_embeddings().weight
        self.norm_w, self.norm_eps = dec.norm.weight, dec.norm.variance_epsilon
        self.H = cfg.num_attention_heads
        self.KVH = getattr(cfg, "num_key_value_heads", None) or self.H
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.low = low if low is not None and low != self.embed.dtype else None
        self.layers: list[_Layer] = []
        self.pack(model)
        self.scale = self.d ** -0.5
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def pack(self, model) -> None:
        """The layers' weights arranged for decoding (fused and, with ``low``, cast): again after the
        model's weights changed in place mid-call (an asynchronous run's partial rollouts), the cache kept."""
        dec, cfg = model.get_decoder(), model.config
        head = model.get_output_embeddings()
        self.head = PackedLinear(W(head), head.bias)

        def linear(w, b):
            if self.low is not None:
                w, b = w.to(self.low), None if b is None else b.to(self.low)
            return PackedLinear(w, b)

        self.layers = []
        with torch.no_grad():
            for layer in dec.layers[:cfg.num_hidden_layers]:
                a, m = layer.self_attn, layer.mlp
                self.layers.append(_Layer(
                    layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                    layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon,
                    linear(torch.cat([W(a.q_proj), W(a.k_proj), W(a.v_proj)]),
                           _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)),
                    linear(W(a.o_proj), a.o_proj.bias),
                    linear(torch.cat([W(m.gate_proj), W(m.up_proj)]), _cat(m.gate_proj.bias, m.up_proj.bias)),
                    linear(W(m.down_proj), m.down_proj.bias)))

    def alloc(self, batch: int, length: int, like: torch.Tensor, zeros: bool = False) -> None:
        """A cache of ``length`` positions for ``batch`` rows; ``zeros``: written with zeros (a step that
        attends over the whole cache must not meet NaN in positions not yet written)."""
        shape = (batch, self.KVH, length, self.d)
        new = like.new_zeros if zeros else like.new_empty
        self.k = [new(shape) for _ in self.layers]
        self.v = [new(shape) for _ in self.layers]
        # the model's rotary table for positions 0..length-1, once per call; rotate_half(x) * sin is
        # computed as swap_halves(x) * (-sin1, sin2): the same products, no negation per step
        cos, sin = self.rotary(like[:1, None], torch.arange(length, device=like.device)[None])
        half = self.d // 2
        self.cos, self.sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], -1)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows of the cache."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]

    def repeat(self, n: int) -> None:
        self.k = [t.repeat_interleave(n, 0) for t in self.k]
        self.v = [t.repeat_interleave(n, 0) for t in self.v]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, start, bias: torch.Tensor) -> torch.Tensor:
        """ids/pos (B, T) written at cache columns start..start+T; bias (B, 1, 1, T, start+T) additive
        (0 = may attend, -inf = may not). Returns the logits of the last position (B, V).

        ``start`` a (1,) long tensor instead of an int (T = 1): the step of one shape that a CUDA graph
        captures. The token is written at that column and attends over the whole cache, bias (B, 1, 1,
        1, cache length) masking the columns it may not see."""
        B, T = ids.shape
        fixed = isinstance(start, torch.Tensor)
        small = small_enough(T, self.k[0].shape[2] if fixed else start + T)
        h = F.embedding(ids, self.embed)
        cos, sin = F.embedding(pos, self.cos)[:, :, None], F.embedding(pos, self.sin)[:, :, None]  # (B, T, 1, d)
        H, KVH, d = self.H, self.KVH, self.d
        end = None if fixed else start + T
        low = self.low or h.dtype  # the products' dtype; q/k, h and the cache stay in h's
        for i, L in enumerate(self.layers):
            x = _rms(h, L.ln1, L.eps1)
            qkv = L.qkv(x.to(low))
            qk = qkv[..., :(H + KVH) * d].view(B, T, H + KVH, d)
            swapped = qk.view(B, T, H + KVH, 2, d // 2).flip(-2).view(B, T, H + KVH, d)
            qk = qk * cos + swapped * sin  # rotary on q and k at once
            q, k = qk[:, :, :H], qk[:, :, H:]
            v = qkv[..., (H + KVH) * d:].view(B, T, KVH, d).to(h.dtype)
            if fixed:
                keys = self.k[i].index_copy_(2, start, k.transpose(1, 2))
                vals = self.v[i].index_copy_(2, start, v.transpose(1, 2))
            else:
                self.k[i][:, :, start:end] = k.transpose(1, 2)
                self.v[i][:, :, start:end] = v.transpose(1, 2)
                keys, vals = self.k[i][:, :, :end], self.v[i][:, :, :end]
            if small:
                o = small_attention(q, keys, vals, bias, self.scale)  # (B, T, H, d)
            else:
                o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=bias[:, :, 0],
                                                   scale=self.scale, enable_gqa=KVH != H).transpose(1, 2)
            h = h + L.o(o.reshape(B, T, H * d).to(low))
            x = _rms(h, L.ln2, L.eps2)
            g, u = L.gu(x.to(low)).chunk(2, -1)
            h = h + L.down(F.silu(g) * u)
        h = _rms(h[:, -1], self.norm_w, self.norm_eps)
        return self.head(h)
