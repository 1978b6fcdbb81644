"""One device layer for CPU, CUDA and Ascend NPU (torch_npu registers the 'npu' device)."""
from __future__ import annotations

import importlib.util

import torch

from verirl.errors import ModelError
from verirl.registry import Registry

DEVICES = Registry("model.device", {"auto": "cuda, then npu, then cpu", "cpu": "the CPU",
                                    "cuda": "cuda:LOCAL_RANK", "npu": "Ascend NPU through torch_npu"})


def npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks cuda, then npu, then cpu; an explicit name that is absent is an error."""
    DEVICES.check(name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if npu_available():
            return torch.device("npu")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelError("model.device=cuda but no CUDA device is visible. Use model.device=auto or cpu.")
    if name == "npu" and not npu_available():
        raise ModelError("model.device=npu but torch_npu is not installed or sees no NPU. "
                           "Install torch_npu or use model.device=auto.")
    return torch.device(name)
