"""The one typed config of verirl, and the only place defaults live.

Sections mirror the phases of a step: data -> model -> rollout -> reward -> algo ->
actor (the policy update) -> trainer (the loop) -> eval -> log. A run is configured by a
YAML file (or a recipe shipped inside the package, e.g. ``tiny``) plus ``a.b=c`` overrides
on the command line, merged through OmegaConf structured configs so that unknown keys and
wrong types are caught before anything heavy starts.

The dataclass defaults are for a real model (a Hugging Face directory of 0.5B-7B
parameters on one accelerator); the embedded default run on the tiny model is the ``tiny``
recipe (`verirl train` with no ``--config``). Each default says why in its comment.

This module checks what needs nothing else: types, ranges, finiteness and the batch
arithmetic (`validate`). Checks that need a registry of names or the file system live in
`verirl.run.checks`. It imports no other room of verirl (`verirl.core.errors` aside).

Batch sizes
-----------
* ``data.prompts_per_step`` counts PROMPTS; each prompt is sampled ``rollout.n`` times,
  so one step sees ``prompts_per_step * n`` sequences.
* ``actor.mini_batch_prompts`` counts PROMPTS too (not sequences: veRL's
  ``ppo_mini_batch_size`` is also in prompts, MindSpeed-RL's is not).  One optimizer
  step is taken per mini-batch.  ``mini_batch_prompts == prompts_per_step`` with
  ``actor.epochs == 1`` is on-policy: the old log-prob pass is skipped.
* ``actor.micro_batch_size`` counts SEQUENCES per forward/backward; gradients are
  accumulated over the micro-batches of a mini-batch, exactly.
"""
from __future__ import annotations

import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError, OmegaConfBaseException

from verirl.core.errors import ConfigError

__all__ = ["Config", "ConfigError", "load_config", "validate", "to_yaml", "to_dict", "describe", "RECIPES"]


@dataclass
class DataConfig:
    task: str = "arith"  # built-in task generator (see `verirl.data.tasks`), used when train_path is empty
    train_size: int = 20000  # problems drawn for training by the built-in generator
    prompts_per_step: int = 8  # PROMPTS per step (each is sampled rollout.n times)
    max_prompt_length: int = 512  # tokens (veRL's default); longer prompts are filtered or refused (data.too_long)
    too_long: str = "error"  # error (refuse to start, naming the row) / filter (drop and count)
    seed: int = 0  # seeds the task generator and the prompt order
    shuffle: str = "verl"  # verl (torch RandomSampler order) / megatron / sequential
    # Your own data instead of the built-in task: a file or folder, raw or already preprocessed
    # (a .parquet from `verirl preprocess`, with its .manifest.json). Raw files are preprocessed on the
    # fly with the keys below and cached under $VERIRL_CACHE/data (default ~/.cache/verirl/data).
    train_path: str = ""
    prompt_type: str = "tokenizer"  # template for raw files: a templates.json name, or tokenizer (the model's own)
    templates_file: str = ""  # your own templates.json (MindSpeed-RL format)
    handler_name: str = "R1AlpacaStyleInstructionHandler"  # or VerlParquetHandler
    map_keys: dict[str, str] = field(default_factory=dict)  # canonical -> data set field (see preprocess)
    dataset_additional_keys: list[str] = field(default_factory=lambda: ["labels"])  # extra columns kept (task, ...)


@dataclass
class ModelConfig:
    path: str = "tiny"  # a Hugging Face directory, or tiny (the 1M-parameter model shipped with verirl)
    dtype: str = "float32"  # float32 / bfloat16 / float16
    # mixed precision (docs/performance.md): the log-prob passes, the update (torch.autocast) and the native
    # engine's products in bfloat16, over float32 weights, gradients and optimizer state; the output layer,
    # norms, attention softmax and sampling stay in model.dtype
    compute_dtype: Optional[str] = None  # null or float32 (model.dtype) / bfloat16 / auto (bfloat16 where the CPU or GPU has it natively)
    device: str = "auto"  # auto (cuda, then npu, then cpu) / cpu / cuda / npu
    # values that replace the model's config.json at load, for the actor, the reference and the rollout
    # engine alike (veRL's name), e.g. {rms_norm_eps: 1e-5}: how another system's numerics are reproduced
    override_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutConfig:
    engine: str = "native"  # native (own KV-cache sampler) / hf (transformers generate) / replay (from a dump) / vllm
    n: int = 8  # samples per prompt (the GRPO group size; 8 is the common choice)
    max_new_tokens: int = 512  # response length cap, tokens, the stop token included (veRL's default)
    temperature: float = 1.0  # sampling temperature (0 = greedy); log-probs are taken at the same temperature
    top_p: float = 1.0  # nucleus sampling: keep the smallest set of tokens with this much mass
    top_k: int = 0  # 0 = off
    micro_batch_size: int = 0  # sequences per generate call; 0 = the whole step at once
    replay_path: str = ""  # engine=replay: a rollouts.jsonl (trainer.dump_rollouts) or another system's JSONL dump
    replay_prompts: str = "data"  # engine=replay: data (the run's prompts, checked against the dump) / dump (the dump's)
    replay_eos: str = "length"  # engine=replay, text without a stopped field: length (EOS when < max_new_tokens) / always / never
    # engine=vllm (docs/vllm.md): vLLM's offline engine inside each training process
    tensor_parallel_size: int = 1  # ranks per vLLM engine (a tensor-parallel group of the data-parallel ranks)
    gpu_memory_utilization: float = 0.5  # share of the device's memory vLLM may take (weights + KV cache)
    dtype: Optional[str] = None  # vLLM decodes in: null (model.dtype) / compute (model.compute_dtype, resolved) / float32 / bfloat16 / float16
    max_num_seqs: int = 0  # sequences vLLM schedules at once; 0 = data.prompts_per_step x rollout.n / data-parallel size
    max_num_batched_tokens: int = 0  # tokens per vLLM scheduler step; 0 = vLLM's default
    enable_chunked_prefill: bool = True  # split long prefills across scheduler steps (turned off on a CPU: docs/vllm.md)
    enforce_eager: bool = True  # no CUDA graphs (faster start, less memory; graphs are faster per token)
    free_cache_engine: bool = True  # vLLM sleeps (frees its KV cache) while the actor trains, where the backend can


