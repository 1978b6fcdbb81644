"""Generation engines behind one protocol: ``engine.generate(prompt_ids, n, params) -> Rollout``."""
from __future__ import annotations

import dataclasses

from verirl.registry import Registry
from verirl.rollout.base import Engine, SamplingParams, build_rollout, concat_rollouts, left_pad
from verirl.rollout.hf import HFEngine
from verirl.rollout.native import NativeEngine

ENGINES = Registry("rollout.engine", {"native": NativeEngine, "hf": HFEngine})


def build_engine(name: str, model, pad_id: int, stop_ids: list[int]) -> Engine:
    return ENGINES[name](model, pad_id=pad_id, stop_ids=stop_ids)


def generate_chunked(engine: Engine, prompt_ids, n: int, params: SamplingParams, micro_batch_size: int,
                     pad_id: int):
    """Generate in chunks of ``micro_batch_size`` sequences (whole prompt groups); 0 = all at once."""
    per_call = len(prompt_ids) if micro_batch_size <= 0 else max(1, micro_batch_size // n)
    parts = []
    for i, s in enumerate(range(0, len(prompt_ids), per_call)):
        p = params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
        parts.append(engine.generate(prompt_ids[s:s + per_call], n, p))
    return concat_rollouts(parts, pad_id)


__all__ = ["Engine", "SamplingParams", "ENGINES", "build_engine", "build_rollout", "concat_rollouts",
           "generate_chunked", "left_pad",
           "HFEngine", "NativeEngine"]
