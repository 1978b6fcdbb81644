"""The sections of the one typed config, and the only place defaults live.

Sections mirror the phases of a step: data -> model -> rollout -> reward -> algo -> actor (the
policy update) -> trainer (the loop) -> eval -> log. The dataclass defaults are for a real model (a
Hugging Face directory of 0.5B-7B parameters on one accelerator); the embedded default run on the
tiny model is the ``tiny`` recipe (`verirl train` with no ``--config``). Each default says why in its
comment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


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



def scale_rewards(algo: AlgoConfig) -> str:
    """algo.scale_rewards, with veRL's algo.norm_adv_by_std=false read as none."""
    return "none" if algo.norm_adv_by_std is False else algo.scale_rewards
