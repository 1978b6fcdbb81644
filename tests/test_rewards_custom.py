"""Custom rules (file or module, one response or a list), and failures that never stop a run."""
import time
from pathlib import Path

import pytest

from verirl.rewards import Scorer, load_rule

RULES_FILE = str(Path(__file__).parent / "fixtures" / "user_rules.py")


def spec(fn):
    return f"{RULES_FILE}:{fn}"


def test_single_and_list_rules_get_sample_fields_by_name():
    assert not load_rule(spec("length_bonus")).batched
    assert load_rule(spec("per_source")).batched and load_rule(spec("shout")).batched
    samples = [{"label": "7", "task": "bonus", "data_source": "gsm8k"}, {"label": "8", "task": "x", "data_source": "math"}]
    s = Scorer([spec("length_bonus"), spec("per_source"), spec("shout")], [1.0, 2.0, 1.0])
    res = s(["7", "LOUD"], samples)
    assert res.per_rule["length_bonus"] == [pytest.approx(1.1), pytest.approx(0.4)]
    assert res.per_rule["per_source"] == [1.0, 0.0]
    assert res.per_rule["shout"] == [0.0, 1.0]
    assert res.totals == [pytest.approx(1.1 + 2.0), pytest.approx(0.4 + 1.0)]
    assert res.errors == 0


def test_module_spec(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
    assert Scorer(["user_rules:nan_rule"], [1.0])(["ok"], [{"label": "1"}]).totals == [0.5]


def test_bad_specs_are_config_errors():
    from verirl.run.checks import check
    from verirl.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="does not exist"):
        check(load_config(None, ["reward.verifiers=[nope.py:f]", "reward.weights=[1]"]))
    with pytest.raises(ConfigError, match="has no function 'missing'"):
        check(load_config(None, [f"reward.verifiers=[{spec('missing')}]", "reward.weights=[1]"]))
    cfg = load_config(None, [f"reward.verifiers=[acc,{spec('boom')}]", "reward.weights=[1,1]",
                             "reward.tasks={math: [acc, boom]}"])  # routing may use the function's name
    check(cfg)
    assert cfg.reward.tasks["math"] == ["acc", "boom"]


def test_raising_nan_and_wrong_length_score_zero_and_are_counted(capsys):
    s = Scorer([spec("boom"), spec("nan_rule"), spec("wrong_length")], [1.0, 1.0, 1.0], workers=0)
    res = s(["boom", "fine", "nan"], [{"label": "1"}] * 3)
    assert res.per_rule["boom"] == [0.0, 1.0, 1.0]
    assert res.per_rule["nan_rule"] == [0.5, 0.5, 0.0]
    assert res.per_rule["wrong_length"] == [0.0, 0.0, 0.0]
    assert res.errors == 1 + 1 + 3
    err = capsys.readouterr().err
    assert "raised RuntimeError: kaboom on response 'boom'" in err and "returned 2 scores for 3 responses" in err
    s(["boom"], [{"label": "1"}])
    assert "kaboom" not in capsys.readouterr().err  # logged once, then only counted


def test_a_hanging_rule_times_out_and_the_pool_recovers():
    s = Scorer([spec("hang"), "format"], [1.0, 1.0], workers=2, timeout=2.0, chunk=1)
    try:
        t0 = time.monotonic()
        res = s(["ok", "hang", "<think>a</think><answer>b</answer>"], [{"label": "1"}] * 3)
        took = time.monotonic() - t0
        assert took < 15, took  # bounded by the timeout (plus pool start), not by the hang
        assert res.per_rule["hang"] == [1.0, 0.0, 1.0] and res.errors == 1
        assert res.per_rule["format"] == [0.0, 0.0, 1.0]
        assert s.pool.restarts == 1
        again = s(["ok"], [{"label": "1"}])  # a fresh pool serves the next step
        assert again.per_rule["hang"] == [1.0] and again.errors == 0
    finally:
        s.close()


def test_pool_and_in_process_agree(arith):
    from verirl.data.tasks import reference_response
    train, _ = arith
    responses = [reference_response(p) if i % 3 else "<think>x</think><answer>\\boxed{0}</answer>"
                 for i, p in enumerate(train[:40])]
    samples = [{"label": p.label, "task": p.task} for p in train[:40]]
    rules = ["acc", "exact", "format", "math", "step"]
    inproc = Scorer(rules, [1] * 5, workers=0)(responses, samples)
    pooled = Scorer(rules, [1] * 5, workers=2)
    try:
        res = pooled(responses, samples)
    finally:
        pooled.close()
    assert res.per_rule == inproc.per_rule and res.totals == inproc.totals


ABSURD = '''
import math
VALUES = {"huge": 1e300, "str": "1e9", "inf": math.inf, "ninf": -math.inf, "low": -2e6, "bytes": b"1",
          "edge": 1e6, "true": True, "int": 3, "none": None, "big_int": 10 ** 400}
def absurd(response, label):
    return VALUES[response]
'''


def test_non_finite_absurd_and_string_scores_are_errors(tmp_path, capsys):
    path = tmp_path / "absurd.py"
    path.write_text(ABSURD)
    keys = ["huge", "str", "inf", "ninf", "low", "bytes", "edge", "true", "int", "none", "big_int"]
    res = Scorer([f"{path}:absurd"], [1.0], workers=0)(keys, [{"label": "1"}] * len(keys))
    assert dict(zip(keys, res.per_rule["absurd"])) == {
        "huge": 0.0, "str": 0.0, "inf": 0.0, "ninf": 0.0, "low": 0.0, "bytes": 0.0,
        "edge": 1e6, "true": 1.0, "int": 3.0, "none": 0.0, "big_int": 0.0}
    assert res.errors == 8
    err = capsys.readouterr().err
    assert "returned 1e+300, beyond reward.max_abs_score=1e+06" in err and "returned str '1e9', not a number" in err
    tight = Scorer([f"{path}:absurd"], [1.0], workers=0, max_abs_score=2.0)(["true", "int"], [{"label": "1"}] * 2)
    assert tight.per_rule["absurd"] == [1.0, 0.0] and tight.errors == 1
