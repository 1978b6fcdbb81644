"""On-policy distillation (algo.distill): the teacher's log-probs of the student's samples and the per-token
advantage they make, checked against direct forwards of both models; a teacher with another tokenizer refused."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verirl.cli import main
from verirl.core.algo import distill_advantages, reverse_kl
from verirl.models.load import TINY_DIR, tokenizer_difference


def test_the_advantage_is_teacher_minus_student_on_the_trained_tokens():
    student = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-3.0, -0.1, 0.0, 0.0]])
    teacher = torch.tensor([[-0.5, -3.0, -0.5, -7.0], [-1.0, -0.2, -5.0, -5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # by hand: coef 0.5 * (teacher - student) on the mask
    alone = distill_advantages(student, teacher, mask, coef=0.5)
    assert alone.tolist() == [[0.25, -0.5, 0.0, 0.0], [1.0, pytest.approx(-0.05), 0.0, 0.0]]
    outcome = torch.tensor([1.0, -1.0])
    both = distill_advantages(student, teacher, mask, coef=0.5, outcome=outcome)
    assert both.tolist() == [[1.25, 0.5, 1.0, 0.0], [0.0, pytest.approx(-1.05), 0.0, 0.0]]
    assert reverse_kl(student, teacher)[0].tolist() == [-0.5, 1.0, 0.0, 7.0]


def _response_logprobs(model, prompt_ids, response_ids, temperature):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


def test_a_step_distils_with_the_teachers_logprobs_of_the_sampled_tokens(tmp_path, moved_copy):
    teacher_dir = moved_copy(TINY_DIR, 0.05)
    run = tmp_path / "run"
    rc = main(["train", "--config", "tiny", f"trainer.run_dir={run}", "trainer.total_steps=1",
               "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=4", "rollout.temperature=0.9",
               "model.compute_dtype=null", "algo.kl_coef=0", f"algo.distill.teacher={teacher_dir}",
               "algo.distill.coef=0.5", "algo.distill.rewards=false", "trainer.dump_rollouts=true", "eval.before_train=false",
               "eval.at_end=false", "log.progress=false"])
    assert rc == 0
    row = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["timing/teacher"] > 0 and row["timing/old_log_prob"] > 0  # on-policy, yet the student's pass ran
    student = AutoModelForCausalLM.from_pretrained(TINY_DIR).eval()  # the weights that sampled step 1
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    kl, teacher_sum, tokens, means = 0.0, 0.0, 0, []
    for d in map(json.loads, (run / "rollouts.jsonl").read_text().splitlines()):
        s = _response_logprobs(student, d["prompt_ids"], d["response_ids"], 0.9)
        t = _response_logprobs(teacher, d["prompt_ids"], d["response_ids"], 0.9)
        kl += float((s - t).sum())
        teacher_sum += float(t.sum())
        tokens += len(d["response_ids"])
        means.append(float(0.5 * (t - s).mean()))
    assert row["distill/teacher_logp"] == pytest.approx(teacher_sum / tokens, abs=1e-5)
    assert row["distill/reverse_kl"] == pytest.approx(kl / tokens, abs=1e-5)
    assert abs(row["distill/reverse_kl"]) > 1e-3  # the teacher is another model: the check has teeth
    # algo.distill.rewards=false: each token's advantage is 0.5 (teacher - student) alone; adv/* log each
    # response's token mean, and the on-policy loss (ratio 1, token-mean) is minus the trained tokens' mean
    assert row["adv/mean"] == pytest.approx(sum(means) / len(means), abs=1e-5)
    assert row["actor/pg_loss"] == pytest.approx(0.5 * kl / tokens, abs=1e-4)


def test_a_teacher_with_another_tokenizer_is_refused_naming_the_first_differing_id(tmp_path, capsys, moved_copy):
    teacher_dir = moved_copy(TINY_DIR, 0.05)
    spec = json.loads((teacher_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "!", '"'  # ids 3 and 4 swapped
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (teacher_dir / "tokenizer.json").write_text(json.dumps(spec))
    other = AutoTokenizer.from_pretrained(teacher_dir)
    assert tokenizer_difference(AutoTokenizer.from_pretrained(TINY_DIR), other) == \
        "id 3 is '!' in one and '\"' in the other"
    rc = main(["train", "--config", "tiny", f"trainer.run_dir={tmp_path / 'run'}", "trainer.total_steps=1",
               f"algo.distill.teacher={teacher_dir}", "log.progress=false"])
    assert rc == 2
    said = capsys.readouterr().err
    assert "its tokenizer differs from the student's" in said and "id 3 is '!'" in said
