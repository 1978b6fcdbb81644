"""From a config to the plain objects a run is made of. `build_run` turns the config into them:
everything after it (the step, the update, the evaluation, the loop) takes the values it was
handed. The config itself is only saved (config.yaml, checkpoints), compared with a checkpoint's
on resume, and named in the run's first line."""
from __future__ import annotations

import copy
import dataclasses
import functools
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from verirl.core.algo import ADVANTAGE_ESTIMATORS, CLIP_DEFAULTS, PolicyLossParams
from verirl.config import Config, scale_rewards
from verirl.data import PromptSampler, encode_prompts
from verirl.data.dataset import data_loading_options, load_data, load_prompts
from verirl.models.perf import FlopModel, device_name, peak_flops
from verirl.models import load_model
from verirl.models.lora import LoraSettings, apply_lora, target_modules
from verirl.models.device import compute_dtype, resolve_device
from verirl.config.layout import reward_workers_per_rank, rollout_tensor_parallel, threads_per_rank
from verirl.rewards import Scorer
from verirl.rollout import Engine, SamplingParams, build_engine
from verirl.rollout.multiturn import MultiTurn, ReplayedEpisodes, TurnLimits
from verirl.rollout.render import TurnRenderer
from verirl.rollout.replay import dump_prompts
from verirl.rollout.vllm import vllm_options
from verirl.train.update import Correction, LogprobPass, UpdateParams, build_optimizer
from verirl.models.parallel import tensor_parallel
from verirl.models.expert_parallel import shard_experts
from verirl.models.moe import moe_blocks, routing
from verirl.models.router_tap import replay_mode
from verirl.train.pipelined import pipeline, push_tensor, tied_group
from verirl.train.distributed import TP, Dist
from verirl.train.packing import supports_packing
from verirl.train.settings import (ActivationSettings, DistillSettings, EvalSettings, FilterSettings,
                                   OptimizerSettings, RewardShaping, StepSettings)
from verirl.train.strategy import shard
from verirl.run.checkpoint import Checkpoint, load_checkpoint
from verirl.run.rundir import RunDirLock, checkpoint_to_resume, clear_previous_run, lock_held_by_launcher
from verirl.run.runlog import LogSettings
from verirl.run.watchdog import Watchdog
from verirl.core.errors import ConfigError, UserError
from verirl.core.types import Prompt


@dataclass
class CheckpointPolicy:
    """When the run checkpoints, how many it keeps, and the one it continues from."""
    every: int  # trainer.save_freq: a checkpoint every N steps (0 = only at the end)
    keep: int  # trainer.keep_checkpoints: the newest N are kept (0 = all)
    resume: Optional[Checkpoint] = None  # where training continues from (weights restored by the loop)


@dataclass
class NonfiniteCount:
    """Steps whose update was skipped for a non-finite loss or grad norm: the run's total and the current
    streak; ``limit`` in a row stop the run (trainer.max_nonfinite_steps, 0 = never)."""
    limit: int
    total: int = 0
    in_a_row: int = 0


