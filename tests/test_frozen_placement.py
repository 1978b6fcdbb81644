"""Frozen models (the reference, the distillation teacher) placed as the actor is (`verirl.train.build.place_frozen`)
with expert parallelism, on real gloo ranks in float32: a MoE teacher's experts sliced over the expert-parallel
group under fsdp2 and ddp, a dense teacher left whole, each giving the unsplit model's logits."""
from __future__ import annotations

from ranks import results

RANK = r"""
import json
import torch
from verirl.config import load_config
from verirl.models import load_model
from verirl.models.expert_parallel import EP_IMPLEMENTATION, expert_modules, shard_experts
from verirl.train.build import distill_teacher
from verirl.train.distributed import init

torch.set_num_threads(1)
dist = init(torch.device("cpu"), 60, expert_parallel=2)
ids = torch.randint(1, 300, (2, 12), generator=torch.Generator().manual_seed(dist.rank))
out = {}
for teacher_path, strategy in (("tiny-moe", "fsdp2"), ("tiny-moe", "ddp"), ("tiny", "fsdp2")):
    cfg = load_config("tiny", ["model.path=tiny-moe", f"algo.distill.teacher={teacher_path}",
                               f"actor.strategy={strategy}", "actor.expert_parallel_size=2", "trainer.nproc_per_node=2"])
    student = load_model("tiny-moe", device="cpu")
    shard_experts(student.model, dist.ep_mesh)  # the student as the build places it
    teacher = distill_teacher(cfg, student, dist, strategy == "fsdp2", torch.device("cpu"))
    whole = load_model(teacher_path, device="cpu").model.eval()
    local = lambda p: p.to_local() if hasattr(p, "to_local") else p
    experts = lambda m: sum(local(p).numel() * p.element_size() for n, p in m.named_parameters() if ".experts." in n)
    with torch.no_grad():
        diff = float((teacher(input_ids=ids).logits - whole(input_ids=ids).logits).abs().max())
    out[f"{teacher_path}/{strategy}"] = {
        "sliced": len(expert_modules(teacher)), "expert_bytes": [experts(teacher), experts(whole)],
        "implementation": getattr(teacher.config, "_experts_implementation", None), "logits": diff,
        "frozen": not teacher.training and not any(p.requires_grad for p in teacher.parameters())}
out["ep"] = EP_IMPLEMENTATION
print("RESULT", json.dumps(out), flush=True)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def test_a_moe_teacher_is_sliced_over_the_expert_parallel_group_and_scores_as_the_whole_model(tmp_path):
    """EP 2 on 2 ranks: a MoE teacher keeps half of its expert bytes on each rank (its experts out of FSDP2
    under fsdp2, sliced under ddp too), computes with the all-to-all experts, and its logits equal the
    unsplit model's; a dense teacher of a MoE student stays whole. Each is in eval mode and frozen."""
    for r in results(tmp_path, RANK, 2):
        for case in ("tiny-moe/fsdp2", "tiny-moe/ddp"):
            d = r[case]
            mine, total = d["expert_bytes"]
            assert d["sliced"] > 0 and mine * 2 == total and total > 0, (case, d)
            assert d["implementation"] == r["ep"], (case, d)
        dense = r["tiny/fsdp2"]
        assert dense["sliced"] == 0 and dense["expert_bytes"] == [0, 0]
        for case, d in r.items():
            if case != "ep":
                assert d["frozen"] and d["logits"] < 1e-5, (case, d)
