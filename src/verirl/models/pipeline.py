"""Pipeline parallelism of the decoder of the Llama family for packed passes, on torch's own
`torch.distributed.pipelining`.

The decoder layers are cut into stages (`stage_layers`), held in loop order: with ``ranks`` pipeline
ranks and ``per_rank`` stages each, rank r holds stages r, r + ranks, r + 2 ranks, ... (`stage_indices`;
more than one only for the interleaved schedule). The first stage holds the embedding and its layers,
the last its layers, the final norm and the output layer, a middle stage its layers (`DecoderStage`).
The parameters keep the names they have in the whole model, so a stage's state dict is a slice of
the model's.

A micro-batch is ONE packed row (`MicroBatch`: a `verirl.train.packing.PackedBatch`'s ids, positions,
labels and attention layout). A schedule fixes the shape of what travels between stages when it
starts, so every micro-batch of a pass is padded to the same T tokens at the stage boundaries; inside a
stage only the row's own L tokens go through the layers, and the T - L pad rows are zeros that no real
token attends to. Padding costs the transfers and the receive buffers of T - L rows per micro-batch;
it costs no compute.

Every stage learns the micro-batch it computes from the schedule: ``step`` cuts a tensor of indices
(``mb``) along with the batch, and the micro-batches themselves travel beside it as one argument that
the schedule hands unchanged to every forward. A stage's forward runs its layers inside the micro-batch's
own ``context`` (a packed row's attention layout), so several micro-batches in flight never share one.
The last stage returns the response tokens' log-probs (and entropies) through the chunked output layer,
(1, 2, T), the first M of each row real; the loss of a micro-batch is taken from them
(`pipeline_backward`), or they are sent to every rank of the pipeline (`pipeline_logprobs`).

A tied output layer is a second copy of the embedding on the last stage: `sum_tied_grads` sums the two
copies' gradients after the backward (over the group of the first and the last rank,
`tied_embedding_group`), so both take the same optimizer step, as Megatron-LM does.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from verirl.core.errors import ConfigError
from verirl.core.dtensors import is_split, local
from verirl.core.ops.head_logprobs import head_logprobs

SCHEDULES = ("1f1b", "gpipe", "interleaved_1f1b")  # the names `pipeline_backward` takes

# loss_fn(logp (M,), entropy (M,) or None, micro-batch index) -> this micro-batch's loss (a scalar)
LossFn = Callable[[torch.Tensor, Optional[torch.Tensor], int], torch.Tensor]


def stage_layers(num_layers: int, stages: int, layers: Optional[Sequence[int]] = None) -> list[range]:
    """The decoder layers of each of ``stages`` stages, in order: ``layers[s]`` of them for stage s (as
    MindSpeed-RL's ``num_layer_list``: [2, 2] for 4 layers over 2 stages), or an even split in which the
    earlier stages take one layer more when ``stages`` does not divide ``num_layers``."""
    if stages < 1:
        raise ConfigError(f"a pipeline has at least 1 stage, got {stages}.")
    if layers is None:
        if num_layers < stages:
            raise ConfigError(f"{stages} pipeline stages for a model of {num_layers} decoder layers: each stage "
                              f"holds at least one layer; use at most {num_layers} stages.")
        base, extra = divmod(num_layers, stages)
        layers = [base + (s < extra) for s in range(stages)]
    layers = [int(n) for n in layers]
    if len(layers) != stages or sum(layers) != num_layers or min(layers) < 1:
        raise ConfigError(f"layers per stage {layers} do not split the model's {num_layers} decoder layers over "
                          f"{stages} stages: give {stages} numbers, each at least 1, that sum to {num_layers} "
                          f"(they give {len(layers)} summing to {sum(layers)}).")
    starts = [sum(layers[:s]) for s in range(stages)]
    return [range(a, a + n) for a, n in zip(starts, layers)]


def stages_per_rank(schedule: str) -> int:
    """Stages each rank holds under ``schedule`` in a training run: 2 under interleaved 1F1B, else 1."""
    return 2 if schedule == "interleaved_1f1b" else 1


def stage_indices(rank: int, ranks: int, per_rank: int = 1) -> list[int]:
    """The stages pipeline rank ``rank`` of ``ranks`` holds, ``per_rank`` of them, in loop order (the
    placement of torch's interleaved schedules): rank, rank + ranks, ..."""
    return [rank + k * ranks for k in range(per_rank)]


def bubble_fraction(schedule: str, ranks: int, micro_batches: int, per_rank: int = 1) -> float:
    """The share of a pipelined pass each rank spends idle, for ``ranks`` pipeline ranks and
    ``micro_batches`` micro-batches of equal cost: (p - 1) / (m + p - 1) for GPipe and 1F1B, and
    (p - 1) / (v m + p - 1) for interleaved 1F1B with v = ``per_rank`` stages per rank."""
    _check_schedule(schedule, per_rank)
    p, m, v = ranks, micro_batches, per_rank if schedule == "interleaved_1f1b" else 1
    return (p - 1) / (v * m + p - 1)


def check_micro_batches(schedule: str, ranks: int, micro_batches: int, per_rank: int = 1) -> None:
    """The schedule can run ``micro_batches`` micro-batches over ``ranks`` pipeline ranks with ``per_rank``
    stages each: 1F1B needs at least one micro-batch per stage, interleaved 1F1B a count that its rounds
    of ``ranks`` micro-batches divide; one paragraph with the numbers otherwise."""
    _check_schedule(schedule, per_rank)
    m, p = micro_batches, ranks
    if m < 1:
        raise ConfigError(f"a pipelined pass needs at least 1 micro-batch, got {m}.")
    if schedule == "1f1b" and m < p:
        raise ConfigError(f"pipeline schedule 1f1b over {p} stages needs at least {p} micro-batches, and this pass "
                          f"has {m}: lower the micro-batch size or token budget so the mini-batch splits into "
                          f"{p} or more, or use the gpipe schedule.")
    rounds = max(1, m // p)
    if schedule == "interleaved_1f1b" and m % rounds:
        raise ConfigError(f"pipeline schedule interleaved_1f1b over {p} ranks runs {m} micro-batches in {rounds} "
                          f"rounds ({m} // {p}), which must divide {m}: use a multiple of {p} micro-batches, or "
                          f"fewer than {2 * p}.")


def _check_schedule(schedule: str, per_rank: int) -> None:
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}.")
    if per_rank < 1 or (per_rank > 1 and schedule != "interleaved_1f1b"):
        raise ConfigError(f"pipeline schedule {schedule} holds 1 stage per rank, got {per_rank}; several stages "
                          f"per rank run under interleaved_1f1b.")


@dataclass
class MicroBatch:
    """One micro-batch of a pipelined pass: one packed row and the response tokens it predicts."""
    input_ids: torch.Tensor  # (1, L)
    position_ids: torch.Tensor  # (1, L)
    pred_pos: torch.Tensor  # (M,) position in the row whose hidden state predicts label m
    labels: torch.Tensor  # (M,) the response tokens
    # each stage's forward of this row runs inside context(): for a packed row, its attention layout
    context: Callable[[], ContextManager] = contextlib.nullcontext
    # sequence parallelism: this rank holds a slice of the row and predicts some of its labels; the last
    # stage's log-probs and entropies of them -> the whole row's (`verirl.core.ops.ulysses.gather_tokens`)
    gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    total: int = 0  # the whole row's labels, when ``labels`` are this rank's share of them

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[1]

    @property
    def outputs(self) -> int:
        """The labels whose log-probs the last stage returns: the whole row's."""
        return self.total or self.labels.shape[0]


@dataclass(frozen=True)
class _Pass:
    """What every stage's forward of one pass shares; the schedule replicates it to each micro-batch."""
    micro: tuple[MicroBatch, ...]
    temperature: float
    chunk: int
    with_entropy: bool
    width: int = 0  # the last stage's output columns (0: T; a sequence-parallel slice's row has more labels)


def supports_pipeline(model) -> tuple[bool, str]:
    """Whether ``model`` is a decoder whose stages `DecoderStage` can cut: an embedding, a list of
    layers, a final norm and a rotary embedding, and an output layer beside the decoder."""
    if not hasattr(model, "get_decoder") or model.get_output_embeddings() is None:
        return False, "it has no decoder / output layer to call separately"
    decoder = model.get_decoder()
    for attr in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(decoder, attr):
            return False, f"its decoder ({type(decoder).__name__}) has no {attr}"
    if any(t != "full_attention" for t in getattr(model.config, "layer_types", None) or ()):
        return False, "it has sliding-window layers"
    return True, ""


def _child_name(parent: torch.nn.Module, child: torch.nn.Module) -> str:
    return next(name for name, m in parent.named_children() if m is child)


class DecoderStage(torch.nn.Module):
    """Stage ``index`` of ``num_stages`` of a causal LM: decoder ``layers`` (a range of layer indices), with
    the embedding on the first stage and the final norm and output layer on the last. It holds the model's
    own modules (not copies) under the model's names, and nothing else of it.

    forward(x, mb, run): x (1, T) token ids on the first stage, else (1, T, h) hidden states; ``mb`` (1,)
    the micro-batch's index in ``run.micro``. Returns (1, T, h) hidden states, the pad rows zero; the last
    stage (1, 2, T) float32: row 0 the log-probs of the M labels, row 1 their entropies (zero unless
    ``run.with_entropy``), then zeros."""

    def __init__(self, model, index: int, num_stages: int, layers: range):
        super().__init__()
        ok, why = supports_pipeline(model)
        if not ok:
            raise ConfigError(f"pipeline parallelism cannot cut {type(model).__name__}: {why}.")
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        self.index, self.num_stages = index, num_stages
        self.config = model.config
        self._decoder = _child_name(model, decoder)  # "model" in transformers' causal LMs
        self._head = _child_name(model, head)  # "lm_head"
        # a tied output layer shares the embedding's weight; across ranks each end stage holds its own copy,
        # under both modules' names (as the model does: one parameter to any wrapper of the stage, FSDP2's)
        self.tied = head.weight is decoder.embed_tokens.weight
        ends = self.tied and (self.is_first or self.is_last)
        part = torch.nn.Module()
        if self.is_first or ends:
            part.embed_tokens = decoder.embed_tokens
        part.layers = torch.nn.ModuleDict({str(i): decoder.layers[i] for i in layers})
        if self.is_last:
            part.norm = decoder.norm
        part.rotary_emb = decoder.rotary_emb
        setattr(self, self._decoder, part)
        if self.is_last or ends:
            setattr(self, self._head, head)
        self.hidden_size = decoder.embed_tokens.weight.shape[1]
        self.dtype = decoder.embed_tokens.weight.dtype

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def decoder_layers(self) -> list[torch.nn.Module]:
        """The decoder layers this stage holds, in order."""
        return list(getattr(self, self._decoder).layers.values())

    @property
    def tied_weight(self) -> Optional[torch.nn.Parameter]:
        """This stage's copy of a tied embedding (the embedding on the first stage, the output layer on
        the last), or None."""
        if not self.tied:
            return None
        if self.is_first:
            return getattr(self, self._decoder).embed_tokens.weight
        if self.is_last:
            return getattr(self, self._head).weight
        return None

    def forward(self, x: torch.Tensor, mb: torch.Tensor, run: _Pass) -> torch.Tensor:
        micro = run.micro[int(mb)]
        part = getattr(self, self._decoder)
        T, L = x.shape[1], micro.tokens
        pos = micro.position_ids
        with micro.context():
            h = part.embed_tokens(x[:, :L]) if self.is_first else x[:, :L]
            rotary = part.rotary_emb(h, pos)
            for layer in part.layers.values():
                h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=rotary, use_cache=False)
        if not self.is_last:
            return F.pad(h.to(self.dtype), (0, 0, 0, T - L))  # (1, T, h)
        h = part.norm(h)[0]
        head = getattr(self, self._head)
        # as `verirl.train.packing.packed_logprobs`: the output layer in the weights' dtype, autocast or not
        with torch.autocast(h.device.type, enabled=False):
            at = h.index_select(0, micro.pred_pos).to(head.weight.dtype)
            if is_split(head.weight):  # tensor parallel: this rank's vocabulary rows
                from verirl.core.ops.head_logprobs import vocab_parallel_head_logprobs
                from verirl.models.parallel import vocab_shard

                w, start, tp_group = vocab_shard(head.weight)
                lp, ent = vocab_parallel_head_logprobs(at, w, micro.labels, start, tp_group, head.bias,
                                                       run.temperature, run.chunk, run.with_entropy)
            else:
                lp, ent = head_logprobs(at, head.weight, micro.labels, head.bias, run.temperature, run.chunk,
                                        run.with_entropy)
        if micro.gather is not None:  # this rank's labels -> the row's, on every rank of the group
            lp = micro.gather(lp)
            ent = None if ent is None else micro.gather(ent)
        out = torch.stack([lp, ent if ent is not None else torch.zeros_like(lp)])[None]
        return F.pad(out.to(_out_dtype(self.dtype)), (0, max(run.width, T) - lp.shape[0]))  # (1, 2, width), not a view


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # as head_logprobs: float32, float64 for float64


def build_stages(model, rank: int, ranks: int, per_rank: int = 1,
                 layers: Optional[Sequence[int]] = None) -> list[DecoderStage]:
    """The stages pipeline rank ``rank`` of ``ranks`` holds (`stage_indices`), over ``ranks * per_rank``
    stages split by `stage_layers`. The stages hold only their own modules: dropping ``model`` afterwards
    frees the rest."""
    total = ranks * per_rank
    split = stage_layers(model.config.num_hidden_layers, total, layers)
    return [DecoderStage(model, s, total, split[s]) for s in stage_indices(rank, ranks, per_rank)]


def _agree(stages: Sequence[DecoderStage], micro: Sequence[MicroBatch], tokens: int, group) -> tuple[int, int]:
    """(T, the tokens every micro-batch is padded to: ``tokens``, or the longest row of the pass on any rank
    of the pipeline; the last stage's output width, T or more); the ranks must hold the same number of
    micro-batches (else each would wait on the others' transfers forever)."""
    longest = max(mb.tokens for mb in micro) if micro else 0
    if tokens and longest > tokens:
        i = max(range(len(micro)), key=lambda j: micro[j].tokens)
        raise ConfigError(f"micro-batch {i} of the pipelined pass has {longest} tokens, more than the pass's "
                          f"budget of {tokens}; raise the budget or split the micro-batch.")
    outputs = max(mb.outputs for mb in micro) if micro else 0
    seen = torch.tensor([max(tokens, longest), len(micro), -len(micro), outputs], device=stages[0].device)
    dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=group)
    T, most, fewest, outputs = (int(v) for v in seen.tolist())
    if most != -fewest:
        raise ConfigError(f"the ranks of a pipeline hold {-fewest} to {most} micro-batches of one pass (this rank "
                          f"{len(micro)}); every rank of a pipeline must run the same micro-batches.")
    return T, max(T, outputs)


