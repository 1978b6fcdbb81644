"""Verifiable rewards: a registry of named rules, weights, and per-task routing.

A rule is ``fn(response: str, label: str, **extra) -> float``. ``RULES`` maps config
names to rules. `score_batch` applies the configured rules to a batch and returns the
weighted totals plus each rule's scores (None where the rule does not apply to the
sample's task), so per-rule means are taken over the samples each rule scored.
"""
from verirl.rewards.rules import RULES, extract_boxed, is_correct
from verirl.rewards.scoring import RewardResult, score_batch

__all__ = ["RULES", "extract_boxed", "is_correct", "RewardResult", "score_batch"]
