"""The rules over values alone: ranges, finiteness and the batch arithmetic, checked when a config is
loaded (`verirl.config.load.load_config`). Names looked up in registries and paths on the file system
are checked by `verirl.run.checks`, which knows the rooms above the config."""
from __future__ import annotations

import math
import re
from dataclasses import fields, is_dataclass
from typing import Any

from verirl.config.schema import Config
from verirl.core.errors import ConfigError


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
