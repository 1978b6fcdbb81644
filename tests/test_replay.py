"""`rollout.engine=replay`: a run's dump replayed by a second run gives the same input ids and the
same first-step log-probs (entropy, losses, grad norm); another system's text dump is re-encoded
and gets back the EOS it lost where its `stopped` field says so; a prompt that does not match the
run's data is an error naming the line."""
import json
from pathlib import Path

import pytest

from verirl.cli import main

BASE = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "eval.before_train=false",
        "eval.at_end=false", "log.progress=false", "reward.workers=0", "algo.kl_coef=0.01", "trainer.dump_rollouts=true"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def dumped(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("replay") / "a"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=2", *BASE]) == 0
    return run


@pytest.mark.parametrize("prompts", ["data", "dump"])
def test_a_replayed_dump_gives_the_same_ids_and_log_probs(dumped, tmp_path, prompts):
    run = tmp_path / "b"
    extra = ["data.seed=5"] if prompts == "dump" else []  # other data: the dump's prompts are taken instead
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=2", *BASE, "rollout.engine=replay",
                 f"rollout.replay_path={dumped / 'rollouts.jsonl'}", f"rollout.replay_prompts={prompts}", *extra]) == 0
    a, b = _rows(dumped / "rollouts.jsonl"), _rows(run / "rollouts.jsonl")
    assert [(r["prompt_ids"], r["response_ids"]) for r in a] == [(r["prompt_ids"], r["response_ids"]) for r in b]
    for ma, mb in zip(_rows(dumped / "metrics.jsonl"), _rows(run / "metrics.jsonl")):
        for key in ("actor/entropy", "actor/pg_loss", "actor/kl", "actor/grad_norm", "reward/mean"):
            assert ma[key] == mb[key], (key, ma[key], mb[key])


def test_a_text_dump_gets_back_the_eos_it_lost(tmp_path):
    from verirl.models import load_model

    tok = load_model("tiny").tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "1 + 2 = ?"}], tokenize=False,
                                     add_generation_prompt=True)
    answer = "<think> 1 + 2 </think> <answer> \\boxed{3} </answer>"
    lines = [{"step": 1, "input": prompt, "output": answer, "gts": "3", "stopped": True},
             {"step": 1, "input": prompt, "output": answer, "gts": "3", "stopped": False},
             {"step": 1, "input": prompt, "output": answer, "gts": "3"},  # no field: by length (shorter: ended)
             {"step": 1, "input": prompt, "output": answer + " 3 3 3 3 3 3 3 3 3 3 3 3 3 3 3", "gts": "3"}]  # cut
    dump = tmp_path / "verl_dump.jsonl"
    dump.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = tmp_path / "r"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", *BASE, "data.prompts_per_step=1",
                 "actor.mini_batch_prompts=1", "rollout.max_new_tokens=40", "rollout.engine=replay",
                 f"rollout.replay_path={dump}", "rollout.replay_prompts=dump"]) == 0
    rows = _rows(run / "rollouts.jsonl")
    body = tok(answer, add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    assert rows[0]["prompt_ids"] == tok(prompt, add_special_tokens=False)["input_ids"]
    assert rows[0]["response_ids"] == body + [eos] and rows[0]["stopped"]  # EOS put back: trained on
    assert rows[1]["response_ids"] == body and not rows[1]["stopped"]  # it was cut: no EOS added
    assert rows[2]["response_ids"] == body + [eos]
    assert len(rows[3]["response_ids"]) == 40 and not rows[3]["stopped"]  # as long as the cap: cut there
    assert rows[0]["label"] == "3" and rows[0]["scores"]["acc"] == 1.0


def test_a_prompt_that_is_not_the_runs_is_named(dumped, tmp_path, capsys):
    run = tmp_path / "b"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", *BASE, "data.seed=5",
                 "rollout.engine=replay", f"rollout.replay_path={dumped / 'rollouts.jsonl'}"]) == 2
    err = capsys.readouterr().err
    error = err.splitlines()[-1]  # one paragraph, after the run's notes (the mismatch guard is off for replay)
    assert error.startswith("verirl train: ") and [line for line in err.splitlines() if "verirl train:" in line] == [error]
    assert f"{dumped / 'rollouts.jsonl'}:1: the dump's prompt ids differ" in error and "replay_prompts=dump" in error


def test_replay_without_a_dump_is_a_config_error(tmp_path, capsys):
    assert main(["train", f"trainer.run_dir={tmp_path / 'r'}", "rollout.engine=replay"]) == 2
    assert "rollout.engine=replay needs rollout.replay_path" in capsys.readouterr().err


def test_a_replayed_run_evaluates_before_and_after_with_the_native_engine(dumped, tmp_path):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"problem": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n"
                                for i in range(2)))
    run = tmp_path / "b"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", *BASE, "rollout.engine=replay",
                 f"rollout.replay_path={dumped / 'rollouts.jsonl'}", "eval.before_train=true", "eval.at_end=true",
                 f"eval.data={held_out}", "eval.n=2"]) == 0
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and "val/pass@2" in rows[0] and "val/pass@2" in rows[1]
    assert rows[1]["reward/mean"] == _rows(dumped / "metrics.jsonl")[0]["reward/mean"]  # still the dump's step 1


def test_another_eval_size_with_the_built_in_task_is_named(dumped, tmp_path, capsys):
    run = tmp_path / "b"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", *BASE, "eval.size=8",
                 "rollout.engine=replay", f"rollout.replay_path={dumped / 'rollouts.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "the dump's prompt ids differ" in err and "eval.size" in err and "replay_prompts=dump" in err, err
