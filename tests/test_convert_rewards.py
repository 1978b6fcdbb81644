"""`verirl convert-config` on the peers' reward keys: veRL's reward model, SandboxFusion client, reward managers and
on-policy distillation, MindSpeed-RL's reward model; each from a real peer file (tests/fixtures/convert/, cited at
the top of each) or an override of one, the verirl keys written, the converted YAML loading and passing verirl's
checks, and the unmapped keys' rows saying why."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from verirl.cli import main
from verirl.config import load_config, load_config_dict
from verirl.run.checks import check
from verirl.tools.align.convert import convert

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "convert"
VERL_HEAD = str(FIXTURES / "verl_generated_ppo_trainer_head.yaml")
RM_SCRIPT = FIXTURES / "verl_grpo_skyworkrm_fsdp.sh"
SANDBOX_SCRIPT = FIXTURES / "verl_ppo_deepseek7b_sandbox_fusion.sh"
OPD_SCRIPT = FIXTURES / "verl_opd_qwen3_8b_fsdp.sh"
MS_RM = str(FIXTURES / "mindspeed_grpo_rm_qwen25_7b_pre2.yaml")
MS_GRPO = str(Path(__file__).resolve().parents[1] / "examples" / "mindspeed_rl_grpo_qwen25_7b.yaml")
R, DL, RL = "actor_rollout_ref.rollout.", "distillation.distillation_loss.", "rl_config."
GRPO = ["algorithm.adv_estimator=grpo", R + "n=4", "trainer.total_training_steps=10"]


def script(path: Path) -> list[str]:
    """The key=value overrides a veRL run script passes to verl.trainer.main_ppo."""
    words = shlex.split(path.read_text(), comments=True)
    return [w for w in words[words.index("verl.trainer.main_ppo") + 1:] if "=" in w]


def _head(*overrides: str):
    return convert("verl", VERL_HEAD, [*GRPO, *overrides])


def _passes_checks(fmt: str, source, overrides, tmp_path) -> None:
    """The written YAML loads and passes verirl's checks of names and values."""
    out = tmp_path / "out.yaml"
    assert main(["convert-config", "--from", fmt, *([str(source)] if source else []), *overrides, "-o", str(out)]) == 0
    check(load_config(str(out)), paths=False)


# ---------------------------------------------------------------- veRL: a reward model

def test_verl_reward_model_script_is_the_model_rule(tmp_path):
    r = convert("verl", None, [*script(RM_SCRIPT), "trainer.total_training_steps=10"])
    assert r.get("reward.verifiers") == ["model"] and r.get("reward.weights") == [1.0]
    assert r.get("reward.model") == {"path": "Skywork/Skywork-Reward-Llama-3.1-8B", "max_token_len": 8192,
                                     "dtype": "bfloat16"}
    assert r.row("reward.reward_model.enable").status == "translated"
    assert r.row("reward.reward_model.model_path").targets == ["reward.model.path"]
    row = r.row("reward.reward_model.rollout.tensor_model_parallel_size")
    assert row.status == "ignored" and "in the trainer's process" in row.note
    assert "data.reward_fn_key" not in [x.key for x in r.by_status("decide")]  # the reward model scores every one
    assert [x.key for x in r.by_status("unknown")] == []
    _passes_checks("verl", None, [*script(RM_SCRIPT), "trainer.total_training_steps=10"], tmp_path)


@pytest.mark.parametrize("overrides,budget,source", [
    (["+reward_model.micro_batch_size_per_gpu=4"], 4 * (512 + 512), "reward_model.micro_batch_size_per_gpu"),
    (["+reward_model.use_dynamic_bsz=true", "+reward_model.forward_max_token_len_per_gpu=16384"], 16384,
     "reward_model.forward_max_token_len_per_gpu"),
    (["+reward_model.use_dynamic_bsz=true", "+reward_model.forward_max_token_len_per_gpu=600"], 1024,
     "reward_model.forward_max_token_len_per_gpu")])  # under prompt + response: raised to it
def test_verl_reward_model_worker_budget(overrides, budget, source):
    """veRL's reward-model worker before the reward loop (volcengine/verl b178a3cd's reward_model section)."""
    r = _head("reward_model.enable=true", "+reward_model.model.path=/models/rm", "+reward_model.use_reward_loop=false",
              *overrides)
    assert r.get("reward.model.path") == "/models/rm" and r.get("reward.verifiers") == ["model"]
    assert r.get("reward.model.max_token_len") == budget and r.row(source).targets == ["reward.model.max_token_len"]
    assert r.row("reward.reward_model.enable").note == "veRL copies reward_model.enable over it"


