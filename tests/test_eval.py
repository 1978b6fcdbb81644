"""pass@k / maj@n against hand-computed values, and `verirl eval` on the embedded model."""
import itertools
import json
from math import comb

import pytest

from verirl.cli import main
from verirl.evaluate import majority_correct, pass_at_k, sample_metrics


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
    assert m == {"avg@2": 0.5, "pass@1": 0.75, "pass@2": 1.0, "maj@2": 1.0}


def test_verirl_eval_on_the_embedded_model(tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", "--model", "tiny", "--data", "arith", "--n", "4", "--val-size", "40",
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    o = res["overall"]
    assert res["n"] == 4 and o["prompts"] == 40
    assert set(o) == {"prompts", "avg@4", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert 0 <= o["pass@1"] <= o["pass@2"] <= o["pass@4"] <= 1  # more draws never hurt
    assert 0 < o["pass@4"]  # the shipped model gets some right (~20% greedy)
    # acc scores 1 / -0.5 / -1: the mean score is below the fraction right
    assert o["avg@4"] <= o["pass@1"]
    assert set(res["groups"]) == {"task/add", "task/mul"}
    assert sum(g["prompts"] for g in res["groups"].values()) == 40
    table = capsys.readouterr().out
    assert "pass@4" in table and "task/add" in table


def test_verirl_eval_bad_input_is_one_clear_line(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_validation_during_training_logs_val_metrics(tmp_path):
    from pathlib import Path
    config = str(Path(__file__).resolve().parent.parent / "configs" / "tiny_grpo.yaml")
    run = tmp_path / "r"
    assert main(["train", "--config", config, f"trainer.run_dir={run}", "trainer.total_steps=3",
                 "trainer.test_freq=2", "trainer.val_before_train=true", "trainer.val_n=2", "data.val_size=8",
                 "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "reward.workers=0",
                 "trainer.eval_at_start=false", "trainer.eval_at_end=false", "log.progress=false"]) == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert {"val/avg@2", "val/pass@1", "val/pass@2", "val/maj@2", "val/task/add/pass@1"} <= set(rows[0])
    assert "val/pass@1" in rows[2] and "val/pass@1" in rows[3]  # every 2 steps and at the end
    assert "val/pass@1" not in rows[1]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and "val_before_train" in summary
