"""Expert parallelism (``actor.expert_parallel_size``): the routed experts of every sparse block split over
the ranks of an expert-parallel group, tokens sent to their experts' rank and back with all-to-all.

* `shard_experts` keeps, on the rank of coordinate r of ``ep`` ranks, the experts [r*E/ep, (r+1)*E/ep) of
  every block as plain Parameters (dimension 0 of each fused 3-D weight), sets the block's
  ``num_experts`` to E/ep and selects the experts function ``verirl_ep`` (`EP_IMPLEMENTATION`), registered
  in transformers' ``ExpertsInterface`` and chosen with ``model.set_experts_implementation``.
* `ep_experts_forward`: each (token, expert) pair sorted by expert (so by owner rank), the per-expert counts
  exchanged with one all-to-all, the token rows with a second (autograd: its backward is the reverse
  exchange), this rank's experts computed as one grouped matrix product per projection (transformers'
  ``grouped_mm_experts_forward`` on local ids with unit weights), the results sent back, and the routing
  weights applied on the sender. No token is dropped: the split sizes are exact counts.
* `gather_experts`: every expert whole on every rank of the group inside the block (decoding reads the
  weights outside module forwards, once per generate call, like FSDP2's full weights).

Each expert slice's gradient holds the contributions of every rank of its group (the tokens came to it):
it is summed over the expert-data-parallel ranks (``Dist.edp_mesh``) only, and `is_expert` tags the
parameters so the gradient norm counts each slice once.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Optional

import torch

from verirl.core.errors import ConfigError
from verirl.models.moe import moe_blocks

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

EP_IMPLEMENTATION = "verirl_ep"  # the experts implementation name in transformers' ExpertsInterface
_MESH = "_verirl_ep_mesh"  # attribute of a sharded experts module: its expert-parallel DeviceMesh
TAG = "_verirl_ep"  # attribute of an expert parameter: the expert-parallel group size (and _MESH: the group)


def ep_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                       top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts of a block sharded by `shard_experts`: (T, H) hidden states, (T, k) global expert ids and
    weights -> (T, H). A collective: every rank of the group calls it, with any T (0 too). Experts not sharded
    (another model sharing the config) compute as transformers' grouped_mm."""
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
    from transformers.integrations.moe import grouped_mm_experts_forward

    mesh = getattr(self, _MESH, None)
    if mesh is None:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    group, ep, n = mesh.get_group(), mesh.size(), self.num_experts
    tokens, k = top_k_index.shape
    hidden = hidden_states.size(-1)
    ids = top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)
    send = hidden_states[order // k]
    counts = torch.bincount(ids, minlength=n * ep).view(ep, n)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send_sizes, recv_sizes = torch.stack([counts.sum(1), recv_counts.sum(1)]).tolist()
    recv = wait_tensor(all_to_all_single_autograd(send, recv_sizes, send_sizes, group))
    local_ids = torch.arange(n, device=ids.device).repeat(ep).repeat_interleave(recv_counts.reshape(-1))
    if recv.size(0) == 0:  # no pair for this rank's experts: a zero row keeps them in the backward
        out = grouped_mm_experts_forward(self, recv.sum(0, keepdim=True), local_ids.new_zeros((1, 1)),
                                         recv.new_ones((1, 1)))[:0]
    else:
        out = grouped_mm_experts_forward(self, recv, local_ids.unsqueeze(-1), recv.new_ones((recv.size(0), 1)))
    back = wait_tensor(all_to_all_single_autograd(out, send_sizes, recv_sizes, group))
    pairs = torch.empty_like(back)
    pairs[order] = back
    return (pairs.view(tokens, k, hidden) * top_k_weights.unsqueeze(-1)).sum(dim=1).to(hidden_states.dtype)


def register() -> None:
    """Add `EP_IMPLEMENTATION` to transformers' experts implementations (idempotent)."""
    from transformers.integrations.moe import ExpertsInterface

    if EP_IMPLEMENTATION not in ExpertsInterface._global_mapping:
        ExpertsInterface.register(EP_IMPLEMENTATION, ep_experts_forward)


def expert_modules(model) -> list[torch.nn.Module]:
    """The experts modules of ``model`` that `shard_experts` split."""
    return [m for m in model.modules() if getattr(m, _MESH, None) is not None]


def is_expert(p: torch.Tensor) -> bool:
    return getattr(p, TAG, 1) > 1


def expert_rows(p: torch.Tensor) -> Optional[tuple[int, int]]:
    """(the first expert, the experts of the whole tensor) of an expert slice's dimension 0: the rank of
    coordinate r of ep holding E/ep experts holds rows [r*E/ep, (r+1)*E/ep) of (E, ...); None for a tensor
    that is not an expert slice. ``p.shape[0]`` is the slice's (a DTensor's global shape over the
    expert-data-parallel ranks)."""
    mesh = getattr(p, _MESH, None)
    if mesh is None or not is_expert(p):
        return None
    n = int(p.shape[0])
    return mesh.get_local_rank() * n, n * mesh.size()


def tag_experts(model) -> None:
    """Mark the expert parameters ``model`` holds now (`is_expert`; again after FSDP2 replaced them)."""
    for m in expert_modules(model):
        for p in m._parameters.values():
            if p is not None:
                setattr(p, TAG, getattr(m, _MESH).size())
                setattr(p, _MESH, getattr(m, _MESH))


def shard_experts(model, ep_mesh: "DeviceMesh"):
    """Keep this rank's experts of every sparse block (in place; returns ``model``): the rank of coordinate r
    of ep_mesh's ep ranks keeps experts [r*E/ep, (r+1)*E/ep). A dense model, or E not divisible by ep,
    raises ConfigError."""
    ep = ep_mesh.size()
    blocks = moe_blocks(model)
    if not blocks:
        raise ConfigError(f"actor.expert_parallel_size={ep}: {type(model).__name__} has no mixture-of-experts "
                          f"layers; set actor.expert_parallel_size=1 for a dense model.")
    register()
    for _, block in blocks:
        shard_experts_module(block.experts, ep_mesh)
    model.set_experts_implementation(EP_IMPLEMENTATION)
    return model


def shard_experts_module(ex: torch.nn.Module, ep_mesh: "DeviceMesh") -> None:
    """`shard_experts` for one fused experts module (its parameters' dimension 0 the experts), in place; its
    config's experts implementation is the caller's to set."""
    ep, r = ep_mesh.size(), ep_mesh.get_local_rank()
    e = ex.num_experts
    if e % ep:
        raise ConfigError(f"actor.expert_parallel_size={ep} does not divide the model's {e} experts "
                          f"({e} % {ep} = {e % ep}); choose a divisor of {e}.")
    n = e // ep
    for name, p in list(ex._parameters.items()):
        if p is not None:
            ex._parameters[name] = torch.nn.Parameter(p.detach()[r * n:(r + 1) * n].clone(),
                                                      requires_grad=p.requires_grad)
    ex.num_experts = n
    setattr(ex, _MESH, ep_mesh)
    for p in ex._parameters.values():
        if p is not None:
            setattr(p, TAG, ep)
            setattr(p, _MESH, ep_mesh)


def gather_slices(t: torch.Tensor, mesh: "DeviceMesh") -> torch.Tensor:
    """Every rank's ``t`` of the expert-parallel group, concatenated along dimension 0 (a collective)."""
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(mesh.size())]
    dist.all_gather(parts, t.contiguous(), group=mesh.get_group())
    return torch.cat(parts)


@contextlib.contextmanager
def gather_experts(model) -> Iterator[None]:
    """Every expert of ``model`` whole on this rank inside the block, computed by transformers' grouped_mm
    experts (for decoding: no collective inside); this rank's slices put back after. Reads the parameters
    the modules hold now (FSDP2's gathered ones inside `verirl.train.strategy.full_weights`). A no-op for a
    model without sharded experts."""
    from verirl.core.dtensors import local

    mods = expert_modules(model)
    if not mods:
        yield
        return
    kept = []
    for m in mods:
        params = dict(m._parameters)
        kept.append((m, params, m.num_experts))
        for name, p in params.items():
            if p is not None:
                whole = gather_slices(local(p).detach(), getattr(m, _MESH))
                m._parameters[name] = torch.nn.Parameter(whole, requires_grad=False)
        m.num_experts = m.num_experts * getattr(m, _MESH).size()
    model.set_experts_implementation("grouped_mm")
    try:
        yield
    finally:
        for m, params, n in kept:
            m._parameters.update(params)
            m.num_experts = n
        model.set_experts_implementation(EP_IMPLEMENTATION)
