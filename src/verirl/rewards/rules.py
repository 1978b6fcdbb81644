"""Built-in rule verifiers. Each takes one response and its label; scores are documented.

Every rule finishes in bounded time on any response. Finding the answer is linear in the length
of the response (one pass over its braces and tags, no pattern that backtracks), and what reaches
math-verify's parser is bounded (`_tractable`): at most `MAX_ANSWER_CHARS` characters, brackets
nested at most `MAX_NESTING` deep, powers and factorials of small numbers only. An answer past a
bound is a wrong answer. In a process's main thread (a scoring worker's) math-verify's own timeout,
`MATH_VERIFY_TIMEOUT_S` per parse and per comparison, applies as well. A None response or label
is an empty one; integers of any length compare exactly.
"""
from __future__ import annotations

import logging
import re
import threading
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Optional

from math_verify import parse, verify

from verirl.core.registry import Registry

# Outside a main thread math-verify runs without its signal-based timeouts (the bounds in
# `_tractable` hold there too); its one-off warning about that is noise for our users.
logging.getLogger("math_verify").setLevel(logging.ERROR)

MAX_ANSWER_CHARS = 300  # an answer longer than this is compared as text only (MATH-500's longest: 159)
MAX_LABEL_CHARS = 2000  # the same for a label
MAX_NESTING = 6  # ( and [ nested deeper than this: compared as text only (each level costs the parser ~0.1 s)
MAX_BRACES = 40  # { nested deeper than this: the same
MAX_POWER = 1000  # largest exponent or factorial argument evaluated in an answer with no variable
MAX_SYMBOLIC_POWER = 30  # the sum of the exponents in an answer with a variable (sympy expands (x+1)^n)
MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own timeout per parse and comparison, in a main thread: a backstop
MAX_BOX_RUN = 50  # boxes read as one list answer at most
FINAL_LINE_CHARS = 1000  # the tail of a response searched for a final-answer line


def _text(x: object) -> str:
    return "" if x is None else str(x)


_BOX_TOKEN = re.compile(r"\\boxed\{|[{}]")


def _boxes(text: str) -> list[tuple[int, int]]:
    """(start, end) of the content of every complete ``\\boxed{...}``, braces matched, in order of
    the box's start. One pass over the braces: an unclosed box costs nothing more."""
    stack: list[Optional[int]] = []  # per open brace: where its box's content starts, or None
    found = []
    for m in _BOX_TOKEN.finditer(text):
        if m.group() == "}":
            if stack and (begin := stack.pop()) is not None:
                found.append((begin, m.start()))
        else:
            stack.append(m.end() if m.group() != "{" else None)
    return sorted(found)


def extract_boxed(text: Optional[str]) -> Optional[str]:
    """The content of the LAST complete ``\\boxed{...}`` in ``text``, with nested braces matched.

    Returns None when there is no complete ``\\boxed{}``.
    """
    text = _text(text)
    found = _boxes(text)
    if not found:
        return None
    begin, end = found[-1]
    return text[begin:end].strip()


# What may stand between boxes that list one answer: \boxed{1}, \boxed{2} and \boxed{3}
_BOX_GAP = re.compile(r"(?:\s|[$,;]|\\[,; ]|\\q?quad|\\text\{\s*(?:and|or|,)\s*\}|and|or|\\[()\[\]])*")


def _box_run(text: str, found: list[tuple[int, int]]) -> list[str]:
    """The contents of the run of top-level boxes that ends with the last one, each separated from
    the next only by commas, ``and``, spaces and math delimiters."""
    top: list[tuple[int, int]] = []
    for b in found:  # sorted by start, and boxes nest: a box inside the previous top-level one is not one
        if not top or b[0] > top[-1][1]:
            top.append(b)
    run = [top[-1]]
    for prev in reversed(top[-MAX_BOX_RUN:-1]):
        gap = text[prev[1] + 1:run[0][0] - len("\\boxed{")]
        if len(gap) > 200 or not _BOX_GAP.fullmatch(gap):
            break
        run.insert(0, prev)
    return [text[b:e].strip() for b, e in run]


