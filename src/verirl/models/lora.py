"""LoRA adapters on a causal LM, through peft.

peft's LoRA layers are injected into the model in place (`peft.inject_adapter_in_model`): the model
stays the transformers model it was (its decoder, head and config are where verirl's passes and
engines look for them), each adapted linear layer becomes a ``peft.tuners.lora.Linear`` that holds the
frozen base layer and the adapter's A (rank x in) and B (out x rank), and only the adapters' parameters
require gradients. Its output is ``base(x) + scale * B(A(dropout(x)))`` with ``scale = alpha / rank``.

* The reference policy is the same model with its adapters switched off (`adapters_off`): no second copy.
* Decoding engines that read weights directly (the lean decoder) take `merged_weight`: W + scale * B A,
  computed when they lay the weights out, once per generate call.
* A checkpoint or export of the adapters is a peft adapter directory (`save_adapter`:
  adapter_config.json + adapter_model.safetensors with peft's key names), which
  ``peft.PeftModel.from_pretrained(base, DIR)`` loads; `merged_state` gives the merged model's weights
  under the base model's own names, for a Hugging Face directory that needs no peft to load.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional, Union

import torch

from verirl.core.errors import ConfigError, ModelError

ADAPTER = "default"  # peft's name for a model's one adapter
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # the key prefix of a PeftModel's saved adapter weights
# init_lora_weights values verirl accepts, by peft's names: those that leave the adapted model equal to the
# base at the start (B A = 0). The ones that rewrite the base weights (pissa, olora, corda, loftq, eva) are
# refused: the reference policy is the base with the adapters off, so the base must stay the model loaded.
PEFT_INITS = {"true": True, "gaussian": "gaussian", "orthogonal": "orthogonal"}


@dataclass(frozen=True)
class LoraSettings:
    """actor.lora as plain values."""
    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: Union[str, tuple[str, ...]] = "all-linear"
    init: str = "true"

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def peft_config(self, base: str = ""):
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          init_lora_weights=PEFT_INITS[self.init.lower()], bias="none", task_type="CAUSAL_LM",
                          base_model_name_or_path=base or None)


def target_modules(value) -> Union[str, tuple[str, ...]]:
    """actor.lora.target_modules as peft takes it: "all-linear", or a tuple of module names (a list, or
    one string of comma-separated names)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    names = tuple(str(v) for v in value)
    return "all-linear" if names == ("all-linear",) else names


def linear_names(model, but: Optional[torch.nn.Module] = None) -> list[str]:
    """The distinct last names of the model's linear layers (what target_modules may name), ``but`` left out."""
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and n and m is not but})


def apply_lora(model, settings: LoraSettings) -> None:
    """Inject the adapters into ``model`` in place; only they require gradients afterwards. The RNG draws
    of A's initialisation come from torch's generator (seeded by the run). On a mixture-of-experts model
    ``all-linear`` is its linear layers: the routers and the routed experts get no adapters."""
    from peft import inject_adapter_in_model

    from verirl.models.moe import routing

    wanted = settings.target_modules
    if wanted == "all-linear" and routing(model.config) is not None:
        # peft's all-linear would also wrap a MoE block's router and fused 3-D experts (its ParamWrapper),
        # which the lean decoder, expert parallelism and routing replay read as plain tensors: the linear
        # layers instead (attention, dense layers' and shared experts' MLPs), without the output layer
        settings = replace(settings, target_modules=tuple(linear_names(model, but=model.get_output_embeddings())))
    elif not isinstance(wanted, str):
        known = set(linear_names(model))
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise ConfigError(f"actor.lora.target_modules={list(wanted)}: {', '.join(unknown)} "
                              f"{'is not a linear layer' if len(unknown) == 1 else 'are not linear layers'} of "
                              f"this model. Its linear layers: {', '.join(linear_names(model))} (or all-linear).")
    try:
        inject_adapter_in_model(settings.peft_config(), model)
    except ValueError as e:  # peft's own refusals (an odd rank for orthogonal, nothing to target, ...)
        raise ConfigError(f"actor.lora: peft refused the adapters ({e}).") from None
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)


