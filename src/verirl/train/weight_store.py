"""The policy's weights, versioned, in shared memory on one machine: how the trainer hands each update to
the producers of an asynchronous run (`verirl.train.producer`).

A store is a ring of ``slots`` flat buffers, one copy of the weights each, and a header of (version,
sequence) per slot. Version v lives in slot v % slots. The writer makes the sequence odd, copies, writes
the version, and makes the sequence even again; a reader copies out of a slot and keeps the copy only if
the sequence was even and the same before and after (a seqlock), so a producer never loads half-updated
weights and the trainer never waits on a reader. The buffers are torch shared-memory tensors (file
descriptors passed to the spawned producers, nothing named on disk): nothing is left behind when a
process is killed.

``fixed`` mode keeps k + 1 versions (the producer of step t needs version t - 1 - k while the trainer may
already hold t - 1); ``bounded`` mode one (the latest).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

ALIGN = 64  # bytes: every tensor starts on a cache line of its slot


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # bytes into the slot
    nbytes: int


def layout(weights: dict[str, torch.Tensor]) -> tuple[list[Entry], int]:
    """Where each tensor sits in a slot, and the slot's size in bytes."""
    entries, at = [], 0
    for name, t in weights.items():
        nbytes = t.numel() * t.element_size()
        entries.append(Entry(name, t.dtype, tuple(t.shape), at, nbytes))
        at += -(-nbytes // ALIGN) * ALIGN
    return entries, max(at, ALIGN)


class WeightStore:
    """``slots`` versions of the weights named in ``entries`` (`layout`). Built by the trainer
    (`WeightStore.create`), sent whole to a producer process (its tensors travel as shared memory)."""

    def __init__(self, entries: list[Entry], buffers: list[torch.Tensor], header: torch.Tensor):
        self.entries, self.buffers, self.header = entries, buffers, header

    @classmethod
    def create(cls, weights: dict[str, torch.Tensor], slots: int) -> "WeightStore":
        entries, size = layout(unique(weights))
        check_room(size * slots, slots)
        buffers = [torch.empty(size, dtype=torch.uint8).share_memory_() for _ in range(slots)]
        header = torch.full((slots, 2), -1, dtype=torch.int64).share_memory_()
        header[:, 1] = 0
        return cls(entries, buffers, header)

    @property
    def slots(self) -> int:
        return len(self.buffers)

    def _views(self, slot: int) -> dict[str, torch.Tensor]:
        buf = self.buffers[slot]
        return {e.name: buf[e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shape) for e in self.entries}

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (the names of the layout, on any device) in as ``version``."""
        slot = version % self.slots
        self.header[slot, 1] += 1  # odd: being written
        views = self._views(slot)
        with torch.no_grad():
            for e in self.entries:
                views[e.name].copy_(weights[e.name].detach().reshape(e.shape))
        self.header[slot, 0] = version
        self.header[slot, 1] += 1  # even: whole

    def latest(self) -> int:
        """The newest whole version in the store (-1: none yet)."""
        whole = [int(v) for v, s in self.header.tolist() if s % 2 == 0 and v >= 0]
        return max(whole, default=-1)

    def has(self, version: int) -> bool:
        v, s = self.header[version % self.slots].tolist()
        return v == version and s % 2 == 0

    def load(self, version: int, into: dict[str, torch.Tensor]) -> bool:
        """Copy ``version`` into the tensors ``into`` (a model's parameters and buffers by name); False,
        leaving them partly written, if that version is not whole in the store (not yet written, being
        written, or already overwritten: call again, or for another version)."""
        slot = version % self.slots
        before = self.header[slot].tolist()
        if before[0] != version or before[1] % 2:
            return False
        views = self._views(slot)
        with torch.no_grad():
            for e in self.entries:
                into[e.name].copy_(views[e.name])
        return self.header[slot].tolist() == before

    def wait_load(self, into: dict[str, torch.Tensor], version: Optional[int] = None, at_least: int = 0,
                  poll_s: float = 0.005, alive=lambda: True) -> int:
        """Load ``version`` exactly, or (``version=None``) the newest version >= ``at_least``, waiting
        for it to be published; -> the version loaded. ``alive()`` is asked while waiting (a producer
        whose trainer went away stops waiting)."""
        while True:
            want = version if version is not None else self.latest()
            if want >= 0 and (version is not None or want >= at_least) and self.load(want, into):
                return want
            if not alive():
                raise RuntimeError("the trainer that publishes the weights is gone")
            time.sleep(poll_s)


def check_room(need: int, slots: int, where: str = "/dev/shm") -> None:
    """Shared memory (``where``, the tmpfs torch's shared tensors live in) has room for ``need`` bytes;
    a `verirl.core.errors.ConfigError` that says how much and the fix otherwise (a container's default
    /dev/shm is 64 MB)."""
    import os

    from verirl.core.errors import ConfigError

    try:
        st = os.statvfs(where)
    except OSError:
        return  # no such tmpfs here: torch says what it lacks
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise ConfigError(f"rollout.placement=separate: the weights store needs {need / 2**20:.0f} MB of shared "
                          f"memory ({slots} cop{'y' if slots == 1 else 'ies'} of the weights: max_staleness + 1 in "
                          f"mode fixed, 1 in bounded) and {where} has {free / 2**20:.0f} MB free. Give the container "
                          f"more (docker run --shm-size=...), or use trainer.async_training.mode=bounded or a "
                          f"smaller max_staleness.")


def named_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a store holds of ``model``: its state dict's tensors, a tied weight once under its first name."""
    return unique(model.state_dict(keep_vars=True))


def unique(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` with a tensor held under several names (tied weights) kept under its first."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in weights.items():
        key = id(t)
        if key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out