def _answer_tag(text: str) -> Optional[str]:
    """The content of the last ``<answer>...</answer>`` (each tag closed by the first ``</answer>``
    after it), stripped; None if there is none or it is empty."""
    pos, last = 0, None
    while (begin := text.find("<answer>", pos)) != -1:
        end = text.find("</answer>", begin + len("<answer>"))
        if end == -1:
            break
        last, pos = text[begin + len("<answer>"):end], end + len("</answer>")
    return last.strip() if last is not None and last.strip() else None


_FINAL = re.compile(r"(?i)\bfinal[ \t]+answer[ \t]+is[ \t]*|\banswer[ \t]*:[ \t]*")


def _final_line(text: str) -> Optional[str]:
    """The answer of the last final-answer line in the response's tail: DAPO's ``Answer: X`` or
    Minerva's ``The final answer is $X$. I hope it is correct.``; None if there is none."""
    tail = text[-FINAL_LINE_CHARS:]
    last = None
    for last in _FINAL.finditer(tail):
        pass
    if last is None:
        return None
    line = tail[last.end():].split("\n", 1)[0].strip()
    for hope in ("i hope it is correct.", "i hope it is correct"):
        if line.lower().endswith(hope):
            line = line[:-len(hope)].strip()
    line = line.rstrip(".").strip()
    if len(line) > 1 and line[0] == line[-1] == "$":
        line = line.strip("$").strip()
    return line or None


_SPACE = re.compile(r"\s")
_WORD = re.compile(r"(?<![\\A-Za-z{])[A-Za-z]{2,}\b")


def _math_run(prose: str) -> Optional[str]:
    """The last stretch of prose between plain words, trimmed: ``The answer is \\dfrac{1}{2}.`` gives
    ``\\dfrac{1}{2}``; None where there is no such stretch or it is the whole text."""
    parts = [p.strip(" \t\n.,:;!?$") for p in _WORD.split(prose)]
    parts = [p for p in parts if p and p.count("{") == p.count("}")]
    return parts[-1] if parts and parts[-1] != prose.strip() else None


def _readings(text: str) -> Optional[list[tuple[str, bool]]]:
    """The response's final answer as (text, free) readings to compare, the first being
    `extract_answer`'s; ``free`` lets math-verify find the math in prose. In order: the last
    ``\\boxed{}`` (and the run of boxes it ends, as one list), else the last ``<answer>`` tag, else a
    final-answer line; a tag's or line's text is also read as free text when it has a space in it,
    and by its last stretch of math when it has two words. None when the response marks no answer."""
    found = _boxes(text)
    if found:
        last = text[found[-1][0]:found[-1][1]].strip()
        run = _box_run(text, found)
        return [(last, False)] + ([(", ".join(run), False)] if len(run) > 1 else [])
    answer = _answer_tag(text)
    if answer is None:
        answer = _final_line(text)
    if answer is None:
        return None
    if not _SPACE.search(answer):  # one token (``12``, ``old{108}``): read as math only
        return [(answer, False)]
    run = _math_run(answer) if len(_WORD.findall(answer)) >= 2 else None
    return [(answer, False), (answer[-MAX_ANSWER_CHARS:], True)] + ([(run, False)] if run else [])


def extract_answer(text: Optional[str]) -> Optional[str]:
    """The final answer: the last ``\\boxed{}``; failing that, the content of the last
    ``<answer>...</answer>``; failing that, a final-answer line (``Answer: X``, ``The final answer is
    X``); else None."""
    found = _readings(_text(text))
    return found[0][0] if found else None


_INTEGER = re.compile(r"[+-]?\d+")
_THOUSANDS = re.compile(r"(?<=\d)(?:\\,|\\!|\{,\}|,\\!|\\ )(?=\d{3}(?!\d))")
_DOLLAR = re.compile(r"(?<!\\)\$")


def _normalise(s: str) -> str:
    """Stripped, thousands separators between groups of three digits (``2\\,500``, ``1,\\!000``,
    ``14{,}916``) dropped: math-verify reads ``2\\,500`` as 502."""
    return _THOUSANDS.sub("", s.strip())


def _int_key(s: str) -> tuple[bool, str]:
    digits = s.lstrip("+-").lstrip("0") or "0"
    return s.startswith("-") and digits != "0", digits


