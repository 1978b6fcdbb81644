"""A lean forward for decoding Llama-family models (Llama, Qwen2, Qwen3, Mistral, SmolLM2) and the
mixture-of-experts families Qwen2-MoE, Qwen3-MoE and Mixtral.

Generation is one small forward per token, so on a small model the time goes to Python
and dispatch rather than arithmetic: transformers' forward builds masks, walks cache
objects and calls ~30 modules per layer. This forward reads the same weights and runs
the same arithmetic (the model's RMSNorm formula, Qwen3's per-head q/k norms before the rotary,
its rotary table and rotate-half products, attention) with
* q/k/v and gate/up projections fused into one matmul each (weights concatenated once
  per generate call), the rotary applied to q and k together from a table built once,
* a preallocated KV cache written in place, masks as additive key biases sliced per step,
* short attention as two matmuls (`verirl.core.ops.attention`), long prefills through SDPA,
* nothing but tensors between the layers,
* a LoRA-adapted layer's weight merged (W + scale x B A, `verirl.models.lora.merged_weight`) when the
  weights are laid out: the adapters cost nothing per decoding step.
A sparse layer (`_Moe`) routes each token by `verirl.models.moe.route` (the family's transformers
router: softmax in float32, top-k, renormalised where the family does) and computes every chosen
(token, expert) pair in one grouped matrix product per projection (`torch.nn.functional.grouped_mm`
over the pairs sorted by expert, int32 offsets from exact counts: no capacity, no token dropped) on
views of the experts' fused 3-D weights (gate_up_proj (E, 2I, H), down_proj (E, H, I); not copied);
Qwen2-MoE's shared expert is added times the sigmoid of its gate. Layers a MoE config keeps dense
(mlp_only_layers, decoder_sparse_step) run the dense MLP. DeepSeek-V3 (MLA attention) is left to
transformers' forward.
With ``low`` (model.compute_dtype, mixed precision) the dense products of each layer (q/k/v, o, gate/up,
down, the router, a shared expert and its gate) multiply in that dtype from weights cast once per
generate call, as they do under the trainer's autocast; the experts' grouped products, which autocast
leaves alone, multiply in the experts' dtype; the norms, rotary, attention, residual stream, output
layer and sampling stay in the model's dtype.
Its logits equal the model's own to float rounding (tests check it, and that greedy
decoding gives the same tokens as ``transformers.generate``).

For routing replay and its tests, a decoder records the experts each sparse layer chose
(``record_routes``: ``last_routes``, one (B, T, k) int64 tensor per sparse layer in layer order for the
tokens of the last `forward`) and can perturb its routers (``route_noise``: the standard deviation of
Gaussian noise added to every router logit before the choice, drawn from a generator seeded with
``route_seed`` at its first draw; a CUDA graph is not captured with it: the engine decodes eagerly). Both are
class attributes, off by default, that an instance or a test may set. With a captured CUDA graph step,
``last_routes`` holds the graph's tensors, rewritten at each replay: copy them before the next step.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F

from verirl.core.ops.attention import small_attention, small_enough
from verirl.core.ops.linear import PackedLinear
from verirl.models.lora import merged_weight as W
from verirl.models.moe import SOFTMAX, Routing, is_moe_block, route, routing

SUPPORTED = {"llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral"}
_WINDOWED = {"mistral", "mixtral"}  # families whose sliding_window applies without use_sliding_window


def _lean_experts(block) -> bool:
    """The experts of a sparse block in the layout `_Moe` computes: fused gate;up, no bias, not transposed,
    no post-expert norm, SiLU, all of the model's experts on this rank."""
    ex = block.experts
    return (getattr(ex, "has_gate", True) and not getattr(ex, "has_bias", False)
            and not getattr(ex, "is_transposed", False) and getattr(ex, "is_concatenated", True)
            and not getattr(ex, "has_post_expert_norm", False) and not getattr(ex, "_is_expert_parallel", False)
            and getattr(ex, "down_proj", None) is not None and ex.gate_up_proj.dim() == 3
            and ex.gate_up_proj.shape[0] == block.gate.weight.shape[0])


