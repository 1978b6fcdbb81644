"""How the model's states are laid out across the ranks (`actor.strategy`), and the few operations
that differ between the layouts: full weights for decoding, full state dicts for checkpoints.

* one rank, or ``ddp``: every rank holds the whole model; `verirl.train.distributed.Dist`
  sums the gradients over the mesh's data-parallel group once per mini-batch.
* ``fsdp2``: torch's FSDP2 (`fully_shard`) on each decoder layer and then on the root, for the
  actor and (parameters only) the reference, over the mesh's data-parallel dimension
  (``dist.mesh["dp"]``); with pipeline stages, on each of this rank's stages instead (`shard_stages`).
  Parameters, gradients and optimizer state are DTensors sharded over it; each module's forward
  all-gathers its weights and each backward reduce-scatters the gradients, SUMMED (the losses are already divided by the global token or
  sequence counts, so the sum is the one-rank gradient; gloo has no pre-multiplied sum, so the sum
  is forced for every backend).

Every rank must run the same collectives. FSDP2 runs them inside module forwards, so:

* the log-prob passes go through the root's forward (`final_hidden`), never only the decoder's,
  so the root's weights (embeddings, final norm, output layer) are gathered before the chunked
  output layer reads them, and its backward is scheduled;
* decoding reads weights outside module forwards and stops at a different step on each rank, so
  it runs inside `full_weights`: every unit gathered once before, none resharded during, all
  resharded after; no collective while decoding;
* a rank with fewer micro-batches runs empty ones (`padded_micro_batches`).

Expert parallelism (`verirl.models.expert_parallel`): each rank holds its slice of the routed experts.
With ``fsdp2`` the experts of each layer are their own unit over the expert-data-parallel ranks
(``dist.edp_mesh``) when there are more than one, and left out of FSDP2 otherwise (``ignored_params``:
their gradients already hold every token of their group, nothing to reduce). `full_weights` gathers
every expert for decoding; the gradient norm counts a slice once; the full state dicts concatenate the
slices (in expert order) and `shard_state_dict` cuts this rank's.

Checkpoints are one format whatever the layout: full tensors (`full_state_dict`,
`full_optimizer_state`, gathered on every rank, written by rank 0), placed back into the shards
on load (`shard_state_dict`, `shard_optimizer_state`).
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch

from verirl.core.dtensors import local
from verirl.models.expert_parallel import expert_modules, gather_experts, gather_slices, tag_experts
from verirl.train.distributed import TP, Dist


def _dtensor():
    from torch.distributed.tensor import DTensor

    return DTensor


def fsdp_units(model) -> list:
    """The FSDP2 units of ``model`` (each sharded layer, then the root); empty when it is not sharded."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model, mesh, device: torch.device, offload_params: bool = False, trainable: bool = True,
          experts_mesh=None):
    """FSDP2 over every decoder layer, then the root (in place; returns ``model``), sharded over
    ``mesh``, a one-dimensional DeviceMesh (the data-parallel dimension, ``dist.mesh["dp"]``). On
    accelerators the parameters compute in bf16 and the gradients reduce in fp32; ``offload_params``
    keeps the shards on the host (where the device is not the host already). ``trainable=False``
    (the reference): parameters only. Experts split by expert parallelism: their own units over
    ``experts_mesh`` (the expert-data-parallel ranks) when it has more than one rank, else left out."""
    _fully_shard(model, model.get_decoder().layers, mesh, device, offload_params, trainable, experts_mesh=experts_mesh)
    return model


def shard_stages(stages, mesh, device: torch.device, offload_params: bool = False, trainable: bool = True) -> None:
    """`shard` for the pipeline stages this rank holds (`verirl.models.pipeline.DecoderStage`): FSDP2 over
    each stage's decoder layers, then the stage, whose embedding, final norm and output layer are its
    root's. The layers stay gathered from a pass's first micro-batch to its end (as torchtitan does under
    pipelining): one all-gather per unit per pass and one reduce-scatter per step (at the schedule's
    end), however many micro-batches each data-parallel rank runs; `reshard_stages` frees them after a
    forward-only pass. Each stage's root is set up at once (FSDP2 would otherwise take the first module
    whose forward runs as its root: a decoder layer, when decoding with the whole model comes first)."""
    for stage in stages:
        _fully_shard(stage, stage.decoder_layers(), mesh, device, offload_params, trainable, reshard_layers=False)
        stage._get_fsdp_state()._lazy_init()


