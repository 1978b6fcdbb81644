"""`verirl plan` / `verirl train --dry-run`: the layout per rank, the resources, the memory estimate,
and the layout checks' one-paragraph errors. Nothing here loads weights, except to check the
parameter count against the real tiny model."""
import json
import re
import shutil
import warnings

import pytest
import torch
from transformers import AutoConfig

from verirl.cli import main
from verirl.config import load_config
from verirl.core.errors import ConfigError
from verirl.models.load import TINY_DIR
from verirl.config.layout import check_layout, reward_workers_per_rank, threads_per_rank
from verirl.run.checks import local_devices
from verirl.tools.plan import (count_active, count_adapters, count_parameters, count_parameters_on_meta,
                               estimate_memory, human_count, make_layout, make_plan, model_shape, read_model_config,
                               render)

TINY_PARAMETERS = 1_032_064
# DeepSeek-V3's layout at a small size: 1 dense layer then 2 sparse ones, 8 routed experts in 2 groups, MLA attention
DEEPSEEK_SMALL = dict(moe_intermediate_size=32, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
                      n_group=2, topk_group=1, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)


def _plan(*overrides, **kw):
    return make_plan(load_config("tiny", list(overrides)), **kw)


def test_the_tiny_recipe_plan(tiny):
    plan = _plan()
    L, M = plan.layout, plan.memory
    assert (L.world_size, L.prompts_per_step, L.group_size, L.sequences_per_step) == (1, 8, 8, 64)
    assert (L.prompts_per_rank, L.sequences_per_rank) == (8, 64)
    assert (L.mini_batches_per_step, L.optimizer_steps_per_step, L.mini_batch_sequences_per_rank) == (1, 1, 64)
    assert L.micro_batches_per_mini_batch == 1 and L.token_budget == 0
    assert not L.old_log_prob_pass and L.old_log_prob_micro_batches == 0  # on-policy
    assert L.reference_pass and L.ref_micro_batches == 1  # the recipe's kl_coef is 0.001
    assert (L.generate_calls_per_rank, L.sequences_per_generate_call) == (1, 64)
    assert plan.resources.threads_per_rank == 2  # the recipe sets trainer.threads=2
    assert M.parameters == TINY_PARAMETERS == sum(p.numel() for p in tiny.model.parameters())
    assert M.counted == "formula" and M.parameters_by_part["output layer"] == 0  # tied to the embeddings
    assert M.params == M.grads == M.reference == TINY_PARAMETERS * 4 and M.optimizer == TINY_PARAMETERS * 8
    assert M.tokens_per_forward == 64 * (128 + 32)  # one micro-batch of 64 sequences at their longest
    assert M.kv_cache == 2 * 4 * 2 * 32 * 4 * (128 + 32) * 64
    assert M.peak == max(M.update_phase, M.rollout_phase) > 0
    text = render(plan)
    for line in ["prompts per step", "sequences per rank", "old-log-prob pass", "skipped", "reward workers",
                 "1,032,064 parameters", "ESTIMATE", "leaves out"]:
        assert line in text


def test_the_json_output_is_the_plan(capsys):
    assert main(["plan", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"]["sequences_per_step"] == 64 and out["memory"]["parameters"] == TINY_PARAMETERS
    assert out["resources"]["reward_workers_per_rank"] >= 1 and out["source"] == "tiny"


@pytest.mark.parametrize("model_type,extra", [
    ("llama", {}), ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    ("mistral", {}), ("qwen2", {}), ("qwen2", dict(tie_word_embeddings=True)), ("qwen3", dict(head_dim=24)),
    ("qwen3", dict(attention_bias=True, head_dim=16)),
    ("qwen2_moe", dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[2])),
    ("qwen3_moe", dict(num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2, mlp_only_layers=[0])),
    ("mixtral", dict(num_local_experts=3, num_experts_per_tok=2)),
    ("deepseek_v3", dict(DEEPSEEK_SMALL, q_lora_rank=16)), ("deepseek_v3", dict(DEEPSEEK_SMALL, q_lora_rank=None)),
    ("deepseek_v3", dict(DEEPSEEK_SMALL, q_lora_rank=16, attention_bias=True, n_shared_experts=2)),
])
def test_the_parameter_formula_matches_a_model_built_on_the_meta_device(model_type, extra):
    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=300, **extra)
    total, parts = count_parameters(config)
    assert total == count_parameters_on_meta(config) == sum(parts.values())


