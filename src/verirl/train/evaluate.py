"""Evaluation with the training engine and rules: one loop (`evaluate`) for the held-out numbers of a
training run (``val/...``) and for `verirl eval`: greedy accuracy, pass@k, maj@n, mean reward."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from verirl.rewards import ANSWER_RULES, RewardResult, is_correct
from verirl.rollout import Engine, SamplingParams
from verirl.core.types import Prompt


def reward_fields(p: Prompt) -> dict:
    """What a reward rule sees of a prompt besides the response: its extra keys, label, task and the prompt's
    chat messages (``prompt``: what a judge, a scoring server and a reward model read; a preprocessed
    dataset's rows have the templated prompt text there instead)."""
    return {**p.extra, "label": p.label, "task": p.task, "prompt": p.messages or p.extra.get("prompt", "")}


def decode_responses(tokenizer, rollout) -> list[str]:
    """Response texts without pad/stop tokens (special tokens dropped)."""
    out = []
    for ids, m in zip(rollout.response_ids.tolist(), rollout.response_mask.tolist()):
        out.append(tokenizer.decode([i for i, k in zip(ids, m) if k], skip_special_tokens=True))
    return out


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


def sample_metrics(rewards: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]],
                   answers: Sequence[Sequence[Optional[str]]], ks: Sequence[int]) -> dict[str, float]:
    """pass@k for each k, maj@n and reward_mean (the mean weighted reward, avg@n) over prompts, each
    a list of its n samples."""
    n = len(rewards[0])
    out = {f"pass@{k}": sum(pass_at_k(n, sum(c), k) for c in correct) / len(correct) for k in ks}
    out[f"maj@{n}"] = sum(majority_correct(a, c) for a, c in zip(answers, correct)) / len(correct)
    out["reward_mean"] = sum(sum(r) / n for r in rewards) / len(rewards)
    return out


def answer_right(result: RewardResult, i: int, response: str, label: str, checked: Optional[bool] = None) -> bool:
    """Whether sample ``i`` is right by its task's own answer check: the first answer rule (`ANSWER_RULES`)
    that scored it, at that rule's "right" score; with none, the `acc` rule's test (``checked``, its
    verdict computed under the scoring pool's deadline, where given)."""
    for name, scores in result.per_rule.items():
        if name in ANSWER_RULES and scores[i] is not None:
            return scores[i] >= ANSWER_RULES[name]
    return bool(checked) if checked is not None else is_correct(response, label)


_EXTRACT, _CHECK = "verirl.rewards.rules:extract_answer", "verirl.rewards.rules:is_correct"


def _score(scorer, texts: list[str], samples: list[dict], sampled_from: int):
    """The rules' result; each text's verdict for `answer_right` (the acc test, run only where no answer
    rule scores the text); the extracted answers of ``texts[sampled_from:]`` (maj@n's votes). The
    answers and verdicts are computed in the scoring pool, under its deadline, like the rules."""
    pending = scorer.submit(texts, samples)
    unchecked = [i for i, s in enumerate(samples) if not scorer.applies(ANSWER_RULES, s)]
    answers, checked = scorer.apply([(_EXTRACT, range(sampled_from, len(texts))), (_CHECK, unchecked)], texts, samples)
    verdicts: list[Optional[bool]] = [None] * len(texts)
    for i, v in zip(unchecked, checked):
        verdicts[i] = bool(v)
    return pending.result(), verdicts, answers


