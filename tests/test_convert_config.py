"""`verirl convert-config`: both shipped examples translated and checked key by key, every source key
classified, the written YAML passing verirl's schema checks, and the meanings that differ between the
systems converted (seed 000's table: mini-batch already multiplied by n, warm-up ratio vs fraction,
seq_length = prompt + response, epochs vs iterations)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from verirl.tools.align import convert_mindspeed, convert_verl
from verirl.tools.align.convert import STATUSES, convert, flatten, verirl_keys
from verirl.cli import main
from verirl.config import Config, load_config, validate
from verirl.core.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
VERL = str(EXAMPLES / "verl_ppo_trainer_grpo.yaml")
MSRL = str(EXAMPLES / "mindspeed_rl_grpo_qwen25_7b.yaml")
A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."

# ---------------------------------------------------------------- what each example becomes

VERL_CONFIG = {
    "data.prompts_per_step": 64,  # data.train_batch_size
    "data.max_prompt_length": 8192, "rollout.max_new_tokens": 4096,  # max_prompt_length, max_response_length
    "data.too_long": "filter", "data.seed": 1, "data.shuffle": "verl",
    "data.train_path": "/data/math_tasks/train.parquet", "data.prompt_type": "tokenizer",
    "data.handler_name": "VerlParquetHandler", "model.path": "/models/Qwen2.5-7B",
    "rollout.engine": "vllm", "rollout.tensor_parallel_size": 2, "rollout.gpu_memory_utilization": 0.6,
    "rollout.n": 8, "rollout.temperature": 1.0, "rollout.top_p": 1.0,
    "rollout.top_k": 0,  # vLLM's -1
    "reward.verifiers": ["/workspace/reward/task_rules.py:compute_score"], "reward.weights": [1.0],
    "algo.adv_estimator": "grpo", "algo.scale_rewards": "group",  # norm_adv_by_std_in_grpo: true
    "algo.kl_coef": 0.001, "algo.kl_type": "low_var_kl",  # use_kl_loss / kl_loss_coef / kl_loss_type
    "algo.policy_loss": "dual_clip", "algo.clip_ratio_c": 3.0,  # veRL's vanilla loss has the dual clip
    "algo.clip_ratio_low": 0.2, "algo.clip_ratio_high": 0.2, "algo.entropy_coef": 0.0,
    "algo.loss_agg_mode": "token-mean",
    # veRL's rollout correction is off by default, verirl's rejection is on: written off
    "algo.rollout_correction.rollout_is": None, "algo.rollout_correction.rollout_rs": None,
    "actor.lr": 1e-6, "actor.betas": [0.9, 0.999], "actor.weight_decay": 0.01,
    "actor.warmup_steps": 50,  # int(0.05 x 500 steps) = 25 veRL steps x (64 / 32) optimizer steps each
    "actor.grad_clip": 1.0,
    "actor.mini_batch_prompts": 32,  # ppo_mini_batch_size counts prompts (veRL multiplies by n inside)
    "actor.epochs": 1, "actor.max_token_len_per_device": 24576,  # ppo_max_token_len_per_gpu (use_dynamic_bsz)
    "actor.use_remove_padding": True, "actor.strategy": "fsdp2",
    "ref.log_prob_max_token_len_per_device": 49152,
    "trainer.total_steps": 500,  # total_training_steps wins over total_epochs
    "trainer.run_dir": "runs/grpo_math_tasks/qwen25_7b_8k4k", "trainer.save_freq": 100, "trainer.resume": "auto",
    "eval.data": "/data/math_tasks/test.parquet", "eval.n": 4, "eval.temperature": 0.6, "eval.greedy": False,
    "eval.top_p": 0.95,  # val_kwargs.top_p
    "eval.before_train": True, "eval.every": 50, "eval.at_end": True,  # test_freq
}

MSRL_CONFIG = {
    "data.prompts_per_step": 64,  # global_batch_size
    "data.max_prompt_length": 8192, "rollout.max_new_tokens": 4096,  # seq_length 12288 = 8192 + 4096
    "data.too_long": "filter", "data.seed": 1, "data.shuffle": "megatron",
    "data.dataset_additional_keys": ["labels", "task"], "model.path": "./model_from_hf/qwen25-7b",
    "rollout.n": 8, "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
    "rollout.engine": "vllm", "rollout.tensor_parallel_size": 4, "rollout.gpu_memory_utilization": 0.6,
    "reward.verifiers": ["base_acc", "format"], "reward.weights": [1.0, 0.5], "reward.timeout": 120.0,
    "algo.adv_estimator": "grpo", "algo.kl_coef": 0.001, "algo.kl_type": "low_var_kl",
    "algo.clip_ratio_low": 0.2, "algo.clip_ratio_high": 0.2, "algo.entropy_coef": 0.0,
    "algo.loss_agg_mode": "seq-mean-token-mean",  # token mean per micro-batch of 1 sequence
    "algo.policy_loss": "vanilla",  # no dual clip in MindSpeed-RL's loss
    "algo.rollout_correction.rollout_is": None, "algo.rollout_correction.rollout_rs": None,  # none in MindSpeed-RL
    "actor.lr": 1e-6, "actor.betas": [0.9, 0.999], "actor.weight_decay": 0.01,
    "actor.warmup_steps": 50,  # 0.05 x 500 iterations x 2 mini-batches per iteration
    "actor.grad_clip": 1.0,
    "actor.mini_batch_prompts": 32,  # 256 sequences / 8 samples per prompt
    "actor.micro_batch_size": 1, "actor.epochs": 1,
    "actor.tensor_parallel_size": 4,  # actor_config.tensor_model_parallel_size
    "trainer.nproc_per_node": 4,  # the fewest ranks that hold tensor parallelism 4 (not the other run's 16 NPUs)
    "trainer.total_steps": 500, "trainer.seed": 1, "trainer.save_freq": 100,
}

# Every source key of each example: (status, the verirl keys written from it).
VERL_ROWS = {
    "hydra.searchpath": ("ignored", []), "defaults": ("ignored", []),
    "data.train_files": ("translated", ["data.train_path", "data.handler_name", "data.prompt_type"]),
    "data.val_files": ("translated", ["eval.data"]), "data.prompt_key": ("translated", []),
    "data.reward_fn_key": ("ignored", []),
    "data.max_prompt_length": ("translated", ["data.max_prompt_length"]),
    "data.max_response_length": ("translated", ["rollout.max_new_tokens"]),
    "data.train_batch_size": ("translated", ["data.prompts_per_step"]),
    "data.filter_overlong_prompts": ("translated", ["data.too_long"]), "data.truncation": ("translated", []),
    "data.shuffle": ("translated", ["data.shuffle"]), "data.seed": ("translated", ["data.seed"]),
    "data.dataloader_num_workers": ("ignored", []), "actor_rollout_ref.hybrid_engine": ("ignored", []),
    "actor_rollout_ref.model.path": ("translated", ["model.path"]),
    "actor_rollout_ref.model.use_remove_padding": ("translated", ["actor.use_remove_padding"]),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("ignored", []),
    "actor_rollout_ref.model.override_config": ("ignored", []),
    A + "strategy": ("translated", ["actor.strategy"]),
    A + "ppo_mini_batch_size": ("translated", ["actor.mini_batch_prompts"]),
    A + "ppo_micro_batch_size_per_gpu": ("ignored", []),
    A + "use_dynamic_bsz": ("translated", ["actor.max_token_len_per_device"]),
    A + "ppo_max_token_len_per_gpu": ("translated", ["actor.max_token_len_per_device"]),
    A + "ppo_epochs": ("translated", ["actor.epochs"]),
    A + "clip_ratio_low": ("translated", ["algo.clip_ratio_low"]),
    A + "clip_ratio_high": ("translated", ["algo.clip_ratio_high"]),
    A + "clip_ratio_c": ("translated", ["algo.clip_ratio_c"]),
    A + "loss_agg_mode": ("translated", ["algo.loss_agg_mode"]),
    A + "entropy_coeff": ("translated", ["algo.entropy_coef"]),
    A + "use_kl_loss": ("translated", ["algo.kl_coef"]), A + "kl_loss_coef": ("translated", ["algo.kl_coef"]),
    A + "kl_loss_type": ("translated", ["algo.kl_type"]), A + "grad_clip": ("translated", ["actor.grad_clip"]),
    A + "optim.lr": ("translated", ["actor.lr"]),
    A + "optim.lr_warmup_steps_ratio": ("translated", ["actor.warmup_steps"]),
    A + "optim.lr_scheduler_type": ("translated", []),
    A + "optim.weight_decay": ("translated", ["actor.weight_decay"]),
    A + "optim.betas": ("translated", ["actor.betas"]),
    A + "fsdp_config.param_offload": ("ignored", []), A + "fsdp_config.optimizer_offload": ("ignored", []),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": ("translated", ["ref.log_prob_max_token_len_per_device"]),
    "actor_rollout_ref.ref.fsdp_config.param_offload": ("ignored", []),
    R + "name": ("translated", ["rollout.engine"]), R + "mode": ("ignored", []), R + "n": ("translated", ["rollout.n"]),
    R + "temperature": ("translated", ["rollout.temperature"]), R + "top_p": ("translated", ["rollout.top_p"]),
    R + "top_k": ("translated", ["rollout.top_k"]),
    R + "tensor_model_parallel_size": ("translated", ["rollout.tensor_parallel_size"]),
    R + "gpu_memory_utilization": ("translated", ["rollout.gpu_memory_utilization"]),
    R + "enable_chunked_prefill": ("ignored", []),
    R + "max_num_batched_tokens": ("ignored", []), R + "log_prob_max_token_len_per_gpu": ("ignored", []),
    R + "val_kwargs.do_sample": ("translated", ["eval.n", "eval.greedy"]),
    R + "val_kwargs.n": ("translated", ["eval.n"]), R + "val_kwargs.temperature": ("translated", ["eval.temperature"]),
    R + "val_kwargs.top_p": ("translated", ["eval.top_p"]),
    "algorithm.adv_estimator": ("translated", ["algo.adv_estimator"]),
    "algorithm.norm_adv_by_std_in_grpo": ("translated", ["algo.scale_rewards"]),
    "algorithm.use_kl_in_reward": ("translated", []),
    "custom_reward_function.path": ("decide", ["reward.verifiers", "reward.weights"]),
    "custom_reward_function.name": ("translated", ["reward.verifiers"]),
    "trainer.project_name": ("translated", ["trainer.run_dir"]),
    "trainer.experiment_name": ("translated", ["trainer.run_dir"]),
    "trainer.logger": ("ignored", []), "trainer.n_gpus_per_node": ("ignored", []), "trainer.nnodes": ("ignored", []),
    "trainer.total_epochs": ("ignored", []), "trainer.total_training_steps": ("translated", ["trainer.total_steps"]),
    "trainer.save_freq": ("translated", ["trainer.save_freq"]),
    "trainer.test_freq": ("translated", ["eval.every", "eval.at_end"]),
    "trainer.val_before_train": ("translated", ["eval.before_train"]), "trainer.critic_warmup": ("ignored", []),
    "trainer.balance_batch": ("ignored", []), "trainer.resume_mode": ("translated", ["trainer.resume"]),
    "trainer.default_local_dir": ("ignored", []),
    # veRL's defaults the translation read (absent from the file)
    A + "policy_loss.loss_mode": ("translated", ["algo.policy_loss"]), A + "optim.optimizer": ("translated", []),
    "algorithm.rollout_correction.rollout_is": ("translated", ["algo.rollout_correction.rollout_is"]),
    "algorithm.rollout_correction.rollout_rs": ("translated", ["algo.rollout_correction.rollout_rs"]),
}

MT, AC, RL, GEN = "megatron_training.", "actor_config.", "rl_config.", "generate_config."
MSRL_ROWS = {
    "defaults": ("ignored", []), MT + "model": ("ignored", []),
    **{MT + k: ("ignored", []) for k in (
        "use_fused_rmsnorm", "use_mcore_models", "sequence_parallel", "use_flash_attn", "no_masked_softmax_fusion",
        "attention_softmax_in_fp32", "no_gradient_accumulation_fusion", "use_fused_swiglu", "use_fused_rotary_pos_emb",
        "bf16", "use_distributed_optimizer", "tokenizer_type", "init_method_std", "distributed_backend",
        "no_shared_storage", "variable_seq_lengths")},
    MT + "tokenizer_name_or_path": ("translated", ["model.path"]),
    MT + "global_batch_size": ("translated", ["data.prompts_per_step"]),
    MT + "seq_length": ("translated", ["data.max_prompt_length", "rollout.max_new_tokens"]),
    MT + "save_interval": ("translated", ["trainer.save_freq"]),
    MT + "train_iters": ("translated", ["trainer.total_steps", "actor.warmup_steps"]),
    MT + "stage": ("translated", ["algo.policy_loss"]), MT + "attention_dropout": ("translated", []),
    MT + "hidden_dropout": ("translated", []),
    MT + "dataset_additional_keys": ("translated", ["data.dataset_additional_keys"]),
    MT + "data_path": ("decide", []), MT + "split": ("translated", []),
    AC + "model": ("decide", []),
    AC + "micro_batch_size": ("translated", ["actor.micro_batch_size", "algo.loss_agg_mode"]),
    # tensor parallelism 4 with MindSpeed-RL's vLLM: verirl's vllm engine takes no tensor-parallel actor yet
    AC + "tensor_model_parallel_size": ("translated", ["actor.tensor_parallel_size", "trainer.nproc_per_node"]),
    **{AC + k: ("ignored", []) for k in ("pipeline_model_parallel_size", "min_lr",
                                         "finetune", "load", "save", "no_load_optim", "no_load_rng")},
    AC + "lr": ("translated", ["actor.lr"]), AC + "lr_decay_style": ("translated", []),
    AC + "weight_decay": ("translated", ["actor.weight_decay"]),
    AC + "lr_warmup_fraction": ("translated", ["actor.warmup_steps"]),
    AC + "clip_grad": ("translated", ["actor.grad_clip"]), AC + "adam_beta1": ("translated", ["actor.betas"]),
    AC + "adam_beta2": ("translated", ["actor.betas"]), AC + "seed": ("translated", ["data.seed", "trainer.seed"]),
    **{RL + k: ("ignored", []) for k in ("use_integrated_worker", "blocking", "experience_count", "gamma", "lam",
                                         "shuffle_mini_batch", "verifier_parallel", "use_tensorboard",
                                         "actor_resource.num_npus")},
    RL + "adv_estimator": ("translated", ["algo.adv_estimator"]), RL + "kl_penalty": ("translated", ["algo.kl_type"]),
    RL + "kl_ctrl_type": ("translated", []), RL + "init_kl_coef": ("translated", ["algo.kl_coef"]),
    RL + "mini_batch_size": ("translated", ["actor.mini_batch_prompts"]),
    RL + "max_prompt_length": ("translated", ["data.max_prompt_length", "data.too_long"]),
    RL + "epochs": ("translated", ["actor.epochs"]),
    RL + "clip_ratio": ("translated", ["algo.clip_ratio_low", "algo.clip_ratio_high"]),
    RL + "entropy_coeff": ("translated", ["algo.entropy_coef"]),
    RL + "n_samples_per_prompt": ("translated", ["rollout.n", "actor.mini_batch_prompts"]),
    RL + "rule_reward": ("translated", []), RL + "verifier_function": ("translated", ["reward.verifiers"]),
    RL + "verifier_weight": ("translated", ["reward.weights"]),
    RL + "verifier_timeout": ("translated", ["reward.timeout"]),
    **{GEN + k: ("ignored", []) for k in (
        "trust_remote_code", "offload_train_optimizer", "offload_train_grad", "offload_train_param",
        "infer_pipeline_parallel_size", "infer_expert_parallel_size", "max_num_seqs",
        "max_model_len", "max_num_batched_tokens", "dtype", "sampling_config.logprobs",
        "sampling_config.min_p", "sampling_config.detokenize")},
    GEN + "infer_tensor_parallel_size": ("translated", ["rollout.engine", "rollout.tensor_parallel_size"]),
    GEN + "gpu_memory_utilization": ("translated", ["rollout.engine", "rollout.gpu_memory_utilization"]),
    GEN + "sampling_config.max_tokens": ("translated", ["rollout.max_new_tokens"]),
    GEN + "sampling_config.top_p": ("translated", ["rollout.top_p"]),
    GEN + "sampling_config.top_k": ("translated", ["rollout.top_k"]),
    GEN + "sampling_config.temperature": ("translated", ["rollout.temperature"]),
    # MindSpeed-RL's defaults the translation read (absent from the file)
    RL + "use_dynamic_bsz": ("translated", []), RL + "use_kl_in_reward": ("translated", []),
    MT + "no_shuffle": ("decide", ["data.shuffle"]),
}


def _flat(result) -> dict:
    """verirl's dotted keys -> values, sub-sections (algo.filter_groups, ...) flattened too."""
    keys, out = verirl_keys(), {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if f"{prefix}{k}" in keys:
                out[f"{prefix}{k}"] = v
            else:
                walk(v, f"{prefix}{k}.")

    walk(result.config, "")
    return out


def _source_keys(path: str) -> set[str]:
    return set(flatten(yaml.safe_load(Path(path).read_text())))


@pytest.fixture(scope="module")
def verl():
    return convert("verl", VERL)


@pytest.fixture(scope="module")
def msrl():
    return convert("mindspeed-rl", MSRL)


# ---------------------------------------------------------------- the examples, key by key

@pytest.mark.parametrize("which", ["verl", "msrl"])
def test_example_translated_key_by_key(which, request):
    result = request.getfixturevalue(which)
    expected = VERL_CONFIG if which == "verl" else MSRL_CONFIG
    assert _flat(result) == expected  # every value written, and nothing else


@pytest.mark.parametrize("which", ["verl", "msrl"])
def test_every_source_key_has_its_row(which, request):
    result = request.getfixturevalue(which)
    rows = VERL_ROWS if which == "verl" else MSRL_ROWS
    path = VERL if which == "verl" else MSRL
    got = {r.key: (r.status, r.targets) for r in result.rows}
    assert got == rows
    assert _source_keys(path) <= set(got)  # nothing dropped silently
    for r in result.rows:
        assert r.status in STATUSES and r.note, r  # each row says what became of it, or why not
        assert (r.origin == "default") == (r.key not in _source_keys(path))
    assert not result.by_status("unknown")


def test_verl_notes_spell_out_the_conversions(verl):
    assert "prompts in both" in verl.row(A + "ppo_mini_batch_size").note
    assert "ppo_mini_batch_size *= n" in verl.row(A + "ppo_mini_batch_size").note
    warm = verl.row(A + "optim.lr_warmup_steps_ratio").note
    assert "int(0.05 x 500 steps) = 25 veRL steps x 2 optimizer steps" in warm
    assert "dual" in verl.row(A + "clip_ratio_c").note and "dual_clip" in verl.row(A + "policy_loss.loss_mode").note
    assert "total_training_steps is set" in verl.row("trainer.total_epochs").note
    assert "compute_score(data_source, solution_str, ground_truth" in verl.row("custom_reward_function.path").note
    assert any("verirl doctor" in c and "/models/Qwen2.5-7B" in c for c in verl.checks)
    assert any("tokenizer ids" in c for c in verl.checks)


def test_mindspeed_notes_spell_out_the_conversions(msrl):
    mini = msrl.row(RL + "mini_batch_size").note
    assert "before 2.0" in mini and "256 sequences / 8 = 32 prompts" in mini
    assert "= max_prompt_length 8192 + max_tokens 4096" in msrl.row(MT + "seq_length").note
    assert "0.05 x 500 x 2 mini-batches per step = 50 optimizer steps" in msrl.row(AC + "lr_warmup_fraction").note
    assert "iterations" in msrl.row(MT + "train_iters").note and "not epochs" in msrl.row(MT + "train_iters").note
    assert "seq-mean-token-mean" in msrl.row(AC + "micro_batch_size").note
    assert "configs/model/qwen25_7b.yaml" in msrl.row(AC + "model").note
    assert "overridden by actor_config.model" in msrl.row(MT + "model").note
    assert "kernel" in msrl.row(MT + "use_fused_rmsnorm").note
    tp = msrl.row(AC + "tensor_model_parallel_size").note
    assert "trainer.nproc_per_node=4 written" in tp and "16 NPUs" in tp
    assert msrl.row(AC + "tensor_model_parallel_size").status == "translated"  # vLLM takes a split actor
    assert msrl.row(AC + "pipeline_model_parallel_size").note == "1: none"
    assert any("rms_norm_eps" in c and "not" not in c[:5] for c in msrl.checks)
    assert "override_config" not in msrl.config.get("model", {})  # flagged, not guessed


def test_the_two_examples_describe_one_run(verl, msrl):
    """The GPU run and its NPU migration agree on every key of the step's maths; what differs is what the systems
    do differently with the same settings (seed 000's findings)."""
    v, m = _flat(verl), _flat(msrl)
    shared = set(v) & set(m)
    differ = {k for k in shared if v[k] != m[k]}
    # MindSpeed-RL's loss averages per micro-batch (1 sequence: seq-mean-token-mean) and has no dual clip (veRL's
    # vanilla has); pre-2.0 MindSpeed-RL shuffled Megatron's way; the paths are each machine's; the GPU run scored
    # with its own function, the NPU run with rules
    # with its own function, the NPU run with rules; the NPU run's vLLM spans 4 devices
    assert differ == {"algo.loss_agg_mode", "algo.policy_loss", "data.shuffle", "model.path", "reward.verifiers",
                      "reward.weights", "rollout.tensor_parallel_size"}
    for key in ("data.prompts_per_step", "rollout.n", "actor.mini_batch_prompts", "actor.warmup_steps",
                "trainer.total_steps", "algo.kl_coef", "data.max_prompt_length", "rollout.max_new_tokens"):
        assert v[key] == m[key], key


# ---------------------------------------------------------------- the written YAML

@pytest.mark.parametrize("fmt,path,expected", [("verl", VERL, VERL_CONFIG), ("mindspeed-rl", MSRL, MSRL_CONFIG)])
def test_written_yaml_passes_the_schema_checks(fmt, path, expected, tmp_path, capsys):
    out = tmp_path / "grpo.yaml"
    assert main(["convert-config", "--from", fmt, path, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "source keys:" in printed and f"wrote {out}" in printed
    text = out.read_text()
    assert text.startswith(f"# verirl config translated from {fmt} config {path}")
    cfg = load_config(str(out))  # types, ranges, batch arithmetic
    assert isinstance(cfg, Config)
    validate(cfg)
    for dotted, value in expected.items():
        node = cfg
        for part in dotted.split("."):
            node = getattr(node, part)
        assert node == value, dotted
    assert "# <- data.train_batch_size" in text or "# <- megatron_training.global_batch_size" in text


def test_mindspeed_rule_names_are_verirl_rules(msrl):
    from verirl.run.checks import check_rules

    check_rules(msrl.config["reward"]["verifiers"], {})


def test_yaml_goes_to_stdout_and_the_table_to_stderr(capsys):
    assert main(["convert-config", "--from", "mindspeed-rl", MSRL]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["actor"]["mini_batch_prompts"] == 32
    assert "rl_config.mini_batch_size" in err and "decide" in err


def test_json_table(capsys):
    assert main(["convert-config", "--from", "verl", VERL, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {s: len([r for r in VERL_ROWS.values() if r[0] == s]) for s in STATUSES}
    assert data["config"]["actor"]["mini_batch_prompts"] == 32
    assert {r["key"] for r in data["rows"]} == set(VERL_ROWS)


# ---------------------------------------------------------------- veRL: overrides, epochs, warm-up

def test_verl_overrides_apply_before_translation():
    r = convert("verl", VERL, [R + "n=16", "data.train_batch_size=128", "+" + R + "val_kwargs.top_k=20"])
    assert r.get("rollout.n") == 16 and r.get("data.prompts_per_step") == 128
    assert r.row(R + "n").origin == "override" and r.row(R + "n").value == 16
    assert r.get("actor.warmup_steps") == 25 * 4  # 128 / 32 = 4 optimizer steps per veRL step
    assert r.row(R + "val_kwargs.top_k").status == "translated" and r.get("eval.top_k") == 20
    cli = main(["convert-config", "--from", "verl", VERL, R + "n=16", "--json"])
    assert cli == 0


def test_verl_epochs_need_the_row_count():
    r = convert("verl", VERL, ["trainer.total_training_steps=null"])
    assert r.row("trainer.total_epochs").status == "decide" and "--train-rows" in r.row("trainer.total_epochs").note
    assert r.get("trainer.total_steps") is None  # verirl's default stands, the header says so
    assert r.row(A + "optim.lr_warmup_steps_ratio").status == "decide"  # a ratio of an unknown step count
    assert r.get("actor.warmup_steps") is None and any("left as a ratio" in w for w in r.warnings)
    r = convert("verl", VERL, ["trainer.total_training_steps=null"], train_rows=7473)
    assert r.get("trainer.total_steps") == 15 * (7473 // 64) == 1740  # drop_last: floor
    assert r.get("actor.warmup_steps") == int(0.05 * 1740) * 2 == 174
    assert any("drops the last 49 rows" in w for w in r.warnings)
    with pytest.raises(ConfigError, match="less than one batch"):
        convert("verl", VERL, ["trainer.total_training_steps=null"], train_rows=10)


def test_verl_command_line_only_uses_verl_defaults(capsys):
    """A run script's overrides alone (no FILE): veRL's defaults fill the rest and are marked so."""
    argv = ["convert-config", "--from", "verl", "algorithm.adv_estimator=grpo", "data.train_batch_size=1024",
            "data.max_prompt_length=1024", "data.max_response_length=1024",
            "actor_rollout_ref.model.path=Qwen/Qwen2-7B",
            A + "ppo_mini_batch_size=256", A + "ppo_micro_batch_size_per_gpu=16", A + "use_kl_loss=True",
            R + "n=5", "trainer.total_epochs=15", "--train-rows", "7473", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    cfg, rows = data["config"], {r["key"]: r for r in data["rows"]}
    assert cfg["actor"]["micro_batch_size"] == 16 and cfg["trainer"]["total_steps"] == 15 * 7
    assert cfg["actor"]["weight_decay"] == 0.01 and rows[A + "optim.weight_decay"]["origin"] == "default"
    assert cfg["algo"]["kl_coef"] == 0.001 and rows[A + "kl_loss_coef"]["origin"] == "default"
    assert cfg["actor"]["betas"] == [0.9, 0.999]
    assert rows["data.seed"]["status"] == "decide"  # veRL's null seed: an unseeded order


def test_verl_kl_off_and_clip_fallback():
    r = convert("verl", VERL, [A + "use_kl_loss=false", A + "clip_ratio_low=null", A + "clip_ratio_high=0.28",
                               "+" + A + "clip_ratio=0.25"])
    assert r.get("algo.kl_coef") == 0.0 and r.row(A + "kl_loss_coef").status == "ignored"
    assert r.get("algo.clip_ratio_low") == 0.25 and r.get("algo.clip_ratio_high") == 0.28  # null falls back


def test_verl_model_override_is_carried_over():
    r = convert("verl", VERL, ["+actor_rollout_ref.model.override_config.rms_norm_eps=1e-5"])
    row = r.row("actor_rollout_ref.model.override_config.rms_norm_eps")
    assert row.status == "translated" and row.targets == ["model.override_config"]
    assert r.get("model.override_config") == {"rms_norm_eps": 1e-5}
    assert any("rms_norm_eps=1e-05" in c for c in r.checks)


def test_token_budget_under_the_longest_sequence_is_raised():
    r = convert("verl", VERL, [A + "ppo_max_token_len_per_gpu=8192"])
    assert r.get("actor.max_token_len_per_device") == 8192 + 4096
    assert r.row(A + "ppo_max_token_len_per_gpu").status == "decide"


# ---------------------------------------------------------------- parallel layouts

MG, M = A + "megatron.", "actor_rollout_ref.model."
MEGATRON = [A + "strategy=megatron", MG + "tensor_model_parallel_size=2"]
REF_TP = "actor_rollout_ref.ref.megatron.tensor_model_parallel_size"
REF_CP = "actor_rollout_ref.ref.megatron.context_parallel_size"


def test_verl_megatron_tensor_parallelism_is_verirls():
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang"])  # sglang: verirl's native engine
    row = r.row(MG + "tensor_model_parallel_size")
    assert row.status == "translated" and r.get("actor.tensor_parallel_size") == 2
    assert r.row(R + "tensor_model_parallel_size").status == "translated"  # = the actor's: decodes on the plan
    assert (r.get("rollout.engine"), r.get("rollout.tensor_parallel_size")) == ("native", 2)
    # veRL's 16 GPUs are the other machine's; verirl's default world of 1 rank holds no group of 2
    assert r.get("trainer.nproc_per_node") == 2 and "trainer.nproc_per_node=2 written" in row.note
    assert "16 GPUs" in row.note
    assert "tensor, context and pipeline parallelism are translated" in r.row(A + "strategy").note
    from verirl.run.checks import check, check_model_parallel

    cfg = _checked(r)
    check(cfg, paths=False)
    cfg.model.path = "tiny"  # the layout's own checks, on a model that splits 2 ways
    check_model_parallel(cfg)


def test_verl_megatron_tensor_parallelism_with_vllm_is_translated():
    r = convert("verl", VERL, MEGATRON)  # the example's rollout: vllm, tensor parallel 2
    row = r.row(MG + "tensor_model_parallel_size")
    assert row.status == "translated"  # verirl's push assembles each tensor for vLLM from the split actor
    assert (r.get("actor.tensor_parallel_size"), r.get("rollout.engine")) == (2, "vllm")
    assert r.row(R + "tensor_model_parallel_size").note == "the same vLLM setting"


PP = MG + "pipeline_model_parallel_size"
VPP = MG + "virtual_pipeline_model_parallel_size"
NATIVE = [A + "strategy=megatron", R + "name=sglang", R + "tensor_model_parallel_size=1"]  # verirl's native engine


def _model_parallel_checked(result, **changes):
    """check(cfg, paths=False) and the layout's own checks (check_model_parallel) on the tiny model (qwen2, 4 decoder
    layers, 4 heads, 2 key/value heads), after ``changes`` (dotted verirl keys)."""
    from verirl.run.checks import check, check_model_parallel

    cfg = _checked(result)
    cfg.model.path = "tiny"
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        setattr(getattr(cfg, section), key, value)
    check(cfg, paths=False)
    check_model_parallel(cfg)
    return cfg


def test_verl_megatron_pipeline_parallelism_is_verirls():
    """Megatron's pipeline stages are verirl's: the size, 1F1B (both defaults), the token budget the stages pad every
    micro-batch to (use_dynamic_bsz's), FSDP2 inside the stages over any data-parallel ranks, one group of ranks."""
    r = convert("verl", VERL, [*NATIVE, f"{PP}=2"])
    row = r.row(PP)
    assert row.status == "translated" and r.get("actor.pipeline_parallel_size") == 2
    assert "Megatron's schedule is 1F1B" in row.note and "llama, qwen2, qwen3, mistral" in row.note
    assert r.get("actor.pipeline_schedule") is None and r.get("actor.pipeline_layers") is None  # 1f1b, even split
    assert r.get("actor.max_token_len_per_device") == 24576  # the example's ppo_max_token_len_per_gpu
    assert r.get("actor.strategy") == "fsdp2" and "pipeline parallelism are translated" in r.row(A + "strategy").note
    assert r.get("trainer.nproc_per_node") == 2 and "pipeline parallelism 2 does not divide" in row.note
    cfg = _model_parallel_checked(r)
    assert (cfg.actor.pipeline_parallel_size, cfg.actor.strategy) == (2, "fsdp2")
    cfg = _model_parallel_checked(r, **{"trainer.nproc_per_node": 4})  # 2 data-parallel ranks x 2 stages, sharded
    assert (cfg.actor.pipeline_parallel_size, cfg.actor.strategy) == (2, "fsdp2")


def test_verl_megatron_pipeline_with_tensor_parallelism_is_translated():
    """verirl runs tensor-parallel layers inside pipeline stages: both sizes translated, 2 x 2 = 4 ranks, and the
    converted config passes verirl's checks."""
    r = convert("verl", VERL, [A + "strategy=megatron", R + "name=sglang", f"{PP}=2", f"{MG}tensor_model_parallel_size=2"])
    assert r.row(PP).status == "translated"
    assert r.get("actor.pipeline_parallel_size") == 2 and r.get("actor.tensor_parallel_size") == 2
    assert r.get("trainer.nproc_per_node") == 4
    cfg = _model_parallel_checked(r)
    assert (cfg.actor.pipeline_parallel_size, cfg.actor.tensor_parallel_size) == (2, 2)


def test_verl_megatron_pipeline_with_context_parallelism_is_translated():
    """verirl's stages compose with Ulysses too (each sequence-parallel rank runs the stages on its slice of
    every micro-batch): both sizes translated, 2 x 2 = 4 ranks, and the converted config passes verirl's checks."""
    r = convert("verl", VERL, [A + "strategy=megatron", R + "name=sglang", f"{PP}=2", f"+{MG}context_parallel_size=2"])
    assert r.row(PP).status == "translated"
    assert r.get("actor.pipeline_parallel_size") == 2 and r.get("actor.sequence_parallel_size") == 2
    assert r.get("trainer.nproc_per_node") == 4
    cfg = _model_parallel_checked(r)
    assert (cfg.actor.pipeline_parallel_size, cfg.actor.sequence_parallel_size) == (2, 2)


def test_verl_pipeline_token_budget_from_the_micro_batch():
    """Without use_dynamic_bsz veRL sizes micro-batches by sequences; verirl's stages need a token budget: the
    micro-batch's sequences of the longest length."""
    r = convert("verl", VERL, [*NATIVE, f"{PP}=2", A + "use_dynamic_bsz=false", A + "ppo_micro_batch_size_per_gpu=2"])
    assert r.get("actor.max_token_len_per_device") == 2 * (8192 + 4096)
    assert r.row(PP).targets == ["actor.pipeline_parallel_size", "actor.max_token_len_per_device",
                                 "trainer.nproc_per_node"]
    note = r.row(A + "ppo_micro_batch_size_per_gpu").note
    assert "2 sequences x the longest, prompt 8192 + response 4096 = 24576 tokens written" in note
    _model_parallel_checked(r)
    assert convert("verl", VERL, [*NATIVE, A + "use_dynamic_bsz=false"]).get("actor.max_token_len_per_device") is None


@pytest.mark.parametrize("chunks,status,schedule", [(2, "translated", "interleaved_1f1b"), (1, "translated", None),
                                                    (4, "decide", None)])
def test_verl_megatron_virtual_stages(chunks, status, schedule):
    """Megatron's interleaved 1F1B with 2 model chunks per rank is verirl's interleaved_1f1b (2 stages per rank);
    another count is a decision."""
    r = convert("verl", VERL, [*NATIVE, f"{PP}=2", f"{VPP}={chunks}"])
    assert (r.row(VPP).status, r.get("actor.pipeline_schedule")) == (status, schedule)
    if status == "decide":
        assert "verirl's interleaved_1f1b holds 2 stages per rank" in r.row(VPP).note
    _model_parallel_checked(r)  # the tiny model's 4 layers over 2 ranks x 2 stages
    off = convert("verl", VERL, [*NATIVE, f"{VPP}=2"]).row(VPP)  # no pipeline: nothing to interleave
    assert off.status == "ignored" and "pipeline_model_parallel_size > 1" in off.note


def test_verl_megatron_pipeline_of_the_reference_and_the_rollout():
    ref = "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size"
    r = convert("verl", VERL, [*NATIVE, f"{PP}=2", f"+{ref}=2"])
    assert r.row(ref).status == "ignored" and "actor's layout" in r.row(ref).note
    different = convert("verl", VERL, [*NATIVE, f"{PP}=2", f"+{ref}=1"]).row(ref)
    assert different.status == "decide" and "computed over 2 stages" in different.note
    vllm = convert("verl", VERL, [A + "strategy=megatron", f"{PP}=2"])  # the example's vLLM rollout
    assert vllm.row(PP).status == "translated"  # vLLM takes a pipelined actor
    padded = convert("verl", VERL, [*NATIVE, f"{PP}=2", M + "use_remove_padding=false"])
    assert padded.get("actor.use_remove_padding") is True
    assert "one packed row per micro-batch" in padded.row(M + "use_remove_padding").note


def test_verl_megatron_stage_split_overrides():
    """Megatron's layer splits: its plain pipeline_model_parallel_layout is verirl's actor.pipeline_layers; the first
    and last stage's counts need the model's layer count, so a decision."""
    o = f"+{MG}override_transformer_config."
    r = convert("verl", VERL, [*NATIVE, f"{PP}=2", f"{o}pipeline_model_parallel_layout='Et*1|t*3L'",
                               f"{o}deallocate_pipeline_outputs=true"])
    assert r.get("actor.pipeline_layers") == [1, 3]
    assert r.row(f"{MG}override_transformer_config.deallocate_pipeline_outputs").status == "ignored"
    _model_parallel_checked(r)
    r = convert("verl", VERL, [*NATIVE, f"{PP}=4", f"{o}num_layers_in_first_pipeline_stage=11",
                               f"{o}account_for_loss_in_pipeline_split=false"])
    first = r.row(f"{MG}override_transformer_config.num_layers_in_first_pipeline_stage")
    assert first.status == "decide" and "actor.pipeline_layers" in first.note and "4 numbers" in first.note
    assert r.row(f"{MG}override_transformer_config.account_for_loss_in_pipeline_split").status == "ignored"
    assert convert("verl", VERL, [*NATIVE, f"{o}pipeline_model_parallel_layout='Et|tL'"]).row(
        f"{MG}override_transformer_config.pipeline_model_parallel_layout").status == "ignored"  # no stages


def test_converted_pipeline_yaml_runs_on_its_own_ranks(tmp_path):
    from verirl.config.layout import data_parallel_size

    out = tmp_path / "pp.yaml"
    assert main(["convert-config", "--from", "verl", VERL, *NATIVE, f"{PP}=2", f"{VPP}=2", "-o", str(out)]) == 0
    text = out.read_text()
    assert f"pipeline_parallel_size: 2  # <- {PP}" in text
    assert f"pipeline_schedule: interleaved_1f1b  # <- {VPP}" in text
    cfg = load_config(str(out))
    assert (cfg.actor.pipeline_parallel_size, cfg.trainer.nproc_per_node, cfg.actor.strategy) == (2, 2, "fsdp2")
    assert data_parallel_size(cfg) == 1


def test_verl_megatron_sizes_of_one_and_the_reference():
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang", MG + "pipeline_model_parallel_size=1",
                               MG + "context_parallel_size=1", MG + "virtual_pipeline_model_parallel_size=null",
                               f"{REF_TP}=2"])
    for key in ("pipeline_model_parallel_size", "context_parallel_size"):
        assert (r.row(MG + key).status, r.row(MG + key).note) == ("ignored", "1: none")
    assert r.row(MG + "virtual_pipeline_model_parallel_size").status == "ignored"
    ref = r.row(REF_TP)
    assert ref.status == "ignored" and "actor's layout" in ref.note
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang", f"{REF_TP}=1"])
    assert r.row(REF_TP).status == "decide"
    # without strategy megatron veRL reads no Megatron key
    r = convert("verl", VERL, [MG + "tensor_model_parallel_size=2"])
    assert r.row(MG + "tensor_model_parallel_size").status == "ignored" and r.get("actor.tensor_parallel_size") is None


def test_verl_megatron_tensor_parallelism_packs_sequences():
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang", "actor_rollout_ref.model.use_remove_padding=false"])
    assert r.get("actor.use_remove_padding") is True  # verirl's tensor parallelism needs the packed passes
    assert "true is written" in r.row("actor_rollout_ref.model.use_remove_padding").note


def test_verl_megatron_context_parallelism_is_verirls_sequence_parallelism():
    """Megatron's context parallelism (ring attention) becomes verirl's Ulysses sequence parallelism over the same
    ranks; the group of tensor x sequence parallel ranks sets the fewest ranks."""
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang", f"+{MG}context_parallel_size=2", f"+{REF_CP}=2"])
    row = r.row(MG + "context_parallel_size")
    assert row.status == "translated" and r.get("actor.sequence_parallel_size") == 2
    assert "ring attention" in row.note and "Ulysses" in row.note and "key/value heads divide" in row.note
    assert r.get("actor.tensor_parallel_size") == 2
    assert r.get("trainer.nproc_per_node") == 4 and "trainer.nproc_per_node=4 written" in row.note  # 2 x 2
    assert "tensor parallelism 2 x sequence parallelism 2 = 4 ranks" in r.row(MG + "tensor_model_parallel_size").note
    assert r.row(REF_CP).status == "ignored" and "actor's layout" in r.row(REF_CP).note
    assert convert("verl", VERL, [*MEGATRON, R + "name=sglang", f"+{MG}context_parallel_size=2",
                                  f"+{REF_CP}=1"]).row(REF_CP).status == "decide"
    from verirl.run.checks import check, check_model_parallel

    cfg = _checked(r)
    check(cfg, paths=False)
    cfg.model.path = "tiny"  # 4 heads, 2 key/value heads: 1 key/value head per tensor-parallel rank, split 2 ways
    with pytest.raises(ConfigError, match="sequence_parallel_size"):
        check_model_parallel(cfg)
    cfg.actor.tensor_parallel_size = cfg.rollout.tensor_parallel_size = 1
    check_model_parallel(cfg)  # 4 heads and 2 key/value heads split 2 ways


@pytest.mark.parametrize("where", ["", "fsdp_config."])  # the deprecated key, and fsdp_config's (veRL's head)
def test_verl_ulysses_is_verirls_sequence_parallelism(where):
    key = f"{A}{where}ulysses_sequence_parallel_size"
    ref = f"actor_rollout_ref.ref.{where}ulysses_sequence_parallel_size"
    native = [R + "name=sglang", R + "tensor_model_parallel_size=1"]
    r = convert("verl", VERL, [*native, f"+{key}=4", f"+{ref}=4"])
    row = r.row(key)
    assert row.status == "translated" and row.targets == ["actor.sequence_parallel_size", "trainer.nproc_per_node"]
    assert r.get("actor.sequence_parallel_size") == 4 and "Ulysses in both" in row.note
    assert r.get("trainer.nproc_per_node") == 4 and "sequence parallelism 4 does not divide" in row.note
    assert r.get("actor.tensor_parallel_size") is None
    assert r.row(ref).status == "ignored" and "actor's layout" in r.row(ref).note
    different = convert("verl", VERL, [*native, f"+{key}=4", f"+{ref}=2"]).row(ref)
    assert different.status == "decide" and "actor.sequence_parallel_size=4" in different.note
    assert convert("verl", VERL, [f"+{key}=1"]).row(key).note == "1: none"
    # the example's vLLM rollout: verirl's vllm engine takes an actor split so
    vllm = convert("verl", VERL, [f"+{key}=4"])
    assert vllm.row(key).status == "translated"
    assert vllm.get("actor.sequence_parallel_size") == 4


def test_verl_ulysses_deprecated_key_replaces_fsdp_configs():
    """veRL's FSDPActorConfig copies the deprecated actor-level size over fsdp_config's when it is above 1."""
    legacy, fsdp = A + "ulysses_sequence_parallel_size", A + "fsdp_config.ulysses_sequence_parallel_size"
    r = convert("verl", VERL, [R + "name=sglang", R + "tensor_model_parallel_size=1", f"+{legacy}=2", f"+{fsdp}=4"])
    assert r.get("actor.sequence_parallel_size") == 2
    assert r.row(fsdp).status == "ignored" and "replaced by" in r.row(fsdp).note
    r = convert("verl", VERL, [R + "name=sglang", R + "tensor_model_parallel_size=1", f"+{legacy}=1", f"+{fsdp}=4"])
    assert r.get("actor.sequence_parallel_size") == 4 and r.row(legacy).note == "1: veRL reads fsdp_config's"
    # veRL's Megatron workers read no Ulysses key
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang", f"+{fsdp}=4"])
    assert r.row(fsdp).status == "ignored" and r.get("actor.sequence_parallel_size") is None


def test_verl_sequence_parallel_token_budget_carries_over():
    """veRL packs ppo_max_token_len_per_gpu x the Ulysses size per micro-batch (prepare_micro_batches), as verirl
    packs actor.max_token_len_per_device x actor.sequence_parallel_size."""
    r = convert("verl", VERL, [R + "name=sglang", R + "tensor_model_parallel_size=1",
                               f"+{A}fsdp_config.ulysses_sequence_parallel_size=2"])  # the example: dynamic, 24576
    assert r.get("actor.max_token_len_per_device") == 24576
    assert "the budget carries over unchanged" in r.row(A + "ppo_max_token_len_per_gpu").note
    r = convert("verl", VERL, [*MEGATRON, R + "name=sglang", f"+{MG}context_parallel_size=2"])
    assert r.get("actor.max_token_len_per_device") == 24576
    assert "the budget carries over unchanged" in r.row(A + "ppo_max_token_len_per_gpu").note


def test_verl_sequence_parallelism_packs_sequences():
    r = convert("verl", VERL, [R + "name=sglang", R + "tensor_model_parallel_size=1", M + "use_remove_padding=false",
                               f"+{A}fsdp_config.ulysses_sequence_parallel_size=2"])
    assert r.get("actor.use_remove_padding") is True
    assert "actor.sequence_parallel_size=2 on the packed passes" in r.row(M + "use_remove_padding").note


@pytest.mark.parametrize("ov,status,written", [
    ([R + "name=sglang", R + "tensor_model_parallel_size=1"], "translated", 1),
    ([R + "name=sglang"], "decide", None),  # 2 with an actor of whole layers: neither of the native engine's sizes
    ([R + "name=hf"], "decide", None),  # transformers' generate decodes with the whole weights
    ([R + "name=vllm"], "translated", 2)])  # vLLM's own setting, as before
def test_verl_rollout_tensor_parallelism_by_engine(ov, status, written):
    r = convert("verl", VERL, ov)
    assert r.row(R + "tensor_model_parallel_size").status == status
    assert r.get("rollout.tensor_parallel_size") == written


def test_converted_tensor_parallel_yaml_runs_on_its_own_ranks(tmp_path):
    out = tmp_path / "tp.yaml"
    assert main(["convert-config", "--from", "verl", VERL, *MEGATRON, R + "name=sglang", "-o", str(out)]) == 0
    text = out.read_text()
    assert f"nproc_per_node: 2  # <- {MG}tensor_model_parallel_size" in text
    cfg = load_config(str(out))
    assert (cfg.actor.tensor_parallel_size, cfg.trainer.nproc_per_node, cfg.rollout.tensor_parallel_size) == (2, 2, 2)


def test_converted_tensor_and_sequence_parallel_yaml_runs_on_one_group(tmp_path):
    from verirl.config.layout import data_parallel_size

    out = tmp_path / "tp_sp.yaml"
    assert main(["convert-config", "--from", "verl", VERL, *MEGATRON, R + "name=sglang",
                 f"+{MG}context_parallel_size=2", "-o", str(out)]) == 0
    assert f"nproc_per_node: 4  # <- {MG}tensor_model_parallel_size, {MG}context_parallel_size" in out.read_text()
    cfg = load_config(str(out))
    assert (cfg.actor.tensor_parallel_size, cfg.actor.sequence_parallel_size, cfg.trainer.nproc_per_node) == (2, 2, 4)
    assert data_parallel_size(cfg) == 1


def test_mindspeed_tensor_parallelism_is_verirls():
    r = convert("mindspeed-rl", MSRL)  # actor_config.tensor_model_parallel_size: 4
    assert r.get("actor.tensor_parallel_size") == 4
    assert r.row(AC + "tensor_model_parallel_size").targets == ["actor.tensor_parallel_size", "trainer.nproc_per_node"]
    assert r.get("rollout.tensor_parallel_size") == 4  # generate_config.infer_tensor_parallel_size, vLLM's
    # megatron_training's, where actor_config leaves it out; actor_config's wins where both hold it
    r = convert("mindspeed-rl", MSRL, [f"~{AC}tensor_model_parallel_size", f"+{MT}tensor_model_parallel_size=2"])
    assert r.get("actor.tensor_parallel_size") == 2 and r.get("trainer.nproc_per_node") == 2
    r = convert("mindspeed-rl", MSRL, [f"+{MT}tensor_model_parallel_size=2"])
    assert r.get("actor.tensor_parallel_size") == 4 and r.row(MT + "tensor_model_parallel_size").status == "ignored"
    r = convert("mindspeed-rl", MSRL, [f"{AC}tensor_model_parallel_size=1"])
    assert r.row(AC + "tensor_model_parallel_size").status == "translated" and r.get("trainer.nproc_per_node") is None


MS_PP = AC + "pipeline_model_parallel_size"
LAYER_LIST, PER_CHUNK = AC + "num_layer_list", AC + "num_layers_per_virtual_pipeline_stage"
MS_ONE = [f"{AC}tensor_model_parallel_size=1", f"{GEN}infer_tensor_parallel_size=1"]  # stages alone


def test_mindspeed_pipeline_parallelism_is_verirls():
    """pipeline_model_parallel_size is actor.pipeline_parallel_size and num_layer_list (MindSpeed-RL's comma string)
    actor.pipeline_layers; with the example's tensor parallelism 4 verirl runs tp x pp (one group of 8), its vLLM
    generation too."""
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{LAYER_LIST}=14,14"])
    assert (r.get("actor.pipeline_parallel_size"), r.get("actor.pipeline_layers")) == (2, [14, 14])
    assert r.row(LAYER_LIST).status == "translated" and "num_hidden_layers" in r.row(LAYER_LIST).note
    row = r.row(MS_PP)
    assert row.status == "translated"
    assert "composes pipeline stages" not in row.note
    assert (r.get("actor.tensor_parallel_size"), r.get("trainer.nproc_per_node")) == (4, 8)  # 4 x 2, one group
    assert "tensor parallelism 4 x pipeline parallelism 2 = 8 ranks" in row.note and "16 NPUs" in row.note
    assert r.get("actor.strategy") is None  # the default, fsdp2: each stage sharded over the data-parallel ranks
    assert "shards each stage's parameters" in r.row(MT + "use_distributed_optimizer").note
    # the example's micro_batch_size 1 and no dynamic batches: one longest sequence, prompt 8192 + response 4096
    assert r.get("actor.max_token_len_per_device") == 8192 + 4096
    alone = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{LAYER_LIST}=[1,3]", *MS_ONE])
    assert alone.row(MS_PP).status == "translated"
    assert "composes" not in alone.row(MS_PP).note and alone.get("actor.pipeline_layers") == [1, 3]
    _model_parallel_checked(alone, **{"rollout.engine": "native"})  # the tiny model's 4 layers as 1 + 3
    off = convert("mindspeed-rl", MSRL, [f"+{LAYER_LIST}=14,14"]).row(LAYER_LIST)
    assert off.status == "ignored" and "pipeline_model_parallel_size > 1" in off.note


def test_mindspeed_layer_list_of_another_length_needs_a_decision():
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{LAYER_LIST}=9,9,10"])
    row = r.row(LAYER_LIST)
    assert row.status == "decide" and "3 layer counts for pipeline_model_parallel_size 2" in row.note
    assert r.get("actor.pipeline_layers") is None


@pytest.mark.parametrize("per_chunk,status,schedule,layers", [
    (7, "translated", "interleaved_1f1b", [7, 7, 7, 7]),  # 14 per rank / 7 = 2 chunks: stage k x 2 + r on rank r
    (14, "translated", None, [14, 14]),  # one chunk per rank: 1F1B
    (2, "decide", None, [14, 14])])  # 7 chunks per rank: verirl's interleaved holds 2
def test_mindspeed_virtual_stages(per_chunk, status, schedule, layers):
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{LAYER_LIST}=14,14", f"+{PER_CHUNK}={per_chunk}"])
    assert r.row(PER_CHUNK).status == status
    assert (r.get("actor.pipeline_schedule"), r.get("actor.pipeline_layers")) == (schedule, layers)


def test_mindspeed_virtual_stages_need_the_layer_count():
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{PER_CHUNK}=7"])  # neither num_layers nor num_layer_list
    assert r.row(PER_CHUNK).status == "decide" and r.get("actor.pipeline_schedule") is None
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{PER_CHUNK}=7", f"+{AC}num_layers=28"])
    assert r.get("actor.pipeline_schedule") == "interleaved_1f1b" and r.get("actor.pipeline_layers") is None
    assert "14 layers per rank / 7 per chunk = 2 model chunks" in r.row(PER_CHUNK).note


def test_mindspeed_noop_layers_leave_the_stages():
    """noop_layers are empty layers Megatron inserts and counts in num_layers (grpo_qwen3_235b_a22b_A2: 96 with 5 and
    95 empty over 16 stages): verirl's stages hold the model's own layers."""
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=4", f"+{AC}noop_layers='5,23'", f"+{AC}num_layers=32"])
    assert r.get("actor.pipeline_layers") == [7, 8, 7, 8]
    assert r.row(AC + "noop_layers").status == "translated" and r.row(AC + "num_layers").status == "translated"
    r = convert("mindspeed-rl", MSRL, [f"{MS_PP}=2", f"+{AC}noop_layers='5,23'", f"+{LAYER_LIST}=16,16",
                                       f"+{PER_CHUNK}=8"])  # chunk k of rank r: layers 16k + 8r onwards
    assert (r.get("actor.pipeline_schedule"), r.get("actor.pipeline_layers")) == ("interleaved_1f1b", [7, 8, 7, 8])


def test_mindspeed_ulysses_context_parallelism_is_verirls_sequence_parallelism():
    """context_parallel_algo's default, ulysses_cp_algo, is verirl's sequence parallelism, with MindSpeed-RL's vLLM
    generation too."""
    r = convert("mindspeed-rl", MSRL, [f"+{AC}context_parallel_size=2"])
    row = r.row(AC + "context_parallel_size")
    assert r.get("actor.sequence_parallel_size") == 2 and "actor.sequence_parallel_size" in row.targets
    assert row.status == "translated" and "ring" not in row.note
    algo = r.row(MT + "context_parallel_algo")  # MindSpeed-RL's default, not in the file
    assert (algo.origin, algo.value, algo.status) == ("default", "ulysses_cp_algo", "translated")
    assert "Ulysses in both" in algo.note
    assert (r.get("actor.tensor_parallel_size"), r.get("trainer.nproc_per_node")) == (4, 8)  # one group of 4 x 2
    assert "tensor parallelism 4 x sequence parallelism 2 = 8 ranks" in row.note
    r = convert("mindspeed-rl", MSRL, [f"+{AC}context_parallel_size=2", f"+{AC}context_parallel_algo=ulysses_cp_algo"])
    assert r.row(AC + "context_parallel_algo").status == "translated"


@pytest.mark.parametrize("algo,what", [("megatron_cp_algo", "ring attention (key/value blocks"),
                                       ("hybrid_cp_algo", "not an algorithm MindSpeed-RL takes")])
def test_mindspeed_ring_context_parallelism_needs_a_decision(algo, what):
    r = convert("mindspeed-rl", MSRL, [f"+{AC}context_parallel_size=2", f"+{AC}context_parallel_algo={algo}"])
    row = r.row(AC + "context_parallel_size")
    assert row.status == "decide" and what in row.note and "ring attention is not built in verirl" in row.note
    assert "actor.sequence_parallel_size=1" in row.note
    assert r.get("actor.sequence_parallel_size") == 2  # Ulysses over the same ranks, written
    assert r.row(AC + "context_parallel_algo").status == "decide"


def test_mindspeed_context_parallel_token_budget_is_each_ranks_share():
    """MindSpeed-RL packs max_packing_token_size tokens per micro-batch and splits them over the context-parallel
    group; verirl's budget counts each rank's share."""
    budgets = [f"{RL}use_dynamic_bsz=true", f"+{RL}update_max_packing_token_size=32768",
               f"+{RL}ref_max_packing_token_size=32768"]
    r = convert("mindspeed-rl", MSRL, [*budgets, f"+{AC}context_parallel_size=2"])
    assert r.get("actor.max_token_len_per_device") == 16384 and r.get("ref.log_prob_max_token_len_per_device") is None
    assert "32768 / 2 = 16384 per rank" in r.row(RL + "update_max_packing_token_size").note
    assert "divided by 2" in r.row(AC + "context_parallel_size").note
    assert convert("mindspeed-rl", MSRL, budgets).get("actor.max_token_len_per_device") == 32768
    r = convert("mindspeed-rl", MSRL, [*budgets[:2], f"+{RL}ref_max_packing_token_size=49152",
                                       f"+{AC}context_parallel_size=2"])
    assert r.get("ref.log_prob_max_token_len_per_device") == 24576


# ---------------------------------------------------------------- MindSpeed-RL: versions and splits

def test_mindspeed_mini_batch_by_version():
    # the example: 256 > global_batch_size 64 can only be sequences (pre-2.0): 256 / 8 = 32 prompts
    assert convert("mindspeed-rl", MSRL).get("actor.mini_batch_prompts") == 32
    # a 2.0+ file says 32 for the same run; auto reads it as prompts and says how to read it otherwise
    ov = [RL + "mini_batch_size=32", "~" + RL + "experience_count"]
    r = convert("mindspeed-rl", MSRL, ov)
    assert r.get("actor.mini_batch_prompts") == 32 and "2.0 or later" in r.row(RL + "mini_batch_size").note
    assert any("--mindspeed-rl-version pre-2.0" in w for w in r.warnings)
    r = convert("mindspeed-rl", MSRL, ov, mindspeed_rl_version="pre-2.0")
    assert r.get("actor.mini_batch_prompts") == 4 and r.get("actor.warmup_steps") == round(0.05 * 500 * 16)
    # more prompts than the step holds: one mini-batch, the whole step
    r = convert("mindspeed-rl", MSRL, mindspeed_rl_version="2.0+")
    assert r.get("actor.mini_batch_prompts") == 64 and "one mini-batch" in r.row(RL + "mini_batch_size").note


def test_mindspeed_before_2_0_loss_terms():
    """Before 2.0 MindSpeed-RL's GRPO loss used k3 whatever kl_penalty said, and had no entropy term."""
    r = convert("mindspeed-rl", MSRL, [RL + "kl_penalty=kl", RL + "entropy_coeff=0.01"])
    assert r.get("algo.kl_type") == "low_var_kl" and any("had no effect" in w for w in r.warnings)
    assert r.get("algo.entropy_coef") == 0.0 and "no entropy term" in r.row(RL + "entropy_coeff").note
    r = convert("mindspeed-rl", MSRL, [RL + "kl_penalty=kl", RL + "entropy_coeff=0.01", RL + "mini_batch_size=32",
                                       "~" + RL + "experience_count"])  # read as 2.0+
    assert r.get("algo.kl_type") == "kl" and r.get("algo.entropy_coef") == 0.01


def test_mindspeed_seq_length_split_into_prompt_and_response():
    r = convert("mindspeed-rl", MSRL, ["~" + GEN + "sampling_config.max_tokens"])
    assert r.get("rollout.max_new_tokens") == 12288 - 8192
    assert set(r.row(MT + "seq_length").targets) == {"rollout.max_new_tokens"}
    assert any("no max_tokens" in w for w in r.warnings)
    r = convert("mindspeed-rl", MSRL, [MT + "seq_length=10000"])
    assert r.get("rollout.max_new_tokens") == 4096 and any("less than max_prompt_length" in w for w in r.warnings)


def test_mindspeed_actor_config_wins_over_megatron_training():
    r = convert("mindspeed-rl", MSRL, [MT + "lr=5e-7", MT + "seed=1234"])
    assert r.get("actor.lr") == 1e-6 and r.get("data.seed") == 1
    assert "overridden by actor_config.lr" in r.row(MT + "lr").note and r.row(MT + "lr").status == "ignored"


def test_mindspeed_numerics_and_unknown_rules_need_a_decision():
    r = convert("mindspeed-rl", MSRL, [f"+{MT}norm_epsilon=1e-6",
                                       f"{RL}verifier_function=[base_acc,math_verify_reward]",
                                       f"{RL}verifier_weight=[1.0,1.0]", f"+{RL}some_new_knob=3",
                                       f"{MT}hidden_dropout=0.1"])
    assert r.row(MT + "norm_epsilon").status == "translated"  # the run's own numerics, seed 000's fix
    assert r.get("model.override_config") == {"rms_norm_eps": 1e-6}
    assert r.get("reward.verifiers") == ["base_acc", "math_verify_reward"]  # kept: verirl refuses it at start
    assert r.row(RL + "verifier_function").status == "decide"
    assert r.row(RL + "some_new_knob").status == "unknown"
    assert r.row(MT + "hidden_dropout").status == "decide"


def test_mindspeed_dapo_stage_and_dynamic_batches():
    r = convert("mindspeed-rl", MSRL, [f"{MT}stage=ray_dapo", f"+{RL}clip_higher_enable=true",
                                       f"+{RL}clip_ratio_low=0.2", f"+{RL}clip_ratio_high=0.28",
                                       f"+{RL}use_dynamic_bsz=true", f"+{RL}max_packing_token_size=16384"])
    assert r.get("algo.clip_ratio_high") == 0.28 and r.get("algo.kl_coef") == 0.0
    assert r.get("algo.loss_agg_mode") == "token-mean"  # token_level_loss defaults to true
    assert r.get("actor.max_token_len_per_device") == 16384


# ---------------------------------------------------------------- user errors: one paragraph, exit 2

@pytest.mark.parametrize("argv,message", [
    (["--from", "verl", "no/such/file.yaml"], "does not exist"),
    (["--from", "openrlhf", VERL], "is not a format convert-config reads"),
    (["--from", "verl", VERL, "actor_rollout_ref.rollout.n"], "not of the form key.sub=value"),
    (["--from", "mindspeed-rl", MSRL, "rl_config.mini_batch_size=48"], "fails verirl's checks"),
    (["--from", "verl", VERL, "--train-rows", "0"], "positive integer"),
    (["--from", "verl", VERL, "data.train_batch_size=sixty"], "data.train_batch_size='sixty'"),
    (["--from", "mindspeed-rl", MSRL, "rl_config.n_samples_per_prompt=null"], "rl_config.n_samples_per_prompt=None"),
])
def test_bad_input_is_one_paragraph_and_exit_2(argv, message, capsys):
    assert main(["convert-config", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("verirl convert-config: config error:") and message in err
    assert "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("text,message", [("a: [1, 2\n", "not valid YAML"), ("- 1\n- 2\n", "mapping of keys")])
def test_bad_file_is_one_paragraph_and_exit_2(text, message, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert main(["convert-config", "--from", "mindspeed-rl", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


# ---------------------------------------------------------------- the tables themselves

@pytest.mark.parametrize("module", [convert_verl, convert_mindspeed])
def test_tables_name_real_verirl_keys(module):
    keys = verirl_keys()
    assert {d.target for d in module.DIRECT} <= keys
    assert all(why for _, why in module.IGNORED)


def _registries() -> dict:
    """Every registry of a choice key a table's note may name, by that key."""
    from verirl.config.layout import LAUNCHERS, OFFLOADS, STRATEGIES
    from verirl.core.algo import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
    from verirl.data.prompts import SHUFFLES, TOO_LONG
    from verirl.models.device import COMPUTE_DTYPES, DEVICES
    from verirl.models.load import DTYPES
    from verirl.rewards.rules import RULES
    from verirl.rollout import ENGINES

    return {r.key: r for r in (LAUNCHERS, OFFLOADS, STRATEGIES, ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS,
                                POLICY_LOSSES, SHUFFLES, TOO_LONG, COMPUTE_DTYPES, DEVICES, DTYPES, RULES, ENGINES)}


@pytest.mark.parametrize("module", [convert_verl, convert_mindspeed])
def test_table_notes_name_verirl_choices_its_registries_hold(module):
    """A `key=value` a note of the data tables tells the user to set is a choice of verirl's registry for key."""
    import re

    registries = _registries()
    notes = [why for _, why in module.IGNORED] + [*getattr(module, "NO_LOSS_MODE", {}).values(),
                                                  *getattr(module, "NO_RULE", {}).values()]
    named = {m for note in notes for m in re.findall(r"(?<![\w.])([a-z_]+\.[a-z_.]*[a-z_])=([\w.]+)", note)}
    assert named
    for key, value in named:
        assert key in registries and value in registries[key], f"{key}={value}"


def test_peer_tables_are_package_data():
    """The tables' data files ship in the wheel: pyproject's package-data names each of them."""
    import tomllib
    from fnmatch import fnmatch

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["verirl"]
    package = root / "src" / "verirl"
    files = [f.relative_to(package).as_posix() for f in (package / "tools" / "align").glob("*.yaml")]
    assert sorted(files) == ["tools/align/mindspeed_rl.yaml", "tools/align/verl.yaml"]
    assert all(any(fnmatch(f, g) for g in globs) for f in files)


# ---------------------------------------------------------------- veRL: the algorithm options

def _checked(result):
    """The translation loads as a verirl config and passes the name checks of its algorithm options."""
    from verirl.run.checks import check_algorithms
    from verirl.config import load_config_dict

    cfg = load_config_dict(result.config)
    check_algorithms(cfg)
    return cfg


def _verl_vanilla(logp, old, adv, low, high, c):
    """veRL's compute_policy_loss_vanilla (core_algos.py, January 2026), per token."""
    import torch

    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    clipped1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high))
    return torch.where(adv < 0, torch.min(-adv * c, clipped1), clipped1)


def test_verl_vanilla_loss_is_verirl_dual_clip():
    """veRL's vanilla loss applies the dual clip (clip_ratio_c): verirl's dual_clip is that loss, its vanilla is not."""
    import torch

    from verirl.core.algo import POLICY_LOSSES, PolicyLossParams

    r = convert("verl", VERL, [A + "clip_ratio_c=10.0", A + "clip_ratio_high=0.28"])
    assert r.get("algo.policy_loss") == "dual_clip" and r.get("algo.clip_ratio_c") == 10.0
    assert r.row(A + "clip_ratio_c").targets == ["algo.clip_ratio_c"]
    cfg = _checked(r)
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(4, 16, generator=g) - 1, torch.randn(4, 16, generator=g) - 1
    adv, mask = torch.randn(4, 16, generator=g), torch.ones(4, 16)
    p = PolicyLossParams(cfg.algo.clip_ratio_low, cfg.algo.clip_ratio_high, cfg.algo.clip_ratio_c)
    expected = _verl_vanilla(logp, old, adv, 0.2, 0.28, 10.0)
    torch.testing.assert_close(POLICY_LOSSES[cfg.algo.policy_loss](logp, old, adv, mask, p)[0], expected)
    assert not torch.allclose(POLICY_LOSSES["vanilla"](logp, old, adv, mask, p)[0], expected)  # the dual clip acts
    r = convert("verl", VERL, [A + "clip_ratio_c=1.0"])  # veRL asserts clip_ratio_c > 1
    assert r.row(A + "clip_ratio_c").status == "decide" and r.get("algo.clip_ratio_c") is None


@pytest.mark.parametrize("mode,expected", [
    ("gspo", {"algo.policy_loss": "gspo", "algo.loss_agg_mode": "seq-mean-token-mean", "algo.clip_ratio_low": 0.2,
              "algo.clip_ratio_high": 0.2}),
    ("clip_cov", {"algo.policy_loss": "clip_cov", "algo.clip_cov_ratio": 0.0002, "algo.clip_cov_lb": 1.0,
                  "algo.clip_cov_ub": 5.0}),
    ("kl_cov", {"algo.policy_loss": "kl_cov", "algo.kl_cov_ratio": 0.0002, "algo.ppo_kl_coef": 0.1}),
    ("cispo", {"algo.policy_loss": "cispo", "algo.clip_ratio_max": 1.2}),
])
def test_verl_loss_modes_map_by_name(mode, expected):
    r = convert("verl", VERL, [f"+{A}policy_loss.loss_mode={mode}"])
    flat = _flat(r)
    for key, value in expected.items():
        assert flat[key] == pytest.approx(value), key
    assert "algo.clip_ratio_c" not in flat  # the dual clip is vanilla's only
    _checked(r)
    if mode == "gspo":  # veRL's gspo ignores loss_agg_mode; the KL loss (on in the example) still reads it
        assert r.row(A + "loss_agg_mode").status == "decide" and "KL" in r.row(A + "loss_agg_mode").note
        assert "3e-4" in r.row(A + "clip_ratio_low").note
    if mode == "cispo":  # veRL also floors the weight at 1 - clip_ratio_low: not exact, said so
        assert r.row(A + "policy_loss.loss_mode").status == "decide"
        assert "[0.8, 1.2]" in r.row(A + "policy_loss.loss_mode").note
    if mode == "kl_cov":
        r = convert("verl", VERL, [f"+{A}policy_loss.loss_mode=kl_cov", f"+{A}policy_loss.ppo_kl_coef=0.5"])
        assert r.get("algo.ppo_kl_coef") == 0.5 and r.row(A + "policy_loss.ppo_kl_coef").status == "translated"


@pytest.mark.parametrize("mode", ["gpg", "sapo", "geo_mean", "something_new"])
def test_verl_unsupported_loss_mode_is_reported(mode):
    r = convert("verl", VERL, [f"+{A}policy_loss.loss_mode={mode}"])
    row = r.row(A + "policy_loss.loss_mode")
    assert row.status == "decide" and "not available in verirl" in row.note
    assert r.get("algo.policy_loss") is None and r.get("algo.clip_ratio_c") is None
    assert r.row(A + "clip_ratio_c").status == "ignored"
    assert any(d.key == A + "policy_loss.loss_mode" for d in r.by_status("decide"))


def test_verl_advantage_scaling_and_estimators():
    r = convert("verl", VERL, ["algorithm.norm_adv_by_std_in_grpo=false"])
    assert r.get("algo.scale_rewards") == "none" and r.get("algo.norm_adv_by_std") is None
    r = convert("verl", VERL, ["algorithm.adv_estimator=rloo"])  # veRL's rloo never divides by a std
    assert r.get("algo.adv_estimator") == "rloo" and r.get("algo.scale_rewards") == "none"
    assert r.row("algorithm.norm_adv_by_std_in_grpo").status == "ignored"
    r = convert("verl", VERL, ["algorithm.adv_estimator=reinforce_plus_plus_baseline"])
    assert r.get("algo.adv_estimator") == "reinforce_plus_plus_baseline" and r.get("algo.scale_rewards") is None
    _checked(r)
    r = convert("verl", VERL, ["algorithm.adv_estimator=gae"])
    assert r.row("algorithm.adv_estimator").status == "decide" and r.get("algo.adv_estimator") is None


def test_verl_seq_mean_token_sum_norm_and_its_scale_factor():
    base = [A + "loss_agg_mode=seq-mean-token-sum-norm", A + "use_dynamic_bsz=false",
            "+" + A + "ppo_micro_batch_size_per_gpu=4"]
    r = convert("verl", VERL, base)  # loss_scale_factor null: the padded response width, max_response_length
    assert r.get("algo.loss_agg_mode") == "seq-mean-token-sum-norm" and r.get("algo.loss_scale_factor") == 0.0
    assert r.row(A + "loss_scale_factor").origin == "default" and "max_response_length" in \
        r.row(A + "loss_scale_factor").note
    agg = r.row(A + "loss_agg_mode")
    assert agg.status == "decide" and "grad_clip / 4" in agg.note  # veRL's loss is verirl's x the micro-batch
    r = convert("verl", VERL, base + ["+" + A + "loss_scale_factor=2048"])  # legacy workers ignore it in the loss
    assert r.get("algo.loss_scale_factor") == 0.0 and r.row(A + "loss_scale_factor").status == "decide"
    r = convert("verl", VERL, base + ["+" + A + "loss_scale_factor=2048", "+trainer.use_legacy_worker_impl=disable"])
    assert r.get("algo.loss_scale_factor") == 2048.0 and r.row(A + "loss_scale_factor").status == "translated"
    _checked(r)
    r = convert("verl", VERL, ["+" + A + "loss_scale_factor=2048"])  # token-mean: not read
    assert r.row(A + "loss_scale_factor").status == "ignored" and r.get("algo.loss_scale_factor") is None


RCK = "algorithm.rollout_correction."


def test_verl_rollout_correction_defaults_differ():
    """veRL's correction is off unless asked for (and needs the rollout's log-probs); verirl's rejection is on by
    default, so the translation always writes the two modes."""
    from verirl.config import Config

    assert Config().algo.rollout_correction.rollout_rs == "sequence"  # verirl's default: on
    r = convert("verl", VERL)
    assert r.get("algo.rollout_correction") == {"rollout_is": None, "rollout_rs": None}
    row = r.row(RCK + "rollout_rs")
    assert row.origin == "default" and "verirl's default rejects" in row.note
    # asked for, but veRL keeps no rollout log-probs without calculate_log_probs: it ran without the correction
    r = convert("verl", VERL, [f"+{RCK}rollout_is=token", f"+{RCK}rollout_rs=token_k1",
                               f"+{RCK}rollout_rs_threshold=2.0"])
    assert r.get("algo.rollout_correction") == {"rollout_is": None, "rollout_rs": None}
    assert "calculate_log_probs" in r.row(RCK + "rollout_is").note
    assert r.row(RCK + "rollout_rs_threshold").status == "ignored"


@pytest.mark.parametrize("rs,threshold,lower,expected", [
    ("token_k1", "2.0", None, ("token", 0.5, 2.0)),  # one value: lower bound 1 / upper
    ("seq_sum_k1", "'0.5_2.0'", None, ("sequence", 0.5, 2.0)),
    ("seq_mean_k1", "'0.999_1.001'", None, ("geometric", 1 / 1.001, 1 / 0.999)),
    ("token_k1", "'0.9_1.2'", None, ("token", 1 / 1.2, 1 / 0.9)),  # veRL keeps r in [1/upper, 1/lower]
    ("sequence", "3.0", None, ("sequence", 1 / 3.0, 3.0)),  # veRL of late 2025: a null lower bound is 1 / upper
    ("geometric", "1.01", "0.98", ("geometric", 0.98, 1.01)),
])
def test_verl_rollout_correction_translated(rs, threshold, lower, expected):
    ov = [f"+{R}calculate_log_probs=true", f"+{RCK}rollout_is=sequence", f"+{RCK}rollout_is_threshold=2.5",
          f"+{RCK}rollout_rs={rs}", f"+{RCK}rollout_rs_threshold={threshold}"]
    ov += [f"+{RCK}rollout_rs_threshold_lower={lower}"] if lower else []
    r = convert("verl", VERL, ov)
    rc = r.get("algo.rollout_correction")
    assert rc["rollout_is"] == "sequence" and rc["rollout_is_threshold"] == 2.5
    assert (rc["rollout_rs"], rc["rollout_rs_threshold_lower"], rc["rollout_rs_threshold"]) == pytest.approx(expected)
    assert any("response mask" in w for w in r.warnings)  # rejected tokens leave veRL's loss denominators
    cfg = _checked(r)
    assert cfg.algo.rollout_correction.rollout_rs == expected[0]


def test_verl_rollout_rejection_matches_verl_on_tokens():
    """The translated bounds reject exactly the tokens veRL's token_k1 rejects (rollout_corr_helper.py:
    keep when log(lower) <= -log r <= log(upper))."""
    import math

    import torch

    from verirl.core.algo.correction import rollout_correction

    r = convert("verl", VERL, [f"+{R}calculate_log_probs=true", f"+{RCK}rollout_rs=token_k1",
                               f"+{RCK}rollout_rs_threshold='0.8_1.5'"])
    rc = r.get("algo.rollout_correction")
    g = torch.Generator().manual_seed(1)
    old, roll = torch.randn(8, 32, generator=g) * 0.5, torch.randn(8, 32, generator=g) * 0.5
    mask = torch.ones(8, 32)
    k1 = -(old - roll)
    verl_keep = (k1 >= math.log(0.8)) & (k1 <= math.log(1.5))
    _, rejected = rollout_correction(old, roll, mask, None, 2.0, rc["rollout_rs"], rc["rollout_rs_threshold"],
                                     rc["rollout_rs_threshold_lower"])
    assert 0 < int(rejected.sum()) < rejected.numel()
    assert torch.equal(rejected, ~verl_keep)


@pytest.mark.parametrize("ov,key", [
    ([f"+{RCK}rollout_rs=seq_mean_k3", f"+{RCK}rollout_rs_threshold=0.01"], RCK + "rollout_rs"),
    ([f"+{RCK}rollout_rs='token_k1,seq_max_k2'", f"+{RCK}rollout_rs_threshold=2.0"], RCK + "rollout_rs"),
    ([f"+{RCK}rollout_rs=token_k1"], RCK + "rollout_rs_threshold"),  # veRL refuses rs without a threshold
    ([f"+{RCK}rollout_is=token", f"+{RCK}rollout_is_batch_normalize=true"], RCK + "rollout_is_batch_normalize"),
    ([f"+{RCK}bypass_mode=true"], RCK + "bypass_mode"),
])
def test_verl_rollout_correction_not_available(ov, key):
    r = convert("verl", VERL, [f"+{R}calculate_log_probs=true", *ov])
    assert r.row(key).status == "decide"
    _checked(r)


def test_verl_dapo_dynamic_sampling_and_overlong_penalty(tmp_path):
    """The DAPO recipe's keys: algorithm.filter_groups.* and the overlong buffer, in each place veRL kept it."""
    ov = ["+algorithm.filter_groups.enable=true", "+algorithm.filter_groups.metric=acc",
          "+algorithm.filter_groups.max_num_gen_batches=10", "+data.gen_batch_size=192",
          "+reward_model.reward_manager=dapo", "+reward_model.overlong_buffer.enable=true",
          "+reward_model.overlong_buffer.len=1024", "+reward_model.overlong_buffer.penalty_factor=0.5",
          "+reward_model.overlong_buffer.log=false"]
    r = convert("verl", VERL, ov)
    assert r.get("algo.filter_groups") == {"enable": True, "metric": "compute_score", "max_num_gen_batches": 30}
    assert "10 x 192 prompts = 30 batches of 64" in r.row("algorithm.filter_groups.max_num_gen_batches").note
    assert r.get("reward.overlong_buffer") == {"enable": True, "len": 1024, "penalty_factor": 0.5}
    assert r.row("reward_model.reward_manager").status == "translated"
    assert r.row("reward_model.overlong_buffer.log").status == "ignored"
    assert not r.by_status("unknown")
    _checked(r)
    out = tmp_path / "dapo.yaml"
    assert main(["convert-config", "--from", "verl", VERL, *ov, "-o", str(out)]) == 0
    cfg = load_config(str(out))  # the sub-sections are written nested, and load
    assert cfg.algo.filter_groups.enable and cfg.algo.filter_groups.max_num_gen_batches == 30
    assert cfg.reward.overlong_buffer.len == 1024 and cfg.algo.rollout_correction.rollout_rs is None
    assert "  filter_groups:\n    enable: true  # <- algorithm.filter_groups.enable" in out.read_text()


@pytest.mark.parametrize("prefix,max_key", [("+reward.reward_kwargs.overlong_buffer_cfg.", "+reward.reward_kwargs."),
                                            ("+reward_model.reward_kwargs.overlong_buffer_cfg.",
                                             "+reward_model.reward_kwargs.")])
def test_verl_overlong_buffer_in_reward_kwargs(prefix, max_key):
    ov = [prefix + "enable=true", prefix + "len=512", prefix + "penalty_factor=1.0"]
    r = convert("verl", VERL, ov + [max_key + "max_resp_len=4096"])
    assert r.get("reward.overlong_buffer") == {"enable": True, "len": 512, "penalty_factor": 1.0}
    assert r.row(max_key[1:] + "max_resp_len").status == "translated"
    _checked(r)
    r = convert("verl", VERL, ov + [max_key + "max_resp_len=3000"])  # measured from another length: flagged
    assert r.row(max_key[1:] + "max_resp_len").status == "decide"
    r = convert("verl", VERL, [prefix + "enable=false", prefix + "len=512"])
    assert r.get("reward.overlong_buffer") is None and r.row(prefix[1:] + "len").status == "ignored"


@pytest.mark.parametrize("metric,written,status", [("seq_reward", "reward", "translated"),
                                                   ("seq_final_reward", "reward", "translated"),
                                                   ("pred", "reward", "decide"), ("null", "reward", "decide")])
def test_verl_filter_groups_metrics(metric, written, status):
    r = convert("verl", VERL, ["+algorithm.filter_groups.enable=true", f"+algorithm.filter_groups.metric={metric}"])
    assert r.get("algo.filter_groups.metric") == written
    assert r.row("algorithm.filter_groups.metric").status == status
    assert r.get("algo.filter_groups.max_num_gen_batches") == 0  # veRL's default 0: no limit


# ---------------------------------------------------------------- MindSpeed-RL: DAPO's keys

DAPO = [f"{MT}stage=ray_dapo", f"+{RL}filter_groups_enable=true", f"+{RL}filter_groups_metric=base_acc",
        f"+{RL}filter_groups_max_batches=3", f"+{RL}filter_groups_train_batch_size=32",
        f"+{RL}overlong_buffer_enable=true", f"+{RL}overlong_buffer=1024", f"+{RL}overlong_buffer_penalty_factor=0.5",
        f"+{RL}rollout_max_tokens=4096"]


def test_mindspeed_dapo_dynamic_sampling_and_overlong_penalty():
    r = convert("mindspeed-rl", MSRL, DAPO)
    assert r.get("algo.filter_groups") == {"enable": True, "metric": "base_acc", "max_num_gen_batches": 6}
    assert r.get("data.prompts_per_step") == 32  # the trained batch: filter_groups_train_batch_size
    assert r.row(MT + "global_batch_size").status == "decide"  # generation batches of 64 prompts there
    assert r.get("actor.mini_batch_prompts") == 32
    assert r.get("reward.overlong_buffer") == {"enable": True, "len": 1024, "penalty_factor": 0.5}
    assert r.row(RL + "rollout_max_tokens").status == "translated"
    assert r.get("algo.policy_loss") == "vanilla" and r.get("algo.rollout_correction.rollout_rs", "x") is None
    for key in ("filter_groups_enable", "filter_groups_metric", "filter_groups_max_batches",
                "filter_groups_train_batch_size", "overlong_buffer_enable", "overlong_buffer",
                "overlong_buffer_penalty_factor"):
        assert r.row(RL + key).status == "translated", key
    _checked(r)


def test_mindspeed_dapo_keys_that_need_a_decision():
    r = convert("mindspeed-rl", MSRL, DAPO + [f"{RL}rollout_max_tokens=2048", f"{RL}filter_groups_metric=format2",
                                              f"{RL}overlong_buffer=0"])
    assert r.row(RL + "rollout_max_tokens").status == "decide"  # MindSpeed-RL refuses it unequal to max_tokens
    assert r.row(RL + "filter_groups_metric").status == "decide" and r.get("algo.filter_groups.metric") is None
    assert r.row(RL + "overlong_buffer").status == "decide" and r.get("reward.overlong_buffer.len") is None
    r = convert("mindspeed-rl", MSRL, DAPO[1:] + [f"{RL}filter_groups_max_batches=-1"])  # GRPO stage: no filtering
    assert r.get("algo.filter_groups") is None and r.row(RL + "filter_groups_enable").status == "ignored"
    assert r.get("data.prompts_per_step") == 64
    assert r.get("reward.overlong_buffer.enable") is True  # the rule reward adds it in any stage
    r = convert("mindspeed-rl", MSRL, DAPO + [f"{RL}filter_groups_max_batches=0"])
    assert r.get("algo.filter_groups.max_num_gen_batches") == 0


# ---------------------------------------------------------------- multi-turn rollouts with tools

MTK, AGENT, SAMP = R + "multi_turn.", R + "agent.", GEN + "sampling_config."
TOOLS_YAML = """tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k.
        parameters: {type: object, properties: {answer: {type: string, description: the answer}}, required: [answer]}
"""
FUNCTION_TOOLS = '''from verl.tools.function_tool import function_tool


@function_tool
def get_weather(city: str) -> dict:
    """Get the current weather for a city.

    Args:
        city: The city to look up.
    """
    return {"city": city}


@function_tool("web_search")
def search(query: str) -> str:
    """Search the web.

    Args:
        query: What to look for.
    """
    return query


@function_tool
async def fetch_url(url: str) -> str:
    """Fetch a URL.

    Args:
        url: The URL.
    """
    return url


def helper(x: int) -> int:
    return x
'''


@pytest.fixture
def tools_yaml(tmp_path):
    path = tmp_path / "tool_config.yaml"
    path.write_text(TOOLS_YAML)
    return str(path)


def _verl_multi_turn(tools_yaml, *more):
    return convert("verl", VERL, [f"+{MTK}enable=true", f"+{MTK}tool_config_path={tools_yaml}", *more])


def test_verl_multi_turn_keys_become_rollout_multi_turn(tools_yaml):
    r = _verl_multi_turn(tools_yaml, f"+{MTK}max_assistant_turns=5", f"+{MTK}max_user_turns=3",
                         f"+{MTK}max_tool_response_length=1200", f"+{MTK}format=hermes",
                         f"+{MTK}tokenization_sanity_check_mode=ignore_strippable", f"+{MTK}num_repeat_rollouts=2")
    assert r.get("rollout.multi_turn") == {
        "enable": True, "tools": [tools_yaml], "max_turns": 5, "max_env_turns": 3,
        "max_tool_response_chars": 1200,  # veRL's max_tool_response_length counts characters
        "max_tool_response_tokens": 4096,  # no token cap in veRL: the response length bounds the episode
        "parser": "hermes"}
    for key, targets in ((MTK + "enable", ["rollout.multi_turn.enable"]),
                         (MTK + "tool_config_path", ["rollout.multi_turn.tools"]),
                         (MTK + "max_assistant_turns", ["rollout.multi_turn.max_turns"]),
                         (MTK + "max_user_turns", ["rollout.multi_turn.max_env_turns"]),
                         (MTK + "format", ["rollout.multi_turn.parser"])):
        assert (r.row(key).status, r.row(key).targets) == ("translated", targets), key
    row = r.row(MTK + "max_tool_response_length")
    assert row.status == "translated" and "characters" in row.note
    assert row.targets == ["rollout.multi_turn.max_tool_response_chars", "rollout.multi_turn.max_tool_response_tokens"]
    assert r.row(MTK + "tokenization_sanity_check_mode").status == "ignored"
    assert "never re-tokenizes" in r.row(MTK + "tokenization_sanity_check_mode").note
    assert r.row(MTK + "num_repeat_rollouts").status == "ignored"
    # veRL's defaults the translation used: rows marked default
    chat = r.row(MTK + "use_inference_chat_template")
    assert (chat.origin, chat.status) == ("default", "translated") and "token ids the rollout recorded" in chat.note
    for key, what in ((MTK + "tool_response_truncate_side", "first N/2 and the last N/2"),
                      (MTK + "max_parallel_calls", "only the first tool call")):
        assert (r.row(key).origin, r.row(key).status) == ("default", "decide") and what in r.row(key).note
    assert "verirl's own gsm8k tool" in r.row(MTK + "tool_config_path").note  # veRL's Gsm8kTool: verirl's checker
    assert any(tools_yaml in c and "copy it" in c for c in r.checks)
    assert any("agent_name" in c for c in r.checks)
    # veRL's vLLM engine over 2 devices: verirl's multi-turn loop decodes with one vLLM engine per rank
    tp = r.row(R + "tensor_model_parallel_size")
    assert r.get("rollout.tensor_parallel_size") == 1 and tp.status == "decide" and "row by row" in tp.note
    cfg = _checked(r)
    assert cfg.rollout.multi_turn.enable and cfg.rollout.multi_turn.max_tool_response_chars == 1200


def test_verl_multi_turn_null_limits_are_the_response_length(tools_yaml):
    """veRL's null (or 0) max_assistant_turns is no limit but the response length: one turn samples at least one
    token, so max_turns = rollout.max_new_tokens is the same bound; null max_user_turns is verirl's 0 (= max_turns)."""
    r = _verl_multi_turn(tools_yaml)
    assert r.get("rollout.multi_turn.max_turns") == 4096 and r.get("rollout.multi_turn.max_env_turns") is None
    assert r.row(MTK + "max_assistant_turns").origin == "default"
    assert r.row(MTK + "max_user_turns").status == "translated" and "null" in r.row(MTK + "max_user_turns").note
    assert r.get("rollout.multi_turn.max_total_tokens") is None  # 0 = rollout.max_new_tokens, veRL's response length
    assert "whole episode" in r.row("data.max_response_length").note
    r = _verl_multi_turn(tools_yaml, f"+{MTK}max_assistant_turns=0", "data.max_response_length=1024")
    assert r.get("rollout.multi_turn.max_turns") == 1024  # veRL tests the limit for truth: 0 is none


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_verl_tool_response_cut_side_is_a_decision(tools_yaml, side):
    """veRL's sides swapped between volcengine/verl (January 2026) and verl-project/verl (1dda039b); verirl keeps the
    first characters."""
    row = _verl_multi_turn(tools_yaml, f"+{MTK}tool_response_truncate_side={side}").row(
        MTK + "tool_response_truncate_side")
    assert row.status == "decide" and "first rollout.multi_turn.max_tool_response_chars" in row.note
    assert ("1dda039b" in row.note) == (side != "middle")


@pytest.mark.parametrize("fmt,status,parser", [("hermes", "translated", "hermes"),
                                               ("llama3_json", "translated", "llama3"),
                                               ("gpt-oss", "decide", None), ("qwen3_coder", "decide", None)])
def test_verl_tool_call_formats(tools_yaml, fmt, status, parser):
    r = _verl_multi_turn(tools_yaml, f"+{MTK}format={fmt}")
    assert r.row(MTK + "format").status == status and r.get("rollout.multi_turn.parser") == parser
    if parser is None:
        assert "auto" in r.row(MTK + "format").note


def test_verl_tool_agent_loop_turns_multi_turn_on(tools_yaml):
    """veRL's agent loop picks the tool agent by name: default_agent_loop=tool_agent runs it on every row, with or
    without multi_turn.enable; an agent loop of the user's own is verirl's environment class."""
    r = convert("verl", VERL, [f"+{AGENT}default_agent_loop=tool_agent", f"+{MTK}tool_config_path={tools_yaml}"])
    assert r.get("rollout.multi_turn.enable") is True
    assert r.row(AGENT + "default_agent_loop").targets == ["rollout.multi_turn.enable"]
    r = convert("verl", VERL, [f"+{AGENT}default_agent_loop=my_agent", f"+{AGENT}agent_loop_config_path=loops.yaml"])
    for key in (AGENT + "default_agent_loop", AGENT + "agent_loop_config_path"):
        assert r.row(key).status == "decide" and "rollout.multi_turn.environment" in r.row(key).note
    assert r.get("rollout.multi_turn.enable") is None
    r = convert("verl", VERL, [f"+{AGENT}default_agent_loop=single_turn_agent", f"+{AGENT}num_workers=8"])
    assert r.row(AGENT + "default_agent_loop").status == "ignored" and r.row(AGENT + "num_workers").status == "ignored"


def test_verl_function_tool_path_names_each_function(tools_yaml, tmp_path):
    """multi_turn.function_tool_path (verl-project/verl, 2026): the file's @function_tool functions, read as source,
    each a verirl tool file.py:function; a renamed or async one needs a decision."""
    path = tmp_path / "function_tools.py"
    path.write_text(FUNCTION_TOOLS)
    r = _verl_multi_turn(tools_yaml, f"+{MTK}function_tool_path={path}", f"+data.function_tool_path={path}")
    assert r.get("rollout.multi_turn.tools") == [tools_yaml, f"{path}:get_weather", f"{path}:search"]
    row = r.row(MTK + "function_tool_path")
    assert row.status == "decide" and "get_weather, search" in row.note
    assert "'web_search'" in row.note and "fetch_url" in row.note  # renamed; async (left out)
    assert r.row("data.function_tool_path").status == "translated"  # the same file: the prompt's tools
    assert any("veRL must be installed" in c for c in r.checks)
    r = convert("verl", VERL, [f"+{MTK}enable=true", f"+{MTK}function_tool_path=/other/machine/tools.py"])
    assert r.row(MTK + "function_tool_path").status == "decide" and "cannot be read here" in r.row(
        MTK + "function_tool_path").note
    assert r.get("rollout.multi_turn.enable") is None  # nothing verirl can call: left off, said so
    assert "nothing to call" in r.row(MTK + "enable").note


def test_verl_multi_turn_choices_the_user_makes(tools_yaml):
    r = _verl_multi_turn(tools_yaml, f"+{MTK}use_inference_chat_template=true",
                         f"+{MTK}interaction_config_path=interaction.yaml", f"+{MTK}max_tool_response_length=0")
    assert r.row(MTK + "use_inference_chat_template").status == "decide"
    assert "never re-rendered" in r.row(MTK + "use_inference_chat_template").note
    inter = r.row(MTK + "interaction_config_path")
    assert inter.status == "decide" and "rollout.multi_turn.environment=file.py:Class" in inter.note
    assert r.row(MTK + "max_tool_response_length").status == "decide"
    assert r.get("rollout.multi_turn.max_tool_response_chars") is None
    # an older veRL's max_turns, before max_assistant_turns / max_user_turns
    r = _verl_multi_turn(tools_yaml, f"+{MTK}max_turns=8")
    assert r.get("rollout.multi_turn.max_turns") == 8 and r.row(MTK + "max_turns").status == "decide"


def test_verl_tool_configs_with_and_without_multi_turn(tools_yaml):
    """data.tool_config_path (veRL's prompts list these tools) with multi-turn off: no tool runs there, and verirl
    shows tools only in multi-turn episodes; with multi-turn on and the same file: the same tools."""
    r = convert("verl", VERL, [f"+data.tool_config_path={tools_yaml}"])
    assert r.row("data.tool_config_path").status == "decide" and r.get("rollout.multi_turn.enable") is None
    r = _verl_multi_turn(tools_yaml, f"+data.tool_config_path={tools_yaml}")
    assert r.row("data.tool_config_path").status == "translated"
    r = _verl_multi_turn(tools_yaml, "+data.tool_config_path=other.yaml")
    assert r.row("data.tool_config_path").status == "decide"
    r = convert("verl", VERL, [f"+{MTK}enable=false", f"+{MTK}max_assistant_turns=5", "+data.tool_config_path=null"])
    for key in (MTK + "enable", MTK + "max_assistant_turns", "data.tool_config_path"):
        assert r.row(key).status == "ignored", key
    assert r.get("rollout.multi_turn") is None


def test_verl_multi_turn_key_of_another_version_is_unknown_when_on(tools_yaml):
    r = _verl_multi_turn(tools_yaml, f"+{MTK}use_xml_tool_parser=true")
    assert r.row(MTK + "use_xml_tool_parser").status == "unknown"
    off = convert("verl", VERL, [f"+{MTK}use_xml_tool_parser=true"])
    assert off.row(MTK + "use_xml_tool_parser").status == "ignored"  # multi-turn is off


def test_converted_multi_turn_yaml_passes_plan(tools_yaml, tmp_path, capsys):
    """A veRL multi-turn config with a tool config converts to a verirl config that `verirl plan` takes (its model,
    data and engine pointed at this machine's)."""
    out = tmp_path / "multi_turn.yaml"
    assert main(["convert-config", "--from", "verl", VERL, f"+{MTK}enable=true", f"+{MTK}max_assistant_turns=4",
                 f"+{MTK}tool_config_path={tools_yaml}", "-o", str(out)]) == 0
    text = out.read_text()
    assert f"tools: [{tools_yaml}]  # <- {MTK}tool_config_path" in text and f"enable: true  # <- {MTK}enable" in text
    capsys.readouterr()
    here = ["model.path=tiny", "data.train_path=''", "eval.data=''", "reward.verifiers=[acc]", "reward.weights=[1.0]",
            "rollout.engine=native", f"trainer.run_dir={tmp_path / 'run'}"]
    assert main(["plan", "--config", str(out), *here]) == 0, capsys.readouterr().err
    cfg = load_config(str(out), here)
    assert (cfg.rollout.multi_turn.enable, cfg.rollout.multi_turn.tools, cfg.rollout.multi_turn.max_turns) == (
        True, [tools_yaml], 4)


def _mindspeed_multi_turn(*more):
    return convert("mindspeed-rl", MSRL, [f"+{RL}multi_turn_enable=true",
                                          f"+{RL}tool_config_path=./configs/tools/retool_config.yaml", *more])


def test_mindspeed_multi_turn_keys_become_rollout_multi_turn():
    r = _mindspeed_multi_turn(f"+{RL}max_tool_calls=3", f"+{RL}max_parallel_calls=1",
                              f"+{RL}max_total_response_length=8192", f"+{RL}max_tool_response_length=512",
                              f"+{RL}tool_response_truncate_side=left", f"+{RL}tool_parser_format=hermes")
    assert r.get("rollout.multi_turn") == {
        "enable": True, "tools": ["./configs/tools/retool_config.yaml"],
        "max_env_turns": 3, "max_turns": 4,  # 3 rounds of tool calls, then the answer
        "max_tool_response_chars": 512, "max_tool_response_tokens": 8192, "parser": "hermes"}
    # the episode's response (turns and tool responses) is capped by max_total_response_length, not max_tokens
    assert r.get("rollout.max_new_tokens") == 8192 and r.out_from["rollout.max_new_tokens"] == [
        RL + "max_total_response_length"]
    assert "max_total_response_length" in r.row(SAMP + "max_tokens").note
    for key in ("multi_turn_enable", "tool_config_path", "max_tool_calls", "max_total_response_length",
                "max_tool_response_length", "tool_response_truncate_side", "tool_parser_format"):
        assert r.row(RL + key).status == "translated", key
    assert r.row(RL + "max_parallel_calls").status == "decide"
    assert "ends MindSpeed-RL's episode" in r.row(RL + "tool_config_path").note
    assert any("ChatML" in c for c in r.checks) and any("retool_config.yaml" in c for c in r.checks)
    # MindSpeed-RL's vLLM engine over 4 devices: one vLLM engine per rank in verirl's multi-turn loop
    tp = r.row(GEN + "infer_tensor_parallel_size")
    assert r.get("rollout.tensor_parallel_size") == 1 and tp.status == "decide"
    _checked(r)


def test_mindspeed_multi_turn_defaults_and_decisions():
    """MindSpeed-RL's defaults (rl_config.py): max_tool_calls 0 runs no tool (one turn), max_parallel_calls 0 answers
    none, max_tool_response_length 0 cuts every response; a total under max_tokens it refuses."""
    r = _mindspeed_multi_turn(f"+{RL}max_total_response_length=4096")
    assert r.get("rollout.multi_turn.max_turns") == 1 and r.get("rollout.multi_turn.max_env_turns") is None
    assert r.row(RL + "max_tool_calls").origin == "default"
    for key in ("max_parallel_calls", "max_tool_response_length", "tool_response_truncate_side", "tool_parser_format"):
        assert (r.row(RL + key).origin, r.row(RL + key).status) == ("default", "decide"), key
    r = _mindspeed_multi_turn(f"+{RL}max_total_response_length=1024")  # < max_tokens 4096
    assert r.row(RL + "max_total_response_length").status == "decide" and r.get("rollout.max_new_tokens") == 4096
    r = _mindspeed_multi_turn(f"+{RL}max_total_response_length=4096", f"+{RL}tool_response_truncate_side=right")
    assert r.row(RL + "tool_response_truncate_side").status == "decide"
    r = convert("mindspeed-rl", MSRL, [f"+{RL}multi_turn_enable=true"])  # no tool config
    assert r.row(RL + "multi_turn_enable").status == "decide" and r.get("rollout.multi_turn.enable") is None
    r = convert("mindspeed-rl", MSRL, [f"+{RL}multi_turn_enable=false", f"+{RL}max_tool_calls=2"])
    assert r.row(RL + "multi_turn_enable").status == "translated" and r.row(RL + "max_tool_calls").status == "ignored"
    r = _mindspeed_multi_turn(f"+{RL}max_total_response_length=4096", f"+{RL}tool_timeout=30")
    assert r.row(RL + "tool_timeout").status == "unknown"


def test_tool_formats_are_verirl_parsers():
    from verirl.config.schema import MultiTurnConfig  # noqa: F401  (the key exists)

    parsers = pytest.importorskip("verirl.envs.parsers").PARSERS
    for module in (convert_verl, convert_mindspeed):
        assert set(module.TOOL_FORMATS.values()) <= set(parsers), module.__name__


# ---------------------------------------------------------------- LoRA

LORA_HF = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # Megatron's four layers


def _loaded(fmt: str, path: str, overrides: list[str], tmp_path):
    """The converted YAML (`verirl convert-config -o`) as verirl's schema loads it."""
    out = tmp_path / "converted.yaml"
    assert main(["convert-config", "--from", fmt, path, *overrides, "-o", str(out)]) == 0
    return load_config(str(out))


def test_verl_lora_keys_become_actor_lora(tmp_path):
    """veRL's FSDP engine's peft keys (hf_model.yaml: lora_rank, lora_alpha, target_modules) are verirl's."""
    ov = [f"{M}lora_rank=32", f"{M}lora_alpha=64", f"{M}target_modules=[q_proj,v_proj]"]
    r = convert("verl", VERL, ov)
    assert r.get("actor.lora") == {"rank": 32, "alpha": 64.0, "target_modules": ["q_proj", "v_proj"]}
    for key, target in (("lora_rank", "actor.lora.rank"), ("lora_alpha", "actor.lora.alpha"),
                        ("target_modules", "actor.lora.target_modules")):
        row = r.row(M + key)
        assert (row.status, row.targets, row.origin) == ("translated", [target], "override"), key
    assert "reference from the actor with its adapters off" in r.row(M + "lora_rank").note
    cfg = _loaded("verl", VERL, ov, tmp_path)
    lo = cfg.actor.lora
    assert (lo.rank, lo.alpha, list(lo.target_modules), lo.init) == (32, 64.0, ["q_proj", "v_proj"], "true")
    # veRL's defaults where the run script gives the rank alone: alpha 16 and all-linear, rows marked default
    r = convert("verl", VERL, [f"{M}lora_rank=8"])
    assert r.get("actor.lora") == {"rank": 8, "alpha": 16.0, "target_modules": "all-linear"}
    assert r.row(M + "lora_alpha").origin == r.row(M + "target_modules").origin == "default"


def test_verl_lora_rank_0_is_off():
    r = convert("verl", VERL, [f"{M}lora_rank=0", f"{M}lora_alpha=64", f"{M}target_modules=[q_proj]"])
    assert r.get("actor.lora") is None  # verirl's rank 0: every weight trained
    assert r.row(M + "lora_rank").status == "ignored" and "LoRA is off" in r.row(M + "lora_rank").note
    assert r.row(M + "lora_alpha").status == r.row(M + "target_modules").status == "ignored"
    # the Megatron engine's section of veRL's generated configs, rank 0
    r = convert("verl", VERL, [f"+{M}lora.rank=0", f"+{M}lora.alpha=32", f"+{M}lora.merge=false"])
    assert r.get("actor.lora") is None
    assert {r.row(M + k).status for k in ("lora.rank", "lora.alpha", "lora.merge")} == {"ignored"}
    # veRL's generated Megatron config holds the FSDP engine's lora_rank 0 too
    r = convert("verl", VERL, [f"{A}strategy=megatron", f"{M}lora_rank=0"])
    assert r.get("actor.lora") is None and r.row(M + "lora_rank").status == "ignored"


def test_verl_lora_keys_verirl_does_otherwise():
    r = convert("verl", VERL, [f"{M}lora_rank=16", f"{M}target_modules=.*q_proj", f"+{M}exclude_modules=[o_proj]",
                               f"+{M}lora_adapter_path=/ckpt/adapter", f"+{R}layered_summon=true",
                               f"+{M}use_shm=true", f"+{M}lora.merge=true"])
    assert r.get("actor.lora") == {"rank": 16, "alpha": 16.0}  # verirl's all-linear left
    row = r.row(M + "target_modules")
    assert row.status == "decide" and "regular expression" in row.note
    row = r.row(M + "exclude_modules")
    assert row.status == "decide" and "no exclusions" in row.note
    row = r.row(M + "lora_adapter_path")
    assert row.status == "decide" and "continues training this LoRA adapter" in row.note
    assert "trainer.resume" in row.note and "merged" in row.note
    assert r.row(R + "layered_summon").status == "ignored" and "adapters" in r.row(R + "layered_summon").note
    assert r.row(M + "use_shm").status == "ignored"
    row = r.row(M + "lora.merge")
    assert row.status == "ignored" and "LoRA request" in row.note  # verirl's vLLM engine gets the adapters
    # lora.rank is the Megatron engine's; veRL's FSDP engine trains no adapters from it
    r = convert("verl", VERL, [f"+{M}lora.rank=8"])
    assert r.row(M + "lora.rank").status == "decide" and r.get("actor.lora") is None


def test_verl_megatron_lora_keys(tmp_path):
    """veRL's Megatron engine (model.lora.*, Megatron-Bridge's): rank, alpha and the A initialisation translated, the
    fused layers (linear_qkv, linear_fc1) the Hugging Face model's, a decision; canonical_lora's layers exactly."""
    ov = [f"{A}strategy=megatron", f"{M}lora.rank=32", f"{M}lora.alpha=64", f"{M}lora.lora_A_init_method=kaiming"]
    r = convert("verl", VERL, ov)  # examples/grpo_trainer/run_qwen2-7b_math_megatron_lora.sh's keys
    assert r.get("actor.lora") == {"rank": 32, "alpha": 64.0, "target_modules": LORA_HF, "init": "true"}
    assert r.row(M + "lora.rank").status == r.row(M + "lora.alpha").status == "translated"
    assert r.row(M + "lora.lora_A_init_method").targets == ["actor.lora.init"]
    row = r.row(M + "lora.target_modules")  # veRL's default [linear_qkv, linear_proj, linear_fc1, linear_fc2]
    assert (row.status, row.origin, row.targets) == ("decide", "default", ["actor.lora.target_modules"])
    assert "linear_qkv -> q_proj/k_proj/v_proj" in row.note and "verirl has no fused adapter" in row.note
    cfg = _loaded("verl", VERL, ov, tmp_path)
    assert (cfg.actor.lora.rank, list(cfg.actor.lora.target_modules)) == (32, LORA_HF)
    r = convert("verl", VERL, [f"{A}strategy=megatron", f"{M}lora.rank=16", f"+{M}lora.type=canonical_lora",
                               f"{M}lora.target_modules=[linear_q,linear_v,linear_fc2]", f"{M}lora.dropout=0.05"])
    assert r.get("actor.lora") == {"rank": 16, "alpha": 32.0, "target_modules": ["q_proj", "v_proj", "down_proj"],
                                   "dropout": 0.05}
    assert r.row(M + "lora.target_modules").status == "translated"
    row = r.row(M + "lora.lora_A_init_method")  # Megatron-Bridge's default xavier: no peft initialisation
    assert (row.status, row.origin) == ("decide", "default") and "Xavier" in row.note
    r = convert("verl", VERL, [f"{A}strategy=megatron", f"{M}lora.rank=16", f"+{M}lora.type=dora",
                               f"{M}lora.target_modules=[linear_qkv,router]", f"{M}lora_rank=8"])
    assert r.row(M + "lora.type").status == "decide" and "no DoRA" in r.row(M + "lora.type").note
    row = r.row(M + "lora.target_modules")
    assert row.status == "decide" and "router" in row.note and r.get("actor.lora.target_modules") is None
    row = r.row(M + "lora_rank")  # the FSDP engine's key, which the Megatron engine does not read
    assert row.status == "decide" and "model.lora" in row.note and r.get("actor.lora.rank") == 16


def test_mindspeed_lora_keys_become_actor_lora(tmp_path):
    """MindSpeed-RL's megatron_training LoRA keys (megatron_config.py; configs/grpo_lora_qwen25_32b_A2.yaml): LoRA is on
    where lora_target_modules names Megatron's layers; actor_config's key wins, as MindSpeed-RL merges them."""
    ov = [f"+{MT}lora_r=64", f"+{MT}lora_alpha=128", f"+{MT}lora_target_modules=[linear_proj,linear_fc2]",
          f"+{AC}lora_r=32", f"+{RL}share_backbone=true"]
    r = convert("mindspeed-rl", MSRL, ov)
    assert r.get("actor.lora") == {"rank": 32, "alpha": 128.0, "target_modules": ["o_proj", "down_proj"]}
    assert r.row(AC + "lora_r").targets == ["actor.lora.rank"] and r.row(MT + "lora_r").status == "ignored"
    assert (r.row(MT + "lora_alpha").status, r.row(MT + "lora_alpha").targets) == ("translated", ["actor.lora.alpha"])
    row = r.row(MT + "lora_target_modules")
    assert (row.status, row.targets) == ("translated", ["actor.lora.target_modules"])
    row = r.row(RL + "share_backbone")
    assert row.status == "translated" and "adapters off" in row.note
    cfg = _loaded("mindspeed-rl", MSRL, ov, tmp_path)
    assert (cfg.actor.lora.rank, cfg.actor.lora.alpha, list(cfg.actor.lora.target_modules)) == (
        32, 128.0, ["o_proj", "down_proj"])
    # the fused layers: the Hugging Face model's, a decision; MindSpeed-RL's defaults rank 8, alpha 16
    r = convert("mindspeed-rl", MSRL, [f"+{MT}lora_target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]"])
    assert r.get("actor.lora") == {"rank": 8, "alpha": 16.0, "target_modules": LORA_HF}
    assert r.row(MT + "lora_r").origin == r.row(MT + "lora_alpha").origin == "default"
    row = r.row(MT + "lora_target_modules")
    assert row.status == "decide" and "one adapter on each fused Megatron layer" in row.note
    row = r.row(RL + "share_backbone")  # MindSpeed-RL's default: a second copy of the base
    assert (row.status, row.origin) == ("translated", "default") and "no copy" in row.note


def test_mindspeed_lora_off():
    r = convert("mindspeed-rl", MSRL, [f"+{MT}lora_r=64", f"+{MT}lora_alpha=128", f"+{MT}lora_target_modules=[]"])
    assert r.get("actor.lora") is None  # no layers named: LoRA off, as in MindSpeed-RL
    assert {r.row(MT + k).status for k in ("lora_r", "lora_alpha", "lora_target_modules")} == {"ignored"}
    assert "LoRA is off" in r.row(MT + "lora_r").note
    r = convert("mindspeed-rl", MSRL, [f"+{MT}lora_r=0", f"+{MT}lora_target_modules=[linear_qkv]"])
    assert r.get("actor.lora") is None and r.row(MT + "lora_r").status == "decide"  # peft refuses rank 0
    assert r.row(MT + "lora_target_modules").status == "ignored"


def test_mindspeed_lora_keys_verirl_does_otherwise():
    r = convert("mindspeed-rl", MSRL, [f"+{MT}lora_target_modules=[linear_proj]", f"+{MT}lora_fusion=true",
                                       f"+{MT}lora_ckpt_filter=true", f"+{MT}lora_load=/ckpt/lora",
                                       f"+{MT}lora_register_forward_hook=[word_embeddings,input_layernorm]"])
    row = r.row(MT + "lora_fusion")
    assert row.status == "ignored" and "CCLoRA" in row.note and "not maths" in row.note
    assert r.row(MT + "lora_ckpt_filter").status == "translated"  # verirl's LoRA checkpoints: the adapters only
    for key, what in (("lora_load", "trainer.resume"), ("lora_register_forward_hook", "pipeline stage")):
        row = r.row(MT + key)  # MindSpeed-LLM's arguments, which MindSpeed-RL's config refuses
        assert row.status == "decide" and "not a MindSpeed-RL key" in row.note and what in row.note, key
    assert r.get("actor.lora") == {"rank": 8, "alpha": 16.0, "target_modules": ["o_proj"]}