def _equivalent(answer: str, label: str, free: bool = False) -> bool:
    """math-verify's equivalence. Two plain integers (the answer of most arithmetic and GSM8K-style
    tasks) are compared exactly, digit by digit, which is math-verify's verdict on them without its
    parse and verify (and without Python's limit on the digits of an int); a test checks they agree.
    Equal texts are equal. ``free``: math-verify finds the answer in ``answer`` as in free text."""
    a, b = _normalise(answer), _normalise(label)
    if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
        return _int_key(a) == _int_key(b)
    if a == b:
        return True
    if not (_tractable(a, MAX_ANSWER_CHARS) and _tractable(b, MAX_LABEL_CHARS)):
        return False
    return _math_verify_equal(a, b, free)


def _timeout() -> Optional[int]:
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_label(label: str, timeout: Optional[int]) -> list:
    """A label parsed once per process: the group's responses share it."""
    return parse(label if _DOLLAR.search(label) or "\\boxed" in label else f"${label}$", parsing_timeout=timeout)


def _math_verify_equal(answer: str, label: str, free: bool = False) -> bool:
    timeout = _timeout()
    try:
        gold = _parse_label(label, timeout)
        pred = parse(answer if free else f"${answer}$", parsing_timeout=timeout)
        if not gold or not pred:
            return False
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001  (math-verify and sympy on a model's text: any failure is a wrong answer)
        return False


_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTER = re.compile(r"[A-Za-z]")
_LITERAL = re.compile(r"\d+(?:\.\d*)?")
_GROWTH = re.compile(r"\^|\*\*|(?<!\\)!(?!=)|\\[dt]?binom|\\choose|\\Gamma|\\prod|\\sum")


def _depth(s: str, opening: str, closing: str) -> int:
    depth = worst = 0
    for ch in s:
        if ch in opening:
            depth += 1
            worst = max(worst, depth)
        elif ch in closing:
            depth -= 1
    return worst


_TOKEN = re.compile(r"\s*(?:[+-]?\d+|\\[A-Za-z]+|.)")


def _group_after(s: str, i: int) -> str:
    """The exponent that starts at ``s[i]``: a braced group, a number, a command or one character."""
    if i < len(s) and s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth == 0:
                return s[i + 1:j]
        return s[i + 1:]
    m = _TOKEN.match(s, i)
    return m.group() if m else ""


def _group_before(s: str, i: int) -> str:
    """What a factorial or power at ``s[i]`` applies to: the number or bracketed group just before it."""
    j = i
    if j > 0 and s[j - 1] in ")}]":
        depth = 0
        for j in range(i - 1, -1, -1):
            depth += {")": 1, "}": 1, "]": 1, "(": -1, "{": -1, "[": -1}.get(s[j], 0)
            if depth == 0:
                return s[j + 1:i - 1]
        return s[:i]
    while j > 0 and (s[j - 1].isdigit() or s[j - 1] == "."):
        j -= 1
    return s[j:i] if j < i else s[i - 1:i]


def _small(part: str, limit: int) -> bool:
    """No variable in ``part``: it is a plain arithmetic of numbers at most ``limit``, with no power,
    factorial or product inside. A variable: anything."""
    if _LETTER.search(_COMMAND.sub("", part)):
        return True
    return not _GROWTH.search(part) and all(float(n) <= limit for n in _LITERAL.findall(part))


def _tractable(s: str, max_chars: int) -> bool:
    """Whether math-verify may evaluate ``s`` in bounded time: short, shallow, and every power,
    factorial, binomial, product or sum in it of small numbers (``2^{1000}``, ``10!``, ``x^{30}``
    are; ``9^{9^{9}}``, ``9**9**9``, ``(10^{9})!``, ``(x+2)^{1000}`` are not)."""
    if len(s) > max_chars or _depth(s, "([", ")]") > MAX_NESTING or _depth(s, "{", "}") > MAX_BRACES:
        return False
    variable = bool(_LETTER.search(_COMMAND.sub("", s)))
    limit, degree = (MAX_SYMBOLIC_POWER if variable else MAX_POWER), 0.0
    for m in _GROWTH.finditer(s):
        op = m.group()
        if op in ("^", "**"):
            exponent = _group_after(s, m.end())
            after = s[m.end() + len(exponent) + (2 if s[m.end():m.end() + 1] == "{" else 0):].lstrip()
            base = _group_before(s, m.start())
            if after.startswith(("^", "**")) or not _small(exponent, limit) or not _small(base, MAX_POWER):
                return False  # a tower (9**9**9, (10!)^{100}), or a power of large numbers
            if variable and _INTEGER.fullmatch(exponent.strip().strip("()")):
                degree += abs(int(exponent.strip().strip("()")))  # polynomial degree: what sympy expands
                if degree > limit:
                    return False
        elif op == "!":
            if not _small(_group_before(s, m.start()), MAX_POWER):
                return False
        elif any(float(n) > MAX_POWER for n in _LITERAL.findall(s)):
            return False
    return True


def _right(response: Optional[str], label: object) -> Optional[bool]:
    """Whether the response's final answer (any of its `_readings`) equals the label; None when it
    marks no answer."""
    found = _readings(_text(response))
    if found is None:
        return None
    gold = _text(label)
    return any(_equivalent(answer, gold, free) for answer, free in found)


def acc(response: str, label: str, **_: object) -> float:
    """Accuracy, MindSpeed-RL's values: 1.0 right, -0.5 answer extracted but wrong, -1.0 nothing extracted.

    The answer is the last ``\\boxed{}`` (braces matched; a run of boxes such as ``\\boxed{1}, \\boxed{2}``
    is also read as the list ``1, 2``), else the last ``<answer>`` tag's content (prose in it read as
    math-verify reads free text), else a final-answer line (``Answer: X``, ``The final answer is X``).
    Equivalence is math-verify's (``\\frac{1}{2}`` equals ``0.5``)."""
    right = _right(response, label)
    return -1.0 if right is None else 1.0 if right else -0.5


def exact(response: str, label: str, **_: object) -> float:
    """Exact match: 1.0 when the last ``\\boxed{}`` holds exactly the label (spaces stripped), else 0.0."""
    answer = extract_boxed(_text(response))
    return 1.0 if answer is not None and answer.replace(" ", "") == _text(label).replace(" ", "") else 0.0


_THINK_THEN_ANSWER = re.compile(r"</think>\s*<answer>")


def _tags(response: str) -> Optional[tuple[str, str]]:
    """(think, answer) when the stripped response is ``<think>THINK</think>`` then ``<answer>ANSWER</answer>``
    (the think part ending at the first ``</think>`` followed by ``<answer>``), else None. Linear."""
    s = response.strip()
    if not (s.startswith("<think>") and s.endswith("</answer>")):
        return None
    m = _THINK_THEN_ANSWER.search(s, len("<think>"), len(s) - len("</answer>"))
    return (s[len("<think>"):m.start()], s[m.end():len(s) - len("</answer>")]) if m else None


def format_rule(response: str, label: str = "", **_: object) -> float:
    """Format: 1.0 when the response is ``<think>...</think>`` then ``<answer>...</answer>``, else 0.0."""
    return 1.0 if _tags(_text(response)) is not None else 0.0


# A line's leading whitespace stops at its end ([^\S\n]*, not \s*): the same markers counted, without
# rescanning a run of blank lines from each of its line starts.
_STEP = re.compile(r"(?im)\bstep\s*\d+\s*[:.)]|^[^\S\n]*(?:\d+\s*[.)]|[-*])\s"
                   r"|\b(?:first|second|third|next|then|finally)\b|第[一二三四五六七八九十\d]+步|首先|其次|然后|最后")


def step(response: str, label: str = "", **_: object) -> float:
    """Reasoning steps: min(1, markers / 3), markers being ``Step N:``, numbered or bulleted lines,
    the words first/second/third/next/then/finally, and 第N步/首先/其次/然后/最后."""
    return min(1.0, len(_STEP.findall(_text(response))) / 3)


def _strict_ok(response: str) -> bool:
    parts = _tags(response)
    if parts is None or [response.count(t) for t in ("<think>", "</think>", "<answer>", "</answer>")] != [1, 1, 1, 1]:
        return False
    think, answer = parts
    return answer.count("\\boxed{") == 1 and len(_boxes(answer)) == 1 and "\\boxed{" not in think


def strict_format(response: str, label: str = "", **_: object) -> float:
    """Strict format: exactly one think, then exactly one answer holding exactly one ``\\boxed{}`` (its braces
    closed), nothing outside the tags: 1.0, else -0.5."""
    return 1.0 if _strict_ok(_text(response)) else -0.5


def base_acc(response: str, label: str, **_: object) -> float:
    """For base models: 1.0 when the strict format holds AND the boxed answer is right, else 0.0."""
    response = _text(response)
    if not _strict_ok(response):
        return 0.0
    answer = extract_boxed(response)
    return 1.0 if answer is not None and _equivalent(answer, _text(label)) else 0.0


_LOGIC = re.compile(r"\b(?:because|therefore|thus|so|since|hence)\b|∴|=", re.IGNORECASE)


def math_graded(response: str, label: str, **_: object) -> float:
    """A graded reward for MATH-style answers: a wrong (or missing) answer scores 0; a right one scores
    0.7 (math-verify equivalence, the answer found as `acc` finds it) + 0.2
    (``<think>..</think><answer>..</answer>`` format) + 0.1 (ordered reasoning: at least two step
    markers, or step markers and logic words)."""
    response = _text(response)
    if not _right(response, label):
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
    ``... #### 72`` answer field), compared exactly as decimals: 1.0, else 0.0."""
    pred = _gsm_number(_text(response))
    gold = _gsm_number(_text(label)) or _text(label).strip().replace(",", "")
    if pred is None:
        return 0.0
    try:
        return 1.0 if Decimal(pred) == Decimal(gold) else 0.0
    except InvalidOperation:
        return 0.0


# Minerva's answer normalisation (Lewkowycz et al. 2022, appendix D; the form in lm-evaluation-harness's
# hendrycks_math and veRL's math_dapo), as data: replacements, then words and marks dropped.
_MINERVA_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_MINERVA_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
                 r",\!", "{,}", '"', "\\dots")
