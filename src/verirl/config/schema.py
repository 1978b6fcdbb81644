"""The sections of the one typed config, and the only place defaults live.

Sections mirror the phases of a step: data -> model -> rollout -> reward -> algo -> actor (the
policy update) -> trainer (the loop) -> eval -> log. The dataclass defaults are for a real model (a
Hugging Face directory of 0.5B-7B parameters on one accelerator); the embedded default run on the
tiny model is the ``tiny`` recipe (`verirl train` with no ``--config``).

Each key is a `setting`: its default, its meaning (docs/config.md is generated from it) and the
bounds or names it must keep (``ge`` / ``gt`` / ``le`` / ``lt``, ``choices``: a `Registry`), which
`verirl.config.values.check_bounds` holds every loaded config to. A nested section is a `section`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from verirl.core.registry import Registry


def setting(default: Any, meaning: str, *, ge: Optional[float] = None, gt: Optional[float] = None,
            le: Optional[float] = None, choices: Optional[Registry] = None, why: str = "",
            normal: Optional[Callable[[Any], Any]] = None):
    """A key: ``default`` (a list or dict is copied for each config), what it means, and what it must keep:
    bounds (``ge``, ``gt``, ``le``; null passes), or ``choices`` (the value, through ``normal`` if given,
    is a name of that `Registry`); ``why`` ends a bound's error with the reason."""
    meta = {"help": meaning, "ge": ge, "gt": gt, "le": le, "choices": choices, "why": why, "normal": normal}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, meaning: str):
    """A nested section of keys, with what it is for."""
    return field(default_factory=cls, metadata={"help": meaning})


AGGREGATES = Registry("reward.aggregate", {
    "sum": "the weighted sum of the rules",
    "normalize_then_sum": "each rule normalised in its group first, then the weighted sum (GDPO)"})
ON_STALL = Registry("trainer.on_stall", {
    "warn": "say where the run is stuck and keep waiting", "abort": "end the run"})
PLACEMENTS = Registry("rollout.placement", {
    "colocated": "every process generates, then trains (the synchronous step)",
    "separate": "rollout.nproc processes generate and score while the others train (docs/async.md)"})
ASYNC_MODES = Registry("trainer.async_training.mode", {
    "fixed": "step s trains on samples from the weights after max(0, s - 1 - k) updates: two runs with one seed "
             "are identical",
    "bounded": "the producer runs ahead as fast as it can, never more than k versions behind the trainer"})
PROGRESS = Registry("log.progress", {
    "auto": "rich on a terminal, plain otherwise", "rich": "the live view",
    "plain": "one line per step, no escape codes", "off": "no view"})
CHECKPOINT_FORMATS = Registry("trainer.checkpoint_format", {
    "auto": "sharded when the actor's parameters are split across ranks (fsdp2 with more than one rank, "
            "tensor or pipeline parallel), whole otherwise",
    "whole": "the whole tensors in one Hugging Face directory, gathered and written by rank 0",
    "sharded": "each rank writes the pieces it holds (RUN_DIR/checkpoints/step_N/shards/rankR.*)"})


def progress_name(value: Any) -> str:
    """log.progress as a name of `PROGRESS`: any case, and true / false (YAML's booleans) as auto / off."""
    name = str(value).lower()
    return {"true": "auto", "false": "off"}.get(name, name)


@dataclass
class DataConfig:
    task: str = setting("arith", "built-in task generator (see `verirl.data.tasks`), used when train_path is empty")
    train_size: int = setting(20000, "problems drawn for training by the built-in generator")
    prompts_per_step: int = setting(8, "PROMPTS per step (each is sampled rollout.n times)", gt=0)
    max_prompt_length: int = setting(512, "tokens (veRL's default); longer prompts are filtered or refused "
                                     "(data.too_long)", gt=0)
    too_long: str = setting("error", "error (refuse to start, naming the row) / filter (drop and count)")
    seed: int = setting(0, "seeds the task generator and the prompt order")
    shuffle: str = setting("verl", "verl (torch RandomSampler order) / megatron / sequential")
    train_path: str = setting("", "your own data instead of the built-in task: a file or folder, raw or already "
                                  "preprocessed (a .parquet from `verirl preprocess`, with its .manifest.json); raw "
                                  "files are preprocessed on the fly with the keys below and cached under "
                                  "$VERIRL_CACHE/data (default ~/.cache/verirl/data)")
    prompt_type: str = setting("tokenizer", "template for raw files: a templates.json name, or tokenizer (the model's "
                               "own)")
    templates_file: str = setting("", "your own templates.json (MindSpeed-RL format)")
    handler_name: str = setting("R1AlpacaStyleInstructionHandler",
                                "how raw rows are read: R1AlpacaStyleInstructionHandler or VerlParquetHandler")
    map_keys: dict[str, str] = setting({}, "canonical -> data set field (see preprocess)")
    dataset_additional_keys: list[str] = setting(["labels"], "extra columns kept (task, ...)")


