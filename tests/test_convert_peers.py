"""`verirl convert-config` on the peers' own files (tests/fixtures/convert/: excerpts of veRL at 1dda039b,
verl-recipe at 48ea0a79 and MindSpeed-RL at 05a90d77, veRL's multi-turn examples at volcengine/verl b178a3cd, cited
at the top of each): every key classified, none unknown, the values the peers compute with, and the notes true to
the file."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verirl.tools.align.convert import convert
from verirl.cli import main
from verirl.config import load_config_dict
from verirl.core.errors import ConfigError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "convert"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
VERL_HEAD = str(FIXTURES / "verl_generated_ppo_trainer_head.yaml")
DAPO_RECIPE = str(FIXTURES / "verl_recipe_dapo_trainer.yaml")
MS_LORA = str(FIXTURES / "mindspeed_grpo_lora_qwen25_32b_A2.yaml")
MS_DAPO = str(FIXTURES / "mindspeed_dapo_qwen25_32b_A3.yaml")
MS_R1 = str(FIXTURES / "mindspeed_grpo_deepseek_r1_671b_A2.yaml")
MS_MULTI_TURN = str(FIXTURES / "mindspeed_dapo_qwen25_7b_A2_multi_turn.yaml")
MS_COMPOSED = str(FIXTURES / "mindspeed_grpo_qwen25_7b_A3_composed.yaml")
VERL_GSM8K = str(FIXTURES / "verl_gsm8k_multiturn_grpo.yaml")
VERL_INTERACTION = str(FIXTURES / "verl_gsm8k_multiturn_grpo_w_interaction.yaml")
GSM8K_TOOLS = str(FIXTURES / "verl_gsm8k_tool_config.yaml")
VERL_FUNCTION_TOOLS = str(FIXTURES / "verl_function_tool_examples.py")
SANDBOX_TOOLS = str(FIXTURES / "verl_sandbox_fusion_tool_config.yaml")
SEARCH_TOOLS = str(FIXTURES / "verl_search_tool_config.yaml")
MS_RETOOL = str(FIXTURES / "mindspeed_retool_config.yaml")
A, R, RL = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "rl_config."
# what veRL's generated config leaves to the run script (its example scripts set these for GRPO)
GRPO = ["algorithm.adv_estimator=grpo", R + "n=4", "trainer.total_training_steps=10"]


def _verl_head(*overrides: str):
    return convert("verl", VERL_HEAD, [*GRPO, *overrides])


@pytest.mark.parametrize("fmt,path,overrides", [
    ("verl", VERL_HEAD, GRPO), ("verl", DAPO_RECIPE, GRPO), ("verl", VERL_GSM8K, GRPO), ("verl", VERL_INTERACTION, GRPO),
    ("mindspeed-rl", MS_LORA, []), ("mindspeed-rl", MS_DAPO, []), ("mindspeed-rl", MS_R1, []),
    ("mindspeed-rl", MS_MULTI_TURN, []), ("mindspeed-rl", MS_COMPOSED, [])])
def test_peer_files_convert_with_no_unknown_key(fmt, path, overrides):
    result = convert(fmt, path, overrides)
    assert [r.key for r in result.by_status("unknown")] == []
    load_config_dict(result.config)


def test_verl_null_gen_batch_size_is_train_batch_size():
    result = _verl_head()
    row = result.row("data.gen_batch_size")
    assert row.value is None and row.status == "translated" and "train_batch_size" in row.note
    assert result.get("data.prompts_per_step") == 1024


def test_verl_dapo_recipe_interpolation_resolves_over_verl_defaults():
    result = convert("verl", DAPO_RECIPE, GRPO)
    assert result.row("data.gen_batch_size").value == 1024  # ${data.train_batch_size}: veRL's default
    result = convert("verl", DAPO_RECIPE, [*GRPO, "data.train_batch_size=64", A + "ppo_mini_batch_size=32"])
    assert result.row("data.gen_batch_size").value == 64
    assert result.row("data.gen_batch_size").status == "translated"


def test_verl_reward_section_of_veRL_head():
    result = _verl_head("reward.custom_reward_function.path=/rules/score.py",
                        "reward.custom_reward_function.name=my_score")
    assert result.get("reward.verifiers") == ["/rules/score.py:my_score"]
    assert result.row("reward.custom_reward_function.path").status == "decide"
    assert result.row("custom_reward_function.path").status == "ignored"  # the top-level section is null
    legacy = _verl_head("custom_reward_function.path=/old/score.py")  # veRL copies a set top-level section over
    assert legacy.get("reward.verifiers") == ["/old/score.py:compute_score"]
    assert legacy.row("reward.custom_reward_function.path").status == "ignored"


@pytest.mark.parametrize("key", ["trainer.v1.separate_async.num_warmup_batches", "distillation.enabled",
                                 "distillation.distillation_loss.loss_mode", R + "seed", R + "mtp", R + "qat",
                                 R + "disaggregation.enabled", A + "optim.zero_indexed_step", "skip.rollout.enable",
                                 A + "qat.enable", "reward.reward_model.enable", "reward.num_workers"])
def test_verl_head_keys_have_their_row(key):
    row = _verl_head().row(key)
    assert row.status == "ignored" and row.note


@pytest.mark.parametrize("switch", ["distillation.enabled", "skip.rollout.enable", A + "qat.enable"])
def test_verl_switch_on_needs_a_decision(switch):
    assert _verl_head(f"{switch}=true").row(switch).status == "decide"


def test_verl_v1_trainer_sync_is_verirls_and_colocate_async_needs_a_decision():
    assert _verl_head().row("trainer.use_v1").status == "translated"  # veRL's head: use_v1 true, sync mode
    assert _verl_head().get("rollout.placement") is None
    colocated = _verl_head("trainer.v1.trainer_mode=colocate_async")
    row = colocated.row("trainer.v1.trainer_mode")
    assert row.status == "decide" and "rollout.placement=separate" in row.note
    assert colocated.get("trainer.async_training") is None  # verirl trains it synchronously


# ---------------------------------------------------------------- veRL's asynchronous trainers

# verl-project/verl at 1dda039b, verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml (Apache-2.0),
# its keys and values without the comments
FULLY_ASYNC_YAML = """\
hydra:
  searchpath:
    - pkg://verl.trainer.config
