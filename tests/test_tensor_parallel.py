"""Tensor parallelism of the decoder (`verirl.models.parallel`) with two real gloo processes, the tiny
model in float32: the log-probs of the same tokens and every parameter's gradient (the output layer
vocabulary-parallel, tied to the embedding) against the unsharded model in one process; and the shapes
that cannot split, refused with their arithmetic."""
from __future__ import annotations


import pytest

from ranks import results
from verirl.core.errors import ConfigError

RANK = r"""
import json, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from verirl.core.ops.head_logprobs import head_logprobs, vocab_parallel_head_logprobs
from verirl.models import load_model
from verirl.models.parallel import head_shard, tensor_parallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))["tp"]
ids = torch.randint(1, 366, (2, 24), generator=torch.Generator().manual_seed(0))
labels, hidden_size = ids[:, 1:].reshape(-1), 128


def log_probs(model, tp):
    h = model.get_decoder()(input_ids=ids).last_hidden_state[:, :-1].reshape(-1, hidden_size)
    if not tp:
        return head_logprobs(h, model.get_output_embeddings().weight, labels, temperature=0.8, with_entropy=True)
    w, start = head_shard(model)
    return vocab_parallel_head_logprobs(h, w, labels, start, mesh.get_group(), temperature=0.8, with_entropy=True)


ref = load_model("tiny", device="cpu").model
lp_ref, ent_ref = log_probs(ref, False)
(lp_ref.sum() + 0.1 * ent_ref.sum()).backward()
model = tensor_parallel(load_model("tiny", device="cpu").model, mesh)
lp, ent = log_probs(model, True)
(lp.sum() + 0.1 * ent.sum()).backward()
worst = {}
grads_ref = dict(ref.named_parameters())
for name, p in model.named_parameters():
    g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
    want = grads_ref[name].grad
    worst[name] = float((g - want).abs().max() / want.abs().max())
sharded = sorted(n for n, p in model.named_parameters() if hasattr(p, "to_local"))
print("RESULT", json.dumps({"logp": float((lp - lp_ref).abs().max() / lp_ref.abs().max()),
                            "entropy": float((ent - ent_ref).abs().max() / ent_ref.abs().max()),
                            "grads": worst, "sharded": sharded}), flush=True)
dist.barrier()  # without it a gloo rank may abort at exit, after its result
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_tensor_parallel_tiny_equals_one_process(tmp_path):
    for result in results(tmp_path, RANK, 2):
        assert result["logp"] < 1e-5 and result["entropy"] < 1e-5, result
        assert len(result["grads"]) == 4 * 12 + 2 and max(result["grads"].values()) < 1e-5, result["grads"]
        assert len(result["sharded"]) == 4 * 10 + 1  # each layer: 7 weights, the q, k, v biases; the tied embedding
        assert "model.embed_tokens.weight" in result["sharded"] and "model.norm.weight" not in result["sharded"]


@pytest.mark.parametrize("tp,words", [
    (3, "does not divide the model's num_attention_heads=4 (4 / 3 = 1.33)"),
    (4, "does not divide the model's num_key_value_heads=2 (2 / 4 = 0.5)"),
])
def test_shapes_that_cannot_split_are_refused_with_the_arithmetic(tp, words):
    from verirl.models.load import model_config
    from verirl.models.parallel import check_tensor_parallel

    config = model_config("tiny", {})
    check_tensor_parallel(config, 2)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_tensor_parallel(config, tp)


def test_a_family_without_a_plan_is_named():
    from transformers import GPT2Config

    from verirl.models.parallel import check_tensor_parallel

    with pytest.raises(ConfigError, match="model_type 'gpt2' has no tensor-parallel plan.*llama, qwen2, qwen3, mistral"):
        check_tensor_parallel(GPT2Config(), 2)


# float32 throughout; veRL's default actor.lr: AdamW's first step moves each weight by about lr x the sign of
# its gradient, so a gradient that sums to near 0 (a token no response holds) may take either sign under
# another summation order; at 1e-6 that is at most 2e-6, within 1e-5 of the largest weight
TRAIN = ["train", "trainer.total_steps=1", "trainer.save_freq=1", "data.prompts_per_step=4",
         "actor.mini_batch_prompts=4", "rollout.n=8", "eval.before_train=false", "eval.at_end=false",
         "log.progress=false", "log.console_every=0", "reward.workers=0", "algo.kl_coef=0.01", "actor.lr=1e-6",
         "trainer.dump_rollouts=true", "trainer.threads=1", "trainer.dist_timeout_s=60", "model.compute_dtype=null"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    from verirl.cli import main

    run = tmp_path_factory.mktemp("tp") / "one"
    assert main(TRAIN + [f"trainer.run_dir={run}"]) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("ranks,strategy,rollout_tp", [(4, "fsdp2", 1), (2, "fsdp2", 2)])
def test_tensor_parallel_training_takes_the_one_rank_step(tmp_path, one_rank, ranks, strategy, rollout_tp):
    """dp2 x tp2 with FSDP2 (each rank decoding a share with the whole weights), and tp2 alone: the same
    rollouts and rewards as one rank, the update's statistics within 1e-5 and the weights after it within
    1e-5; each rank holds 1/ranks of the model states, which `verirl plan` estimates within 10%. (ddp x tp
    takes the same path with the gradients summed by an all-reduce: measured equal too.) With rollout.tensor_parallel_size=2 the native engine
    decodes on the tensor-parallel plan: its log-probs of the sampled tokens are the trainer's to float
    rounding, and its tokens those of one rank (the gathered logits round differently from the whole ones,
    so a token may differ; on this machine none of 32 x 20 does)."""
    import json

    from safetensors.torch import load_file

    from verirl.cli import main

    run = tmp_path / "tp"
    layout = TRAIN + [f"trainer.nproc_per_node={ranks}", "actor.tensor_parallel_size=2", f"actor.strategy={strategy}",
                      f"rollout.tensor_parallel_size={rollout_tp}"]
    assert main(layout + [f"trainer.run_dir={run}"]) == 0
    a, b = (json.loads((r / "metrics.jsonl").read_text().splitlines()[-1]) for r in (one_rank, run))
    if rollout_tp > 1:
        assert b["rollout/logprob_diff/max"] < 1.5e-5, b["rollout/logprob_diff/max"]  # measured 8e-6 (one rank 5e-6)
    assert (one_rank / "rollouts.jsonl").read_text() == (run / "rollouts.jsonl").read_text()
    assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]) or abs(a[key] - b[key]) < 1e-8, (key, a[key], b[key])
    share = b["perf/model_states_gb"] / a["perf/model_states_gb"]
    assert abs(share - (1 / ranks if strategy == "fsdp2" else 0.5)) < 0.02, share
    from verirl.config import load_config
    from verirl.tools.plan import make_plan

    m = make_plan(load_config("tiny", layout[1:] + [f"trainer.run_dir={tmp_path / 'plan'}"])).memory
    estimate = (m.params + m.grads + m.optimizer + m.reference) / 2**30
    assert abs(estimate / b["perf/model_states_gb"] - 1) < 0.1, (estimate, b["perf/model_states_gb"])
    wa, wb = (load_file(str(r / "final" / "model.safetensors")) for r in (one_rank, run))
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= 1e-5 * wa[name].abs().max(), name


# a tensor-parallel checkpoint resumed on another layout: tests/test_sharded_checkpoint.py


SHORT = ["data.max_prompt_length=40"]  # 40 + rollout.max_new_tokens 32: sequences of up to 72 tokens


@pytest.fixture(scope="module")
def one_rank_budget(tmp_path_factory):
    """One rank with a token budget of 72 per forward: the micro-batches sp2 makes of 36 tokens per rank."""
    from verirl.cli import main

    run = tmp_path_factory.mktemp("sp") / "one"
    assert main(TRAIN + SHORT + [f"trainer.run_dir={run}", "actor.max_token_len_per_device=72"]) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("ranks,strategy,pp", [(2, "fsdp2", 1), (4, "fsdp2", 1), (4, "ddp", 2)])
def test_sequence_parallel_training_takes_the_one_rank_step(tmp_path, one_rank_budget, ranks, strategy, pp):
    """sp2 and dp2 x sp2 (Ulysses): each rank of a sequence-parallel group holds half of each packed
    micro-batch, at most 36 tokens, so sequences longer than a rank's budget (up to 72 tokens) are split
    across the group; the same rollouts and rewards as one rank with a budget of 72, the update's
    statistics and the weights after it within 1e-5. sp2 x pp2: each rank of a sequence-parallel pair runs
    its own 2-stage pipeline on its half of every micro-batch (36 tokens between stages), the attention
    Ulysses inside each stage, the last stage gathering the row's log-probs from the pair; the same."""
    import json

    from safetensors.torch import load_file

    from verirl.cli import main
    from verirl.config import load_config
    from verirl.tools.plan import make_plan

    run = tmp_path / "sp"
    layout = TRAIN + SHORT + [f"trainer.nproc_per_node={ranks}", "actor.sequence_parallel_size=2",
                              f"actor.strategy={strategy}", "actor.max_token_len_per_device=36",
                              f"actor.pipeline_parallel_size={pp}"]
    assert main(layout + [f"trainer.run_dir={run}"]) == 0
    assert (one_rank_budget / "rollouts.jsonl").read_text() == (run / "rollouts.jsonl").read_text()
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows) > 36  # longer than a rank's budget
    a, b = (json.loads((r / "metrics.jsonl").read_text().splitlines()[-1]) for r in (one_rank_budget, run))
    assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert abs(a[key] - b[key]) <= 1e-5 * abs(a[key]) or abs(a[key] - b[key]) < 1e-8, (key, a[key], b[key])
    share = b["perf/model_states_gb"] / a["perf/model_states_gb"]
    assert (abs(share - 1 / ranks) < 0.02) if pp == 1 else (share < 0.65), share  # pp: the embedding twice
    m = make_plan(load_config("tiny", layout[1:] + [f"trainer.run_dir={tmp_path / 'plan'}"])).memory
    estimate = (m.params + m.grads + m.optimizer + m.reference) / 2**30
    assert abs(estimate / b["perf/model_states_gb"] - 1) < 0.1, (estimate, b["perf/model_states_gb"])
    wa, wb = (load_file(str(r / "final" / "model.safetensors")) for r in (one_rank_budget, run))
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= 1e-5 * wa[name].abs().max(), name


