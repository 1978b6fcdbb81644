"""`verirl compare-runs`: real tiny runs judged against seed 000's tolerance, foreign metric files
(veRL's file and console loggers, a JSONL with its own step key), the figure, and the errors.

Three 20-step runs of the tiny recipe are shared by the module (about 7 s of CPU each): two with the
same seed, and one with 10x the learning rate (actor.lr=7e-4 against the recipe's 7e-5)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from verirl.tools.align.compare_runs import Tolerance, compare_curves, load_run, moving_average, tail_count
from verirl.cli import main

STEPS = 20
FAST = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=8", "eval.before_train=false",
        "eval.at_end=false", "log.progress=false", "log.console_every=0", "reward.workers=0",
        "trainer.save_freq=0", "trainer.threads=1", "data.train_size=200"]  # 80 prompts used


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare_runs")
    out = {}
    for name, extra in [("a", []), ("b", []), ("lr10", ["actor.lr=7e-4"])]:
        out[name] = root / name
        assert main(["train", f"trainer.run_dir={out[name]}", f"trainer.total_steps={STEPS}", *FAST, *extra]) == 0
    return out


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _compare(capsys, *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["compare-runs", *map(str, argv), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _error(capsys, *argv: str) -> str:
    """Runs a command that must fail as a user error: exit 2, one paragraph on stderr."""
    capsys.readouterr()
    assert main(["compare-runs", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("verirl compare-runs: error: ") and "\n" not in err, err
    return err


# --- the maths, by hand -----------------------------------------------------------------------

def test_moving_average_and_tail():
    assert moving_average([1.0, 2.0, 3.0, 4.0, 5.0], 3) == [1.0, 1.5, 2.0, 3.0, 4.0]
    assert moving_average([1.0, 2.0], 1) == [1.0, 2.0]
    assert [tail_count(n, 0.1) for n in (1, 9, 10, 11, 30, 500)] == [1, 1, 1, 2, 3, 50]
    assert tail_count(4, 1.0) == 4


def test_compare_curves_by_hand():
    a = {1: 0.0, 2: 0.2, 3: 0.4, 4: 0.6}
    b = {0: 9.0, 1: 0.0, 2: 0.3, 3: 0.45, 4: 0.55, 5: 9.0}  # steps 0 and 5 are not in A: not compared
    r, c = compare_curves("m", a, b, Tolerance(tol=0.1, final_tol=0.05))
    assert c.steps == [1, 2, 3, 4] and r.steps == 4 and (r.first_step, r.last_step) == (1, 4)
    assert r.max_diff == pytest.approx(0.1) and r.max_diff_step == 2  # raw |diff|: 0, .1, .05, .05
    assert r.final_steps == 1 and r.final_a == 0.6 and r.final_b == 0.55  # the last 10% of 4 steps: 1 step
    assert r.curve_ok and r.final_ok and r.passed  # a difference equal to the tolerance passes
    # smoothed over 2 steps: A 0, .1, .3, .5; B 0, .15, .375, .5 -> |diff| 0, .05, .075, 0
    r, _ = compare_curves("m", a, b, Tolerance(tol=0.07, final_tol=0.05, smooth=2))
    assert r.max_diff == pytest.approx(0.075) and r.max_diff_step == 3 and not r.curve_ok and r.final_ok
    assert r.final_diff == pytest.approx(0.05)  # the converged values are means of raw values
    # relative: the full scale is the largest |value| of either smoothed curve (0.6), so 0.1 -> 0.06
    r, _ = compare_curves("m", a, b, Tolerance(tol=0.1, final_tol=0.1, relative=True))
    assert r.scale == pytest.approx(0.6) and r.tol == pytest.approx(0.06) and r.final_tol == pytest.approx(0.06)
    assert not r.curve_ok and r.final_ok


# --- real runs --------------------------------------------------------------------------------

def test_two_runs_with_the_same_seed_pass(runs, capsys):
    rc, out = _compare(capsys, runs["a"], runs["b"])
    assert rc == 0 and out["verdict"] == "PASS"
    [m] = out["metrics"]
    assert m["metric"] == "reward/mean" and m["steps"] == STEPS and (m["first_step"], m["last_step"]) == (1, STEPS)
    assert m["max_diff"] == 0.0 and m["final_diff"] == 0.0 and m["final_steps"] == 2
    assert out["runs"]["A"]["source"] == "verirl run directory" and out["runs"]["A"]["step_key"] == "step"
    assert out["tolerance"]["mode"] == "absolute" and out["tolerance"]["tol"] == 0.04
    # the table: one row per metric and the overall line
    assert main(["compare-runs", str(runs["a"]), str(runs["b"]), "--metric", "reward/mean,response_length/mean"]) == 0
    text = capsys.readouterr().out
    assert "reward/mean" in text and "response_length/mean" in text and "PASS: B matches A" in text


def test_ten_times_the_learning_rate_fails_on_reward(runs, capsys):
    a, fast = _rows(runs["a"]), _rows(runs["lr10"])
    assert a[0]["reward/mean"] == fast[0]["reward/mean"]  # same seed: the first rollout is the same ...
    rc, out = _compare(capsys, runs["a"], runs["lr10"])  # ... and the updates take the runs apart
    assert rc == 1 and out["verdict"] == "FAIL"
    [m] = out["metrics"]
    assert not m["passed"] and not m["curve_ok"] and not m["final_ok"]
    # not sampling noise: smoothed over 10 steps, over the last half of the run, and with twice the
    # tolerances, the 10x run is still apart (its reward falls while the recipe's does not)
    rc, out = _compare(capsys, runs["a"], runs["lr10"], "--smooth", "10", "--final-fraction", "0.5",
                       "--tol", "0.1", "--final-tol", "0.1")
    [m] = out["metrics"]
    assert rc == 1 and not m["curve_ok"] and not m["final_ok"] and m["final_b"] < m["final_a"], m
    assert main(["compare-runs", str(runs["a"]), str(runs["lr10"])]) == 1
    text = capsys.readouterr().out
    assert "FAIL: reward/mean (curve |Δ|" in text


def test_the_png_is_written(runs, tmp_path, capsys):
    from matplotlib.image import imread

    png = tmp_path / "figs" / "overlay.png"  # the folder is made
    rc, out = _compare(capsys, runs["a"], runs["lr10"], "--png", png, "--smooth", "5",
                       "--metric", "reward/mean", "--metric", "response_length/mean", "--relative")
    assert rc == 1 and out["png"] == str(png) and len(out["metrics"]) == 2
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    image = imread(png)
    assert image.ndim == 3 and image.shape[0] > image.shape[1] * 0.6  # two panels, one above the other


# --- other systems' files ---------------------------------------------------------------------

def _verl_rows(run: Path) -> list[dict]:
    """A verirl run's rewards as veRL's metric names."""
    return [{"step": r["step"], "critic/score/mean": r["reward/mean"], "actor/kl_loss": r["actor/kl"],
             "response_length/mean": r["response_length/mean"]} for r in _rows(run)]


def test_verl_file_logger_jsonl_with_map(runs, tmp_path, capsys):
    # veRL's `file` logger: {"step": N, "data": {...}}, the validation before training at step 0
    lines = [{"step": 0, "data": {"val-core/arith/reward/mean@1": 0.1}}]
    lines += [{"step": r.pop("step"), "data": {**r, "training/global_step": 0}} for r in _verl_rows(runs["a"])]
    lines[1]["data"]["training/global_step"] = 1
    path = tmp_path / "verl.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rc, out = _compare(capsys, runs["b"], path, "--map", "critic/score/mean=reward/mean",
                       "--map", "actor/kl_loss=actor/kl", "--metric", "reward/mean,actor/kl")
    assert rc == 0, out
    assert out["runs"]["B"] == {"path": str(path), "source": "veRL file logger JSONL", "step_key": "step",
                                "steps": STEPS + 1}
    assert [m["steps"] for m in out["metrics"]] == [STEPS, STEPS] and out["metrics"][0]["max_diff"] == 0.0
    # without --map, the error names the run, its metrics and the fix
    err = _error(capsys, runs["b"], path)
    assert "run B" in err and "has no metric 'reward/mean'" in err and "critic/score/mean" in err
    assert "--map OLD=NEW" in err


def test_foreign_jsonl_with_its_own_step_key(runs, tmp_path, capsys):
    path = tmp_path / "other.jsonl"
    rows = [{"iteration": r.pop("step"), **r} for r in _verl_rows(runs["lr10"])]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 31, "critic/score')  # cut off
    rc, out = _compare(capsys, runs["lr10"], path, "--step-key", "iteration", "--map",
                       "critic/score/mean=reward/mean")
    assert rc == 0 and out["runs"]["B"]["step_key"] == "iteration" and out["runs"]["A"]["step_key"] == "step"
    assert any("cut off" in n for n in out["notes"])
    rc, out = _compare(capsys, runs["a"], path, "--step-key", "iteration", "--map", "critic/score/mean=reward/mean")
    assert rc == 1  # the 10x run's numbers, read from a foreign file, still fail against the recipe
    err = _error(capsys, runs["a"], path, "--map", "critic/score/mean=reward/mean")
    assert "run B" in err and "no step key" in err and "--step-key" in err and "iteration" in err


def test_verl_console_log(runs, tmp_path, capsys):
    # veRL's console logger prints `step:N - key:value - ...` with 3 decimals, in a log with other lines
    lines = ["(TaskRunner pid=4242) Training Progress: 0%|", "INFO 12-01 vllm engine started"]
    for r in _verl_rows(runs["a"]):
        items = " - ".join(f"{k}:{v:.3f}" for k, v in r.items() if k != "step")
        lines.append(f"(TaskRunner pid=4242) step:{r['step']} - {items}")
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    rc, out = _compare(capsys, runs["b"], path, "--map", "critic/score/mean=reward/mean")
    assert rc == 0 and out["runs"]["B"]["source"] == "veRL console log" and out["runs"]["B"]["steps"] == STEPS
    assert 0 < out["metrics"][0]["max_diff"] <= 0.0005 + 1e-12  # the rounding to 3 decimals, nothing else


# --- errors: exit 2, one paragraph ------------------------------------------------------------

def test_errors_name_the_run_and_the_fix(runs, tmp_path, capsys):
    err = _error(capsys, runs["a"], tmp_path / "nowhere")
    assert "run B" in err and "nowhere" in err and "no such file or directory" in err
    parent = runs["a"].parent  # a folder of runs, not a run
    err = _error(capsys, parent, runs["a"])
    assert "run A" in err and "without metrics.jsonl" in err and str(runs["a"] / "metrics.jsonl") in err
    err = _error(capsys, runs["a"], runs["b"], "--metric", "reward/men")
    assert "run A" in err and "'reward/men'" in err and "Did you mean reward/mean" in err
    shifted = tmp_path / "shifted.jsonl"
    shifted.write_text("".join(json.dumps({**r, "step": r["step"] + 1000}) + "\n" for r in _rows(runs["a"])))
    err = _error(capsys, runs["a"], shifted)
    assert "no step in common" in err and f"1..{STEPS} ({STEPS} steps)" in err and f"1001..{1000 + STEPS}" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2, oops}\n{"step": 3, "reward/mean": 0.1}\n')
    err = _error(capsys, runs["a"], bad)
    assert f"{bad}, line 2: not JSON" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "is empty" in _error(capsys, runs["a"], empty)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert "neither a metrics JSONL" in _error(capsys, text, runs["a"])
    assert "--map reward: write OLD=NEW" in _error(capsys, runs["a"], runs["b"], "--map", "reward")
    assert "--smooth 0" in _error(capsys, runs["a"], runs["b"], "--smooth", "0")
    assert "--final-fraction 0" in _error(capsys, runs["a"], runs["b"], "--final-fraction", "0")


def test_help_describes_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["compare-runs", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--tol" in text and "--relative" in text and "4% of a reward" in text and "critic/score/mean" in text


def test_load_run_merges_rows_of_one_step(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 1, "val/acc": 0.5}\n'
                    '{"step": 2, "reward/mean": 0.2}\n{"step": 2, "reward/mean": 0.3}\n{"note": "no step"}\n')
    run = load_run(str(path), "A")
    assert run.steps == {1: {"reward/mean": 0.1, "val/acc": 0.5}, 2: {"reward/mean": 0.3}}
    assert any("skipped" in n for n in run.notes) and any("later kept" in n for n in run.notes)