@dataclass
class ModelConfig:
    path: str = setting("tiny", "a Hugging Face directory, or tiny (the 1M-parameter model shipped with verirl)")
    dtype: str = setting("float32", "float32 / bfloat16 / float16")
    compute_dtype: Optional[str] = setting(
        None, "null or float32 (model.dtype) / bfloat16 / auto (bfloat16 where the CPU or GPU has it natively): mixed "
              "precision (docs/performance.md), the log-prob passes, the update (torch.autocast) and the native "
              "engine's products in bfloat16, over float32 weights, gradients and optimizer state; the output layer, "
              "norms, attention softmax and sampling stay in model.dtype")
    device: str = setting("auto", "auto (cuda, then npu, then cpu) / cpu / cuda / npu")
    override_config: dict[str, Any] = setting({}, "values that replace the model's config.json at load, for the "
                                                  "actor, the reference and the rollout engine alike (veRL's name), "
                                                  "e.g. {rms_norm_eps: 1e-5}: how another system's numerics are "
                                                  "reproduced")


SFT_MODELS = Registry("model", {"tiny": "the tiny tokenizer (Qwen's specials, <think>/<answer>)",
                                 "tiny-tools": "tiny's construction with <tool_call>/<tool_response> tokens, trained "
                                               "on calculator episodes; turns stop at <|im_end|> or </tool_call>",
                                 "tiny-moe": "the tiny tokenizer and a Qwen3-MoE (8 experts, top-2; docs/moe.md)"})
MULTI_TURN_REWARDS = Registry("rollout.multi_turn.reward", {
    "sum": "the rules' score of the final answer plus every reward the environment returned",
    "last": "the rules' score of the final answer plus the environment's last reward"})


@dataclass
class MultiTurnConfig:
    enable: bool = setting(False, "multi-turn rollouts: the model calls tools or talks to an environment, reads the "
                                  "result and goes on (docs/agents.md)")
    max_turns: int = setting(4, "assistant turns per episode at most (veRL's max_assistant_turns)", gt=0)
    max_env_turns: int = setting(0, "observations (tool results or environment messages) per episode at most; "
                                    "0 = max_turns (veRL's max_user_turns)", ge=0)
    max_tool_response_tokens: int = setting(256, "an observation is cut to this many tokens (its template "
                                                 "markup not counted)", gt=0)
    max_tool_response_chars: int = setting(0, "an observation's text is cut to this many characters first; 0 = "
                                              "no character limit (veRL's max_tool_response_length counts "
                                              "characters)", ge=0)
    max_total_tokens: int = setting(0, "response tokens per episode in all (sampled and observations); 0 = "
                                       "rollout.max_new_tokens", ge=0)
    max_tokens_per_turn: int = setting(0, "sampled tokens per assistant turn; 0 = rollout.max_new_tokens", ge=0)
    tools: list[str] = setting([], "tools the model may call: built-in names (calculator, python), "
                                   "file.py:function, module:function, or a veRL tool config YAML")
    environment: str = setting("", "an environment instead of (or with) tools: file.py:Class or module:Class, "
                                   "with reset(prompt) and step(turn) (docs/agents.md)")
    parser: str = setting("auto", "how tool calls are read from a turn: auto (by the chat template), hermes "
                                  "(<tool_call>{json}</tool_call>: Qwen2.5, Qwen3), llama3 (a JSON object), "
                                  "answer (no tools: the turn is the answer)")
    reward: str = setting("sum", "what the environment's rewards add to the answer's score",
                          choices=MULTI_TURN_REWARDS)
    tool_timeout_s: float = setting(10.0, "a tool call's wall-clock deadline, seconds", gt=0)
    tool_workers: int = setting(2, "processes that run tool calls while the other samples decode", gt=0)


@dataclass
class RolloutConfig:
    engine: str = setting("native", "native (own KV-cache sampler) / hf (transformers generate) / replay (from a dump) "
                          "/ vllm")
    n: int = setting(8, "samples per prompt (the GRPO group size; 8 is the common choice)", ge=2,
                     why="group advantages compare the samples of one prompt with each other (8 is typical)")
    max_new_tokens: int = setting(512, "response length cap, tokens, the stop token included (veRL's default)", gt=0)
    temperature: float = setting(1.0, "sampling temperature (0 = greedy); log-probs are taken at the same "
                                      "temperature", ge=0)
    top_p: float = setting(1.0, "nucleus sampling: keep the smallest set of tokens with this much mass", gt=0, le=1)
    top_k: int = setting(0, "0 = off", ge=0)
    micro_batch_size: int = setting(0, "sequences per generate call; 0 = the whole step at once", ge=0)
    replay_path: str = setting("", "engine=replay: a rollouts.jsonl (trainer.dump_rollouts) or another system's JSONL "
                               "dump")
    replay_prompts: str = setting("data", "engine=replay: data (the run's prompts, checked against the dump) / dump "
                                  "(the dump's)")
    replay_eos: str = setting("length", "engine=replay, text without a stopped field: length (EOS when < "
                                        "max_new_tokens) / always / never")
    # engine=vllm (docs/vllm.md): vLLM's offline engine inside each training process
    tensor_parallel_size: int = setting(0, "ranks that decode together on a tensor-parallel plan (a vLLM engine's, or "
                                           "the native engine's on the actor's): 0 = actor.tensor_parallel_size (1 "
                                           "with engine hf); 1 = every rank decodes with the whole weights "
                                           "(docs/parallelism.md)", ge=0)
    gpu_memory_utilization: float = setting(0.5, "share of the device's memory vLLM may take (weights + KV cache)")
    dtype: Optional[str] = setting(None, "vLLM decodes in: null (model.dtype) / compute (model.compute_dtype, "
                                         "resolved) / float32 / bfloat16 / float16")
    max_num_seqs: int = setting(0, "sequences vLLM schedules at once; 0 = data.prompts_per_step x rollout.n / "
                                "data-parallel size")
    max_num_batched_tokens: int = setting(0, "tokens per vLLM scheduler step; 0 = vLLM's default")
    enable_chunked_prefill: bool = setting(True, "split long prefills across scheduler steps (turned off on a CPU: "
                                           "docs/vllm.md)")
    enforce_eager: bool = setting(True, "no CUDA graphs (faster start, less memory; graphs are faster per token)")
    free_cache_engine: bool = setting(True, "vLLM sleeps (frees its KV cache) while the actor trains, where the "
                                      "backend can")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "multi-turn rollouts with tools and environments, token "
                                                           "in / token out (docs/agents.md)")
    placement: str = setting("colocated", "colocated: every process generates, then trains / separate: rollout.nproc "
                                          "of the trainer.nproc_per_node processes generate and score while the rest "
                                          "train (docs/async.md)", choices=PLACEMENTS)
    nproc: int = setting(1, "placement=separate: the processes that generate (producers), out of "
                            "trainer.nproc_per_node", gt=0)