@dataclass
class OverlongBufferConfig:
    # DAPO's soft overlong punishment: a response of L tokens longer than rollout.max_new_tokens - len gets
    # -penalty_factor * min(1, (L - (max_new_tokens - len)) / len), logged as the rule reward/overlong
    enable: bool = False  # add the penalty to every response's reward
    len: int = 0  # the buffer B, tokens; 0 = a fifth of rollout.max_new_tokens (DAPO: 4096 of 20480)
    penalty_factor: float = 1.0  # the penalty at max_new_tokens


@dataclass
class RewardConfig:
    verifiers: list[str] = field(default_factory=lambda: ["acc", "format"])  # rule names (see verirl.rewards)
    weights: list[float] = field(default_factory=lambda: [1.0, 0.5])  # one per verifier, same order
    # task -> the rules that score it, e.g. {add: [acc, format], mul: [exact, format]};
    # a task not listed here is scored by every verifier.
    tasks: dict[str, list[str]] = field(default_factory=dict)  # task -> rules; {} = every rule scores every task
    workers: int = -1  # scoring processes: -1 = one per core (at most 8); 0 = in this process, no timeout
    timeout: float = 10.0  # seconds per scoring call, from when it starts running; past it the worker is replaced and the call scores 0
    max_memory_mb: int = 0  # address-space (virtual memory) cap per scoring worker, MB; 0 = no cap (Linux only)
    max_abs_score: float = 1e6  # a rule's score beyond +-this (or not finite) is an error: scored 0, counted in reward/errors
    aggregate: str = "sum"  # sum (weighted sum of the rules) / normalize_then_sum (each rule normalised in its group first: GDPO)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class FilterGroupsConfig:
    # DAPO dynamic sampling: groups whose metric is the same for every sample (all right or all wrong: zero
    # advantage, no signal) are dropped and more prompts generated until the step has data.prompts_per_step
    enable: bool = False  # regenerate until the step's groups all carry signal (logs filter/*)
    metric: str = "reward"  # the per-sample quantity whose spread is tested: reward (the total) or a rule's name
    max_num_gen_batches: int = 10  # generation batches per step at most (0 = no limit); then the step trains on what it has


@dataclass
class RolloutCorrectionConfig:
    # The train/inference mismatch guard (docs/algorithms.md): the ratio trainer / rollout-engine probability
    # of each sampled token. Engines that return no log-probs (hf, replay) turn it off, and say so once.
    rollout_is: Optional[str] = None  # token / sequence / null: truncated importance weights on the loss
    rollout_is_threshold: float = 2.0  # the cap on the importance weight
    rollout_rs: Optional[str] = "sequence"  # token / sequence / geometric / null: reject samples outside the bounds
    rollout_rs_threshold: float = 3.0  # upper bound on the ratio (TRL's vllm_importance_sampling_clip_max)
    rollout_rs_threshold_lower: float = 0.0  # lower bound; 0 = none (TRL's default)


@dataclass
class AlgoConfig:
    adv_estimator: str = "grpo"  # grpo (group mean/std) / rloo (leave-one-out) / reinforce_plus_plus_baseline
    scale_rewards: str = "group"  # group (divide by the group std) / batch (by the batch std) / none (Dr. GRPO)
    norm_adv_by_std: Optional[bool] = None  # veRL's name: true = scale_rewards group, false = none; null = unset
    adv_epsilon: float = 1e-6  # added to the std (veRL's; TRL uses 1e-4)
    kl_coef: float = 0.0  # weight of the KL-to-reference loss; 0 (DAPO's and TRL's default) skips the reference pass
    kl_type: str = "low_var_kl"  # k3, clamped to [-10, 10]; also: kl (k1), mse (k2), abs
    policy_loss: str = "vanilla"  # vanilla / dual_clip / gspo / cispo / clip_cov / kl_cov (docs/algorithms.md)
    clip_ratio_low: Optional[float] = None  # ratio floor 1 - low; null = the policy loss's default (0.2; gspo 3e-4)
    clip_ratio_high: Optional[float] = None  # ratio ceiling 1 + high (DAPO clip-higher: 0.28); null = 0.2 (gspo 4e-4)
    clip_ratio_c: float = 3.0  # dual_clip: the loss of a negative advantage is at most -A * clip_ratio_c
    clip_ratio_max: float = 5.0  # cispo: the cap on the stop-gradient importance weight (TRL's epsilon_high there)
    clip_cov_ratio: float = 0.0002  # clip_cov: share of tokens whose gradient is cut
    clip_cov_lb: float = 1.0  # clip_cov: covariance window, lower bound
    clip_cov_ub: float = 5.0  # clip_cov: covariance window, upper bound
    kl_cov_ratio: float = 0.0002  # kl_cov: share of tokens given the KL penalty
    ppo_kl_coef: float = 0.1  # kl_cov: weight of that penalty (veRL's default)
    entropy_coef: float = 0.0  # entropy bonus weight (subtracted from the loss)
    top_entropy_quantile: float = 1.0  # train only on this top share of tokens by entropy (TRL's name; 1 = all)
    loss_agg_mode: str = "token-mean"  # token-mean (veRL's default) / seq-mean-token-mean / seq-mean-token-sum / seq-mean-token-sum-norm
    loss_scale_factor: float = 0.0  # seq-mean-token-sum-norm: the constant divisor; 0 = rollout.max_new_tokens (Dr. GRPO)
    mask_truncated: bool = False  # responses cut at rollout.max_new_tokens (no stop token) get no loss
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class ActorConfig:
    lr: float = 1e-6  # AdamW peak learning rate (veRL's default for the actor of a real model)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    warmup_steps: int = 0  # optimizer steps of linear warm-up from 0 to lr
    grad_clip: float = 1.0  # max global grad norm; <= 0 disables
    mini_batch_prompts: int = 8  # PROMPTS per optimizer step (see module docstring)
    micro_batch_size: int = 64  # SEQUENCES per forward/backward (gradient accumulation)
    epochs: int = 1  # passes over each step's rollouts
    # token budget per forward/backward (update and old log-probs): micro-batches are balanced
    # bins of at most this many real tokens (a shared prompt counted once); 0 = use micro_batch_size
    max_token_len_per_device: int = 0
    use_remove_padding: bool = True  # pack sequences into one row: no compute on pad tokens
    share_prompt: bool = True  # with packing: compute each prompt once for its rollout.n samples
    logprob_chunk: int = 0  # output-layer rows per log-prob chunk; 0 = auto (about 4M logits per chunk on a CPU, 64M on a GPU or NPU; at least 64 rows)
    strategy: str = "fsdp2"  # data parallelism when the world size is above 1: fsdp2 (sharded) / ddp (replicated)
    offload: str = "none"  # none / optimizer / params: what leaves the device between phases (where supported)