_MINERVA_UNWRAP = [re.compile(rf"\\{cmd}\{{(.*?)\}}") for cmd in ("text", "textbf", "overline")]


def _minerva_normal(answer: str) -> str:
    """Minerva's normal form of a final answer: the part after the last ``=``, spaces, units and
    ``\\text{}`` dropped, the first ``$...$`` kept, ``\\fracab`` as ``\\frac{a}{b}``, ``1,000`` as ``1000``."""
    answer = answer.split("=")[-1]
    for old, new in _MINERVA_REPLACE:
        answer = answer.replace(old, new)
    for word in _MINERVA_DROP:
        answer = answer.replace(word, "")
    first, second = answer.find("$"), -1
    if first != -1 and (second := answer.find("$", first + 1)) != -1:
        answer = f"${answer[first + 1:second]}$"
    for unwrap in _MINERVA_UNWRAP:
        answer = unwrap.sub(r"\1", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", answer).replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
DAPO_TAIL_CHARS = 300


def math_dapo(response: str, label: str, **_: object) -> float:
    """DAPO's reward, veRL's ``math_dapo``: 1.0 when the last ``Answer: X`` in the response's last 300
    characters equals the label after Minerva's normalisation (units, spaces and ``\\text{}`` dropped,
    ``1,000`` read as ``1000``), else -1.0 (a missing answer too). Text equality, as veRL's."""
    found = _DAPO_ANSWER.findall(_text(response)[-DAPO_TAIL_CHARS:])
    if not found:
        return -1.0
    return 1.0 if _minerva_normal(found[-1]) == _minerva_normal(_text(label)[:MAX_ANSWER_CHARS]) else -1.0


RULES: Registry = Registry("reward.verifiers", {
    "acc": acc, "exact": exact, "format": format_rule, "step": step, "strict_format": strict_format,
    "base_acc": base_acc, "math": math_graded, "gsm8k": gsm8k, "math_dapo": math_dapo,
})

# The rules that check the final answer, and the score from which each counts it as right: what
# evaluation calls "right" (val/greedy_acc, pass@k, maj@n), as opposed to the weighted reward.
ANSWER_RULES: dict[str, float] = {"acc": 1.0, "exact": 1.0, "base_acc": 1.0, "gsm8k": 1.0, "math": 0.7,
                                  "math_dapo": 1.0}


def is_correct(response: str, label: str = "", **_: object) -> bool:
    """Held-out accuracy's test, the same as ``acc == 1.0``: the final answer (as `acc` finds it) is
    mathematically equal to the label."""
    return bool(_right(response, label))
