"""A model trained in pipeline stages (``actor.pipeline_parallel_size``): the stages this rank holds
(`verirl.models.pipeline`), the log-prob passes and the update through torch's pipelining schedules,
and the whole model where the rest of a run needs it.

Each rank of a pipeline keeps the parameters of its stages and frees the others (their tensors
emptied, ``requires_grad`` off, so the optimizer holds its stages' state only). A tied embedding is
held by the first and the last stage. Under ``actor.strategy=fsdp2`` with data-parallel ranks the
stages are FSDP2-sharded over them (`Pipeline.shard`). Decoding with the whole weights, a checkpoint and its resume
take the whole model for the block (`whole_model`): each freed parameter is made again and sent by
the rank whose stage holds it, and freed after.

Every micro-batch of a pipelined pass is one packed row padded to the token budget at the stage
boundaries (``actor.max_token_len_per_device``: a schedule fixes the shapes it sends when it starts);
the loss and the log-probs are computed on the last stage and sent to the other ranks of the pipeline.
"""
from __future__ import annotations

import contextlib
import re
import weakref
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist

from verirl.core.errors import ConfigError
from verirl.models.pipeline import MicroBatch, build_stages, stage_layers, stages_per_rank, tied_embedding_group
from verirl.train.distributed import Dist
from verirl.train.strategy import fsdp_units, full, reshard_stages, shard_like, shard_stages

_PIPELINES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its Pipeline
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class Pipeline:
    """``model`` cut into the stages of this rank of its pipeline (``dist``'s "pp" group)."""

    def __init__(self, model, dist_: Dist, schedule: str, layers: Optional[Sequence[int]], tied_group):
        self.model, self.schedule, self.group, self.tied_group = model, schedule, dist_.pp_group, tied_group
        pp, per_rank = dist_.pp_world, stages_per_rank(schedule)
        total = pp * per_rank
        self.stages = build_stages(model, dist_.pp_rank, pp, per_rank, layers)
        split = stage_layers(model.config.num_hidden_layers, total, layers)
        stage_of_layer = {i: s for s, r in enumerate(split) for i in r}
        mine = {id(p) for s in self.stages for p in s.parameters()}
        self.owner: dict[str, int] = {}  # parameter name -> the pipeline rank that sends it (first holder)
        self.shapes: dict[str, torch.Size] = {}  # whole
        self.local_shapes: dict[str, torch.Size] = {}  # this rank's share (tensor parallel: its shard)
        self.held: set[str] = set()  # the parameters of this rank's stages
        for name, p in model.named_parameters():
            m = _LAYER.search(name)
            stage = stage_of_layer[int(m.group(1))] if m else (0 if "embed_tokens" in name else total - 1)
            self.owner[name] = stage % pp
            self.shapes[name] = p.shape
            self.local_shapes[name] = _storage(p).shape
            if id(p) in mine:
                self.held.add(name)
        self.sharded = False  # FSDP2 inside the stages (`shard`)
        self._index()
        self._free()
        _PIPELINES[model] = self

    def _index(self) -> None:
        """The parameter objects as the model holds them now (FSDP2 makes new ones): every one's name, and
        the ones this rank holds."""
        params = list(self.model.named_parameters())
        self.names = {id(p): name for name, p in params}  # every parameter, held or not
        self.mine = {id(p) for name, p in params if name in self.held}

    def shard(self, mesh, device: torch.device, offload_params: bool = False, trainable: bool = True) -> None:
        """FSDP2 inside this rank's stages, over ``mesh`` (the data-parallel ranks at this pipeline
        coordinate: `verirl.train.strategy.shard_stages`)."""
        shard_stages(self.stages, mesh, device, offload_params, trainable)
        self.sharded = True
        self._index()

    def _params(self):
        return [(name, p) for name, p in self.model.named_parameters()]

    def _free(self) -> None:
        for name, p in self._params():
            if name not in self.held:
                t = _storage(p)
                t.data = t.data.new_empty(0)
                p.requires_grad_(False)
                p.grad = None

    @contextlib.contextmanager
    def whole(self) -> Iterator[None]:
        """Every parameter of the model on this rank inside the block (tensor parallel: this rank's shard of
        each), to read (its values are not written back): FSDP2's stages gathered over their data-parallel
        ranks, each freed parameter made again and sent by the pipeline rank whose stage holds it (one
        broadcast per parameter over the pipeline, whose ranks share this rank's tensor-parallel
        coordinate), all freed again after."""
        for unit in [u for s in self.stages for u in fsdp_units(s)] if self.sharded else []:
            unit.unshard()  # the stages' units stay whole through forwards (`shard_stages`)
        try:
            for name, p in self._params():
                t = _storage(p)
                if name not in self.held:
                    t.data = t.data.new_empty(self.local_shapes[name])
                dist.broadcast(t.data, group=self.group, group_src=self.owner[name])
            yield
        finally:
            self.reshard()
            self._free()

    def reshard(self) -> None:
        """FSDP2 inside the stages: their gathered weights freed (after a forward-only pass)."""
        if self.sharded:
            reshard_stages(self.stages)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether this rank holds ``t``: a parameter of its stages, or any tensor that is not a parameter
        (buffers: every stage keeps them)."""
        return id(t) in self.mine or id(t) not in self.names

    def owns(self, name: str) -> bool:
        return name in self.held


def _storage(p: torch.Tensor) -> torch.Tensor:
    """The tensor holding this rank's values of ``p``: a DTensor's local tensor (its own object, so that
    freeing and refilling its storage keeps the DTensor), else ``p`` itself."""
    from torch.distributed.tensor import DTensor

    return p._local_tensor if isinstance(p, DTensor) else p


def pipeline_of(model) -> Optional[Pipeline]:
    """The model's `Pipeline`, or None when it is not cut into stages."""
    return _PIPELINES.get(model) if model is not None else None