def lora_layers(model) -> list[tuple[str, torch.nn.Module]]:
    """(module name, peft LoRA layer) for every adapted layer of ``model``."""
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def is_lora(model) -> bool:
    return getattr(model, "peft_config", None) is not None and bool(lora_layers(model))


@contextmanager
def adapters_off(model) -> Iterator[None]:
    """``model`` computes as its base inside the block (the reference policy); its adapters are back on,
    and trainable again, after it."""
    layers = [m for _, m in lora_layers(model)]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)


def merged_weight(module: torch.nn.Module) -> torch.Tensor:
    """The weight a linear layer computes with: its own, or for an adapted layer with its adapters on, the
    base's plus scale x B A (in the base weight's dtype; float32 products on the CPU for half types)."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer):
        return module.weight
    base = module.get_base_layer().weight
    if module.disable_adapters or module.merged:
        return base
    delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
    return (base + delta.to(base.device)).to(base.dtype)


def is_adapter_key(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_parameter_names(model) -> list[str]:
    return [n for n, _ in model.named_parameters() if is_adapter_key(n)]


def to_peft_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' tensors of a model state dict under the names peft saves them by:
    ``model.layers.0.self_attn.q_proj.lora_A.default.weight`` -> ``base_model.model.model.layers.0.
    self_attn.q_proj.lora_A.weight``."""
    return {PEFT_PREFIX + k.replace(f".{ADAPTER}.", "."): v for k, v in state.items() if is_adapter_key(k)}


def from_peft_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of `to_peft_names`: a peft adapter file's tensors under the injected model's names."""
    out = {}
    for k, v in state.items():
        name = k.removeprefix(PEFT_PREFIX)
        for part in ("lora_A", "lora_B"):
            name = name.replace(f".{part}.weight", f".{part}.{ADAPTER}.weight")
        out[name] = v
    return out


def merged_state(model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A whole state dict of the adapted ``model`` (names as the model has them) as the merged model's,
    under the base model's names: each adapted layer's ``W + scale x B A`` (summed in float32, stored in
    W's dtype) and its bias; the adapters' own tensors dropped."""
    out = {k: v for k, v in state.items() if ".base_layer." not in k and not is_adapter_key(k)}
    for name, m in lora_layers(model):
        w = state[f"{name}.base_layer.weight"]
        delta = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        for a in m.active_adapters:
            b, lo = state[f"{name}.lora_B.{a}.weight"], state[f"{name}.lora_A.{a}.weight"]
            delta += (b.float() @ lo.float()) * m.scaling[a]
        out[f"{name}.weight"] = (w.float() + delta).to(w.dtype)
        if f"{name}.base_layer.bias" in state:
            out[f"{name}.bias"] = state[f"{name}.base_layer.bias"]
    return out


def settings_of(model) -> Optional[LoraSettings]:
    """The adapters' settings read back from an adapted model (None: no adapters)."""
    config = (getattr(model, "peft_config", None) or {}).get(ADAPTER)
    if config is None:
        return None
    init = next((k for k, v in PEFT_INITS.items() if v == config.init_lora_weights), "true")
    targets = config.target_modules
    targets = targets if isinstance(targets, str) else tuple(sorted(targets))
    return LoraSettings(config.r, float(config.lora_alpha), float(config.lora_dropout), targets, init)