defaults:
  - ppo_trainer
  - _self_
async_training:
  staleness_threshold: 0.1
  trigger_parameter_sync_step: 4
  require_batches: 1
  partial_rollout: True
  use_trainer_do_validate: False
  use_dynamic_resource_scheduling: False
  dynamic_schedule_policy: "default"
  dynamic_schedule_deactivate_ratio: 0.3
  dynamic_schedule_enable_rebalance: True
  concurrent_samples_per_replica: 16
rollout:
  nnodes: 1
  n_gpus_per_node: 8
  n: 4
  total_rollout_steps: 100
data:
  gen_batch_size: 1
actor_rollout_ref:
  rollout:
    calculate_log_probs: True
    standalone_gpu_memory_utilization: null
    checkpoint_engine:
      backend: "nccl"
  actor:
    use_rollout_log_probs: True
  model:
    use_remove_padding: True
algorithm:
  rollout_correction:
    bypass_mode: True
"""
# what verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh (the same commit) hands to fully_async_main
# about the step, the devices and the schedule (its shell variables expanded)
FULLY_ASYNC_4_4 = [
    "data.train_files=/data/dapo-math-17k.parquet", "data.max_prompt_length=2048", "data.max_response_length=8192",
    "data.train_batch_size=0", "data.gen_batch_size=1", R + "n=16", "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.hybrid_engine=False", A + "optim.lr_warmup_steps=10", A + "ppo_mini_batch_size=32",
    R + "tensor_model_parallel_size=1", R + "temperature=1.0", R + "calculate_log_probs=True", R + "name=vllm",
    R + "mode=async", "trainer.save_freq=-1", "trainer.nnodes=1", "trainer.n_gpus_per_node=4", "rollout.nnodes=1",
    "rollout.n_gpus_per_node=4", "rollout.total_rollout_steps=51200", "trainer.total_epochs=10",
    "trainer.test_freq=10", "async_training.staleness_threshold=0.1", "async_training.trigger_parameter_sync_step=4",
    "async_training.require_batches=4", "async_training.partial_rollout=True"]
AT, V1S = "async_training.", "trainer.v1.sampler."


@pytest.fixture
def fully_async(tmp_path):
    path = tmp_path / "fully_async_ppo_trainer.yaml"
    path.write_text(FULLY_ASYNC_YAML)
    return str(path)


def _stale(result) -> tuple:
    a = result.get("trainer.async_training")
    return a["max_staleness"], a["mode"], a.get("sync_every", 1)


def test_verl_fully_async_recipe_becomes_producers_beside_the_trainers(fully_async):
    """The 4+4 GPU DAPO run: 4 rollout GPUs are 4 producers beside 4 trainers; an update of require_batches x
    ppo_mini_batch_size = 128 prompts is one verirl step; int(128 x 1.1 x 4) = 563 prompts of one version may be out,
    the last trained by the 5th update after it: max_staleness 4 (whole updates, rounded up), weights every 4."""
    result = convert("verl", fully_async, FULLY_ASYNC_4_4)
    assert [r.key for r in result.by_status("unknown")] == []
    assert (result.get("rollout.placement"), result.get("rollout.nproc"), result.get("trainer.nproc_per_node")) == (
        "separate", 4, 8)
    assert (result.get("data.prompts_per_step"), result.get("actor.mini_batch_prompts")) == (128, 32)
    assert _stale(result) == (4, "bounded", 4)
    row = result.row(AT + "staleness_threshold")
    assert row.status == "translated" and "int(128 x 1.1 x 4) = 563" in row.note and "rounded up" in row.note
    assert result.row(AT + "trigger_parameter_sync_step").targets[:2] == ["trainer.async_training.max_staleness",
                                                                           "trainer.async_training.sync_every"]
    assert result.row("rollout.n_gpus_per_node").targets[:2] == ["rollout.nproc", "trainer.nproc_per_node"]
    assert result.row("data.train_batch_size").status == "translated"  # 0: the update is require_batches x mini
    assert result.row("rollout.n").status == "ignored"  # the samples per prompt are actor_rollout_ref.rollout.n
    # 51200 prompts / 128 an update; validation every 10 versions of 4 updates; warm-up 10 updates x 4 mini-batches
    assert (result.get("trainer.total_steps"), result.get("eval.every"), result.get("actor.warmup_steps")) == (
        400, 40, 40)
    # vLLM decodes each call to its end: no partial rollouts in verirl, false written
    partial = result.row(AT + "partial_rollout")
    assert partial.status == "decide" and "rollout.engine=vllm" in partial.note
    assert result.get("trainer.async_training")["partial_rollout"] is False
    # veRL's recipe corrects nothing but its bypass-mode clip; verirl needs a correction for stale samples
    assert result.get("algo.rollout_correction.rollout_rs") == "sequence"
    assert result.row("algorithm.rollout_correction.rollout_rs").status == "decide"
    cfg = load_config_dict(result.config)
    assert (cfg.rollout.placement, cfg.rollout.nproc, cfg.trainer.nproc_per_node) == ("separate", 4, 8)
    a = cfg.trainer.async_training
    assert (a.max_staleness, a.mode, a.sync_every, a.partial_rollout) == (4, "bounded", 4, False)


def test_verl_fully_async_partial_rollout_on_verirls_native_engine(fully_async):
    result = convert("verl", fully_async, [*FULLY_ASYNC_4_4, R + "name=sglang"])
    assert result.row(AT + "partial_rollout").status == "translated"
    assert load_config_dict(result.config).trainer.async_training.partial_rollout is True


@pytest.mark.parametrize("staleness,sync,batches,expected", [
    (0, 1, 1, (0, "fixed", 1)),  # veRL's on-policy pipeline: verirl's synchronous step
    (0, 4, 1, (3, "bounded", 4)),  # stream off-policy: the 4th update of a version trains on its samples
    (0.5, 4, 4, (5, "bounded", 4)),  # int(128 x 1.5 x 4) = 768 prompts, the last in the 6th update
    (1, 1, 1, (1, "bounded", 1)),  # staleness 1, sync every update: one step off
    (0.1, 1, 1, (1, "bounded", 1)),  # int(32 x 1.1) = 35 prompts: 3 of them in the 2nd update
])
def test_verl_fully_async_staleness_is_whole_updates(fully_async, staleness, sync, batches, expected):
    result = convert("verl", fully_async, [*FULLY_ASYNC_4_4, R + "name=sglang", f"{AT}staleness_threshold={staleness}",
                                           f"{AT}trigger_parameter_sync_step={sync}", f"{AT}require_batches={batches}"])
    assert _stale(result) == expected
    a = load_config_dict(result.config).trainer.async_training
    assert (a.max_staleness, a.mode, a.sync_every) == expected
    if staleness == 0:  # nothing is in flight when the weights arrive
        assert result.row(AT + "partial_rollout").status == "ignored" and not a.partial_rollout


def test_verl_fully_async_keys_of_january_2026(fully_async):
    """volcengine/verl b178a3cd's recipe: rollout.test_freq, async_training.use_rollout_log_probs (the rollout's
    log-probs as the old policy's unless compute_prox_log_prob), checkpoint_engine."""
    result = convert("verl", fully_async, [*FULLY_ASYNC_4_4, "rollout.test_freq=5", f"+{AT}use_rollout_log_probs=True",
                                           f"+{AT}compute_prox_log_prob=False", f"+{AT}checkpoint_engine.enable=True"])
    assert [r.key for r in result.by_status("unknown")] == []
    assert result.get("eval.every") == 20 and result.row("trainer.test_freq").status == "ignored"
    assert result.row(AT + "use_rollout_log_probs").status == "decide"
    prox = convert("verl", fully_async, [*FULLY_ASYNC_4_4, f"+{AT}use_rollout_log_probs=True",
                                         f"+{AT}compute_prox_log_prob=True"])
    assert prox.row(AT + "use_rollout_log_probs").status == "translated"