@dataclass
class RefConfig:
    # token budget per reference log-prob forward; 0 = the actor's (max_token_len_per_device or micro_batch_size)
    log_prob_max_token_len_per_device: int = 0
    offload: bool = False  # keep the reference model on the host between its passes (where supported)


@dataclass
class ActivationDumpConfig:
    # Per-module statistics of the training forward (and backward) of chosen steps, for
    # `verirl compare-activations` (docs/activations.md); generation is not hooked.
    steps: list[int] = field(default_factory=list)  # the steps whose update is recorded ([] = none)
    modules: str = ".*"  # a regular expression over module names, e.g. "layers\\.0\\."
    backward: bool = False  # also the gradients flowing back into each module's output
    dir: str = ""  # "" = RUN_DIR/activations; one file per step and rank: DIR/step_N/rankR.json


@dataclass
class TrainerConfig:
    total_steps: int = 100  # GRPO steps (one rollout each)
    run_dir: str = "runs/default"  # config.yaml, metrics.jsonl, summary.json, final/ go here
    seed: int = 0  # seeds python, numpy, torch and the rollout sampling
    save_freq: int = 100  # write a checkpoint every N steps, and always at the end (0 = only at the end)
    keep_checkpoints: int = 2  # keep the newest N checkpoints in RUN_DIR/checkpoints (0 = keep all)
    resume: str = "auto"  # auto: continue from RUN_DIR's newest checkpoint, if any / false / a checkpoint path
    overwrite: bool = False  # with resume=false: delete the previous run in run_dir instead of refusing
    dump_rollouts: bool = False  # write RUN_DIR/rollouts.jsonl, one line per response
    max_nonfinite_steps: int = 3  # stop after this many steps in a row with a non-finite loss or grad norm (skipped)
    threads: int = 0  # torch intra-op threads per rank; 0 = the cores divided by the local ranks
    nproc_per_node: int = 1  # ranks (processes) on this machine, started with torch's elastic launcher
    nnodes: int = 1  # machines; with > 1, start the same command on each (torchrun's rendezvous)
    rdzv_endpoint: str = ""  # host:port of the rendezvous for nnodes > 1 (e.g. the first machine:29400)
    launcher: str = "local"  # local (torch.distributed.run) / ray (placement group on a Ray cluster)
    ray_address: str = "auto"  # the Ray cluster to join (auto: the running one, else a local one started for the run)
    dist_timeout_s: int = 600  # a rank that raises or dies ends every rank within this many seconds
    dump_activations: ActivationDumpConfig = field(default_factory=ActivationDumpConfig)
    stall_timeout_s: float = 1800.0  # a phase running longer than this dumps every thread's stack to RUN_DIR/stall_<step>.txt
    on_stall: str = "warn"  # warn (say where it is stuck and keep waiting) / abort (end the run)
    peak_flops: float = 0.0  # the device's peak FLOP/s behind perf/mfu; 0 = measured once per device type (cached)


@dataclass
class EvalConfig:
    # Held-out evaluation with the training engine and rules, logged under val/ in metrics.jsonl and
    # summary.json: val/greedy_acc, val/pass@k, val/maj@n, val/reward_mean, overall and per task / data_source.
    data: str = ""  # a data file or folder (raw or preprocessed) of held-out prompts; "" = the built-in task's held-out split, and with data.train_path no held-out evaluation at all (said at start)
    size: int = 200  # held-out problems of the built-in task (never trained on)
    n: int = 4  # sampled responses per problem (pass@k for k up to n, maj@n); 0 = greedy only
    temperature: float = 1.0  # temperature of the n samples
    top_p: float = 1.0  # nucleus sampling of the n samples: keep the smallest set of tokens with this much mass
    top_k: int = 0  # the n samples draw from the k most likely tokens; 0 = off
    greedy: bool = True  # also decode each problem greedily once (val/greedy_acc)
    before_train: bool = True  # evaluate before the first step (logged as step 0)
    every: int = 0  # evaluate every N steps (0 = never)
    at_end: bool = True  # evaluate after the last step


