"""float32 products with a weight on the CPU through oneDNN instead of torch's default BLAS (MKL).

torch runs a float32 ``F.linear`` on the CPU through MKL's sgemm, which on AMD processors takes a
generic path and, for the skinny products of decoding (64 rows against a weight), spends more
time packing the weight into its panel layout at every call than multiplying (a `perf` profile of
the embedded default's rollout: sgemm's pack and copy routines above its compute kernel). oneDNN,
also inside every x86 build of torch (the `mkldnn` ops that torch.compile's CPU backend emits),
multiplies at the machine's rate, and can hold a weight already laid out in its blocked format,
so a generate call lays each weight out once and its 32 decoding steps reuse it. The products'
times through both, by machine and date: BENCHMARKS.md ("Kernel choices"); bench/rollout.py prints
this machine's matmul rates.

The results are the same products summed in another order: equal to float32 rounding (relative
1e-6 here). Everything else (a tensor on another device, another dtype, a torch built without
oneDNN) goes through ``F.linear``; ``VERIRL_ONEDNN=0`` in the environment at start turns the whole
path off.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from verirl.core.errors import env_choice


@functools.cache  # read once: it is asked on every product
def onednn_available() -> bool:
    return (env_choice("VERIRL_ONEDNN") == "1" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


# Products of fewer multiply-adds stay with F.linear: for them oneDNN's per-call set-up outweighs its
# faster arithmetic (the embedded model's decoding step, 64 x 128 -> 1,024, is slower through it:
# BENCHMARKS.md, "Kernel choices").
MIN_MACS = 1 << 24


def _plain(t: torch.Tensor) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.dtype == torch.float32


def _fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """oneDNN for this product: float32 CPU tensors (not FSDP's DTensors), big enough, oneDNN present."""
    return (w.dim() == 2 and x.numel() * w.shape[0] >= MIN_MACS and _plain(x) and _plain(w)
            and onednn_available())


def _dnn(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


class _Linear(torch.autograd.Function):
    """x @ w.T + b with the forward and the input's gradient through oneDNN; the weight's gradient
    (activations x activations, where oneDNN is no faster here) through torch.mm."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return _dnn(x, w, b)

    @staticmethod
    @once_differentiable  # a second derivative through it raises instead of coming out wrong
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _dnn(gy, w.t().contiguous(), None)
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            g2 = gy.reshape(-1, gy.shape[-1])
            if ctx.needs_input_grad[1]:
                gw = g2.t().mm(x.reshape(-1, x.shape[-1]))
            if ctx.has_bias and ctx.needs_input_grad[2]:
                gb = g2.sum(0)
        return gx, gw, gb


def linear(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear``, through oneDNN where it is faster (float32 on the CPU, at least `MIN_MACS`
    multiply-adds); differentiable."""
    if _fits(x, w) and (b is None or _plain(b)) and not torch.is_autocast_enabled("cpu"):
        return _Linear.apply(x, w, b)  # (under autocast, F.linear: it multiplies in the autocast dtype)
    return F.linear(x, w, b)


class FastLinear(torch.nn.Linear):
    """``nn.Linear`` whose forward is `linear`: same parameters, state dict and hooks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_fast_linears(model: torch.nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` a `FastLinear` (in place: its class changes, nothing
    else). Returns how many. Nothing is done where oneDNN is absent or turned off."""
    if not onednn_available():
        return 0
    n = 0
    for m in model.modules():
        if type(m) is torch.nn.Linear:
            m.__class__ = FastLinear
            n += 1
    return n


class PackedLinear:
    """``F.linear(x, weight, bias)`` for inference with a weight that does not change while this object
    lives. A float32 CPU weight of at least `MIN_ENTRIES` entries is laid out once in oneDNN's format
    (a copy: later writes to ``weight`` are not seen), and products of at least `MIN_MACS`
    multiply-adds use it. x (..., in) -> (..., out)."""

    MIN_ENTRIES = 1 << 18

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        self.weight, self.bias = weight, bias
        self.packed = None
        if weight.numel() >= self.MIN_ENTRIES and _plain(weight) and onednn_available():
            with torch.no_grad():
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
                self.bias = None if bias is None else bias.detach().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or not _fits(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return _dnn(x, self.packed, self.bias)