def test_verl_fully_async_needs_one_machine(fully_async):
    result = convert("verl", fully_async, [*FULLY_ASYNC_4_4, "trainer.nnodes=2", "rollout.nnodes=2",
                                           "trainer.n_gpus_per_node=8", "rollout.n_gpus_per_node=8"])
    row = result.row("trainer.nnodes")
    assert row.status == "decide" and "one machine" in row.note
    assert (result.get("rollout.nproc"), result.get("trainer.nproc_per_node")) == (16, 32)
    assert load_config_dict(result.config).trainer.nnodes == 1


# verl-project/verl at 1dda039b, verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml (Apache-2.0)
ONE_STEP_OFF_YAML = """\
hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_trainer
  - _self_
rollout:
  nnodes: 1
  n_gpus_per_node: 8
actor_rollout_ref:
  rollout:
    free_cache_engine: False
    calculate_log_probs: True
    checkpoint_engine:
      backend: "nccl"
algorithm:
  rollout_correction:
    bypass_mode: True
"""
# verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh (the same commit): 6 trainer, 2 rollout GPUs
ONE_STEP_OFF_2_6 = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=1152", "data.max_prompt_length=512",
    "data.max_response_length=1024", "actor_rollout_ref.hybrid_engine=False", A + "ppo_mini_batch_size=192",
    A + "ppo_micro_batch_size_per_gpu=32", R + "tensor_model_parallel_size=2", R + "name=vllm", R + "n=5",
    "trainer.save_freq=-1", "trainer.test_freq=5", "trainer.total_epochs=2", "trainer.nnodes=1",
    "trainer.n_gpus_per_node=6", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"]


