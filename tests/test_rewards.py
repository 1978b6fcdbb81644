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
    ("<think>x</think><answer>4</answer>", "4", -1.0),  # nothing extracted
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
