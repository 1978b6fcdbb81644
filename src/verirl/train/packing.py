"""Padding-free log-prob passes: pack a micro-batch into one row, share each prompt once.

A micro-batch of rollout rows becomes ONE packed row of tokens with no pads:

    [prompt A][resp A1][resp A2]...[prompt B][resp B1]...      (share_prompt=True)
    [prompt A][resp A1][prompt A][resp A2]...                   (share_prompt=False)

Position ids restart at 0 for each prompt and continue through its responses, so every
token sees the positions it had during the rollout. Attention is restricted by a
*layout*: each segment (a prompt, or a response) attends causally to itself and, for a
response, to all of its prompt. The projections, MLPs and the output layer therefore
run on real tokens only, and a prompt shared by n samples is computed once instead of n
times (the gradient of the n responses flows back into the one prompt computation, so
the result is exact, not an approximation).

Attention itself runs on segments gathered into a few buckets of similar length (one call
per bucket and layer): short segments through `verirl.core.ops.attention.small_attention`,
long ones through torch's SDPA with the bucket's mask. A bucket costs about its number of
segments times the square of its longest segment, whereas one block-diagonal mask over the
whole row costs the square of the row length, most of it on pairs of tokens that may not
attend to each other.
On CUDA with a half-precision model, all segments go instead through one call of a
variable-length attention kernel per layer (`verirl.core.ops.varlen.varlen_kernel` picks it:
flash-attn's `flash_attn_varlen_func` when it is installed, else torch's own flash kernels where
they run). Segments are taken in packed order, so the queries are the packed row
itself (no gather, no reordering) and only a shared prompt's keys are gathered once per response;
causal is aligned to each segment's last key. The arguments are checked on CPU against a
written-out kernel of the same semantics. On a GPU the kernel's one call per layer takes the place
of one SDPA call per bucket and layer, which is bound by kernel launches there (the figures:
BENCHMARKS.md, "Kernel choices"; bench/gpu_profile.py measures them).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from verirl.core.errors import ConfigError
from verirl.core.ops.attention import small_attention, small_enough
from verirl.core.ops.head_logprobs import head_logprobs, vocab_parallel_head_logprobs
from verirl.core.ops.ulysses import gather_tokens, split_packed, ulysses_attention
from verirl.core.ops.varlen import varlen_kernel
from verirl.models.parallel import head_group, head_shard, is_tensor_parallel
from verirl.train.strategy import final_hidden
from verirl.train.record import response_positions
from verirl.core.types import Rollout
from verirl.models import router_tap

ATTN_NAME = "verirl_packed"
# The layout of the packed forward in progress. It travels beside the model call rather than as
# its attention_mask, because some models (Llama) rebuild the mask argument before the layers.
_LAYOUT: contextvars.ContextVar = contextvars.ContextVar("verirl_packed_layout", default=None)


@dataclass
class _Bucket:
    q_idx: torch.Tensor  # (S, Qmax) packed positions of each segment's queries (pads -> 0)
    k_idx: torch.Tensor  # (S, Kmax) packed positions of each segment's keys
    mask: torch.Tensor  # (S, 1, Qmax, Kmax) bool, True = may attend
    valid: torch.Tensor  # (n,) flat indices into (S * Qmax) of real queries

    def additive(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as (S, 1, 1, Qmax, Kmax) zeros and -inf, made once per dtype."""
        cache = self.__dict__.setdefault("_additive", {})
        if dtype not in cache:
            cache[dtype] = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill(
                ~self.mask, float("-inf"))[:, :, None]
        return cache[dtype]


@dataclass
class _Varlen:
    """The same segments for a variable-length kernel (flash-attn's varlen), in packed order: the
    queries of segment after segment are the packed row itself, so only keys need gathering."""
    k_pos: Optional[torch.Tensor]  # (Nk,) packed positions of the keys, segment after segment; None: the row
    cu_q: torch.Tensor  # (S + 1,) int32 offsets of each segment's queries in the packed row
    cu_k: torch.Tensor  # (S + 1,) int32 offsets into k_pos
    max_q: int
    max_k: int