@dataclass
class OverlongBufferConfig:
    enable: bool = setting(False, "add the penalty to every response's reward")
    len: int = setting(0, "the buffer B, tokens; 0 = a fifth of rollout.max_new_tokens (DAPO: 4096 of 20480)", ge=0)
    penalty_factor: float = setting(1.0, "the penalty at max_new_tokens", ge=0)


CODE_EXTRACT = Registry("reward.code.extract", {
    "block": "the last fenced code block (```python ... ``` or ``` ... ```); a response without one scores 0",
    "block_or_whole": "the last fenced block, else the whole response",
    "whole": "the whole response is the program"})
CODE_MODES = Registry("reward.code.mode", {
    "fraction": "the share of the sample's tests that pass",
    "all": "1 when every test passes, else 0 (solved or not, as pass@1 counts it; veRL's default reward "
           "scores the share of the first 10 tests: fraction)"})
CODE_LANGUAGES = Registry("reward.code.language", {"python": "Python 3, the trainer's interpreter, run isolated (-I)"})
JUDGE_PARSERS = Registry("reward.judge.parse", {
    "number": "the last number in the reply, divided by reward.judge.scale",
    "yes_no": "1 when the reply's last yes/no word is yes, 0 when no",
    "boxed": "the number in the reply's last \\boxed{}, divided by reward.judge.scale"})


@dataclass
class CodeRewardConfig:
    extract: str = setting("block_or_whole", "where the program is in a response", choices=CODE_EXTRACT)
    tests: str = setting("label", "the sample's column holding its test cases: APPS/TACO input_output, CodeContests "
                                  "public/private/generated_tests, LiveCodeBench test cases or veRL's prime "
                                  "{inputs, outputs, fn_name} (docs/rewards.md)")
    mode: str = setting("fraction", "the score", choices=CODE_MODES)
    language: str = setting("python", "the programs' language", choices=CODE_LANGUAGES)
    test_timeout_s: float = setting(5.0, "wall-clock seconds per test case; past it the test fails", gt=0)
    sample_timeout_s: float = setting(30.0, "wall-clock seconds for all of one sample's tests; the tests not run by "
                                            "then fail", gt=0)
    max_tests: int = setting(0, "run at most this many of a sample's tests (the first ones); 0 = all", ge=0)
    memory_mb: int = setting(1024, "address space of a program under test, MB", gt=0)
    processes: int = setting(32, "processes a program under test may run at once (its sandbox's)", gt=0)
    concurrency: int = setting(0, "samples run at once, each in its own sandbox; 0 = one per core", ge=0)


@dataclass
class RemoteRewardConfig:
    url: Optional[str] = setting(None, "POST {\"items\": [{prompt, response, label, task, ...}]} -> {\"scores\": "
                                       "[...]} (docs/rewards.md); the rule 'remote' in reward.verifiers")
    api_key_env: Optional[str] = setting(None, "the environment variable holding the key, sent as "
                                               "'Authorization: Bearer <key>' (never written anywhere)")
    batch_size: int = setting(16, "samples per request", gt=0)
    max_concurrency: int = setting(8, "requests in flight at once", gt=0)
    timeout_s: float = setting(30.0, "deadline for a batch's scoring from its first request, retries included; "
                                     "what is not scored by then scores 0 and is counted in reward/remote/errors",
                               gt=0)
    retries: int = setting(3, "retries of a request that failed with a 5xx, a 429 or a connection error", ge=0)
    backoff_s: float = setting(0.5, "the first retry's wait; doubled each retry (with jitter)", ge=0)


