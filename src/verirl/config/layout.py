"""The layout of ranks, worked out from the config alone: the names of the launchers, strategies
and offloads, the world size, the threads and reward workers of each rank, and the check that the
layout fits the config (divisibility, devices)."""
from __future__ import annotations

import os
from typing import Optional

from verirl.config.schema import Config
from verirl.core.errors import ConfigError
from verirl.core.registry import Registry

LAUNCHERS = Registry("trainer.launcher", {
    "local": "torch.distributed.run (torchrun's elastic launcher) on this machine; nnodes > 1 with its rendezvous",
    "ray": "one Ray actor per rank in a placement group on a Ray cluster (trainer.ray_address)"})
STRATEGIES = Registry("actor.strategy", {
    "fsdp2": "parameters, gradients and optimizer state sharded across the ranks (torch FSDP2 fully_shard)",
    "ddp": "a full replica on every rank, gradients summed over the ranks by an all-reduce"})
OFFLOADS = Registry("actor.offload", {
    "none": "everything stays on the device", "optimizer": "the optimizer state leaves the device between phases",
    "params": "parameters and optimizer state leave the device between phases"})

REWARD_WORKERS_CAP = 8  # reward.workers=-1: one scoring process per core of the rank, at most this many


def world_size(cfg: Config) -> int:
    """Training ranks: ``trainer.nproc_per_node x trainer.nnodes``, less the ``rollout.nproc`` producers
    with ``rollout.placement=separate``."""
    return cfg.trainer.nproc_per_node * cfg.trainer.nnodes - producers(cfg)


def producers(cfg: Config) -> int:
    """Processes that only generate and score (``rollout.placement=separate``; 0 when colocated)."""
    return cfg.rollout.nproc if cfg.rollout.placement == "separate" else 0


def local_trainers(cfg: Config) -> int:
    """Training ranks the local launcher starts on this machine (the producers are started by rank 0)."""
    return cfg.trainer.nproc_per_node - producers(cfg)


def data_parallel_size(cfg: Config) -> int:
    """Ranks that split the step's data: the world size / (``actor.tensor_parallel_size`` x
    ``actor.sequence_parallel_size`` x ``actor.pipeline_parallel_size``)."""
    return world_size(cfg) // model_parallel_size(cfg)


def model_parallel_size(cfg: Config) -> int:
    """Ranks that hold one data-parallel coordinate's data: tp x sp x pp."""
    a = cfg.actor
    return a.tensor_parallel_size * a.sequence_parallel_size * a.pipeline_parallel_size


def rollout_tensor_parallel(cfg: Config) -> int:
    """Ranks that decode together (``rollout.tensor_parallel_size``): 0 means the actor's tensor-parallel
    size, so a model trained split is decoded split (no rank holds it whole); 1 with the hf engine, whose
    generate decodes with the whole weights."""
    size = cfg.rollout.tensor_parallel_size
    if size:
        return size
    return 1 if cfg.rollout.engine == "hf" else cfg.actor.tensor_parallel_size


def _split_words(cfg: Config) -> str:
    return " x ".join(f"actor.{k}_parallel_size={v}" for k, v in (
        ("tensor", cfg.actor.tensor_parallel_size), ("sequence", cfg.actor.sequence_parallel_size),
        ("pipeline", cfg.actor.pipeline_parallel_size)) if v > 1)


def _world_words(cfg: Config) -> str:
    t = cfg.trainer
    less = f" - rollout.nproc={producers(cfg)} producers" if producers(cfg) else ""
    world = (f"the world size {world_size(cfg)} (trainer.nproc_per_node={t.nproc_per_node} x trainer.nnodes={t.nnodes}"
             f"{less})")
    split = _split_words(cfg)
    return world if not split else f"the data-parallel size {data_parallel_size(cfg)} ({world[4:]} / {split})"


def _ranks(cfg: Config) -> str:
    return "ranks" if model_parallel_size(cfg) == 1 else "data-parallel ranks"


