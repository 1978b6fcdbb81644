"""`verirl.run.checks.check`: one bad config per rule of `RULES`, each refused in one paragraph (a `UserError`,
which the command line prints without a traceback) that names the key; the rules that read this machine are
skipped with ``paths=False`` (what `verirl convert-config` asks), the others are not."""
import importlib.util
import re
import shutil

import pytest

from verirl.config import load_config
from verirl.core.errors import ConfigError, UserError
from verirl.run.checks import RULES, Ask, check, local_devices

VLLM = importlib.util.find_spec("vllm") is not None
RAY = importlib.util.find_spec("ray") is not None


def pickle_model(tmp_path):
    """The shipped tiny model's files with its weights as a pickle file instead of safetensors."""
    from verirl.models import TINY_DIR

    d = tmp_path / "pickled"
    shutil.copytree(TINY_DIR, d)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    return str(d)


def data_file(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text('{"problem": "1+1", "answer": "2"}\n')
    return str(f)


def _config_only(tmp_path, config) -> str:
    """``config``'s config.json beside the tiny model's tokenizer, no weights (the checks read no more)."""
    import shutil

    from verirl.models.load import TINY_DIR

    path = tmp_path / config.model_type
    path.mkdir()
    for f in [*TINY_DIR.glob("tokenizer*"), TINY_DIR / "chat_template.jinja"]:
        shutil.copy(f, path)
    config.save_pretrained(path)
    return str(path)


SMALL_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2)


def _gemma2(tmp_path) -> str:
    """Gemma-2 (logit soft-capping: its passes are not the packed ones)."""
    from transformers import Gemma2Config

    return _config_only(tmp_path, Gemma2Config(**SMALL_SHAPE, head_dim=16))


def _mixtral_jitter(tmp_path) -> str:
    """Mixtral with router_jitter_noise 0.01."""
    from transformers import MixtralConfig

    return _config_only(tmp_path, MixtralConfig(**SMALL_SHAPE, num_local_experts=4, num_experts_per_tok=2,
                                                router_jitter_noise=0.01))


def _qwen3_moe(tmp_path) -> str:
    """Qwen3-MoE of 6 experts."""
    from transformers import Qwen3MoeConfig

    return _config_only(tmp_path, Qwen3MoeConfig(**SMALL_SHAPE, head_dim=16, num_experts=6, num_experts_per_tok=2,
                                                 moe_intermediate_size=32))


