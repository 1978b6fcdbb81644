"""The ranks on torch.distributed: the process group, its named device mesh, and the few collectives
a step needs.

The ranks form a `torch.distributed.device_mesh.DeviceMesh` (`Dist.mesh`) with the named dimensions
``"dp"`` (data parallel) and, with ``actor.sequence_parallel_size`` or ``actor.tensor_parallel_size``
> 1, ``"sp"`` (sequence parallel, Ulysses) and ``"tp"`` (tensor parallel, the innermost: the ranks of
a tensor-parallel group are consecutive, so on one machine). The strategies are built on it: FSDP2
shards over the data-parallel and sequence-parallel ranks (`Dist.gradient_mesh`), ``ddp`` sums the
gradients over the same group, `verirl.models.parallel.tensor_parallel` splits each layer over
``mesh["tp"]``, and the packed passes split each micro-batch's tokens over ``mesh["sp"]``.

With ``actor.expert_parallel_size`` ep > 1 the data-parallel x sequence-parallel group (the gradient
mesh) is laid out again as (``"edp"``, ``"ep"``), ep innermost: each expert-parallel group
(`Dist.ep_mesh`) holds every routed expert once, split over its ranks
(`verirl.models.expert_parallel`), and the ranks holding the same experts (`Dist.edp_mesh`, the
expert-data-parallel group) shard them with FSDP2 or sum their gradients.

The ranks of one data-parallel coordinate (its sp x tp ranks, `Dist.replica_mesh`) hold the same data
(the same prompts, rollouts, rewards and log-probs): the step's data is split over the data-parallel
coordinate (`Dist.dp_rank` of `Dist.dp_world`), and the data collectives (`all_sum`, `all_max`,
`gather`) run over the ``"dp"`` group, so that a replica is not counted twice. ``world=True`` runs one
over every rank instead (a decision every rank must share, the largest memory of any rank).

With ``actor.strategy=ddp`` every rank holds the whole model. A step's prompts are split across the
ranks by whole groups, so advantages need no communication; each rank's loss is divided by the
mini-batch's GLOBAL token or sequence count, and the gradients are summed over the ranks with one
all-reduce per mini-batch, so N ranks take exactly the update one rank takes on the same global
batch. The gradients are reduced here rather than by torch's DistributedDataParallel wrapper
because the log-prob passes call the decoder and the output layer separately (packed attention,
the chunked output layer), which that wrapper's forward never sees.

`Dist` is the one object the rest of training gets: one process alone is `Dist.single()`, with no
process group and no mesh, whose collectives are the identity.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch

from verirl.core.dtensors import local

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DP = "dp"  # the data-parallel dimension's name in `Dist.mesh`
PP = "pp"  # the pipeline-parallel dimension's name (present, with SP and TP, when any is above 1)
SP = "sp"  # the sequence-parallel dimension's name
TP = "tp"  # the tensor-parallel dimension's name
EP = "ep"  # the expert-parallel dimension of the gradient mesh (`Dist.ep_mesh`)
EDP = "edp"  # the expert-data-parallel dimension: the ranks holding the same experts (`Dist.edp_mesh`)


@dataclass(frozen=True)
class Dist:
    rank: int  # global rank
    world: int  # number of ranks
    local_rank: int
    local_world: int  # ranks on this machine
    mesh: Optional["DeviceMesh"] = None  # the ranks' mesh, dimensions DP (and SP, TP); None: one process alone
    shards_mesh: Optional["DeviceMesh"] = None  # DP x SP flattened: FSDP2 shards and gradients are summed over it
    replica_mesh: Optional["DeviceMesh"] = None  # PP x SP x TP flattened: the ranks holding one dp coordinate's data
    groups_mesh: Optional["DeviceMesh"] = None  # PP x SP flattened: a dp coordinate's tensor-parallel groups (with PP)
    ep_mesh: Optional["DeviceMesh"] = None  # the gradient mesh's inner ep ranks: they split the experts (ep > 1)
    edp_mesh: Optional["DeviceMesh"] = None  # the gradient mesh's outer ranks: they hold the same experts (ep > 1)

    @staticmethod
    def single() -> "Dist":
        return Dist(0, 1, 0, 1)

    def _size(self, dim: str) -> int:
        return self.mesh[dim].size() if self.mesh is not None and dim in (self.mesh.mesh_dim_names or ()) else 1

    def _coordinate(self, dim: str) -> int:
        return self.mesh[dim].get_local_rank() if self._size(dim) > 1 else 0

    @property
    def dp_world(self) -> int:
        """Data-parallel ranks: the number of parts the step's data is split into."""
        return self._size(DP)

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel coordinate: which part of the step's data it holds."""
        return self._coordinate(DP)

    @property
    def tp_world(self) -> int:
        """Ranks of this rank's tensor-parallel group (1: none)."""
        return self._size(TP)

    @property
    def tp_rank(self) -> int:
        return self._coordinate(TP)

    @property
    def ep_world(self) -> int:
        """Ranks of this rank's expert-parallel group (1: every rank holds every expert)."""
        return self.ep_mesh.size() if self.ep_mesh is not None else 1

    @property
    def ep_rank(self) -> int:
        """This rank's coordinate in its expert-parallel group: it holds experts [ep_rank*E/ep, (ep_rank+1)*E/ep)."""
        return self.ep_mesh.get_local_rank() if self.ep_mesh is not None else 0

    @property
    def pp_world(self) -> int:
        """Stages of this rank's pipeline (1: none)."""
        return self._size(PP)

    @property
    def pp_rank(self) -> int:
        return self._coordinate(PP)

    @property
    def pp_group(self):
        """The process group of this rank's pipeline (None: no pipeline parallelism)."""
        return self.mesh.get_group(PP) if self.pp_world > 1 else None

    def pipelines(self) -> list[list[int]]:
        """The global ranks of every pipeline, each in stage order."""
        ranks = self.mesh.mesh.movedim(self.mesh.mesh_dim_names.index(PP), -1).reshape(-1, self.pp_world)
        return ranks.tolist()

    @property
    def sp_world(self) -> int:
        """Ranks of this rank's sequence-parallel group (1: none)."""
        return self._size(SP)

    @property
    def sp_group(self):
        """The sequence-parallel process group (None: no sequence parallelism)."""
        return self.mesh.get_group(SP) if self.sp_world > 1 else None

    @property
    def gradient_mesh(self) -> Optional["DeviceMesh"]:
        """The ranks whose gradients are summed and over which FSDP2 shards: the data-parallel ranks, and
        the sequence-parallel ones (each computed its own tokens' share)."""
        if self.mesh is None:
            return None
        return self.shards_mesh if self.shards_mesh is not None else self.mesh[DP]

    def _group(self, world: bool):
        """The process group of a collective: the data-parallel one, or (``world``) every rank."""
        return None if world or self.replica_mesh is None else self.mesh.get_group(DP)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, writes the logs and the checkpoints."""
        return self.rank == 0

    def all_sum(self, values: Sequence[float], world: bool = False) -> list[float]:
        """Element-wise sum over the data-parallel ranks (``world``: over every rank), float64."""
        return self._all_reduce(values, "SUM", world)

    def all_max(self, values: Sequence[float], world: bool = False) -> list[float]:
        """Element-wise maximum over the data-parallel ranks (``world``: over every rank), float64."""
        return self._all_reduce(values, "MAX", world)

    def _all_reduce(self, values: Sequence[float], op: str, world: bool) -> list[float]:
        if not self.active:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64)
        torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, op), group=self._group(world))
        return t.tolist()

    def gather(self, obj: Any, world: bool = False) -> list[Any]:
        """Every data-parallel rank's ``obj`` in data-parallel order (``world``: every rank's, in rank
        order), on every rank."""
        if not self.active:
            return [obj]
        group = self._group(world)
        out: list[Any] = [None] * (self.world if group is None else self.dp_world)
        torch.distributed.all_gather_object(out, obj, group=group)
        return out

    def decoders(self, split: bool) -> tuple[int, int]:
        """(this rank's place, their number) among the ranks that decode shares of one data-parallel
        coordinate's prompts: all its pp x sp x tp ranks, or (``split``: a tensor-parallel group decodes
        together) its tensor-parallel groups (pp x sp)."""
        if self.replica_mesh is None:
            return 0, 1
        if split:
            if self.groups_mesh is not None:
                return self.groups_mesh.get_local_rank(), self.groups_mesh.size()
            return self._coordinate(SP), self.sp_world
        return self.replica_mesh.get_local_rank(), self.replica_mesh.size()

    def decoders_gather(self, obj: Any, split: bool) -> list[Any]:
        """Every decoder's ``obj`` (`decoders`), in their order, on every rank of the replica."""
        rank, size = self.decoders(split)
        if size == 1:
            return [obj]
        out: list[Any] = [None] * size
        group = (self.replica_mesh if not split else self.groups_mesh if self.groups_mesh is not None
                 else self.mesh[SP]).get_group()
        torch.distributed.all_gather_object(out, obj, group=group)
        return out

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients over the mesh's data-parallel group, in one flat buffer (params without a
        gradient count as 0; a tensor-parallel parameter's local shard is summed with the same shard of
        the other data-parallel ranks). Expert slices (`verirl.models.expert_parallel.is_expert`) hold every
        rank of their expert-parallel group's tokens already: they are summed over `edp_mesh` only."""
        from verirl.models.expert_parallel import is_expert

        experts = [p for p in params if is_expert(p)]
        if experts:
            params = [p for p in params if not is_expert(p)]
            if self.edp_mesh is not None and self.edp_mesh.size() > 1:
                self._sum(experts, self.edp_mesh)
        self._sum(params, self.gradient_mesh)

    def _sum(self, params: Sequence[torch.nn.Parameter], mesh: Optional["DeviceMesh"]) -> None:
        if mesh is None or mesh.size() == 1 or not params:
            return
        grads = [local(p.grad) if p.grad is not None else torch.zeros_like(local(p)) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM, group=mesh.get_group())
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            summed = flat[offset:offset + n].view_as(g).to(p.dtype)
            p.grad = _like(summed, p)
            offset += n

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def _like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``value`` (a local shard) as a gradient of ``param``: a DTensor laid out as ``param`` when it is one."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return value
    return DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