@dataclass
class JudgeConfig:
    url: Optional[str] = setting(None, "an OpenAI-compatible server's base URL (.../v1); the rule 'judge' in "
                                       "reward.verifiers")
    model: Optional[str] = setting(None, "the model name sent in each chat request")
    template: str = setting("Question:\n{prompt}\n\nReference answer: {label}\n\nResponse:\n{response}\n\n"
                            "Is the response correct? Answer yes or no.",
                            "the judge's user message; {prompt}, {response}, {label} and the sample's columns are "
                            "filled in; a path to a .txt file is read")
    system: Optional[str] = setting(None, "a system message before the template")
    parse: str = setting("yes_no", "how a reply becomes a score", choices=JUDGE_PARSERS)
    scale: float = setting(1.0, "number / boxed: the reply's number is divided by this (10 for a 0-10 grade)", gt=0)
    api_key_env: Optional[str] = setting(None, "the environment variable holding the key (never written anywhere)")
    max_tokens: int = setting(256, "the reply's length at most, tokens", gt=0)
    temperature: float = setting(0.0, "the judge's sampling temperature", ge=0)
    max_concurrency: int = setting(8, "requests in flight at once", gt=0)
    timeout_s: float = setting(60.0, "deadline for a batch's judging from its first request, retries included; "
                                     "what is not judged by then scores 0 and is counted in reward/remote/errors",
                               gt=0)
    retries: int = setting(3, "retries of a request that failed with a 5xx, a 429 or a connection error", ge=0)
    backoff_s: float = setting(0.5, "the first retry's wait; doubled each retry (with jitter)", ge=0)


@dataclass
class RewardModelConfig:
    path: Optional[str] = setting(None, "a Hugging Face sequence-classification model (AutoModelForSequence"
                                        "Classification) scoring the chat-templated prompt and response; the rule "
                                        "'model' in reward.verifiers")
    index: int = setting(0, "the logit that is the score (0 for a one-label head)", ge=0)
    max_token_len: int = setting(8192, "tokens per forward pass (packed greedily, like the log-prob passes)", gt=0)
    dtype: str = setting("auto", "auto (the trainer's model.dtype) / float32 / bfloat16 / float16")


@dataclass
class RewardConfig:
    verifiers: list[str] = setting(["acc", "format"], "rule names (see verirl.rewards)")
    weights: list[float] = setting([1.0, 0.5], "one per verifier, same order")
    tasks: dict[str, list[str]] = setting({}, "task -> the rules that score it, e.g. {add: [acc, format], mul: "
                                              "[exact, format]}; a task not listed is scored by every verifier ({} = "
                                              "every rule scores every task)")
    workers: int = setting(-1, "scoring processes: -1 = one per core (at most 8); 0 = in this process, no timeout",
                           ge=-1, why="give -1 (one scoring process per core, at most 8), 0 (score in the training "
                                      "process, no timeout) or a number of processes >= 1")
    timeout: float = setting(10.0, "seconds per scoring call, from when it starts running; past it the worker is "
                                   "replaced and the call scores 0", gt=0)
    max_memory_mb: int = setting(0, "address-space (virtual memory) cap per scoring worker, MB; 0 = no cap (Linux "
                                 "only), or 4096 in the sandbox", ge=0)
    sandbox: bool = setting(True, "score in `verirl.sandbox` (docs/sandbox.md): no network, the file system "
                                  "read-only, the run directory and home hidden, a uid of its own (or a user namespace), "
                                  "nothing of a call's left alive after it, none of the trainer's variables; false: "
                                  "plain workers with the trainer's uid, files and environment (said at start)")
    max_abs_score: float = setting(1e6, "a rule's score beyond +-this (or not finite) is an error: scored 0, counted "
                                   "in reward/errors", gt=0)
    aggregate: str = setting("sum", "sum (weighted sum of the rules) / normalize_then_sum (each rule normalised in "
                                    "its group first: GDPO)", choices=AGGREGATES)
    code: CodeRewardConfig = section(CodeRewardConfig, "the rule 'code': a response's program run against the "
                                                       "sample's tests in the sandbox (docs/rewards.md)")
    remote: RemoteRewardConfig = section(RemoteRewardConfig, "the rule 'remote': a scoring server over HTTP")
    judge: JudgeConfig = section(JudgeConfig, "the rule 'judge': an LLM judge behind an OpenAI-compatible endpoint")
    model: RewardModelConfig = section(RewardModelConfig, "the rule 'model': a reward model in the trainer's process")
    overlong_buffer: OverlongBufferConfig = section(
        OverlongBufferConfig, "DAPO's soft overlong punishment: a response of L tokens longer than "
                              "rollout.max_new_tokens - len gets -penalty_factor * min(1, (L - (max_new_tokens - len)) "
                              "/ len), logged as the rule reward/overlong")


@dataclass
class FilterGroupsConfig:
    enable: bool = setting(False, "regenerate until the step's groups all carry signal (logs filter/*)")
    metric: str = setting("reward", "the per-sample quantity whose spread is tested: reward (the total) or a rule's "
                          "name")
    max_num_gen_batches: int = setting(10, "generation batches per step at most (0 = no limit); then the step trains "
                                       "on what it has", ge=0)


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = setting(None, "token / sequence / null: truncated importance weights on the loss")
    rollout_is_threshold: float = setting(2.0, "the cap on the importance weight", ge=0)
    rollout_rs: Optional[str] = setting("sequence", "token / sequence / geometric / null: reject samples outside the "
                                        "bounds")
    rollout_rs_threshold: float = setting(3.0, "upper bound on the ratio (TRL's vllm_importance_sampling_clip_max)",
                                          ge=0)
    rollout_rs_threshold_lower: float = setting(0.0, "lower bound; 0 = none (TRL's default)", ge=0)


