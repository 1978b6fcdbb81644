"""Ulysses sequence parallelism for a packed row: sp ranks share one packed row of T tokens.

Each rank of an sp group holds a contiguous slice of the row, T_local = T_pad / sp tokens, the
row padded at its end to T_pad, the next multiple of sp; rank r holds packed positions
[r * T_local, (r + 1) * T_local). Embeddings, projections, MLPs, norms and the output layer run on
the rank's own tokens. Attention needs every token of a segment, so around it two all-to-alls
exchange a sequence shard for a head shard (DeepSpeed-Ulysses):

    q (1, H, T_local, d) --seq_to_heads--> (1, H/sp, T_pad, d)   rank r: query heads r*H/sp ...
    k, v (1, KVH, T_local, d) ----------> (1, KVH/sp, T_pad, d)  and their key/value heads
    attention over the whole row's layout on those heads -> (1, T, H/sp, d)
    out --heads_to_seq--> (1, T_local, H, d)

Query head h uses key/value head h // (H / KVH), so rank r's contiguous block of query heads uses
exactly its block of key/value heads; H and KVH must both divide by sp (`check_ulysses`).

Pad tokens (at most sp - 1, at the end of the row, on the last ranks) take id ``pad_id`` and
position 0. `ulysses_attention` drops them before the attention and gives them a zero output:
they attend to nothing and nothing attends to them, so no real token's result depends on them,
and they predict no label.

Labels belong to the rank holding the position that predicts them (`SeqShard.pred_pos`,
`SeqShard.owned`); each rank computes the log-probs of its own labels and `gather_tokens` puts
every rank's into one (M,) tensor, the same on each rank of the group. The loss built from it
is then the same on each rank, and the backward of `gather_tokens` hands each rank the gradient
of its own labels only: each rank's parameter gradients cover the parameters' use on its own
tokens, and the sum over the sp group is the gradient of one process running the whole row. The
sp group's gradients are therefore summed, not averaged; a data-parallel reducer that averages
over dp * sp ranks needs the loss multiplied by sp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from verirl.core.errors import ConfigError


def check_ulysses(heads: int, kv_heads: int, sp: int, key: str = "actor.sequence_parallel_size") -> None:
    """The attention's ``heads`` query and ``kv_heads`` key/value heads split over ``sp`` ranks (under
    tensor parallelism, the heads of one tensor-parallel rank); one paragraph with the arithmetic
    otherwise."""
    if sp == 1:
        return
    if heads % sp:
        raise ConfigError(f"{key}={sp} does not divide num_attention_heads={heads} ({heads} / {sp} = "
                          f"{heads / sp:.3g}): each of the {sp} ranks of a sequence-parallel group attends with "
                          f"an equal share of the heads. Set {key} to a divisor of {heads}.")
    if kv_heads < sp:
        raise ConfigError(f"{key}={sp} is more than num_key_value_heads={kv_heads} ({kv_heads} / {sp} = "
                          f"{kv_heads / sp:.3g}): more sp than key/value heads needs ring attention, not built. "
                          f"Set {key} to a divisor of {kv_heads}.")
    if kv_heads % sp:
        raise ConfigError(f"{key}={sp} does not divide num_key_value_heads={kv_heads} ({kv_heads} / {sp} = "
                          f"{kv_heads / sp:.3g}): each of the {sp} ranks of a sequence-parallel group takes an "
                          f"equal share of the key/value heads. Set {key} to a divisor of {kv_heads}.")


def _group_size(group) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group)


def _all_to_all(x: torch.Tensor, group, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk j of ``x`` along ``scatter_dim`` goes to rank j of ``group``; the chunks received, in rank
    order, are joined along ``gather_dim``."""
    import torch.distributed as dist

    sp = dist.get_world_size(group)
    send = torch.stack(x.chunk(sp, scatter_dim))  # (sp, ...) contiguous, chunk j for rank j
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """`_all_to_all`; its backward is the opposite exchange (gather and scatter dims swapped)."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim: int, gather_dim: int):
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def seq_to_heads(x: torch.Tensor, group, seq_dim: int = 2, head_dim: int = 1) -> torch.Tensor:
    """(1, heads, T_local, d) of this rank's tokens -> (1, heads / sp, T_local * sp, d): the whole row,
    for this rank's block of heads (rank r: heads [r * heads / sp, (r + 1) * heads / sp)). Differentiable."""
    if _group_size(group) == 1:
        return x
    return _AllToAll.apply(x, group, head_dim, seq_dim)


def heads_to_seq(x: torch.Tensor, group, seq_dim: int = 2, head_dim: int = 1) -> torch.Tensor:
    """The inverse of `seq_to_heads`: (1, heads / sp, T, d) -> (1, heads, T / sp, d), this rank's slice of
    the tokens for every head. Differentiable."""
    if _group_size(group) == 1:
        return x
    return _AllToAll.apply(x, group, seq_dim, head_dim)


