"""A short real GRPO run of the shipped tiny model through the CLI."""
import json
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from verirl.cli import main

CONFIG = "tiny"  # the recipe shipped in the package

REQUIRED = ["step", "reward/mean", "reward/acc/mean", "reward/format/mean", "response_length/mean",
            "response_length/max", "response_length/min", "response_length/clip_ratio", "prompt_length/mean",
            "actor/pg_loss", "actor/kl", "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm", "actor/lr",
            "timing/rollout", "timing/reward", "timing/old_log_prob", "timing/ref", "timing/update",
            "timing/all", "perf/tps"]


def test_short_grpo_run_end_to_end(tmp_path, capsys):
    run = tmp_path / "run"
    start = time.monotonic()
    rc = main(["train", "--config", CONFIG, f"trainer.run_dir={run}", "trainer.total_steps=3",
               "data.prompts_per_step=4", "actor.mini_batch_prompts=2", "rollout.n=4", "actor.micro_batch_size=5",
               "trainer.dump_rollouts=true", "eval.size=8", "eval.n=1", "actor.warmup_steps=2",
               "log.progress=false", "log.console_every=1"])
    elapsed = time.monotonic() - start
    assert rc == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: the held-out evaluation before training
    assert "val/greedy_acc" in rows[0] and "val/greedy_acc" in rows[3] and "val/greedy_acc" not in rows[1]
    rows = rows[1:]
    for key in REQUIRED:
        assert key in rows[0], key
    # two mini-batches per step: not on-policy, so the old log-prob pass ran
    assert all(r["timing/old_log_prob"] > 0 and r["timing/ref"] > 0 for r in rows)
    assert rows[0]["actor/lr"] < rows[-1]["actor/lr"]  # warm-up
    dump = [json.loads(l) for l in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(dump) == 3 * 4 * 4
    # perf/tps: the step's tokens, counted here from its dumped prompts and responses, over its measured time
    # (timing/all, itself within the run's wall time)
    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    for r in rows:
        tokens = sum(len(tokenizer(d["prompt"], add_special_tokens=False).input_ids) + d["response_length"]
                     for d in dump if d["step"] == r["step"])
        assert r["perf/tps"] * r["timing/all"] == pytest.approx(tokens, rel=1e-6)
    assert sum(r["timing/all"] for r in rows) < elapsed
    assert {"step", "prompt", "response", "label", "task", "scores", "reward", "response_length", "stopped"} <= set(dump[0])
    assert (run / "config.yaml").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["eval_end"]["val/greedy_acc"] <= 1
    assert summary["eval_end"]["val/greedy_acc"] == rows[-1]["val/greedy_acc"]  # evaluated once, logged twice
    model = AutoModelForCausalLM.from_pretrained(run / "final")  # a real Hugging Face directory
    assert model.generation_config.eos_token_id is not None
    out = capsys.readouterr().out
    assert "held-out at start" in out and "held-out greedy_acc" in out
    # the run directory is not silently overwritten
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={run}", "log.progress=false",
                 "trainer.resume=false"]) == 2


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_on_policy_skips_old_log_prob(tmp_path, engine):
    run = tmp_path / "onp"
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={run}", "trainer.total_steps=1",
                 f"rollout.engine={engine}",
                 "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=4", "algo.kl_coef=0",
                 "eval.before_train=false", "eval.at_end=false", "log.progress=false"]) == 0
    row = json.loads((run / "metrics.jsonl").read_text())
    assert row["timing/old_log_prob"] == 0.0 and row["timing/ref"] == 0.0
    assert "actor/kl" not in row  # no reference pass: no made-up KL


@pytest.mark.slow  # about 20-50 s here (twice that on the slower CI machines): `make test-slow`
def test_reward_rises_on_the_embedded_default(tmp_path):
    """200 steps of the shipped recipe (about a minute): the reward must climb, not just run."""
    run = tmp_path / "learn"
    assert main(["train", "--config", CONFIG, f"trainer.run_dir={run}", "trainer.total_steps=200",
                 "eval.before_train=false", "eval.at_end=false", "log.progress=false",
                 "log.console_every=0"]) == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    first = sum(r["reward/mean"] for r in rows[:50]) / 50
    last = sum(r["reward/mean"] for r in rows[-50:]) / 50
    assert last > first + 0.08, (first, last)
    assert all(r["response_length/clip_ratio"] < 0.2 for r in rows[-10:])  # it still stops on EOS