# (rule name in RULES, the values set on a valid config, the words its paragraph holds); a callable value is
# called with tmp_path. Values are set on the loaded config, since load_config itself refuses bad values.
CASES = [
    ("check_finite", {"actor.lr": float("inf")}, "actor.lr=inf is not a finite number"),
    ("check_bounds", {"trainer.total_steps": 0}, "trainer.total_steps=0 must be > 0"),
    ("check_bounds", {"reward.aggregate": "mean"}, "reward.aggregate='mean' is not a known name; known: sum"),
    ("check_activation_pattern", {"trainer.dump_activations.modules": "layers.("}, "is not a regular expression"),
    ("check_vllm_dtype", {"rollout.dtype": "bf16"}, "rollout.dtype='bf16' is not null (model.dtype)"),
    ("check_algorithm_ranges", {"algo.clip_cov_lb": 6.0}, "algo.clip_cov_lb=6.0 is above algo.clip_cov_ub=5.0"),
    ("check_overlong_buffer", {"reward.overlong_buffer.enable": True, "reward.overlong_buffer.len": 9999},
     "reward.overlong_buffer.len=9999 must be below rollout.max_new_tokens"),
    ("check_token_budgets", {"actor.max_token_len_per_device": 10},
     "actor.max_token_len_per_device=10 is smaller than the longest possible sequence"),
    ("check_eval_samples", {"eval.n": 0, "eval.greedy": False}, "eval.n=0 with eval.greedy=false evaluates nothing"),
    ("check_batch_shape", {"actor.mini_batch_prompts": 3}, "is not divisible by actor.mini_batch_prompts=3: 8 / 3"),
    ("check_betas", {"actor.betas": [0.9]}, "actor.betas=[0.9] must be two numbers in [0, 1)"),
    ("check_reward_weights", {"reward.weights": [1.0]}, "give one weight per verifier"),
    ("layout", {"trainer.nproc_per_node": 3}, "data.prompts_per_step=8 is not divisible by the world size 3"),
    ("names", {"rollout.engine": "sglang"}, "rollout.engine='sglang' is not a known name"),
    ("names", {"model.compute_dtype": "half"}, "model.compute_dtype='half' is not a known name"),
    ("reward rules", {"reward.tasks": {"add": ["nope"]}}, "reward.tasks.add names rule 'nope'"),
    ("algorithm names", {"algo.policy_loss": "ppo2"}, "algo.policy_loss='ppo2' is not a known name"),
    ("launch", {"actor.offload": "params"}, "actor.offload=params keeps the parameter shards on the host"),
    ("trackers", {"log.backends": ["console", "nope"]}, "names 'nope', which is not a backend"),
    ("engine", {"rollout.engine": "vllm", "rollout.tensor_parallel_size": 3},
     "rollout.tensor_parallel_size=3 must divide the 1 ranks" if VLLM else "rollout.engine=vllm but vLLM is not"),
    pytest.param("launcher", {"trainer.launcher": "ray"}, "trainer.launcher=ray but Ray is not installed",
                 marks=pytest.mark.skipif(RAY, reason="Ray is installed here")),
    ("paths", {"eval.data": "/no/such/file.jsonl"}, "eval.data='/no/such/file.jsonl' does not exist"),
    ("model directory", {"model.path": pickle_model}, "cannot be used as it is (`verirl doctor"),
    ("started ranks", {}, "this process was started as one of 2 ranks (WORLD_SIZE=2"),
    ("templates", {"data.train_path": data_file, "data.prompt_type": "nope"}, "nope"),
    ("activation modules", {"trainer.dump_activations.steps": [1], "trainer.dump_activations.modules": "decoder"},
     "trainer.dump_activations.modules='decoder' matches no module of tiny"),
    ("layout", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 3},
     "actor.tensor_parallel_size=3 does not divide the world size 2 (trainer.nproc_per_node=2 x trainer.nnodes=1)"),
    ("layout", {"trainer.nproc_per_node": 6, "actor.tensor_parallel_size": 2},
     "data.prompts_per_step=8 is not divisible by the data-parallel size 3 (world size 6"),
    ("model parallel", {"trainer.nproc_per_node": 4, "actor.tensor_parallel_size": 4},
     "actor.tensor_parallel_size=4 does not divide the model's num_key_value_heads=2 (2 / 4 = 0.5)"),
    ("layout", {"trainer.nproc_per_node": 4, "actor.tensor_parallel_size": 2, "actor.sequence_parallel_size": 4},
     "actor.tensor_parallel_size=2 x actor.sequence_parallel_size=4 = 8 does not divide the world size 4"),
    ("model parallel", {"trainer.nproc_per_node": 4, "actor.sequence_parallel_size": 4},
     "actor.sequence_parallel_size=4 is more than num_key_value_heads=2 (2 / 4 = 0.5): more sp than key/value heads "
     "needs ring attention"),
    ("check_token_budgets", {"actor.sequence_parallel_size": 2, "actor.max_token_len_per_device": 40},
     "actor.max_token_len_per_device=40 x actor.sequence_parallel_size 2 = 80 tokens per group is smaller than the "
     "longest possible sequence"),
    ("layout", {"trainer.nproc_per_node": 4, "actor.sequence_parallel_size": 2, "actor.expert_parallel_size": 3},
     "actor.expert_parallel_size=3 does not divide the data-parallel x sequence-parallel ranks it splits the experts "
     "over: 2 x actor.sequence_parallel_size=2 = 4 (4 % 3 = 1)"),
    ("layout", {"actor.expert_tensor_parallel_size": 2},
     "actor.expert_tensor_parallel_size=2: experts split over ranks are not built"),
    ("layout", {"trainer.nproc_per_node": 4, "actor.pipeline_parallel_size": 2, "actor.expert_parallel_size": 2,
                "trainer.checkpoint_format": "whole"},
     "actor.expert_parallel_size=2 with actor.pipeline_parallel_size=2: expert parallelism inside pipeline stages"),
    ("experts", {"trainer.nproc_per_node": 2, "actor.expert_parallel_size": 2, "trainer.checkpoint_format": "whole"},
     "actor.expert_parallel_size=2: model.path=tiny (qwen2) is a dense model, with no experts to split"),
    ("experts", {"trainer.nproc_per_node": 4, "actor.expert_parallel_size": 4, "model.path": _qwen3_moe,
                 "trainer.checkpoint_format": "whole"},
     "actor.expert_parallel_size=4 does not divide the 6 experts of model.path="),
    ("experts", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 2, "model.path": _qwen3_moe},
     "(qwen3_moe, 6 experts): its expert layers have no tensor-parallel plan"),
    ("experts", {"model.path": _mixtral_jitter},
     "sets router_jitter_noise=0.01, which multiplies every router's input by random noise while the model trains"),
    ("routing replay", {"algo.router_replay": "r3"},
     "algo.router_replay=r3: model.path=tiny (qwen2) is a dense model, with no routers to replay"),
    ("routing replay", {"algo.moe_aux_loss_coef": 0.01},
     "algo.moe_aux_loss_coef=0.01: model.path=tiny (qwen2) is a dense model"),
    pytest.param("routing replay", {"model.path": "tiny-moe", "algo.router_replay": "R3", "rollout.engine": "vllm"},
                 "vLLM's routed experts (enable_return_routed_experts) are not read by verirl's vllm engine",
                 marks=pytest.mark.skipif(not VLLM, reason="vLLM is not installed here")),
    ("routing replay", {"model.path": "tiny-moe", "algo.router_replay": "R3", "rollout.engine": "hf"},
     "rollout.engine=hf returns no routed experts. Use rollout.engine=native"),
    ("routing replay", {"model.path": "tiny-moe", "algo.router_replay": "R3", "rollout.multi_turn.enable": True,
                         "rollout.multi_turn.tools": ["calculator"]},
     "a multi-turn episode's routes are not recorded"),
    ("routing replay", {"model.path": "tiny-moe", "algo.router_replay": "R3", "rollout.placement": "separate",
                         "trainer.nproc_per_node": 2},
     "the producers' batches do not carry the routed experts"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.pipeline_parallel_size": 2},
     "actor.pipeline_parallel_size=2 needs actor.max_token_len_per_device > 0"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.pipeline_parallel_size": 2,
                        "actor.max_token_len_per_device": 512, "actor.pipeline_layers": [1, 2]},
     "layers per stage [1, 2] do not split the model's 4 decoder layers over 2 stages"),
    ("model parallel", {"trainer.nproc_per_node": 8, "actor.pipeline_parallel_size": 8,
                        "actor.max_token_len_per_device": 512},
     "8 pipeline stages for a model of 4 decoder layers"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.pipeline_parallel_size": 2,
                        "actor.max_token_len_per_device": 512, "actor.pipeline_schedule": "zb"},
     "actor.pipeline_schedule='zb' is not a known name; known: 1f1b, gpipe, interleaved_1f1b"),
    ("model parallel", {"rollout.tensor_parallel_size": 2},
     "rollout.tensor_parallel_size=2 with rollout.engine=native: this engine decodes with the whole weights on every "
     "rank (1) or on the actor's tensor-parallel plan (actor.tensor_parallel_size=1). Set rollout.tensor_parallel_size=1."),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 2, "actor.use_remove_padding": False},
     "actor.tensor_parallel_size=2 needs actor.use_remove_padding=true"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 2, "algo.kl_coef": 0.01,
                        "ref.offload": True},
     "ref.offload=true with actor.tensor_parallel_size=2: the reference is split like the actor"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.sequence_parallel_size": 2, "model.path": _gemma2},
     "actor.sequence_parallel_size=2: model_type 'gemma2' has no sequence-parallel attention in verirl"),
    ("model parallel", {"trainer.nproc_per_node": 3, "actor.tensor_parallel_size": 3},
     "actor.tensor_parallel_size=3 does not divide the model's num_attention_heads=4 (4 / 3 = 1.33)"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 2, "model.path": _gemma2},
     "actor.tensor_parallel_size=2: model_type 'gemma2' has no tensor-parallel plan in verirl; the families that "
     "have one: llama, qwen2, qwen3, mistral"),
    ("model parallel", {"trainer.nproc_per_node": 2, "actor.pipeline_parallel_size": 2,
                        "actor.max_token_len_per_device": 512, "actor.pipeline_schedule": "interleaved_1f1b",
                        "actor.mini_batch_prompts": 1, "rollout.n": 2},
     "needs at least 4 micro-batches in every optimizer step (2 pipeline ranks x 2 stages each: one micro-batch per stage)"),
    ("model parallel", {"trainer.nproc_per_node": 8, "actor.pipeline_parallel_size": 4,
                        "actor.max_token_len_per_device": 512, "actor.mini_batch_prompts": 2, "rollout.n": 2},
     "actor.mini_batch_prompts=2 / 2 data-parallel ranks x rollout.n=2 = 2 sequences, fewer than 4"),
    ("activation dump layout", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 2,
                                "trainer.dump_activations.steps": [1]},
     "trainer.dump_activations.steps=[1] with actor.tensor_parallel_size=2: an activation dump's rank files are "
     "merged as data-parallel shares of the batch"),
    ("activation dump layout", {"trainer.nproc_per_node": 2, "actor.pipeline_parallel_size": 2,
                                "actor.max_token_len_per_device": 512, "trainer.dump_activations.steps": [1]},
     "each stage records only its own layers"),
    ("launch", {"trainer.nproc_per_node": 2, "actor.tensor_parallel_size": 2, "actor.offload": "params"},
     "not available with 2 ranks that all hold parts of one model"),
    ("reward services", {"reward.verifiers": ["acc", "format", "remote"], "reward.weights": [1.0, 0.5, 1.0],
                         "reward.tasks": {}},
     "reward.verifiers names 'remote' but reward.remote.url is not set"),
    ("reward services", {"reward.model.path": "/no/such/rm"}, "is set but reward.verifiers"),
    ("reward services", {"reward.verifiers": ["acc", "format", "judge"], "reward.weights": [1.0, 0.5, 1.0],
                         "reward.tasks": {}, "reward.judge.url": "http://127.0.0.1:9/v1"}, "reward.judge.model is not set"),
    ("reward services", {"algo.distill.teacher": "/t", "algo.distill.rewards": False, "algo.distill.coef": 0.0},
     "leaves no advantage"),
    ("reward services", {"algo.distill.teacher": "/t", "actor.pipeline_parallel_size": 2, "trainer.nproc_per_node": 2},
     "the teacher's layers would need stages of their own"),
    ("lora", {"actor.lora.rank": 5, "actor.lora.init": "orthogonal"}, "so the rank must be even"),
    ("lora", {"actor.lora.rank": 4, "actor.lora.target_modules": 3}, "is neither all-linear nor a list"),
    ("asynchronous training", {"trainer.async_training.max_staleness": 1}, "needs rollout.placement=separate"),
    ("asynchronous training", {"rollout.placement": "separate", "trainer.nproc_per_node": 2,
                               "trainer.async_training.max_staleness": 1, "algo.rollout_correction.rollout_rs": None},
     "with algo.rollout_correction off"),
    ("multi-turn", {"rollout.multi_turn.enable": True}, "neither rollout.multi_turn.tools nor"),
    ("multi-turn", {"rollout.multi_turn.enable": True, "rollout.multi_turn.tools": ["calculator"],
                    "rollout.engine": "vllm", "rollout.tensor_parallel_size": 2, "trainer.nproc_per_node": 2},
     "rollout.multi_turn.enable=true with rollout.tensor_parallel_size=2: the ranks of a tensor-parallel group"),
    ("multi-turn", {"rollout.multi_turn.enable": True, "rollout.multi_turn.tools": ["calculator"],
                    "rollout.multi_turn.parser": "xml"}, "rollout.multi_turn.parser='xml' is not a known name"),
    ("multi-turn", {"rollout.multi_turn.enable": True, "rollout.multi_turn.tools": ["calculator"],
                    "rollout.engine": "hf"}, "rollout.engine=hf: transformers' generate samples from torch's global"),
    ("multi-turn", {"rollout.multi_turn.enable": True, "rollout.multi_turn.tools": ["calculator"],
                    "rollout.multi_turn.max_total_tokens": 4096},
     "rollout.multi_turn.max_total_tokens=4096 is over rollout.max_new_tokens"),
]