def test_verl_one_step_off_recipe_is_fixed_staleness_one(tmp_path):
    """Step s trains on the batch sampled while step s - 1 trained, from the weights after s - 2 updates: verirl's
    fixed mode with max_staleness 1 (version max(0, s - 2))."""
    path = tmp_path / "one_step_off_ppo_trainer.yaml"
    path.write_text(ONE_STEP_OFF_YAML)
    result = convert("verl", str(path), ONE_STEP_OFF_2_6, train_rows=7473)
    assert [r.key for r in result.by_status("unknown")] == []
    assert _stale(result) == (1, "fixed", 1)
    assert (result.get("rollout.placement"), result.get("rollout.nproc"), result.get("trainer.nproc_per_node")) == (
        "separate", 2, 8)
    assert result.row("actor_rollout_ref.hybrid_engine").status == "translated"
    # a producer decodes with the whole weights: veRL's rollout tensor parallelism 2 becomes 1, a decision
    assert result.get("rollout.tensor_parallel_size") == 1
    assert result.row(R + "tensor_model_parallel_size").status == "decide"
    cfg = load_config_dict(result.config)
    assert (cfg.trainer.async_training.max_staleness, cfg.rollout.nproc, cfg.rollout.tensor_parallel_size) == (1, 2, 1)


def test_verl_v1_separate_async_of_its_guide():
    """docs/advance/v1_async_trainer.md's example: 2 trainer and 2 rollout nodes of 8 GPUs, train_batch_size 64 =
    parameter_sync_step 4 x ppo_mini_batch_size 16; groups spanning at most max_off_policy_threshold 8 versions."""
    result = _verl_head("trainer.use_v1=True", "trainer.v1.trainer_mode=separate_async", "trainer.nnodes=2",
                        "trainer.n_gpus_per_node=8", R + "nnodes=2", R + "n_gpus_per_node=8",
                        R + "checkpoint_engine.backend=nccl", "data.train_batch_size=64", A + "ppo_mini_batch_size=16",
                        "trainer.v1.separate_async.parameter_sync_step=4",
                        "trainer.v1.separate_async.num_warmup_batches=1", R + "tensor_model_parallel_size=1")
    assert [r.key for r in result.by_status("unknown")] == []
    assert result.row("trainer.v1.trainer_mode").status == "translated"
    assert _stale(result) == (7, "bounded", 1)  # span <= 8 versions: the trainer's weights at most 7 updates newer
    assert "8 - 1 = 7" in result.row(V1S + "max_off_policy_threshold").note
    assert result.row("trainer.v1.separate_async.parameter_sync_step").status == "translated"
    assert result.row(V1S + "max_off_policy_strategy").status == "decide"  # drop: veRL drops stale groups
    assert (result.get("rollout.nproc"), result.get("trainer.nproc_per_node")) == (16, 32)
    assert result.row("trainer.nnodes").status == "decide"  # one machine in verirl
    assert result.get("trainer.async_training")["partial_rollout"] is True  # v1's client always continues them
    cfg = load_config_dict(result.config)
    assert (cfg.rollout.placement, cfg.trainer.async_training.max_staleness) == ("separate", 7)
    wait = _verl_head("trainer.v1.trainer_mode=separate_async", R + "nnodes=1", R + "n_gpus_per_node=2",
                      f"+{V1S}max_off_policy_threshold=2", f"+{V1S}max_off_policy_strategy=wait")
    assert _stale(wait) == (1, "bounded", 1) and wait.row(V1S + "max_off_policy_strategy").status == "translated"


def test_verl_rollout_response_length_caps_generation():
    result = _verl_head(R + "response_length=256")
    assert result.get("rollout.max_new_tokens") == 256
    assert _verl_head().row(R + "response_length").status == "translated"


def test_verl_vllm_engine_and_its_settings():
    result = _verl_head(R + "name=vllm", R + "tensor_model_parallel_size=2", R + "gpu_memory_utilization=0.4")
    assert (result.get("rollout.engine"), result.get("rollout.tensor_parallel_size"),
            result.get("rollout.gpu_memory_utilization")) == ("vllm", 2, 0.4)
    assert "native" in result.row(R + "name").note  # how to run it on a CPU
    assert _verl_head(R + "name=sglang").get("rollout.engine") == "native"


