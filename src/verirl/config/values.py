"""The rules over values alone, in the order they run: finiteness, the bounds and names each key declares
(`verirl.config.schema.setting`), then the rules that relate keys to each other (the batch arithmetic,
the algorithm options' windows). `validate` runs them when a config is loaded; `verirl.run.checks.check`
runs them first, then the names, paths and devices, which need the rooms above the config."""
from __future__ import annotations

import math
import re
from dataclasses import fields, is_dataclass
from typing import Any, Callable

from verirl.config.schema import Config
from verirl.core.errors import ConfigError


def _leaves(obj: Any, prefix: str = ""):
    """(dotted key, value, its `Field`) for every key of ``obj``, sections walked in order."""
    for f in fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            yield from _leaves(value, key + ".")
        else:
            yield key, value, f


def check_finite(cfg: Any) -> None:
    """Every float in the config is a finite number (inf and nan pass YAML's float type)."""
    for key, value, _ in _leaves(cfg):
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{key}={value} is not a finite number. Give a finite value.")


def bounds_text(ge, gt, le) -> str:
    low = f"[{ge:g}" if ge is not None else f"({gt:g}" if gt is not None else ""
    if le is not None:
        return f"in {low}, {le:g}]" if low else f"<= {le:g}"
    return f">= {ge:g}" if ge is not None else f"> {gt:g}"


def _out_of_bounds(value: float, meta) -> bool:
    ge, gt, le = meta.get("ge"), meta.get("gt"), meta.get("le")
    return (ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le)


def check_bounds(cfg: Any) -> None:
    """Each key keeps the bounds (``ge`` / ``gt`` / ``le``) and names (``choices``) its `setting` declares;
    a null value passes its bounds."""
    for key, value, f in _leaves(cfg):
        meta = f.metadata
        if meta.get("choices") is not None:
            meta["choices"].check((meta["normal"] or (lambda v: v))(value), key)
        if value is not None and not isinstance(value, (list, dict)) and _out_of_bounds(value, meta):
            why = f": {meta['why']}" if meta.get("why") else ""
            raise ConfigError(f"{key}={value} must be {bounds_text(meta.get('ge'), meta.get('gt'), meta.get('le'))}{why}.")


def check_activation_pattern(cfg: Config) -> None:
    modules = cfg.trainer.dump_activations.modules
    try:
        re.compile(modules)
    except re.error as e:
        raise ConfigError(f"trainer.dump_activations.modules={modules!r} is not a regular expression ({e}). Give "
                          f"one over module names, e.g. 'layers\\.0\\.'.") from None


def check_vllm_dtype(cfg: Config) -> None:
    rollout = cfg.rollout
    if rollout.dtype not in (None, "compute", "float32", "bfloat16", "float16"):
        raise ConfigError(f"rollout.dtype={rollout.dtype!r} is not null (model.dtype), compute (the trainer's "
                          f"model.compute_dtype), float32, bfloat16 or float16.")
    if rollout.dtype is not None and rollout.engine != "vllm":
        raise ConfigError(f"rollout.dtype={rollout.dtype} sets the dtype vLLM decodes in, but rollout.engine="
                          f"{rollout.engine}: set rollout.engine=vllm, or leave rollout.dtype null.")


def check_algorithm_ranges(cfg: Config) -> None:
    """The algorithm options whose range depends on another key."""
    algo, rc = cfg.algo, cfg.algo.rollout_correction
    if algo.clip_cov_lb > algo.clip_cov_ub:
        raise ConfigError(f"algo.clip_cov_lb={algo.clip_cov_lb} is above algo.clip_cov_ub={algo.clip_cov_ub}: "
                          f"the covariance window needs lb <= ub.")
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


def check_overlong_buffer(cfg: Config) -> None:
    ob, longest = cfg.reward.overlong_buffer, cfg.rollout.max_new_tokens
    if ob.enable and ob.len == 0 and longest < 5:
        raise ConfigError(f"reward.overlong_buffer.len=0 means a fifth of rollout.max_new_tokens={longest}: 0 tokens. "
                          f"Give reward.overlong_buffer.len explicitly.")
    if ob.enable and ob.len >= longest:
        raise ConfigError(f"reward.overlong_buffer.len={ob.len} must be below rollout.max_new_tokens={longest}: "
                          f"the penalty starts at max_new_tokens - len tokens.")


def check_token_budgets(cfg: Config) -> None:
    data, rollout = cfg.data, cfg.rollout
    longest = data.max_prompt_length + rollout.max_new_tokens
    sp = cfg.actor.sequence_parallel_size
    for key, budget in [("actor.max_token_len_per_device", cfg.actor.max_token_len_per_device),
                        ("ref.log_prob_max_token_len_per_device", cfg.ref.log_prob_max_token_len_per_device)]:
        if 0 < budget * sp < longest:
            group = "" if sp == 1 else f" x actor.sequence_parallel_size {sp} = {budget * sp} tokens per group"
            raise ConfigError(
                f"{key}={budget}{group} is smaller than the longest possible sequence: data.max_prompt_length "
                f"{data.max_prompt_length} + rollout.max_new_tokens {rollout.max_new_tokens} = {longest} tokens. "
                f"Set it to at least {-(-longest // sp)} (a few times more packs several sequences per forward), "
                f"or 0.")


def check_eval_samples(cfg: Config) -> None:
    if cfg.eval.n == 0 and not cfg.eval.greedy:
        raise ConfigError("eval.n=0 with eval.greedy=false evaluates nothing: give eval.n > 0 samples per problem, "
                          "or eval.greedy=true.")


def check_batch_shape(cfg: Config) -> None:
    data, actor = cfg.data, cfg.actor
    if data.prompts_per_step % actor.mini_batch_prompts:
        raise ConfigError(
            f"data.prompts_per_step={data.prompts_per_step} is not divisible by actor.mini_batch_prompts="
            f"{actor.mini_batch_prompts}: {data.prompts_per_step} / {actor.mini_batch_prompts} = "
            f"{data.prompts_per_step / actor.mini_batch_prompts:.3g} mini-batches per step. Both count prompts; "
            f"choose a mini-batch that divides the step (e.g. actor.mini_batch_prompts={data.prompts_per_step})."
        )


def check_betas(cfg: Config) -> None:
    betas = cfg.actor.betas
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"actor.betas={list(betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99].")


def check_reward_weights(cfg: Config) -> None:
    reward = cfg.reward
    if not reward.verifiers:
        raise ConfigError("reward.verifiers is empty: name at least one rule, e.g. [acc, format].")
    if len(reward.weights) != len(reward.verifiers):
        raise ConfigError(
            f"reward.weights has {len(reward.weights)} entries but reward.verifiers has {len(reward.verifiers)} "
            f"({list(reward.verifiers)}): give one weight per verifier, in the same order."
        )


VALUE_RULES: list[Callable[[Config], None]] = [
    check_finite, check_bounds, check_activation_pattern, check_vllm_dtype, check_algorithm_ranges,
    check_overlong_buffer, check_token_budgets, check_eval_samples, check_batch_shape, check_betas,
    check_reward_weights]


def validate(cfg: Config) -> None:
    """Refuse impossible values before anything heavy starts, with the arithmetic spelled out: every rule of
    `VALUE_RULES`, in order."""
    for rule in VALUE_RULES:
        rule(cfg)
