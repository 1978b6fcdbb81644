"""The rule ``model``: a sequence-classification reward model trained here for a few steps (the tiny model
with a one-logit head) scores in the trainer's process through the Scorer, equal to a direct forward of
its backbone and head at each sequence's last token, weighted with the string rules."""
import json
import shutil

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from verirl.cli import main
from verirl.config.schema import RewardConfig, RewardModelConfig
from verirl.models.load import TINY_DIR
from verirl.rewards import Scorer
from verirl.rewards.model import RewardModelService, batches, rm_text
from verirl.rewards.service import ServiceContext
from verirl.rewards.services import build_services

PROMPTS = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(3, 4), (12, 30), (7, 8), (51, 9)]]
GOOD = ["<think>3+4=7</think><answer>\\boxed{7}</answer>", "<answer>\\boxed{42}</answer>",
        "<think>7+8=15</think><answer>\\boxed{15}</answer>", "\\boxed{60}"]
BAD = ["seven", "I think it is 42 maybe", "15 15 15 15 15 15 15 15", "no idea"]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    """The tiny model with a one-logit head, its head trained 200 steps (the backbone frozen) to score boxed
    answers 1 and the rest 0."""
    path = tmp_path_factory.mktemp("rm")
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(TINY_DIR, num_labels=1)
    tok = AutoTokenizer.from_pretrained(TINY_DIR)
    rows = [tok(rm_text(tok, p, r), add_special_tokens=False)["input_ids"] for p in PROMPTS for r in (*GOOD, *BAD)]
    target = torch.tensor([1.0 if r in GOOD else 0.0 for p in PROMPTS for r in (*GOOD, *BAD)])
    with torch.no_grad():  # each sequence's last hidden state, as the head reads it
        last = torch.stack([model.model(torch.tensor([r])).last_hidden_state[0, -1] for r in rows])
    opt = torch.optim.AdamW(model.score.parameters(), lr=1e-2)
    for _ in range(200):
        loss = torch.nn.functional.mse_loss(model.score(last)[:, 0], target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path)
    for f in [*TINY_DIR.glob("tokenizer*"), TINY_DIR / "chat_template.jinja"]:
        shutil.copy(f, path)
    return path


def direct(path, prompt, response) -> float:
    """The reference: the backbone's last hidden state at the sequence's last token through the head."""
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    text = rm_text(tok, prompt, response)
    ids = torch.tensor([tok(text, add_special_tokens=isinstance(prompt, str))["input_ids"]])
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state[0, -1]
        return float(model.score(hidden)[0])


def test_scores_equal_a_direct_forward_and_combine_with_the_rules_by_weight(reward_model):
    reward = RewardConfig(verifiers=["acc", "model"], weights=[1.0, 0.5],
                          model=RewardModelConfig(path=str(reward_model), max_token_len=400))
    scorer = Scorer(reward.verifiers, reward.weights, workers=0,
                    services=build_services(reward.verifiers, reward, ServiceContext()))
    responses = [GOOD[0], BAD[0], GOOD[1], BAD[1], GOOD[3], BAD[2]]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[3], PROMPTS[2]]
    labels = ["7", "7", "42", "42", "60", "15"]
    try:
        result = scorer(responses, [{"label": lab, "task": "add", "prompt": p} for lab, p in zip(labels, prompts)])
    finally:
        scorer.close()
    model_scores = result.per_rule["model"]
    for s, p, r in zip(model_scores, prompts, responses):
        assert s == pytest.approx(direct(reward_model, p, r), abs=1e-6)
    assert result.totals == pytest.approx([a + 0.5 * m for a, m in zip(result.per_rule["acc"], model_scores)],
                                          abs=1e-6)
    assert result.per_rule["acc"][0::2] == [1.0, 1.0, 1.0] and max(result.per_rule["acc"][1::2]) < 1.0
    good, bad = model_scores[0::2], model_scores[1::2]
    assert min(good) > max(bad)  # trained: it tells a boxed answer from the rest
    assert result.errors == 0


def test_batches_keep_the_token_budget_and_a_longer_sequence_is_not_cut(reward_model):
    svc = RewardModelService(RewardModelConfig(path=str(reward_model), max_token_len=60))
    rows = svc.encode([GOOD[0], "x " * 200, BAD[3]], [{"prompt": PROMPTS[0]}] * 3)
    assert len(rows[0]) <= 60 < len(rows[1])
    out = svc.score([GOOD[0], "x " * 200, BAD[3]], [{"prompt": PROMPTS[0]}] * 3)
    assert out.scores[1][0] is None and "over reward.model.max_token_len=60" in out.scores[1][1]
    assert out.scores[0][0] == pytest.approx(direct(reward_model, PROMPTS[0], GOOD[0]), abs=1e-6)
    assert out.scores[2][0] == pytest.approx(direct(reward_model, PROMPTS[0], BAD[3]), abs=1e-6)
    # a sequence that ends in the tokenizer's pad token keeps it: the head reads that token, as alone
    templated = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ends_in_pad = svc.score(["5", "4" + svc.tokenizer.pad_token], [{"prompt": templated}] * 2)  # one batch
    assert svc.encode(["4" + svc.tokenizer.pad_token], [{"prompt": templated}])[0][-1] == svc.tokenizer.pad_token_id
    assert ends_in_pad.scores[1][0] == pytest.approx(direct(reward_model, templated, "4" + svc.tokenizer.pad_token),
                                                     abs=1e-6)
    lengths = [len(r) for r in rows]
    for b in batches(lengths, 60):
        assert len(b) * max(lengths[i] for i in b) <= 60
    # a preprocessed row's prompt is the templated text: the response follows it as it is
    assert rm_text(svc.tokenizer, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "4") == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n4"


def test_a_head_without_the_index_is_refused(reward_model):
    with pytest.raises(Exception, match=r"reward.model.index=3 but .* has 1 logit"):
        RewardModelService(RewardModelConfig(path=str(reward_model), index=3))


def test_a_training_step_scores_with_the_reward_model(reward_model, tmp_path):
    run = tmp_path / "run"
    rc = main(["train", "--config", "tiny", f"trainer.run_dir={run}", "trainer.total_steps=1",
               "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "reward.verifiers=[acc,model]",
               "reward.weights=[1.0,0.5]", "reward.tasks={}", f"reward.model.path={reward_model}",
               "eval.before_train=false", "eval.at_end=false", "log.progress=false"])
    assert rc == 0
    row = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert "reward/model/mean" in row and row["reward/errors"] == 0