def _multiples(of: int, near: int) -> str:
    """The multiples of ``of`` on either side of ``near``, for a fix."""
    low, high = (near // of) * of, (near // of + 1) * of
    return f"{low} or {high}" if low > 0 else f"{high}"


def check_layout(cfg: Config, devices: Optional[tuple[str, int]] = None) -> None:
    """The layout of ranks fits the config; raises `ConfigError` (one paragraph, the arithmetic spelled
    out). Assumes `verirl.config.validate` has passed (it checks prompts_per_step against
    mini_batch_prompts). ``devices``: (kind, count) of the accelerators visible to the local launcher
    (`verirl.models.device.visible_devices`); None: the CPU, or ranks placed elsewhere (Ray), no limit."""
    t, data, actor = cfg.trainer, cfg.data, cfg.actor
    LAUNCHERS.check(t.launcher)
    STRATEGIES.check(actor.strategy)
    OFFLOADS.check(actor.offload)
    world, group = world_size(cfg), model_parallel_size(cfg)
    if world % group:
        sizes = _split_words(cfg)
        product = f" = {group}" if " x " in sizes else ""
        raise ConfigError(
            f"{sizes}{product} does not divide the world size "
            f"{world} (trainer.nproc_per_node={t.nproc_per_node} x trainer.nnodes={t.nnodes}"
            f"{f' - rollout.nproc={producers(cfg)} producers' if producers(cfg) else ''}): the ranks form "
            f"groups of {group} ({world} / {group} = {world / group:.3g} groups). Choose sizes whose "
            f"product divides {world}, or change the number of ranks.")
    world = data_parallel_size(cfg)  # the ranks the step's prompts are split over
    n = cfg.rollout.n
    if data.prompts_per_step % world:
        raise ConfigError(
            f"data.prompts_per_step={data.prompts_per_step} is not divisible by {_world_words(cfg)}: "
            f"{data.prompts_per_step} / {world} = {data.prompts_per_step / world:.3g} prompts per rank. "
            f"Each rank takes whole groups (all rollout.n={n} samples of a prompt on one rank, so advantages "
            f"need no communication), so the prompts of a step must split evenly: set data.prompts_per_step "
            f"to a multiple of {world} "
            f"(e.g. {_multiples(world, data.prompts_per_step)}) or change the number of {_ranks(cfg)}.")
    if actor.mini_batch_prompts % world:
        raise ConfigError(
            f"actor.mini_batch_prompts={actor.mini_batch_prompts} is not divisible by {_world_words(cfg)}: "
            f"{actor.mini_batch_prompts} / {world} = {actor.mini_batch_prompts / world:.3g} prompts per rank in each "
            f"mini-batch. Every rank takes part in every optimizer step with whole groups of rollout.n={n} "
            f"samples, so set actor.mini_batch_prompts to a multiple of {world} that divides data.prompts_per_step="
            f"{data.prompts_per_step} (e.g. {_multiples(world, actor.mini_batch_prompts)}), or change the number "
            f"of {_ranks(cfg)}. Both keys count prompts, not sequences.")
    _check_expert_layout(cfg)
    if devices is not None:
        kind, count = devices
        if t.nproc_per_node > count:
            raise ConfigError(
                f"trainer.nproc_per_node={t.nproc_per_node} local ranks but {count} {kind} device"
                f"{'' if count == 1 else 's'} visible on this machine (model.device={cfg.model.device}; "
                f"{kind.lower()}.device_count() = {count}): each rank takes one device of its own, "
                f"{kind.lower()}:LOCAL_RANK. Set trainer.nproc_per_node to at most {count}"
                f"{' (and trainer.nnodes for more machines)' if count else ''}, make more devices visible "
                f"({'CUDA' if kind == 'CUDA' else 'ASCEND_RT'}_VISIBLE_DEVICES), or use model.device=cpu.")


def _check_expert_layout(cfg: Config) -> None:
    """actor.expert_parallel_size divides the data-parallel x sequence-parallel ranks it lives in, without
    pipeline stages; actor.expert_tensor_parallel_size is 1."""
    a = cfg.actor
    ep, etp = a.expert_parallel_size, a.expert_tensor_parallel_size
    if etp != 1:
        raise ConfigError(f"actor.expert_tensor_parallel_size={etp}: experts split over ranks are not built; each "
                          f"expert stays whole on its rank (expert tensor parallel 1, as Qwen3-235B-A22B's runs use). "
                          f"Set actor.expert_tensor_parallel_size=1 and split the experts with "
                          f"actor.expert_parallel_size.")
    if ep == 1:
        return
    group = data_parallel_size(cfg) * a.sequence_parallel_size
    if group % ep:
        raise ConfigError(f"actor.expert_parallel_size={ep} does not divide the data-parallel x sequence-parallel "
                          f"ranks it splits the experts over: {data_parallel_size(cfg)} x "
                          f"actor.sequence_parallel_size={a.sequence_parallel_size} = {group} ({group} % {ep} = "
                          f"{group % ep}). Choose a divisor of {group}, or change the number of ranks.")
    if a.pipeline_parallel_size > 1:
        raise ConfigError(f"actor.expert_parallel_size={ep} with actor.pipeline_parallel_size="
                          f"{a.pipeline_parallel_size}: expert parallelism inside pipeline stages is not built. Use "
                          f"one of the two.")


def cpu_cores() -> int:
    return os.cpu_count() or 1


def threads_per_rank(cfg: Config, cores: Optional[int] = None) -> int:
    """torch intra-op threads of one rank: trainer.threads, or 0 = the cores divided by the local ranks."""
    if cfg.trainer.threads > 0:
        return cfg.trainer.threads
    return max(1, (cores or cpu_cores()) // cfg.trainer.nproc_per_node)


def reward_workers_per_rank(cfg: Config, cores: Optional[int] = None) -> int:
    """Scoring processes of one rank: reward.workers, or -1 = min(cores // local ranks, 8), at least 1
    (0 = scored in the rank's own process)."""
    if cfg.reward.workers >= 0:
        return cfg.reward.workers
    return max(1, min((cores or cpu_cores()) // cfg.trainer.nproc_per_node, REWARD_WORKERS_CAP))