def test_verl_reward_model_input_cut_needs_a_decision():
    r = _head("reward_model.enable=true", "+reward_model.model.path=/m", "+reward_model.use_reward_loop=false",
              "+reward_model.max_length=256")
    assert r.row("reward_model.max_length").status == "decide" and "whole sequences" in r.row("reward_model.max_length").note


def test_verl_generative_reward_model_is_a_judge_decision():
    r = _head("reward.custom_reward_function.path=/r/genrm.py", "reward.reward_model.enable=true",
              "reward.reward_model.model_path=/m/genrm")
    assert r.get("reward.verifiers") == ["/r/genrm.py:compute_score"] and r.get("reward.model") is None
    row = r.row("reward.reward_model.model_path")
    assert row.status == "decide" and "reward.judge.url" in row.note and "'judge'" in row.note


def test_verl_reward_model_without_a_path_needs_a_decision():
    r = _head("reward.reward_model.enable=true")
    assert r.row("reward.reward_model.enable").status == "decide" and r.get("reward.model") is None


# ---------------------------------------------------------------- veRL: SandboxFusion -> the code rule

def test_verl_sandbox_fusion_script_is_the_code_rule(tmp_path):
    overrides = [*script(SANDBOX_SCRIPT), "algorithm.adv_estimator=grpo", R + "n=4", "trainer.total_training_steps=10"]
    r = convert("verl", None, overrides)
    assert r.get("reward.verifiers") == ["code"] and r.get("reward.weights") == [1.0]
    assert r.get("reward.code") == {"mode": "fraction", "max_tests": 10, "test_timeout_s": 10.0, "extract": "block",
                                    "memory_mb": 1024, "concurrency": 128}
    url = r.row("reward_model.sandbox_fusion.url")
    assert url.status == "translated" and "not a SandboxFusion server: the URL is not used" in url.note
    assert r.row("reward_model.sandbox_fusion.max_concurrent").targets == ["reward.code.concurrency"]
    assert r.row("reward_model.reward_manager").status == "translated" and r.get("reward.timeout") == 300.0  # prime
    assert r.row("data.reward_fn_key").status == "decide"  # the other data sources' rules
    assert [x.key for x in r.by_status("unknown")] == []
    _passes_checks("verl", None, overrides, tmp_path)


@pytest.mark.parametrize("section", ["sandbox_fusion", "reward_model.sandbox_fusion", "reward.sandbox_fusion"])
def test_verl_sandbox_sections(section):
    r = _head(f"+{section}.url=http://sandbox:8080/run_code", f"+{section}.memory_limit_mb=2048",
              f"+{section}.max_concurrent=8")
    assert r.get("reward.code.memory_mb") == 2048 and r.get("reward.code.concurrency") == 8
    assert r.row(f"{section}.memory_limit_mb").targets == ["reward.code.memory_mb"]


def test_verl_sandbox_unused_beside_a_reward_function():
    r = _head("reward.custom_reward_function.path=/r/score.py", "+reward.sandbox_fusion.url=http://s/run_code")
    assert r.get("reward.verifiers") == ["/r/score.py:compute_score"] and r.get("reward.code") is None
    row = r.row("reward.sandbox_fusion.url")
    assert row.status == "ignored" and "default reward only" in row.note


# ---------------------------------------------------------------- veRL: reward managers

@pytest.mark.parametrize("name,status", [("naive", "translated"), ("prime", "translated"), ("remote", "translated"),
                                         ("batch", "translated"), ("gdpo", "translated"), ("dapo", "translated"),
                                         ("limited", "decide"), ("my_manager", "decide")])
def test_verl_reward_managers(name, status):
    r = _head(f"reward.reward_manager.name={name}", "reward.custom_reward_function.path=/r/score.py")
    row = r.row("reward.reward_manager.name")
    assert row.status == status and row.note
    assert (r.get("reward.timeout") == 300.0) == (name == "prime")
    wrapper = r.row("reward.custom_reward_function.path").note
    assert ("def rule(responses," in wrapper) == (name == "batch")  # the batch manager passes lists


# ---------------------------------------------------------------- veRL: on-policy distillation

