"""pass@k / maj@n against hand-computed values, and `verirl eval` on the embedded model."""
import itertools
import json
import re
from math import comb

import pytest

from verirl.cli import main
from verirl.train.evaluate import majority_correct, pass_at_k, sample_metrics


@pytest.mark.parametrize("n,c,k,want", [
    (5, 2, 1, 0.4),  # c / n
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (5, 2, 4, 1.0),  # fewer than k wrong: every draw of 4 holds a right one
    (4, 0, 3, 0.0),
    (4, 4, 1, 1.0),
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
])
def test_pass_at_k_hand_values(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_right_answer():
    for n in range(1, 8):
        for c in range(n + 1):
            right = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(right, k))
                assert len(subsets) == comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets), abs=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_correct(["3", "4", "4", None], [False, True, True, False]) == 1.0
    assert majority_correct(["3", "3", "4", None], [False, False, True, False]) == 0.0
    assert majority_correct(["3", "4"], [True, False]) == 1.0  # a tie goes to the answer seen first
    assert majority_correct([None, None], [False, False]) == 0.0
    m = sample_metrics([[1.0, -1.0], [1.0, 1.0]], [[True, False], [True, True]], [["2", "3"], ["5", "5"]], [1, 2])
    assert m == {"reward_mean": 0.5, "pass@1": 0.75, "pass@2": 1.0, "maj@2": 1.0}