@dataclass
class DistillConfig:
    teacher: Optional[str] = setting(None, "a model with the student's tokenizer: on-policy distillation, the "
                                           "per-token reverse KL (teacher log-prob - student log-prob of each "
                                           "sampled token) as an advantage (docs/algorithms.md)")
    coef: float = setting(1.0, "the weight of the distillation advantage", ge=0)
    rewards: bool = setting(True, "add the rules' group advantage to it; false: the distillation advantage alone",)


ROUTER_REPLAY = Registry("algo.router_replay", {
    "off": "every pass routes by its own router",
    "R2": "the update routes by the routes the trainer's old-log-prob pass chose (no old pass: as off)",
    "R3": "the old-log-prob pass and the update route by the experts the rollout engine chose (rollout.engine=native)"})


@dataclass
class AlgoConfig:
    adv_estimator: str = setting("grpo", "grpo (group mean/std) / rloo (leave-one-out) / reinforce_plus_plus_baseline")
    scale_rewards: str = setting("group", "group (divide by the group std) / batch (by the batch std) / none (Dr. "
                                 "GRPO)")
    norm_adv_by_std: Optional[bool] = setting(None, "veRL's name: true = scale_rewards group, false = none; null = "
                                              "unset")
    adv_epsilon: float = setting(1e-6, "added to the std (veRL's; TRL uses 1e-4)", ge=0)
    kl_coef: float = setting(0.0, "weight of the KL-to-reference loss; 0 (DAPO's and TRL's default) skips the "
                             "reference pass", ge=0)
    kl_type: str = setting("low_var_kl", "k3, clamped to [-10, 10]; also: kl (k1), mse (k2), abs")
    policy_loss: str = setting("vanilla", "vanilla / dual_clip / gspo / cispo / clip_cov / kl_cov (docs/algorithms.md)")
    clip_ratio_low: Optional[float] = setting(None, "ratio floor 1 - low; null = the policy loss's default (0.2; gspo "
                                              "3e-4)", ge=0)
    clip_ratio_high: Optional[float] = setting(None, "ratio ceiling 1 + high (DAPO clip-higher: 0.28); null = 0.2 "
                                               "(gspo 4e-4)", ge=0)
    clip_ratio_c: float = setting(3.0, "dual_clip: the loss of a negative advantage is at most -A * clip_ratio_c", ge=0)
    clip_ratio_max: float = setting(5.0, "cispo: the cap on the stop-gradient importance weight (TRL's epsilon_high "
                                    "there)", ge=0)
    clip_cov_ratio: float = setting(0.0002, "clip_cov: share of tokens whose gradient is cut", ge=0)
    clip_cov_lb: float = setting(1.0, "clip_cov: covariance window, lower bound")
    clip_cov_ub: float = setting(5.0, "clip_cov: covariance window, upper bound")
    kl_cov_ratio: float = setting(0.0002, "kl_cov: share of tokens given the KL penalty", ge=0)
    ppo_kl_coef: float = setting(0.1, "kl_cov: weight of that penalty (veRL's default)", ge=0)
    entropy_coef: float = setting(0.0, "entropy bonus weight (subtracted from the loss)")
    top_entropy_quantile: float = setting(1.0, "train only on this top share of tokens by entropy (TRL's name; 1 = "
                                               "all)", gt=0, le=1,
                                          why="the share of tokens, by entropy, that the policy loss keeps (1 = all, "
                                              "0.2 = the top fifth)")
    loss_agg_mode: str = setting("token-mean", "token-mean (veRL's default) / seq-mean-token-mean / "
                                               "seq-mean-token-sum / seq-mean-token-sum-norm")
    loss_scale_factor: float = setting(0.0, "seq-mean-token-sum-norm: the constant divisor; 0 = rollout.max_new_tokens "
                                       "(Dr. GRPO)", ge=0)
    mask_truncated: bool = setting(False, "responses cut at rollout.max_new_tokens (no stop token) get no loss")
    router_replay: str = setting("off", "a mixture-of-experts model's routing replay (docs/moe.md): off / R2 (the "
                                 "update routes by the old-log-prob pass's routes) / R3 (the old pass and the update "
                                 "route by the rollout engine's recorded experts: rollout.engine=native); lower case "
                                 "accepted", choices=ROUTER_REPLAY,
                                 normal=lambda v: "off" if str(v).lower() in ("off", "none", "false") else str(v).upper())
    moe_aux_loss_coef: float = setting(0.0, "a mixture-of-experts model's load-balancing loss (transformers' "
                                       "load_balancing_loss_func on the routers' logits) added to the loss times "
                                       "this; 0 = off (moe/aux_loss)", ge=0)
    distill: DistillConfig = section(DistillConfig, "on-policy distillation from a teacher model")
    filter_groups: FilterGroupsConfig = section(
        FilterGroupsConfig, "DAPO dynamic sampling: groups whose metric is the same for every sample (all right or "
                            "all wrong: zero advantage, no signal) are dropped and more prompts generated until the "
                            "step has data.prompts_per_step")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "The train/inference mismatch guard (docs/algorithms.md): the ratio trainer / "
                                 "rollout-engine probability of each sampled token. Engines that return no log-probs "
                                 "(hf, replay) turn it off, and say so once.")


LORA_INITS = Registry("actor.lora.init", {
    "true": "peft's default: A Kaiming-uniform, B zero (the adapted model starts as the base)",
    "gaussian": "A Gaussian scaled by the rank, B zero",
    "orthogonal": "A and B from orthogonal rows of one matrix: B A = 0 with neither zero (an even rank)"})


