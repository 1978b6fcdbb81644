"""`verirl convert-config` on mixture-of-experts runs: veRL's Megatron expert parallel sizes, router_replay.mode and
load-balancing coefficient, and MindSpeed-RL's MoE keys (moe_tp_extend_ep, moe_grouped_gemm, moe_aux_loss_coeff,
the dispatcher and the model's shape), each a row; the peers' own files (tests/fixtures/convert: veRL's
examples/router_replay at volcengine/verl b178a3cd, MindSpeed-RL's configs/dapo_qwen3_30b_a3b_A3.yaml at 05a90d77)
become configs that load and pass verirl's checks, the expert layout's on the tiny MoE model too."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from verirl.cli import main
from verirl.config import load_config, load_config_dict
from verirl.run.checks import check, check_experts
from verirl.tools.align.convert import convert

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "convert"
VERL_R2 = FIXTURES / "verl_router_replay_qwen30_a3b_megatron_vllm.sh"
MS_QWEN3_MOE = str(FIXTURES / "mindspeed_dapo_qwen3_30b_a3b_A3_composed.yaml")
VERL_HEAD = str(FIXTURES / "verl_generated_ppo_trainer_head.yaml")
A, R, AC = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_config."
MG = A + "megatron."
OTC = MG + "override_transformer_config."
MOE_MODEL = "model.qwen3_30b_a3b."
GRPO = ["algorithm.adv_estimator=grpo", R + "n=4", "trainer.total_training_steps=10"]
EP8 = [A + "strategy=megatron", f"{MG}expert_model_parallel_size=8", f"{MG}expert_tensor_parallel_size=1"]


def _script(path: Path) -> list[str]:
    """The key=value overrides a veRL run script passes to verl.trainer.main_ppo."""
    words = shlex.split(path.read_text(), comments=True)
    return [w for w in words[words.index("verl.trainer.main_ppo") + 1:] if "=" in w and not w.startswith("--")]


def _verl(*overrides: str):
    return convert("verl", VERL_HEAD, [*GRPO, *overrides])


def _passes(result, moe: bool = True):
    """The translation loads and passes verirl's checks of names and values; with ``moe``, the expert layout's check
    on the tiny MoE model (8 experts) too, without the other model's numerics (model.override_config)."""
    cfg = load_config_dict(result.config)
    check(cfg, paths=False)
    if moe:
        cfg.model.path, cfg.model.override_config = "tiny-moe", {}
        check_experts(cfg)
    return cfg


# ---------------------------------------------------------------- veRL

def test_verl_router_replay_recipe(tmp_path):
    """Qwen3-30B-A3B on 8 GPUs, Megatron TP 2 x EP 8, ETP 1, R2: verirl's EP 8 over 8 ranks, no
    tensor parallelism (a decision), R2; the dispatcher, DeepEP and fusions ignored with why; no key unknown."""
    r = convert("verl", None, _script(VERL_R2))
    assert [x.key for x in r.by_status("unknown")] == []
    ep = r.row(MG + "expert_model_parallel_size")
    assert ep.status == "translated" and "actor.expert_parallel_size" in ep.targets
    assert (r.get("actor.expert_parallel_size"), r.get("trainer.checkpoint_format"), r.get("trainer.nproc_per_node"),
            r.get("actor.tensor_parallel_size")) == (8, None, 8, 1)
    tp = r.row(MG + "tensor_model_parallel_size")
    assert tp.status == "decide" and "no tensor-parallel plan" in tp.note
    assert r.row(MG + "expert_tensor_parallel_size").status == "translated"
    assert r.get("actor.expert_tensor_parallel_size") is None  # verirl's default, 1
    rr = r.row(A + "router_replay.mode")
    assert rr.status == "translated" and r.get("algo.router_replay") == "R2"
    assert r.get("rollout.tensor_parallel_size") == 2  # vLLM's own layout
    for leaf, word in (("moe_token_dispatcher_type", "all-to-all"), ("moe_enable_deepep", "DeepEP"),
                       ("moe_permute_fusion", "kernel"), ("moe_router_dtype", "router")):
        row = r.row(OTC + leaf)
        assert row.status == "ignored" and word in row.note, leaf
    assert r.row("actor_rollout_ref.ref.megatron.expert_model_parallel_size").status == "ignored"
    cfg = _passes(r)
    assert cfg.algo.router_replay == "R2"
    out = tmp_path / "moe.yaml"
    assert main(["convert-config", "--from", "verl", *_script(VERL_R2), "-o", str(out)]) == 0
    written = load_config(str(out))
    assert (written.actor.expert_parallel_size, written.trainer.checkpoint_format) == (8, "auto")