def test_the_formula_at_real_sizes():
    """The published counts of Qwen2.5-1.5B (tied) and Qwen2.5-7B (untied)."""
    small = AutoConfig.for_model("qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                 tie_word_embeddings=True)
    big = AutoConfig.for_model("qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                               tie_word_embeddings=False)
    assert count_parameters(small)[0] == 1_543_714_304
    assert count_parameters(big)[0] == 7_615_616_512


def _tiny_tokenizer(model_dir) -> None:
    """The shipped tokenizer's files (366 tokens) next to a config.json: what the pre-load checks read."""
    for name in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
        shutil.copy(TINY_DIR / name, model_dir / name)


def test_another_architecture_is_counted_on_the_meta_device(tmp_path):
    config = AutoConfig.for_model("gemma", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=400)
    config.save_pretrained(tmp_path)
    _tiny_tokenizer(tmp_path)
    plan = _plan(f"model.path={tmp_path}")
    assert plan.memory.counted == "meta device" and plan.memory.parameters == count_parameters_on_meta(config)


def test_a_model_that_is_not_a_causal_lm_gets_the_plan_without_an_estimate(tmp_path, capsys):
    AutoConfig.for_model("t5", d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=64,
                         vocab_size=400).save_pretrained(tmp_path)
    _tiny_tokenizer(tmp_path)
    plan = _plan(f"model.path={tmp_path}")
    assert plan.memory is None and "no memory estimate" in plan.memory_note and plan.layout.sequences_per_step == 64
    assert main(["plan", f"model.path={tmp_path}"]) == 0 and "no memory estimate" in capsys.readouterr().out


def test_two_ranks_halve_the_per_rank_numbers():
    one, two = _plan(cores=8), _plan("trainer.nproc_per_node=2", "actor.strategy=ddp", "trainer.threads=0", cores=8)
    a, b = one.layout, two.layout
    assert b.world_size == 2 and b.strategy == "ddp"
    assert (b.prompts_per_step, b.sequences_per_step) == (a.prompts_per_step, a.sequences_per_step) == (8, 64)
    assert (b.prompts_per_rank, b.sequences_per_rank) == (4, 32)
    assert (b.mini_batch_prompts_per_rank, b.mini_batch_sequences_per_rank) == (4, 32)
    assert b.sequences_per_generate_call == 32 and b.ref_micro_batches == 1
    assert two.memory.shards == 1 and two.memory.params == one.memory.params  # ddp: a full replica per rank
    assert two.memory.kv_cache == one.memory.kv_cache // 2 and two.memory.tokens_per_forward == 32 * 160
    assert two.resources.threads_per_rank == 4 and two.resources.reward_workers_per_rank == 4
    assert "4  8 / world size 2" in render(two)


def test_fsdp2_shards_the_states_over_the_world():
    """The estimate alone (`verirl.run.checks` may refuse fsdp2 with several ranks until it is built)."""
    def memory(*overrides):
        cfg = load_config("tiny", list(overrides))
        return estimate_memory(cfg, make_layout(cfg), read_model_config("tiny"))

    one, ddp, fsdp = memory(), memory("trainer.nproc_per_node=2", "actor.strategy=ddp"), memory(
        "trainer.nproc_per_node=2", "actor.strategy=fsdp2")
    assert fsdp.shards == 2 and ddp.shards == 1
    for part in ("params", "grads", "optimizer", "reference"):
        assert getattr(fsdp, part) == getattr(one, part) // 2 == getattr(ddp, part) // 2
    assert fsdp.rollout_params == one.params + fsdp.params  # full for generation, and the shard
    assert fsdp.activations == ddp.activations and fsdp.kv_cache == ddp.kv_cache


def test_tensor_parallel_splits_the_states_and_shows_the_mesh():
    """dp2 x tp2 on 4 ranks: the data split in 2, every state 1/4 per rank (FSDP2 over dp, each layer over tp),
    the output layer's chunk over half the vocabulary; the mesh and each rank's coordinates in the text."""
    one = _plan(cores=8)
    plan = _plan("trainer.nproc_per_node=4", "actor.tensor_parallel_size=2", "rollout.tensor_parallel_size=1", cores=8)
    L, M = plan.layout, plan.memory
    assert (L.data_parallel, L.tensor_parallel, L.prompts_per_rank, L.mini_batch_sequences_per_rank) == (2, 2, 4, 32)
    assert L.coordinates(3) == {"dp": 1, "pp": 0, "sp": 0, "tp": 1} and L.coordinates(2)["tp"] == 0
    assert M.shards == 4 and all(getattr(M, k) == getattr(one.memory, k) // 4 for k in ("params", "optimizer"))
    assert M.kv_cache == one.memory.kv_cache // 4  # half the prompts per rank, decoded in two shares
    split = _plan("trainer.nproc_per_node=4", "actor.tensor_parallel_size=2", cores=8).memory  # rollout tp: the actor's
    assert split.kv_cache == one.memory.kv_cache // 4 and split.rollout_params == split.params  # no whole copy
    text = render(plan)
    assert "dp 2 x tp 2" in text and "[0, 1], [2, 3]" in text and "rank 3: dp 1, tp 1" in text
    assert "8 / data-parallel size 2" in text
    assert "ray placement" not in text
    ray = render(_plan("trainer.nproc_per_node=4", "actor.tensor_parallel_size=2", "trainer.launcher=ray", cores=8))
    assert "ray placement" in ray and "2 bundles of 2 ranks" in ray and "each group on one machine" in ray


def test_resources_per_rank():
    cfg = load_config("tiny", ["trainer.threads=0", "trainer.nproc_per_node=4"])
    assert threads_per_rank(cfg, cores=16) == 4 and threads_per_rank(cfg, cores=2) == 1
    assert reward_workers_per_rank(cfg, cores=64) == 8 and reward_workers_per_rank(cfg, cores=2) == 1
    assert reward_workers_per_rank(load_config("tiny", ["reward.workers=0"]), cores=8) == 0
    assert threads_per_rank(load_config("tiny", ["trainer.threads=3"]), cores=64) == 3


def test_token_budgets_and_the_off_policy_passes():
    plan = _plan("actor.max_token_len_per_device=640", "ref.log_prob_max_token_len_per_device=1280",
                 "actor.mini_batch_prompts=4", "data.prompts_per_step=8", "actor.epochs=2")
    L = plan.layout
    assert (L.mini_batches_per_step, L.optimizer_steps_per_step) == (2, 4)
    assert L.token_budget == 640 and L.micro_batches_per_mini_batch == 8  # 32 sequences, 640 // 160 = 4 per forward
    assert L.old_log_prob_pass and L.old_log_prob_micro_batches == 16
    assert L.ref_token_budget == 1280 and L.ref_micro_batches == 8
    assert plan.memory.tokens_per_forward == 640
    assert "token budget per forward" in render(plan) and "off-policy" in render(plan)


def test_sequence_parallel_packs_the_budget_sp_times_and_gpipe_keeps_every_micro_batch():
    """sp2 packs each rank's budget twice over per micro-batch (half the micro-batches of one rank at the same
    budget); GPipe runs every forward before the first backward, so a stage keeps all m micro-batches'
    activations where 1F1B keeps p."""
    budget = ["actor.max_token_len_per_device=640", "data.prompts_per_step=8", "actor.mini_batch_prompts=8"]
    one, sp = _plan(*budget, cores=8), _plan(*budget, "trainer.nproc_per_node=2", "actor.sequence_parallel_size=2",
                                              cores=8)
    assert one.layout.micro_batches_per_mini_batch == 16  # 64 sequences of at most 160 tokens, 4 per 640
    assert sp.layout.micro_batches_per_mini_batch == 8 and sp.memory.tokens_per_forward == 640
    pp = ["trainer.nproc_per_node=2", "actor.pipeline_parallel_size=2"]
    f1b, gpipe = (_plan(*budget, *pp, f"actor.pipeline_schedule={s}", cores=8).memory for s in ("1f1b", "gpipe"))
    assert gpipe.activations == pytest.approx(f1b.activations * 16 / 2, rel=1e-6)  # m = 16 micro-batches in flight against p = 2


@pytest.mark.parametrize("overrides,message", [
    (["data.prompts_per_step=6", "actor.mini_batch_prompts=6", "trainer.nproc_per_node=4"],
     r"data.prompts_per_step=6 is not divisible by the world size 4 \(trainer.nproc_per_node=4 x "
     r"trainer.nnodes=1\): 6 / 4 = 1.5 prompts per rank\. Each rank takes whole groups .* multiple of 4 "
     r"\(e.g. 4 or 8\)"),
    (["actor.mini_batch_prompts=2", "trainer.nproc_per_node=2", "trainer.nnodes=2"],
     r"actor.mini_batch_prompts=2 is not divisible by the world size 4 \(trainer.nproc_per_node=2 x "
     r"trainer.nnodes=2\): 2 / 4 = 0.5 prompts per rank in each mini-batch\..* multiple of 4"),
    (["actor.strategy=zero3"], r"actor.strategy='zero3' is not a known name; known: fsdp2, ddp"),
    (["trainer.launcher=slurm"], r"trainer.launcher='slurm' is not a known name; known: local, ray"),
    (["actor.offload=cpu"], r"actor.offload='cpu' is not a known name; known: none, optimizer, params"),
])
def test_each_layout_check_gives_its_paragraph(overrides, message, capsys):
    cfg = load_config("tiny", overrides)
    with pytest.raises(ConfigError, match=message):
        check_layout(cfg)
    assert main(["plan", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verirl plan: config error: ") and err.count("\n") == 1


def test_more_local_ranks_than_devices():
    cfg = load_config("tiny", ["model.device=cuda", "trainer.nproc_per_node=2"])
    with pytest.raises(ConfigError, match=r"trainer.nproc_per_node=2 local ranks but 1 CUDA device visible .*"
                                          r"cuda.device_count\(\) = 1.*at most 1"):
        check_layout(cfg, devices=("CUDA", 1))
    check_layout(cfg, devices=("CUDA", 2))
    cpu = load_config("tiny", ["trainer.nproc_per_node=2", "model.device=cpu"])
    assert local_devices(cpu) is None
    check_layout(cpu, local_devices(cpu))  # the CPU has no limit
    ray = load_config("tiny", ["trainer.nproc_per_node=2", "model.device=cuda", "trainer.launcher=ray"])
    assert local_devices(ray) is None  # Ray places the ranks
    check_layout(ray, local_devices(ray))
    if not torch.cuda.is_available():  # this machine: model.device=cuda sees no device at all
        cuda = load_config("tiny", ["model.device=cuda"])
        with pytest.raises(ConfigError, match="but 0 CUDA devices visible"):
            check_layout(cuda, local_devices(cuda))


def test_train_dry_run_prints_the_plan_and_loads_no_weights(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    for name in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"]:
        shutil.copy(TINY_DIR / name, model / name)  # no weights file
    run = tmp_path / "run"
    overrides = [f"model.path={model}", f"trainer.run_dir={run}"]
    assert main(["train", "--dry-run", *overrides]) == 0
    dry = capsys.readouterr().out
    assert main(["plan", "--config", "tiny", *overrides]) == 0
    planned = capsys.readouterr().out
    assert dry.splitlines()[1:] == planned.splitlines()[1:]  # the first line names the --config given
    assert "1,032,064 parameters" in dry and not run.exists()
    assert main(["train", "--dry-run", "--json", *overrides]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["parameters"] == TINY_PARAMETERS


# ---------------------------------------------------------------- LoRA (actor.lora)

LORA_SMALL = ["data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "rollout.max_new_tokens=8",
              "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
              "reward.workers=0", "data.train_size=16", "eval.size=2", "trainer.total_steps=1"]


def _peft_count(config, targets) -> int:
    """The adapters' parameters peft injects into the model built from ``config`` (on the meta device)."""
    from transformers import AutoModelForCausalLM

    from verirl.models.lora import LoraSettings, apply_lora

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notes on Mixtral's patterns that match no layer
        apply_lora(model, LoraSettings(8, 16.0, target_modules=targets))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("targets,by_hand", [
    # the tiny model: h 128, 4 heads of 32, 2 kv heads (64 wide), i 512, 4 layers; rank 8 x (in + out) each:
    # q 8 x (128 + 128), k and v 8 x (128 + 64), o 8 x (128 + 128), gate, up and down 8 x (128 + 512)
    ("all-linear", 4 * (2048 + 1536 + 1536 + 2048 + 3 * 5120)),  # 90,112: every linear layer but lm_head
    ("[q_proj,v_proj]", 4 * (2048 + 1536)),  # 14,336
])
def test_lora_trains_the_adapters_only_and_needs_no_reference_copy(targets, by_hand):
    plan = _plan("actor.lora.rank=8", f"actor.lora.target_modules={targets}", "algo.kl_coef=0.1")
    M, A = plan.memory, plan.memory.adapters
    assert A.parameters == by_hand == M.trained_parameters and A.counted == "formula"
    assert by_hand == _peft_count(read_model_config("tiny"), "all-linear" if targets == "all-linear"
                                  else ("q_proj", "v_proj"))
    assert M.parameters == TINY_PARAMETERS and M.trained_share == pytest.approx(by_hand / (TINY_PARAMETERS + by_hand))
    assert M.params == (TINY_PARAMETERS + by_hand) * 4  # the frozen base and the adapters, float32
    assert M.grads == by_hand * 4 and M.optimizer == by_hand * 8  # the adapters' alone
    assert plan.layout.reference_pass and M.reference == 0  # kl_coef > 0: the base with the adapters off
    assert M.model_states == M.params + M.grads + M.optimizer
    full = _plan("algo.kl_coef=0.1").memory
    assert full.reference == TINY_PARAMETERS * 4 and full.trained_parameters == TINY_PARAMETERS
    assert M.update_phase < full.update_phase and M.model_states < 0.3 * full.model_states
    text = render(plan)
    assert re.search(rf"parameters trained +{by_hand:,}  LoRA adapters: rank 8 x \(in \+ out\)", text)
    assert re.search(r"reference model +0 B  0: the base with the adapters off", text)
    assert "AdamW over the adapters only" in text and "model states" in text
    cfg = load_config("tiny", ["actor.lora.rank=8", f"actor.lora.target_modules={targets}",
                               "trainer.nproc_per_node=2", "actor.strategy=fsdp2"])
    fsdp = estimate_memory(cfg, make_layout(cfg), read_model_config("tiny"))  # FSDP2 shards the adapters too
    assert (fsdp.params, fsdp.grads, fsdp.optimizer) == (M.params // 2, M.grads // 2, M.optimizer // 2)


def test_the_json_output_has_the_adapters(capsys):
    assert main(["plan", "--json", "actor.lora.rank=8", "actor.lora.target_modules=[q_proj,v_proj]"]) == 0
    m = json.loads(capsys.readouterr().out)["memory"]
    assert m["adapters"]["parameters"] == m["trained_parameters"] == 14_336 and m["reference"] == 0
    assert m["adapters"]["by_module"] == {"q_proj": 8192, "v_proj": 6144} and m["adapters"]["rank"] == 8
    assert main(["plan", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["memory"]
    assert m["adapters"] is None and m["trained_parameters"] == TINY_PARAMETERS and m["trained_share"] == 1.0


def test_another_architecture_s_adapters_are_counted_on_the_meta_device(tmp_path):
    config = AutoConfig.for_model("gemma", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=400)
    config.save_pretrained(tmp_path)
    _tiny_tokenizer(tmp_path)
    A = _plan(f"model.path={tmp_path}", "actor.lora.rank=8").memory.adapters
    assert A.counted == "meta device" and A.parameters == _peft_count(config, "all-linear")


@pytest.mark.parametrize("model_type,extra", [
    ("llama", dict(attention_bias=True)), ("qwen3", dict(head_dim=24)), ("mistral", {}),
    ("qwen2_moe", dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[2])),
    ("mixtral", dict(num_local_experts=3, num_experts_per_tok=2)),  # peft adapts the router and the fused experts
])
def test_the_adapter_count_is_peft_s(model_type, extra):
    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=300, **extra)
    for targets in ("all-linear", ("q_proj", "v_proj"), ("lm_head",)):
        assert count_adapters(config, 8, targets).parameters == _peft_count(config, targets)


def test_a_target_module_the_model_lacks_is_refused_with_its_linear_layers(capsys):
    assert main(["plan", "actor.lora.rank=8", "actor.lora.target_modules=[q_proj,wq]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verirl plan: config error: actor.lora.target_modules=['q_proj', 'wq']: wq is not a "
                          "linear layer of model.path=tiny") and err.count("\n") == 1
    assert "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj" in err and "all-linear" in err
    assert main(["plan", "actor.lora.target_modules=[wq]"]) == 0  # rank 0: no adapters, nothing to check


@pytest.mark.parametrize("targets", ["all-linear", "[q_proj,v_proj]"])
def test_the_lora_estimate_is_a_real_run_s_model_states(targets, tmp_path):
    """One step of the tiny model with adapters: perf/model_states_gb (every parameter, the adapters' gradients
    and AdamW state, no reference) within 10% of the plan's model states."""
    overrides = [f"trainer.run_dir={tmp_path / 'r'}", *LORA_SMALL, "actor.lora.rank=8",
                 f"actor.lora.target_modules={targets}", "algo.kl_coef=0.1"]
    assert main(["train", *overrides]) == 0
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    measured = next(r["perf/model_states_gb"] for r in rows if "perf/model_states_gb" in r)
    m = _plan(*overrides).memory
    estimate = (m.params + m.grads + m.optimizer + m.reference) / 2**30
    assert estimate == pytest.approx(measured, rel=0.10)


# ---------------------------------------------------------------- mixtures of experts

QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768, vocab_size=151936, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, tie_word_embeddings=False)
# (config.json's keys, published total, published active per token)
PUBLISHED_MOE = {
    "Qwen3-30B-A3B": (QWEN3_30B_A3B, 30.5e9, 3.3e9),
    # DeepSeek-V3: transformers' defaults are its config.json; the main model (the Hub's 685B adds the 14B MTP module)
    "DeepSeek-V3": (dict(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=3,
                         intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
                         num_experts_per_tok=8, vocab_size=129280, q_lora_rank=1536, kv_lora_rank=512,
                         qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, num_attention_heads=128,
                         num_key_value_heads=128, tie_word_embeddings=False), 671e9, 37e9),
    "Mixtral-8x7B": (dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, num_local_experts=8,
                          num_experts_per_tok=2, tie_word_embeddings=False), 46.7e9, 12.9e9),
    "Qwen1.5-MoE-A2.7B": (dict(model_type="qwen2_moe", hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                               num_attention_heads=16, num_key_value_heads=16, vocab_size=151936, num_experts=60,
                               num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                               tie_word_embeddings=False), 14.3e9, 2.7e9),
}


def _config(keys: dict):
    keys = dict(keys)
    return AutoConfig.for_model(keys.pop("model_type"), **keys)


@pytest.mark.parametrize("name", sorted(PUBLISHED_MOE))
def test_moe_total_and_active_are_the_published_ones(name):
    """Totals within 0.5% and active counts within 2% of the published figures, which are rounded (Qwen3-30B-A3B's
    3.35B is published as 3.3B; DeepSeek-V3's 37.6B, the input embedding counted, as 37B)."""
    keys, total, active = PUBLISHED_MOE[name]
    config = _config(keys)
    counted, (per_token, routed) = count_parameters(config)[0], count_active(config)
    assert counted == pytest.approx(total, rel=0.005) and per_token == pytest.approx(active, rel=0.02)
    assert count_parameters(config)[1]["experts"] == routed and per_token < counted


def test_qwen3_30b_a3b_by_hand():
    """Each part of Qwen3-30B-A3B from its config: h 2048, 48 layers, q 32 x 128, kv 4 x 128, 128 experts of 768."""
    config = _config(QWEN3_30B_A3B)
    total, parts = count_parameters(config)
    assert parts == {"embeddings": 151936 * 2048, "output layer": 151936 * 2048, "norms": 48 * 2 * 2048 + 2048,
                     "attention": 48 * (2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128),  # q, o, k, v; q_norm, k_norm
                     "mlp": 48 * 128 * 2048,  # the routers
                     "experts": 48 * 128 * 3 * 2048 * 768}
    assert total == 30_532_122_624
    assert count_active(config) == (total - parts["experts"] + 48 * 8 * 3 * 2048 * 768, parts["experts"])
    assert (human_count(total), human_count(count_active(config)[0])) == ("30.5B", "3.35B")


MOE_SMALL = {
    "qwen2_moe": dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                      num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[2]),
    "qwen3_moe": dict(num_experts=4, moe_intermediate_size=32, num_experts_per_tok=2, mlp_only_layers=[0]),
    "mixtral": dict(num_local_experts=3, num_experts_per_tok=2),
    "deepseek_v3": dict(DEEPSEEK_SMALL, q_lora_rank=16, n_shared_experts=2),
}


@pytest.mark.parametrize("model_type", sorted(MOE_SMALL))
def test_active_and_routed_counts_are_the_model_s_own_expert_tensors(model_type):
    """On the model transformers builds (meta device): the routed experts are its fused (E, ., .) expert tensors,
    and a token's forward touches every other parameter and k of the E slices of each expert tensor."""
    from transformers import AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=300, **MOE_SMALL[model_type])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    experts = [p for name, p in model.named_parameters() if ".mlp.experts." in name]
    assert experts and all(p.dim() == 3 for p in experts)
    others = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." not in name)
    k = config.num_experts_per_tok
    by_model = others + sum(p.numel() // p.shape[0] * k for p in experts), sum(p.numel() for p in experts)
    assert count_active(config) == by_model and count_parameters(config)[0] == sum(by_model[1:]) + others


def test_deepseek_v3_s_kv_cache_is_its_latent():
    """MLA caches kv_lora_rank + qk_rope_head_dim elements per token per layer: measured in transformers' cache of a
    small random DeepSeek-V3's forward."""
    from transformers import AutoModelForCausalLM

    config = AutoConfig.for_model("deepseek_v3", hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=4, vocab_size=300,
                                  **dict(DEEPSEEK_SMALL, q_lora_rank=16))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 300, (2, 5)), use_cache=True).past_key_values
    per_token_layer = sum(t.numel() for layer in cache.layers for t in (layer.keys, layer.values)) // (2 * 5 * 3)
    assert per_token_layer == model_shape(config).cache_width == 8 + 4


def test_a_moe_plan_shows_total_active_and_the_experts_states(tmp_path):
    """Qwen3-30B-A3B's config.json alone: the two counts side by side, the routed experts' states as their own line,
    held whole by every rank under ddp and sharded by FSDP2 like any weight."""
    _config(QWEN3_30B_A3B).save_pretrained(tmp_path)
    _tiny_tokenizer(tmp_path)
    plan = _plan(f"model.path={tmp_path}", "model.dtype=bfloat16")
    M = plan.memory
    routed = 48 * 128 * 3 * 2048 * 768
    assert (M.parameters, M.routed_parameters) == (30_532_122_624, routed) and plan.layout.reference_pass
    assert M.expert_states == routed * (2 + 2 + 8 + 2)  # bfloat16 params, grads and reference, AdamW's float32 moments
    text = render(plan)
    assert "30.5B total, 3.35B active per token" in text
    assert re.search(r"active parameters per token +3\.35B  30\.5B total, 3\.35B active per token: each token "
                     r"visits 8 of 128 routed experts \(width 768\) in 48 of 48 layers", text)
    assert re.search(r"routed experts' states +378\.0 GiB  28,991,029,248 routed-expert parameters x \(params 2 \+ "
                     r"grads 2 \+ AdamW 8 \+ reference 2\) B; one rank holds all 128 experts", text)

    def memory(*overrides):
        cfg = load_config("tiny", [f"model.path={tmp_path}", "model.dtype=bfloat16", *overrides])
        return estimate_memory(cfg, make_layout(cfg), read_model_config(str(tmp_path)))

    ddp, fsdp = memory("trainer.nproc_per_node=4", "actor.strategy=ddp"), memory(
        "trainer.nproc_per_node=4", "actor.strategy=fsdp2")
    assert ddp.expert_states == M.expert_states and fsdp.expert_states == M.expert_states // 4
    assert any("all its 128 experts whole: 1.1 GiB per layer" in w for w in fsdp.leaves_out)
    dense = _plan().memory
    assert dense.routed_parameters == dense.expert_states == 0 and dense.active_parameters == TINY_PARAMETERS
    assert "routed experts' states" not in render(_plan())


def test_flops_per_token_are_the_active_weights_that_multiply(tiny):
    """2 x the matmul weights: perf/mfu's count (`FlopModel`, the nn.Linear weights) for the tiny model (the formula
    adds the attention's biases); for Qwen3-30B-A3B the 8 of 128 experts a token visits, not all of them."""
    from verirl.models.perf import FlopModel

    assert _plan().memory.flops_per_token == pytest.approx(2 * FlopModel.of(tiny.model).matmul_params, rel=2e-3)
    config = _config(QWEN3_30B_A3B)
    cfg = load_config("tiny", ["model.dtype=bfloat16"])
    M = estimate_memory(cfg, make_layout(cfg), config)
    attention, lm_head = 48 * (2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128), 151936 * 2048
    assert M.flops_per_token == 2 * (attention + 48 * 128 * 2048 + 48 * 8 * 3 * 2048 * 768 + lm_head)


# ---------------------------------------------------------------- expert parallel (actor.expert_parallel_size)

EP16 = ["model.dtype=bfloat16", "trainer.nproc_per_node=16", "data.prompts_per_step=16", "actor.mini_batch_prompts=16"]


@pytest.fixture(scope="module")
def qwen3_30b_a3b(tmp_path_factory):
    """Qwen3-30B-A3B's config.json beside the tiny tokenizer's files (no weights)."""
    path = tmp_path_factory.mktemp("qwen3-30b-a3b")
    _config(QWEN3_30B_A3B).save_pretrained(path)
    _tiny_tokenizer(path)
    return path


def test_expert_parallel_splits_the_experts_and_counts_the_all_to_all_by_hand(qwen3_30b_a3b, capsys):
    """Qwen3-30B-A3B, ep 8 on 16 ranks (edp 2): each rank holds 128 / 8 = 16 experts of every layer, 1/8 of the
    routed experts' bytes under ddp, 1/16 under FSDP2 (each slice over edp 2); one micro-batch of 8 sequences of
    160 tokens sends 2 x 1280 x k 8 x h 2048 x 2 B x 7/8 per sparse layer forward."""
    plan = _plan(f"model.path={qwen3_30b_a3b}", *EP16, "actor.strategy=ddp", "actor.expert_parallel_size=8", cores=8)
    L, M = plan.layout, plan.memory
    routed, total = 48 * 128 * 3 * 2048 * 768, 30_532_122_624
    assert (L.expert_parallel, L.expert_data_parallel, M.experts_per_rank, M.expert_shards) == (8, 2, 16, 8)
    assert M.expert_states == routed * (2 + 2 + 8 + 2) // 8  # bfloat16 params, grads, reference; AdamW float32
    assert M.params == M.grads == M.reference == (total - routed) * 2 + routed * 2 // 8
    assert M.optimizer == (total - routed) * 8 + routed * 8 // 8
    assert M.rollout_params == total * 2 + M.params  # the experts gathered whole for generation, beside the slices
    assert M.tokens_per_forward == 8 * 160
    forward = 2 * 1280 * 8 * 2048 * 2 * 7 // 8
    assert (M.all_to_all_forward, M.all_to_all_update, M.all_to_all_micro_batch) == (forward, 2 * forward,
                                                                                     48 * 2 * forward)
    assert L.expert_coordinates(9) == {"edp": 1, "ep": 1} and L.expert_coordinates(7) == {"edp": 0, "ep": 7}
    text = render(plan)
    assert "dp 16 (edp 2 x ep 8)" in text and "[0..7], [8..15]" in text and "rank 7: dp 7, edp 0, ep 7" in text
    assert re.search(r"all-to-all per sparse layer +70\.0 MiB  dispatch \+ combine: 2 x 1,280 tokens x k 8 x 2048 "
                     r"x 2 B", text) and re.search(r"all-to-all per micro-batch +6\.6 GiB", text)
    assert "128 / 8 = 16 experts per rank" in text
    cfg = load_config("tiny", [f"model.path={qwen3_30b_a3b}", *EP16, "actor.strategy=fsdp2",
                               "actor.expert_parallel_size=8", "trainer.checkpoint_format=whole"])
    fsdp = estimate_memory(cfg, make_layout(cfg), read_model_config(str(qwen3_30b_a3b)))
    assert fsdp.expert_states == routed * 14 // 16 and fsdp.params == total * 2 // 16 and fsdp.expert_shards == 16
    assert any("over the 2 edp ranks holds its 16 experts whole: 144.0 MiB per layer" in w for w in fsdp.leaves_out)
    one = _plan(f"model.path={qwen3_30b_a3b}", *EP16, "actor.strategy=ddp", cores=8).memory
    assert one.expert_states == 8 * M.expert_states and one.all_to_all_forward == 0  # ep 1: no exchange
    assert main(["plan", "--json", f"model.path={qwen3_30b_a3b}", *EP16, "actor.strategy=ddp",
                 "actor.expert_parallel_size=8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["layout"]["expert_parallel"], out["layout"]["expert_data_parallel"]) == (8, 2)
    assert out["memory"]["all_to_all_forward"] == forward and out["memory"]["expert_states"] == M.expert_states


@pytest.mark.parametrize("overrides,message", [
    (["trainer.nproc_per_node=6", "data.prompts_per_step=6", "actor.mini_batch_prompts=6",
      "actor.expert_parallel_size=3"],
     r"actor.expert_parallel_size=3 does not divide the 128 experts of model.path=\S+ \(128 % 3 = 2\)"),
    (["trainer.nproc_per_node=16", "data.prompts_per_step=16", "actor.mini_batch_prompts=16",
      "actor.expert_parallel_size=32"],
     r"actor.expert_parallel_size=32 does not divide the data-parallel x sequence-parallel ranks it splits the "
     r"experts over: 16 x actor.sequence_parallel_size=1 = 16 \(16 % 32 = 16\)"),
])
def test_the_plan_refuses_an_expert_parallel_size_that_does_not_divide(qwen3_30b_a3b, overrides, message, capsys):
    assert main(["plan", f"model.path={qwen3_30b_a3b}", "actor.strategy=ddp", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verirl plan: config error: ") and err.count("\n") == 1 and re.search(message, err)