@dataclass
class LogConfig:
    progress: str = "auto"  # auto (rich on a terminal, plain otherwise) / rich / plain (one line a step) / off (no view)
    console_every: int = 10  # with rich or off: a metrics line every N steps (0 = never); plain prints every step
    # tensorboard: RUN_DIR/tensorboard; wandb: offline unless WANDB_MODE says otherwise; mlflow: RUN_DIR/mlruns
    # unless MLFLOW_TRACKING_URI; swanlab (docs/trackers.md)
    backends: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # where step metrics go; metrics.jsonl is always written
    project: str = "verirl"  # the trackers' project / experiment name
    run_name: str = ""  # the trackers' run name; "" = the run directory's name


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)


@dataclass
class SFTConfig:
    """`verirl sft`: supervised warm start on a built-in task (how the tiny model is made)."""
    init: str = "scratch"  # scratch = build the tiny tokenizer + a fresh model; or a model directory
    out_dir: str = "runs/sft"  # where the Hugging Face directory is written (`make weights`: the shipped model)
    task: str = "arith"  # built-in task
    seed: int = 0  # seeds the tokenizer, the init, the data and the order (use GRPO's data.seed)
    val_size: int = 200  # the held-out split (the same problems GRPO evaluates on)
    train_size: int = 50000  # problems drawn for SFT (from the non-held-out pool)
    batch_size: int = 64  # sequences per step
    lr: float = 1e-3  # AdamW, betas (0.9, 0.99)
    warmup_steps: int = 50  # linear warm-up steps
    max_steps: int = 2000  # upper bound on SFT steps
    eval_every: int = 25  # steps between held-out greedy checks
    target_greedy: float = 0.20  # stop once held-out greedy accuracy reaches this (0 = run max_steps)
    threads: int = 0  # torch threads; 0 = all cores


@dataclass
class PreprocessConfig:
    """`verirl preprocess`: MindSpeed-RL's data keys, so its data configs carry over (see docs/data.md)."""
    input: str = ""  # a .json/.jsonl/.parquet/.arrow file or a folder of them
    tokenizer_name_or_path: str = "tiny"  # a tokenizer directory, or tiny
    output_prefix: str = ""  # writes PREFIX.parquet and PREFIX.manifest.json
    handler_name: str = "R1AlpacaStyleInstructionHandler"  # or VerlParquetHandler
    tokenizer_type: str = "HuggingFaceTokenizer"  # the only kind supported
    workers: int = 1  # processes that tokenize
    log_interval: int = 1000  # rows between progress updates
    prompt_type: str = "qwen_r1"  # template name (empty, qwen, qwen_r1, qwen_math_r1, llama3, ...) or tokenizer
    templates_file: str = ""  # a templates.json of your own (MindSpeed-RL format); adds/overrides by name
    # canonical field -> data set field (nested with dots, e.g. reward_model.ground_truth); "" = unused.
    # Unset fields take the handler's default (instruction: prompt=problem, response=answer).
    map_keys: dict[str, str] = field(default_factory=dict)  # prompt/query/response/system -> field ({} = defaults)
    dataset_additional_keys: list[str] = field(default_factory=lambda: ["labels"])  # kept for the rewards
    max_prompt_length: int = 0  # tokens; 0 = no limit
    too_long: str = "filter"  # filter (count and drop) / error
    on_bad_row: str = "error"  # error (stop, naming file/row/key) / skip (count and go on)


# Renamed keys: the old name still works and prints one line naming the new one.
RENAMED: dict[type, dict[str, str]] = {
    Config: {
        "trainer.eval_at_start": "eval.before_train", "trainer.val_before_train": "eval.before_train",
        "trainer.eval_at_end": "eval.at_end", "trainer.eval_samples": "eval.n", "trainer.val_n": "eval.n",
        "trainer.test_freq": "eval.every", "trainer.val_data": "eval.data", "data.val_path": "eval.data",
        "data.val_size": "eval.size", "data.additional_keys": "data.dataset_additional_keys",
    },
    PreprocessConfig: {"additional_keys": "dataset_additional_keys"},
}

# Defaults that changed when the tiny model's values moved into the `tiny` recipe (documented in docs/config.md).
CHANGED_DEFAULTS = [
    ("actor.lr", 1e-4, 1e-6, "veRL's actor default; 1e-4 diverges on a real model"),
    ("data.max_prompt_length", 128, 512, "veRL's default; real prompts with a template run past 128 tokens"),
    ("rollout.max_new_tokens", 32, 512, "veRL's default; reasoning responses run past 32 tokens"),
]

# Recipes shipped inside the package: `--config NAME` (`verirl train` alone = `--config tiny`).
RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"
RECIPES = {"tiny": "the embedded default: GRPO on the shipped 1M-parameter model and the built-in arithmetic "
                   "task, 700 steps on a CPU (what `make run` runs)"}


# ---------------------------------------------------------------- loading

def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        out.append(key)
        if is_dataclass(f.type) or (isinstance(f.default_factory, type) and is_dataclass(f.default_factory)):
            out.extend(_all_keys(f.default_factory, key + "."))  # type: ignore[arg-type]
    return out


def _suggest(key: str, cls: type) -> str:
    keys = _all_keys(cls)
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
    if not close:  # match on the last component ("lr" -> actor.lr)
        last = key.split(".")[-1]
        close = [k for k in keys if k.split(".")[-1] == last] or difflib.get_close_matches(
            last, keys, n=3, cutoff=0.6
        )
    return f" Did you mean: {', '.join(close)}?" if close else ""