@dataclass
class PackedLayout:
    """Which packed positions attend to which: the segments (for a variable-length kernel, `varlen`),
    and their buckets with the order to undo, made on first use (the bucket path only: their masks
    are the costly part of packing long responses)."""
    segments: list[_Seg]  # longest keys first
    varlen: _Varlen
    total: int  # T, the tokens of the packed row
    device: torch.device

    @property
    def max_keys(self) -> int:
        return self.segments[0].keys

    @functools.cached_property
    def buckets(self) -> list[_Bucket]:
        return _bucket(self.segments, self.device)

    @functools.cached_property
    def inverse(self) -> torch.Tensor:
        """(T,) puts the buckets' outputs (the segments' queries, in the segments' order) back in packed order."""
        order = _positions([s.queries for s in self.segments])
        inverse = torch.empty(self.total, dtype=torch.long)
        inverse[order] = torch.arange(self.total)
        return inverse.to(self.device)


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T)
    layout: PackedLayout
    pred_pos: torch.Tensor  # (M,) packed position whose hidden state predicts label m
    labels: torch.Tensor  # (M,) the response tokens
    out_row: torch.Tensor  # (M,) row in the (b, r) result
    out_col: torch.Tensor  # (M,) column in the (b, r) result
    rows: int
    width: int  # r = the longest response among the rows
    # (T,) each packed token's place in the rollout's (N, P + R) columns of cat(prompt_ids, response_ids), flat
    # (a shared prompt's: its first row's): where its routed experts are (`routes_of`)
    source: Optional[torch.Tensor] = None
    # (K,) (rollout place, packed position) of every row's every token, a shared prompt's once per row: where a
    # pass's own routes go (`store_routes`)
    dest: Optional[tuple[torch.Tensor, torch.Tensor]] = None


@dataclass(frozen=True)
class _Seg:
    """One attention segment of the packed row: its keys are the packed positions of ``runs``
    ((start, length) pairs, end to end) and its queries the last ``q`` of them, all in its last run."""
    runs: tuple
    q: int

    @property
    def keys(self) -> int:
        return sum(n for _, n in self.runs)

    @property
    def queries(self) -> tuple[int, int]:
        start, n = self.runs[-1]
        return start + n - self.q, self.q


def _within(lens: torch.Tensor) -> torch.Tensor:
    """0..n-1 for each length n of ``lens``, end to end (built without a loop over the positions: a step
    packs tens of thousands of them)."""
    return torch.arange(int(lens.sum())) - torch.repeat_interleave(lens.cumsum(0) - lens, lens)


