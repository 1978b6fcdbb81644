"""Built-in tasks, generated deterministically from a seed (nothing to download).

``arith``: two tasks with different verifiers by default:
  * ``add``: a + b with a, b in [10, 99]          (8,100 distinct problems; checked by ``acc``)
  * ``mul``: a * b with a in [2, 9], b in [10, 99] (720 distinct problems; checked by ``exact``)
Each is phrased as a short word problem or a bare expression, R1 style: the model is asked
to reason in ``<think></think>`` and answer in ``<answer>\\boxed{}</answer>``.
The held-out split is drawn first and never appears in training or in SFT.

``arith_tools``: numbers too large to compute in one's head, for multi-turn episodes with a calculator
(``mul``: a 4-digit times a 3-digit number; ``add``: two 5-digit numbers; both checked by ``acc``). The
prompt asks for the calculator; ``reference_turns`` is the worked episode (call, result, answer).
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




# ----------------------------------------------------------------------------- arith_tools
# Problems a 1M-parameter model cannot compute in its head but can solve with a calculator: the
# multiplication of a 4-digit by a 3-digit number (``mul``) and the sum of two 5-digit numbers (``add``),
# scored by ``acc``. The model of this task, ``tiny-tools`` (docs/tiny-model.md), answers in two turns:
# a ``calculator`` call, then the boxed result it read back.

TOOLS_INSTRUCTION = "Use the calculator, then reply <answer>\\boxed{}</answer>."
_MUL_TOOLS = ["{a} * {b} = ?", "{a} boxes hold {b} pens each. How many pens?",
              "What is {a} times {b}?"]
_ADD_TOOLS = ["{a} + {b} = ?", "A farm has {a} hens and {b} ducks. How many birds?",
              "What is {a} plus {b}?"]
TOOLS_RESERVE = 1000  # the held-out split is a prefix of this many problems, none of them ever trained on


def _tools_problem(task: str, a: int, b: int, phrasing: int) -> Prompt:
    q = (_MUL_TOOLS if task == "mul" else _ADD_TOOLS)[phrasing].format(a=a, b=b)
    ans = a * b if task == "mul" else a + b
    op = "*" if task == "mul" else "+"
    return Prompt(messages=[{"role": "user", "content": f"{q} {TOOLS_INSTRUCTION}"}], label=str(ans), task=task,
                  extra={"a": a, "b": b, "expression": f"{a}{op}{b}"})


def _tools_draw(rng: random.Random, i: int) -> tuple[str, int, int, int]:
    task = "mul" if i % 2 == 0 else "add"
    if task == "mul":
        a, b = rng.randint(1000, 9999), rng.randint(100, 999)
    else:
        a, b = rng.randint(10000, 99999), rng.randint(10000, 99999)
    return task, a, b, rng.randrange(3)


def arith_tools_split(seed: int, train_size: int, val_size: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, val) of ``arith_tools``, tasks alternating (mul, add, ...). The held-out problems are drawn
    first, as the first ``val_size`` of a reserve of max(val_size, `TOOLS_RESERVE`) distinct problems; the
    training problems are drawn after it and never hold a reserved pair. So a larger or smaller held-out
    split (GRPO's eval.size against SFT's val_size) never meets a training problem, up to the reserve."""
    rng = random.Random(seed)
    reserve, seen = [], set()
    while len(reserve) < max(val_size, TOOLS_RESERVE):
        task, a, b, phrasing = _tools_draw(rng, len(reserve))
        if (task, a, b) not in seen:
            seen.add((task, a, b))
            reserve.append(_tools_problem(task, a, b, phrasing))
    train = []
    while len(train) < train_size:
        task, a, b, phrasing = _tools_draw(rng, len(train))
        if (task, a, b) not in seen:
            train.append(_tools_problem(task, a, b, phrasing))
    return train, reserve[:val_size]


def tool_call_text(name: str, arguments: dict) -> str:
    """A Hermes tool call, as the ``hermes`` parser reads it: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def reference_turns(p: Prompt) -> list[dict]:
    """The worked episode of an ``arith_tools`` problem, as the messages after the prompt: the calculator
    call, the tool's result, the boxed answer (SFT traces; `verirl.train.sft`)."""
    return [{"role": "assistant", "content": tool_call_text("calculator", {"expression": p.extra["expression"]})},
            {"role": "tool", "name": "calculator", "content": p.label},
            {"role": "assistant", "content": f"<answer>\\boxed{{{p.label}}}</answer>"}]


TASKS = Registry("data.task", {"arith": arith_split, "arith_tools": arith_tools_split})
# tasks answered in episodes with tools: the task -> its worked episode (the messages after the prompt)
EPISODES = {"arith_tools": reference_turns}
