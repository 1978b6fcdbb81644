"""verirl's answer rules against the peers' verdicts on their own public cases (docs/rewards.md).

    PYTHONPATH=src .venv/bin/python tests/scripts/answer_agreement.py \
        --math-verify /work/.mirror/huggingface+Math-Verify/repo \
        --verl /work/.mirror/volcengine+verl/repo \
        --gsm8k /work/.mirror/openai+grade-school-math/repo [--show N]

Each path is a checkout or a bare git directory (read at HEAD). The sources and what "agree" means:

- math-verify ``tests/*.py``: every ``(gold, pred, expected)`` case of a ``parametrize`` list whose
  names start with gold/pred. verirl's verdict is ``acc(pred, gold) == 1.0``, the pred inside
  ``<answer>...</answer>`` where it has no ``\\boxed`` (verirl reads only a marked answer).
- veRL ``verl/utils/reward_score``: ``gsm8k.compute_score`` on GSM8K's reference solutions
  (``#### N``) and ``math_dapo.compute_score`` on the same solutions ending ``Answer: N``, each against
  the right label and a wrong one (N + 1); verirl's ``gsm8k`` rule and its ``math_dapo`` rule (``acc``
  where verirl has none). Minerva's ``The final answer is $N$. I hope it is correct.`` line against the
  same two labels, where the right verdict is known by construction; verirl's ``acc``.
- OpenAI's GSM8K model solutions (``example_model_solutions.jsonl``): each of the four models'
  solutions, its ``A: N`` line written as GSM8K's ``#### N``, against the number of the reference
  solution; verirl's ``gsm8k`` rule against the file's ``is_correct``.

The peers' scoring code is run from the given snapshot (it is a measurement, not a test).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import types
from typing import Callable, Iterator

from verirl.rewards import RULES

Case = tuple[str, str, str, bool]  # (source, response, label, the peer's verdict)


def read(root: str, path: str) -> str:
    if os.path.exists(os.path.join(root, path)):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            return f.read()
    return subprocess.run(["git", "--git-dir", root, "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def listing(root: str, under: str) -> list[str]:
    if os.path.isdir(os.path.join(root, under)):
        return sorted(os.path.join(under, f) for f in os.listdir(os.path.join(root, under)))
    out = subprocess.run(["git", "--git-dir", root, "ls-tree", "--name-only", "HEAD", f"{under}/"], check=True,
                         capture_output=True, text=True).stdout
    return sorted(out.split())


def module_from(root: str, path: str, name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(read(root, path), path, "exec"), mod.__dict__)  # noqa: S102  (a peer's scoring code)
    return mod


def math_verify_cases(root: str) -> Iterator[Case]:
    for path in listing(root, "tests"):
        if not path.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(read(root, path))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize"):
                continue
            names = ast.literal_eval(node.args[0])
            names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
            if names[:2] != ["gold", "pred"] or names[2] not in ("expected", "result"):
                continue
            for elt in node.args[1].elts:
                try:
                    row = ast.literal_eval(elt)
                except ValueError:
                    continue
                if isinstance(row, tuple) and len(row) >= 3 and isinstance(row[0], str) and isinstance(row[1], str):
                    pred = row[1] if "\\boxed" in row[1] else f"<answer>{row[1]}</answer>"
                    yield f"math-verify {os.path.basename(path)}", pred, row[0], bool(row[2])


def gsm8k_references(root: str) -> list[tuple[str, str]]:
    """(solution text without its final line, the answer) for GSM8K's test set."""
    out = []
    for line in read(root, "grade_school_math/data/test.jsonl").splitlines():
        answer = json.loads(line)["answer"]
        body, _, number = answer.rpartition("####")
        out.append((body.rstrip(), number.strip().replace(",", "")))
    return out


def verl_cases(verl: str, gsm: str) -> Iterator[Case]:
    gsm8k = module_from(verl, "verl/utils/reward_score/gsm8k.py", "verl_gsm8k")
    dapo = module_from(verl, "verl/utils/reward_score/math_dapo.py", "verl_math_dapo")
    for body, n in gsm8k_references(gsm):
        for label in (n, str(int(n) + 1)):
            resp = f"{body}\n#### {n}"
            yield "veRL gsm8k", resp, label, gsm8k.compute_score(resp, label) == 1.0
            resp = f"{body}\nAnswer: {n}"
            yield "veRL math_dapo", resp, label, dapo.compute_score(resp, label)["score"] == 1.0
            resp = f"{body}\nThe final answer is ${n}$. I hope it is correct."
            yield "Minerva final answer", resp, label, label == n


def openai_cases(root: str) -> Iterator[Case]:
    for line in read(root, "grade_school_math/data/example_model_solutions.jsonl").splitlines():
        row = json.loads(line)
        gold = row["ground_truth"].rpartition("A:")[2].strip()
        for model in ("6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"):
            body, sep, ans = row[model]["solution"].rpartition("A:")
            resp = f"{body}#### {ans.strip()}" if sep else row[model]["solution"]
            yield f"OpenAI GSM8K {model}", resp, gold, bool(row[model]["is_correct"])


def verirl_verdict(source: str) -> tuple[str, Callable[[str, str], bool]]:
    if "gsm8k" in source.lower() and "Minerva" not in source:
        name = "gsm8k"
    elif source == "veRL math_dapo" and "math_dapo" in RULES:
        name = "math_dapo"
    else:
        name = "acc"
    fn = RULES[name]
    return name, lambda resp, label: fn(resp, label) == 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--math-verify", required=True)
    ap.add_argument("--verl", required=True)
    ap.add_argument("--gsm8k", required=True, help="openai/grade-school-math")
    ap.add_argument("--show", type=int, default=0, help="print up to N differing cases per source")
    args = ap.parse_args()
    cases = [*math_verify_cases(args.math_verify), *verl_cases(args.verl, args.gsm8k), *openai_cases(args.gsm8k)]
    by_source: dict[str, list[int]] = {}
    shown: dict[str, int] = {}
    for source, resp, label, peer in cases:
        name, verdict = verirl_verdict(source)
        try:
            ours = verdict(resp, label)
        except Exception as e:  # noqa: BLE001  (a rule that raises is a disagreement, and is shown)
            ours = f"raised {type(e).__name__}"
        tally = by_source.setdefault(f"{source} [{name}]", [0, 0])
        tally[1] += 1
        if ours == peer:
            tally[0] += 1
        elif shown.get(source, 0) < args.show:
            shown[source] = shown.get(source, 0) + 1
            print(f"  differs ({source}): label {label[:80]!r} response {resp[-160:]!r}: peer {peer}, verirl {ours}")
    total = [sum(t[0] for t in by_source.values()), sum(t[1] for t in by_source.values())]
    for source, (agree, n) in by_source.items():
        print(f"{source:55} {agree:>6,} / {n:>6,} agree")
    print(f"{'all':55} {total[0]:>6,} / {total[1]:>6,} agree")
    sys.exit(0)


if __name__ == "__main__":
    main()