def _positions(runs: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The positions of (start, length) runs, end to end: one long tensor."""
    starts = torch.tensor([s for s, _ in runs], dtype=torch.long)
    lens = torch.tensor([n for _, n in runs], dtype=torch.long)
    return torch.repeat_interleave(starts, lens) + _within(lens)


def _varlen(segments: list[_Seg], total: int, device) -> _Varlen:
    """segments in packed order, whose queries tile the packed row 0..total-1 end to end."""
    qlen = torch.tensor([0] + [s.q for s in segments])
    klen = torch.tensor([0] + [s.keys for s in segments])
    if int(qlen.sum()) != total:
        raise AssertionError(f"packed segments' queries cover {int(qlen.sum())} of {total} positions")
    own = bool((qlen == klen).all())  # no shared prompt: every segment's keys are its own queries
    k_pos = None if own else _positions([r for s in segments for r in s.runs]).to(device)
    return _Varlen(k_pos, qlen.cumsum(0).to(device, torch.int32), klen.cumsum(0).to(device, torch.int32),
                   int(qlen.max()), int(klen.max()))


def _bucket(segments: list[_Seg], device, ratio: float = 0.7) -> list[_Bucket]:
    """segments, longest keys first. Groups consecutive segments of similar key length so that
    padding inside a bucket stays small; the buckets' queries, in order, are the segments' queries
    in order."""
    buckets = []
    i = 0
    while i < len(segments):
        k0 = segments[i].keys
        j = i
        while j < len(segments) and segments[j].keys >= ratio * k0:
            j += 1
        members = segments[i:j]
        S, K, Q = len(members), k0, max(s.q for s in members)
        klen = torch.tensor([s.keys for s in members])
        qlen = torch.tensor([s.q for s in members])
        k_idx = torch.zeros((S, K), dtype=torch.long)
        k_idx[torch.repeat_interleave(torch.arange(S), klen), _within(klen)] = _positions([r for s in members
                                                                                       for r in s.runs])
        t = torch.arange(Q)[None, :, None]  # query row
        c = torch.arange(K)[None, None, :]  # key column
        real_q = t < qlen[:, None, None]
        # query t is key number klen - qlen + t, and sees keys 0 .. klen - qlen + t
        q_idx = k_idx.gather(1, ((klen - qlen)[:, None] + t[..., 0]).clamp(max=K - 1)).masked_fill(~real_q[..., 0], 0)
        mask = real_q & (c <= (klen - qlen)[:, None, None] + t)
        mask |= ~real_q & (c == 0)  # padded query rows see one key (no NaN); their output is dropped
        valid = (torch.arange(S * Q).view(S, Q))[real_q[:, :, 0]]
        buckets.append(_Bucket(q_idx.to(device), k_idx.to(device), mask[:, None].to(device), valid.to(device)))
        i = j
    return buckets


def pack_rows(rollout: Rollout, rows: Sequence[int], share_prompt: bool = True) -> PackedBatch:
    """Pack rollout ``rows`` into one padding-free row (see the module docstring)."""
    device = rollout.response_ids.device
    p_ids, p_mask = rollout.prompt_ids.tolist(), rollout.prompt_mask.tolist()
    r_ids, r_len = rollout.response_ids.tolist(), rollout.response_lengths.tolist()
    ids: list[int] = []
    pos: list[int] = []
    segments: list[_Seg] = []
    heads, starts, lens = [], [], []  # per row: the position predicting its first token, its start, its length
    shared: dict[tuple, int] = {}  # prompt tokens -> start in the packed row
    Pw, cols = rollout.prompt_ids.shape[1], rollout.prompt_ids.shape[1] + rollout.response_ids.shape[1]
    source: list[int] = []  # per packed token: its flat rollout place
    dest: list[tuple[int, int]] = []  # (flat rollout place, packed position start, length) runs of every row
    for i in rows:
        prompt = tuple(t for t, m in zip(p_ids[i], p_mask[i]) if m)
        L = int(r_len[i])
        if not prompt:
            raise ValueError(f"rollout row {i} has an empty prompt; a response needs at least one prompt token.")
        P = len(prompt)
        if share_prompt and prompt in shared:
            p_start = shared[prompt]
        else:
            p_start = len(ids)
            ids.extend(prompt)
            pos.extend(range(P))
            source.extend(range(i * cols + Pw - P, i * cols + Pw))
            if share_prompt:
                shared[prompt] = p_start
                segments.append(_Seg(((p_start, P),), P))
        dest.append((i * cols + Pw - P, p_start, P))
        r_start = len(ids)
        source.extend(range(i * cols + Pw, i * cols + Pw + L))
        dest.append((i * cols + Pw, r_start, L))
        ids.extend(r_ids[i][:L])
        pos.extend(range(P, P + L))
        segments.append(_Seg(((p_start, P), (r_start, L)), L) if share_prompt else _Seg(((p_start, P + L),), P + L))
        heads.append(p_start + P - 1)
        starts.append(r_start)
        lens.append(L)
    # label m of row b, column j: response token j, predicted by the hidden state before it
    lens_t = torch.tensor(lens, dtype=torch.long)
    out_row = torch.repeat_interleave(torch.arange(len(rows)), lens_t)
    out_col = _within(lens_t)
    at = _positions(list(zip(starts, lens)))  # each response token's packed position
    pred = torch.where(out_col == 0, torch.repeat_interleave(torch.tensor(heads, dtype=torch.long), lens_t), at - 1)
    ids_t = torch.tensor(ids, dtype=torch.long)
    segments = [s for s in segments if s.q > 0]  # an empty response has no queries of its own
    varlen = _varlen(segments, len(ids), device)
    segments.sort(key=lambda seg: -seg.keys)  # stable: equal lengths keep their packed order
    width = max(lens, default=0)
    layout = PackedLayout(segments, varlen, len(ids), device)
    t = lambda x: x.to(device)  # noqa: E731
    d_lens = torch.tensor([n for _, _, n in dest], dtype=torch.long)
    d_place = torch.repeat_interleave(torch.tensor([a for a, _, _ in dest], dtype=torch.long), d_lens) + _within(d_lens)
    d_pos = _positions([(b, n) for _, b, n in dest])
    return PackedBatch(t(ids_t)[None], t(torch.tensor(pos, dtype=torch.long))[None], layout, t(pred), t(ids_t[at]),
                       t(out_row), t(out_col), len(rows), max(width, 1), t(torch.tensor(source, dtype=torch.long)),
                       (t(d_place), t(d_pos)))


def routes_of(routed: torch.Tensor, pb: PackedBatch) -> torch.Tensor:
    """(T, L, k) the routes of the packed row's tokens, from a rollout's (N, P + R, L, k) routed experts."""
    return routed.reshape((-1,) + routed.shape[2:]).index_select(0, pb.source.to(routed.device))


def store_routes(store: torch.Tensor, pb: PackedBatch, ids: torch.Tensor, start: int = 0) -> None:
    """Write a packed forward's routes ids (T', L, k), of packed positions start..start+T', into every row's
    places of ``store`` (N, P + R, L, k)."""
    place, at = pb.dest
    keep = (at >= start) & (at < start + ids.shape[0])
    flat = store.view((-1,) + store.shape[2:])
    flat[place[keep].to(store.device)] = ids[(at[keep] - start).to(ids.device)].to(store.device, store.dtype)


def _tap_begin(tap, routed: Optional[torch.Tensor], replay: bool, pb: PackedBatch, shard) -> Optional[torch.Tensor]:
    """The router tap's routes for this rank's tokens of ``pb``; returns which of them are real (T_local,)."""
    T = pb.input_ids.shape[1]
    lo, width = (0, T) if shard is None else (shard.start, shard.input_ids.shape[1])
    real = (torch.arange(lo, lo + width, device=pb.input_ids.device) < T)
    feed = None
    if routed is not None:
        feed = routes_of(routed, pb)[lo:lo + width]
        if feed.shape[0] < width:  # a shard's pads past the row's end: the router's own choice
            feed = torch.cat([feed, feed.new_full((width - feed.shape[0],) + feed.shape[1:], -1)])
    tap.begin(feed, replay)
    return real


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     sliding_window=None, **kwargs):
    """An attention function for transformers' AttentionInterface: the packed layout while a packed
    forward is running, plain SDPA otherwise. query (1, H, T, d), key/value (1, KVH, T, d)."""
    layout = _LAYOUT.get()
    if layout is None or query.shape[0] != 1 or query.shape[2] != layout.total:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if sliding_window is not None and layout.max_keys > sliding_window:
        raise ConfigError(f"packed attention does not apply a sliding window ({sliding_window} tokens) "
                                  f"to sequences of {layout.max_keys}; set actor.use_remove_padding=false.")
    H, d, KVH = query.shape[1], query.shape[-1], key.shape[1]
    if torch.is_autocast_enabled(query.device.type):  # mixed precision: the rotary left q and k in float32
        low = torch.get_autocast_dtype(query.device.type)
        query, key, value = query.to(low), key.to(low), value.to(low)
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # (T, H, d), (T, KVH, d)
    scale = d ** -0.5 if scaling is None else scaling
    p_drop = dropout if module.training else 0.0
    varlen_fn = varlen_kernel(query, p_drop)
    if varlen_fn is not None:  # every segment in one call; causal aligned to the last key, as here
        vl = layout.varlen
        if vl.k_pos is not None:  # a shared prompt's keys and values, once per response
            k, v = k.index_select(0, vl.k_pos), v.index_select(0, vl.k_pos)
        out = varlen_fn(q.contiguous(), k.contiguous(), v.contiguous(), vl.cu_q, vl.cu_k, vl.max_q, vl.max_k,
                        dropout_p=p_drop, softmax_scale=scale, causal=True)
        return out[None], None
    outs = []
    for bk in layout.buckets:
        S, Q = bk.q_idx.shape
        K = bk.k_idx.shape[1]
        # index_select (backward: index_add) rather than advanced indexing (backward: a sorting index_put)
        qb = q.index_select(0, bk.q_idx.view(-1))  # (S * Q, H, d)
        kb = k.index_select(0, bk.k_idx.view(-1)).view(S, K, KVH, d).transpose(1, 2)  # (S, KVH, K, d)
        vb = v.index_select(0, bk.k_idx.view(-1)).view(S, K, KVH, d).transpose(1, 2)
        if small_enough(Q, K) and not p_drop:
            ob = small_attention(qb.view(S, Q, H, d), kb, vb, bk.additive(query.dtype), scale)
        else:
            ob = torch.nn.functional.scaled_dot_product_attention(
                qb.view(S, Q, H, d).transpose(1, 2), kb, vb, attn_mask=bk.mask, scale=scale, dropout_p=p_drop,
                enable_gqa=KVH != H).transpose(1, 2)  # (S, Q, H, d)
        outs.append(ob.reshape(S * Q, H, d).index_select(0, bk.valid))
    out = torch.cat(outs).index_select(0, layout.inverse)  # (T, H, d)
    return out[None], None


AttentionInterface.register(ATTN_NAME, packed_attention)

SP_ATTN_NAME = "verirl_packed_sp"
# (the sequence-parallel group, the row's real tokens) of the packed forward in progress on a slice of its row
_SEQUENCE_SPLIT: contextvars.ContextVar = contextvars.ContextVar("verirl_packed_sp", default=None)


def sequence_parallel_attention(module, query, key, value, attention_mask, **kwargs):
    """`packed_attention` for one rank's slice of the packed row (Ulysses, `verirl.core.ops.ulysses`): the
    tokens exchanged for heads around it."""
    group, tokens = _SEQUENCE_SPLIT.get()
    return ulysses_attention(module, query, key, value, attention_mask, group=group, inner=packed_attention,
                             tokens=tokens, **kwargs)


AttentionInterface.register(SP_ATTN_NAME, sequence_parallel_attention)


@contextlib.contextmanager
def _packed_attention(model, layout: PackedLayout, split: Optional[tuple] = None):
    """The packed layout for the model's forward inside the block; ``split`` (group, tokens): the forward
    runs on this rank's slice of the row, the attention sequence-parallel."""
    cfg = model.config
    old = cfg._attn_implementation_internal
    # no mask function registered: transformers builds no mask
    cfg._attn_implementation_internal = ATTN_NAME if split is None else SP_ATTN_NAME
    token, split_token = _LAYOUT.set(layout), _SEQUENCE_SPLIT.set(split)
    try:
        yield
    finally:
        _SEQUENCE_SPLIT.reset(split_token)
        _LAYOUT.reset(token)
        cfg._attn_implementation_internal = old