def launched() -> bool:
    """Whether this process is a rank started by torch's launcher (or torchrun, or the Ray driver)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: torch.device, timeout_s: int, tensor_parallel: int = 1, sequence_parallel: int = 1,
         pipeline_parallel: int = 1, expert_parallel: int = 1) -> Dist:
    """Join the process group the launcher set up (RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT in the
    environment) and lay its ranks out on a mesh: world / (``pipeline_parallel`` x ``sequence_parallel`` x
    ``tensor_parallel``) data-parallel ranks, each with its pipeline, sequence-parallel and (innermost)
    tensor-parallel groups when any is above 1, and the gradient mesh laid out as (edp, ``expert_parallel``)
    when that is above 1; one process alone gets `Dist.single()`."""
    if not launched() or int(os.environ["WORLD_SIZE"]) == 1:
        return Dist.single()
    from torch.distributed.device_mesh import init_device_mesh

    from verirl.models.device import dist_backend

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(dist_backend(device), timeout=datetime.timedelta(seconds=timeout_s))
    world = torch.distributed.get_world_size()
    rank, local = torch.distributed.get_rank(), (int(os.environ.get("LOCAL_RANK", "0")),
                                                 int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    split = tensor_parallel * sequence_parallel * pipeline_parallel
    if split == 1:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=(DP,))
        ep, edp = _experts(mesh[DP], expert_parallel)
        return Dist(rank, world, *local, mesh, ep_mesh=ep, edp_mesh=edp)
    mesh = init_device_mesh(device.type, (world // split, pipeline_parallel, sequence_parallel, tensor_parallel),
                            mesh_dim_names=(DP, PP, SP, TP))
    shards = mesh[DP, SP]._flatten("dp_sp") if sequence_parallel > 1 else None
    groups = mesh[PP, SP]._flatten("pp_sp") if pipeline_parallel > 1 and tensor_parallel > 1 else None
    ep, edp = _experts(shards if shards is not None else mesh[DP], expert_parallel)
    return Dist(rank, world, *local, mesh, shards, mesh[PP, SP, TP]._flatten("pp_sp_tp"), groups, ep, edp)


def _experts(gradient: "DeviceMesh", ep: int) -> tuple[Optional["DeviceMesh"], Optional["DeviceMesh"]]:
    """(ep_mesh, edp_mesh): the gradient mesh unflattened into (edp, ep), ep innermost; (None, None) at ep 1."""
    if ep == 1:
        return None, None
    size = gradient.size()
    if size % ep:
        from verirl.core.errors import ConfigError

        raise ConfigError(f"actor.expert_parallel_size={ep} does not divide the {size} data-parallel x "
                          f"sequence-parallel ranks ({size} % {ep} = {size % ep}); choose a divisor of {size}.")
    mesh = gradient._unflatten(0, (size // ep, ep), (EDP, EP))
    return mesh[EP], mesh[EDP]


def close(dist: Optional[Dist]) -> None:
    if dist is not None and dist.active and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


POLL_S = 5.0  # the longest any trainer rank waits in one collective for rank 0's producers


def on_rank0(dist: "Dist", poll: Callable[[float], object]):
    """``poll(POLL_S)`` on rank 0 until it answers (not None), every other trainer rank waiting with it in
    short broadcasts: no collective waits longer than POLL_S for the producers, whatever
    trainer.dist_timeout_s is. -> the answer, on every rank."""
    while True:
        got = poll(POLL_S) if dist.is_main else None
        got = dist.broadcast(got)
        if got is not None:
            return got