@dataclass(kw_only=True)
class Run:
    """Everything a run is made of, built once from the config."""
    cfg: Config  # kept to be saved (config.yaml, checkpoints) and compared on resume; nothing else reads it
    dist: Dist  # this rank and the collectives (one process alone: Dist.single())
    model: torch.nn.Module
    ref: Optional[torch.nn.Module]
    teacher: Optional[torch.nn.Module]  # algo.distill.teacher: scores the student's samples (frozen), or None
    tokenizer: object
    stop_ids: list[int]
    pad_id: int
    engine: Engine
    eval_engine: Optional[Engine] = None  # the held-out evaluation's, when not the rollout's (`evaluation_engine`)
    multi_turn: Optional[MultiTurn] = None  # rollout.multi_turn.enable: episodes with tools on ``engine``
    environments: Optional[object] = None  # the tools' and environments' factory (`verirl.envs`): closed at the end
    optimizer: torch.optim.Optimizer
    scheduler: object
    optimizer_settings: OptimizerSettings
    train: list[Prompt]
    sampler: PromptSampler
    step: StepSettings
    eval: EvalSettings
    scorer: Scorer
    run_dir: Path
    lock: RunDirLock  # held from before the run directory is first touched until the run ends (by rank 0
    # alone, or by the launcher that started the ranks, when this one is not held)
    watchdog: Watchdog  # the hang watchdog: each phase's heartbeat (started and stopped by the loop)
    total_steps: int
    checkpoints: CheckpointPolicy
    nonfinite: NonfiniteCount
    device: str = ""  # what the model computes on, named (`verirl.models.perf.device_name`): the summary says it
    source: Optional[object] = None  # rollout.placement=separate, rank 0: the producers' batches (`RolloutSource`)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_run(cfg: Config, dist: Optional[Dist] = None, say: Optional[Callable[[str], None]] = None) -> Run:
    """Load the model and data and build every object of the run. The run directory's lock is held by
    the launcher that started the ranks, else rank 0 takes it (at once if the directory exists, else
    when it is made); nothing is written into the directory before the inputs are known to be good.
    ``say``: where the watchdog reports a stall (default: stderr)."""
    dist = dist or Dist.single()
    if cfg.trainer.threads > 0 or dist.active:  # alone with threads=0, torch's own default (all cores)
        torch.set_num_threads(threads_per_rank(cfg))
    seed_everything(cfg.trainer.seed)
    run_dir = Path(cfg.trainer.run_dir)
    lock = RunDirLock(run_dir)
    takes_lock = dist.is_main and not lock_held_by_launcher(run_dir)  # else the launcher holds it for us
    if run_dir.is_dir() and takes_lock:
        lock.acquire()  # before reading its checkpoints: another run may be writing them
    try:
        return _build(cfg, run_dir, lock, dist, takes_lock, say or _stderr)
    except BaseException:
        lock.release()
        raise


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _build(cfg: Config, run_dir: Path, lock: RunDirLock, dist: Dist, takes_lock: bool,
           say: Callable[[str], None]) -> Run:
    resume = checkpoint_to_resume(cfg.trainer.run_dir, cfg.trainer.resume, cfg.trainer.overwrite)
    lm = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device, dict(cfg.model.override_config))
    envs = environments(cfg, lm.tokenizer, hide=(cfg.trainer.run_dir,))
    try:
        return _build_with(cfg, run_dir, lock, dist, takes_lock, say, resume, lm, envs)
    except BaseException:
        if envs is not None:
            envs.close()  # its tool workers
        raise


