"""Generation engines behind one protocol: ``engine.generate(prompt_ids, n, params, prompt_index) -> Rollout``."""
from __future__ import annotations

from typing import Optional, Sequence

from verirl.registry import Registry
from verirl.rollout.base import Engine, SamplingParams, build_rollout, concat_rollouts, left_pad
from verirl.rollout.hf import HFEngine
from verirl.rollout.native import NativeEngine

ENGINES = Registry("rollout.engine", {"native": NativeEngine, "hf": HFEngine})


def build_engine(name: str, model, pad_id: int, stop_ids: list[int]) -> Engine:
    return ENGINES[name](model, pad_id=pad_id, stop_ids=stop_ids)


def generate_chunked(engine: Engine, prompt_ids, n: int, params: SamplingParams, micro_batch_size: int,
                     pad_id: int, prompt_index: Optional[Sequence[int]] = None):
    """Generate in chunks of ``micro_batch_size`` sequences (whole prompt groups); 0 = all at once.

    ``prompt_index``: the prompts' positions in the step's global batch (default
    ``range(len(prompt_ids))``, for a caller that holds the whole batch). Every chunk gets the
    same seed and its prompts' global positions, so the chunking changes no sampled token."""
    index = list(range(len(prompt_ids))) if prompt_index is None else list(prompt_index)
    if len(index) != len(prompt_ids):
        raise ValueError(f"prompt_index has {len(index)} entries for {len(prompt_ids)} prompts; pass one "
                         f"global batch position per prompt")
    per_call = len(prompt_ids) if micro_batch_size <= 0 else max(1, micro_batch_size // n)
    parts = [engine.generate(prompt_ids[s:s + per_call], n, params, prompt_index=index[s:s + per_call])
             for s in range(0, len(prompt_ids), per_call)]
    return concat_rollouts(parts, pad_id)


__all__ = ["Engine", "SamplingParams", "ENGINES", "build_engine", "build_rollout", "concat_rollouts",
           "generate_chunked", "left_pad",
           "HFEngine", "NativeEngine"]