@dataclass
class LoraConfig:
    rank: int = setting(0, "LoRA adapters of this rank on the actor (docs/lora.md); 0 = off, every parameter "
                           "trained", ge=0)
    alpha: float = setting(16.0, "the adapters' scale is alpha / rank (peft's lora_alpha)", gt=0)
    dropout: float = setting(0.0, "dropout on the adapters' input while training (off in the log-prob passes and "
                                  "decoding)", ge=0, le=1)
    target_modules: Any = setting("all-linear", "the linear layers that get adapters: all-linear (every linear "
                                                "layer but the output layer; on a MoE model not the routers or "
                                                "the routed experts) or a list of module names, e.g. "
                                                "[q_proj,v_proj]")
    init: str = setting("true", "the adapters' initialisation, by peft's init_lora_weights names", choices=LORA_INITS,
                        normal=lambda v: str(v).lower())


@dataclass
class ActorConfig:
    lr: float = setting(1e-6, "AdamW peak learning rate (veRL's default for the actor of a real model)", gt=0)
    betas: list[float] = setting([0.9, 0.99], "AdamW betas")
    weight_decay: float = setting(0.0, "AdamW decoupled weight decay")
    warmup_steps: int = setting(0, "optimizer steps of linear warm-up from 0 to lr", ge=0)
    grad_clip: float = setting(1.0, "max global grad norm; <= 0 disables")
    mini_batch_prompts: int = setting(8, "PROMPTS per optimizer step (see module docstring)", gt=0)
    micro_batch_size: int = setting(64, "SEQUENCES per forward/backward (gradient accumulation)", gt=0)
    epochs: int = setting(1, "passes over each step's rollouts", gt=0)
    max_token_len_per_device: int = setting(0, "token budget per forward/backward (update and old log-probs): "
                                               "micro-batches are balanced bins of at most this many real tokens (a "
                                               "shared prompt counted once); 0 = use micro_batch_size", ge=0)
    use_remove_padding: bool = setting(True, "pack sequences into one row: no compute on pad tokens")
    share_prompt: bool = setting(True, "with packing: compute each prompt once for its rollout.n samples")
    logprob_chunk: int = setting(0, "output-layer rows per log-prob chunk; 0 = auto (about 4M logits per chunk on a "
                                    "CPU, 64M on a GPU or NPU; at least 64 rows)", ge=0)
    strategy: str = setting("fsdp2", "data parallelism when the world size is above 1: fsdp2 (sharded) / ddp "
                            "(replicated)")
    tensor_parallel_size: int = setting(1, "ranks that split each layer (tensor parallel, docs/parallelism.md): "
                                           "heads, MLP width and vocabulary 1/tp per rank; data parallel = world / "
                                           "this", gt=0)
    sequence_parallel_size: int = setting(1, "ranks that split each packed micro-batch's tokens (Ulysses sequence "
                                             "parallel, docs/parallelism.md): attention heads / (tp x this) per rank "
                                             "around attention; the token budget counts each rank's share; data "
                                             "parallel = world / (tp x this)", gt=0)
    pipeline_parallel_size: int = setting(1, "pipeline stages of decoder layers, one per rank (docs/parallelism.md); "
                                             "needs max_token_len_per_device: every micro-batch is padded to it "
                                             "between stages; data parallel = world / (tp x sp x this)", gt=0)
    expert_parallel_size: int = setting(1, "ranks that split a mixture-of-experts model's routed experts (expert "
                                           "parallel, docs/moe.md): E/ep experts per rank, tokens exchanged by "
                                           "all-to-all; divides data parallel x sequence parallel", gt=0)
    expert_tensor_parallel_size: int = setting(1, "ranks that split each expert's matrices; 1 only (experts whole "
                                                  "on their rank)", gt=0)
    pipeline_schedule: str = setting("1f1b", "1f1b / gpipe / interleaved_1f1b (2 stages per rank)")
    pipeline_layers: list[int] = setting([], "decoder layers of each stage, first to last (MindSpeed-RL's "
                                             "num_layer_list); [] = an even split, earlier stages one more")
    offload: str = setting("none", "none / optimizer / params: what leaves the device between phases (where supported)")
    lora: LoraConfig = section(LoraConfig, "LoRA: low-rank adapters trained instead of the whole model; the reference "
                                           "is the base with the adapters off (docs/lora.md).")


@dataclass
class RefConfig:
    log_prob_max_token_len_per_device: int = setting(0, "token budget per reference log-prob forward; 0 = the "
                                                        "actor's (max_token_len_per_device or micro_batch_size)", ge=0)
    offload: bool = setting(False, "keep the reference model on the host between its passes (where supported)")


@dataclass
class ActivationDumpConfig:
    steps: list[int] = setting([], "the steps whose update is recorded ([] = none)")
    modules: str = setting(".*", r'a regular expression over module names, e.g. "layers\\.0\\."')
    backward: bool = setting(False, "also the gradients flowing back into each module's output")
    dir: str = setting("", "\"\" = RUN_DIR/activations; one file per step and rank: DIR/step_N/rankR.json")