def _build_with(cfg: Config, run_dir: Path, lock: RunDirLock, dist: Dist, takes_lock: bool,
                say: Callable[[str], None], resume, lm, envs) -> Run:
    train, val, stop_ids = load_data(cfg.data, cfg.eval.size, lm)
    train, val = with_tools(train, lm.tokenizer, envs, cfg.data, "data.train_path" if cfg.data.train_path else
                            f"the built-in {cfg.data.task} task"), with_tools(val, lm.tokenizer, envs, cfg.data, "")
    eval_prompts = val
    if cfg.eval.data:
        eval_prompts = load_prompts(cfg.eval.data, lm.path, **data_loading_options(cfg.data, too_long="filter")).prompts
        eval_prompts = with_tools(eval_prompts, lm.tokenizer, envs, cfg.data, "eval.data", too_long="filter")
    if len(train) < cfg.data.prompts_per_step:
        print(f"data: {len(train)} training prompts, fewer than data.prompts_per_step={cfg.data.prompts_per_step}: "
              f"every step repeats prompts. Add data or lower data.prompts_per_step.", file=sys.stderr)
    wanted = cfg.eval.before_train or cfg.eval.every or cfg.eval.at_end
    if dist.is_main and cfg.data.train_path and not cfg.eval.data and wanted:
        print(f"eval: no held-out evaluation in this run: data.train_path={cfg.data.train_path} has no held-out "
              f"split (eval.size splits only the built-in task). Give eval.data=FILE (held-out prompts) to "
              f"evaluate on.", file=sys.stderr)
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if takes_lock:
            lock.acquire()
        if resume is None and str(cfg.trainer.resume).lower() in ("false", "none", ""):
            clear_previous_run(run_dir)  # trainer.overwrite=true; only once the inputs are known to be good
    dist.barrier()  # the other ranks start once rank 0 holds the directory
    lora = lora_settings(cfg)
    if lora is not None:  # adapters trained, the base frozen; the reference is the base with them off: no copy
        apply_lora(lm.model, lora)
    ref = copy.deepcopy(lm.model) if cfg.algo.kl_coef > 0 and lora is None else None  # before the actor is split
    if dist.tp_world > 1:  # each layer split over the tensor-parallel group
        tensor_parallel(lm.model, dist.mesh[TP])
    if dist.ep_world > 1:  # each rank keeps its experts' slice
        shard_experts(lm.model, dist.ep_mesh)
    sharded = dist.gradient_mesh is not None and dist.gradient_mesh.size() > 1 and cfg.actor.strategy == "fsdp2"
    device = next(lm.model.parameters()).device
    if sharded and dist.pp_world == 1:
        shard(lm.model, dist.gradient_mesh, device, offload_params=cfg.actor.offload == "params",
              experts_mesh=dist.edp_mesh)
    tied = tied_group(dist) if dist.pp_world > 1 else None
    if dist.pp_world > 1:  # this rank keeps its stages' parameters (FSDP2 inside them)
        pipe = pipeline(lm.model, dist, cfg.actor.pipeline_schedule, list(cfg.actor.pipeline_layers), tied)
        if sharded:
            pipe.shard(dist.gradient_mesh, device, cfg.actor.offload == "params", trainable=True)
    if ref is not None:
        place_frozen(ref, cfg, dist, sharded, device, tied)
    teacher = distill_teacher(cfg, lm, dist, sharded, device)
    adamw = OptimizerSettings(cfg.actor.lr, tuple(cfg.actor.betas), cfg.actor.weight_decay)
    optimizer, scheduler = build_optimizer(lm.model, adamw.lr, adamw.betas, adamw.weight_decay, cfg.actor.warmup_steps)
    reward = cfg.reward
    workers = reward_workers_per_rank(cfg)
    scorer = build_scorer(reward, workers, hide=(cfg.trainer.run_dir,), say=dist.is_main,
                          device=str(next(lm.model.parameters()).device), dtype=cfg.model.dtype)
    evaluation = EvalSettings(eval_prompts, cfg.eval.n, cfg.eval.temperature, cfg.eval.greedy,
                              cfg.rollout.max_new_tokens, cfg.trainer.seed + 777, cfg.eval.before_train,
                              cfg.eval.every, cfg.eval.at_end, cfg.eval.top_p, cfg.eval.top_k)
    engine, train, order = rollout_engine(cfg, lm, stop_ids, train)
    eval_engine = evaluation_engine(cfg, lm, stop_ids) if eval_prompts else None
    t = cfg.trainer
    return Run(cfg=cfg, dist=dist, model=lm.model, ref=ref, teacher=teacher, tokenizer=lm.tokenizer, stop_ids=stop_ids,
               pad_id=lm.pad_id, engine=engine, eval_engine=eval_engine, optimizer=optimizer, scheduler=scheduler,
               multi_turn=multi_turn(cfg, engine, lm.tokenizer, envs, stop_ids, lm.pad_id), environments=envs,
               optimizer_settings=adamw, train=train, sampler=PromptSampler(len(train), cfg.data.seed, order),
               step=step_settings(cfg, lm.model, dist.dp_world, t.peak_flops or device_peak_flops(cfg, lm.model, dist)),
               eval=evaluation, scorer=scorer, run_dir=run_dir, lock=lock,
               watchdog=Watchdog(run_dir, dist.rank, t.stall_timeout_s, t.on_stall, scorer.outstanding, say),
               total_steps=t.total_steps,
               checkpoints=CheckpointPolicy(t.save_freq, t.keep_checkpoints, load_checkpoint(resume) if resume else None),
               nonfinite=NonfiniteCount(t.max_nonfinite_steps), device=device_name(resolve_device(cfg.model.device)))


def distill_teacher(cfg: Config, lm, dist: Dist, sharded: bool, device) -> Optional[torch.nn.Module]:
    """algo.distill.teacher loaded frozen on the student's device and placed as the student is (`place_frozen`:
    tensor parallel, expert slices, FSDP2, ref.offload), or None. A teacher whose tokenizer maps an id to
    another token than the student's is refused: its log-probs would score other tokens than the ones sampled."""
    from verirl.models.load import tokenizer_difference

    path = cfg.algo.distill.teacher
    if not path:
        return None
    teacher = load_model(path, cfg.model.dtype, cfg.model.device)
    differs = tokenizer_difference(lm.tokenizer, teacher.tokenizer)
    if differs is not None:
        raise ConfigError(f"algo.distill.teacher={path}: its tokenizer differs from the student's ({cfg.model.path}): "
                          f"{differs}. On-policy distillation scores the student's sampled token ids with the "
                          f"teacher, so both must share one tokenizer; use a teacher of the student's family.")
    teacher_vocab, student_vocab = teacher.model.get_output_embeddings().weight.shape[0], \
        lm.model.get_output_embeddings().weight.shape[0]
    if teacher_vocab < len(lm.tokenizer):
        raise ConfigError(f"algo.distill.teacher={path}: its output layer has {teacher_vocab} rows, fewer than the "
                          f"{len(lm.tokenizer)} tokens of the shared tokenizer (the student's has {student_vocab}).")
    try:
        return place_frozen(teacher.model, cfg, dist, sharded, device)
    except UserError as e:  # its experts do not split over actor.expert_parallel_size, a family not known
        raise type(e)(f"algo.distill.teacher={path}: {e}") from None


