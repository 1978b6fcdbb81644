"""Generation engines behind one protocol: ``engine.generate(prompt_ids, n, params, prompt_index) -> Rollout``."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from verirl.core.registry import Registry
from verirl.rollout.base import Engine, SamplingParams, build_rollout, concat_rollouts, left_pad
from verirl.rollout.hf import HFEngine
from verirl.rollout.native import NativeEngine
from verirl.rollout.replay import ReplayEngine

def _vllm_engine(*args, **kwargs):
    """vLLM, imported only when chosen (an optional extra: pip install 'verirl[vllm]')."""
    from verirl.rollout.vllm import VLLMEngine

    return VLLMEngine(*args, **kwargs)


ENGINES = Registry("rollout.engine", {"native": NativeEngine, "hf": HFEngine, "replay": ReplayEngine,
                                      "vllm": _vllm_engine})


def build_engine(name: str, model, pad_id: int, stop_ids: list[int], **options) -> Engine:
    """The engine ``name`` over ``model``; ``options``: the engine's own keyword arguments (replay: path,
    tokenizer, prompts, eos)."""
    return ENGINES[name](model, pad_id=pad_id, stop_ids=stop_ids, **options)


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
    parts = []
    for s in range(0, len(prompt_ids), per_call):
        part = engine.generate(prompt_ids[s:s + per_call], n, params, prompt_index=index[s:s + per_call])
        check_grouped(part, prompt_ids[s:s + per_call], n, type(engine).__name__)
        parts.append(part)
    return concat_rollouts(parts, pad_id)


def check_grouped(rollout, prompt_ids, n: int, source: str) -> None:
    """The one order of samples, checked where rows come back from an engine: row i is a sample of
    prompt i // n (the n samples of a prompt contiguous, prompts in the order given). Every later
    phase (rewards, group advantages, the update, the records) relies on it; a reward goes to 0 when one system's input
    interleave changes and its output one does not. A violation is a
    bug in ``source``, raised with the first row that breaks it."""
    rows, width = rollout.prompt_ids.shape
    if rows != len(prompt_ids) * n:
        raise RuntimeError(f"{source} returned {rows} rows for {len(prompt_ids)} prompts x n={n}")
    lengths = rollout.prompt_lengths.tolist()
    for j, want in enumerate(prompt_ids):
        want_t = torch.as_tensor(list(want), dtype=rollout.prompt_ids.dtype, device=rollout.prompt_ids.device)
        for i in range(j * n, (j + 1) * n):
            if lengths[i] != len(want) or not torch.equal(rollout.prompt_ids[i, width - len(want):], want_t):
                raise RuntimeError(f"{source} broke the order of samples: row {i} should hold a sample of prompt "
                                   f"{j} (rows {j * n}..{(j + 1) * n - 1} are its n={n} samples) but holds another "
                                   f"prompt's")


__all__ = ["Engine", "SamplingParams", "ENGINES", "build_engine", "build_rollout", "concat_rollouts",
           "generate_chunked", "check_grouped", "left_pad",
           "HFEngine", "NativeEngine", "ReplayEngine"]