@pytest.mark.parametrize("etp,why", [("2", "expert tensor parallel 2"), ("null", "expert tensor parallel 2")])
def test_verl_expert_tensor_parallel_other_than_one_is_not_built(etp, why):
    """ETP 2, and null under TP 2 (Megatron takes the tensor-parallel size): a decision, experts whole (ETP 1)."""
    r = _verl(A + "strategy=megatron", f"{MG}tensor_model_parallel_size=2", f"{MG}expert_model_parallel_size=4",
              f"{MG}expert_tensor_parallel_size={etp}")
    row = r.row(MG + "expert_tensor_parallel_size")
    assert row.status == "decide" and why in row.note and "not built" in row.note
    assert r.get("actor.expert_tensor_parallel_size") is None and r.get("actor.expert_parallel_size") == 4
    _passes(r)


def test_verl_expert_parallel_one_and_fsdp():
    dense = _verl(A + "strategy=megatron", f"{MG}tensor_model_parallel_size=2", f"{MG}expert_model_parallel_size=1")
    assert dense.row(MG + "expert_model_parallel_size").status == "ignored"
    assert dense.get("actor.tensor_parallel_size") == 2  # a dense model keeps its tensor parallelism
    fsdp = _verl(A + "strategy=fsdp", f"{MG}expert_model_parallel_size=8")
    row = fsdp.row(MG + "expert_model_parallel_size")
    assert row.status == "ignored" and "Megatron workers only" in row.note
    assert fsdp.get("actor.expert_parallel_size") is None


def test_verl_expert_parallel_inside_pipeline_stages_needs_a_decision():
    r = _verl(*EP8, f"{MG}pipeline_model_parallel_size=2", R + "name=sglang", R + "tensor_model_parallel_size=1")
    row = r.row(MG + "expert_model_parallel_size")
    assert row.status == "decide" and "inside 2 pipeline stages" in row.note
    assert r.get("actor.expert_parallel_size") is None and r.get("actor.pipeline_parallel_size") == 2
    _passes(r, moe=False)


@pytest.mark.parametrize("mode,engine,written,status", [
    ("R2", "vllm", "R2", "translated"), ("r2", "vllm", "R2", "translated"), ("R3", "sglang", "R3", "translated"),
    ("R3", "vllm", "R2", "decide"), ("disabled", "vllm", None, "ignored")])
def test_verl_router_replay_modes(mode, engine, written, status):
    """disabled / R2 / R3 are verirl's off / R2 / R3; R3 on verirl's native engine (veRL's sglang), R2 written for
    vLLM, whose routed experts verirl does not read."""
    r = _verl(*EP8, A + f"router_replay.mode={mode}", R + f"name={engine}", R + "tensor_model_parallel_size=1",
              R + f"enable_rollout_routing_replay={mode == 'R3'}")
    row = r.row(A + "router_replay.mode")
    assert row.status == status and r.get("algo.router_replay") == written
    if (mode, engine) == ("R3", "vllm"):
        assert "returns none" in row.note
    if mode == "R3":
        assert r.row(R + "enable_rollout_routing_replay").status in ("translated", "decide")
    _passes(r)


def test_verl_r3_without_the_rollouts_routes_needs_a_decision():
    r = _verl(*EP8, A + "router_replay.mode=R3", R + "name=sglang", R + "tensor_model_parallel_size=1")
    assert r.row(R + "enable_rollout_routing_replay").status == "decide"


def test_verl_rollout_expert_parallel_is_placement():
    r = _verl(*EP8, R + "expert_parallel_size=4")
    row = r.row(R + "expert_parallel_size")
    assert row.status == "ignored" and "every expert gathered" in row.note


def test_verl_aux_loss_coefficient():
    """Megatron's moe_aux_loss_coeff is algo.moe_aux_loss_coef (with the per-layer vs pooled scale as a decision);
    load balancing none is off; model.override_config's router_aux_loss_coef reaches no loss in veRL's FSDP actor."""
    r = _verl(*EP8, f"+{OTC}moe_aux_loss_coeff=0.01")
    row = r.row(OTC + "moe_aux_loss_coeff")
    assert row.status == "decide" and r.get("algo.moe_aux_loss_coef") == 0.01 and "x L / k" in row.note
    assert _passes(r).algo.moe_aux_loss_coef == 0.01
    off = _verl(*EP8, f"+{OTC}moe_aux_loss_coeff=0.01", f"+{OTC}moe_router_load_balancing_type=none")
    assert off.row(OTC + "moe_aux_loss_coeff").status == "ignored" and off.get("algo.moe_aux_loss_coef") is None
    seq = _verl(*EP8, f"+{OTC}moe_aux_loss_coeff=0.01", f"+{OTC}moe_router_load_balancing_type=seq_aux_loss")
    assert seq.row(OTC + "moe_router_load_balancing_type").status == "decide"
    hf = _verl("+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.001")
    assert "adds no router loss" in hf.row("actor_rollout_ref.model.override_config.router_aux_loss_coef").note
    assert hf.get("algo.moe_aux_loss_coef") is None


