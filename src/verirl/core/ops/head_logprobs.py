"""Log p(label) and entropy through the output layer, without the full logits.

A chunked autograd function: the forward and the backward each compute the (rows x vocab)
logits one chunk of rows at a time, so memory holds one chunk's logits, never all of them.
The numbers are those of `verirl.core.algo.logprobs` applied to ``hidden @ weight.T + bias``,
to float rounding.
"""
from __future__ import annotations

import torch

from verirl.core.ops.linear import PackedLinear


CPU_BUDGET = 1 << 22  # float32 logits per chunk on a CPU (16 MB)
ACCELERATOR_BUDGET = 1 << 26  # on a GPU or NPU (256 MB)


def auto_chunk(vocab: int, device: str = "cpu", budget_elems: int = 0) -> int:
    """Rows per chunk so one chunk's float32 logits stay near ``budget_elems`` (0: the device type's
    budget), and at least 64 rows (a product with fewer runs well below the matmul rate).

    CPU, 4M logits (16 MB): less peak memory than larger chunks at the same step time.
    Accelerators, 64M logits (256 MB; 1,365 rows of a 49k vocabulary): a chunk's work there takes
    microseconds, so small chunks are bound by kernel launches. The figures behind both budgets:
    BENCHMARKS.md, "Kernel choices"."""
    budget = budget_elems or (CPU_BUDGET if device == "cpu" else ACCELERATOR_BUDGET)
    return max(64, budget // max(vocab, 1))


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """log p(label) and entropy through the output layer, ``chunk`` rows at a time.

    The full (rows x vocab) logits never exist: the forward keeps only the inputs, and the
    backward recomputes each chunk's logits (one extra matmul) to form
    d logp / dz = onehot - p and d H / dz = -p (z - E_p[z])."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature: float, chunk: int, with_entropy: bool):
        M = hidden.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)  # float32, or float64 when given float64
        logp = hidden.new_empty(M, dtype=acc)
        ent = hidden.new_zeros(M, dtype=acc)
        head = PackedLinear(weight, bias)  # laid out once for all chunks (oneDNN, large float32 CPU heads)
        for s in range(0, M, chunk):
            z = _chunk_logits(head(hidden[s:s + chunk]), temperature)
            lse = torch.logsumexp(z, -1)
            logp[s:s + chunk] = z.gather(-1, labels[s:s + chunk, None]).squeeze(-1) - lse
            if with_entropy:
                p = torch.exp(z - lse[:, None])
                ent[s:s + chunk] = lse - (p * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        ctx.mark_non_differentiable(labels)
        ctx.set_materialize_grads(False)  # an unused output (entropy for metrics only) costs no backward work
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, bias, labels = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        g_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(hidden.dtype, torch.float32)
        g_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        g_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        head = PackedLinear(weight, bias)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            z = _chunk_logits(head(h), t)
            p = torch.softmax(z, -1)
            if g_logp is not None:
                gl = g_logp[s:s + chunk].to(acc)
                dz = p * (-gl)[:, None]  # d logp / dz = onehot(label) - p
                dz.scatter_add_(-1, labels[s:s + chunk, None], gl[:, None])
            else:
                dz = torch.zeros_like(p)
            if ctx.with_entropy and g_ent is not None:
                ge = g_ent[s:s + chunk].to(acc)
                mean_z = (p * z).sum(-1, keepdim=True)
                dz -= ge[:, None] * p * (z - mean_z)  # d H / dz = -p (z - E[z])
            if t != 1.0:
                dz /= t
            dz = dz.to(hidden.dtype)
            if need_h:
                g_h[s:s + chunk] = dz @ weight  # (a laid-out weight.T would cost two more copies of the head)
            if need_w:
                g_w.addmm_(dz.t().to(acc), h.to(acc))
            if need_b:
                g_b += dz.to(acc).sum(0)
        return (g_h, g_w.to(weight.dtype) if need_w else None, g_b.to(bias.dtype) if need_b else None,
                None, None, None, None)


def _chunk_logits(z: torch.Tensor, temperature: float) -> torch.Tensor:
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias=None,
                  temperature: float = 1.0, chunk: int = 0, with_entropy: bool = False):
    """hidden (M, h) states that predict ``labels`` (M,) through the output layer (weight (V, h), bias).

    Returns (log p(label) (M,), entropy (M,) or None), float32, computed in chunks of rows so
    that memory holds one chunk's logits at a time (``chunk`` 0 = `auto_chunk` for the weight's device)."""
    chunk = chunk or auto_chunk(weight.shape[0], weight.device.type)
    logp, ent = _ChunkedHeadLogprobs.apply(hidden, weight, bias, labels, float(temperature), int(chunk),
                                           bool(with_entropy))
    return logp, (ent if with_entropy else None)


class _VocabParallelHeadLogprobs(torch.autograd.Function):
    """`_ChunkedHeadLogprobs` over an output layer whose vocabulary rows are split across the ranks of
    ``group`` (tensor parallelism): each rank holds rows [start, start + V_local) and the same hidden
    states; a chunk's log-sum-exp, the label's logit and E_p[z] are combined across the group, so no
    rank ever holds more than (chunk x V_local) logits. The backward sums the hidden states' gradient
    over the group (each rank's share of the vocabulary contributes its part) and leaves each rank
    the gradient of its own rows."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, start: int, group, temperature: float, chunk: int,
                with_entropy: bool):
        import torch.distributed as dist

        M, local = hidden.shape[0], weight.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        logp = hidden.new_empty(M, dtype=acc)
        ent = hidden.new_zeros(M, dtype=acc)
        lse_all = hidden.new_empty(M, dtype=acc)
        mean_z_all = hidden.new_zeros(M, dtype=acc)
        mine = (labels >= start) & (labels < start + local)
        index = torch.where(mine, labels - start, torch.zeros_like(labels))
        head = PackedLinear(weight, bias)
        for s in range(0, M, chunk):
            z = _chunk_logits(head(hidden[s:s + chunk]), temperature)
            top = z.max(-1).values
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            sums = torch.exp(z - top[:, None]).sum(-1)
            picked = torch.where(mine[s:s + chunk], z.gather(-1, index[s:s + chunk, None]).squeeze(-1),
                                 torch.zeros_like(top))
            parts = torch.stack([sums, picked])
            dist.all_reduce(parts, group=group)  # the whole vocabulary's sum of exp, the label's logit
            lse = top + torch.log(parts[0])
            lse_all[s:s + chunk] = lse
            logp[s:s + chunk] = parts[1] - lse
            if with_entropy:
                mean_z = (torch.exp(z - lse[:, None]) * z).sum(-1)
                dist.all_reduce(mean_z, group=group)
                mean_z_all[s:s + chunk] = mean_z
                ent[s:s + chunk] = lse - mean_z
        ctx.save_for_backward(hidden, weight, bias, labels, lse_all, mean_z_all)
        ctx.start, ctx.group, ctx.temperature, ctx.chunk, ctx.with_entropy = start, group, temperature, chunk, with_entropy
        ctx.mark_non_differentiable(labels)
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        import torch.distributed as dist

        hidden, weight, bias, labels, lse_all, mean_z_all = ctx.saved_tensors
        t, chunk, start, local = ctx.temperature, ctx.chunk, ctx.start, weight.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        g_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        g_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        g_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        mine = (labels >= start) & (labels < start + local)
        index = torch.where(mine, labels - start, torch.zeros_like(labels))
        head = PackedLinear(weight, bias)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]
            z = _chunk_logits(head(h), t)
            p = torch.exp(z - lse_all[s:s + chunk, None])  # this rank's share of the whole softmax
            dz = torch.zeros_like(p)
            if g_logp is not None:
                gl = g_logp[s:s + chunk].to(acc)
                dz -= p * gl[:, None]
                dz.scatter_add_(-1, index[s:s + chunk, None], torch.where(mine[s:s + chunk], gl, 0.0)[:, None])
            if ctx.with_entropy and g_ent is not None:
                ge = g_ent[s:s + chunk].to(acc)
                dz -= ge[:, None] * p * (z - mean_z_all[s:s + chunk, None])
            if t != 1.0:
                dz /= t
            if need_h:
                g_h[s:s + chunk] = dz @ weight.to(acc)
            if need_w:
                g_w.addmm_(dz.t(), h.to(acc))
            if need_b:
                g_b += dz.sum(0)
        if need_h:
            dist.all_reduce(g_h, group=ctx.group)  # the hidden states reach every rank's rows
        return (g_h.to(hidden.dtype) if need_h else None, g_w.to(weight.dtype) if need_w else None,
                g_b.to(bias.dtype) if need_b else None, None, None, None, None, None, None)


def vocab_parallel_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, start: int,
                                 group=None, bias=None, temperature: float = 1.0, chunk: int = 0,
                                 with_entropy: bool = False):
    """`head_logprobs` for an output layer split by vocabulary rows across ``group``: this rank holds
    ``weight`` (V_local, h), the rows [start, start + V_local) of the whole (V, h) head, and the same
    ``hidden`` (M, h) and ``labels`` (M,, ids of the whole vocabulary) as the other ranks. Every rank
    gets the same log p(label) and entropy, equal to `head_logprobs` on the whole head; no rank
    computes more than (chunk x V_local) logits at a time. ``chunk`` 0: `auto_chunk` of V_local."""
    chunk = chunk or auto_chunk(weight.shape[0], weight.device.type)
    logp, ent = _VocabParallelHeadLogprobs.apply(hidden, weight, bias, labels, int(start), group, float(temperature),
                                                 int(chunk), bool(with_entropy))
    return logp, (ent if with_entropy else None)
