"""Pure GRPO maths on tensors: no config objects, no distributed, no I/O.

Each family is a dict registry picked by name from the config:
``ADVANTAGE_ESTIMATORS``, ``KL_ESTIMATORS``, ``AGGREGATIONS``.
"""
from verirl.algo.advantages import ADVANTAGE_ESTIMATORS, grpo_advantages
from verirl.algo.kl import KL_ESTIMATORS, kl_penalty
from verirl.algo.loss import AGGREGATIONS, aggregate, clipped_policy_loss
from verirl.algo.logprobs import entropy_from_logits, logprobs_from_logits

__all__ = [
    "ADVANTAGE_ESTIMATORS", "grpo_advantages", "KL_ESTIMATORS", "kl_penalty", "AGGREGATIONS",
    "aggregate", "clipped_policy_loss", "entropy_from_logits", "logprobs_from_logits",
]