def _bad(tmp_path, values: dict):
    cfg = load_config("tiny", [f"trainer.run_dir={tmp_path / 'run'}"])
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = cfg
        for p in parents:
            node = getattr(node, p)
        setattr(node, leaf, value(tmp_path) if callable(value) else value)
    return cfg


def _name(case) -> str:
    return (case.values if hasattr(case, "values") else case)[0]


def test_every_rule_has_a_bad_config():
    assert {r.name for r in RULES} == {_name(c) for c in CASES}


@pytest.mark.parametrize("rule,values,words", CASES, ids=[f"{_name(c)}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_refuses_its_bad_config_in_one_paragraph(rule, values, words, tmp_path, monkeypatch):
    if rule == "started ranks":
        monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = _bad(tmp_path, values)
    with pytest.raises(UserError) as through_check:
        check(cfg)
    said = str(through_check.value)
    assert words in said and "\n" not in said, said
    owner = next(r for r in RULES if r.name == rule)
    with pytest.raises(UserError, match="^" + re.escape(said) + "$"):  # that rule says it
        owner.run(cfg, Ask(True, True, local_devices(cfg)))
    if owner.machine:  # names and values only: this machine's files, packages and launch are not read
        check(cfg, paths=False)
    else:
        with pytest.raises(UserError, match=re.escape(words)):
            check(cfg, paths=False)
    assert not (tmp_path / "run").exists()  # nothing written


def test_router_noise_is_refused_for_training_only(tmp_path):
    """``verirl eval`` (the checks without a run directory) decodes in eval mode, where Mixtral's
    router_jitter_noise does nothing: the same model passes there."""
    cfg = _bad(tmp_path, {"model.path": _mixtral_jitter})
    with pytest.raises(UserError, match="router_jitter_noise=0.01"):
        check(cfg)
    check(cfg, run_dir=False)


def test_a_valid_config_passes_and_plan_and_train_run_the_same_check(tmp_path):
    from verirl.cli import main

    check(load_config("tiny", [f"trainer.run_dir={tmp_path / 'run'}"]))
    assert main(["plan", "eval.data=/no/such/file.jsonl"]) == 2
    assert main(["train", "eval.data=/no/such/file.jsonl", f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override,message", [
    ("reward.verifiers=[acc2]", "reward.verifiers='acc2' is not a known name; known: acc, exact.*Did you mean acc"),
    ("algo.loss_agg_mode=mean", "algo.loss_agg_mode='mean' is not a known name; known: token-mean"),
    ("algo.adv_estimator=gae", "algo.adv_estimator='gae' is not a known name; known: grpo, rloo"),
    ("algo.kl_type=k4", "algo.kl_type='k4' is not a known name; known: kl, k1, abs"),
    ("rollout.engine=sglang", "rollout.engine='sglang' is not a known name; known: native, hf, replay, vllm"),
    pytest.param("rollout.engine=vllm", "rollout.engine=vllm but vLLM is not installed", marks=pytest.mark.skipif(
        VLLM, reason="vLLM is installed here")),
    ("data.shuffle=random", "data.shuffle='random' is not a known name"),
    ("data.too_long=cut", "data.too_long='cut' is not a known name; known: error, filter"),
    ("data.task=geometry", "data.task='geometry' is not a known name; known: arith"),
    ("model.dtype=fp8", "model.dtype='fp8' is not a known name; known: float32, bfloat16, float16"),
    ("eval.data=/no/such/file.jsonl", "eval.data='/no/such/file.jsonl' does not exist"),
])
def test_names_and_paths_are_checked_before_anything_heavy(override, message):
    """The registry owns the unknown-name message; the value rules alone let the name through."""
    weights = ["reward.weights=[1]"] if override.startswith("reward.verifiers") else []
    cfg = load_config(None, [override, *weights])  # types and ranges are fine
    with pytest.raises(ConfigError, match=message):
        check(cfg)