def place_frozen(model: torch.nn.Module, cfg: Config, dist: Dist, sharded: bool, device: torch.device,
                 tied=None) -> torch.nn.Module:
    """A frozen model (the reference, the distillation teacher) placed as the actor is, in place, in eval mode
    with requires_grad False; returns it. Its layers split over the tensor-parallel group; its routed experts
    sliced over the expert-parallel group (a model without mixture-of-experts layers stays whole); with
    ``sharded`` (actor.strategy=fsdp2 on several ranks) FSDP2 over the gradient mesh, the expert slices over
    the expert-data-parallel ranks, its shards on the host with ref.offload; not sharded, on the host with
    ref.offload (it comes to ``device`` for its pass); with pipeline parallelism this rank's stages, ``tied``
    being the actor's `tied_group`."""
    model.eval().requires_grad_(False)
    if dist.tp_world > 1:
        tensor_parallel(model, dist.mesh[TP])
    if dist.ep_world > 1 and moe_blocks(model):
        shard_experts(model, dist.ep_mesh)
    if sharded and dist.pp_world == 1:
        shard(model, dist.gradient_mesh, device, offload_params=cfg.ref.offload, trainable=False,
              experts_mesh=dist.edp_mesh)
    elif cfg.ref.offload and not sharded:
        model.to("cpu")  # ref.offload: it waits on the host, and comes to the device for its pass
    if dist.pp_world > 1:
        pipe = pipeline(model, dist, cfg.actor.pipeline_schedule, list(cfg.actor.pipeline_layers), tied)
        if sharded:
            pipe.shard(dist.gradient_mesh, device, cfg.ref.offload, trainable=False)
    return model


def lora_settings(cfg: Config) -> Optional[LoraSettings]:
    """actor.lora as plain values, or None when off (rank 0)."""
    lo = cfg.actor.lora
    if not lo.rank:
        return None
    return LoraSettings(lo.rank, float(lo.alpha), float(lo.dropout), target_modules(lo.target_modules),
                        str(lo.init).lower())


def with_tools(prompts: list[Prompt], tokenizer, envs, data, source: str, too_long: str = "") -> list[Prompt]:
    """``prompts`` rendered again with the tools' schemas declared (the chat template shows the model its
    tools), where there are tools and the prompts are chat messages. Prompts that are token ids only (a
    preprocessed file) keep their ids: said once, naming ``source``."""
    if envs is None or not envs.schemas or not prompts:
        return prompts
    if any(not p.messages for p in prompts):
        if source:
            print(f"rollout.multi_turn.tools: the prompts of {source} are token ids (a preprocessed file), so the "
                  f"tools' schemas are not added to them by the chat template; the model sees only what their "
                  f"template wrote. Use a raw data file to have the template declare the tools.", file=sys.stderr)
        return prompts
    return encode_prompts(prompts, tokenizer, data.max_prompt_length, source or "data", too_long or data.too_long,
                          tools=envs.schemas)


def environments(cfg: Config, tokenizer, hide: tuple[str, ...] = ()):
    """rollout.multi_turn's tools and environment (`verirl.envs.build_environments`), or None when off (and
    when a multi-turn dump is replayed: nothing runs)."""
    mt = cfg.rollout.multi_turn
    if not mt.enable or cfg.rollout.engine == "replay":
        return None
    from verirl.envs import build_environments

    return build_environments(list(mt.tools), mt.environment, mt.parser, getattr(tokenizer, "chat_template", "") or "",
                              mt.tool_timeout_s, mt.tool_workers, mt.max_tool_response_chars, cfg.reward.sandbox,
                              hide=hide, memory_mb=cfg.reward.max_memory_mb)


