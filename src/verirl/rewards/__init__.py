"""Verifiable rewards: a registry of named rules, custom rules, weights, per-task routing.

A rule is ``fn(response: str, label: str, **extra) -> float`` (or the list form, see
`verirl.rewards.custom`). ``RULES`` maps config names to built-in rules; config may also
name ``path/to/file.py:fn`` or ``package.module:fn`` (not the standard library's), a plain
function; `verirl.rewards.check_reference` checks a reference without running it. `Scorer`
applies the configured rules to a batch in a process pool (`verirl.rewards.pool`: a deadline per call from its start, workers
that die with the trainer, an optional memory cap, captured output) and returns the weighted
totals plus each rule's scores (None where the rule does not apply to the sample's task), so
per-rule means are taken over the samples each rule scored. A failure of any kind, an absurd
score included, scores 0 and is counted, never stopping the run.
"""
from verirl.rewards.custom import Rule, batched, check_reference, load_rule
from verirl.rewards.rules import ANSWER_RULES, RULES, extract_answer, extract_boxed, is_correct
from verirl.rewards.scoring import RewardResult, Scorer, default_workers, score_batch

__all__ = ["ANSWER_RULES", "RULES", "Rule", "batched", "check_reference", "load_rule",
           "extract_answer", "extract_boxed", "is_correct",
           "RewardResult", "Scorer", "default_workers", "score_batch"]