def _fully_shard(root, layers, mesh, device: torch.device, offload_params: bool, trainable: bool,
                 reshard_layers: bool = True, experts_mesh=None) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    accelerator = device.type != "cpu"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if accelerator and next(root.parameters()).dtype == torch.float32 else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload_params and accelerator else OffloadPolicy()
    experts = expert_modules(root)
    ignored: Optional[set] = None
    if experts and experts_mesh is not None and experts_mesh.size() > 1:
        for ex in experts:
            fully_shard(ex, mesh=experts_mesh, mp_policy=mp, offload_policy=offload,
                        reshard_after_forward=reshard_layers)
    elif experts:
        ignored = {p for ex in experts for p in ex.parameters()}
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard_layers,
                    ignored_params=ignored)
    fully_shard(root, mesh=mesh, mp_policy=mp, offload_policy=offload, ignored_params=ignored)
    tag_experts(root)  # FSDP2 replaced the experts' parameters with its own
    for unit in fsdp_units(root):
        unit.set_gradient_divide_factor(1.0)  # a sum, not a mean: see the module docstring
        unit.set_force_sum_reduction_for_comms(True)
    if not trainable:
        root.requires_grad_(False)


def reshard_stages(stages) -> None:
    """Free the gathered weights of FSDP2-sharded stages (`shard_stages`) after a pass."""
    for stage in stages:
        for unit in fsdp_units(stage):
            unit.reshard()


@contextlib.contextmanager
def full_weights(model, split: bool = False) -> Iterator[None]:
    """Every parameter of ``model`` whole, as a plain tensor, inside the block (for decoding, which
    reads weights outside module forwards): one all-gather per unit before, none inside, reshard
    after. A no-op for a model that is not sharded. Experts split by expert parallelism: all gathered
    (`verirl.models.expert_parallel.gather_experts`)."""
    units = fsdp_units(model)
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        with contextlib.nullcontext() if split else _whole_layers(model), gather_experts(model):
            yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(unit is not model, recurse=False)  # FSDP2's defaults
            unit.reshard()


@contextlib.contextmanager
def _whole_layers(model) -> Iterator[None]:
    """A tensor-parallel model as a plain one inside the block: each split weight gathered whole (a
    weight two modules share, once) and the tensor-parallel forward hooks of its modules set aside, so
    that the modules compute as unsplit ones; all put back after. A no-op without split weights."""
    DTensor = _dtensor()
    owners = [m for m in model.modules() if any(isinstance(p, DTensor) for p in m._parameters.values())]
    if not owners:
        yield
        return
    whole: dict[int, torch.Tensor] = {}
    kept = []
    for m in owners:
        params = dict(m._parameters)
        kept.append((m, params, m._forward_pre_hooks, m._forward_hooks))
        for name, p in params.items():
            if isinstance(p, DTensor):
                if id(p) not in whole:
                    whole[id(p)] = torch.nn.Parameter(p.full_tensor().detach(), requires_grad=False)
                m._parameters[name] = whole[id(p)]
        m._forward_pre_hooks, m._forward_hooks = type(m._forward_pre_hooks)(), type(m._forward_hooks)()
    try:
        yield
    finally:
        for m, params, pre, post in kept:
            m._parameters.update(params)
            m._forward_pre_hooks, m._forward_hooks = pre, post


def reshard(model) -> None:
    """Free the gathered root weights a no-grad pass leaves behind (FSDP2 keeps the root's whole after
    its forward, for the backward that follows in training)."""
    if is_sharded(model):
        model.reshard()