def test_verl_head_rollout_tensor_parallelism_without_an_engine_needs_a_decision():
    """veRL's head leaves rollout.name to the script (???) with tensor_model_parallel_size 2: verirl's native engine
    decodes with whole weights (1) or on the actor's plan, and this actor splits no layer."""
    row = _verl_head().row(R + "tensor_model_parallel_size")
    assert row.status == "decide" and "whole weights" in row.note
    megatron = _verl_head(A + "strategy=megatron", f"+{A}megatron.tensor_model_parallel_size=2")
    assert megatron.row(R + "tensor_model_parallel_size").status == "translated"
    assert (megatron.get("actor.tensor_parallel_size"), megatron.get("rollout.tensor_parallel_size")) == (2, 2)


def test_verl_validation_top_p_and_top_k():
    result = _verl_head(R + "val_kwargs.do_sample=true", R + "val_kwargs.n=4", R + "val_kwargs.top_p=0.9",
                        R + "val_kwargs.top_k=20")
    assert (result.get("eval.top_p"), result.get("eval.top_k")) == (0.9, 20)
    cfg = load_config_dict(result.config)
    assert (cfg.eval.top_p, cfg.eval.top_k) == (0.9, 20)


def test_evaluation_samples_with_top_k():
    """top_k=1: every sample is the greedy decode, so pass@1 (the mean over samples) is greedy_acc."""
    from verirl.data import arith_split, encode_prompts
    from verirl.train.evaluate import evaluate
    from verirl.models import load_model
    from verirl.rewards import Scorer
    from verirl.rollout import build_engine

    lm = load_model("tiny", device="cpu")
    prompts = encode_prompts(arith_split(0, 0, 20)[1], lm.tokenizer, 1024, "arith val", "filter")
    engine = build_engine("native", lm.model, lm.pad_id, lm.stop_ids)
    scorer = Scorer(["acc"], [1.0], workers=0)
    overall = evaluate(engine, lm.tokenizer, prompts, scorer, n=2, max_new_tokens=32, temperature=1.0, top_k=1,
                       seed=3)["overall"]
    assert overall["pass@1"] == overall["greedy_acc"] > 0


def test_eval_top_p_out_of_range_is_one_paragraph(capsys):
    assert main(["eval", "--top-p", "0", "--top-k", "-1"]) == 2
    assert "--top-p=0.0 must be in (0, 1]" in capsys.readouterr().err


def test_verl_notes_follow_the_file():
    result = _verl_head("data.shuffle=false", A + "use_kl_loss=true", A + "kl_loss_type=kl")
    assert result.get("data.shuffle") == "sequential"
    assert "RandomSampler" not in result.row("data.shuffle").note
    assert result.row("data.seed").status == "ignored"  # nothing is shuffled
    assert "clamp" not in result.row(A + "kl_loss_type").note
    rs = _verl_head(R + "calculate_log_probs=true", "algorithm.rollout_correction.rollout_rs=token",
                    "algorithm.rollout_correction.rollout_rs_threshold=1.01",
                    "+algorithm.rollout_correction.rollout_rs_threshold_lower=0.99")
    assert "upper" in rs.row("algorithm.rollout_correction.rollout_rs_threshold").note
    assert "lower bound" not in rs.row("algorithm.rollout_correction.rollout_rs_threshold").note
    assert rs.get("algo.rollout_correction.rollout_rs_threshold_lower") == 0.99


def test_verl_legacy_reward_manager_wins_without_a_spurious_decision():
    result = _verl_head("reward_model.reward_manager=dapo")
    assert result.row("reward_model.reward_manager").status == "translated"
    assert result.row("reward.reward_manager.name").status == "ignored"  # naive there; veRL copies dapo over it
    assert not [r.key for r in result.by_status("decide") if "reward_manager" in r.key]


def test_verl_multi_turn_keys_are_not_off_when_it_is_on():
    result = _verl_head(f"+{R}multi_turn.enable=true", f"+{R}multi_turn.max_user_turns=3",
                        "+data.tool_config_path=tools.yaml")
    assert result.row(R + "multi_turn.enable").status == "decide"  # no tool verirl can call: left off, said so
    assert "nothing to call" in result.row(R + "multi_turn.enable").note
    assert result.get("rollout.multi_turn.max_env_turns") == 3
    for key in (R + "multi_turn.max_user_turns", "data.tool_config_path"):
        assert "off" not in result.row(key).note


def test_verl_gsm8k_multi_turn_example():
    """veRL's examples/sglang_multiturn: gsm8k_multiturn_grpo.yaml run by run_qwen2.5-3b_gsm8k_multiturn.sh (its
    multi-turn and rollout overrides), the tool config its script names."""
    script = ["algorithm.adv_estimator=grpo", "data.train_batch_size=256", "data.max_response_length=1024",
              "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct", A + "ppo_mini_batch_size=256",
              R + "tensor_model_parallel_size=1", R + "name=sglang", R + "gpu_memory_utilization=0.85",
              R + "multi_stage_wake_up=True", R + "n=16", R + "over_sample_rate=0.1", R + "mode=async",
              f"{R}multi_turn.tool_config_path={GSM8K_TOOLS}"]
    result = convert("verl", VERL_GSM8K, script)
    assert [r.key for r in result.by_status("unknown")] == []
    assert result.get("rollout.multi_turn") == {
        "enable": True, "max_turns": 5, "tools": [GSM8K_TOOLS], "max_tool_response_chars": 256,
        "max_tool_response_tokens": 1024, "parser": "hermes"}
    assert result.get("rollout.engine") == "native"  # sglang: verirl's native engine
    assert result.row(R + "multi_turn.max_tool_response_length").origin == "default"
    assert result.row(R + "multi_turn.max_assistant_turns").origin == "file"
    load_config_dict(result.config)