def packed_context(model, pb: PackedBatch, sp_group=None, shard=None) -> contextlib.ExitStack:
    """What a forward of packed row ``pb`` runs inside, for a caller that runs the model's layers itself (a
    pipeline stage): its attention layout and the activation dump's positions; with ``shard`` (this rank's
    `split_packed` slice of the row), the attention sequence-parallel over ``sp_group``."""
    stack = contextlib.ExitStack()
    if shard is None:
        stack.enter_context(_packed_attention(model, pb.layout))
        stack.enter_context(response_positions(pb.pred_pos, pb.out_col == 0))
    else:
        stack.enter_context(_packed_attention(model, pb.layout, (sp_group, shard.tokens)))
        stack.enter_context(response_positions(shard.pred_pos, (pb.out_col == 0)[shard.owned]))
    return stack


def supports_packing(model) -> tuple[bool, str]:
    """Whether ``model`` is a plain decoder whose logits are lm_head(final hidden state)."""
    cfg = model.config
    for attr in ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale"):
        if getattr(cfg, attr, None):
            return False, f"its config sets {attr}"
    if not hasattr(model, "get_decoder") or model.get_output_embeddings() is None:
        return False, "it has no decoder / output layer to call separately"
    return True, ""


class PackCache:
    """The packed layouts of one rollout's rows, made on first use: the passes of a step (old, ref,
    update) pack the same micro-batches, so each is laid out once. One cache per rollout."""

    def __init__(self, rollout: Rollout):
        self.rollout = rollout
        self._packed: dict[tuple, PackedBatch] = {}

    def get(self, rollout: Rollout, rows: Sequence[int], share_prompt: bool) -> PackedBatch:
        if rollout is not self.rollout:
            raise ValueError("PackCache holds the layouts of another rollout; make one cache per rollout.")
        key = (tuple(rows), share_prompt)
        if key not in self._packed:
            self._packed[key] = pack_rows(rollout, rows, share_prompt)
        return self._packed[key]