def turn_limits(cfg: Config) -> TurnLimits:
    """An episode's bounds from rollout.multi_turn, its zeros resolved."""
    mt, longest = cfg.rollout.multi_turn, cfg.rollout.max_new_tokens
    return TurnLimits(max_turns=mt.max_turns, max_env_turns=mt.max_env_turns or mt.max_turns,
                      max_total_tokens=mt.max_total_tokens or longest,
                      max_tokens_per_turn=mt.max_tokens_per_turn or longest,
                      max_observation_tokens=mt.max_tool_response_tokens, max_prompt_tokens=cfg.data.max_prompt_length)


def multi_turn(cfg: Config, engine: Engine, tokenizer, envs, stop_ids: list[int], pad_id: int) -> Optional[MultiTurn]:
    """The multi-turn loop on the rollout engine (a multi-turn dump's episodes with the replay engine), or
    None for single-turn rollouts."""
    if cfg.rollout.multi_turn.enable and cfg.rollout.engine == "replay":
        return ReplayedEpisodes(engine)
    if envs is None:
        return None
    renderer = TurnRenderer(tokenizer, envs.schemas)
    try:  # a template that cannot place an observation after a turn is found here, not mid-rollout
        renderer.observation_ids([{"role": "user", "content": "1 + 1?"}], [{"role": "tool", "content": "2"}])
    except Exception as e:  # noqa: BLE001  (any template error is the template's)
        raise ConfigError(f"rollout.multi_turn: the chat template of {cfg.model.path} cannot render a tool "
                          f"observation after an assistant turn ({type(e).__name__}: {e}). Use a model whose "
                          f"template renders tool messages, or set data.prompt_type / the tokenizer's "
                          f"chat_template (docs/agents.md).") from None
    return MultiTurn(engine, tokenizer, renderer, envs.new, turn_limits(cfg), stop_ids, pad_id,
                     workers=cfg.rollout.multi_turn.tool_workers, batch=cfg.rollout.micro_batch_size)


def log_settings(cfg: Config) -> LogSettings:
    """The ``log`` section as the run log's plain values."""
    log = cfg.log
    return LogSettings(log.progress, log.console_every, tuple(log.backends), log.project, log.run_name)


def device_peak_flops(cfg: Config, model, dist: Dist) -> float:
    """One device's peak FLOP/s at the model's dtype, on the device it computes on (not where offloaded
    parameters wait): measured by rank 0 alone (ranks sharing a CPU would slow each other's
    measurement) and cached (`verirl.models.perf.peak_flops`), then sent to every rank."""
    p = next(model.parameters())
    dtype = p.dtype if p.dtype.is_floating_point else torch.float32
    value = peak_flops(resolve_device(cfg.model.device), dtype) if dist.is_main else None
    return float(dist.broadcast(value)) if dist.active else float(value)


