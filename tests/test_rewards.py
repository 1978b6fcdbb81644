import pytest

from verirl.rewards import RULES, extract_boxed, score_batch


@pytest.mark.parametrize("text,expected", [
    ("\\boxed{42}", "42"),
    ("a \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one, nested braces
    ("\\boxed{{a}{b}}", "{a}{b}"),
    ("no box", None),
    ("\\boxed{7} and \\boxed{unclosed", "7"),
    ("", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("response,label,score", [
    ("<think>2+2=4</think><answer>\\boxed{4}</answer>", "4", 1.0),
    ("<think>x</think><answer>\\boxed{0.5}</answer>", "\\frac{1}{2}", 1.0),  # math-verify equivalence
    ("<think>x</think><answer>\\boxed{5}</answer>", "4", -0.5),  # extracted, wrong
    ("<think>x</think><answer>4</answer>", "4", 1.0),  # no \\boxed: falls back to the <answer> tag
    ("<think>the answer is 4</think>", "4", -1.0),  # nothing extracted
    ("答案是 \\boxed{12}", "12", 1.0),
])
def test_acc(response, label, score):
    assert RULES["acc"](response, label) == score


@pytest.mark.parametrize("response,score", [
    ("<think>a</think><answer>b</answer>", 1.0),
    ("  <think>a</think>\n<answer>b</answer>\n", 1.0),
    ("<answer>b</answer><think>a</think>", 0.0),
    ("<think>a</think>", 0.0),
    ("extra <think>a</think><answer>b</answer>", 0.0),
    ("", 0.0),
])
def test_format(response, score):
    assert RULES["format"](response, "") == score


def test_exact_is_stricter_than_acc():
    assert RULES["exact"]("\\boxed{602}", "602") == 1.0
    assert RULES["exact"]("\\boxed{602.0}", "602") == 0.0
    assert RULES["acc"]("\\boxed{602.0}", "602") == 1.0


def test_task_routing_and_means_over_matching_samples_only():
    responses = ["<think>a</think><answer>\\boxed{3}</answer>", "<think>a</think><answer>\\boxed{9}</answer>",
                 "\\boxed{6}"]
    labels, tasks = ["3", "3", "6"], ["add", "add", "mul"]
    res = score_batch(responses, labels, tasks, ["acc", "exact", "format"], [1.0, 2.0, 0.5],
                      {"add": ["acc", "format"], "mul": ["exact"]})
    assert res.per_rule["acc"] == [1.0, -0.5, None]
    assert res.per_rule["exact"] == [None, None, 1.0]
    assert res.totals == pytest.approx([1.0 + 0.5, -0.5 + 0.5, 2.0])
    m = res.metrics(tasks)
    assert m["reward/acc/mean"] == pytest.approx(0.25)  # over the two add samples, not three
    assert m["reward/exact/mean"] == 1.0  # over the one mul sample
    assert m["reward/task/add/mean"] == pytest.approx(0.75)
    # a batch with no mul sample says nothing about exact, rather than a zero
    m2 = score_batch(responses[:2], labels[:2], tasks[:2], ["acc", "exact", "format"], [1.0, 2.0, 0.5],
                     {"add": ["acc", "format"], "mul": ["exact"]}).metrics(tasks[:2])
    assert "reward/exact/mean" not in m2 and "reward/task/mul/mean" not in m2


GOOD = "<think>Step 1: 48 / 2 = 24. Step 2: 48 + 24 = 72.</think><answer>\\boxed{72}</answer>"


@pytest.mark.parametrize("rule,response,label,score", [
    # step: min(1, markers / 3)
    ("step", GOOD, "", 2 / 3),
    ("step", "1. add\n2. carry\n3. done", "", 1.0),
    ("step", "First, halve. Then add. Finally box.", "", 1.0),
    ("step", "首先，求一半；然后相加。", "", 2 / 3),
    ("step", "just 72", "", 0.0),
    ("step", "", "", 0.0),
    # strict_format: one think, one answer with one boxed, in order, nothing outside
    ("strict_format", GOOD, "", 1.0),
    ("strict_format", "hi " + GOOD, "", -0.5),
    ("strict_format", "<think>a</think><answer>\\boxed{1} \\boxed{2}</answer>", "", -0.5),
    ("strict_format", "<think>a</think><think>b</think><answer>\\boxed{1}</answer>", "", -0.5),
    ("strict_format", "<answer>\\boxed{1}</answer><think>a</think>", "", -0.5),
    ("strict_format", "<think>a</think><answer>1</answer>", "", -0.5),
    # base_acc: strict structure AND right
    ("base_acc", GOOD, "72", 1.0),
    ("base_acc", GOOD, "71", 0.0),
    ("base_acc", "x " + GOOD, "72", 0.0),
    # math (graded): wrong 0; right 0.7 + format 0.2 + steps 0.1
    ("math", GOOD, "72", 1.0),
    ("math", GOOD, "73", 0.0),
    ("math", "<think>72</think><answer>\\boxed{72}</answer>", "72", 0.9),
    ("math", "The answer is \\boxed{72}", "72", 0.7),
    ("math", "Step 1: half is 24. Step 2: sum. \\boxed{72}", "72", 0.8),
    ("math", "<think>Step 1: x</think><answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", 0.9),  # one step, no logic word
    ("math", "<think>Step 1: x = 1/2 because y</think><answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", 1.0),
    ("math", "", "72", 0.0),
    # gsm8k: the number after ####
    ("gsm8k", "48/2=24, 48+24=72\n#### 72", "72", 1.0),
    ("gsm8k", "#### 1,234", "Natalia ... #### 1234", 1.0),
    ("gsm8k", "#### 72.0", "72", 1.0),
    ("gsm8k", "#### 71\n#### 72", "72", 1.0),  # the last one
    ("gsm8k", "72", "72", 0.0),
    ("gsm8k", "#### -5", "-5", 1.0),
    # acc corner cases
    ("acc", "\\boxed{\\frac{3}{4}} and later \\boxed{0.75}", "\\frac{3}{4}", 1.0),
    ("acc", "<think>\\boxed{1}</think><answer>\\boxed{2}</answer>", "2", 1.0),  # the last boxed
    ("acc", "", "2", -1.0),
])
def test_rule_table(rule, response, label, score):
    assert RULES[rule](response, label) == pytest.approx(score)


@pytest.mark.parametrize("response", ["<answer>4</answer>", "\\boxed{4}", "x", "\\boxed{5}", "<answer>\\boxed{4}</answer>"])
def test_held_out_accuracy_agrees_with_acc(response):
    from verirl.rewards import is_correct
    assert is_correct(response, "4") == (RULES["acc"](response, "4") == 1.0)


def test_integer_shortcut_agrees_with_math_verify():
    """Plain integers skip math-verify; its verdict on them must be the same."""
    import random

    from verirl.rewards.rules import _equivalent, _math_verify_equal

    rng = random.Random(0)
    pairs = [("38", "38"), ("038", "38"), ("-0", "0"), ("+5", "5"), ("-7", "7"), (" 12 ", "12"), ("12", "-12"),
             ("1000000000000000000001", "1000000000000000000000"), ("007", "7"), ("0", "00")]
    for _ in range(40):
        a = rng.randint(-200, 200)
        pairs.append((str(a), str(a + rng.choice([0, 0, 1, -1, 10]))))
    for answer, label in pairs:
        assert _equivalent(answer, label) == _math_verify_equal(answer, label), (answer, label)
    assert _equivalent("3", "3") and not _equivalent("3", "4")
    assert _equivalent("0.5", "\\frac{1}{2}")  # not integers: math-verify decides
