"""Expert parallelism (`verirl.models.expert_parallel`) with real gloo processes, float32: the all-to-all
experts function against transformers' grouped_mm experts in one process (forward and backward, uneven
and empty experts, a rank with no tokens), each rank's expert memory, the gathered weights and state
dicts; and training the shipped tiny MoE model with EP 2 (2 ranks) and dp2 x ep2 (4 ranks) against one
rank."""
from __future__ import annotations

import json

import pytest
import torch

from ranks import results

RANK = r"""
import json
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, Qwen3MoeConfig
from verirl.models import load_model
from verirl.models.expert_parallel import EP_IMPLEMENTATION, shard_experts
from verirl.train.strategy import full_state_dict, full_weights, shard_state_dict

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))["ep"]
out = {}

# one layer: 8 experts of which each rank keeps 4, top-2
cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                     head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, intermediate_size=48)
torch.manual_seed(0)
one = AutoModelForCausalLM.from_config(cfg).float()
torch.manual_seed(0)
split = AutoModelForCausalLM.from_config(Qwen3MoeConfig(**cfg.to_dict())).float()
shard_experts(split, mesh)
out["implementation"] = split.config._experts_implementation, one.config._experts_implementation
ex_one, ex = one.model.layers[0].mlp.experts, split.model.layers[0].mlp.experts
g = torch.Generator().manual_seed(10 + rank)
for case, (tokens, high) in {"uneven": (7, 8), "one_rank_empty": (5, 4), "no_tokens": (0, 8)}.items():
    h = torch.randn(tokens, 32, generator=g)
    ids = torch.stack([torch.randperm(high, generator=g)[:2] for _ in range(tokens)]) if tokens else \
        torch.zeros(0, 2, dtype=torch.long)
    ids[ids == 5] = 6  # expert 5 gets no token on any rank; "one_rank_empty": rank 1's experts 4..7 get none
    w = torch.rand(tokens, 2, generator=g)
    upstream = torch.randn(tokens, 32, generator=g)  # a real gradient (a stride-0 one is refused by _grouped_mm)
    for m in (ex_one, ex):
        m.zero_grad(set_to_none=True)
    h1, w1, h2, w2 = (t.clone().requires_grad_(True) for t in (h, w, h, w))
    y1 = ex_one(h1, ids, w1)
    (y1 * upstream).sum().backward()
    y2 = ex(h2, ids, w2)
    (y2 * upstream).sum().backward()
    d = {"y": float((y2 - y1).abs().max()) if tokens else 0.0,
         "dh": float((h2.grad - h1.grad).abs().max()) if tokens else 0.0,
         "dw": float((w2.grad - w1.grad).abs().max()) if tokens else 0.0, "scale": float(y1.abs().max()) if tokens else 1.0}
    for name in ("gate_up_proj", "down_proj"):
        want = getattr(ex_one, name).grad
        want = torch.zeros_like(getattr(ex_one, name)) if want is None else want.clone()
        dist.all_reduce(want)  # the slice's gradient holds every rank's tokens
        got = getattr(ex, name).grad
        d[name] = float((got - want[rank * 4:(rank + 1) * 4]).abs().max())
        d[name + "_scale"] = float(want.abs().max())
    out[case] = d

# the shipped tiny MoE: this rank's expert bytes, the experts gathered for decoding, the state dicts
whole = load_model("tiny-moe", device="cpu").model
model = load_model("tiny-moe", device="cpu").model
shard_experts(model, mesh)
experts = lambda m: sum(p.numel() * p.element_size() for n, p in m.named_parameters() if ".experts." in n)
out["expert_bytes"] = experts(model), experts(whole)
with full_weights(model):
    gathered = experts(model)
    out["gathered_diff"] = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), whole.parameters()))
    out["gathered"] = gathered
out["after_bytes"] = experts(model)
sd = full_state_dict(model)
out["state_dict_diff"] = max(float((sd[k] - v).abs().max()) for k, v in whole.state_dict().items())
fresh = load_model("tiny-moe", device="cpu").model
fresh.model.layers[0].mlp.experts.down_proj.data.zero_()
shard_experts(fresh, mesh)
fresh.load_state_dict(shard_state_dict(fresh, sd))
out["reload_diff"] = max(float((a - b).abs().max()) for a, b in zip(fresh.parameters(), model.parameters()))
ids = torch.randint(1, 300, (2, 10), generator=torch.Generator().manual_seed(rank))
out["logits"] = float((model(input_ids=ids).logits - whole(input_ids=ids).logits).abs().max())
print("RESULT", json.dumps(out), flush=True)
dist.barrier()  # without it a gloo rank may abort at exit, after its result
dist.destroy_process_group()
"""