def _wrap(err: OmegaConfBaseException, source: str, cls: type) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigKeyError) or "not in struct" in str(err) or "Key '" in str(err):
        return ConfigError(
            f"Unknown config key '{key}' in {source}.{_suggest(key, cls)} "
            f"Run `verirl train --help-config` for every key with its default."
        )
    if isinstance(err, ValidationError):
        msg = str(err).splitlines()[0]
        return ConfigError(f"Bad value for config key '{key}' in {source}: {msg}. Fix the value's type.")
    return ConfigError(f"Config error in {source}: {str(err).splitlines()[0]}")


def _section_error(key: str, value: Any, source: str, section: type) -> ConfigError:
    names = [f.name for f in fields(section)]
    return ConfigError(f"'{key}' in {source} is a section of keys ({', '.join(f'{key}.{n}' for n in names[:4])}, ...), "
                       f"not one value ({value!r}). Set one of its keys, e.g. {key}.{names[0]}=..., or give it as a "
                       f"mapping of keys ({key}: {{{names[0]}: ...}}).")


def _check_sections(values: Any, schema_cls: type, source: str, prefix: str = "") -> None:
    """A section of the schema (actor, algo.filter_groups) given one value in a file instead of its keys."""
    if not isinstance(values, dict):
        return
    for f in fields(schema_cls):
        default = getattr(schema_cls(), f.name)
        if f.name in values and is_dataclass(default):
            if values[f.name] is not None and not isinstance(values[f.name], dict):
                raise _section_error(prefix + f.name, values[f.name], source, type(default))
            _check_sections(values[f.name], type(default), source, f"{prefix}{f.name}.")


def _tab_hint(file: Path) -> str:
    """" Line N is indented with a tab ..." for the first such line of ``file``, else ""."""
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for n, line in enumerate(lines, start=1):
        if "\t" in line[:len(line) - len(line.lstrip())]:
            return (f" Line {n} is indented with a tab: YAML indents with spaces only. Replace the tab with "
                    f"spaces (e.g. `expand -t 2 {file}`).")
    return ""


def recipe_file(name: str) -> Path:
    """The YAML file of a recipe shipped inside the package."""
    return RECIPE_DIR / f"{name}.yaml"


def _source(path: str) -> tuple[Path, str]:
    """(file to read, how to name it in messages) for --config: a recipe name or a YAML file."""
    if path in RECIPES:
        return recipe_file(path), f"recipe '{path}' ({recipe_file(path)})"
    if not os.path.exists(path):
        raise ConfigError(f"Config file '{path}' does not exist. Pass an existing YAML file to --config, or a "
                          f"recipe shipped with verirl: {', '.join(RECIPES)}.")
    return Path(path), f"'{path}'"


def _renamed(key: str, schema_cls: type, source: str) -> str:
    """The current name of ``key``; an old name prints one line naming the new one."""
    new = RENAMED.get(schema_cls, {}).get(key)
    if new is None:
        return key
    print(f"config: {key} ({source}) is now {new}; using it as {new}. Rename it to silence this line.",
          file=sys.stderr)
    return new


def upgrade_dict(old: dict, schema_cls: type = Config) -> dict:
    """A config saved by an older verirl (e.g. in a checkpoint), as nested dicts, with renamed keys
    moved to their new names (silently: nothing is being configured)."""
    out = {section: dict(values) if isinstance(values, dict) else values for section, values in old.items()}
    for old_key, new_key in RENAMED.get(schema_cls, {}).items():
        *parents, leaf = old_key.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new_key.split(".")
        target = out
        for p in new_parents:
            target = target.setdefault(p, {})
        target.setdefault(new_leaf, value)
    return out


def _rename_file_keys(file_cfg: DictConfig, schema_cls: type, source: str) -> None:
    for old, new in RENAMED.get(schema_cls, {}).items():
        *parents, leaf = old.split(".")
        node = OmegaConf.select(file_cfg, ".".join(parents)) if parents else file_cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            continue
        value = node[leaf]
        del node[leaf]
        _renamed(old, schema_cls, f"in {source}")
        if OmegaConf.select(file_cfg, new) is None:  # the new name, when also given, wins
            OmegaConf.update(file_cfg, new, value, force_add=True)


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None, schema_cls: type = Config):
    """Defaults <- YAML file or recipe <- ``a.b=c`` overrides; then `validate` (for the GRPO `Config`).

    Old key names (`RENAMED`) are accepted with one line naming the new key."""
    schema = OmegaConf.structured(schema_cls)
    cfg = schema
    if path:
        file, source = _source(path)
        try:
            file_cfg = OmegaConf.load(file)
        except Exception as e:  # yaml errors carry line numbers
            raise ConfigError(f"Config file {source} is not valid YAML: {e}{_tab_hint(file)}") from None
        if not isinstance(file_cfg, DictConfig):
            raise ConfigError(f"Config file {source} must hold a mapping of sections (data:, actor:, ...) at its "
                              f"top level, not a {type(file_cfg).__name__}.")
        _rename_file_keys(file_cfg, schema_cls, source)
        _check_sections(OmegaConf.to_container(file_cfg, resolve=False), schema_cls, source)
        try:
            cfg = OmegaConf.merge(cfg, file_cfg)
        except OmegaConfBaseException as e:
            raise _wrap(e, source, schema_cls) from None
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"Override '{ov}' is not of the form key.sub=value (e.g. actor.lr=1e-4).")
        key, value = ov.split("=", 1)
        key = _renamed(key.strip(), schema_cls, "on the command line")
        ov = f"{key}={value}"
        try:
            parsed = OmegaConf.select(OmegaConf.from_dotlist([ov]), key)
            current = OmegaConf.select(cfg, key, default=None)
            section = isinstance(current, DictConfig) and is_dataclass(OmegaConf.get_type(current))
            if section and not isinstance(parsed, DictConfig):
                raise _section_error(key, parsed, f"override '{ov}'", OmegaConf.get_type(current))
            if isinstance(parsed, DictConfig) and not section:  # a mapping replaces the file's, not merged into it
                OmegaConf.update(cfg, key, parsed, merge=False)
            else:  # a plain value, or a mapping onto a section of the schema: its keys are set, the rest kept
                cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([ov]))
        except OmegaConfBaseException as e:
            raise _wrap(e, f"override '{ov}'", schema_cls) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{ov}': the value is not valid YAML ({' '.join(str(e).split())}). Quote "
                              f"strings with backslashes in single quotes, e.g. modules: 'layers\\.0\\.'.") from None
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, Config):
        validate(obj)
    return obj