def test_verl_distillation_script_is_algo_distill(tmp_path):
    overrides = [*script(OPD_SCRIPT), R + "n=4", "trainer.total_training_steps=10"]
    r = convert("verl", None, overrides)
    assert r.get("algo.distill") == {"teacher": "Qwen/Qwen3-32B", "rewards": False, "coef": 1.0}
    assert r.row(DL + "loss_mode").status == "translated" and r.row(DL + "use_policy_gradient").status == "translated"
    assert r.row(DL + "use_task_rewards").targets == ["algo.distill.rewards", "algo.distill.coef"]
    assert r.row(DL + "loss_max_clamp").status == "decide"  # veRL clamps, verirl does not
    assert r.row(DL + "log_prob_min_clamp").status == "ignored"  # top-k mode only
    assert r.row("distillation.teacher_models.teacher_model.inference.name").status == "ignored"
    assert [x.key for x in r.by_status("unknown")] == []
    _passes_checks("verl", None, overrides, tmp_path)


def test_verl_distillation_with_task_rewards_weighs_by_coef():
    r = _head("distillation.enabled=true", "+distillation.teacher_models.teacher_model.model_path=/t",
              DL + "use_policy_gradient=true", DL + "loss_mode=k1", DL + "distillation_loss_coef=0.5")
    assert r.get("algo.distill") == {"teacher": "/t", "rewards": True, "coef": 0.5}
    assert r.row("distillation.enabled").status == "translated" and not r.by_status("unknown")


@pytest.mark.parametrize("overrides,key", [
    ([], DL + "use_policy_gradient"),  # veRL's default: the k3 estimate back-propagated as a loss
    ([DL + "use_policy_gradient=true", DL + "loss_mode=k3"], DL + "loss_mode"),
    ([DL + "use_policy_gradient=true", DL + "loss_mode=k1", DL + "clip_ratio_high=0.28"], DL + "clip_ratio_high"),
    ([DL + "use_policy_gradient=true", DL + "loss_mode=k1", DL + "policy_loss_mode=gspo"], DL + "policy_loss_mode")])
def test_verl_distillation_forms_verirl_lacks_need_a_decision(overrides, key):
    r = _head("distillation.enabled=true", "+distillation.teacher_models.teacher_model.model_path=/t", *overrides)
    assert r.row(key).status == "decide" and r.get("algo.distill.teacher") == "/t"


def test_verl_several_teachers_need_a_decision():
    r = _head("distillation.enabled=true", "+distillation.teacher_models.math.model_path=/t1",
              "+distillation.teacher_models.code.model_path=/t2")
    assert r.row("distillation.enabled").status == "decide" and r.get("algo.distill.teacher") is None


# ---------------------------------------------------------------- MindSpeed-RL: a reward model

def test_mindspeed_reward_model_file_is_the_model_rule(tmp_path):
    r = convert("mindspeed-rl", MS_RM)
    assert r.get("reward.verifiers") == ["model"] and r.get("reward.weights") == [1.0]
    assert r.get("reward.model") == {"path": "./ckpt", "max_token_len": 512}  # micro-batch 1 x (256 + 256)
    assert r.row("reward_config.load").status == "decide" and "Megatron weights" in r.row("reward_config.load").note
    assert r.row(RL + "rule_reward").status == "translated"
    assert r.row("reward_config.tensor_model_parallel_size").status == "ignored"
    assert [x.key for x in r.by_status("unknown")] == []
    load_config_dict(r.config)
    _passes_checks("mindspeed-rl", MS_RM, [], tmp_path)


def test_mindspeed_rules_beside_a_reward_model_need_a_decision():
    r = convert("mindspeed-rl", MS_RM, [f"{RL}rule_reward=true", f"{RL}verifier_function=[base_acc]",
                                        f"{RL}verifier_weight=[1.0]", "+reward_config.tokenizer_name_or_path=/rm",
                                        f"{RL}use_dynamic_bsz=true", f"+{RL}ref_max_packing_token_size=2048"])
    assert r.get("reward.verifiers") == ["base_acc", "model"] and r.get("reward.weights") == [1.0, 1.0]
    assert r.row(RL + "rule_reward").status == "decide"
    assert r.get("reward.model.path") == "/rm" and r.row("reward_config.tokenizer_name_or_path").status == "translated"
    assert r.get("reward.model.max_token_len") == 2048


def test_mindspeed_reward_model_with_the_integrated_worker_is_refused():
    r = convert("mindspeed-rl", MS_GRPO, [f"+{RL}reward_resource.num_npus=2"])  # 2.x: integrated worker by default
    assert r.row(RL + "use_integrated_worker").status == "decide" and r.get("reward.model") is None
    assert r.get("reward.verifiers") == ["base_acc", "format"]
