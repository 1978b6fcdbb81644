"""Built-in tasks, generated deterministically from a seed (nothing to download).

``arith``: two tasks with different verifiers by default:
  * ``add``: a + b with a, b in [10, 99]          (8,100 distinct problems; checked by ``acc``)
  * ``mul``: a * b with a in [2, 9], b in [10, 99] (720 distinct problems; checked by ``exact``)
Each is phrased as a short word problem or a bare expression, R1 style: the model is asked
to reason in ``<think></think>`` and answer in ``<answer>\\boxed{}</answer>``.
The held-out split is drawn first and never appears in training or in SFT.
"""
from __future__ import annotations

import random

from verirl.core.registry import Registry
from verirl.core.types import Prompt

INSTRUCTION = "Reply <think> </think> <answer> \\boxed{} </answer>."

_ADD = ["{a} + {b} = ?", "Tom has {a} apples and gets {b} more. How many now?",
        "Shelves hold {a} and {b} books. How many books?"]
_MUL = ["{a} * {b} = ?", "{a} boxes hold {b} pens each. How many pens?",
        "A bus has {b} seats. How many seats in {a} buses?"]


def _problem(task: str, a: int, b: int, phrasing: int) -> Prompt:
    if task == "add":
        q, ans = _ADD[phrasing].format(a=a, b=b), a + b
    else:
        q, ans = _MUL[phrasing].format(a=a, b=b), a * b
    return Prompt(messages=[{"role": "user", "content": f"{q} {INSTRUCTION}"}], label=str(ans), task=task,
                  extra={"a": a, "b": b})


def reference_response(p: Prompt) -> str:
    """The worked answer used for SFT: the equation in <think>, the result boxed in <answer>."""
    op = "+" if p.task == "add" else "*"
    return f"<think>{p.extra['a']}{op}{p.extra['b']}={p.label}</think><answer>\\boxed{{{p.label}}}</answer>"


def arith_split(seed: int, train_size: int, val_size: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, val): val has val_size distinct problems, half add and half mul; train draws
    train_size problems (tasks alternating, phrasings random) from the rest."""
    rng = random.Random(seed)
    pools = {"add": [(a, b) for a in range(10, 100) for b in range(10, 100)],
             "mul": [(a, b) for a in range(2, 10) for b in range(10, 100)]}
    for pool in pools.values():
        rng.shuffle(pool)
    val_add = val_size - val_size // 2
    val = [_problem("add", a, b, rng.randrange(3)) for a, b in pools["add"][:val_add]]
    val += [_problem("mul", a, b, rng.randrange(3)) for a, b in pools["mul"][:val_size // 2]]
    rest = {"add": pools["add"][val_add:], "mul": pools["mul"][val_size // 2:]}
    train = []
    for i in range(train_size):
        task = "add" if i % 2 == 0 else "mul"
        a, b = rng.choice(rest[task])
        train.append(_problem(task, a, b, rng.randrange(3)))
    return train, val


TASKS = Registry("data.task", {"arith": arith_split})
