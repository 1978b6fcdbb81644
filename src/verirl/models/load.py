"""Load a causal LM and its tokenizer, work out its stop tokens, and save Hugging Face directories."""
from __future__ import annotations

import difflib
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel

from verirl.core.errors import ModelError
from verirl.models.device import resolve_device
from verirl.core.ops.linear import use_fast_linears
from verirl.core.registry import Registry
from verirl.models.lora import (ADAPTER_CONFIG, apply_lora, is_adapter_dir, is_lora, load_adapter_into, merge_into_base,
                                 merged_state, read_adapter_dir, save_adapter)
from verirl.models.lora import adapter_base as named_base

TINY_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny"
TINY_MOE_DIR = TINY_DIR.parent / "tiny-moe"  # the tiny tokenizer and a Qwen3-MoE, 8 experts, top-2 (docs/moe.md)
DTYPES = Registry("model.dtype", {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16})


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: object
    stop_ids: list[int]  # a response ends at the first of these (it is kept and trained on)
    pad_id: int  # fills positions after the end; never used to decide what a response is
    path: str


def resolve_path(path: str) -> str:
    # tiny-tools: tiny with the tool-call tokens, beside it; tiny-moe: the MoE twin (docs/tiny-model.md)
    return {"tiny": str(TINY_DIR), "tiny-tools": str(TINY_DIR.parent / "tiny-tools"),
            "tiny-moe": str(TINY_MOE_DIR)}.get(path, path)


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # weight formats that torch.load unpickles


def pickle_weights(model_dir: str) -> list[str]:
    """The pickle weight files of a directory that has no safetensors weights (what transformers would
    then load with torch.load, which can run code): verirl loads safetensors only."""
    d = Path(model_dir)
    if any(d.glob("*.safetensors")):
        return []
    return sorted(f.name for f in d.iterdir() if f.is_file() and f.suffix in PICKLE_SUFFIXES)


def pickle_refusal(path: str, files: list[str]) -> str:
    return (f"{path} holds its weights as pickle files ({', '.join(files[:3])}), which verirl does not "
            f"load: unpickling a file can run any code in it. Convert them to safetensors on a machine you trust "
            f"(AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)), or "
            f"download the model's .safetensors files.")


def eos_sources(config, generation_config, tokenizer) -> dict[str, list[int]]:
    """The EOS ids each source names: generation_config.json, config.json, the tokenizer (absent
    sources left out)."""
    sources: dict[str, list[int]] = {}
    for name, val in [("generation_config.json", getattr(generation_config, "eos_token_id", None)),
                      ("config.json", getattr(config, "eos_token_id", None)),
                      ("tokenizer", getattr(tokenizer, "eos_token_id", None))]:
        if val is not None:
            sources[name] = [val] if isinstance(val, int) else list(val)
    return sources


def eos_disagree(sources: dict[str, list[int]]) -> bool:
    """Whether a source names an EOS id that generation_config.json does not (transformers' generate()
    and vLLM would not stop on it)."""
    ids = {i for v in sources.values() for i in v}
    gen_ids = set(sources.get("generation_config.json", ids))
    return any(not set(v) <= gen_ids for v in sources.values())


def pad_token_id(tokenizer, stop_ids: list[int]) -> int:
    """The tokenizer's pad id, else the first stop id (safe: responses are masked by position)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]


def stop_token_ids(path: str, model: PreTrainedModel, tokenizer) -> list[int]:
    """Union of the EOS ids of generation_config.json, config.json and the tokenizer.

    Warns when they disagree: Qwen2.5 base and instruct differ here, and a rollout that does
    not stop at the model's real EOS never shows the policy that token, so it never learns to stop."""
    sources = eos_sources(model.config, getattr(model, "generation_config", None), tokenizer)
    ids = sorted({i for v in sources.values() for i in v})
    if not ids:
        raise ModelError(f"{path}: no EOS token id in generation_config.json, config.json or the tokenizer. "
                         f"Set eos_token_id in generation_config.json.")
    if eos_disagree(sources):  # generate() would not stop on one of them
        detail = "; ".join(f"{k}: {v}" for k, v in sources.items())
        warnings.warn(f"{path}: EOS ids disagree ({detail}). verirl stops on any of {ids}; check that the "
                      f"chat template ends turns with one of them.", stacklevel=2)
    return ids