@dataclass
class AsyncTrainingConfig:
    max_staleness: int = setting(0, "k: a sample is trained on at most k policy versions after the weights that "
                                    "generated it; 0 = the synchronous step, bit for bit; k > 0 needs "
                                    "rollout.placement=separate", ge=0)
    mode: str = setting("fixed", "fixed: step s trains on samples of version max(0, s - 1 - k), reproducible / "
                                 "bounded: the producer runs ahead as fast as it can within k versions",
                        choices=ASYNC_MODES)
    partial_rollout: bool = setting(False, "mode=bounded: sequences still decoding when new weights arrive go on "
                                           "with them (each token's version and log-prob recorded) instead of "
                                           "finishing on the old ones")
    sync_every: int = setting(1, "the trainer hands its weights to the producers every N updates (at most k + 1)",
                              gt=0)
    max_restarts: int = setting(3, "a producer that dies is started again this many times in a row at most, its "
                                   "unfinished steps generated again", ge=0)


@dataclass
class TrainerConfig:
    total_steps: int = setting(100, "GRPO steps (one rollout each)", gt=0)
    run_dir: str = setting("runs/default", "config.yaml, metrics.jsonl, summary.json, final/ go here")
    seed: int = setting(0, "seeds python, numpy, torch and the rollout sampling")
    save_freq: int = setting(100, "write a checkpoint every N steps, and always at the end (0 = only at the end)", ge=0)
    keep_checkpoints: int = setting(2, "keep the newest N checkpoints in RUN_DIR/checkpoints (0 = keep all)", ge=0)
    checkpoint_format: str = setting("auto", "sharded: each rank writes the pieces it holds, no rank gathers the "
                                     "model; whole: gathered into one Hugging Face directory; auto: sharded when "
                                     "the actor's parameters are split across ranks. Either resumes on any layout "
                                     "(docs/checkpoints.md)", choices=CHECKPOINT_FORMATS)
    resume: str = setting("auto", "auto: continue from RUN_DIR's newest checkpoint, if any / false / a checkpoint path")
    overwrite: bool = setting(False, "with resume=false: delete the previous run in run_dir instead of refusing")
    dump_rollouts: bool = setting(False, "write RUN_DIR/rollouts.jsonl, one line per response")
    max_nonfinite_steps: int = setting(3, "stop after this many steps in a row with a non-finite loss or grad norm "
                                       "(skipped)", gt=0)
    threads: int = setting(0, "torch intra-op threads per rank; 0 = the cores divided by the local ranks")
    nproc_per_node: int = setting(1, "ranks (processes) on this machine, started with torch's elastic launcher", gt=0)
    nnodes: int = setting(1, "machines; with > 1, start the same command on each (torchrun's rendezvous)", gt=0)
    rdzv_endpoint: str = setting("", "host:port of the rendezvous for nnodes > 1 (e.g. the first machine:29400)")
    launcher: str = setting("local", "local (torch.distributed.run) / ray (placement group on a Ray cluster)")
    ray_address: str = setting("auto", "the Ray cluster to join (auto: the running one, else a local one started for "
                               "the run)")
    dist_timeout_s: int = setting(600, "a rank that raises or dies ends every rank within this many seconds", gt=0)
    dump_activations: ActivationDumpConfig = section(
        ActivationDumpConfig, "Per-module statistics of the training forward (and backward) of chosen steps, for "
                              "`verirl compare-activations` (docs/activations.md); generation is not hooked.")
    stall_timeout_s: float = setting(1800.0, "a phase running longer than this dumps every thread's stack to "
                                     "RUN_DIR/stall_<step>.txt", gt=0)
    on_stall: str = setting("warn", "warn (say where it is stuck and keep waiting) / abort (end the run)",
                            choices=ON_STALL)
    peak_flops: float = setting(0.0, "the device's peak FLOP/s behind perf/mfu; 0 = measured once per device type "
                                "(cached)", ge=0)
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, "Asynchronous training (docs/async.md): with rollout.placement=separate the producers "
                             "generate while the trainers update, samples at most max_staleness versions old.")


@dataclass
class EvalConfig:
    data: str = setting("", 'a data file or folder (raw or preprocessed) of held-out prompts; "" = the built-in '
                            "task's held-out split, and with data.train_path no held-out evaluation at all (said at "
                            "start)")
    size: int = setting(200, "held-out problems of the built-in task (never trained on)", ge=0)
    n: int = setting(4, "sampled responses per problem (pass@k for k up to n, maj@n); 0 = greedy only", ge=0)
    temperature: float = setting(1.0, "temperature of the n samples", ge=0)
    top_p: float = setting(1.0, "nucleus sampling of the n samples: keep the smallest set of tokens with this much "
                                "mass", gt=0, le=1)
    top_k: int = setting(0, "the n samples draw from the k most likely tokens; 0 = off", ge=0)
    greedy: bool = setting(True, "also decode each problem greedily once (val/greedy_acc)")
    before_train: bool = setting(True, "evaluate before the first step (logged as step 0)")
    every: int = setting(0, "evaluate every N steps (0 = never)", ge=0)
    at_end: bool = setting(True, "evaluate after the last step")


@dataclass
class LogConfig:
    progress: str = setting("auto", "auto (rich on a terminal, plain otherwise) / rich / plain (one line a step) / "
                                    "off (no view)", choices=PROGRESS, normal=progress_name)
    console_every: int = setting(10, "with rich or off: a metrics line every N steps (0 = never); plain prints every "
                                 "step")
    backends: list[str] = setting(["console", "jsonl"], "where step metrics go; metrics.jsonl is always written. "
                                                        "tensorboard: RUN_DIR/tensorboard; wandb: offline unless "
                                                        "WANDB_MODE says otherwise; mlflow: RUN_DIR/mlruns unless "
                                                        "MLFLOW_TRACKING_URI; swanlab (docs/trackers.md)")
    project: str = setting("verirl", "the trackers' project / experiment name")
    run_name: str = setting("", "the trackers' run name; \"\" = the run directory's name")


