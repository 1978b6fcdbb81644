"""Variable-length attention kernels: every packed segment in one call, on CUDA.

All take flash-attn's ``flash_attn_varlen_func`` arguments: q (T, H, d) and k/v (T_k, KVH, d) with KVH
dividing H, ``cu_q`` / ``cu_k`` the segments' cumulative query and key lengths, ``max_q`` / ``max_k`` the
longest of each; segment s is ``q[cu_q[s]:cu_q[s+1]]`` against ``k[cu_k[s]:cu_k[s+1]]``, causal aligned to
its last key (bottom-right). `varlen_kernel` picks one for a query tensor: flash-attn's function when the
package is installed, else torch's flash kernels (`flash_varlen`, or torch's ``varlen_attn`` through
`torch_varlen`) where they run: an Ampere or newer GPU, a head size that is a multiple of 8 up to 256, no
attention dropout. None elsewhere: the caller computes attention its own way
(`verirl.train.packing`'s buckets). The figures: BENCHMARKS.md, "Kernel choices".
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from verirl.core.errors import ConfigError, env_choice

# what `varlen_kernel` found installed: fn (None: none), torch (fn is torch's, with its kernel's limits)
_KERNEL = {}


class _FlashVarlen(torch.autograd.Function):
    """torch's flash kernels on packed segments, called directly (``aten._flash_attention_forward`` and
    ``_backward``, what ``torch.nn.attention.varlen.varlen_attn`` runs on its flash path): the same
    kernels without that function's custom-op dispatch, whose host time a call adds up over the layers
    of a forward and backward (BENCHMARKS.md, "Kernel choices"). q (T, H, d), k/v (T_k, KVH, d) with KVH
    dividing H; no dropout."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale, causal: bool):
        out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale)
        ctx.save_for_backward(q, k, v, cu_q, cu_k, out, lse, seed, offset)
        ctx.args = (max_q, max_k, causal, scale)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v, cu_q, cu_k, out, lse, seed, offset = ctx.saved_tensors
        max_q, max_k, causal, scale = ctx.args
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale)
        return dq, dk, dv, None, None, None, None, None, None


def flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False):
    """`_FlashVarlen` called as flash-attn's ``flash_attn_varlen_func`` is."""
    if dropout_p:
        raise ConfigError("torch's varlen kernels take no attention dropout here; install flash-attn, or set "
                          "actor.use_remove_padding=false.")
    return _FlashVarlen.apply(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k),
                              softmax_scale, bool(causal))


def torch_varlen(direct: Optional[bool] = None):
    """torch's ``varlen_attn`` called as flash-attn's ``flash_attn_varlen_func`` is (the call below),
    or None where this torch has none. ``direct`` (the default unless ``VERIRL_VARLEN=torch``): the kernels
    that function runs on its flash path, called without its dispatch (`flash_varlen`). Whether they run
    at all (CUDA, half precision, head size, GPU generation) is `varlen_kernel`'s decision."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    if direct is None:
        direct = env_choice("VERIRL_VARLEN") == "auto"
    if direct:
        return flash_varlen
    params = inspect.signature(varlen_attn).parameters

    def call(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=None, causal=False):
        if dropout_p:
            raise ConfigError("torch's varlen_attn has no attention dropout; install flash-attn, or set "
                              "actor.use_remove_padding=false.")
        kw = {} if softmax_scale is None else {"scale": softmax_scale}
        if causal:  # flash-attn's causal: aligned to the last key of each segment (bottom-right)
            if "is_causal" in params:
                kw["is_causal"] = True
            else:
                kw["window_size"] = (-1, 0)
        H, KVH = q.shape[1], k.shape[1]
        if KVH != H:
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    return call if ("is_causal" in params or "window_size" in params) else None


def varlen_kernel(query: torch.Tensor, dropout: float = 0.0):
    """For CUDA half-precision tensors: flash-attn's ``flash_attn_varlen_func`` when the package is
    installed, else torch's ``varlen_attn`` where its flash kernel runs (an Ampere or newer GPU, head
    size a multiple of 8 up to 256, no attention dropout); None elsewhere (the buckets below are
    used). ``VERIRL_VARLEN=buckets`` keeps the buckets everywhere."""
    if query.device.type != "cuda" or query.dtype not in (torch.float16, torch.bfloat16):
        return None
    if "fn" not in _KERNEL:
        fn, ours = None, False
        if env_choice("VERIRL_VARLEN") != "buckets":
            try:
                from flash_attn import flash_attn_varlen_func as fn
            except ImportError:
                fn = torch_varlen()
                ours = fn is not None
        _KERNEL["fn"], _KERNEL["torch"] = fn, ours
    d = query.shape[-1]
    if _KERNEL.get("torch") and not (dropout == 0 and d <= 256 and d % 8 == 0
                                     and torch.cuda.get_device_capability(query.device) >= (8, 0)):
        return None
    return _KERNEL["fn"]