def ulysses_attention(module, query, key, value, attention_mask, *, group, inner: Callable,
                      tokens: Optional[int] = None, **kwargs):
    """An attention function of transformers' kind for one rank of a sequence-parallel ``group``: query
    (1, H, T_local, d), key/value (1, KVH, T_local, d), this rank's tokens. ``inner`` (an attention
    function, e.g. `verirl.train.packing.packed_attention`) sees query (1, H / sp, tokens, d) and key/value
    (1, KVH / sp, tokens, d): the whole row's ``tokens`` real tokens (None: all T_local * sp) for this
    rank's heads, and returns (1, tokens, H / sp, d). Returns (1, T_local, H, d) and None."""
    sp = _group_size(group)
    check_ulysses(query.shape[1], key.shape[1], sp)
    if torch.is_autocast_enabled(query.device.type):  # the attention runs in the low dtype: send that
        low = torch.get_autocast_dtype(query.device.type)
        query, key, value = query.to(low), key.to(low), value.to(low)
    q, k, v = (seq_to_heads(t, group) for t in (query, key, value))
    padded = q.shape[2]
    tokens = padded if tokens is None else tokens
    if tokens < padded:  # the pads at the row's end attend to nothing and nothing attends to them
        q, k, v = q[:, :, :tokens], k[:, :, :tokens], v[:, :, :tokens]
    out, _ = inner(module, q, k, v, attention_mask, **kwargs)  # (1, tokens, H / sp, d)
    if tokens < padded:
        out = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, padded - tokens))
    return heads_to_seq(out, group, seq_dim=1, head_dim=2), None


@dataclass
class SeqShard:
    """One rank's slice of a packed row of ``tokens`` tokens, padded to ``size`` * T_local."""
    input_ids: torch.Tensor  # (1, T_local) the slice's tokens, pads (``pad_id``) past the row's end
    position_ids: torch.Tensor  # (1, T_local) their positions, 0 for pads
    pred_pos: torch.Tensor  # (M_local,) position in the slice of each hidden state that predicts an owned label
    owned: torch.Tensor  # (M_local,) which of the row's M labels those are, increasing
    start: int  # the slice's first packed position, rank * T_local
    tokens: int  # T, the real tokens of the whole row
    total_labels: int  # M, the labels of the whole row
    size: int  # sp, the ranks of the group


def split_packed(input_ids: torch.Tensor, position_ids: torch.Tensor, pred_pos: torch.Tensor, rank: int,
                 size: int, pad_id: int = 0) -> SeqShard:
    """Rank ``rank`` of ``size``'s slice of a packed row: input_ids, position_ids (1, T); pred_pos (M,)
    the packed position whose hidden state predicts label m. The row is padded at its end to a multiple
    of ``size``; label m belongs to the rank whose slice holds pred_pos[m]."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not one of the {size} ranks of the sequence-parallel group")
    T = input_ids.shape[1]
    local = -(-T // size)
    start, stop = rank * local, (rank + 1) * local
    pad = max(stop - max(T, start), 0)

    def cut(x: torch.Tensor, fill: int) -> torch.Tensor:
        part = x[:, start:stop]
        return torch.cat([part, part.new_full((1, pad), fill)], dim=1) if pad else part

    mine = (pred_pos >= start) & (pred_pos < stop)
    owned = mine.nonzero().view(-1)
    return SeqShard(cut(input_ids, pad_id), cut(position_ids, 0), pred_pos[owned] - start, owned, start, T,
                    pred_pos.shape[0], size)


class _GatherTokens(torch.autograd.Function):
    """Each rank's values at its own rows ``owned`` of an (M, ...) tensor, summed over the group (every
    row is one rank's, the others add zeros). The backward hands each rank its own rows of the gradient:
    the loss made from the result is the same on every rank of the group, not one part of a sum."""

    @staticmethod
    def forward(ctx, values, owned, rows: int, group):
        import torch.distributed as dist

        full = values.new_zeros((rows, *values.shape[1:])).index_copy_(0, owned, values)
        dist.all_reduce(full, group=group)
        ctx.save_for_backward(owned)
        ctx.mark_non_differentiable(owned)
        return full

    @staticmethod
    def backward(ctx, grad):
        (owned,) = ctx.saved_tensors
        return grad.index_select(0, owned), None, None, None


def gather_tokens(values: torch.Tensor, shard: SeqShard, group) -> torch.Tensor:
    """values (M_local, ...) of ``shard``'s own labels -> (M, ...) of the whole row's, the same on every rank
    of ``group``; differentiable, each rank's gradient covering its own labels (the module docstring)."""
    if shard.size == 1:
        return values
    return _GatherTokens.apply(values, shard.owned, shard.total_labels, group)