def load_config_dict(values: dict, schema_cls: type = Config):
    """A config from `to_dict`'s output (how a launcher hands the resolved config to its ranks)."""
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema_cls), values))
    if isinstance(obj, Config):
        validate(obj)
    return obj


def to_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg) -> dict:
    """The config as plain nested dicts (JSON-able)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted leaves; lists and empty mappings are leaves."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def describe(schema_cls: type = Config) -> str:
    """Every key with its default, for --help-config."""
    return to_yaml(schema_cls())


# ---------------------------------------------------------------- validation

def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}.")


def _finite(obj: Any, prefix: str = "") -> None:
    """Every float in the config is a finite number (inf and nan pass YAML's float type)."""
    for f in fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            _finite(value, key + ".")
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{key}={value} is not a finite number. Give a finite value.")


def validate(cfg: Config) -> None:
    """Refuse impossible settings before anything heavy starts, with the arithmetic spelled out.

    Types, ranges, finiteness and batch shapes only: names (rules, engines, estimators) and
    paths are checked by `verirl.run.checks`, which knows the registries and the file system."""
    _finite(cfg)
    data, rollout, algo, actor, trainer = cfg.data, cfg.rollout, cfg.algo, cfg.actor, cfg.trainer
    progress = {"true": "auto", "false": "off"}.get(str(cfg.log.progress).lower(), str(cfg.log.progress).lower())
    if progress not in ("auto", "rich", "plain", "off"):
        raise ConfigError(f"log.progress={cfg.log.progress!r} is not one of auto (rich on a terminal, plain otherwise), "
                          f"rich, plain (one line per step, no escape codes), off.")
    cfg.log.progress = progress
    if trainer.on_stall not in ("warn", "abort"):
        raise ConfigError(f"trainer.on_stall={trainer.on_stall!r} is not warn (say where the run is stuck and keep "
                          f"waiting) or abort (end the run).")
    try:
        re.compile(trainer.dump_activations.modules)
    except re.error as e:
        raise ConfigError(f"trainer.dump_activations.modules={trainer.dump_activations.modules!r} is not a regular "
                          f"expression ({e}). Give one over module names, e.g. 'layers\\.0\\.'.") from None
    for key, val in [("data.prompts_per_step", data.prompts_per_step), ("rollout.n", rollout.n),
                     ("rollout.max_new_tokens", rollout.max_new_tokens),
                     ("data.max_prompt_length", data.max_prompt_length),
                     ("actor.mini_batch_prompts", actor.mini_batch_prompts),
                     ("actor.micro_batch_size", actor.micro_batch_size), ("actor.epochs", actor.epochs),
                     ("trainer.total_steps", trainer.total_steps), ("actor.lr", actor.lr),
                     ("reward.timeout", cfg.reward.timeout), ("reward.max_abs_score", cfg.reward.max_abs_score),
                     ("trainer.max_nonfinite_steps", trainer.max_nonfinite_steps),
                     ("trainer.nproc_per_node", trainer.nproc_per_node), ("trainer.nnodes", trainer.nnodes),
                     ("trainer.dist_timeout_s", trainer.dist_timeout_s),
                     ("trainer.stall_timeout_s", trainer.stall_timeout_s)]:
        _positive(key, val)
    for key, val in [("rollout.temperature", rollout.temperature), ("algo.kl_coef", algo.kl_coef),
                     ("trainer.save_freq", trainer.save_freq), ("actor.warmup_steps", actor.warmup_steps),
                     ("rollout.micro_batch_size", rollout.micro_batch_size), ("rollout.top_k", rollout.top_k),
                     ("actor.max_token_len_per_device", actor.max_token_len_per_device),
                     ("ref.log_prob_max_token_len_per_device", cfg.ref.log_prob_max_token_len_per_device),
                     ("actor.logprob_chunk", actor.logprob_chunk), ("trainer.keep_checkpoints", trainer.keep_checkpoints),
                     ("eval.every", cfg.eval.every), ("eval.size", cfg.eval.size), ("eval.n", cfg.eval.n),
                     ("reward.max_memory_mb", cfg.reward.max_memory_mb),
                     ("eval.temperature", cfg.eval.temperature), ("algo.adv_epsilon", algo.adv_epsilon),
                     ("algo.clip_ratio_c", algo.clip_ratio_c), ("algo.clip_ratio_max", algo.clip_ratio_max),
                     ("algo.clip_cov_ratio", algo.clip_cov_ratio), ("algo.kl_cov_ratio", algo.kl_cov_ratio),
                     ("algo.ppo_kl_coef", algo.ppo_kl_coef), ("algo.loss_scale_factor", algo.loss_scale_factor),
                     ("algo.filter_groups.max_num_gen_batches", algo.filter_groups.max_num_gen_batches),
                     ("algo.rollout_correction.rollout_is_threshold", algo.rollout_correction.rollout_is_threshold),
                     ("algo.rollout_correction.rollout_rs_threshold", algo.rollout_correction.rollout_rs_threshold),
                     ("algo.rollout_correction.rollout_rs_threshold_lower",
                      algo.rollout_correction.rollout_rs_threshold_lower),
                     ("reward.overlong_buffer.len", cfg.reward.overlong_buffer.len),
                     ("reward.overlong_buffer.penalty_factor", cfg.reward.overlong_buffer.penalty_factor),
                     ("trainer.peak_flops", trainer.peak_flops),
                     *[(f"algo.{k}", v) for k, v in (("clip_ratio_low", algo.clip_ratio_low),
                                                     ("clip_ratio_high", algo.clip_ratio_high)) if v is not None]]:
        _positive(key, val, allow_zero=True)
    if cfg.reward.workers < -1:
        raise ConfigError(f"reward.workers={cfg.reward.workers}: give -1 (one scoring process per core, at most 8), "
                          f"0 (score in the training process, no timeout) or a number of processes >= 1.")
    if rollout.dtype not in (None, "compute", "float32", "bfloat16", "float16"):
        raise ConfigError(f"rollout.dtype={rollout.dtype!r} is not null (model.dtype), compute (the trainer's "
                          f"model.compute_dtype), float32, bfloat16 or float16.")
    if rollout.dtype is not None and rollout.engine != "vllm":
        raise ConfigError(f"rollout.dtype={rollout.dtype} sets the dtype vLLM decodes in, but rollout.engine="
                          f"{rollout.engine}: set rollout.engine=vllm, or leave rollout.dtype null.")
    _check_algorithms(cfg)
    longest = data.max_prompt_length + rollout.max_new_tokens
    for key, budget in [("actor.max_token_len_per_device", actor.max_token_len_per_device),
                        ("ref.log_prob_max_token_len_per_device", cfg.ref.log_prob_max_token_len_per_device)]:
        if 0 < budget < longest:
            raise ConfigError(
                f"{key}={budget} is smaller than the longest possible sequence: data.max_prompt_length "
                f"{data.max_prompt_length} + rollout.max_new_tokens {rollout.max_new_tokens} = {longest} tokens. "
                f"Set it to at least {longest} (a few times more packs several sequences per forward), or 0.")
    if cfg.eval.n == 0 and not cfg.eval.greedy:
        raise ConfigError("eval.n=0 with eval.greedy=false evaluates nothing: give eval.n > 0 samples per problem, "
                          "or eval.greedy=true.")
    for key, top_p, top_k in (("rollout", rollout.top_p, rollout.top_k), ("eval", cfg.eval.top_p, cfg.eval.top_k)):
        if not 0 < top_p <= 1:
            raise ConfigError(f"{key}.top_p={top_p} must be in (0, 1].")
        if top_k < 0:
            raise ConfigError(f"{key}.top_k={top_k} must be 0 (off) or a positive number of tokens.")
    if data.prompts_per_step % actor.mini_batch_prompts:
        raise ConfigError(
            f"data.prompts_per_step={data.prompts_per_step} is not divisible by actor.mini_batch_prompts="
            f"{actor.mini_batch_prompts}: {data.prompts_per_step} / {actor.mini_batch_prompts} = "
            f"{data.prompts_per_step / actor.mini_batch_prompts:.3g} mini-batches per step. Both count prompts; "
            f"choose a mini-batch that divides the step (e.g. actor.mini_batch_prompts={data.prompts_per_step})."
        )
    if rollout.n < 2:
        raise ConfigError(f"rollout.n={rollout.n}: group advantages compare the samples of one prompt with each "
                          f"other, so they need rollout.n >= 2 (8 is typical).")
    if len(actor.betas) != 2 or not all(0 <= b < 1 for b in actor.betas):
        raise ConfigError(f"actor.betas={list(actor.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99].")
    reward = cfg.reward
    if not reward.verifiers:
        raise ConfigError("reward.verifiers is empty: name at least one rule, e.g. [acc, format].")
    if len(reward.weights) != len(reward.verifiers):
        raise ConfigError(
            f"reward.weights has {len(reward.weights)} entries but reward.verifiers has {len(reward.verifiers)} "
            f"({list(reward.verifiers)}): give one weight per verifier, in the same order."
        )


def _check_algorithms(cfg: Config) -> None:
    """The ranges of the algorithm options that `_positive` does not cover."""
    algo, rc = cfg.algo, cfg.algo.rollout_correction
    if algo.clip_cov_lb > algo.clip_cov_ub:
        raise ConfigError(f"algo.clip_cov_lb={algo.clip_cov_lb} is above algo.clip_cov_ub={algo.clip_cov_ub}: "
                          f"the covariance window needs lb <= ub.")
    if not 0 < algo.top_entropy_quantile <= 1:
        raise ConfigError(f"algo.top_entropy_quantile={algo.top_entropy_quantile} must be in (0, 1]: the share of "
                          f"tokens, by entropy, that the policy loss keeps (1 = all, 0.2 = the top fifth).")
    if (algo.norm_adv_by_std, algo.scale_rewards) in ((True, "none"), (False, "batch")):
        raise ConfigError(f"algo.norm_adv_by_std={algo.norm_adv_by_std} (veRL's name) contradicts "
                          f"algo.scale_rewards={algo.scale_rewards}: true means group, false means none. Set "
                          f"algo.scale_rewards alone.")
    if rc.rollout_rs_threshold_lower and rc.rollout_rs_threshold_lower >= rc.rollout_rs_threshold:
        raise ConfigError(f"algo.rollout_correction.rollout_rs_threshold_lower={rc.rollout_rs_threshold_lower} is "
                          f"not below rollout_rs_threshold={rc.rollout_rs_threshold}: nothing could pass.")
    if algo.policy_loss == "dual_clip" and algo.clip_ratio_c <= 1:
        raise ConfigError(f"algo.clip_ratio_c={algo.clip_ratio_c} must be above 1 for algo.policy_loss=dual_clip: the "
                          f"loss of a negative advantage is capped at -A * clip_ratio_c (3 is usual).")
    for mode, key in ((rc.rollout_is, "rollout_is_threshold"), (rc.rollout_rs, "rollout_rs_threshold")):
        if mode is not None and getattr(rc, key) <= 0:
            raise ConfigError(f"algo.rollout_correction.{key}={getattr(rc, key)} must be > 0 while its mode is "
                              f"{mode}; set the mode to null to turn it off.")
    ob, longest = cfg.reward.overlong_buffer, cfg.rollout.max_new_tokens
    if ob.enable and ob.len == 0 and longest < 5:
        raise ConfigError(f"reward.overlong_buffer.len=0 means a fifth of rollout.max_new_tokens={longest}: 0 tokens. "
                          f"Give reward.overlong_buffer.len explicitly.")
    if ob.enable and ob.len >= longest:
        raise ConfigError(f"reward.overlong_buffer.len={ob.len} must be below rollout.max_new_tokens={longest}: "
                          f"the penalty starts at max_new_tokens - len tokens.")


def scale_rewards(algo: AlgoConfig) -> str:
    """algo.scale_rewards, with veRL's algo.norm_adv_by_std=false read as none."""
    return "none" if algo.norm_adv_by_std is False else algo.scale_rewards


# ---------------------------------------------------------------- reference docs

_DOC_HEAD = """# Configuration reference

Generated from `src/verirl/config/__init__.py` by `python -m verirl.config > docs/config.md` (a test
checks that it is current).

A run is `verirl train --config FILE.yaml key.sub=value ...`: the defaults below, then the
file, then the overrides. `--config` also takes the name of a recipe shipped inside the package
(`src/verirl/recipes/NAME.yaml`); `verirl train` with no `--config` runs the `tiny` recipe, the
embedded default that `make run` runs. The defaults below are for a real model; the `tiny`
recipe sets what the 1M-parameter model needs. `verirl train --help-config` prints every key with
its default. Unknown keys and wrong types are refused with the closest valid names; impossible
batch shapes are refused with the arithmetic spelled out. The resolved config is written to
`RUN_DIR/config.yaml`.

**Counting rule**: `data.prompts_per_step` and `actor.mini_batch_prompts` count *prompts*;
each prompt is sampled `rollout.n` times, so a step holds `prompts_per_step * n` sequences.
`actor.micro_batch_size` and `rollout.micro_batch_size` count *sequences*. veRL's
`ppo_mini_batch_size` also counts prompts; MindSpeed-RL's mini-batch is already multiplied by n.
"""


def _table(cls: type, prefix: str) -> list[str]:
    import inspect
    import re

    src = inspect.getsource(cls)
    inst = cls()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for f in fields(cls):
        m = re.search(rf"^\s+{f.name}:[^\n]*?(?:#\s*([^\n]*))?$", src, re.M)
        comment = ((m.group(1) or "") if m else "").replace("|", "/")
        value = getattr(inst, f.name)
        if is_dataclass(value):  # a nested section: its own rows, after a line of what it is
            doc = " ".join(line.strip().lstrip("# ") for line in inspect.getsource(type(value)).splitlines()
                           if line.strip().startswith("#"))
            rows.append(f"| `{prefix}{f.name}.*` | | {(comment + ' ' + doc).strip().replace('|', '/')} |")
            rows += _table(type(value), f"{prefix}{f.name}.")[2:]
            continue
        rows.append(f"| `{prefix}{f.name}` | `{'null' if value is None else value}` | {comment} |")
    return rows


def markdown_reference() -> str:
    out = [_DOC_HEAD]
    for f in fields(Config):
        out += [f"## `{f.name}`", ""] + _table(f.default_factory, f"{f.name}.") + [""]  # type: ignore[arg-type]
    out += ["## `verirl sft`", ""] + _table(SFTConfig, "") + [""]
    out += ["## `verirl preprocess`", "", "MindSpeed-RL's data keys; see docs/data.md.", ""]
    out += _table(PreprocessConfig, "") + [""]
    out += ["## Recipes", "", "| `--config` | what |", "|---|---|"]
    out += [f"| `{name}` | {what} |" for name, what in RECIPES.items()] + [""]
    out += ["## Defaults changed for real models", "",
            "A `--config FILE` starts from the defaults above, chosen for a real model. Before the `tiny` recipe",
            "existed, three of them were the tiny model's; a file that relied on them now gets:", "",
            "| key | was | now | why |", "|---|---|---|---|"]
    out += [f"| `{key}` | `{was}` | `{now}` | {why} |" for key, was, now, why in CHANGED_DEFAULTS] + [""]
    out += ["## Renamed keys", "", "The old name still works and prints one line naming the new one.", "",
            "| old | new |", "|---|---|"]
    for renamed in RENAMED.values():
        out += [f"| `{old}` | `{new}` |" for old, new in renamed.items()]
    return "\n".join(out) + "\n"
