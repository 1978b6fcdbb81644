"""One device layer for CPU, CUDA and Ascend NPU (torch_npu registers the 'npu' device)."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

import torch

from verirl.core.errors import ConfigError, ModelError
from verirl.core.registry import Registry

DEVICES = Registry("model.device", {"auto": "cuda, then npu, then cpu", "cpu": "the CPU",
                                    "cuda": "cuda:LOCAL_RANK", "npu": "Ascend NPU through torch_npu"})


def npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def local_rank() -> int:
    """This process's rank on its machine (LOCAL_RANK, set by torch's launcher), 0 alone."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks cuda, then npu, then cpu; an explicit name that is absent is an error. In a
    multi-process run each local rank gets its own accelerator: cuda:LOCAL_RANK / npu:LOCAL_RANK."""
    DEVICES.check(name)
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif npu_available():
            name = "npu"
        else:
            return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelError("model.device=cuda but no CUDA device is visible. Use model.device=auto or cpu.")
    if name == "npu" and not npu_available():
        raise ModelError("model.device=npu but torch_npu is not installed or sees no NPU. "
                         "Install torch_npu or use model.device=auto.")
    if name == "cpu":
        return torch.device("cpu")
    device = torch.device(name, local_rank())
    getattr(torch, name).set_device(device)
    return device


# torch.distributed's backend for each device type
BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def dist_backend(device: torch.device) -> str:
    """The collective backend for ``device``: gloo (CPU); on an accelerator its own (nccl on CUDA, hccl
    on Ascend NPU) for device tensors, and gloo beside it for the host tensors of the step's few
    scalar reductions and gathers (NCCL and HCCL refuse CPU tensors)."""
    if device.type == "cpu":
        return "gloo"
    return f"cpu:gloo,{device.type}:{BACKENDS[device.type]}"


def peak_memory(device: torch.device) -> tuple[str, float]:
    """(metric name, GiB): on an accelerator, the most memory torch has allocated on it so far
    (``perf/max_memory_allocated_gb``, veRL's name); on the CPU, the process's peak resident memory
    (``perf/max_rss_gb``: everything the process holds, the Python runtime included)."""
    if device.type in ("cuda", "npu"):
        return "perf/max_memory_allocated_gb", getattr(torch, device.type).max_memory_allocated(device) / 2**30
    import resource

    return "perf/max_rss_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


COMPUTE_DTYPES = Registry("model.compute_dtype", {
    "null": "the weights' own (model.dtype)", "auto": "bfloat16 where the device multiplies it natively, else the weights' own",
    "float32": "float32 throughout (float32 weights)", "bfloat16": "bfloat16 products over float32 weights"})


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 in hardware: a CPU with AVX512-BF16 or AMX (elsewhere oneDNN
    emulates it, no faster than float32), or a CUDA GPU with bfloat16 tensor cores (compute capability 8.0,
    Ampere, or later; older GPUs only emulate it). Other devices: not assumed."""
    if device.type == "cpu":
        probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return any(p is not None and p() for p in probes)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return False


def check_compute_dtype(name: Optional[str], weights: str) -> None:
    """model.compute_dtype is a known name, and float32 / bfloat16 come with float32 weights (model.dtype):
    checked before a run touches its directory."""
    COMPUTE_DTYPES.check("null" if name is None else name)
    if name in ("float32", "bfloat16") and weights != "float32":
        raise ConfigError(f"model.compute_dtype={name} computes over float32 weights (under mixed precision, the "
                          f"master copy the optimizer updates), but model.dtype={weights} loads them in {weights}. "
                          f"Set model.dtype=float32, or model.compute_dtype=null to compute in the weights' dtype.")


def compute_dtype(name: Optional[str], weights: torch.dtype, device: torch.device) -> Optional[torch.dtype]:
    """The dtype the training passes multiply in under `torch.autocast` (model.compute_dtype) on ``device``
    (where the model computes), or None to compute in the weights' own dtype (no autocast). Mixed precision
    only over float32 weights: they stay the master copy that the gradients and the optimizer state follow."""
    check_compute_dtype(name, str(weights).removeprefix("torch."))
    if name in (None, "float32") or weights != torch.float32 or (name == "auto" and not native_bf16(device)):
        return None
    return torch.bfloat16


def visible_devices(device: str) -> Optional[tuple[str, int]]:
    """(kind, count) of the accelerators one rank per device would use, or None for the CPU
    (model.device=cpu, or auto with no accelerator)."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return "CUDA", torch.cuda.device_count()
    if device == "npu" or (device == "auto" and npu_available()):
        return "NPU", torch.npu.device_count() if npu_available() else 0  # type: ignore[attr-defined]
    return None