def parameter_count(model) -> int:
    """The model's parameters, counted whole (a pipelined model's freed ones too)."""
    pipe = pipeline_of(model)
    if pipe is None:
        return sum(p.numel() for p in model.parameters())
    return sum(shape.numel() for shape in pipe.shapes.values())


def pipeline(model, dist_: Dist, schedule: str, layers: Optional[Sequence[int]], tied_group) -> Pipeline:
    """Cut ``model`` into this rank's stages (in place: the other stages' parameters are freed)."""
    return Pipeline(model, dist_, schedule, layers or None, tied_group)


def tied_group(dist_: Dist):
    """The group of each pipeline's first and last rank (every rank calls this once)."""
    return tied_embedding_group(dist_.pipelines())


@contextlib.contextmanager
def whole_model(model) -> Iterator[None]:
    """The whole of a pipelined model inside the block (`Pipeline.whole`); a no-op for any other model."""
    pipe = pipeline_of(model)
    if pipe is None:
        yield
        return
    with pipe.whole():
        yield


def push_tensor(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The whole of one of ``model``'s tensors on every rank, one tensor at a time (a push into an engine
    with its own copy of the weights: vLLM's reload reads each and cuts it again for its own tensor
    parallelism): a pipelined model's parameter first sent over the pipeline by the rank whose stage holds
    it, into a buffer of this rank's share (its tensor-parallel shard), then FSDP2's or tensor parallelism's
    gather (`strategy.full`). A collective: every rank calls it for the same tensors in the same order."""
    def whole(t: torch.Tensor) -> torch.Tensor:
        pipe = pipeline_of(model)
        name = None if pipe is None else pipe.names.get(id(t))
        if name is None:  # not pipelined, or a buffer (every stage holds it)
            return full(t)
        local = _storage(t)
        src = pipe.owner[name]
        sends = dist.get_rank(pipe.group) == src
        if pipe.sharded:  # FSDP2 shards over the stage's data-parallel ranks: gathered whole, then sent whole
            buf = full(t).detach().contiguous() if sends else \
                torch.empty(pipe.shapes[name], dtype=local.dtype, device=local.device)
            dist.broadcast(buf, group=pipe.group, group_src=src)
            return buf
        buf = local.data if sends else torch.empty(pipe.local_shapes[name], dtype=local.dtype, device=local.device)
        dist.broadcast(buf, group=pipe.group, group_src=src)
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            return DTensor.from_local(buf, t.device_mesh, t.placements, shape=t.shape, stride=t.stride()).full_tensor()
        return buf

    return whole


def micro_batches(model, pbs, sp_group=None) -> list[MicroBatch]:
    """The pipelined passes' micro-batches of packed rows ``pbs``, each with its attention layout. With
    ``sp_group`` (sequence parallelism: each rank of the group runs its own pipeline of the same stages)
    each is this rank's slice of the row (`split_packed`), its attention Ulysses over the group, and the
    last stage gathers the row's log-probs from the group's slices."""
    from verirl.train.packing import packed_context

    if sp_group is None or dist.get_world_size(sp_group) == 1:
        return [MicroBatch(pb.input_ids, pb.position_ids, pb.pred_pos, pb.labels,
                           context=lambda pb=pb: packed_context(model, pb)) for pb in pbs]
    from verirl.core.ops.ulysses import gather_tokens, split_packed

    rank, size = dist.get_rank(sp_group), dist.get_world_size(sp_group)
    out = []
    for pb in pbs:
        shard = split_packed(pb.input_ids, pb.position_ids, pb.pred_pos, rank, size)
        out.append(MicroBatch(shard.input_ids, shard.position_ids, shard.pred_pos, pb.labels[shard.owned],
                              context=lambda pb=pb, shard=shard: packed_context(model, pb, sp_group, shard),
                              gather=lambda v, shard=shard: gather_tokens(v, shard, sp_group),
                              total=shard.total_labels))
    return out


def at_least(planned: list[list[int]], count: int, schedule: str = "1f1b", ranks: int = 1) -> list[list[int]]:
    """``planned`` micro-batches split (the largest in halves) until there are at least ``count`` of them
    (a 1F1B schedule over ``count`` stages needs one per stage) and, under interleaved 1F1B over ``ranks``
    pipeline ranks, a count its rounds divide (`check_micro_batches`); refused when there are too few
    sequences to split. Every rank of a pipeline holds the same micro-batches, so all of them split alike."""
    def fits(m: int) -> bool:
        return m >= count and (schedule != "interleaved_1f1b" or m % max(1, m // ranks) == 0)

    planned = [list(mb) for mb in planned]
    while not fits(len(planned)):
        i = max(range(len(planned)), key=lambda j: len(planned[j]))
        if len(planned[i]) < 2:
            raise ConfigError(f"a pipelined pass over {count} stages ({schedule}) needs at least {count} "
                              f"micro-batches{' in whole rounds' if schedule == 'interleaved_1f1b' else ''}, and this "
                              f"mini-batch has {sum(len(mb) for mb in planned)} sequences per data-parallel rank: "
                              f"raise actor.mini_batch_prompts, or use actor.pipeline_schedule=gpipe, or fewer "
                              f"stages.")
        mb = planned.pop(i)
        planned[i:i] = [mb[:len(mb) // 2], mb[len(mb) // 2:]]
    return planned


def scatter(pb, values: torch.Tensor) -> torch.Tensor:
    """(M,) per-label values of packed row ``pb`` as its (rows, width) matrix."""
    return values.new_zeros((pb.rows, pb.width)).index_put((pb.out_row, pb.out_col), values)


def optimizer_state(pipe: Pipeline, optimizer) -> Optional[dict]:
    """The optimizer's state in one rank's format (indices of the whole model's parameters) on the first
    rank of each pipeline (None on the others), every rank sending the state of its stages' parameters
    on the host (a collective over the pipeline)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    names = {id(p): n for n, p in pipe.model.named_parameters()}
    sd = optimizer.state_dict()
    mine = {names[id(params[int(i)])]: {k: full(v).cpu() if torch.is_tensor(v) else v for k, v in s.items()}
            for i, s in sd["state"].items()}  # tensor parallel: each state gathered over the stage's group
    first = dist.get_global_rank(pipe.group, 0)
    every: Optional[list] = [None] * dist.get_world_size(pipe.group) if dist.get_rank() == first else None
    dist.gather_object(mine, every, dst=first, group=pipe.group)
    if every is None:
        return None
    order = [n for n, _ in pipe.model.named_parameters()]
    merged = {k: v for part in every for k, v in part.items()}
    group = dict(sd["param_groups"][0])
    group["params"] = list(range(len(order)))
    return {"state": {i: merged[n] for i, n in enumerate(order) if n in merged}, "param_groups": [group]}


def load_optimizer_state(pipe: Pipeline, optimizer, state: dict) -> None:
    """A one-rank optimizer state (`optimizer_state`'s format) into this rank's optimizer: its stages' part."""
    order = [n for n, _ in pipe.model.named_parameters()]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    names = {id(p): n for n, p in pipe.model.named_parameters()}
    local = {names[id(p)]: i for i, p in enumerate(params)}
    out = {"state": {}, "param_groups": [dict(optimizer.state_dict()["param_groups"][0])]}
    for i, s in state["state"].items():
        name = order[int(i)]
        if name in local:
            param = params[local[name]]
            out["state"][local[name]] = {k: shard_like(v, param) if torch.is_tensor(v) and v.dim() > 0 else v
                                         for k, v in s.items()}
    saved = state["param_groups"][0]
    out["param_groups"][0].update({k: v for k, v in saved.items() if k != "params"})
    optimizer.load_state_dict(out)