def test_verirl_eval_on_the_embedded_model(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", "tiny", "--data", "arith", "--n", "4", "--size", "40",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    o = res["overall"]
    assert res["n"] == 4 and o["prompts"] == 40
    assert set(o) == {"prompts", "greedy_acc", "reward_mean", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert 0 <= o["pass@1"] <= o["pass@2"] <= o["pass@4"] <= 1  # more draws never hurt
    assert 0 < o["pass@4"]  # the shipped model gets some right (~20% greedy)
    # acc scores 1 / -0.5 / -1: the mean score is below the fraction right
    assert o["reward_mean"] <= o["pass@1"]
    assert 0 < o["greedy_acc"] < 1
    assert set(res["groups"]) == {"task/add", "task/mul"}
    assert sum(g["prompts"] for g in res["groups"].values()) == 40
    table = capsys.readouterr().out
    assert "pass@4" in table and "task/add" in table
    assert re.search(r"eval: evaluated 40/40 prompts in \d+s", table)  # progress, also where no spinner shows


def test_verirl_eval_with_and_without_the_calculator(tmp_path):
    """The shipped tiny-tools model calls the calculator (docs/agents.md: ~30% held-out greedy with it at
    the SFT start, 0% without): its products and sums are too large to compute in its head. The call,
    the tool's answer and the reply take ~60 tokens, so --max-new-tokens 112 (the demo's budget)."""
    common = ["eval", "--model", "tiny-tools", "--data", "arith_tools", "--n", "0", "--size", "20",
              "--max-new-tokens", "112"]
    results = {}
    for name, flags in [("with", ["--tools", "calculator", "--max-turns", "2"]), ("without", [])]:
        out = tmp_path / f"{name}.json"
        assert main([*common, *flags, "--json", str(out)]) == 0
        results[name] = json.loads(out.read_text())
    assert results["with"]["tools"] == ["calculator"] and results["without"]["tools"] == []
    with_tools, without = results["with"]["overall"], results["without"]["overall"]
    assert with_tools["prompts"] == without["prompts"] == 20
    assert without["greedy_acc"] == 0.0  # no tool: it cannot multiply 4 digits by 3
    assert with_tools["greedy_acc"] >= 0.15 > without["greedy_acc"], (with_tools, without)  # 0.30 here


def test_verirl_eval_bad_input_is_one_clear_line(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"--data='{tmp_path / 'missing.jsonl'}' does not exist" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flags,train_key", [
    (["--data", "/no/such/file.jsonl"], "eval.data=/no/such/file.jsonl"),
    (["--max-prompt-length", "0"], "data.max_prompt_length=0"),
    (["--top-k", "-2"], "eval.top_k=-2"),
    (["--verifiers", "acc,accc"], "reward.verifiers=[acc,accc]"),
    (["--template", "nosuch", "--data", "/etc/hostname"], "data.prompt_type=nosuch"),
])
def test_eval_runs_the_check_train_runs_and_names_its_flags(flags, train_key, tmp_path, capsys):
    """`verirl eval` checks the config its flags make with `verirl.run.checks.check`: the paragraph
    `verirl plan` gives for the same value, each key named by eval's flag."""
    more = ["eval.data=/etc/hostname"] if train_key.startswith("data.prompt_type") else []
    weights = ["reward.weights=[1,1]"] if train_key.startswith("reward") else []
    assert main(["plan", train_key, *more, *weights]) == 2
    planned = capsys.readouterr().err.split(": ", 2)[2]
    assert main(["eval", *flags]) == 2
    evaluated = capsys.readouterr().err.split(": ", 2)[2]
    flag = flags[-2] if train_key.startswith("data.prompt_type") is False else "--template"
    key = train_key.split("=")[0]
    assert flag in evaluated and key not in evaluated, evaluated
    assert evaluated.replace(flag, key) == planned.replace(" (1 rank)", ""), (planned, evaluated)


def test_eval_writes_no_run_directory_so_checks_none(tmp_path, monkeypatch, capsys):
    """trainer.run_dir (runs/default) would be made inside a file here: a run is refused, an evaluation
    is not (it writes no run directory)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("a file")
    assert main(["plan"]) == 2
    assert "which is a file" in capsys.readouterr().err
    assert main(["eval", "--size", "4", "--n", "0"]) == 0


def test_a_run_directory_as_model_names_its_final_model_or_export(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["eval", "--model", str(run)]) == 2
    err = capsys.readouterr().err
    assert "a training run's directory, not a model, and it has no final model yet" in err
    assert f"verirl export {run} OUT" in err and "make weights" not in err
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    assert main(["eval", "--model", str(run)]) == 2
    assert f"--model {run / 'final'}" in capsys.readouterr().err


def test_right_is_the_tasks_own_answer_check():
    """12.0 for 12: acc (mathematical equality) counts it right, exact (the same string) does not; a
    sample is right by the first answer rule its task is routed to, not by the weighted reward."""
    from verirl.train.evaluate import answer_right
    from verirl.rewards import Scorer

    texts = ["<think>x</think><answer>\\boxed{12.0}</answer>"] * 2 + ["no answer"]
    samples = [{"label": "12", "task": "add"}, {"label": "12", "task": "mul"}, {"label": "3", "task": "other"}]
    scorer = Scorer(["format", "acc", "exact"], [0.1, 1.0, 1.0], {"add": ["acc", "format"], "mul": ["exact", "format"]})
    result = scorer(texts, samples)
    assert result.per_rule["acc"][:2] == [1.0, None] and result.per_rule["exact"][:2] == [None, 0.0]
    assert [answer_right(result, i, t, s["label"]) for i, (t, s) in enumerate(zip(texts, samples))] == \
        [True, False, False]
    only_format = Scorer(["format"], [1.0])(texts[:1], samples[:1])  # no answer rule: acc's test
    assert answer_right(only_format, 0, texts[0], "12") is True


def test_evaluation_during_training_logs_val_metrics(tmp_path):
    run = tmp_path / "r"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=3", "eval.every=2", "eval.n=2",
                 "eval.size=8", "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2",
                 "reward.workers=0", "eval.at_end=false", "log.progress=false"]) == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert {"val/greedy_acc", "val/reward_mean", "val/pass@1", "val/pass@2", "val/maj@2",
            "val/task/add/pass@1", "val/task/mul/greedy_acc"} <= set(rows[0])
    assert "val/pass@1" in rows[2] and "val/pass@1" in rows[3]  # every 2 steps and after the last one
    assert "val/pass@1" not in rows[1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["eval_start"] == {k: v for k, v in rows[0].items() if k != "step"}
    assert "eval_end" not in summary  # eval.at_end=false


def test_verls_evaluation_keys_are_aliases_and_verirls_old_names_are_refused(tmp_path, capsys):
    from verirl.config import ConfigError, load_config

    cfg = load_config("tiny", ["trainer.test_freq=5", "trainer.val_before_train=false"])
    assert (cfg.eval.every, cfg.eval.before_train) == (5, False)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "veRL's name for eval.every" in lines[0] and "eval.before_train" in lines[1]
    yaml = tmp_path / "verl.yaml"
    yaml.write_text("trainer:\n  test_freq: 7\n  total_steps: 3\n")
    assert load_config(str(yaml)).eval.every == 7 and "trainer.test_freq" in capsys.readouterr().err
    for old, new in [("trainer.val_n=3", "eval.n"), ("data.val_size=12", "eval.size"),
                     ("trainer.eval_at_end=false", "eval.at_end")]:
        with pytest.raises(ConfigError, match=rf"Unknown config key '{old.split('=')[0]}'.*Did you mean: {new}\?"):
            load_config("tiny", [old])