def test_verl_tool_configs_of_veRL_as_verirl_loads_them():
    """veRL's example tool configs: the sandbox-fusion code interpreter is verirl's python tool (its default_timeout
    each call's deadline), veRL's search tool (a retrieval server over HTTP) verirl refuses."""
    sandbox = _verl_head(f"+{R}multi_turn.enable=true", f"{R}multi_turn.tool_config_path={SANDBOX_TOOLS}")
    row = sandbox.row(R + "multi_turn.tool_config_path")
    assert row.status == "translated" and "verirl's python tool" in row.note
    assert sandbox.get("rollout.multi_turn.tool_timeout_s") == 30.0
    search = _verl_head(f"+{R}multi_turn.enable=true", f"{R}multi_turn.tool_config_path={SEARCH_TOOLS}")
    row = search.row(R + "multi_turn.tool_config_path")
    assert row.status == "decide" and "verirl refuses it" in row.note and "retrieval server" in row.note


def test_mindspeed_retool_config_beside_the_file(tmp_path):
    """MindSpeed-RL's relative tool_config_path, read beside the config: its ReTool class is MindSpeed-RL's own, to
    be imported here."""
    import shutil

    (tmp_path / "configs" / "tools").mkdir(parents=True)
    shutil.copy(MS_RETOOL, tmp_path / "configs" / "tools" / "retool_config.yaml")
    shutil.copy(MS_MULTI_TURN, tmp_path / "dapo.yaml")
    result = convert("mindspeed-rl", str(tmp_path / "dapo.yaml"))
    assert any("mindspeed_rl.tools.retool.ReTool" in c and "must import here" in c for c in result.checks)
    assert result.get("rollout.multi_turn.tools") == ["./configs/tools/retool_config.yaml"]


def test_verl_interaction_example_needs_an_environment():
    """gsm8k_multiturn_grpo_w_interaction.yaml with its script's interaction_config_path: veRL's user simulator, no
    tools; verirl's equivalent is an environment class."""
    inter = "examples/sglang_multiturn/config/interaction_config/gsm8k_interaction_config.yaml"
    result = convert("verl", VERL_INTERACTION, [*GRPO, f"{R}multi_turn.interaction_config_path={inter}"])
    row = result.row(R + "multi_turn.interaction_config_path")
    assert row.status == "decide" and "rollout.multi_turn.environment" in row.note
    assert result.row(R + "multi_turn.enable").status == "decide" and result.get("rollout.multi_turn.enable") is None
    assert result.get("rollout.multi_turn.max_env_turns") == 5  # max_user_turns: 5


def test_verl_function_tool_examples_of_veRL():
    """verl-project/verl's own @function_tool examples (tests/experimental/agent_loop/function_tool_examples.py): the
    two plain functions become verirl tools, the async one needs a decision."""
    result = _verl_head(f"+{R}multi_turn.enable=true", f"{R}multi_turn.function_tool_path={VERL_FUNCTION_TOOLS}")
    assert result.get("rollout.multi_turn.tools") == [f"{VERL_FUNCTION_TOOLS}:get_weather",
                                                      f"{VERL_FUNCTION_TOOLS}:calculator"]
    row = result.row(R + "multi_turn.function_tool_path")
    assert row.status == "decide" and "fetch_url" in row.note and "async" in row.note
    assert result.row("data.function_tool_path").status == "translated"  # veRL's interpolation of the same file
    assert [r.key for r in result.by_status("unknown")] == []


