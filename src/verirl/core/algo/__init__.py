"""Pure GRPO maths on tensors: no config objects, no distributed, no I/O.

Each family is a dict registry picked by name from the config:
``ADVANTAGE_ESTIMATORS``, ``KL_ESTIMATORS``, ``POLICY_LOSSES``, ``AGGREGATIONS``.
"""
from verirl.core.algo.advantages import (ADVANTAGE_ESTIMATORS, SCALES, grpo_advantages,
                                    reinforce_plus_plus_baseline_advantages, rloo_advantages)
from verirl.core.algo.distill import distill_advantages, reverse_kl
from verirl.core.algo.correction import MODES_IS, MODES_RS, rollout_correction
from verirl.core.algo.kl import KL_ESTIMATORS, kl_penalty
from verirl.core.algo.logprobs import entropy_from_logits, high_entropy_mask, logprobs_from_logits
from verirl.core.algo.loss import (AGGREGATIONS, CLIP_DEFAULTS, POLICY_LOSSES, PolicyLossParams, aggregate,
                              clipped_policy_loss, policy_loss)
from verirl.core.algo.rewards import informative_groups, normalize_then_sum, overlong_penalty

__all__ = [
    "ADVANTAGE_ESTIMATORS", "SCALES", "grpo_advantages", "rloo_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "MODES_IS", "MODES_RS", "rollout_correction", "distill_advantages", "reverse_kl",
    "KL_ESTIMATORS", "kl_penalty",
    "entropy_from_logits", "high_entropy_mask", "logprobs_from_logits",
    "AGGREGATIONS", "CLIP_DEFAULTS", "POLICY_LOSSES", "PolicyLossParams", "aggregate", "clipped_policy_loss",
    "policy_loss",
    "informative_groups", "normalize_then_sum", "overlong_penalty",
]
