"""Apply configured rules to a batch: weights, task routing, honest per-rule means."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from verirl.rewards.rules import RULES


@dataclass
class RewardResult:
    totals: list[float]  # (N,) weighted sum of the rules that apply to each sample
    per_rule: dict[str, list[Optional[float]]]  # rule -> (N,) score, None where the rule does not apply
    errors: int = 0  # rule calls that raised or returned a non-finite value (scored 0)

    def metrics(self, tasks: Sequence[str]) -> dict[str, float]:
        """reward/mean, reward/<rule>/mean over applicable samples only, reward/task/<task>/mean."""
        out = {"reward/mean": sum(self.totals) / max(len(self.totals), 1), "reward/errors": float(self.errors)}
        for rule, scores in self.per_rule.items():
            vals = [s for s in scores if s is not None]
            if vals:  # a batch without this rule's task logs nothing rather than a zero
                out[f"reward/{rule}/mean"] = sum(vals) / len(vals)
        for task in sorted(set(tasks)):
            vals = [t for t, k in zip(self.totals, tasks) if k == task]
            out[f"reward/task/{task}/mean"] = sum(vals) / len(vals)
        return out


def score_batch(responses: Sequence[str], labels: Sequence[str], tasks: Sequence[str],
                verifiers: Sequence[str], weights: Sequence[float],
                task_rules: Optional[Mapping[str, Sequence[str]]] = None) -> RewardResult:
    """Score N responses. A task listed in ``task_rules`` is scored only by its rules;
    any other task by every verifier."""
    task_rules = task_rules or {}
    weight = dict(zip(verifiers, weights))
    per_rule: dict[str, list[Optional[float]]] = {v: [None] * len(responses) for v in verifiers}
    totals = [0.0] * len(responses)
    errors = 0
    for i, (resp, label, task) in enumerate(zip(responses, labels, tasks)):
        for rule in task_rules.get(task, verifiers):
            try:
                s = float(RULES[rule](resp, label, task=task))
                if not math.isfinite(s):
                    raise ValueError(f"non-finite score {s}")
            except Exception:
                s, errors = 0.0, errors + 1
            per_rule[rule][i] = s
            totals[i] += weight[rule] * s
    return RewardResult(totals, per_rule, errors)
