"""Responses scored per second for `acc` and `math`: verirl's process pool (2 workers on this
2-core machine) against scoring in one process, same responses, same process run. With
``--adversarial``: each built-in rule's time per call on each response of
tests/fixtures/answers/adversarial.py (one response a call, the label not yet parsed, in this
process's main thread as in a scoring worker), the slowest and the mean.

    .venv/bin/python bench/score_rate.py --n 4000
    .venv/bin/python bench/score_rate.py --adversarial
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from verirl.rewards import RULES, Scorer


def make(n: int) -> tuple[list[str], list[dict]]:
    rng = random.Random(0)
    responses, samples = [], []
    for i in range(n):
        a, b = rng.randint(1, 99), rng.randint(2, 99)
        label = f"\\frac{{{a}}}{{{b}}}"
        kind = i % 4
        if kind == 0:
            ans = label
        elif kind == 1:
            ans = f"{a / b:.6f}"  # equal as a decimal: math-verify's work
        elif kind == 2:
            ans = f"\\frac{{{a + 1}}}{{{b}}}"
        else:
            ans = f"{a}/{b} + 0"
        steps = " ".join(f"Step {k}: we simplify {a}*{k}/{b}." for k in range(1, rng.randint(2, 6)))
        responses.append(f"<think>{steps} Therefore the result follows.</think><answer>\\boxed{{{ans}}}</answer>")
        samples.append({"label": label, "task": "math"})
    return responses, samples


def adversarial(repeats: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "answers"))
    from adversarial import CASES

    from verirl.rewards.rules import _parse_label

    for rule in RULES.values():  # warm imports and caches outside the timing
        rule("\\boxed{\\frac{1}{2}}", "0.5")
    print(f"{len(CASES)} adversarial responses, best of {repeats} per call, seconds")
    print(f"{'rule':>14} {'slowest':>8} {'mean':>8}  slowest on")
    for name, rule in RULES.items():
        times = []
        for case, response, label in CASES:
            best = float("inf")
            for _ in range(repeats):
                _parse_label.cache_clear()  # a label's first call parses it: count that
                t0 = time.perf_counter()
                rule(response, label)
                best = min(best, time.perf_counter() - t0)
            times.append((best, case))
        worst = max(times)
        print(f"{name:>14} {worst[0]:>8.4f} {sum(t for t, _ in times) / len(times):>8.4f}  {worst[1]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--adversarial", action="store_true", help="per-call times on adversarial responses")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.adversarial:
        adversarial(args.repeats)
        return
    responses, samples = make(args.n)
    print(f"{args.n} responses (fractions, decimals, wrong answers), pool of {args.workers}")
    print(f"{'rule':>6} {'1 process /s':>13} {'pool /s':>9} {'ratio':>6}")
    for rule in ("acc", "math"):
        single = Scorer([rule], [1.0], workers=0)
        single(responses[:50], samples[:50])  # warm imports
        t0 = time.perf_counter()
        a = single(responses, samples)
        t_single = time.perf_counter() - t0
        pooled = Scorer([rule], [1.0], workers=args.workers, timeout=60, chunk=64)
        pooled(responses[:50], samples[:50])  # start the pool outside the timing
        t0 = time.perf_counter()
        b = pooled(responses, samples)
        t_pool = time.perf_counter() - t0
        pooled.close()
        assert a.totals == b.totals
        print(f"{rule:>6} {args.n / t_single:>13,.0f} {args.n / t_pool:>9,.0f} {t_single / t_pool:>6.2f}")


if __name__ == "__main__":
    main()
