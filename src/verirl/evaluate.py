"""Evaluation with the training engine and verifiers: held-out accuracy (greedy, sampled) and
`verirl eval`'s avg@n / pass@k / maj@n."""
from __future__ import annotations

from typing import Optional, Sequence

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


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code"): 1 - C(n - c, k) / C(n, k), as a running product."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n; got k={k}, n={n}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(k):
        miss *= (n - c - i) / (n - i)
    return 1.0 - miss


def majority_correct(answers: Sequence[Optional[str]], correct: Sequence[bool]) -> float:
    """maj@n for one prompt: the most frequent extracted answer (ties: the one seen first) and
    whether it is right; responses with no answer do not vote; no vote at all scores 0."""
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        votes[a] = votes.get(a, 0) + 1
        first.setdefault(a, i)
    if not votes:
        return 0.0
    best = max(votes, key=lambda a: (votes[a], -first[a]))
    return float(correct[first[best]])


def sample_metrics(scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]],
                   answers: Sequence[Sequence[Optional[str]]], ks: Sequence[int]) -> dict[str, float]:
    """avg@n, pass@k for each k, maj@n over prompts (each a list of its n samples)."""
    n = len(scores[0])
    out = {f"avg@{n}": sum(sum(s) / n for s in scores) / len(scores)}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(c), k) for c in correct) / len(correct)
    out[f"maj@{n}"] = sum(majority_correct(a, c) for a, c in zip(answers, correct)) / len(correct)
    return out


def evaluate_samples(engine: Engine, tokenizer, prompts: Sequence[Prompt], n: int, scorer, max_new_tokens: int,
                     temperature: float = 1.0, seed: int = 0, batch_prompts: int = 64,
                     ks: Optional[Sequence[int]] = None, progress=None) -> dict:
    """Sample ``n`` responses per prompt with the training engine, score them with ``scorer`` (the
    same rules as training), and report avg@n (mean score), pass@k (k <= n, unbiased) and maj@n
    (majority vote over extracted answers), overall and per task / data_source.

    A response counts as correct when its answer equals the label (the `acc` rule's test)."""
    from verirl.rewards.rules import extract_answer

    ks = sorted({k for k in (ks or [1, 2, 4, 8, 16, 32, 64]) if k <= n} | {1, n})
    groups: dict[str, list[int]] = {}
    per_prompt: list[tuple[list[float], list[bool], list[Optional[str]]]] = []
    for b in range(0, len(prompts), batch_prompts):
        chunk = prompts[b:b + batch_prompts]
        roll = engine.generate([p.ids for p in chunk], n, SamplingParams(max_new_tokens=max_new_tokens,
                                                                          temperature=temperature, seed=seed + b))
        texts = decode_responses(tokenizer, roll)
        samples = [{**p.extra, "label": p.label, "task": p.task} for p in chunk for _ in range(n)]
        totals = scorer(texts, samples).totals
        for j, p in enumerate(chunk):
            sl = slice(j * n, (j + 1) * n)
            ans = [extract_answer(t) for t in texts[sl]]
            per_prompt.append((totals[sl], [is_correct(t, p.label) for t in texts[sl]], ans))
            idx = len(per_prompt) - 1
            groups.setdefault(f"task/{p.task}", []).append(idx)
            if p.extra.get("data_source"):
                groups.setdefault(f"data_source/{p.extra['data_source']}", []).append(idx)
        if progress:
            progress(min(b + batch_prompts, len(prompts)))

    def metrics(idx: Sequence[int]) -> dict[str, float]:
        rows = [per_prompt[i] for i in idx]
        return {"prompts": float(len(rows)),
                **sample_metrics([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], ks)}

    return {"n": n, "overall": metrics(range(len(per_prompt))),
            "groups": {g: metrics(idx) for g, idx in sorted(groups.items())}}