def test_mindspeed_lora_is_actor_lora():
    """grpo_lora_qwen25_32b_A2.yaml: rank and alpha translated, Megatron's fused layers the Hugging Face model's (a
    decision: one adapter per fused layer there), CCLoRA a kernel switch, the shared backbone verirl's reference."""
    result = convert("mindspeed-rl", MS_LORA)
    assert result.get("actor.lora") == {"rank": 128, "alpha": 128.0, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    for key in ("lora_r", "lora_alpha", "lora_ckpt_filter"):
        assert result.row("megatron_training." + key).status == "translated", key
    assert result.row("megatron_training.lora_target_modules").status == "decide"
    assert result.row("megatron_training.lora_fusion").status == "ignored"
    assert result.row("rl_config.share_backbone").status == "translated"


def test_mindspeed_dapo_token_level_loss_is_per_micro_batch():
    result = convert("mindspeed-rl", MS_DAPO)  # token_level_loss: true, micro_batch_size: 1
    assert result.get("algo.loss_agg_mode") == "seq-mean-token-mean"
    dynamic = convert("mindspeed-rl", MS_DAPO, [RL + "use_dynamic_bsz=true"])
    assert dynamic.row(RL + "use_dynamic_bsz").status == "decide"
    off = convert("mindspeed-rl", MS_DAPO, [RL + "token_level_loss=false", "megatron_training.micro_batch_size=4"])
    assert off.get("algo.loss_agg_mode") == "seq-mean-token-mean"


def test_mindspeed_max_packing_token_size_reaches_the_critic_only():
    result = convert("mindspeed-rl", MS_R1, [RL + "max_packing_token_size=40000"])
    row = result.row(RL + "max_packing_token_size")
    assert row.status == "ignored" and "critic" in row.note
    assert result.get("actor.max_token_len_per_device") == 8196 + 2048  # 4096, raised to the longest sequence
    given = convert("mindspeed-rl", MS_R1, [f"+{RL}update_max_packing_token_size=40000"])
    assert given.get("actor.max_token_len_per_device") == 40000


def test_mindspeed_pipeline_layouts_of_the_peers():
    """DeepSeek-R1 on 256 NPUs: tensor parallel 4 x pipeline parallel 8 with uneven stages (num_layer_list
    7,7,8,8,8,8,8,7); Qwen2.5-7B on tensor parallel 2 x pipeline parallel 2. The pipeline sizes are written as
    MindSpeed-RL ran them, one group of tp x pp ranks, which verirl runs, its generation on vLLM too; DeepSeek-R1's
    tensor parallelism becomes 1 (verirl's MoE layers have no tensor-parallel plan) and its expert parallelism inside
    the stages a decision."""
    result = convert("mindspeed-rl", MS_R1)
    assert (result.get("actor.tensor_parallel_size"), result.get("actor.pipeline_parallel_size"),
            result.get("trainer.nproc_per_node")) == (1, 8, 32)
    assert result.row("actor_config.tensor_model_parallel_size").status == "decide"
    ep = result.row("actor_config.expert_model_parallel_size")
    assert ep.status == "decide" and "inside 8 pipeline stages" in ep.note and result.get("actor.expert_parallel_size") is None
    assert result.get("actor.pipeline_layers") == [7, 7, 8, 8, 8, 8, 8, 7]
    assert result.row("actor_config.num_layer_list").status == "translated"
    pp = result.row("actor_config.pipeline_model_parallel_size")
    assert pp.status == "translated"
    assert "composes pipeline stages" not in pp.note
    assert "256 NPUs" in result.row("actor_config.tensor_model_parallel_size").note and "256 NPUs" in pp.note
    assert result.get("actor.strategy") is None  # the default, fsdp2, inside the stages too
    assert result.get("actor.max_token_len_per_device") == 8196 + 2048  # use_dynamic_bsz's 4096, raised
    composed = convert("mindspeed-rl", MS_COMPOSED)  # tensor parallel 2 x pipeline parallel 2, 28 layers: 14 + 14
    assert (composed.get("actor.tensor_parallel_size"), composed.get("actor.pipeline_parallel_size"),
            composed.get("trainer.nproc_per_node"), composed.get("actor.pipeline_layers")) == (2, 2, 4, None)
    assert "composes pipeline stages" not in composed.row("actor_config.pipeline_model_parallel_size").note
    assert composed.get("actor.max_token_len_per_device") == 4 * (2048 + 2048)  # micro_batch_size 4, no dynamic bsz
    assert convert("mindspeed-rl", MS_DAPO).row("actor_config.pipeline_model_parallel_size").status == "ignored"


def test_mindspeed_ring_context_parallelism_needs_a_decision():
    """Qwen2.5-32B's DAPO on tensor parallel 8 with context parallel 2 by megatron_cp_algo (ring attention), as
    configs/dapo_qwen25_32b_A3_32k.yaml runs it: Ulysses over the same 2 ranks is written, with the decision."""
    result = convert("mindspeed-rl", MS_DAPO, ["+actor_config.context_parallel_size=2",
                                               "+actor_config.context_parallel_algo=megatron_cp_algo"])
    assert [r.key for r in result.by_status("unknown")] == []
    row = result.row("actor_config.context_parallel_size")
    assert row.status == "decide" and "ring attention is not built in verirl" in row.note
    assert (result.get("actor.tensor_parallel_size"), result.get("actor.sequence_parallel_size"),
            result.get("trainer.nproc_per_node")) == (8, 2, 16)


def test_verl_head_fsdp_ulysses_is_sequence_parallelism():
    """The FSDP scripts (run_qwen3_5_*_fsdp.sh) set the actor's and the reference's
    fsdp_config.ulysses_sequence_parallel_size to one SP_SIZE: verirl's actor.sequence_parallel_size, the
    reference on the actor's layout; with vLLM too."""
    ulysses = [f"+{A}fsdp_config.ulysses_sequence_parallel_size=2",
               "+actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=2"]
    result = _verl_head(R + "name=vllm", *ulysses)
    assert result.get("actor.sequence_parallel_size") == 2 and result.get("trainer.nproc_per_node") == 2
    assert result.row(f"{A}fsdp_config.ulysses_sequence_parallel_size").status == "translated"  # vLLM takes it
    assert result.row("actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size").status == "ignored"
    native = _verl_head(R + "name=sglang", R + "tensor_model_parallel_size=1", *ulysses)
    assert native.row(f"{A}fsdp_config.ulysses_sequence_parallel_size").status == "translated"


def test_mindspeed_composed_model_numerics_are_carried():
    result = convert("mindspeed-rl", MS_COMPOSED)
    assert result.get("model.override_config") == {"rms_norm_eps": 1e-6, "rope_theta": 1000000}
    assert result.row("model.qwen25_7b.num_layers").status == "ignored"


def test_mindspeed_kl_and_multi_turn_notes_follow_the_file():
    assert "seeds the prompt order" not in convert("mindspeed-rl", MS_DAPO).row(  # no_shuffle: true
        "megatron_training.seed").note
    assert "clamp" not in convert("mindspeed-rl", MS_R1).row(RL + "kl_penalty").note  # kl_penalty: kl
    result = convert("mindspeed-rl", MS_MULTI_TURN)  # multi_turn_enable: true
    for key in (RL + "tool_config_path", RL + "max_tool_calls"):
        assert "off" not in result.row(key).note


def test_mindspeed_multi_turn_example():
    """configs/dapo_qwen25_7b_A2_multi_turn.yaml (ReTool): max_tool_calls 1, max_total_response_length 2048,
    max_tool_response_length 256 (characters), middle, hermes."""
    result = convert("mindspeed-rl", MS_MULTI_TURN)
    assert result.get("rollout.multi_turn") == {
        "enable": True, "tools": ["./configs/tools/retool_config.yaml"], "max_env_turns": 1, "max_turns": 2,
        "max_tool_response_chars": 256, "max_tool_response_tokens": 2048, "parser": "hermes"}
    assert result.get("rollout.max_new_tokens") == 2048  # max_total_response_length: the episode's response
    for key in ("multi_turn_enable", "tool_config_path", "max_tool_calls", "max_total_response_length",
                "max_tool_response_length", "tool_parser_format"):
        assert result.row(RL + key).status == "translated", key
    for key in ("max_parallel_calls", "tool_response_truncate_side"):
        assert result.row(RL + key).status == "decide", key
    assert result.row(RL + "verifier_function").status == "decide"  # retool_reward: no verirl rule


def test_overrides_after_the_options(tmp_path):
    out = tmp_path / "out.yaml"
    assert main(["convert-config", "--from", "verl", VERL_HEAD, "-o", str(out), *GRPO, R + "n=6"]) == 0
    assert yaml.safe_load(out.read_text())["rollout"]["n"] == 6


def test_names_come_from_the_registries():
    """A new estimator or rule is known to the converter the day it is registered."""
    from verirl.core.algo.advantages import ADVANTAGE_ESTIMATORS, grpo_advantages
    from verirl.rewards.rules import RULES, acc

    ADVANTAGE_ESTIMATORS["grpo_twin"], RULES["acc_twin"] = grpo_advantages, acc
    try:
        verl = convert("verl", str(EXAMPLES / "verl_ppo_trainer_grpo.yaml"), ["algorithm.adv_estimator=grpo_twin"])
        assert verl.get("algo.adv_estimator") == "grpo_twin"
        result = convert("mindspeed-rl", str(EXAMPLES / "mindspeed_rl_grpo_qwen25_7b.yaml"),
                         [f"{RL}verifier_function=[acc_twin]", f"{RL}verifier_weight=[1.0]"])
        assert result.row(RL + "verifier_function").status == "translated"
    finally:
        del ADVANTAGE_ESTIMATORS["grpo_twin"], RULES["acc_twin"]


@pytest.mark.parametrize("fmt", ["verl", "mindspeed-rl"])
def test_a_file_in_neither_format_is_named_so(fmt, tmp_path):
    path = tmp_path / "other.yaml"
    path.write_text("model:\n  path: tiny\nrollout:\n  n: 4\n")
    with pytest.raises(ConfigError, match=f"is not a {fmt} config.*model, rollout"):
        convert(fmt, str(path))


def test_verl_script_overrides_under_a_null_section():
    """`+...override_optimizer_config.optimizer_offload_fraction=1.0` (veRL's run_qwen3_5_35b_megatron.sh): Hydra adds
    the key under veRL's null section."""
    result = _verl_head(f"+{A}optim.override_optimizer_config.optimizer_offload_fraction=1.0")
    assert result.row(f"{A}optim.override_optimizer_config.optimizer_offload_fraction").status == "ignored"


def test_mindspeed_partial_rollout_needs_a_decision():
    """rl_config.partial_rollout_max_split N > 1 (MindSpeed-RL's docs/zh/features/partial_rollout.md): the longest
    responses continue over up to N iterations on the training devices; verirl continues one on newer weights only
    on producers of its own."""
    assert convert("mindspeed-rl", MS_DAPO).get("trainer.async_training") is None
    result = convert("mindspeed-rl", MS_DAPO, [f"{RL}partial_rollout_max_split=2",
                                               f"{RL}require_max_age_all_finished=true"])
    row = result.row(RL + "partial_rollout_max_split")
    assert row.status == "decide" and "rollout.placement=separate" in row.note
    assert result.row(RL + "require_max_age_all_finished").status == "ignored"
    assert load_config_dict(result.config).rollout.placement == "colocated"