def model_config(path: str, override: Optional[dict] = None):
    """The model's transformers config, with ``override`` (model.override_config) applied: each key
    must be one the config has (a misspelt key would otherwise change nothing, silently). A peft adapter
    directory without a config.json gives its base model's config (as `load_model` loads it)."""
    from transformers import AutoConfig

    real = resolve_path(path)
    if is_adapter_dir(real) and not os.path.exists(os.path.join(real, "config.json")):
        return model_config(_named_base(path, named_base(real)), override)
    config = AutoConfig.from_pretrained(real)
    for key, value in (override or {}).items():
        if not hasattr(config, key):
            known = sorted(k for k in config.to_dict() if not k.startswith("_"))
            close = difflib.get_close_matches(key, known, n=1)
            raise ModelError(f"model.override_config.{key}: {path}'s config ({type(config).__name__}) has no key "
                             f"'{key}'{f'; did you mean {close[0]}?' if close else ''} Its keys: {', '.join(known)}.")
        setattr(config, key, value)
    return config


def load_model(path: str = "tiny", dtype: str = "float32", device: str = "auto",
               override_config: Optional[dict] = None) -> LoadedModel:
    """The model and tokenizer of ``path`` (a Hugging Face directory, tiny, or a peft LoRA adapter
    directory: its base with the adapter merged) on ``device``, with ``override_config`` replacing values
    of its config.json (see `model_config`)."""
    real = resolve_path(path)
    if is_adapter_dir(real) and not os.path.exists(os.path.join(real, "config.json")):
        return _load_adapter(path, real, dtype, device, override_config)
    if not os.path.isdir(real) or not os.path.exists(os.path.join(real, "config.json")):
        raise ModelError(f"model.path='{path}' ({real}) is not a Hugging Face model directory "
                         f"(no config.json). Point model.path at one, or rebuild the tiny model "
                         f"with `make weights`.")
    if pickled := pickle_weights(real):
        raise ModelError(f"model.path='{path}': {pickle_refusal(real, pickled)}")
    extra = {"config": model_config(path, override_config)} if override_config else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(real)
        model = AutoModelForCausalLM.from_pretrained(real, dtype=DTYPES[dtype], attn_implementation="sdpa",
                                                     use_safetensors=True, **extra)
    except (OSError, ValueError, KeyError, SafetensorError) as e:  # a damaged file, an unknown architecture
        raise ModelError(f"model.path='{path}' ({real}) cannot be loaded by transformers: "
                         f"{type(e).__name__}: {e} Check its config.json, tokenizer and weight files.") from e
    model.to(resolve_device(device))
    use_fast_linears(model)  # float32 CPU products through oneDNN (verirl.core.ops.linear); elsewhere F.linear
    stops = stop_token_ids(path, model, tokenizer)
    return LoadedModel(model, tokenizer, stops, pad_token_id(tokenizer, stops), real)


def tokenizer_difference(a, b) -> Optional[str]:
    """None when tokenizers ``a`` and ``b`` map every id to the same token, else the first id where they
    differ, with each one's token there (an id one of them lacks shows as None)."""
    ta = {i: t for t, i in a.get_vocab().items()}
    tb = {i: t for t, i in b.get_vocab().items()}
    for i in range(max(max(ta, default=-1), max(tb, default=-1)) + 1):
        if ta.get(i) != tb.get(i):
            return f"id {i} is {ta.get(i)!r} in one and {tb.get(i)!r} in the other"
    return None


def _named_base(path: str, base: str) -> str:
    """``base``, the base model adapter directory ``path`` names; a ModelError when it names none."""
    if not base:
        raise ModelError(f"model.path='{path}' is a LoRA adapter directory whose {ADAPTER_CONFIG} names no "
                         f"base model (base_model_name_or_path): set it to the base model's directory.")
    return base