def test_expert_parallel_layer_equals_grouped_mm_on_one_rank(tmp_path):
    """ep 2: each rank's outputs, input and routing-weight gradients equal transformers' grouped_mm experts on
    its tokens, and each expert slice's gradient the sum of both ranks' one-process gradients (an expert no
    token visits, a rank whose experts get no token, a rank with no tokens: all-to-all of nothing). The
    tiny MoE: each rank holds half of the expert bytes (measured from its parameters), the experts gathered
    for decoding and the full state dict are the unsharded model's, a state dict loads back into the slices,
    and the logits equal the unsharded model's."""
    for r in results(tmp_path, RANK, 2):
        assert r["implementation"] == ["verirl_ep", "grouped_mm"]
        for case in ("uneven", "one_rank_empty", "no_tokens"):
            d = r[case]
            assert d["y"] <= 1e-6 * d["scale"] and d["dh"] < 1e-6 and d["dw"] < 1e-6, (case, d)
            for name in ("gate_up_proj", "down_proj"):
                assert d[name] <= 1e-6 * max(d[name + "_scale"], 1.0), (case, name, d)
        mine, total = r["expert_bytes"]
        assert mine * 2 == total and r["after_bytes"] == mine, r["expert_bytes"]
        assert r["gathered"] == total and r["gathered_diff"] == 0.0
        assert r["state_dict_diff"] == 0.0 and r["reload_diff"] == 0.0
        assert r["logits"] < 1e-5, r["logits"]


