"""Templating prompts into token ids, and the seeded, resumable prompt order."""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import torch

from verirl.core.errors import CheckpointError, DataError
from verirl.core.registry import Registry
from verirl.core.types import Prompt

TOO_LONG = Registry("data.too_long", {"error": "refuse to start, naming the row", "filter": "drop and count"})
SHUFFLES = Registry("data.shuffle", {"verl": "torch RandomSampler's order, as veRL draws it",
                                     "megatron": "numpy RandomState(seed + epoch).permutation per epoch",
                                     "sequential": "the file order"})


def encode_prompts(prompts: Sequence[Prompt], tokenizer, max_length: int, source: str = "data",
                   too_long: str = "error", tools: Optional[list] = None) -> list[Prompt]:
    """Fill ``p.ids`` with the chat-templated prompt (generation prompt appended; ``tools``: the tool
    schemas the template declares, for multi-turn rollouts).

    A prompt longer than ``max_length`` tokens is an error naming the row, or, with
    ``too_long="filter"``, left out of the returned list."""
    TOO_LONG.check(too_long)
    kept = []
    extra = {"tools": tools} if tools else {}
    for i, p in enumerate(prompts):
        ids = tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, **extra)
        if hasattr(ids, "input_ids") or isinstance(ids, dict):
            ids = ids["input_ids"]
        if len(ids) > max_length:
            if too_long == "filter":
                continue
            raise DataError(f"{source} row {i}: prompt is {len(ids)} tokens, over data.max_prompt_length="
                             f"{max_length}. Raise data.max_prompt_length, shorten the prompt, or set "
                             f"data.too_long=filter to drop such rows.")
        p.ids = list(ids)
        kept.append(p)
    return kept


class PromptSampler:
    """The order prompts are drawn in: seeded, epoch after epoch, resumable mid-epoch.

    ``mode``:
    * ``verl``: veRL's order, i.e. torch's ``RandomSampler(data, generator=torch.Generator().manual_seed(seed))``
      iterated epoch after epoch (one generator; each pass draws two ``randperm``s, see `_permutation`).
    * ``megatron``: Megatron-style index shuffling, ``numpy.random.RandomState(seed + epoch).permutation(size)``
      per epoch.
    * ``sequential``: the file order.

    ``position`` counts prompts drawn so far; `state_dict` / `load_state_dict` resume exactly.
    """

    def __init__(self, size: int, seed: int, mode: str = "verl"):
        SHUFFLES.check(mode)
        if size <= 0:
            raise DataError("the data set is empty: no prompts to sample.")
        self.size, self.seed, self.mode = size, seed, mode
        self.position = 0
        self._epoch = -1
        self._perm: list[int] = []
        self._gen = torch.Generator().manual_seed(seed)

    def _permutation(self, epoch: int) -> list[int]:
        if self.mode == "verl":
            perm = torch.randperm(self.size, generator=self._gen).tolist()
            # RandomSampler.__iter__ ends each full pass with randperm(n)[:num_samples % n]: an empty slice,
            # but the generator still advances. Draw it too, or epoch 2 onwards would differ from veRL's.
            torch.randperm(self.size, generator=self._gen)
            return perm
        if self.mode == "megatron":
            import numpy as np
            return np.random.RandomState(self.seed + epoch).permutation(self.size).tolist()
        return list(range(self.size))

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        epoch, k = divmod(self.position, self.size)
        while self._epoch < epoch:  # also replays earlier epochs after a resume
            self._epoch += 1
            self._perm = self._permutation(self._epoch)
        self.position += 1
        return self._perm[k]

    def take(self, count: int) -> list[int]:
        return [next(self) for _ in range(count)]

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "mode": self.mode, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["mode"], state["size"]) != (self.seed, self.mode, self.size):
            raise CheckpointError(f"sampler state is for seed={state['seed']} mode={state['mode']} size={state['size']}, "
                             f"this run has seed={self.seed} mode={self.mode} size={self.size}.")
        self.__init__(self.size, self.seed, self.mode)  # replay from the start: exact for every mode
        self.position = state["position"]
