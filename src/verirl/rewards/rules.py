"""Built-in rule verifiers. Each takes one response and its label; scores are documented."""
from __future__ import annotations

import logging
import re
from typing import Optional

from math_verify import parse, verify

from verirl.registry import Registry

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


_INTEGER = re.compile(r"[+-]?\d+")


def _equivalent(answer: str, label: str) -> bool:
    """math-verify's equivalence. Two plain integers (the answer of most arithmetic and GSM8K-style
    tasks) are compared as integers, which is math-verify's verdict on them without its parse and
    verify (a LaTeX parse and a sympy comparison per call); a test checks they agree."""
    a, b = answer.strip(), label.strip()
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
        return int(a) == int(b)
    return _math_verify_equal(answer, label)


def _math_verify_equal(answer: str, label: str) -> bool:
    gold = parse(f"${label}$" if "$" not in label and "\\boxed" not in label else label, parsing_timeout=None)
    pred = parse(f"${answer}$", parsing_timeout=None)
    if not gold or not pred:
        return answer.strip() == label.strip()
    return bool(verify(gold, pred, timeout_seconds=None))


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> Optional[str]:
    """The final answer: the last ``\\boxed{}``; failing that, the content of the last
    ``<answer>...</answer>``; else None."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(text)
    return tags[-1].strip() if tags and tags[-1].strip() else None


def acc(response: str, label: str, **_: object) -> float:
    """Accuracy, MindSpeed-RL's values: 1.0 right, -0.5 answer extracted but wrong, -1.0 nothing extracted.

    The answer is the last ``\\boxed{}`` (braces matched), else the last ``<answer>`` tag's content.
    Equivalence is math-verify's (``\\frac{1}{2}`` equals ``0.5``)."""
    answer = extract_answer(response)
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


_STEP = re.compile(r"(?im)\bstep\s*\d+\s*[:.)]|^\s*(?:\d+\s*[.)]|[-*])\s|\b(?:first|second|third|next|then|finally)\b"
                   r"|第[一二三四五六七八九十\d]+步|首先|其次|然后|最后")


def step(response: str, label: str = "", **_: object) -> float:
    """Reasoning steps: min(1, markers / 3), markers being ``Step N:``, numbered or bulleted lines,
    the words first/second/third/next/then/finally, and 第N步/首先/其次/然后/最后."""
    return min(1.0, len(_STEP.findall(response)) / 3)


_STRICT = re.compile(r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)


def _strict_ok(response: str) -> bool:
    m = _STRICT.match(response)
    if not m:
        return False
    counts = [response.count(t) for t in ("<think>", "</think>", "<answer>", "</answer>")]
    return counts == [1, 1, 1, 1] and m.group("answer").count("\\boxed{") == 1 and "\\boxed{" not in m.group("think")


def strict_format(response: str, label: str = "", **_: object) -> float:
    """Strict format: exactly one think, then exactly one answer holding exactly one ``\\boxed{}``, nothing
    outside the tags: 1.0, else -0.5."""
    return 1.0 if _strict_ok(response) else -0.5


def base_acc(response: str, label: str, **_: object) -> float:
    """For base models: 1.0 when the strict format holds AND the boxed answer is right, else 0.0."""
    if not _strict_ok(response):
        return 0.0
    answer = extract_boxed(response)
    return 1.0 if answer is not None and _equivalent(answer, str(label)) else 0.0


_LOGIC = re.compile(r"\b(?:because|therefore|thus|so|since|hence)\b|∴|=", re.IGNORECASE)


def math_graded(response: str, label: str, **_: object) -> float:
    """A graded reward for MATH-style answers: a wrong (or missing) answer scores 0; a right one scores
    0.7 (math-verify equivalence) + 0.2 (``<think>..</think><answer>..</answer>`` format)
    + 0.1 (ordered reasoning: at least two step markers, or step markers and logic words)."""
    answer = extract_answer(response)
    if answer is None or not _equivalent(answer, str(label)):
        return 0.0
    score = 0.7
    if format_rule(response):
        score += 0.2
    steps = len(_STEP.findall(response))
    if steps >= 2 or (steps >= 1 and _LOGIC.search(response)):
        score += 0.1
    return round(score, 6)


_GSM = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def _gsm_number(text: str) -> Optional[str]:
    found = _GSM.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def gsm8k(response: str, label: str, **_: object) -> float:
    """GSM8K: the number after the last ``####`` equals the label's (a bare number, or GSM8K's
    ``... #### 72`` answer field): 1.0, else 0.0."""
    pred = _gsm_number(response)
    gold = _gsm_number(str(label)) or str(label).strip().replace(",", "")
    if pred is None:
        return 0.0
    try:
        return 1.0 if float(pred) == float(gold) else 0.0
    except ValueError:
        return 0.0


RULES: Registry = Registry("reward.verifiers", {
    "acc": acc, "exact": exact, "format": format_rule, "step": step, "strict_format": strict_format,
    "base_acc": base_acc, "math": math_graded, "gsm8k": gsm8k,
})

# The rules that check the final answer, and the score from which each counts it as right: what
# evaluation calls "right" (val/greedy_acc, pass@k, maj@n), as opposed to the weighted reward.
ANSWER_RULES: dict[str, float] = {"acc": 1.0, "exact": 1.0, "base_acc": 1.0, "gsm8k": 1.0, "math": 0.7}


def is_correct(response: str, label: str) -> bool:
    """Held-out accuracy's test, the same as ``acc == 1.0``: the final answer (last ``\\boxed{}``,
    else the last ``<answer>`` tag) is mathematically equal to the label."""
    answer = extract_answer(response)
    return answer is not None and _equivalent(answer, str(label))
