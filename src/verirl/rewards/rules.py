"""Built-in rule verifiers. Each takes one response and its label; scores are documented."""
from __future__ import annotations

import logging
import re
from typing import Callable, Optional

from math_verify import parse, verify

# We call math-verify without its signal-based timeouts (they only work on the main thread);
# its one-off warning about that is noise for our users.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def extract_boxed(text: str) -> Optional[str]:
    """The content of the LAST ``\\boxed{...}`` in ``text``, with nested braces matched.

    Returns None when there is no complete ``\\boxed{}``.
    """
    start = text.rfind("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start + len("\\boxed{"): i].strip()
            i += 1
        start = text.rfind("\\boxed{", 0, start)  # unclosed: try an earlier one
    return None


def _equivalent(answer: str, label: str) -> bool:
    gold = parse(f"${label}$" if "$" not in label and "\\boxed" not in label else label, parsing_timeout=None)
    pred = parse(f"${answer}$", parsing_timeout=None)
    if not gold or not pred:
        return answer.strip() == label.strip()
    return bool(verify(gold, pred, timeout_seconds=None))


def acc(response: str, label: str, **_: object) -> float:
    """Accuracy, MindSpeed-RL's values: 1.0 right, -0.5 answer extracted but wrong, -1.0 no ``\\boxed{}``.

    Equivalence is math-verify's (``\\frac{1}{2}`` equals ``0.5``)."""
    answer = extract_boxed(response)
    if answer is None:
        return -1.0
    return 1.0 if _equivalent(answer, str(label)) else -0.5


def exact(response: str, label: str, **_: object) -> float:
    """Exact match: 1.0 when the last ``\\boxed{}`` holds exactly the label (spaces stripped), else 0.0."""
    answer = extract_boxed(response)
    return 1.0 if answer is not None and answer.replace(" ", "") == str(label).replace(" ", "") else 0.0


_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def format_rule(response: str, label: str = "", **_: object) -> float:
    """Format: 1.0 when the response is ``<think>...</think>`` then ``<answer>...</answer>``, else 0.0."""
    return 1.0 if _FORMAT.match(response) else 0.0


RULES: dict[str, Callable[..., float]] = {"acc": acc, "exact": exact, "format": format_rule}


def is_correct(response: str, label: str) -> bool:
    """Held-out accuracy's test: the last ``\\boxed{}`` is mathematically equal to the label."""
    answer = extract_boxed(response)
    return answer is not None and _equivalent(answer, str(label))