def final_hidden(model, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states (after the final norm), computed through the root module's
    forward so that a sharded model gathers its root weights and schedules their gradients; the
    output layer runs on one position only, and its logits are dropped."""
    box: dict[str, torch.Tensor] = {}
    hook = model.get_decoder().register_forward_hook(lambda m, a, out: box.__setitem__("h", out.last_hidden_state))
    try:
        model(input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=1)
    finally:
        hook.remove()
    return box["h"]


@contextlib.contextmanager
def on_device_for(model, device: torch.device, offload: bool) -> Iterator[None]:
    """``ref.offload``: the model comes to ``device`` for the block and goes back to the host after it
    (a sharded model's shards stay on the host under FSDP2's offload policy instead: nothing to move).
    A no-op when ``offload`` is false or the device is the host."""
    move = offload and device.type != "cpu" and not is_sharded(model)
    if move:
        model.to(device)
    try:
        yield
    finally:
        if move:
            model.to("cpu")


@contextlib.contextmanager
def optimizer_state_on_device(optimizer, offload: bool) -> Iterator[None]:
    """``actor.offload=optimizer``: the optimizer state lives on the host between updates and comes to
    its parameters' device for the update. A no-op when ``offload`` is false or the device is the host."""
    if offload:
        _move_optimizer_state(optimizer, to_host=False)
    try:
        yield
    finally:
        if offload:
            _move_optimizer_state(optimizer, to_host=True)


def _move_optimizer_state(optimizer, to_host: bool) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for k, v in state.items():
                if torch.is_tensor(v) and v.dim() > 0 and p.device.type != "cpu":  # AdamW's step count stays put
                    state[k] = v.to("cpu" if to_host else p.device, non_blocking=not to_host)


def state_bytes(model, optimizer, ref=None) -> int:
    """Bytes of the model states this rank holds: parameters, gradients, optimizer state, and the
    reference's parameters (a sharded model's shards only)."""
    tensors = [local(p) for p in model.parameters()] + [local(p.grad) for p in model.parameters() if p.grad is not None]
    tensors += [local(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    tensors += [local(p) for p in ref.parameters()] if ref is not None else []
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_metrics(model, optimizer, ref, dist: Dist) -> dict[str, float]:
    """``perf/model_states_gb`` (`state_bytes`) and the peak memory (`peak_memory`), each the largest
    over the ranks."""
    from verirl.models.device import peak_memory

    name, peak = peak_memory(next(model.parameters()).device)
    states, peak = dist.all_max([state_bytes(model, optimizer, ref) / 2**30, peak], world=True)
    return {"perf/model_states_gb": states, name: peak}


def full(t):
    """The whole of ``t`` on every rank (an all-gather when it is sharded; a collective: every rank
    must call it for the same tensors in the same order). An expert slice: every slice of its
    expert-parallel group, concatenated."""
    whole = t.full_tensor() if isinstance(t, _dtensor()) else t
    mesh = getattr(t, "_verirl_ep_mesh", None)
    return gather_slices(whole, mesh) if mesh is not None else whole


def _expert_meshes(model) -> dict[str, object]:
    """state-dict name -> expert-parallel mesh, for the expert parameters of ``model``."""
    mods = {id(m) for m in expert_modules(model)}
    return {f"{name}.{p}" if name else p: m._verirl_ep_mesh for name, m in model.named_modules() if id(m) in mods
            for p in m._parameters}


def full_state_dict(model, only: Optional[Callable[[str], bool]] = None) -> dict[str, torch.Tensor]:
    """The model's state dict with whole tensors (gathered when sharded; every rank calls it). Tied
    weights stay one tensor under both names, as in the model. ``only``: the names to gather (LoRA: the
    adapters), the rest left out."""
    gathered: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in model.state_dict(keep_vars=True).items():
        if only is not None and not only(k):
            continue
        if id(v) not in gathered:
            gathered[id(v)] = full(v).detach()
        out[k] = gathered[id(v)]
    return out


def full_optimizer_state(optimizer) -> dict:
    """``optimizer.state_dict()`` with whole tensors: the same format as one rank's (every rank calls it)."""
    sd = optimizer.state_dict()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sd["state"] = {i: {k: _full_like(v, params[int(i)]) for k, v in s.items()} for i, s in sd["state"].items()}
    return sd


def _full_like(v, param: torch.Tensor):
    """A state tensor of ``param`` whole (`full`), an expert slice's concatenated over its group."""
    mesh = getattr(param, "_verirl_ep_mesh", None)
    if mesh is None or not torch.is_tensor(v) or v.dim() == 0:
        return full(v)
    v = v.full_tensor() if isinstance(v, _dtensor()) else v
    return gather_slices(v, mesh)


def _own_slice(value: torch.Tensor, mesh) -> torch.Tensor:
    """This rank's rows of a whole expert tensor (dimension 0 split over the expert-parallel ``mesh``)."""
    n = value.shape[0] // mesh.size()
    r = mesh.get_local_rank()
    return value[r * n:(r + 1) * n]


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A whole tensor laid out as ``like`` (this rank's shard of it when ``like`` is sharded, taken
    from the local copy: no communication)."""
    if not isinstance(like, _dtensor()):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh, like.placements, src_data_rank=None)


def shard_state_dict(model, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole weights (a checkpoint's) laid out as ``model``'s parameters, for ``model.load_state_dict``
    (an expert tensor: this rank's experts). Weights as transformers' save_pretrained writes them (a MoE
    block's experts one by one, Mixtral's under ``block_sparse_moe``) are put back under the model's names
    first (`verirl.models.load.model_format`)."""
    from verirl.models.load import model_format

    if getattr(model, "config", None) is not None:
        weights = model_format(model.config)(weights)
    own = model.state_dict()
    meshes = _expert_meshes(model)
    return {k: shard_like(_own_slice(v, meshes[k]) if k in meshes else v, own[k]) if k in own else v
            for k, v in weights.items()}


def shard_optimizer_state(optimizer, state: dict) -> dict:
    """A whole optimizer state (a checkpoint's) laid out as ``optimizer``'s parameters."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    out = dict(state)
    out["state"] = {i: {k: shard_like(_mine(v, params[int(i)]), params[int(i)]) if torch.is_tensor(v) and v.dim() > 0
                        else v for k, v in s.items()} for i, s in state["state"].items()}
    return out


def _mine(v: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    mesh = getattr(param, "_verirl_ep_mesh", None)
    return _own_slice(v, mesh) if mesh is not None else v


def grad_norm(params, max_norm: float) -> torch.Tensor:
    """The gradients' global norm (over every rank's shards), clipped to ``max_norm`` when it is > 0."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    experts = [getattr(p, "_verirl_ep", 1) for p in params if p.grad is not None]
    if any(e > 1 for e in experts) or any(isinstance(g, _dtensor()) and g.device_mesh.ndim > 1 or _on_tp(g)
                                         for g in grads):
        return _split_grad_norm(grads, max_norm, experts)
    if max_norm > 0:
        return full(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return full(torch.nn.utils.get_total_norm(grads))


def _on_tp(t: torch.Tensor) -> bool:
    return isinstance(t, _dtensor()) and TP in (t.device_mesh.mesh_dim_names or ())


def _split_grad_norm(grads, max_norm: float, experts: Optional[list[int]] = None) -> torch.Tensor:
    """`grad_norm` over gradients laid out on several meshes (tensor parallel, with or without FSDP2 over
    the data-parallel ranks, expert slices, and plain tensors every rank holds whole): each rank's local
    squares, each divided by the number of ranks that hold the same piece, summed over every rank.
    ``experts``: per gradient, the expert-parallel group its slice is one of ``experts[i]`` pieces of."""
    world = torch.distributed.get_world_size()
    total = torch.zeros((), dtype=torch.float64, device=local(grads[0]).device if grads else "cpu")
    for i, g in enumerate(grads):
        pieces = experts[i] if experts else 1
        if isinstance(g, _dtensor()):
            for size, p in zip(g.device_mesh.shape, g.placements):
                pieces *= 1 if p.is_replicate() else size  # Shard, or FSDP2's _StridedShard under TP
        total += local(g).double().pow(2).sum() / (world // pieces)
    torch.distributed.all_reduce(total)
    norm = total.sqrt().float()
    if max_norm > 0:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for g in grads:
            local(g).mul_(coef.to(local(g).dtype))
    return norm


def nonfinite_parameter(model, dist: Dist) -> Optional[str]:
    """The name of a parameter holding inf or NaN on any rank (None: all finite), agreed by every rank."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(local(p)).all()]
    first = dist.all_max([1.0 if bad else 0.0], world=True)[0]
    if not first:
        return None
    return next((b for part in dist.gather(bad[:1], world=True) for b in part), "a parameter")