def lean_supported(model) -> bool:
    cfg = model.config
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED:
        return False
    window = getattr(cfg, "sliding_window", None) if (
        mt in _WINDOWED or getattr(cfg, "use_sliding_window", False)) else None
    if window or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        return False  # a window changes which keys each token sees: left to transformers' forward
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu" or not hasattr(sys.modules[type(model).__module__], "apply_rotary_pos_emb"):
        return False
    r = routing(cfg)
    if r is None:
        return True
    blocks = [layer.mlp for layer in model.get_decoder().layers[:cfg.num_hidden_layers] if is_moe_block(layer.mlp)]
    return r.family == SOFTMAX and all(_lean_experts(b) for b in blocks)


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (S, K) grouped by ``offs`` (E,) int32 cumulative ends, group e times ``w[e]`` (K, N):
    one grouped product (rows past offs[-1] would be left unwritten: every row here is in a group). A CUDA
    device without grouped_mm (compute capability < 8.0) multiplies group by group."""
    x = x.to(w.dtype)  # grouped_mm takes one dtype (autocast does not cast for it)
    if w.device.type != "cuda" or torch.cuda.get_device_capability(w.device) >= (8, 0):
        mm = getattr(F, "grouped_mm", None)
        return mm(x, w, offs=offs) if mm is not None else torch._grouped_mm(x, w, offs=offs)
    out, start = x.new_empty((x.shape[0], w.shape[-1])), 0
    for e, end in enumerate(offs.tolist()):
        torch.mm(x[start:end], w[e], out=out[start:end])
        start = end
    return out


@dataclass
class _Dense:
    """A SwiGLU MLP: down(silu(gate x) * up x), gate and up as one product."""
    gu: PackedLinear
    down: PackedLinear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gu(x).chunk(2, -1)
        return self.down(F.silu(g) * u)


@dataclass
class _Moe:
    """A sparse MoE block: the router, the chosen experts in grouped products, a gated shared expert."""
    router: PackedLinear  # (E, H)
    r: Routing
    w_gu: torch.Tensor  # (E, H, 2I): a view of experts.gate_up_proj
    w_d: torch.Tensor  # (E, I, H): a view of experts.down_proj
    round_weights: bool  # the router's weights rounded to its logits' dtype (Qwen routers; Mixtral keeps float32)
    shared: Optional[_Dense] = None
    shared_gate: Optional[PackedLinear] = None  # (1, H)

    def __call__(self, x: torch.Tensor, low: torch.dtype, dec: "LeanDecoder") -> torch.Tensor:
        """x (B, T, H) in the residual stream's dtype; the router and the shared expert multiply in ``low``,
        the experts in their weights' dtype."""
        B, T, Hd = x.shape
        x2 = x.reshape(-1, Hd)
        xl = x2.to(low)
        logits = self.router(xl)  # (B*T, E)
        if dec.route_noise:
            if logits.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("route_noise draws on the host's generator: a step with it is not captured")
            logits = logits + dec.route_noise * torch.randn(logits.shape, generator=dec.noise_gen(logits.device),
                                                            device=logits.device, dtype=torch.float32)
        w, ids = route(logits, self.r)
        if self.round_weights:
            w = w.to(logits.dtype)
        if dec.record_routes:
            dec.last_routes.append(ids.view(B, T, -1))
        k = ids.shape[1]
        flat, order = torch.sort(ids.reshape(-1), stable=True)  # the (token, k) pairs grouped by expert
        hist = flat.float() if flat.device.type == "cpu" else flat.int()  # histc: float on CPU, int on CUDA
        offs = torch.cumsum(torch.histc(hist, bins=self.r.num_experts, min=0, max=self.r.num_experts - 1),
                            0, dtype=torch.int32)
        g, u = _grouped(x2[order // k], self.w_gu, offs).chunk(2, -1)
        y = _grouped(F.silu(g) * u, self.w_d, offs) * w.reshape(-1)[order, None]
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        out = y[inv].view(-1, k, Hd).sum(1)  # each token's k experts, summed in a fixed order
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(xl)) * self.shared(xl)
        return out.view(B, T, Hd)


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    eps1: float
    eps2: float
    qkv: PackedLinear
    o: PackedLinear
    mlp: Union[_Dense, _Moe]
    q_norm: Optional[torch.Tensor] = None  # (d,) Qwen3's RMSNorm over each head's q, before the rotary
    k_norm: Optional[torch.Tensor] = None
    eps_qk: float = 1e-6


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

    record_routes: bool = False  # keep each sparse layer's chosen experts of the last forward in last_routes
    route_noise: Optional[float] = None  # std of Gaussian noise on the router logits (tests of routing replay)
    route_seed: int = 0  # seeds the noise's generator

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
        self.last_routes: list[torch.Tensor] = []  # with record_routes: (B, T, k) expert ids per sparse layer
        self._gen: Optional[torch.Generator] = None

    def noise_gen(self, device: torch.device) -> torch.Generator:
        """The router noise's generator, seeded with ``route_seed`` at its first use."""
        if self._gen is None:
            self._gen = torch.Generator(device=device).manual_seed(self.route_seed)
        return self._gen

    def pack(self, model) -> None:
        """The layers' weights arranged for decoding (fused and, with ``low``, cast): again after the
        model's weights changed in place mid-call (an asynchronous run's partial rollouts), the cache kept."""
        dec, cfg = model.get_decoder(), model.config
        head = model.get_output_embeddings()
        self.head = PackedLinear(W(head), head.bias)
        r = routing(cfg)

        def linear(w, b):
            if self.low is not None:
                w, b = w.to(self.low), None if b is None else b.to(self.low)
            return PackedLinear(w, b)

        def dense(m) -> _Dense:
            return _Dense(linear(torch.cat([W(m.gate_proj), W(m.up_proj)]), _cat(m.gate_proj.bias, m.up_proj.bias)),
                          linear(W(m.down_proj), m.down_proj.bias))

        def sparse(m) -> _Moe:
            ex = m.experts
            shared = getattr(m, "shared_expert", None)
            gate = getattr(m, "shared_expert_gate", None)
            return _Moe(linear(m.gate.weight, None), r, ex.gate_up_proj.transpose(-2, -1),
                        ex.down_proj.transpose(-2, -1), cfg.model_type != "mixtral",
                        None if shared is None else dense(shared), None if gate is None else linear(W(gate), gate.bias))

        self.layers = []
        with torch.no_grad():
            for layer in dec.layers[:cfg.num_hidden_layers]:
                a, m = layer.self_attn, layer.mlp
                qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
                self.layers.append(_Layer(
                    layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                    layer.input_layernorm.variance_epsilon, layer.post_attention_layernorm.variance_epsilon,
                    linear(torch.cat([W(a.q_proj), W(a.k_proj), W(a.v_proj)]),
                           _cat(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias)),
                    linear(W(a.o_proj), a.o_proj.bias),
                    sparse(m) if is_moe_block(m) else dense(m),
                    None if qn is None else qn.weight, None if kn is None else kn.weight,
                    1e-6 if qn is None else qn.variance_epsilon))

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
        (0 = may attend, -inf = may not). Returns the logits of the last position (B, V). With
        ``record_routes``, ``last_routes`` holds this call's chosen experts afterwards.

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
        if self.record_routes:
            self.last_routes = []
        for i, L in enumerate(self.layers):
            x = _rms(h, L.ln1, L.eps1)
            qkv = L.qkv(x.to(low))
            qk = qkv[..., :(H + KVH) * d].view(B, T, H + KVH, d)
            if L.q_norm is not None:  # per head, before the rotary
                qk = torch.cat([_rms(qk[:, :, :H], L.q_norm, L.eps_qk), _rms(qk[:, :, H:], L.k_norm, L.eps_qk)], 2)
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
            h = h + (L.mlp(x, low, self) if isinstance(L.mlp, _Moe) else L.mlp(x.to(low)))
        h = _rms(h[:, -1], self.norm_w, self.norm_eps)
        return self.head(h)