def _load_adapter(path: str, real: str, dtype: str, device: str, override_config: Optional[dict]) -> LoadedModel:
    """A peft LoRA adapter directory as a plain model: its base (base_model_name_or_path), the adapter
    merged into it; the adapter directory's tokenizer when it has one (verirl's exports do)."""
    settings, base, tensors = read_adapter_dir(real)
    lm = load_model(_named_base(path, base), dtype, device, override_config)
    apply_lora(lm.model, settings)
    load_adapter_into(lm.model, real, tensors)
    merge_into_base(lm.model)
    tokenizer = lm.tokenizer
    if os.path.exists(os.path.join(real, "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(real)
    return LoadedModel(lm.model, tokenizer, lm.stop_ids, lm.pad_id, lm.path)


def _skeleton(source):
    """The causal LM of ``source`` (a transformers config, or a directory holding config.json) built on the
    meta device: its names and shapes, no memory."""
    from transformers import AutoConfig, PretrainedConfig

    config = source if isinstance(source, PretrainedConfig) else AutoConfig.from_pretrained(str(source))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def saved_format(source) -> Callable[[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(name, tensor) -> {name: tensor} as ``save_pretrained`` writes a weight of the model of ``source`` (its
    config, or a directory holding its config.json): transformers' own reverse of its load-time conversions
    (``revert_weight_conversion``), e.g. a Qwen3-MoE block's fused ``mlp.experts.gate_up_proj`` (E, 2I, H) ->
    each expert's ``gate_proj`` and ``up_proj``, Mixtral's -> ``block_sparse_moe.experts.{e}.w1 / w3``; most
    weights unchanged. Computed against the model built on the meta device (no memory); works on meta tensors
    too (for a file's header), and gives views of the tensor where the conversion is a split."""
    from transformers.core_model_loading import revert_weight_conversion

    skeleton = _skeleton(source)
    # the weights saved as they are, found once (a conversion call costs ~1 ms: 0.4 s a push of a 1.5B model)
    same = {n for n, p in skeleton.state_dict().items() if list(revert_weight_conversion(skeleton, {n: p})) == [n]}
    return lambda name, t: {name: t} if name in same else revert_weight_conversion(skeleton, {name: t})


def model_format(source) -> Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """The inverse of `saved_format`: whole weights as ``save_pretrained`` wrote them (a whole checkpoint's
    model.safetensors) -> the model's own names and layouts, for ``load_state_dict``. Each weight whose saved
    form differs is put back together from its saved pieces by where `saved_format` sends each element (the
    conversion applied to the element indices), so any of transformers' conversions inverts exactly, whatever
    the family; weights already under the model's names pass unchanged."""
    from transformers.core_model_loading import revert_weight_conversion

    skeleton = _skeleton(source)

    def convert(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(weights)
        for name, p in skeleton.state_dict().items():
            if name in out:
                continue
            pieces = revert_weight_conversion(skeleton, {name: p})
            if list(pieces) == [name] or not all(n in out for n in pieces):
                continue  # nothing to convert, or not saved this way: load_state_dict names what is missing
            where = revert_weight_conversion(skeleton, {name: torch.arange(p.numel()).view(p.shape)})
            whole = torch.empty(p.numel(), dtype=out[next(iter(where))].dtype)
            for n, index in where.items():
                whole[index.reshape(-1)] = out.pop(n).reshape(-1)
            out[name] = whole.view(p.shape)
        return out
    return convert


def save_hf(model: PreTrainedModel, tokenizer, out_dir: str | os.PathLike, stop_ids: list[int],
            state_dict: Optional[dict] = None, adapter_base: Optional[str] = None) -> None:
    """Write config, safetensors, tokenizer and a generation_config that names every stop id;
    ``state_dict``: the weights to write, when they are not the model's own (a sharded model's,
    gathered whole); empty: no weights file (a sharded checkpoint's, whose weights are its shards).
    A LoRA-adapted model (`verirl.models.lora`) is written merged (W + scale x B A under the base's names:
    a plain Hugging Face directory), or with ``adapter_base`` as a peft adapter directory of its adapters
    over that base model (``state_dict`` may then hold the adapters' tensors only).

    Written into a temporary sibling and renamed into place, so a crash never leaves half a model."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    lora = is_lora(model)
    if lora:
        state = state_dict if state_dict is not None else model.state_dict()
        if adapter_base is not None:
            save_adapter(tmp, model, state, adapter_base)
        else:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=merged_state(model, state))
    elif state_dict is not None and not state_dict:
        tmp.mkdir(parents=True)
        model.config.save_pretrained(tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    gen = GenerationConfig(eos_token_id=stop_ids if len(stop_ids) > 1 else stop_ids[0],
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=model.config.bos_token_id)
    gen.save_pretrained(tmp)
    if out.exists():  # only the final rename is left; a crash here keeps out.tmp whole
        shutil.rmtree(out)
    os.replace(tmp, out)
