"""Generation engines behind one protocol: ``engine.generate(prompt_ids, n, params) -> Rollout``."""
from __future__ import annotations

from verirl.rollout.base import Engine, SamplingParams, build_rollout, left_pad
from verirl.rollout.hf import HFEngine
from verirl.rollout.native import NativeEngine

ENGINES = {"native": NativeEngine, "hf": HFEngine}


def build_engine(name: str, model, pad_id: int, stop_ids: list[int]) -> Engine:
    return ENGINES[name](model, pad_id=pad_id, stop_ids=stop_ids)


__all__ = ["Engine", "SamplingParams", "ENGINES", "build_engine", "build_rollout", "left_pad",
           "HFEngine", "NativeEngine"]