def packed_logprobs(model, rollout: Rollout, rows: Sequence[int], temperature: float = 1.0,
                    with_entropy: bool = False, share_prompt: bool = True, chunk: int = 0,
                    layouts: Optional[PackCache] = None, sp_group=None):
    """Like the padded pass: (logp (b, r), entropy (b, r) or None, mask (b, r)) for ``rows``, with
    no compute spent on pad tokens and the output layer applied in chunks to response positions only.
    ``layouts`` (optional) keeps the packed layout for the next pass over the same rows.

    ``sp_group`` (sequence parallelism): this rank computes its slice of the packed row (`split_packed`)
    and the log-probs of the labels its slice predicts; they are gathered over the group, so every rank
    returns the whole micro-batch's, and the backward leaves each rank the gradient of its own tokens
    (summed over the group with the data-parallel ranks' by the strategy)."""
    pb = layouts.get(rollout, rows, share_prompt) if layouts is not None else pack_rows(rollout, rows, share_prompt)
    ids, positions, pred, labels, first = pb.input_ids, pb.position_ids, pb.pred_pos, pb.labels, pb.out_col == 0
    shard = None
    if sp_group is not None:
        import torch.distributed as dist

        shard = split_packed(ids, positions, pred, dist.get_rank(sp_group), dist.get_world_size(sp_group))
        ids, positions, pred = shard.input_ids, shard.position_ids, shard.pred_pos
        labels, first = labels[shard.owned], first[shard.owned]
    split = None if shard is None else (sp_group, shard.tokens)
    tap = router_tap.current()  # routing replay and the MoE metrics (`verirl.models.router_tap`)
    if tap is not None:
        real = _tap_begin(tap, tap.routed, tap.replaying, pb, shard)
    with _packed_attention(model, pb.layout, split), response_positions(pred, first):
        hidden = final_hidden(model, ids, positions)[0]
    if tap is not None:
        tap.end(real)
        if tap.store is not None and tap.counting:
            store_routes(tap.store, pb, torch.stack(tap.last_ids, 1), 0 if shard is None else shard.start)
    head = model.get_output_embeddings()
    # under mixed precision (torch.autocast) the output layer still multiplies in the weights' dtype: a
    # bfloat16 logit of 10 is off by up to 0.03, and so would every log-prob be
    with torch.autocast(hidden.device.type, enabled=False):
        at = hidden.index_select(0, pred).to(head.weight.dtype)
        if is_tensor_parallel(model):  # this rank's vocabulary rows; the log-sum-exp combined over the group
            weight, start = head_shard(model)
            lp, ent = vocab_parallel_head_logprobs(at, weight, labels, start, head_group(model), None,
                                                   temperature, chunk, with_entropy)
        else:
            lp, ent = head_logprobs(at, head.weight, labels, head.bias, temperature, chunk, with_entropy)
    if shard is not None:
        lp = gather_tokens(lp, shard, sp_group)
        ent = None if ent is None else gather_tokens(ent, shard, sp_group)
    b, r = pb.rows, pb.width
    logp = lp.new_zeros((b, r)).index_put((pb.out_row, pb.out_col), lp)
    mask = lp.new_zeros((b, r)).index_put((pb.out_row, pb.out_col), torch.ones_like(lp))
    entropy = None if ent is None else ent.new_zeros((b, r)).index_put((pb.out_row, pb.out_col), ent)
    return logp, entropy, mask