def test_verl_grouped_gemm_is_verirls():
    r = _verl(*EP8, f"+{OTC}moe_grouped_gemm=True")
    row = r.row(OTC + "moe_grouped_gemm")
    assert row.status == "ignored" and "grouped product" in row.note


# ---------------------------------------------------------------- MindSpeed-RL

def test_mindspeed_qwen3_moe_recipe(tmp_path):
    """Qwen3-30B-A3B's DAPO on 16 NPUs: TP 4 x EP 2 with moe_tp_extend_ep (experts over the 8 ranks, each whole) is
    verirl's EP 8 without tensor parallelism; moe_grouped_gemm confirms verirl's grouped product; moe_aux_loss_coeff
    0.001 over 48 layers, top-8, is written with the scale (0.006 per router); the shape and the dispatcher ignored."""
    r = convert("mindspeed-rl", MS_QWEN3_MOE)
    assert [x.key for x in r.by_status("unknown")] == []
    assert (r.get("actor.expert_parallel_size"), r.get("actor.tensor_parallel_size"), r.get("trainer.nproc_per_node"),
            r.get("trainer.checkpoint_format")) == (8, 1, 8, None)
    extend = r.row(AC + "moe_tp_extend_ep")
    assert extend.status == "translated" and "tensor parallel 4 x expert parallel 2 = 8" in extend.note
    assert r.row(AC + "expert_model_parallel_size").status == "translated"
    assert r.row(AC + "tensor_model_parallel_size").status == "decide"
    assert r.row(MOE_MODEL + "moe_grouped_gemm").status == "translated"
    aux = r.row(MOE_MODEL + "moe_aux_loss_coeff")
    assert aux.status == "decide" and r.get("algo.moe_aux_loss_coef") == 0.001 and "0.001 x 48 / 8 = 0.006" in aux.note
    assert r.row(MOE_MODEL + "moe_router_load_balancing_type").status == "translated"
    for leaf, word in (("num_experts", "shape"), ("moe_router_topk", "shape"), ("moe_token_dispatcher_type", "all-to-all"),
                       ("moe_permutation_async_comm", "scheduling")):
        row = r.row(MOE_MODEL + leaf)
        assert row.status == "ignored" and word in row.note and "does not use" not in row.note, leaf
    assert r.row("megatron_training.moe_alltoall_overlap_comm").status == "ignored"
    for key in ("generate_config.infer_expert_parallel_size", "generate_config.enable_expert_parallel"):
        assert "every expert gathered" in r.row(key).note
    cfg = _passes(r)
    assert cfg.algo.moe_aux_loss_coef == 0.001
    out = tmp_path / "moe.yaml"
    assert main(["convert-config", "--from", "mindspeed-rl", MS_QWEN3_MOE, "-o", str(out)]) == 0
    assert load_config(str(out)).actor.expert_parallel_size == 8


def test_mindspeed_expert_parallel_without_tp_extension():
    """moe_tp_extend_ep false: the experts over EP 2 only, each cut over TP 4 (Megatron's unset expert tensor
    parallel is the tensor size), which verirl does not build: a decision, experts whole."""
    r = convert("mindspeed-rl", MS_QWEN3_MOE, [AC + "moe_tp_extend_ep=false"])
    assert r.get("actor.expert_parallel_size") == 2 and r.row(AC + "moe_tp_extend_ep").status == "ignored"
    etp = r.row(AC + "expert_tensor_parallel_size")
    assert etp.status == "decide" and "expert tensor parallel 4" in etp.note
    _passes(r)


def test_mindspeed_moe_switches():
    loop = convert("mindspeed-rl", MS_QWEN3_MOE, [MOE_MODEL + "moe_grouped_gemm=false"])
    row = loop.row(MOE_MODEL + "moe_grouped_gemm")
    assert row.status == "ignored" and "the same maths" in row.note
    off = convert("mindspeed-rl", MS_QWEN3_MOE, [MOE_MODEL + "moe_router_load_balancing_type=none"])
    assert off.get("algo.moe_aux_loss_coef") is None and off.row(MOE_MODEL + "moe_aux_loss_coeff").status == "ignored"
    seq = convert("mindspeed-rl", MS_QWEN3_MOE, [MOE_MODEL + "moe_router_load_balancing_type=seq_aux_loss"])
    assert seq.row(MOE_MODEL + "moe_router_load_balancing_type").status == "decide"
    wins = convert("mindspeed-rl", MS_QWEN3_MOE, ["+" + AC + "moe_aux_loss_coeff=0.002"])
    assert wins.get("algo.moe_aux_loss_coef") == 0.002
    assert "actor_config.moe_aux_loss_coeff wins" in wins.row(MOE_MODEL + "moe_aux_loss_coeff").note
