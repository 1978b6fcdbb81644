"""Held-out accuracy with the training engine: greedy, and the mean over k samples."""
from __future__ import annotations

from typing import Sequence

from verirl.rewards import is_correct
from verirl.rollout import Engine, SamplingParams
from verirl.types import Prompt


def decode_responses(tokenizer, rollout) -> list[str]:
    """Response texts without pad/stop tokens (special tokens dropped)."""
    out = []
    for ids, m in zip(rollout.response_ids.tolist(), rollout.response_mask.tolist()):
        out.append(tokenizer.decode([i for i, k in zip(ids, m) if k], skip_special_tokens=True))
    return out


def accuracy(engine: Engine, tokenizer, prompts: Sequence[Prompt], max_new_tokens: int, samples: int = 4,
             temperature: float = 1.0, seed: int = 12345, batch_prompts: int = 100) -> dict[str, float]:
    """{'greedy': fraction right with greedy decoding, 'sampled': mean over ``samples`` draws at
    ``temperature``} plus the same per task (``greedy/<task>``)."""
    res: dict[str, list[float]] = {}
    for mode, n, temp in [("greedy", 1, 0.0), ("sampled", samples, temperature)]:
        if n == 0:
            continue
        for b in range(0, len(prompts), batch_prompts):
            chunk = prompts[b:b + batch_prompts]
            roll = engine.generate([p.ids for p in chunk], n,
                                   SamplingParams(max_new_tokens=max_new_tokens, temperature=temp, seed=seed + b))
            texts = decode_responses(tokenizer, roll)
            for i, text in enumerate(texts):
                p = chunk[i // n]
                ok = float(is_correct(text, p.label))
                res.setdefault(mode, []).append(ok)
                res.setdefault(f"{mode}/{p.task}", []).append(ok)
    return {k: sum(v) / len(v) for k, v in res.items()}