def rollout_engine(cfg: Config, lm, stop_ids: list[int], train: list[Prompt],
                   producer: bool = False) -> tuple[Engine, list[Prompt], str]:
    """(the rollout engine, the training prompts, their order): the data's, unless the replay engine
    takes the prompts from its dump (rollout.replay_prompts=dump: the dump's, in its order). With
    rollout.placement=separate a trainer's engine (``producer`` False) is the native one, for the held-out
    evaluation: the producers generate the steps."""
    r, tp = cfg.rollout, rollout_tensor_parallel(cfg)
    if r.placement == "separate" and not producer:  # the producers generate; this one evaluates
        return build_engine("native", lm.model, lm.pad_id, stop_ids, compute_dtype=training_dtype(cfg, lm.model)), \
            train, cfg.data.shuffle
    if r.engine == "vllm":
        from verirl.config.layout import world_size

        decoders = 1 if producer else max(world_size(cfg) // tp, 1)  # a producer decodes whole steps
        seqs = r.max_num_seqs or cfg.data.prompts_per_step * r.n // decoders
        options = vllm_options(r, lm, vllm_dtype(cfg, lm.model), dict(cfg.model.override_config), seqs,
                               cfg.data.max_prompt_length + r.max_new_tokens, cfg.trainer.seed, tp, cfg.actor.lora.rank)
        return build_engine("vllm", lm.model, lm.pad_id, stop_ids, whole=push_tensor(lm.model), **options), train, \
            cfg.data.shuffle
    if r.engine != "replay":
        # a MoE model's routes are recorded for R3 only: (N, P + R, sparse layers, top-k) int16 on the device
        options = {"compute_dtype": training_dtype(cfg, lm.model),
                   "split": tp > 1 and tp == cfg.actor.tensor_parallel_size,
                   "record_routes": replay_mode(cfg.algo.router_replay) == "r3"} \
            if r.engine == "native" else {}
        return build_engine(r.engine, lm.model, lm.pad_id, stop_ids, **options), train, cfg.data.shuffle
    engine = build_engine("replay", lm.model, lm.pad_id, stop_ids, path=r.replay_path, tokenizer=lm.tokenizer,
                          prompts=r.replay_prompts, eos=r.replay_eos)
    if r.replay_prompts == "dump":
        return engine, dump_prompts(engine.steps, r.n, lm.tokenizer), "sequential"
    return engine, train, cfg.data.shuffle


def evaluation_engine(cfg: Config, lm, stop_ids: list[int]) -> Optional[Engine]:
    """The held-out evaluation's own engine where the rollout's cannot sample, else None (the rollout's):
    a replayed dump holds responses to its training prompts only, so evaluation samples with the native
    engine."""
    if cfg.rollout.engine != "replay":
        return None
    return build_engine("native", lm.model, lm.pad_id, stop_ids, compute_dtype=training_dtype(cfg, lm.model))


def vllm_dtype(cfg: Config, model) -> str:
    """The dtype vLLM decodes in (rollout.dtype): model.dtype when unset; compute: the dtype the trainer
    multiplies in (model.compute_dtype, resolved on this device)."""
    if cfg.rollout.dtype != "compute":
        return cfg.rollout.dtype or cfg.model.dtype
    low = training_dtype(cfg, model)
    return cfg.model.dtype if low is None else str(low).removeprefix("torch.")


def training_dtype(cfg: Config, model) -> Optional[torch.dtype]:
    """The dtype the log-prob passes and the update multiply in under torch.autocast (model.compute_dtype),
    None for the weights' own. The device is the one the model computes on (model.device), not where
    offloaded parameters wait."""
    return compute_dtype(cfg.model.compute_dtype, next(model.parameters()).dtype, resolve_device(cfg.model.device))


def step_settings(cfg: Config, model, world: int = 1, peak: float = 0.0) -> StepSettings:
    """The step's plain values: sampling, both log-prob passes with their budgets, the advantage
    function, the update's parameters; the batch counts this rank's share of ``world`` ranks."""
    rollout, actor, algo = cfg.rollout, cfg.actor, cfg.algo
    packable, why = supports_packing(model)
    if actor.use_remove_padding and not packable:
        print(f"actor.use_remove_padding: {cfg.model.path} cannot be packed ({why}); "
              f"log-prob passes run on padded rows instead.")
    policy_pass = LogprobPass(
        # with sequence parallelism a micro-batch's tokens are split over the group: the budget is each rank's share
        micro_batch_size=actor.micro_batch_size, max_tokens=actor.max_token_len_per_device * actor.sequence_parallel_size,
        temperature=rollout.temperature if rollout.temperature > 0 else 1.0,
        remove_padding=actor.use_remove_padding and packable, share_prompt=actor.share_prompt,
        chunk=actor.logprob_chunk, compute_dtype=training_dtype(cfg, model))
    # one optimizer step per batch: the update's own first forward is at the weights before it (the proximal
    # policy, also for samples of older weights: docs/async.md), so no old-log-prob pass is needed
    # with a teacher the student's log-probs are needed before the update, for the distillation advantage
    on_policy = actor.mini_batch_prompts == cfg.data.prompts_per_step and actor.epochs == 1 and not algo.distill.teacher
    ref_budget = (cfg.ref.log_prob_max_token_len_per_device or actor.max_token_len_per_device) * actor.sequence_parallel_size
    low, high = CLIP_DEFAULTS.get(algo.policy_loss, (0.2, 0.2))
    loss = PolicyLossParams(
        clip_low=low if algo.clip_ratio_low is None else algo.clip_ratio_low,
        clip_high=high if algo.clip_ratio_high is None else algo.clip_ratio_high,
        clip_ratio_c=algo.clip_ratio_c, clip_ratio_max=algo.clip_ratio_max, clip_cov_ratio=algo.clip_cov_ratio,
        clip_cov_lb=algo.clip_cov_lb, clip_cov_ub=algo.clip_cov_ub, kl_cov_ratio=algo.kl_cov_ratio,
        ppo_kl_coef=algo.ppo_kl_coef)
    update = UpdateParams(
        group_size=rollout.n, mini_batch_prompts=actor.mini_batch_prompts // world, forward=policy_pass,
        epochs=actor.epochs, policy_loss=algo.policy_loss, loss=loss, kl_coef=algo.kl_coef, kl_type=algo.kl_type,
        entropy_coef=algo.entropy_coef, top_entropy_quantile=algo.top_entropy_quantile,
        loss_agg_mode=algo.loss_agg_mode, loss_scale_factor=float(algo.loss_scale_factor or rollout.max_new_tokens),
        mask_truncated=algo.mask_truncated, correction=correction(cfg), grad_clip=actor.grad_clip,
        offload_optimizer=actor.offload == "optimizer")
    ob, fg = cfg.reward.overlong_buffer, algo.filter_groups
    shaping = RewardShaping(cfg.reward.aggregate, (rollout.max_new_tokens, ob.len or rollout.max_new_tokens // 5,
                                                   ob.penalty_factor) if ob.enable else None)
    return StepSettings(
        prompts_per_step=cfg.data.prompts_per_step,
        group_size=rollout.n,
        sampling=SamplingParams(rollout.max_new_tokens, rollout.temperature, rollout.top_p, rollout.top_k),
        seed=cfg.trainer.seed, generate_batch=rollout.micro_batch_size,
        old_pass=None if on_policy else policy_pass,
        ref_pass=dataclasses.replace(policy_pass, max_tokens=ref_budget, offload=cfg.ref.offload)
        if algo.kl_coef > 0 else None,
        advantages=functools.partial(ADVANTAGE_ESTIMATORS[algo.adv_estimator], group_size=rollout.n,
                                     scale=scale_rewards(algo), epsilon=algo.adv_epsilon),
        update=update, dump_rollouts=cfg.trainer.dump_rollouts, activations=activation_settings(cfg, model),
        shaping=shaping, filter=FilterSettings(fg.metric, fg.max_num_gen_batches) if fg.enable else None,
        flops=flop_model(model), peak_flops=peak, env_reward=rollout.multi_turn.reward,
        separate=rollout.placement == "separate", sync_every=cfg.trainer.async_training.sync_every,
        distill=DistillSettings(dataclasses.replace(policy_pass, max_tokens=ref_budget, offload=cfg.ref.offload),
                                algo.distill.coef, algo.distill.rewards) if algo.distill.teacher else None,
        **moe_step_settings(cfg, model))


def moe_step_settings(cfg: Config, model) -> dict:
    """A mixture-of-experts model's StepSettings: algo.router_replay lower-cased (off / r2 / r3) and
    algo.moe_aux_loss_coef; nothing for a dense model (its passes run without a router tap)."""
    if routing(model.config) is None:
        return {}
    return {"router_replay": replay_mode(cfg.algo.router_replay),
            "moe_aux_loss_coef": float(cfg.algo.moe_aux_loss_coef or 0.0)}


def flop_model(model) -> Optional[FlopModel]:
    """The model's shape numbers for perf/mfu, or None (said once) when its config does not name them."""
    try:
        return FlopModel.of(model)
    except (AttributeError, TypeError) as e:
        print(f"perf/mfu: not computed for this model ({e}).", file=sys.stderr)
        return None


def correction(cfg: Config) -> Optional[Correction]:
    """The train/inference mismatch guard, or None: switched off (both modes null), or an engine that
    returns no log-probs of its samples (hf, replay: said, once a run) or decodes greedily."""
    rc = cfg.algo.rollout_correction
    if rc.rollout_is is None and rc.rollout_rs is None:
        return None
    if cfg.rollout.engine in ("hf", "replay") or cfg.rollout.temperature <= 0:
        why = f"rollout.engine={cfg.rollout.engine} returns" if cfg.rollout.temperature > 0 else \
            "greedy decoding (rollout.temperature=0) has"
        print(f"algo.rollout_correction: {why} no log-probs of its samples, so the train/inference mismatch "
              f"guard is off (no mismatch/* metrics). native and vllm have them.", file=sys.stderr)
        return None
    return Correction(rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold,
                      rc.rollout_rs_threshold_lower)


def activation_settings(cfg: Config, model) -> Optional[ActivationSettings]:
    """trainer.dump_activations as plain values (None: nothing to record; `verirl.run.checks.check` has
    found a module its pattern matches)."""
    d = cfg.trainer.dump_activations
    if not d.steps:
        return None
    meta = {"model": cfg.model.path, "override_config": dict(cfg.model.override_config),
            "remove_padding": cfg.actor.use_remove_padding, "share_prompt": cfg.actor.share_prompt,
            "dtype": cfg.model.dtype}
    return ActivationSettings(frozenset(d.steps), d.modules, d.backward,
                              Path(d.dir or Path(cfg.trainer.run_dir) / "activations"), meta)


def build_scorer(reward, workers: int, hide: tuple[str, ...] = (), say: bool = True, device: str = "cpu",
                 dtype: str = "float32") -> Scorer:
    """The reward section's scorer in ``workers`` processes, sandboxed unless reward.sandbox=false (then
    said once, with what that leaves open), with the services reward.verifiers names (`verirl.rewards.service`:
    a reward model on ``device``, in ``dtype`` when its own is auto)."""
    from verirl.rewards.service import ServiceContext
    from verirl.rewards.services import build_services

    if say and not reward.sandbox and workers > 0:
        print("reward.sandbox=false: rules run in plain workers, with the trainer's uid, files, network and "
              "environment (docs/sandbox.md).", file=sys.stderr)
    services = build_services(reward.verifiers, reward, ServiceContext(hide, str(device), dtype, say))
    return Scorer(reward.verifiers, reward.weights, reward.tasks, workers, reward.timeout,
                  max_memory_mb=reward.max_memory_mb, max_abs_score=reward.max_abs_score,
                  sandbox=reward.sandbox, hide=hide, say=say, services=services)


@dataclass
class EvalParts:
    """What `verirl eval` runs: the model, the prompts, the scorer (close it) and the engine."""
    lm: object
    prompts: list[Prompt]
    scorer: Scorer
    engine: Engine
    multi_turn: Optional[MultiTurn] = None  # with tools or an environment: episodes on ``engine``
    environments: Optional[object] = None  # their factory (close it)


def build_eval(cfg: Config, limit: int = 0) -> EvalParts:
    """`verirl eval`'s model, prompts (the built-in task's eval.size held-out problems, or the file or
    folder eval.data; the first ``limit``, 0 = all), scorer and engine, from the config its flags make
    (`verirl.run.checks.check` has passed it)."""
    from verirl.core.errors import DataError
    from verirl.data import encode_prompts
    from verirl.data.tasks import TASKS
    from verirl.rewards import default_workers

    data, reward, rollout = cfg.data, cfg.reward, cfg.rollout
    lm = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device, dict(cfg.model.override_config))
    envs = environments(cfg, lm.tokenizer)
    tools = envs.schemas if envs is not None else None
    if cfg.eval.data:
        prompts = load_prompts(cfg.eval.data, lm.path, **data_loading_options(data, too_long="filter")).prompts
        prompts = with_tools(prompts, lm.tokenizer, envs, data, "--data", too_long="filter")
    else:
        _, val = TASKS[data.task](data.seed, 0, cfg.eval.size)
        prompts = encode_prompts(val, lm.tokenizer, data.max_prompt_length, f"{data.task} val", "filter", tools)
    if limit:
        prompts = prompts[:limit]
    if not prompts:
        raise DataError(f"eval.data={cfg.eval.data or data.task}: no prompts to evaluate.")
    scorer = build_scorer(reward, default_workers(), device=str(next(lm.model.parameters()).device),
                          dtype=cfg.model.dtype)
    options = {}
    if rollout.engine == "vllm":  # the rollout section's vLLM settings (docs/vllm.md)
        options = vllm_options(rollout, lm, cfg.model.dtype, dict(cfg.model.override_config), 256,
                               data.max_prompt_length + rollout.max_new_tokens, cfg.trainer.seed,
                               rollout.tensor_parallel_size or 1)
    engine = build_engine(rollout.engine, lm.model, lm.pad_id, lm.stop_ids, **options)
    return EvalParts(lm, prompts, scorer, engine, multi_turn(cfg, engine, lm.tokenizer, envs, lm.stop_ids, lm.pad_id),
                     envs)