def _schedule(name: str, stages: Sequence[DecoderStage], T: int, m: int, group, loss_fn=None, width: int = 0):
    """A fresh schedule of ``name`` over this rank's ``stages`` for m micro-batches of T tokens (with a
    backward when ``loss_fn`` is given). The shapes between stages are given, so no schedule runs a
    forward to learn them; gradients are not divided by m (each micro-batch's loss carries its share)."""
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)

    def wrap(s: DecoderStage) -> PipelineStage:
        # requires_grad: the hidden states' gradients travel back (torch derives their shapes from these)
        hidden = torch.empty((1, T, s.hidden_size), dtype=s.dtype, device="meta", requires_grad=loss_fn is not None)
        x = torch.empty((1, T), dtype=torch.long, device="meta") if s.is_first else hidden
        y = torch.empty((1, 2, width or T), dtype=_out_dtype(s.dtype), device="meta") if s.is_last else hidden
        return PipelineStage(s, s.index, s.num_stages, s.device, input_args=x, output_args=y, group=group)

    wrapped = [wrap(s) for s in stages]
    if name == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(wrapped, m, loss_fn=loss_fn, scale_grads=False)
    cls = Schedule1F1B if name == "1f1b" else ScheduleGPipe
    return cls(wrapped[0], m, loss_fn=loss_fn, scale_grads=False)


