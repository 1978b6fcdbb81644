"""Checkpoints, exact resume, kills at random moments, export (real runs of the tiny model)."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from verirl.cli import main

CONFIG = "tiny"  # the recipe shipped in the package
SMALL = ["data.prompts_per_step=4", "actor.mini_batch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=20",
         "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
         "reward.workers=0", "algo.kl_coef=0.01", "trainer.dump_rollouts=true", "actor.warmup_steps=3"]
VOLATILE = ("timing/", "perf/")  # wall-clock figures differ between any two runs


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _weights(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={a}", "trainer.total_steps=4",
                 "trainer.save_freq=2", *SMALL]) == 0
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={b}", "trainer.total_steps=2",
                 "trainer.save_freq=2", *SMALL]) == 0
    assert (b / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={b}", "trainer.total_steps=4",
                 "trainer.save_freq=2", *SMALL]) == 0  # trainer.resume=auto by default
    ma, mb = _metrics(a), _metrics(b)
    assert [r["step"] for r in mb] == [1, 2, 3, 4]
    assert ma == mb  # every loss, reward, KL, lr, grad norm: identical
    wa, wb = _weights(a / "final"), _weights(b / "final")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # bit for bit
    # rollouts.jsonl continued too: 4 steps x 16 responses, each step once
    steps = [json.loads(l)["step"] for l in (b / "rollouts.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and len(steps) == 4 * 16


def test_resume_with_changed_settings_says_which(tmp_path, capsys):
    run = tmp_path / "r"
    args = ["train", "--config", CONFIG, f"trainer.run_dir={run}", *SMALL]
    assert main(args + ["trainer.total_steps=1"]) == 0
    capsys.readouterr()
    assert main(args + ["trainer.total_steps=2", "actor.lr=3e-5"]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "actor.lr 7e-05 -> 3e-05" in out
    assert "total_steps" not in out.split("settings differ")[-1]
    # and the new lr is the one used: 2 optimizer steps per GRPO step, warm-up over 3 of them
    lrs = [r["actor/lr"] for r in _metrics(run)]
    assert lrs[0] == pytest.approx(7e-5 * (1 / 3 + 2 / 3) / 2) and lrs[1] == pytest.approx(3e-5)


def test_resume_false_refuses_an_existing_run_unless_overwrite(tmp_path, capsys):
    run = tmp_path / "r"
    args = ["train", "--config", CONFIG, f"trainer.run_dir={run}", "trainer.total_steps=1", *SMALL]
    assert main(args) == 0
    assert main(args + ["trainer.resume=false"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "trainer.overwrite=true" in err
    assert main(args + ["trainer.resume=false", "trainer.overwrite=true"]) == 0
    assert [r["step"] for r in _metrics(run)] == [1]


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    run = tmp_path / "r"
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={run}", "trainer.total_steps=4",
                 "trainer.save_freq=1", "trainer.keep_checkpoints=2", *SMALL]) == 0
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["latest", "step_000003", "step_000004"]
    state = json.loads((run / "checkpoints" / "step_000004" / "state.json").read_text())
    assert state["step"] == 4 and state["sampler"]["position"] == 16


def test_sigterm_saves_a_checkpoint_and_a_rerun_finishes(tmp_path):
    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "verirl.cli", "train", "--config", CONFIG, f"trainer.run_dir={run}",
           "trainer.total_steps=400", "trainer.save_freq=1000", *SMALL]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text().count("\n") >= 2:
        assert time.time() < deadline and p.poll() is None
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=120)
    err = p.stderr.read().decode()
    assert rc == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err and "Run the same command again" in err
    done = len((run / "metrics.jsonl").read_text().splitlines())
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{done:06d}"  # saved where it stopped
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={run}", f"trainer.total_steps={done + 2}",
                 *SMALL]) == 0
    assert [r["step"] for r in _metrics(run)] == list(range(1, done + 3))


def test_export_reloads_with_transformers_and_gives_the_trainers_logprobs(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from verirl.config import load_config
    from verirl.rollout import SamplingParams
    from verirl.train.update import response_logprobs
    from verirl.train.build import build_run
    from verirl.train.step import train_step

    run_dir = tmp_path / "r"
    cfg = load_config(CONFIG, [f"trainer.run_dir={run_dir}", "trainer.total_steps=2", "trainer.save_freq=1",
                               *SMALL])
    run = build_run(cfg)
    for step in (1, 2):
        train_step(run, step)
    from rich.console import Console

    from verirl.core.ops.linear import use_fast_linears
    from verirl.run.runlog import LogSettings, RunLog
    from verirl.train.checkpoint import save
    log = RunLog(run_dir, False, Console(), LogSettings(progress=False, console_every=0))
    log.open(0, 0)
    save(run, 2, log, {})
    log.close()
    run.scorer.close()
    out = tmp_path / "exported"
    assert main(["export", str(run_dir), str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    use_fast_linears(model)  # the same products as the trainer's model (oneDNN on CPU): bit-equal log-probs
    tok = AutoTokenizer.from_pretrained(out)
    gen = GenerationConfig.from_pretrained(out)
    assert set(gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]) == set(run.stop_ids)
    assert tok("12 + 34")["input_ids"] == run.tokenizer("12 + 34")["input_ids"]
    roll = run.engine.generate([p.ids for p in run.train[:3]], 2, SamplingParams(max_new_tokens=16, seed=5))
    with torch.no_grad():
        ours, _, mask = response_logprobs(run.model, roll)
        theirs, _, _ = response_logprobs(model.eval(), roll)
    assert (ours - theirs)[mask.bool()].abs().max() == 0
    assert main(["export", str(run_dir), str(out)]) == 2  # refuses to overwrite


def test_export_of_a_directory_without_checkpoints_is_a_clear_error(tmp_path, capsys):
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "no verirl checkpoint" in capsys.readouterr().err