@dataclass
class Config:
    data: DataConfig = section(DataConfig, "The prompts: the built-in task or your own files, and their order.")
    model: ModelConfig = section(ModelConfig, "The policy model (and the reference, a copy of it): where it is, "
                                              "its dtypes and device.")
    rollout: RolloutConfig = section(RolloutConfig, "Generation: the engine and its sampling.")
    reward: RewardConfig = section(RewardConfig, "Scoring: the rules, their weights and the scoring processes.")
    algo: AlgoConfig = section(AlgoConfig, "The algorithm: advantages, KL, the policy loss and its options.")
    actor: ActorConfig = section(ActorConfig, "The policy update: optimizer, batch shapes and data parallelism.")
    ref: RefConfig = section(RefConfig, "The reference model's log-prob pass (with algo.kl_coef > 0).")
    trainer: TrainerConfig = section(TrainerConfig, "The loop: steps, the run directory, checkpoints, ranks, and "
                                                    "the hang watchdog.")
    eval: EvalConfig = section(EvalConfig, "Held-out evaluation with the training engine and rules, logged under "
                                           "val/ in metrics.jsonl and summary.json: val/greedy_acc, val/pass@k, "
                                           "val/maj@n, val/reward_mean, overall and per task / data_source.")
    log: LogConfig = section(LogConfig, "What the run shows and where its metrics go.")


@dataclass
class SFTConfig:
    """`verirl sft`: supervised warm start on a built-in task (how the tiny model is made)."""
    init: str = setting("scratch", "scratch = build the tiny tokenizer + a fresh model; or a model directory")
    out_dir: str = setting("runs/sft", "where the Hugging Face directory is written (`make weights`: the shipped "
                                       "model)")
    model: str = setting("tiny", "with init=scratch, the tokenizer and model built: tiny, tiny-tools (the tool-call "
                                 "tokens; tasks with tools are trained as episodes, loss on the assistant turns) or "
                                 "tiny-moe (tiny's tokenizer, a Qwen3-MoE)",
                         choices=SFT_MODELS)
    task: str = setting("arith", "built-in task (arith_tools: calculator episodes, for model=tiny-tools)")
    seed: int = setting(0, "seeds the tokenizer, the init, the data and the order (use GRPO's data.seed)")
    val_size: int = setting(200, "the held-out split (the same problems GRPO evaluates on)")
    train_size: int = setting(50000, "problems drawn for SFT (from the non-held-out pool)")
    batch_size: int = setting(64, "sequences per step")
    lr: float = setting(1e-3, "AdamW, betas (0.9, 0.99)")
    warmup_steps: int = setting(50, "linear warm-up steps")
    max_steps: int = setting(2000, "upper bound on SFT steps")
    eval_every: int = setting(25, "steps between held-out greedy checks")
    target_greedy: float = setting(0.20, "stop once held-out greedy accuracy reaches this (0 = run max_steps); with "
                                         "tools: of the whole episode, the calculator's result read back")
    threads: int = setting(0, "torch threads; 0 = all cores")


@dataclass
class PreprocessConfig:
    """`verirl preprocess`: MindSpeed-RL's data keys, so its data configs carry over (see docs/data.md)."""
    input: str = setting("", "a .json/.jsonl/.parquet/.arrow file or a folder of them")
    tokenizer_name_or_path: str = setting("tiny", "a tokenizer directory, or tiny")
    output_prefix: str = setting("", "writes PREFIX.parquet and PREFIX.manifest.json")
    handler_name: str = setting("R1AlpacaStyleInstructionHandler",
                                "how rows are read: R1AlpacaStyleInstructionHandler or VerlParquetHandler")
    tokenizer_type: str = setting("HuggingFaceTokenizer", "the only kind supported")
    workers: int = setting(1, "processes that tokenize")
    log_interval: int = setting(1000, "rows between progress updates")
    prompt_type: str = setting("qwen_r1", "template name (empty, qwen, qwen_r1, qwen_math_r1, llama3, ...) or "
                               "tokenizer")
    templates_file: str = setting("", "a templates.json of your own (MindSpeed-RL format); adds/overrides by name")
    map_keys: dict[str, str] = setting({}, 'prompt/query/response/system -> field ({} = defaults): the canonical '
                                           'field -> the data set field (nested with dots, e.g. '
                                           'reward_model.ground_truth); "" = unused. Unset fields take the '
                                           "handler's default (instruction: prompt=problem, response=answer).")
    dataset_additional_keys: list[str] = setting(["labels"], "kept for the rewards")
    max_prompt_length: int = setting(0, "tokens; 0 = no limit")
    too_long: str = setting("filter", "filter (count and drop) / error")
    on_bad_row: str = setting("error", "error (stop, naming file/row/key) / skip (count and go on)")

def scale_rewards(algo: AlgoConfig) -> str:
    """algo.scale_rewards, with veRL's algo.norm_adv_by_std=false read as none."""
    return "none" if algo.norm_adv_by_std is False else algo.scale_rewards