def evaluate(engine: Engine, tokenizer, prompts: Sequence[Prompt], scorer, *, n: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, greedy: bool = True, seed: int = 0,
             batch_prompts: int = 64,
             ks: Optional[Sequence[int]] = None, progress: Optional[Callable[[int], None]] = None,
             first_index: int = 0, gather: Optional[Callable[[list], list]] = None, multi_turn=None) -> dict:
    """Decode each prompt greedily once (``greedy``) and sample it ``n`` times at ``temperature``,
    ``top_p`` and ``top_k`` (0 = off) with the given engine; score every response with ``scorer``
    (the training rules, weights and routing).

    Returns ``{"n", "overall", "groups"}``; overall and each group (``task/<task>``,
    ``data_source/<source>``) hold ``prompts``, ``greedy_acc`` (right with greedy decoding),
    ``pass@k`` for k <= n (unbiased; pass@1 is the mean over samples), ``maj@n`` (majority vote
    over extracted answers) and ``reward_mean`` (the mean weighted reward of the samples, avg@n).
    "Right" is the task's own answer check (`answer_right`), not the weighted reward. With n = 0
    only greedy_acc is reported. Each sample's randomness is keyed by ``seed``, the prompt's position
    and the sample's index, so the results do not depend on ``batch_prompts``.

    Split across ranks: each rank passes its share of the prompts, ``first_index`` (its share's
    position in the whole list, for the sampling keys) and ``gather`` (every rank's per-prompt rows,
    in order); the metrics are then those of the whole list, the same on every rank and the same
    as one process evaluating it alone.

    ``multi_turn`` (a `verirl.rollout.multiturn.MultiTurn` on ``engine``): each sample is an episode with
    the run's tools or environment, and its last turn is what is scored."""
    if n < 0 or (n == 0 and not greedy):
        raise ValueError(f"evaluate needs n > 0 samples or greedy decoding; got n={n}, greedy={greedy}")
    ks = sorted({k for k in (ks or [1, 2, 4, 8, 16, 32, 64]) if k <= n} | ({1, n} if n else set()))
    rows: list[dict] = []  # per prompt: greedy right, the n samples' rewards, rights, answers, its groups
    for b in range(0, len(prompts), batch_prompts):
        chunk = prompts[b:b + batch_prompts]
        ids = [p.ids for p in chunk]
        texts: list[str] = []
        at = list(range(first_index + b, first_index + b + len(chunk)))
        if multi_turn is not None:
            if greedy:
                texts += multi_turn.generate(chunk, 1, SamplingParams(max_new_tokens, 0.0), at).answers
            if n:
                texts += multi_turn.generate(chunk, n, SamplingParams(max_new_tokens, temperature, top_p, top_k,
                                                                      seed=seed), at).answers
        else:
            if greedy:
                texts += decode_responses(tokenizer, engine.generate(ids, 1, SamplingParams(max_new_tokens, 0.0)))
            if n:
                texts += decode_responses(tokenizer, engine.generate(
                    ids, n, SamplingParams(max_new_tokens, temperature, top_p, top_k, seed=seed), prompt_index=at))
        per_text = ([p for p in chunk] if greedy else []) + [p for p in chunk for _ in range(n)]
        g = len(chunk) if greedy else 0
        result, verdicts, answers = _score(scorer, texts, [reward_fields(p) for p in per_text], g)
        right = [answer_right(result, i, t, p.label, verdicts[i]) for i, (t, p) in enumerate(zip(texts, per_text))]
        for j, p in enumerate(chunk):
            s = slice(g + j * n, g + (j + 1) * n)
            source = p.extra.get("data_source")
            rows.append({"greedy": right[j] if greedy else None, "rewards": result.totals[s], "right": right[s],
                         "answers": answers[j * n:(j + 1) * n],
                         "groups": [f"task/{p.task}"] + ([f"data_source/{source}"] if source else [])})
        if progress:
            progress(min(b + batch_prompts, len(prompts)))
    if gather is not None:
        rows = gather(rows)
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        for name in row["groups"]:
            groups.setdefault(name, []).append(i)

    def metrics(idx: Sequence[int]) -> dict[str, float]:
        sel = [rows[i] for i in idx]
        out = {"prompts": float(len(sel))}
        if greedy:
            out["greedy_acc"] = sum(r["greedy"] for r in sel) / len(sel)
        if n:
            out.update(sample_metrics([r["rewards"] for r in sel], [r["right"] for r in sel],
                                      [r["answers"] for r in sel], ks))
        return out

    return {"n": n, "overall": metrics(range(len(rows))),
            "groups": {name: metrics(idx) for name, idx in sorted(groups.items())}}


def val_metrics(result: dict) -> dict[str, float]:
    """`evaluate`'s result as flat ``val/...`` metrics: val/greedy_acc, val/task/add/pass@1, ..."""
    out = {f"val/{k}": v for k, v in result["overall"].items() if k != "prompts"}
    for group, m in result["groups"].items():
        out.update({f"val/{group}/{k}": v for k, v in m.items() if k != "prompts"})
    return out