def _inputs(stages: Sequence[DecoderStage], micro: Sequence[MicroBatch], T: int) -> tuple:
    """The first stage's (m, T) token ids (the pads: id 0, never computed), or nothing on other ranks."""
    if not stages[0].is_first:
        return ()
    ids = micro[0].input_ids.new_zeros((len(micro), T))
    for i, mb in enumerate(micro):
        ids[i, :mb.tokens] = mb.input_ids[0]
    return (ids,)


def from_last(t: torch.Tensor, group) -> torch.Tensor:
    """``t`` as the pipeline's last rank holds it, on every rank of the pipeline (same shape everywhere)."""
    dist.broadcast(t, group=group, group_src=dist.get_world_size(group) - 1)
    return t


def pipeline_backward(stages: Sequence[DecoderStage], micro: Sequence[MicroBatch], loss_fn: LossFn,
                      group: Optional[dist.ProcessGroup] = None, schedule: str = "1f1b", tokens: int = 0,
                      temperature: float = 1.0, chunk: int = 0, with_entropy: bool = False) -> torch.Tensor:
    """Forward and backward of the micro-batches ``micro`` through the pipeline of ``group`` (None: the
    world), this rank holding ``stages``, under the named schedule (`SCHEDULES`); every rank of the
    pipeline passes the same micro-batches.

    On the last stage ``loss_fn(logp (M,), entropy (M,) or None, i)`` gives micro-batch i's loss from its
    response tokens' log-probs (at ``temperature``; entropies when ``with_entropy``); the gradients of the
    sum of the losses accumulate into the stages' parameters, as a loop of ``loss.backward()`` over the
    micro-batches would. A tied embedding's two copies still need `sum_tied_grads`. Each row is padded to
    ``tokens`` (0: the longest row of the pass). Returns the m losses, detached, on every rank."""
    per_rank = len(stages)
    check_micro_batches(schedule, dist.get_world_size(group), len(micro), per_rank)
    T, W = _agree(stages, micro, tokens, group)
    run = _Pass(tuple(micro), float(temperature), int(chunk), bool(with_entropy), W)
    m = len(micro)

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # out (1, 2, W), target (1,) = [i]
        i = int(target)
        M = micro[i].outputs
        return loss_fn(out[0, 0, :M], out[0, 1, :M] if with_entropy else None, i)

    sched = _schedule(schedule, stages, T, m, group, loss, W)
    index = torch.arange(m)
    losses: list[torch.Tensor] = []
    sched.step(*_inputs(stages, micro, T), target=index, losses=losses, return_outputs=False, mb=index, run=run)
    out = torch.zeros(m, device=stages[0].device)
    if stages[-1].is_last:
        out = torch.stack([v.detach().float() for v in losses]).to(out.device)
    return from_last(out, group)


