"""This rank's view of a tensor that may be a DTensor (FSDP2's shards, tensor parallelism's splits).
``torch.distributed.tensor`` is imported when called, not when verirl is."""
from __future__ import annotations

import torch


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (``t`` itself when it is not a DTensor)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def is_split(t: torch.Tensor) -> bool:
    """Whether ``t`` is a DTensor sharded over some dimension of its mesh (not only replicated)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor) and any(not p.is_replicate() for p in t.placements)
