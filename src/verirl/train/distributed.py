"""Data parallelism on torch.distributed: the process group, its named device mesh, and the few
collectives a step needs.

The ranks form a `torch.distributed.device_mesh.DeviceMesh` with one named dimension, ``"dp"``
(data parallel; `Dist.mesh`). The strategies are built on it (FSDP2 shards over ``mesh["dp"]``,
``ddp`` sums the gradients over its group), so tensor, sequence or pipeline dimensions can be
added beside ``"dp"`` without touching the step. Over one dimension spanning every rank, the
``"dp"`` group is the default process group itself.

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
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DP = "dp"  # the data-parallel dimension's name in `Dist.mesh`


@dataclass(frozen=True)
class Dist:
    rank: int  # global rank
    world: int  # number of ranks
    local_rank: int
    local_world: int  # ranks on this machine
    mesh: Optional["DeviceMesh"] = None  # the ranks' mesh, one dimension named DP; None: one process alone

    @staticmethod
    def single() -> "Dist":
        return Dist(0, 1, 0, 1)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, writes the logs and the checkpoints."""
        return self.rank == 0

    def all_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64)."""
        return self._all_reduce(values, "SUM")

    def all_max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over ranks (float64)."""
        return self._all_reduce(values, "MAX")

    def _all_reduce(self, values: Sequence[float], op: str) -> list[float]:
        if not self.active:
            return list(values)
        t = torch.tensor(list(values), dtype=torch.float64)
        torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, op))
        return t.tolist()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients over the mesh's data-parallel group, in one flat buffer (params without a
        gradient count as 0)."""
        if not self.active:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM, group=self.mesh.get_group(DP))
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
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


def launched() -> bool:
    """Whether this process is a rank started by torch's launcher (or torchrun, or the Ray driver)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: torch.device, timeout_s: int) -> Dist:
    """Join the process group the launcher set up (RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT in the
    environment) and lay its ranks out on a mesh of one data-parallel dimension; one process alone
    gets `Dist.single()`."""
    if not launched() or int(os.environ["WORLD_SIZE"]) == 1:
        return Dist.single()
    from torch.distributed.device_mesh import init_device_mesh

    from verirl.models.device import dist_backend

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(dist_backend(device), timeout=datetime.timedelta(seconds=timeout_s))
    world = torch.distributed.get_world_size()
    return Dist(torch.distributed.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0")),
                int(os.environ.get("LOCAL_WORLD_SIZE", "1")), init_device_mesh(device.type, (world,),
                                                                               mesh_dim_names=(DP,)))


def close(dist: Optional[Dist]) -> None:
    if dist is not None and dist.active and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