@torch.no_grad()
def pipeline_logprobs(stages: Sequence[DecoderStage], micro: Sequence[MicroBatch],
                      group: Optional[dist.ProcessGroup] = None, tokens: int = 0, temperature: float = 1.0,
                      chunk: int = 0, with_entropy: bool = False) -> list[tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """The forward alone (the old and reference log-prob passes): for each micro-batch, (logp (M,),
    entropy (M,) or None) of its response tokens, on every rank of the pipeline."""
    per_rank = len(stages)
    name = "interleaved_1f1b" if per_rank > 1 else "gpipe"  # forwards in order: no 1F1B micro-batch bound
    check_micro_batches(name, dist.get_world_size(group), len(micro), per_rank)
    T, W = _agree(stages, micro, tokens, group)
    run = _Pass(tuple(micro), float(temperature), int(chunk), bool(with_entropy), W)
    m = len(micro)
    sched = _schedule(name, stages, T, m, group, width=W)
    index = torch.arange(m)
    merged = sched.step(*_inputs(stages, micro, T), mb=index, run=run)
    out = torch.zeros((m, 2, W), dtype=_out_dtype(stages[0].dtype), device=stages[0].device)
    if stages[-1].is_last:
        out.copy_(merged)
    out = from_last(out, group)
    return [(out[i, 0, :M], out[i, 1, :M] if with_entropy else None)
            for i, M in enumerate(mb.outputs for mb in micro)]


def tied_embedding_group(pipelines: Sequence[Sequence[int]]) -> Optional[dist.ProcessGroup]:
    """``pipelines``: the global ranks of every pipeline, in stage order (every rank calls this, as torch's
    ``new_group`` needs). Returns the group of this rank's pipeline's first and last rank, which hold the
    two copies of a tied embedding, or None on the other ranks."""
    pairs = [[int(r[0]), int(r[-1])] for r in pipelines if len(r) > 1]
    if not pairs:
        return None
    group, _ = dist.new_subgroups_by_enumeration(pairs)
    return group


def sum_tied_grads(stages: Sequence[DecoderStage], group: Optional[dist.ProcessGroup]) -> None:
    """After the backward: the gradient of a tied embedding, summed over its copies on the first and the
    last stage (``group``: `tied_embedding_group`), so that both copies take the same step. A no-op on the
    ranks outside the group and for untied models."""
    if group is None:
        return
    weights = [w for w in (s.tied_weight for s in stages) if w is not None]
    if not weights:
        if any(s.tied for s in stages):
            raise ValueError("this rank is in the tied-embedding group but holds neither the first nor the last "
                             "stage; make the group with tied_embedding_group.")
        return
    (w,) = weights  # loop placement: the first and the last stage are on different ranks
    if w.grad is None:
        w.grad = torch.zeros_like(w)
    if is_split(w) and w.grad.placements != w.placements:  # a vocabulary-parallel embedding's is whole
        w.grad = w.grad.redistribute(w.device_mesh, w.placements)  # this rank's rows of it: no transfer
    dist.all_reduce(local(w.grad), group=group)  # tensor parallel: the same rows on both ends


def pipeline_grad_norm(stages: Sequence[DecoderStage], group: Optional[dist.ProcessGroup] = None,
                       max_norm: float = 0.0) -> torch.Tensor:
    """The norm of the whole model's gradient over every rank (each rank's stages, in the pipelines of
    ``group``, None: the world), a tied embedding counted once (call it after `sum_tied_grads`). Each
    rank's squares are divided by the number of ranks that hold the same piece of that gradient: a plain
    gradient is whole on every rank of its stage (the world over the pipeline's ranks), a split one (tensor
    parallel, FSDP2 over the data-parallel ranks, or both) is one of its mesh's pieces. When ``max_norm``
    > 0 every stage's gradients are scaled by min(1, max_norm / (norm + 1e-6)), as
    ``torch.nn.utils.clip_grad_norm_`` does over one model."""
    grads = [p.grad for s in stages for p in s.parameters() if p.grad is not None]
    counted = [p.grad for s in stages for p in s.parameters()
               if p.grad is not None and not (s.is_last and not s.is_first and p is s.tied_weight)]
    per_stage = dist.get_world_size() // dist.get_world_size(group)  # the ranks at one pipeline coordinate
    total = torch.zeros((), dtype=torch.float64, device=stages[0].device)
    for g in counted:
        pieces = 1
        if is_split(g):
            for size, placement in zip(g.device_mesh.shape, g.placements):
                pieces *= 1 if placement.is_replicate() else size
        total += local(g).double().pow(2).sum() / (per_stage // pieces)
    dist.all_reduce(total)
    norm = total.sqrt().float()
    if max_norm > 0:
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            local(g).mul_(coef.to(g.dtype))
    return norm