COUNTED = '''
import os

def counted(response, **_):
    with open(os.environ["VERIRL_TEST_CALLS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    return float(len(response) % 3)
'''


@pytest.mark.slow
def test_the_ranks_of_a_tensor_parallel_group_score_each_response_once(tmp_path, monkeypatch):
    """tp2: both ranks hold the step's 32 responses; each scores 16 of them and the scores are exchanged,
    so a rule runs 32 times (not 64) and both ranks train on the same rewards. The held-out evaluation
    before training (5 problems, greedy + 2 samples each) is split between the two ranks decoding with
    the whole weights (rollout.tensor_parallel_size=1): 15 more calls (not 30)."""
    import json

    from verirl.cli import main

    rule, calls = tmp_path / "counted.py", tmp_path / "calls.txt"
    rule.write_text(COUNTED)
    monkeypatch.setenv("VERIRL_TEST_CALLS", str(calls))
    run = tmp_path / "tp"
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.nproc_per_node=2", "actor.tensor_parallel_size=2",
                         f"reward.verifiers=[acc,{rule}:counted]", "reward.weights=[1.0,0.5]", "reward.tasks={}",
                         "rollout.tensor_parallel_size=1", "eval.before_train=true", "eval.size=5", "eval.n=2"]) == 0
    pids = calls.read_text().split()
    assert len(pids) == 32 + 15 and len(set(pids)) == 2 and pids.count(pids[0]) in (16 + 9, 16 + 6), pids
    val = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert val["step"] == 0 and "val/pass@2" in val, val
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert [r["scores"]["counted"] for r in rows] == [float(len(r["response"]) % 3) for r in rows]
