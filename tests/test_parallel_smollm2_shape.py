"""Tensor and pipeline parallelism at a real model's size: SmolLM2-135M's shape (576 wide, 30 layers, a
49,152-token vocabulary tied to the output layer) with 8 attention heads and 4 key/value heads (SmolLM2's
9 and 3 do not split over 2 ranks), random weights, float32, against one rank: one GRPO step of tp2 and
of pp2 (real gloo processes) takes the one-rank step."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# a rule with spread inside every group (random weights answer nothing right): len(response) % 3
RULE = '''
def spread(response, **_):
    return float(len(response) % 3)
'''


@pytest.fixture(scope="module")
def shape_dir(tmp_path_factory) -> Path:
    """The model directory: SmolLM2-135M's shape with 8 / 4 heads, seeded random weights, the tiny tokenizer
    (the benchmarks' builder, `bench/gpu_check.py`, as `bench/scaling.py --model smollm2-8h` makes it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import gpu_check

    out = tmp_path_factory.mktemp("smollm2_8h") / "model"
    gpu_check.build_model_dir(out, dict(gpu_check.SMOLLM2_135M, num_attention_heads=8, num_key_value_heads=4))
    (out.parent / "spread.py").write_text(RULE)
    return out


def _train(model: Path, run: Path, *layout: str) -> dict:
    from verirl.cli import main

    assert main(["train", f"model.path={model}", f"trainer.run_dir={run}", "trainer.total_steps=1",
                 "trainer.save_freq=0", "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2",
                 "rollout.max_new_tokens=8", "eval.before_train=false", "eval.at_end=false", "log.progress=false",
                 "log.console_every=0", "reward.workers=0", f"reward.verifiers=[{model.parent / 'spread.py'}:spread]",
                 "reward.weights=[1.0]", "reward.tasks={}", "algo.kl_coef=0.01", "actor.lr=1e-6",
                 "trainer.dump_rollouts=true", "trainer.threads=1", "trainer.dist_timeout_s=120",
                 "model.compute_dtype=null", "actor.max_token_len_per_device=256", *layout]) == 0
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.fixture(scope="module")
def one_rank(shape_dir, tmp_path_factory) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("one") / "run"
    return run, _train(shape_dir, run)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [("actor.tensor_parallel_size=2", "rollout.tensor_parallel_size=1"),
                                    ("actor.pipeline_parallel_size=2", "actor.strategy=ddp")],
                         ids=["tp2", "pp2"])
def test_two_ranks_split_take_the_one_rank_step(shape_dir, one_rank, tmp_path, layout):
    """The same rollouts and rewards as one rank; pg_loss, kl, entropy and grad_norm within 1e-5 relative;
    the weights after the step within 1e-5 of each tensor's largest."""
    from safetensors.torch import load_file

    one, a = one_rank
    run = tmp_path / "run"
    b = _train(shape_dir, run, "trainer.nproc_per_node=2", *layout)
    assert (one / "rollouts.jsonl").read_text() == (run / "rollouts.jsonl").read_text()
    assert a["reward/mean"] == b["reward/mean"] and a["actor/grad_norm"] > 0
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]) or abs(a[key] - b[key]) < 1e-8, (key, a[key], b[key])
    wa, wb = (load_file(str(r / "final" / "model.safetensors")) for r in (one, run))
    assert sorted(wa) == sorted(wb) and len(wa) == 30 * 9 + 2
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= 1e-5 * wa[name].abs().max(), name