# float32, 2 steps at a small lr (as tests/test_tensor_parallel.py): step 1's gradient is the policy term and an
# entropy bonus (a gradient also when every group's rewards are equal), step 2's adds the KL to the reference
TRAIN = ["train", "trainer.total_steps=2", "trainer.save_freq=1", "data.prompts_per_step=4",
         "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=16", "eval.before_train=false",
         "eval.at_end=false", "log.progress=false", "log.console_every=0", "reward.workers=0", "algo.kl_coef=0.01",
         "actor.lr=1e-6", "algo.entropy_coef=0.1", "trainer.dump_rollouts=true", "trainer.threads=1",
         "trainer.dist_timeout_s=60",
         "model.compute_dtype=null", "model.path=tiny-moe", "trainer.checkpoint_format=whole"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    from verirl.cli import main

    run = tmp_path_factory.mktemp("ep") / "one"
    assert main(TRAIN + [f"trainer.run_dir={run}"]) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_expert_parallel_training_takes_the_one_rank_step(tmp_path, one_rank, ranks):
    """ep 2 on 2 ranks (experts out of FSDP2) and dp2 x ep2 on 4 ranks (each expert slice FSDP2-sharded over
    its 2 expert-data-parallel ranks): the same rollouts and rewards as one rank at both steps (decoding
    gathers every expert), pg_loss, kl and entropy within 1e-5, step 1's grad_norm within 1e-5 and the
    weights after the steps within 1e-5 of the largest. Step 2's gradient can be small (the rewards of a
    group equal: the KL and entropy terms alone): summed in another order, its norm differs by 1e-3
    relative on dp4 without experts split too, so it is compared to step 1's scale. (ddp x ep, whose expert gradients are summed over
    edp by the all-reduce, takes the same step: measured equal on dp2 x ep2 too.)"""
    from safetensors.torch import load_file

    from verirl.cli import main

    run = tmp_path / "ep"
    assert main(TRAIN + [f"trainer.run_dir={run}", f"trainer.nproc_per_node={ranks}",
                         "actor.expert_parallel_size=2"]) == 0
    assert (one_rank / "rollouts.jsonl").read_text() == (run / "rollouts.jsonl").read_text()
    a, b = ([json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in (one_rank, run))
    scale = a[0]["actor/grad_norm"]
    assert scale > 0.1
    for sa, sb in zip(a, b):
        assert sa["reward/mean"] == sb["reward/mean"]
        for key in ("actor/pg_loss", "actor/kl", "actor/entropy"):
            assert abs(sa[key] - sb[key]) <= 1e-5 * abs(sa[key]) or abs(sa[key] - sb[key]) < 1e-8, (key, sa, sb)
        assert abs(sa["actor/grad_norm"] - sb["actor/grad_norm"]) <= 1e-5 * scale, (sa["actor/grad_norm"],
                                                                                     sb["actor/grad_norm"])
    wa, wb = (load_file(str(r / "final" / "model.safetensors")) for r in (one_rank, run))
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= 1e-5 * wa[name].abs().max(), name
    # step 1's whole checkpoint: every expert slice and its AdamW moments gathered in expert order, under the
    # one-rank run's names (what a resume on any layout reads: tests/test_lean_moe.py reads it back)
    ca, cb = (r / "checkpoints" / "step_000001" for r in (one_rank, run))
    ma, mb = (load_file(str(c / "model" / "model.safetensors")) for c in (ca, cb))
    assert sorted(ma) == sorted(mb) and any(".experts.7." in name for name in ma)
    for name in ma:
        assert (ma[name] - mb[name]).abs().max() <= 1e-5 * ma[name].abs().max(), name
    oa, ob = (torch.load(c / "optimizer.pt", weights_only=True)["optimizer"]["state"] for c in (ca, cb))
    assert oa.keys() == ob.keys()
    for i in oa:
        for moment in ("exp_avg", "exp_avg_sq"):
            x, y = oa[i][moment], ob[i][moment]
            assert x.shape == y.shape and (x - y).abs().max() <= 1e-4 * x.abs().max(), (i, moment)


@pytest.mark.slow
@pytest.mark.parametrize("first,then,fmt", [((4, 2), (2, 2), "sharded")], ids=["dp2xep2-to-ep2-sharded"])
def test_resume_across_expert_parallel_layouts_continues_the_one_rank_run(tmp_path, one_rank, first, then, fmt):
    """Step 1 on ``first`` (ranks, ep): dp2 x ep2 on 4 (each expert slice FSDP2-sharded over its 2
    expert-data-parallel ranks); its checkpoint resumed for step 2 on ``then``: ep 2, whose slices overlap two
    FSDP2 blocks each of the writers'. (The whole format's gather is checked in the training test above.) Whole: the
    experts and their AdamW moments gathered in expert order. Sharded: every rank writes its blocks, an expert
    slice's at its experts' rows of the fused tensor, and the resuming ranks read what overlaps theirs. Step
    2's rollouts equal the uninterrupted one-rank run's, its statistics and the weights after it within
    1e-5; a sharded run's final/ holds the one-rank run's tensor names (each expert's, as save_pretrained
    writes them)."""
    from safetensors.torch import load_file

    from verirl.cli import main

    def layout(ranks_ep: tuple[int, int]) -> list[str]:
        return [f"trainer.nproc_per_node={ranks_ep[0]}", f"actor.expert_parallel_size={ranks_ep[1]}",
                f"trainer.checkpoint_format={fmt}"]

    run = tmp_path / "resumed"
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=1"] + layout(first)) == 0
    saved = json.loads((run / "checkpoints" / "step_000001" / "state.json").read_text())
    assert (saved.get("weights") == "sharded") == (fmt == "sharded")
    if fmt == "sharded":
        assert saved["layout"]["ep"] == first[1] and saved["layout"]["world"] == first[0]
    assert main(TRAIN + [f"trainer.run_dir={run}", "trainer.total_steps=2"] + layout(then)) == 0
    a, b = ([json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in (one_rank, run))
    assert [m["step"] for m in b] == [1, 2]
    assert (one_rank / "rollouts.jsonl").read_text() == (run / "rollouts.jsonl").read_text()
    for key in ("reward/mean", "actor/pg_loss", "actor/kl", "actor/entropy"):
        assert abs(a[1][key] - b[1][key]) <= 1e-5 * abs(a[1][key]) or abs(a[1][key] - b[1][key]) < 1e-8, key
    assert abs(a[1]["actor/grad_norm"] - b[1]["actor/grad_norm"]) <= 1e-5 * a[0]["actor/grad_norm"]
    wa, wb = (load_file(str(r / "final" / "model.safetensors")) for r in (one_rank, run))
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= 1e-5 * wa[name].abs().max(), name
