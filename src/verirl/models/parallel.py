"""Tensor parallelism for the decoder of the Llama family (Llama, Qwen2, Qwen3, Mistral; SmolLM2 and the
tiny model are of it), on torch's own `torch.distributed.tensor.parallel` over one mesh dimension.

In each decoder layer q, k, v and gate, up are column-parallel (each rank computes its share of the
heads and of the MLP's inner width) and o and down row-parallel (the partial products are summed
across the group), so a layer's weights are held 1/tp per rank and the hidden states between layers
are whole on every rank. The embedding is vocabulary-parallel (rows split; the looked-up vectors
summed across the group), and so is the output layer that shares its weight: its log-probs come from
`verirl.core.ops.head_logprobs.vocab_parallel_head_logprobs` on the rank's rows (`head_shard`), so
no rank holds a whole vocabulary's logits. Norms stay replicated. LoRA adapters split with their layers:
a column-parallel layer's B, a row-parallel layer's A (`_styles`).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from verirl.core.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

TP_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")  # config.json model_type values with a plan here
# model_type values whose attention runs split over a sequence-parallel group (Ulysses, through the packed
# attention function): the dense families, and the mixture-of-experts ones whose attention is theirs
SP_FAMILIES = TP_FAMILIES + ("qwen2_moe", "qwen3_moe", "mixtral")
_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW = ("self_attn.o_proj", "mlp.down_proj")


def check_tensor_parallel(config, tp: int, key: str = "actor.tensor_parallel_size") -> None:
    """The model's shape splits over ``tp`` ranks: a known family, and heads, key/value heads, the MLP's
    width and the vocabulary each divisible by tp; one paragraph with the arithmetic otherwise."""
    if tp == 1:
        return
    kind = getattr(config, "model_type", "?")
    if kind not in TP_FAMILIES:
        raise ConfigError(f"{key}={tp}: model_type '{kind}' has no tensor-parallel plan in verirl; the families "
                          f"that have one: {', '.join(TP_FAMILIES)}. Use {key}=1 (data parallel only).")
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        value = getattr(config, name, None)
        if value is not None and value % tp:
            raise ConfigError(f"{key}={tp} does not divide the model's {name}={value} ({value} / {tp} = "
                              f"{value / tp:.3g}): each of the {tp} ranks takes an equal share of it. Choose a "
                              f"{key} that divides {name}.")


def tensor_parallel(model: torch.nn.Module, mesh: "DeviceMesh") -> torch.nn.Module:
    """Shard ``model`` (a causal LM of `TP_FAMILIES`) in place over the 1-D ``mesh``; returns it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    check_tensor_parallel(model.config, mesh.size())
    decoder = model.get_decoder()
    for layer in decoder.layers:
        plan = {k: v for name in _COLUMN for k, v in _styles(layer, name, ColwiseParallel, "lora_B").items()}
        plan |= {k: v for name in _ROW for k, v in _styles(layer, name, RowwiseParallel, "lora_A").items()}
        parallelize_module(layer, mesh, plan)
    parallelize_module(decoder.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate(),
                                                                   output_layouts=Replicate()))
    weight = decoder.embed_tokens.weight
    assert weight.placements == (Shard(0),)
    head = model.get_output_embeddings()
    if getattr(model.config, "tie_word_embeddings", False):
        head.weight = weight  # the output layer keeps sharing the sharded table
        _local_logits(head, mesh)
    else:
        parallelize_module(head, mesh, ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
        head.register_forward_hook(lambda module, args, out: out.to_local().clone())
    # FSDP2 over tensor-parallel weights gathers a whole one in two steps, and torch warns of it at every
    # gather; the result is the same tensor
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    return model


def _styles(layer: torch.nn.Module, name: str, style, adapter_part: str) -> dict:
    """The plan of one linear layer: ``style`` on it, or on a LoRA-adapted layer (`verirl.models.lora`) on its
    base layer and on the adapter's factor that shares the split dimension: a column-parallel layer's B
    (out x rank: its output rows split like the base's), a row-parallel layer's A (rank x in: its input
    columns split, its partial products summed across the group like the base's); the other factor is
    replicated."""
    module = layer.get_submodule(name)
    if getattr(module, "base_layer", None) is None or not hasattr(module, adapter_part):
        return {name: style()}
    return {f"{name}.base_layer": style(), **{f"{name}.{adapter_part}.{a}": style() for a in getattr(module, adapter_part)}}


def _local_logits(head: torch.nn.Module, mesh: "DeviceMesh") -> None:
    """The tied output layer's forward on its vocabulary rows: the (whole) hidden states in, this rank's
    columns of the logits out, as a column-parallel layer gives them (its weight is the embedding's,
    already sharded by rows)."""
    from torch.distributed.tensor import DTensor, Replicate

    def into(module, args):
        return (DTensor.from_local(args[0], mesh, (Replicate(),), run_check=False), *args[1:])

    head.register_forward_pre_hook(into)
    head.register_forward_hook(lambda module, args, out: out.to_local().clone())  # a copy: FSDP2 warns of a view


def is_tensor_parallel(model: torch.nn.Module) -> bool:
    """Whether ``model``'s output layer is split by vocabulary (`tensor_parallel` was applied)."""
    from torch.distributed.tensor import DTensor

    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    return isinstance(weight, DTensor) and any(p.is_shard() for p in weight.placements)


def vocab_shard(weight) -> tuple[torch.Tensor, int, object]:
    """(this rank's rows of a weight split by vocabulary rows, the first row's index in the whole
    vocabulary, the process group the rows are split over) for `vocab_parallel_head_logprobs`."""
    from torch.distributed.tensor import Shard

    local = weight.to_local()
    mesh = weight.device_mesh
    dim = next(i for i, p in enumerate(weight.placements) if p == Shard(0))  # FSDP2 + TP: the "tp" of (dp, tp)
    return local, mesh.get_local_rank(dim) * local.shape[0], mesh.get_group(dim)


def head_shard(model: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """(this rank's rows of the output layer's weight, the first row's index in the whole vocabulary)
    for `vocab_parallel_head_logprobs`."""
    local, start, _ = vocab_shard(model.get_output_embeddings().weight)
    return local, start


def head_group(model: torch.nn.Module):
    """The process group the output layer's vocabulary is split over."""
    return vocab_shard(model.get_output_embeddings().weight)[2]
