"""On-policy distillation: a teacher's log-probs of the student's own samples as a dense, per-token reward.

The student samples a response; the teacher scores each sampled token. The per-token reverse KL estimate
``log pi_student(y_t) - log pi_teacher(y_t)`` (its expectation over the student's samples is
KL(student || teacher) at that position) is negated and used as the token's advantage, with no
discounting over later tokens (each token is judged by the teacher alone): tokens the teacher finds
likelier than the student did get a positive advantage. It can stand alone or be added to an outcome
advantage (one scalar per response, broadcast over its tokens).
"""
from __future__ import annotations

from typing import Optional

import torch


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """(N, R) per-token reverse KL estimate: student log-prob - teacher log-prob of each sampled token."""
    return student_logp.float() - teacher_logp.float()


def distill_advantages(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor,
                       coef: float = 1.0, outcome: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(N, R) float32 advantages: ``coef * (teacher_logp - student_logp)`` on the tokens of ``mask`` (N, R),
    plus ``outcome`` (N,) broadcast over each response's tokens when given; 0 outside the mask.

    >>> s = torch.tensor([[-1.0, -2.0, 0.0]]); t = torch.tensor([[-0.5, -3.0, -9.0]])
    >>> distill_advantages(s, t, torch.tensor([[1, 1, 0]]), coef=2.0, outcome=torch.tensor([0.25]))
    tensor([[ 1.2500, -1.7500,  0.0000]])
    """
    adv = -coef * reverse_kl(student_logp, teacher_logp)
    if outcome is not None:
        adv = adv + outcome.float()[:, None]
    return torch.where(mask.bool(), adv, torch.zeros_like(adv))