def save_adapter(out_dir: Path, model, state: dict[str, torch.Tensor], base: str) -> None:
    """A peft adapter directory in ``out_dir`` (created; files written as given, the caller renames the
    directory into place): adapter_config.json (with ``base`` as base_model_name_or_path) and
    adapter_model.safetensors of the adapters' tensors in ``state`` (whole tensors, the model's names)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_of(model).peft_config(base).save_pretrained(str(out_dir))
    tensors = {k: v.detach().contiguous() for k, v in to_peft_names(state).items()}
    save_file(tensors, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def is_adapter_dir(path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file()


def adapter_base(path) -> str:
    """The base model a peft adapter directory names (base_model_name_or_path; "" when it names none)."""
    try:
        return str(json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path") or "")
    except (OSError, ValueError, AttributeError) as e:
        raise ModelError(f"{Path(path) / ADAPTER_CONFIG} cannot be read ({type(e).__name__}: {e}).") from None


def read_adapter_dir(path) -> tuple[LoraSettings, str, dict[str, torch.Tensor]]:
    """(its settings, its base model's path, its tensors under the injected model's names) of a peft
    adapter directory. Only LoRA adapters on linear layers load; anything else is named."""
    from safetensors.torch import load_file

    p = Path(path)
    try:
        config = json.loads((p / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{p / ADAPTER_CONFIG} cannot be read ({type(e).__name__}: {e}).") from None
    kind = str(config.get("peft_type", "")).upper()
    if kind != "LORA":
        raise ModelError(f"{p}: a {kind or 'unknown'} adapter (peft_type in {ADAPTER_CONFIG}); verirl loads LoRA "
                         f"adapters only.")
    init = config.get("init_lora_weights", True)
    targets = config.get("target_modules") or "all-linear"
    settings = LoraSettings(int(config["r"]), float(config.get("lora_alpha", 8)), float(config.get("lora_dropout", 0)),
                            targets if isinstance(targets, str) else tuple(sorted(targets)),
                            "true" if init is True or init not in PEFT_INITS.values() else str(init))
    for key in ("use_rslora", "use_dora"):
        if config.get(key):
            raise ModelError(f"{p}: {key}=true in {ADAPTER_CONFIG}; verirl loads plain LoRA adapters only.")
    files = [p / ADAPTER_WEIGHTS] if (p / ADAPTER_WEIGHTS).is_file() else []
    if not files:
        raise ModelError(f"{p} has no {ADAPTER_WEIGHTS} (verirl reads adapters as safetensors only, never "
                         f"adapter_model.bin: unpickling a file can run code).")
    try:
        tensors = load_file(str(files[0]))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type
        raise ModelError(f"{files[0]} cannot be read ({type(e).__name__}: {e}).") from None
    return settings, str(config.get("base_model_name_or_path") or ""), from_peft_names(tensors)


def load_adapter_into(model, path, tensors: dict[str, torch.Tensor]) -> None:
    """The adapter tensors (the injected model's names) into ``model``'s adapters; every adapter of the
    model must be given, with its shape."""
    own = dict(model.named_parameters())
    wanted = set(adapter_parameter_names(model))
    missing, unexpected = sorted(wanted - set(tensors)), sorted(set(tensors) - wanted)
    if missing or unexpected:
        raise ModelError(f"{path}: the adapter does not fit the model (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}). Was it trained on another base model or target_modules?")
    with torch.no_grad():
        for k, v in tensors.items():
            if own[k].shape != v.shape:
                raise ModelError(f"{path}: {k} is {tuple(v.shape)}, the model's is {tuple(own[k].shape)}.")
            own[k].copy_(v)


def merge_into_base(model) -> None:
    """``model`` without its adapters, each adapted layer's base layer put back with the merged weight
    (W + scale x B A): a plain transformers model again."""
    with torch.no_grad():
        for name, m in lora_layers(model):
            base = m.get_base_layer()
            base.weight.data = merged_weight(m).detach().clone()
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, base)
    if hasattr(model, "peft_config"):
        del model.peft_config


def base_path(path: str) -> str:
    """model.path as an adapter directory names its base (base_model_name_or_path): the built-in names as
    they are, a directory made absolute (a run may be continued or evaluated from another directory)."""
    if path in ("tiny", "tiny-tools") or not Path(path).exists():
        return path
    return str(Path(path).resolve())
