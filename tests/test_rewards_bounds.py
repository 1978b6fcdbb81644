"""Every built-in rule finishes in bounded time on any response, never raises, and leaves no process
behind; evaluation's own answer work runs under the scoring pool's deadline."""
import sys
import threading
import time
from pathlib import Path

from verirl.rewards import RULES, Scorer
from verirl.rewards.pool import _children

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "answers"))
from adversarial import CASES  # noqa: E402

USER_RULES = Path(__file__).parent / "fixtures" / "user_rules.py"
DEADLINE_S = 60.0  # per rule over the whole file: a hang exceeds it, a slow machine does not


def test_every_rule_is_bounded_outside_a_main_thread():
    """In a thread math-verify's own timeout is off: the bounds on what reaches it must hold alone."""
    scores: dict[str, list] = {}

    def run(name, rule):
        scores[name] = [rule(response, label) for _, response, label in CASES]

    for name, rule in RULES.items():
        t = threading.Thread(target=run, args=(name, rule), daemon=True)
        t0 = time.monotonic()
        t.start()
        t.join(DEADLINE_S)
        assert not t.is_alive(), f"rule {name} still running after {DEADLINE_S:.0f} s"
        assert name in scores, f"rule {name} raised (see the thread's traceback above)"
        assert all(isinstance(s, float) for s in scores[name]), (name, scores[name])
        assert time.monotonic() - t0 < DEADLINE_S


def test_every_rule_in_the_pool_scores_every_adversarial_response_and_leaves_no_process():
    names = list(RULES)
    s = Scorer(names, [1.0] * len(names), workers=2, timeout=DEADLINE_S, chunk=4)
    try:
        responses = [r for _, r, _ in CASES]
        samples = [{"label": label, "task": "math"} for _, _, label in CASES]
        res = s(responses, samples)
        assert res.errors == 0
        assert all(all(isinstance(v, float) for v in res.per_rule[n]) for n in names)
        for pid in s.pool.worker_pids():
            assert _children(pid) == []
    finally:
        s.close()


def test_evaluation_helpers_run_under_the_pools_deadline():
    """`Scorer.apply` is how evaluation extracts answers (maj@n) and runs acc's check: in the pool,
    each call under reward.timeout, a call past it None and the rest still served."""
    s = Scorer(["format"], [1.0], workers=1, timeout=1.0, chunk=1)
    try:
        t0 = time.monotonic()
        texts = ["\\boxed{3}", "hang", "<answer>4</answer>"]
        samples = [{"label": "3", "task": "t"}] * 3
        answers, hung, checked = s.apply([("verirl.rewards.rules:extract_answer", [0, 2]),
                                          (f"{USER_RULES}:hang", [1]),
                                          ("verirl.rewards.rules:is_correct", [0, 2])], texts, samples)
        assert time.monotonic() - t0 < 30
        assert answers == ["3", "4"] and hung == [None] and checked == [True, False]
    finally:
        s.close()


def test_the_linear_forms_judge_as_the_backtracking_patterns_did():
    """`format`, `strict_format` and `step` on random short texts agree with the patterns they replace
    (quadratic on long inputs, exact on short ones)."""
    import random
    import re

    fmt = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
    strict = re.compile(r"^\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*$", re.DOTALL)
    steps = re.compile(r"(?im)\bstep\s*\d+\s*[:.)]|^\s*(?:\d+\s*[.)]|[-*])\s|\b(?:first|second|third|next|then|finally)\b"
                       r"|第[一二三四五六七八九十\d]+步|首先|其次|然后|最后")

    def old_strict(r):
        m = strict.match(r)
        return bool(m) and [r.count(t) for t in ("<think>", "</think>", "<answer>", "</answer>")] == [1, 1, 1, 1] \
            and m.group("answer").count("\\boxed{") == 1 and "\\boxed{" not in m.group("think")

    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "\\boxed{1}", " ", "\n", "\r", "\t", "x", "1", ".",
              "-", "step", "first", ")"]
    for _ in range(3000):
        r = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert RULES["format"](r) == (1.0 if fmt.match(r) else 0.0), r
        assert RULES["step"](r) == min(1.0, len(steps.findall(r)) / 3), r
        assert (RULES["strict_format"](r) == 1.0) == old_strict(r), r
