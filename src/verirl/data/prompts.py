"""Templating prompts into token ids, and the seeded, resumable prompt order."""
from __future__ import annotations

from typing import Iterator, Sequence

import torch

from verirl.types import Prompt


def encode_prompts(prompts: Sequence[Prompt], tokenizer, max_length: int, source: str = "data") -> list[Prompt]:
    """Fill ``p.ids`` with the chat-templated prompt (generation prompt appended).

    A prompt longer than ``max_length`` tokens is an error naming the row."""
    for i, p in enumerate(prompts):
        ids = tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "input_ids") or isinstance(ids, dict):
            ids = ids["input_ids"]
        if len(ids) > max_length:
            raise ValueError(f"{source} row {i}: prompt is {len(ids)} tokens, over data.max_prompt_length="
                             f"{max_length}. Raise data.max_prompt_length or shorten the prompt.")
        p.ids = list(ids)
    return prompts


class PromptSampler:
    """Seeded shuffled order over a data set, epoch after epoch, as veRL's RandomSampler does
    (one ``torch.Generator`` seeded once, a fresh permutation each epoch). ``position`` is
    how many prompts were drawn, so the order can be saved and resumed."""

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.position = 0
        self._gen = torch.Generator().manual_seed(seed)
        self._perm: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        k = self.position % self.size
        if k == 0:
            self._perm = torch.randperm(self.size, generator=self._gen).tolist()
        self.position += 1
        return self._perm[k]

    def take(self, count: int) -> list[int]:
        return [next(self) for _ in range(count)]
