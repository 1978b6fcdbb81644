"""MindSpeed-RL's GRPO YAML -> verirl: the tables `verirl convert-config --from mindspeed-rl` reads.

Keys, defaults and meanings as of Ascend/MindSpeed-RL master (2026; checked against 05a90d77, 2026-04-22, on
every grpo_*, dapo_* and ppo_* file of its configs/, tests/scripts/convert_peers.py) and its 2.x branches
(mindspeed_rl/config_cls/{megatron_config,rl_config,generate_config,validate_config}.py,
cli/train_grpo.py, cli/train_dapo.py, mindspeed_rl/models/loss/{grpo,dapo}_actor_loss_func.py,
mindspeed_rl/models/rule_verifier.py, mindspeed_rl/trainer/dapo_trainer_hybrid.py,
mindspeed_rl/workers/dynamic_sampling.py, mindspeed_rl/datasets/dataloader.py; multi-turn rollouts:
mindspeed_rl/workers/actor_hybrid_worker.py's async_multi_turn_rollout, mindspeed_rl/tools/utils/tool_utils.py and
tool_parser.py; LoRA: mindspeed_rl/config_cls/megatron_config.py's lora_* keys, config_cls/base_config.py, which refuses
any other key, workers/integrated_worker.py's share_backbone, docs/zh/features/grpo_lora.md), and the
master of April-May 2025 ("pre-2.0"), where they differ:

* rl_config.mini_batch_size: before 2.0 (commit 61effad, 2025-05-15) the YAML value was in
  sequences, already multiplied by n_samples_per_prompt (configs had 256 for 32 prompts x 8);
  since then MindSpeed-RL multiplies it by n itself (``mini_batch_size * n_samples_per_prompt``
  in rl_config.py), so the YAML counts prompts, as verirl does.
* the prompt order: before 2.0 Megatron's shuffled sample index; since 2.0 a torch RandomSampler
  seeded with the actor's seed (the sampler veRL uses) over that index.

The actor reads megatron_training updated by actor_config (``{**megatron_training, **actor_config}``
in cli/train_grpo.py), so an actor_config key wins over the megatron_training key of the same name.

MindSpeed-RL's defaults and ignored keys are data: mindspeed_rl.yaml beside this file.
"""
from __future__ import annotations

from typing import Any, Optional

from verirl.tools.align.convert import (Direct, NeedsDecision, Translation, aux_scale_words, calls_per_turn_words,
                                       fit_experts, fit_multi_turn, megatron_lora_targets, model_parallel_fits, peer_tables, pipeline_stages,
                                       tool_config_rows)

MT, AC, RL, GEN = "megatron_training.", "actor_config.", "rl_config.", "generate_config."
SAMP = GEN + "sampling_config."

_TABLES = peer_tables("mindspeed_rl.yaml")
# MindSpeed-RL's defaults (2.x) for the keys the translation reads, and the pre-2.0 ones that differ;
# generate_config.sampling_config's when the section is left out, and vLLM's for a key a given section lacks.
DEFAULTS: dict[str, Any] = _TABLES["defaults"]
PRE2_DEFAULTS: dict[str, Any] = _TABLES["pre2_defaults"]
SAMPLING_DEFAULTS: dict[str, Any] = _TABLES["sampling_defaults"]
VLLM_DEFAULTS: dict[str, Any] = _TABLES["vllm_defaults"]
# MindSpeed-RL's rule names verirl has no rule of (a name in verirl.rewards.rules.RULES is written as it is).
NO_RULE: dict[str, str] = _TABLES["no_rule"]
# Model numerics MindSpeed-RL may set in its own yaml: Megatron's name -> config.json's name.
NUMERICS: dict[str, str] = _TABLES["numerics"]
# rl_config.tool_parser_format (its ToolParser registry, mindspeed_rl/tools/utils/tool_parser.py) -> verirl's
# rollout.multi_turn.parser of the same call format.
TOOL_FORMATS: dict[str, str] = _TABLES["tool_formats"]
# (glob, why) for the keys verirl needs no equivalent of; the first match wins. Keys under megatron_training and
# actor_config share one list (the actor reads both).
IGNORED: list[tuple[str, str]] = [*[(prefix + glob, why) for prefix in (MT, AC) for glob, why in
                                    _TABLES["actor_ignored"].items()], *_TABLES["ignored"].items()]


def _kl_type(v: str) -> str:
    from verirl.core.algo.kl import KL_ESTIMATORS

    if v not in KL_ESTIMATORS:
        raise NeedsDecision(f"kl_penalty {v!r} has no verirl estimator (verirl: {', '.join(KL_ESTIMATORS)}); "
                            f"low_var_kl is left")
    return v


def _is_rule(name: str) -> bool:
    """Whether verirl has a rule of this name (its rule registry)."""
    from verirl.rewards.rules import RULES

    return name in RULES


def _top_k(v: Optional[int]) -> int:
    return 0 if v is None or v < 0 else int(v)


DIRECT = [
    Direct(RL + "n_samples_per_prompt", "rollout.n", int, note="samples per prompt"),
    Direct(RL + "epochs", "actor.epochs", int, note="passes over each step's rollouts"),
    Direct(RL + "max_prompt_length", "data.max_prompt_length", int,
           note="tokens; MindSpeed-RL drops longer prompts when it builds the data set (data.too_long=filter)"),
    Direct(SAMP + "temperature", "rollout.temperature", float),
    Direct(SAMP + "top_p", "rollout.top_p", float),
    Direct(SAMP + "top_k", "rollout.top_k", _top_k, note="vLLM's -1 (off) is verirl's 0"),
    Direct(RL + "use_remove_padding", "actor.use_remove_padding", bool, note="pack sequences, no compute on pads"),
    Direct(MT + "dataset_additional_keys", "data.dataset_additional_keys", list,
           note="extra columns kept for the rewards (task, data_source, ...)"),
]

# ---------------------------------------------------------------- helpers

def _actor_key(t: Translation, name: str) -> str:
    """The key MindSpeed-RL's actor reads ``name`` from: actor_config's, else megatron_training's (or its default)."""
    if t.given(AC + name):
        if t.given(MT + name):
            t.ignore(MT + name, f"overridden by actor_config.{name}, as MindSpeed-RL merges them")
        return AC + name
    return MT + name


def _stage(t: Translation) -> Any:
    return t.get(_actor_key(t, "stage"))


def _filtering(t: Translation) -> bool:
    """DAPO's dynamic sampling runs: filter_groups_enable, read by the DAPO trainer (stage ray_dapo) only."""
    return _stage(t) == "ray_dapo" and bool(t.get(RL + "filter_groups_enable"))


def _version(t: Translation) -> tuple[str, str]:
    """('2.0+' | 'pre-2.0', why) for the MindSpeed-RL that ran the file."""
    chosen = t.options.mindspeed_rl_version
    if chosen != "auto":
        return chosen, f"--mindspeed-rl-version {chosen}"
    gbs, mini = t.get(MT + "global_batch_size"), int(t.get(RL + "mini_batch_size"))
    if t.given(RL + "experience_count"):
        return "pre-2.0", "read as MindSpeed-RL before 2.0 (rl_config.experience_count exists only there)"
    if gbs and mini > int(gbs):
        return "pre-2.0", (f"read as MindSpeed-RL before 2.0: mini_batch_size {mini} exceeds global_batch_size {gbs}, "
                           f"so it counts sequences")
    return "2.0+", "read as MindSpeed-RL 2.0 or later (pass --mindspeed-rl-version to say otherwise)"


# ---------------------------------------------------------------- derived keys

def _batches(t: Translation, version: str, why: str) -> None:
    gbs_key, train_key = MT + "global_batch_size", RL + "filter_groups_train_batch_size"
    gbs = t.get(gbs_key)
    if gbs is None:
        t.decide(gbs_key, "not set: MindSpeed-RL requires it (prompts per iteration); set data.prompts_per_step")
    elif _filtering(t):
        train = int(t.get(train_key))
        t.put("data.prompts_per_step", train, train_key,
              note="with dynamic sampling MindSpeed-RL trains on filter_groups_train_batch_size prompts per iteration")
        if train != int(gbs):
            t.decide(gbs_key, f"MindSpeed-RL generates global_batch_size={gbs} prompts per generation batch and trains "
                              f"on the first {train} informative groups; verirl generates data.prompts_per_step="
                              f"{train} at a time, so the prompts drawn and the groups trained on differ "
                              f"(algo.filter_groups.max_num_gen_batches keeps the prompt budget)")
        else:
            t.translated(gbs_key, "the generation batch, equal to filter_groups_train_batch_size: verirl generates "
                                  "data.prompts_per_step prompts at a time")
        gbs = train
    else:
        t.put("data.prompts_per_step", int(gbs), gbs_key, note="prompts per step in both")
    n, mini = int(t.get(RL + "n_samples_per_prompt")), int(t.get(RL + "mini_batch_size"))
    mini_key = RL + "mini_batch_size"
    if version == "pre-2.0":
        prompts = mini // n
        if mini % n or prompts == 0:
            t.decide(mini_key, f"{mini} sequences is not a whole number of prompts of {n} samples; {max(prompts, 1)} "
                               f"prompts written")
        t.put("actor.mini_batch_prompts", max(prompts, 1), mini_key, RL + "n_samples_per_prompt",
              note=f"{why}; it was already multiplied by n_samples_per_prompt: {mini} sequences / {n} = "
                   f"{max(prompts, 1)} prompts")
    else:
        t.put("actor.mini_batch_prompts", mini, mini_key,
              note=f"{why}; MindSpeed-RL 2.0+ counts prompts here and multiplies by n_samples_per_prompt itself")
        if t.options.mindspeed_rl_version == "auto" and mini % n == 0 and mini // n >= 1 and n > 1:
            t.warn(f"{mini_key}={mini} is read as {mini} prompts (MindSpeed-RL 2.0+). If the run used MindSpeed-RL "
                   f"from before May 2025, the same number meant {mini} sequences = {mini // n} prompts: pass "
                   f"--mindspeed-rl-version pre-2.0")
    if gbs is not None and t.out.get("actor.mini_batch_prompts", 0) > int(gbs):
        t.put("actor.mini_batch_prompts", int(gbs), mini_key,
              note=f"more than the step's {gbs} prompts: MindSpeed-RL splits the step into one mini-batch, the whole "
                   f"step (on-policy)")
    micro_key = _actor_key(t, "micro_batch_size")
    update_key = RL + "update_micro_batch_size"
    if t.get(update_key) is not None:
        micro_key = update_key
        t.ignore(_actor_key(t, "micro_batch_size"), "rl_config.update_micro_batch_size replaces it for the update")
    micro = t.get(micro_key)
    dynamic = bool(t.get(RL + "use_dynamic_bsz"))
    if micro is not None:
        t.put("actor.micro_batch_size", int(micro), micro_key,
              note="sequences per forward/backward (per model replica in MindSpeed-RL, per rank in verirl)")
    _loss_agg(t, micro_key, micro, dynamic)
    if dynamic:
        _packing(t, version)
    else:
        t.translated(RL + "use_dynamic_bsz", "false: micro-batches of micro_batch_size sequences")
        for key in (RL + "max_packing_token_size", RL + "update_max_packing_token_size",
                    RL + "ref_max_packing_token_size"):
            t.ignore(key, "read only with use_dynamic_bsz=true")


def _packing(t: Translation, version: str) -> None:
    """use_dynamic_bsz's token budgets. Since commit dd73eb3 (2025-08) rl_config.py sets update_, actor_ and
    ref_max_packing_token_size to 4096 before reading the YAML, so max_packing_token_size alone reaches only the
    critic; before, they defaulted to max_packing_token_size."""
    update, ref, common = (RL + "update_max_packing_token_size", RL + "ref_max_packing_token_size",
                           RL + "max_packing_token_size")
    old = version == "pre-2.0"
    if old:
        t.defaults[update] = t.defaults[ref] = t.get(common)
    budget = int(t.get(update))
    t.put("actor.max_token_len_per_device", budget, RL + "use_dynamic_bsz", update,
          *([common] if old and not t.given(update) else []),
          note="use_dynamic_bsz: micro-batches of at most this many tokens"
          + ("" if t.given(update) else "; update_max_packing_token_size is not set: "
             + ("max_packing_token_size (MindSpeed-RL before 2.0)" if old else
                "MindSpeed-RL's 4096 (since 2025-08 max_packing_token_size does not reach the actor)")))
    if not old and t.given(common):
        t.ignore(common, "the critic's token budget since MindSpeed-RL commit dd73eb3 (2025-08): the actor's is "
                         "update_max_packing_token_size (a release between May and August 2025 gave it to the "
                         "actor too)")
    if int(t.get(ref)) != budget:
        t.put("ref.log_prob_max_token_len_per_device", int(t.get(ref)), ref, note="the reference pass's token budget")
    else:
        t.translated(ref, "the actor's budget, as verirl's ref.log_prob_max_token_len_per_device=0 takes it")


def _loss_agg(t: Translation, micro_key: str, micro: Optional[int], dynamic: bool) -> None:
    """How MindSpeed-RL's loss averages tokens: its GRPO loss is the token mean of each micro-batch
    (masked_mean in grpo_actor_loss_func.py), averaged over the micro-batches by Megatron; its DAPO
    loss is token-level or sequence-level by rl_config.token_level_loss."""
    key = RL + "token_level_loss"
    if _stage(t) == "ray_dapo":
        loss = "DAPO loss (token_level_loss: true)"
        if not t.get(key):
            t.put("algo.loss_agg_mode", "seq-mean-token-mean", key,
                  note="token_level_loss false: the DAPO loss is the mean over sequences of each one's token mean "
                       "(dapo_actor_loss_func.py), verirl's seq-mean-token-mean")
            return
        sources = [key]
    else:
        t.ignore(key, "read by MindSpeed-RL's DAPO loss only (stage ray_dapo)")
        loss, sources = "GRPO loss", []
    if dynamic:
        t.put("algo.loss_agg_mode", "token-mean", RL + "use_dynamic_bsz", *sources)
        t.decide(RL + "use_dynamic_bsz", f"MindSpeed-RL's {loss} takes the token mean of each dynamic micro-batch, "
                                         f"scaled by its share of sequences: neither of verirl's modes exactly "
                                         f"(token-mean written)")
    elif micro is not None and int(micro) == 1:
        t.put("algo.loss_agg_mode", "seq-mean-token-mean", micro_key, *sources,
              note=f"MindSpeed-RL's {loss} is the token mean of each micro-batch, averaged over micro-batches by "
                   f"Megatron: with one sequence per micro-batch, verirl's seq-mean-token-mean")
    else:
        t.put("algo.loss_agg_mode", "token-mean", micro_key, *sources)
        t.decide(micro_key, f"MindSpeed-RL's {loss} is the token mean of each micro-batch of {micro} sequences, "
                            f"averaged over micro-batches: between verirl's token-mean (written) and "
                            f"seq-mean-token-mean (exact with micro_batch_size 1)")


_SPLIT = ("data.max_prompt_length", "rollout.max_new_tokens")


def _lengths(t: Translation) -> None:
    """seq_length is prompt + response: the prompt cap is rl_config.max_prompt_length, the response cap vLLM's
    max_tokens; seq_length is split into them, or checked against them."""
    if float(t.get(SAMP + "min_p") or 0) > 0:
        t.decide(SAMP + "min_p", f"min_p {t.get(SAMP + 'min_p')}: verirl samples without a min-p cut (top_p and top_k "
                                 f"only)")
    p_key, r_key, s_key = RL + "max_prompt_length", SAMP + "max_tokens", _actor_key(t, "seq_length")
    prompt, seq = int(t.get(p_key)), t.get(s_key)
    t.put("data.too_long", "filter", p_key, note="MindSpeed-RL drops prompts over max_prompt_length")
    if t.given(r_key) or seq is None:
        response = int(t.get(r_key))
        t.put("rollout.max_new_tokens", response, r_key, note="vLLM's max_tokens: the response cap, tokens")
        if seq is not None:
            if int(seq) == prompt + response:
                t.translated(s_key, f"seq_length = max_prompt_length {prompt} + max_tokens {response}: split into "
                                    f"data.max_prompt_length + rollout.max_new_tokens", _SPLIT)
            elif int(seq) < prompt + response:
                t.translated(s_key, f"seq_length {seq} < max_prompt_length {prompt} + max_tokens {response}", _SPLIT)
                t.warn(f"{s_key}={seq} is less than max_prompt_length {prompt} + max_tokens {response} = "
                       f"{prompt + response}: MindSpeed-RL's actor is sized for {seq} tokens while rollouts can reach "
                       f"{prompt + response}; verirl sizes by prompt + response. Check the other run's lengths")
            else:
                t.translated(s_key, f"seq_length {seq} >= max_prompt_length {prompt} + max_tokens {response}: room to "
                                    f"spare, verirl sizes by prompt + response", _SPLIT)
        return
    response = int(seq) - prompt
    if response <= 0:
        t.decide(s_key, f"seq_length {seq} leaves no room for a response after max_prompt_length {prompt}")
        return
    t.put("rollout.max_new_tokens", response, s_key, p_key,
          note=f"seq_length {seq} = prompt {prompt} + response {response}: split")
    t.warn(f"generate_config.sampling_config has no max_tokens (vLLM's default would be 16 tokens): the response cap "
           f"{response} is seq_length - max_prompt_length. Check the other run's response lengths")


def _steps_and_warmup(t: Translation) -> None:
    iters_key = _actor_key(t, "train_iters")
    iters = t.get(iters_key)
    if iters is None:
        t.decide(iters_key, "not set: MindSpeed-RL requires it (iterations = steps); set trainer.total_steps")
    else:
        iters = int(iters)
        gbs = t.get(MT + "global_batch_size") or 0
        rows = t.options.train_rows
        epochs = f"; with --train-rows {rows}: {iters * gbs / rows:.3g} passes over the data" if rows and gbs else ""
        t.put("trainer.total_steps", iters, iters_key,
              note="MindSpeed-RL counts iterations (steps of global_batch_size prompts), not epochs: it cycles the "
                   "data as needed" + epochs)
    frac_key = _actor_key(t, "lr_warmup_fraction")
    frac = t.get(frac_key)
    if frac is None or float(frac) == 0:
        if t.given(frac_key):
            t.put("actor.warmup_steps", 0, frac_key, note="no warm-up")
        return
    frac = float(frac)
    gbs, mini = t.get(MT + "global_batch_size"), t.out.get("actor.mini_batch_prompts")
    if iters is None or not gbs or not mini:
        t.decide(frac_key, f"a warm-up of {frac:g}: the step count or batch sizes are not known, so it stays a ratio; "
                           f"set actor.warmup_steps")
        t.warn(f"warm-up left as a ratio ({frac:g}): actor.warmup_steps is not written")
        return
    per_iter = int(gbs) // int(mini)
    steps = round(frac * iters * per_iter)
    t.put("actor.warmup_steps", steps, frac_key, iters_key,
          note=f"Megatron warms up over {frac:g} x train_iters x global_batch_size x n samples (MindSpeed-RL hands its "
               f"workers global_batch_size x n) and advances by each mini-batch's sequences: {frac:g} x {iters} x "
               f"{per_iter} mini-batches per step = {steps} optimizer steps; Megatron starts at lr 0, verirl at "
               f"lr/warmup")
    if _filtering(t) and int(t.get(RL + "filter_groups_train_batch_size")) != int(gbs):
        t.note(frac_key, "with dynamic sampling a step trains filter_groups_train_batch_size prompts, but Megatron's "
                         "warm-up still counts train_iters x global_batch_size samples, so the optimizer steps are "
                         "as written")
    if int(t.get(RL + "epochs")) > 1:
        t.note(frac_key, "with rl_config.epochs > 1 the warm-up ends after that fraction of the iterations divided by "
                         "the epochs, as in MindSpeed-RL")


def _optimizer(t: Translation) -> None:
    lr_key = _actor_key(t, "lr")
    if t.get(lr_key) is None:
        t.decide(lr_key, "not set: MindSpeed-RL requires it; set actor.lr")
    else:
        t.put("actor.lr", float(t.get(lr_key)), lr_key)
    wd = _actor_key(t, "weight_decay")
    t.put("actor.weight_decay", float(t.get(wd)), wd,
          note="Megatron's default is 0.01, verirl's 0.0: written either way")
    clip = _actor_key(t, "clip_grad")
    t.put("actor.grad_clip", float(t.get(clip)), clip, note="max global gradient norm")
    b1, b2 = _actor_key(t, "adam_beta1"), _actor_key(t, "adam_beta2")
    t.put("actor.betas", [float(t.get(b1)), float(t.get(b2))], b1, b2,
          note="Megatron's default beta2 is 0.999, verirl's 0.99: written either way")
    style_key = _actor_key(t, "lr_decay_style")
    style = t.get(style_key)
    if style == "constant":
        t.translated(style_key, "constant after the warm-up, as verirl's")
        t.ignore(_actor_key(t, "min_lr"), "the decay's floor: no decay here")
    else:
        t.decide(style_key, f"lr_decay_style {style!r}" + (" (Megatron's default)" if not t.given(style_key) else "")
                            + ": verirl keeps the lr constant after the warm-up")
        t.ignore(_actor_key(t, "min_lr"), "the decay's floor, see lr_decay_style")


def _algo(t: Translation, stage: str, version: str) -> None:
    est = t.get(RL + "adv_estimator")
    if est == "group_norm":
        t.put("algo.adv_estimator", "grpo", RL + "adv_estimator", note="group mean / std normalisation")
    else:
        t.decide(RL + "adv_estimator", f"adv_estimator {est!r}: verirl has grpo (group_norm) and rloo; grpo is left")
    entropy = RL + "entropy_coeff"
    if version == "pre-2.0" and not stage == "ray_dapo":
        t.put("algo.entropy_coef", 0.0, entropy,
              note="MindSpeed-RL's GRPO loss had no entropy term before 2.0 (added 2025-05-19): 0, whatever the value")
    else:
        t.put("algo.entropy_coef", float(t.get(entropy)), entropy, note="the entropy bonus's weight")
    dapo = stage == "ray_dapo"
    clip_keys = (RL + "clip_higher_enable", RL + "clip_ratio_low", RL + "clip_ratio_high")
    if dapo and t.get(RL + "clip_higher_enable"):
        t.put("algo.clip_ratio_low", float(t.get(RL + "clip_ratio_low")), RL + "clip_ratio_low",
              RL + "clip_higher_enable")
        t.put("algo.clip_ratio_high", float(t.get(RL + "clip_ratio_high")), RL + "clip_ratio_high",
              RL + "clip_higher_enable")
        t.ignore(RL + "clip_ratio", "clip_higher_enable: the DAPO loss clips at clip_ratio_low / clip_ratio_high")
    else:
        ratio = float(t.get(RL + "clip_ratio"))
        t.put("algo.clip_ratio_low", ratio, RL + "clip_ratio", note="one clip ratio for both sides")
        t.put("algo.clip_ratio_high", ratio, RL + "clip_ratio")
        for key in clip_keys:
            t.ignore(key, "read by MindSpeed-RL's DAPO loss only (stage ray_dapo)" if not dapo
                     else "clip_higher_enable is false: clip_ratio applies")
    if dapo:
        t.put("algo.kl_coef", 0.0, MT + "stage", note="MindSpeed-RL's DAPO loss has no KL term")
        for key in (RL + "init_kl_coef", RL + "kl_penalty", RL + "kl_ctrl_type"):
            t.ignore(key, "the DAPO loss has no KL term")
    else:
        t.put("algo.kl_coef", float(t.get(RL + "init_kl_coef")), RL + "init_kl_coef",
              note="MindSpeed-RL's GRPO loss always adds init_kl_coef x KL (there is no use_kl_loss switch)")
        if version == "pre-2.0":
            t.put("algo.kl_type", "low_var_kl", RL + "kl_penalty",
                  note="MindSpeed-RL's GRPO loss before 2.0 computed k3 (low_var_kl) whatever kl_penalty said "
                       "(kl_penalty is read since 2025-05-20), and did not clamp it; verirl clamps at +-10")
            if t.get(RL + "kl_penalty") != "low_var_kl":
                t.warn(f"{RL}kl_penalty={t.get(RL + 'kl_penalty')} had no effect in MindSpeed-RL before 2.0: the run "
                       f"used k3, so algo.kl_type=low_var_kl is written")
        else:
            try:
                kind = _kl_type(t.get(RL + "kl_penalty"))
                t.put("algo.kl_type", kind, RL + "kl_penalty",
                      note="the same estimator" + ("; MindSpeed-RL also clamps the log-ratio at +-20 before the KL's "
                                                   "+-10, as verirl" if kind == "low_var_kl" else ""))
            except NeedsDecision as e:
                t.decide(RL + "kl_penalty", str(e))
        ctrl = t.get(RL + "kl_ctrl_type")
        if ctrl == "fixed":
            t.translated(RL + "kl_ctrl_type", "a fixed coefficient, as verirl's")
        else:
            t.decide(RL + "kl_ctrl_type", f"kl_ctrl_type {ctrl!r}: verirl's KL coefficient is fixed")
    if t.get(RL + "use_kl_in_reward"):
        t.decide(RL + "use_kl_in_reward", "a KL penalty in the reward: verirl has the KL loss only")
    else:
        t.translated(RL + "use_kl_in_reward", "false, as verirl (no KL in the reward)")
    t.put("algo.policy_loss", "vanilla", _actor_key(t, "stage"),
          note="MindSpeed-RL's GRPO and DAPO losses are the clipped surrogate without a dual clip: verirl's vanilla")
    t.put("algo.rollout_correction.rollout_is", None)
    t.put("algo.rollout_correction.rollout_rs", None)
    t.warn("MindSpeed-RL has no rollout/trainer log-prob mismatch correction; verirl's default rejects sequences "
           "(algo.rollout_correction.rollout_rs sequence, 3.0): rollout_is and rollout_rs null written")
    _dynamic_sampling(t, stage)
    _overlong(t)
    if t.given(RL + "shuffle_mini_batch") and t.get(RL + "shuffle_mini_batch"):
        t.decide(RL + "shuffle_mini_batch", "MindSpeed-RL shuffles each step's mini-batches: verirl keeps their order")


MULTI_TURN = tuple(RL + k for k in ("tool_config_path", "max_tool_calls", "max_parallel_calls",
                                     "max_total_response_length", "max_tool_response_length",
                                     "tool_response_truncate_side", "tool_parser_format"))


def _multi_turn(t: Translation) -> None:
    """MindSpeed-RL's multi-turn rollouts with tools (ActorHybridWorker.async_multi_turn_rollout and
    mindspeed_rl/tools/utils/tool_utils.py, read with multi_turn_enable) become rollout.multi_turn: the turns and
    the tools' responses one token sequence, the responses loss-masked, in both."""
    en = RL + "multi_turn_enable"
    if _switched_off(t, en, MULTI_TURN, "single-turn rollouts"):
        return
    path = t.get(RL + "tool_config_path", None)
    if not path:
        t.decide(en, "multi-turn rollouts without rl_config.tool_config_path (MindSpeed-RL fails to load its tools): "
                     "verirl refuses rollout.multi_turn.enable with nothing to call, so it is left false; give "
                     "rollout.multi_turn.tools and set rollout.multi_turn.enable=true")
    else:
        t.put("rollout.multi_turn.enable", True, en,
              note="MindSpeed-RL's multi-turn rollout: the model's turns and the tools' responses are one token "
                   "sequence, the responses loss-masked, as verirl's (token in, token out, docs/agents.md)")
        t.put("rollout.multi_turn.tools", [str(path)], RL + "tool_config_path",
              note="MindSpeed-RL's tool config YAML (veRL's format: tools: - class_name, config, tool_schema), which "
                   "verirl reads as it is; a tool that raises ends MindSpeed-RL's episode there, verirl shows the "
                   "model the error as the tool's response and goes on")
        tool_config_rows(t, RL + "tool_config_path", str(path), "MindSpeed-RL")
        t.check("MindSpeed-RL writes each round of tool responses in Qwen's ChatML markup (<|im_start|>user, "
                "<tool_response> blocks, <|im_end|>, then <|im_start|>assistant), whatever the model, right after the "
                "sampled <|im_end|> (no newline between); verirl renders a tool message with the model's chat template: "
                "the same text for Qwen2.5's template but for that newline, others differ (`verirl doctor --template`)")
    calls_key = RL + "max_tool_calls"
    calls = int(t.get(calls_key) or 0)
    if calls > 0:
        t.put("rollout.multi_turn.max_env_turns", calls, calls_key,
              note="rounds of tool calls per episode at most (one per turn that called tools, all its calls' "
                   "responses together), in both")
        t.put("rollout.multi_turn.max_turns", calls + 1, calls_key,
              note=f"MindSpeed-RL stops calling tools after {calls} round{'' if calls == 1 else 's'} and the model "
                   f"answers once more: {calls + 1} assistant turns at most")
    else:
        t.put("rollout.multi_turn.max_turns", 1, calls_key,
              note=f"{calls}: MindSpeed-RL runs no tool call (tool_call_num >= max_tool_calls from the first turn): "
                   f"one assistant turn, the tools only in the prompt")
    _multi_turn_lengths(t)
    _tool_responses(t)
    fmt = t.get(RL + "tool_parser_format", None)
    if fmt in TOOL_FORMATS:
        t.put("rollout.multi_turn.parser", TOOL_FORMATS[fmt], RL + "tool_parser_format",
              note=f"MindSpeed-RL's {fmt} tool-call parser, verirl's {TOOL_FORMATS[fmt]}; a call that does not parse (not "
                   f"JSON, no name or arguments) MindSpeed-RL skips, so a turn of only such calls ends its episode, where "
                   f"verirl answers it with an error the model reads (counted in tools/parse_errors)")
    else:
        t.decide(RL + "tool_parser_format", f"{fmt!r}: MindSpeed-RL's parsers are {', '.join(TOOL_FORMATS)}; verirl's "
                                            f"auto (by the chat template) stands (rollout.multi_turn.parser)")
    for key in t.values:
        if key.startswith((RL + "tool_", RL + "max_tool_")) and key not in MULTI_TURN:
            t.unknown(key, "a tool key this converter does not know (of another MindSpeed-RL version?): check it by "
                           "hand")


def _multi_turn_lengths(t: Translation) -> None:
    """max_total_response_length: MindSpeed-RL caps each turn's generation and the whole episode's response (every
    turn and tool response) with it, not sampling_config.max_tokens: verirl's episode cap, rollout.max_new_tokens."""
    key, max_key = RL + "max_total_response_length", SAMP + "max_tokens"
    total, response = int(t.get(key) or 0), t.out.get("rollout.max_new_tokens")
    if response is not None and total < int(response):
        t.decide(key, f"{total} < sampling_config.max_tokens {response}: MindSpeed-RL refuses it (validate_config); "
                      f"rollout.max_new_tokens {response} stands")
        return
    t.put("rollout.max_new_tokens", total, key,
          note="the whole episode's response (every turn and tool response) and each turn's generation at most, in "
               "MindSpeed-RL (and at most generate_config.max_model_len with the prompt); verirl's episode cap, with "
               "rollout.multi_turn.max_total_tokens and max_tokens_per_turn 0 (= this)")
    t.note(max_key, f"multi-turn: MindSpeed-RL generates each turn with max_total_response_length ({total}) instead, "
                    f"which is written")
    seq_key = _actor_key(t, "seq_length")
    seq, prompt = t.get(seq_key), t.out.get("data.max_prompt_length", t.get(RL + "max_prompt_length"))
    if seq is not None and int(seq) < int(prompt) + total and total != int(response or 0):  # else _lengths warned
        t.warn(f"{seq_key}={seq} is less than max_prompt_length {prompt} + max_total_response_length {total}: "
               f"MindSpeed-RL's actor is sized for {seq} tokens while its episodes can reach {int(prompt) + total}; "
               f"verirl sizes by prompt + response")


def _tool_responses(t: Translation) -> None:
    """max_tool_response_length (characters), tool_response_truncate_side, max_parallel_calls."""
    key = RL + "max_tool_response_length"
    chars = int(t.get(key) or 0)
    budget = int(t.out.get("rollout.max_new_tokens", 0) or 0)
    if chars > 0:
        t.put("rollout.multi_turn.max_tool_response_chars", chars, key,
              note="characters, in both: MindSpeed-RL cuts a tool's response text at this many characters (then "
                   "marks the cut ...(truncated))")
        if budget:
            t.put("rollout.multi_turn.max_tool_response_tokens", budget, key,
                  note=f"MindSpeed-RL has no token cap on a tool response (max_total_response_length bounds the "
                       f"episode): max_tool_response_tokens = rollout.max_new_tokens ({budget}), only the character "
                       f"cut applies")
    else:
        t.decide(key, f"{chars}: MindSpeed-RL cuts every non-empty tool response (to its marker alone on the left "
                      f"side; middle and right keep the text whole, text[-0:]); verirl's 0 is no character limit: set "
                      f"rollout.multi_turn.max_tool_response_chars")
    side_key = RL + "tool_response_truncate_side"
    side = t.get(side_key, None)
    if side == "left":
        t.translated(side_key, "left: MindSpeed-RL keeps the first max_tool_response_length characters, then "
                               "...(truncated), as verirl (rollout.multi_turn.max_tool_response_chars)",
                     ["rollout.multi_turn.max_tool_response_chars"])
    else:
        kept = ("the last N characters after (truncated)..." if side == "right" else
                "the first N/2 and the last N/2 characters around ...(truncated)...")
        t.decide(side_key, f"{side if side is not None else 'null'}: MindSpeed-RL keeps {kept}; verirl keeps an "
                           f"observation's first rollout.multi_turn.max_tool_response_chars characters and marks the "
                           f"cut ...(truncated) (MindSpeed-RL's left)")
    par_key = RL + "max_parallel_calls"
    t.decide(par_key, calls_per_turn_words("MindSpeed-RL", int(t.get(par_key) or 0)))


def _switched_off(t: Translation, en_key: str, others: tuple[str, ...], what: str) -> bool:
    """Whether the feature switched by ``en_key`` is off: then the switch (when given) is translated as
    verirl's default and its other keys are ignored."""
    if t.get(en_key):
        return False
    if t.given(en_key):
        t.translated(en_key, f"false: {what}, as verirl's default")
    for key in others:
        t.ignore(key, f"{en_key.rsplit('.', 1)[-1]} is false")
    return True


def _dynamic_sampling(t: Translation, stage: str) -> None:
    """filter_groups_*: DAPO's dynamic sampling (dapo_trainer_hybrid.py, workers/dynamic_sampling.py): a group is
    kept when its metric's std > 0 (or it has one sample); generation batches of global_batch_size prompts until
    filter_groups_train_batch_size are kept, at most filter_groups_max_batches (<= 0: no limit), else an error."""
    en_key, metric_key, max_key, train_key = (RL + "filter_groups_enable", RL + "filter_groups_metric",
                                              RL + "filter_groups_max_batches", RL + "filter_groups_train_batch_size")
    if _switched_off(t, en_key, (metric_key, max_key, train_key), "no dynamic sampling"):
        return
    if stage != "ray_dapo":
        for key in (en_key, metric_key, max_key, train_key):
            t.ignore(key, "read by MindSpeed-RL's DAPO trainer only (cli/train_dapo.py, stage ray_dapo): the GRPO "
                          "trainer does not filter")
        return
    t.put("algo.filter_groups.enable", True, en_key,
          note="DAPO's dynamic sampling: groups whose metric is equal for every sample are dropped and more prompts "
               "generated")
    metric, names = str(t.get(metric_key)), [str(n) for n in t.get(RL + "verifier_function")]
    if metric in names:
        t.put("algo.filter_groups.metric", metric, metric_key,
              note="the rule's own score per sample (MindSpeed-RL's <rule>_rewards/mean, unweighted), as verirl's "
                   "metric by rule name")
    else:
        t.decide(metric_key, f"filter_groups_metric {metric!r} is not in verifier_function {names}: MindSpeed-RL "
                             f"refuses it; verirl's reward (the total) is left")
    max_b = int(t.get(max_key))
    gbs, train = t.get(MT + "global_batch_size"), int(t.get(train_key))
    end = "; at the limit MindSpeed-RL stops the run with an error, verirl trains the step on the groups it has"
    if max_b <= 0:
        t.put("algo.filter_groups.max_num_gen_batches", 0, max_key, note="no limit (MindSpeed-RL: <= 0)" + end)
    elif not gbs or int(gbs) == train:
        t.put("algo.filter_groups.max_num_gen_batches", max_b, max_key, note="generation batches per step" + end)
    else:
        batches = -(-max_b * int(gbs) // train)
        t.put("algo.filter_groups.max_num_gen_batches", batches, max_key, MT + "global_batch_size",
              note=f"MindSpeed-RL generates global_batch_size={gbs} prompts per batch, verirl data.prompts_per_step="
                   f"{train}: {max_b} x {gbs} prompts = {batches} batches of {train}" + end)


def _overlong(t: Translation) -> None:
    """overlong_buffer_*: DAPO's soft overlong penalty, added to every score by the rule reward
    (models/rule_verifier.py) whatever the stage: -factor x min(1, (L - (rollout_max_tokens - buffer)) / buffer)
    when positive, as verirl's reward.overlong_buffer."""
    en_key, len_key, factor_key, max_key = (RL + "overlong_buffer_enable", RL + "overlong_buffer",
                                            RL + "overlong_buffer_penalty_factor", RL + "rollout_max_tokens")
    if _switched_off(t, en_key, (len_key, factor_key, max_key), "no overlong penalty"):
        return
    t.put("reward.overlong_buffer.enable", True, en_key,
          note="DAPO's soft overlong penalty, added to every response's score by MindSpeed-RL's rule reward")
    length = int(t.get(len_key))
    if length <= 0:
        t.decide(len_key, f"overlong_buffer {length}" + ("" if t.given(len_key) else " (MindSpeed-RL's default)")
                          + ": MindSpeed-RL divides by it (a response in the buffer fails); verirl's 0 means a fifth "
                            "of rollout.max_new_tokens: set reward.overlong_buffer.len")
    else:
        t.put("reward.overlong_buffer.len", length, len_key, note="the buffer in tokens: the penalty starts at "
                                                                  "rollout_max_tokens - overlong_buffer, in both")
    t.put("reward.overlong_buffer.penalty_factor", float(t.get(factor_key)), factor_key,
          note="the penalty at the response cap, in both")
    max_tokens, response = int(t.get(max_key)), t.out.get("rollout.max_new_tokens")
    if response is not None and max_tokens != int(response):
        t.decide(max_key, f"rollout_max_tokens {max_tokens}" + ("" if t.given(max_key) else " (MindSpeed-RL's default)")
                          + f" differs from the response cap {response}, which MindSpeed-RL refuses with the overlong "
                            f"buffer on; verirl measures the buffer from rollout.max_new_tokens")
    else:
        t.translated(max_key, "= sampling_config.max_tokens (MindSpeed-RL requires it): the buffer is measured from "
                              "rollout.max_new_tokens, as verirl's", ["reward.overlong_buffer.len"])


def _reward(t: Translation, version: str) -> None:
    fn_key, w_key = RL + "verifier_function", RL + "verifier_weight"
    rules, model = bool(t.get(RL + "rule_reward")), _reward_model_runs(t)
    names = [str(n) for n in t.get(fn_key)]
    weights = [float(w) for w in t.get(w_key)]
    if model and not rules:
        t.translated(RL + "rule_reward", "false: the reward model alone scores, verirl's rule 'model'",
                     ["reward.verifiers"])
        t.put("reward.verifiers", ["model"], RL + "rule_reward", note="the reward model's score is the reward")
        t.put("reward.weights", [1.0], RL + "rule_reward")
        t.ignore(fn_key, "rule_reward is false: no rule scores")
        t.ignore(w_key, "rule_reward is false: no rule scores")
        names = []
    elif model:
        t.decide(RL + "rule_reward", "true beside a reward model: MindSpeed-RL runs both, each writing the samples' "
                                     "rm_scores (the later write stands, they are not added); verirl adds the rule "
                                     "'model' (weight 1) to the rules by reward.weights: set the weights")
        t.put("reward.verifiers", [*names, "model"], fn_key, RL + "rule_reward",
              note="verirl's rules of the same names, written after MindSpeed-RL's (docs/rewards.md), and the reward "
                   "model")
        t.put("reward.weights", [*weights, 1.0], w_key, note="one per rule, same order; 1 for the reward model")
    else:
        if not rules:
            t.decide(RL + "rule_reward", "false with no reward model worker (rl_config.reward_resource unset, or "
                                         "use_integrated_worker true): nothing scores the samples; the rules of "
                                         "verifier_function are written")
        else:
            t.translated(RL + "rule_reward", "rule rewards, as verirl's")
        t.put("reward.verifiers", names, fn_key,
              note="verirl's rules of the same names, written after MindSpeed-RL's (docs/rewards.md)")
        t.put("reward.weights", weights, w_key, note="one per rule, same order")
    if model:
        _reward_model(t)
    for name in names:
        if not _is_rule(name):
            hint = NO_RULE.get(name, "a rule of the other run's own")
            skipped = " (MindSpeed-RL before 2.0 skipped a name it did not know, silently)" if version == "pre-2.0" \
                else ""
            t.decide(fn_key, f"'{name}' ({hint}) is not a verirl rule: write it as a verirl rule and name it in "
                             f"reward.verifiers as path.py:function (kept as '{name}', which verirl refuses at "
                             f"start){skipped}")
    timeout = RL + "verifier_timeout"
    if version == "pre-2.0" and int(t.get(RL + "verifier_parallel", 1) or 1) > 1 and t.given(timeout):
        t.put("reward.timeout", float(t.get(timeout)), timeout,
              note="seconds before a scoring worker is given up: MindSpeed-RL's for a worker's share of the "
                   "responses (the whole share scores 0), verirl's for one response")
    else:
        t.ignore(timeout, "read by MindSpeed-RL before 2.0 only, with verifier_parallel > 1: verirl's reward.timeout "
                          "keeps its default")


RC = "reward_config."


def _reward_model_runs(t: Translation) -> bool:
    """MindSpeed-RL builds its reward-model worker when rl_config.reward_resource is set and the actor, reference and
    rollout are not one integrated worker (cli/train_grpo.py; validate_config.py refuses the two together)."""
    if not (t.under(RL + "reward_resource") or t.values.get(RL + "reward_resource")):
        return False
    if t.get(RL + "use_integrated_worker"):
        t.decide(RL + "use_integrated_worker", "true with rl_config.reward_resource: MindSpeed-RL refuses a reward "
                                               "model with the integrated worker; verirl scores with the rules")
        return False
    t.translated(RL + "use_integrated_worker", "false: separate actor, reference and reward-model workers; verirl "
                                               "runs them all in the trainer's processes")
    return True


def _reward_model(t: Translation) -> None:
    """The reward-model worker (workers/reward_worker.py, models/reward.py): a Megatron GPT with a one-output head,
    loaded from reward_config.load (reward_config over megatron_training), its output at each response's last token
    the score; verirl's rule 'model' is a Hugging Face sequence-classification model scoring the same token."""
    tok, load = RC + "tokenizer_name_or_path", RC + "load"
    if t.given(tok):
        path = str(t.get(tok))
        t.put("reward.model.path", path, tok, note="the reward model's Hugging Face directory (its tokenizer's)")
        t.check(f"reward.model.path ({path}) is the other machine's: point it at the Hugging Face sequence-"
                f"classification model reward_config.load's Megatron weights were converted from")
    elif t.values.get(load) is not None:
        path = str(t.get(load))
        t.put("reward.model.path", path, load, note="the other machine's Megatron checkpoint of the reward model")
        t.decide(load, f"{path} holds Megatron weights: verirl's reward model is a Hugging Face sequence-"
                       f"classification directory (AutoModelForSequenceClassification, one label): convert the "
                       f"checkpoint back, or give the directory it came from, as reward.model.path")
    else:
        key = (t.under(RL + "reward_resource") or [RL + "reward_resource"])[0]
        t.decide(key, "a reward model without reward_config.load: give reward.model.path (a Hugging Face "
                      "sequence-classification directory)")
        t.put("reward.model.path", "REWARD_MODEL_DIRECTORY", key,
              note="a placeholder: the reward model's Hugging Face directory")
    longest = int(t.out.get("data.max_prompt_length", 0)) + int(t.out.get("rollout.max_new_tokens", 0))
    if t.get(RL + "use_dynamic_bsz"):
        key = RL + "ref_max_packing_token_size"
        budget, how, keys = int(t.get(key)), "ref_max_packing_token_size (the reward model's packing budget)", [key]
    else:
        key = RC + "micro_batch_size" if t.given(RC + "micro_batch_size") else MT + "micro_batch_size"
        micro = int(t.get(key) or 1)
        budget, how, keys = micro * longest, f"{micro} sequence{'' if micro == 1 else 's'} per micro-batch x the " \
                                             f"longest", [key]
    t.put("reward.model.max_token_len", max(budget, longest), *keys,
          note=f"{how} = {budget} tokens per forward pass" + (
              f", under the longest sequence (prompt + response = {longest}), which one pass must hold: {longest} "
              f"written" if budget < longest else ", packed greedily as verirl's log-prob passes"))
    t.ignore(RL + "beta", "passed to the reward model's engine as a KL coefficient its scoring does not use "
                          "(rl_config.py calls it the rule / model balance; neither applies it): verirl weighs the "
                          "rules and 'model' by reward.weights")
    for key in t.under(RC[:-1]):
        if not t.rows[key].status:
            t.ignore(key, "the reward model's parallel layout: verirl runs it on the trainer's devices"
                     if key.endswith("parallel_size") else
                     "the reward model's architecture yaml (configs/model/NAME.yaml): verirl reads reward.model.path's "
                     "config.json" if key == RC + "model" else
                     "how Megatron loads or runs the reward model's worker: verirl loads the Hugging Face directory")


def _data_and_model(t: Translation, version: str) -> None:
    tok_key = _actor_key(t, "tokenizer_name_or_path")
    path = t.get(tok_key)
    if path is None:
        t.decide(tok_key, "not set: give model.path (the Hugging Face directory of the model)")
    else:
        t.put("model.path", str(path), tok_key,
              note="MindSpeed-RL loads Megatron weights from actor_config.load, converted from a Hugging Face "
                   "directory, usually this tokenizer's; the other machine's path")
        t.check(f"model.path ({path}) is the other machine's tokenizer directory: point it at the Hugging Face model "
                f"the Megatron weights (actor_config.load) were converted from, and run `verirl doctor` on it")
    gen_tok = GEN + "tokenizer_name_or_path"
    if t.given(gen_tok):
        if path is not None and t.get(gen_tok) != path:
            t.decide(gen_tok, f"the rollout's tokenizer ({t.get(gen_tok)}) differs from the actor's ({path}): seed "
                              f"000's first failure was two tokenizers; verirl uses one")
        else:
            t.translated(gen_tok, "the actor's tokenizer, as verirl uses one")
    t.check("tokenizer ids: EOS, pad and BOS must agree between the two runs' tokenizers and configs (`verirl doctor`; "
            "Qwen2.5-7B-Instruct's EOS 151645 vs the base model's 151643 strips every EOS as padding)")
    model_key = _actor_key(t, "model")
    name = t.get(model_key, None)
    if name is not None:
        t.decide(model_key, f"MindSpeed-RL takes the model's numerics from configs/model/{name}.yaml (norm_epsilon, "
                            f"rotary_base, padded_vocab_size), not from config.json: compare them with `verirl doctor` "
                            f"and set model.override_config where they differ (not written here)")
        t.check(f"rms_norm_eps: MindSpeed-RL's configs/model/{name}.yaml norm_epsilon (Megatron's default 1e-5 if "
                f"unset) must equal the Hugging Face config.json's rms_norm_eps the other run used (1e-6 vs "
                f"1e-7 makes the reward drift down after about 1,500 steps); likewise rotary_base = rope_theta")
        # the model yaml's section, at the top level or under model: (as Hydra composes the defaults list)
        model_keys = [k for k in t.under(str(name)) + t.under(f"model.{name}")
                      if not k.startswith(("megatron_training.", "actor_config."))]
        for key in model_keys:
            if key.rsplit(".", 1)[1] not in NUMERICS and key.rsplit(".", 1)[1] not in MOE_KEYS:
                t.ignore(key, "the architecture: verirl reads it from model.path's config.json")
        for key in t.under("model"):
            if key not in model_keys:
                t.ignore(key, f"a model YAML this config does not use (megatron_training.model is {name})")
    else:
        model_keys = []
    numerics, sources = {}, []
    for key in [MT + k for k in NUMERICS] + [AC + k for k in NUMERICS] + model_keys:
        leaf = key.rsplit(".", 1)[1]
        if t.given(key) and leaf in NUMERICS:
            if leaf == "padded_vocab_size":  # Megatron pads the embedding; the values it computes are the same
                t.decide(key, f"{leaf} {t.get(key)}: Megatron's padded embedding rows; compare with config.json's "
                              f"vocab_size (`verirl doctor`)")
                continue
            numerics[NUMERICS[leaf]] = t.get(key)
            sources.append(key)
    if numerics:  # what the MindSpeed-RL run computed with, whatever config.json says (e.g. its rms_norm_eps)
        t.put("model.override_config", numerics, *sources,
              note="the run's own numerics; compare with config.json (`verirl doctor`)")
    _lora(t)
    _engine(t)
    for name_ in ("attention_dropout", "hidden_dropout"):
        key = _actor_key(t, name_)
        value = float(t.get(key))
        if value == 0:
            t.translated(key, "no dropout, as verirl trains")
        else:
            t.decide(key, f"dropout {value:g}" + (" (Megatron's default, not set here)" if not t.given(key) else "")
                          + ": verirl trains without dropout; MindSpeed-RL's run had it on")
    data_key = _actor_key(t, "data_path")
    if t.given(data_key):
        t.decide(data_key, "MindSpeed-RL's preprocessed data (Megatron .bin/.idx files under this prefix) are not "
                           "readable by verirl: run `verirl preprocess` on the raw data with the same keys "
                           "(docs/data.md) and set data.train_path")
    split_key = _actor_key(t, "split")
    if t.given(split_key):
        if str(t.get(split_key)).replace(" ", "").split(",")[0] == "100":
            t.translated(split_key, "all rows train, as verirl's data.train_path")
        else:
            t.decide(split_key, f"split {t.get(split_key)}: verirl trains on every row of data.train_path; cut the "
                                f"file to the training part")
    if t.given(_actor_key(t, "prompt_type")):
        key = _actor_key(t, "prompt_type")
        t.put("data.prompt_type", str(t.get(key)), key, note="the templates.json name, as verirl's")
    seed_key = _actor_key(t, "seed")
    seed = int(t.get(seed_key))
    unshuffled = bool(t.get(_actor_key(t, "no_shuffle")))
    t.put("data.seed", seed, seed_key, note="no_shuffle: no prompt order to seed (written as the other run's seed)"
          if unshuffled else "seeds the prompt order")
    t.put("trainer.seed", seed, seed_key, note="seeds verirl's sampling too")
    shuffle_key = _actor_key(t, "no_shuffle")
    if t.get(shuffle_key):
        t.put("data.shuffle", "sequential", shuffle_key, note="no_shuffle: the file's order")
    elif version == "pre-2.0":
        t.put("data.shuffle", "megatron", shuffle_key)
        t.decide(shuffle_key, "MindSpeed-RL before 2.0 shuffled Megatron's sample index (verirl's megatron order is a "
                              "numpy permutation per epoch: written); a run aligned with veRL may have replaced it with "
                              "veRL's sampler, which is data.shuffle=verl: use what the other run used")
    else:
        t.put("data.shuffle", "verl", shuffle_key,
              note="MindSpeed-RL 2.0+ draws with a torch RandomSampler seeded with seed, veRL's sampler")
        t.check("prompt order: MindSpeed-RL 2.0+ samples over the index Megatron builds for train_iters x "
                "global_batch_size samples (the rows repeated in order), so its order equals verirl's "
                "data.shuffle=verl "
                "only when that is the row count: compare the first steps' prompts (rollout dumps)")
    save_key = _actor_key(t, "save_interval")
    if t.get(save_key, None) is not None:
        t.put("trainer.save_freq", int(t.get(save_key)), save_key, note="every N steps")
    stage_key = _actor_key(t, "stage")
    stage = t.get(stage_key)
    if stage in ("ray_grpo", "ray_dapo"):
        t.translated(stage_key, "GRPO" if stage == "ray_grpo" else "GRPO with DAPO's loss")
    else:
        t.decide(stage_key, f"stage {stage!r}: verirl runs GRPO (ray_grpo)")


def _engine(t: Translation) -> None:
    """MindSpeed-RL generates with vLLM (vllm-ascend on NPUs): verirl's vllm engine, with the same tensor
    parallelism and memory share."""
    tp, mem = GEN + "infer_tensor_parallel_size", GEN + "gpu_memory_utilization"
    t.put("rollout.engine", "vllm", *[k for k in (tp, mem) if t.given(k)],
          note="MindSpeed-RL generates with vLLM (vllm-ascend): verirl's vllm engine; on a machine without vLLM (a "
               "CPU) use rollout.engine=native (docs/vllm.md)")
    if t.given(tp):
        t.put("rollout.tensor_parallel_size", int(t.get(tp)), tp, note="ranks per vLLM engine, the same setting")
    if t.given(mem):
        t.put("rollout.gpu_memory_utilization", float(t.get(mem)), mem, note="the same vLLM setting")


def _size(t: Translation, key: str) -> int:
    """A parallel size as Megatron reads it: unset or null is 1."""
    return int(t.get(key, 1) or 1)


# How verirl's sequence parallelism (Ulysses) splits the work, and what verirl train asks of the model for it
# (run/checks.py: check_model_parallel).
_ULYSSES = ("each rank holds 1/sp of a packed micro-batch's tokens, all-to-alls exchange them for 1/sp of the "
            "attention heads around attention, docs/parallelism.md")
_HEADS = "verirl train refuses it unless each tensor-parallel rank's attention heads and key/value heads divide by it"


def _layout(t: Translation) -> None:
    """The actor's parallel layout (megatron_training updated by actor_config): Megatron's tensor parallelism is
    verirl's actor.tensor_parallel_size, its Ulysses context parallelism verirl's actor.sequence_parallel_size (ring
    attention, not built in verirl, becomes Ulysses over the same ranks, with a decision), its pipeline parallelism
    verirl's actor.pipeline_parallel_size with num_layer_list as actor.pipeline_layers."""
    tp_key = _actor_key(t, "tensor_model_parallel_size")
    tp = _size(t, tp_key)
    if t.given(tp_key):
        t.put("actor.tensor_parallel_size", tp, tp_key,
              note="ranks that split each layer, in both (Megatron's tensor parallelism, verirl's tensor-parallel "
                   "plan: heads, MLP width and vocabulary 1/tp per rank)")
    sp, sp_key = _context_parallel(t)
    pp_key = _actor_key(t, "pipeline_model_parallel_size")
    pp = _size(t, pp_key)
    if pp > 1:
        pipeline_stages(t, pp_key, pp)
        for key in (MT + "use_distributed_optimizer", AC + "use_distributed_optimizer"):
            if t.get(key, False):
                t.ignore(key, "Megatron's optimizer state sharded over the data-parallel ranks: verirl's default, "
                              "actor.strategy=fsdp2, shards each stage's parameters, gradients and optimizer state "
                              "over them")
    else:
        t.ignore(pp_key, "1: none")
    _stages(t, pp)
    if tp * sp * pp > 1:
        model_parallel_fits(t, tp, sp, pp, [k for k, v in ((tp_key, tp), (sp_key, sp), (pp_key, pp)) if v > 1],
                            "MindSpeed-RL", RL + "use_remove_padding",
                            [_actor_key(t, "pipeline_model_parallel_size")],
                            lambda: (f"MindSpeed-RL's actor had {t.get(RL + 'actor_resource.num_npus')} NPUs"
                                     if t.get(RL + "actor_resource.num_npus", None) else ""))


# The MoE keys _experts reads, wherever they are set (actor_config, megatron_training, the model YAML).
MOE_KEYS = ("expert_model_parallel_size", "expert_tensor_parallel_size", "moe_tp_extend_ep", "num_experts",
            "moe_router_topk", "moe_grouped_gemm", "moe_aux_loss_coeff", "moe_router_load_balancing_type",
            "moe_token_dispatcher_type", "moe_permutation_async_comm", "use_fused_moe_token_permute_and_unpermute",
            "moe_alltoall_overlap_comm")
_MOE_IGNORED = {
    "num_experts": "the model's shape: verirl reads the experts from model.path's config.json",
    "moe_router_topk": "the model's shape: verirl reads the router's top-k from model.path's config.json",
    "moe_token_dispatcher_type": "how Megatron moves tokens to their experts (allgather / alltoall / alltoall_seq): "
                                 "communication, not maths; verirl's expert parallel dispatches and combines by "
                                 "all-to-all, with no token dropping",
    "moe_permutation_async_comm": "overlaps the token permutation with communication: scheduling, not maths",
    "use_fused_moe_token_permute_and_unpermute": "a fused kernel for the token permutation: the same maths",
    "moe_alltoall_overlap_comm": "overlaps the all-to-all with computation: scheduling, not maths"}


def _moe_keys(t: Translation, leaf: str) -> list[str]:
    """The given keys named ``leaf``, the one MindSpeed-RL reads first: actor_config, megatron_training, the model
    YAML (top level or under model:)."""
    name = t.get(_actor_key(t, "model"), None)
    where = [AC + leaf, MT + leaf] + ([f"{name}.{leaf}", f"model.{name}.{leaf}"] if name is not None else [])
    return [k for k in where if t.given(k)]


def _moe_value(t: Translation, leaf: str) -> Any:
    keys = _moe_keys(t, leaf)
    return t.get(keys[0]) if keys else None


def _moe(t: Translation, leaf: str, default: Any = None) -> tuple[Any, str]:
    """(the value MindSpeed-RL runs with, the key it came from: the first of `_moe_keys`, else actor_config's);
    the others are rows that say which one wins."""
    keys = _moe_keys(t, leaf)
    for other in keys[1:]:
        t.ignore(other, f"{keys[0]} wins")
    return (t.get(keys[0]), keys[0]) if keys else (default, AC + leaf)


def _experts(t: Translation) -> None:
    """A MoE model's settings (a model with num_experts, or expert parallelism above 1): the expert layout
    (fit_experts; moe_tp_extend_ep spreads the experts over the tensor-parallel ranks too, so Megatron's tp x ep
    ranks are verirl's expert-parallel group), the grouped expert product, the load-balancing loss; the rest
    communication and the model's shape."""
    experts = _moe_value(t, "num_experts")
    ep, ep_key = _moe(t, "expert_model_parallel_size", 1)
    ep = int(ep or 1)
    for leaf, why in _MOE_IGNORED.items():
        for key in _moe_keys(t, leaf):
            t.ignore(key, why)
    grouped, grouped_key = _moe(t, "moe_grouped_gemm", False)
    if t.given(grouped_key):
        if grouped:
            t.translated(grouped_key, "the experts computed as one grouped product (torch's _grouped_mm), as verirl "
                                      "always does")
        else:
            t.ignore(grouped_key, "false: a loop over the experts, the same maths; verirl computes them as one "
                                  "grouped product")
    if not experts and ep <= 1:
        for leaf in ("expert_tensor_parallel_size", "moe_tp_extend_ep", "moe_aux_loss_coeff",
                     "moe_router_load_balancing_type"):
            for key in _moe_keys(t, leaf):
                t.ignore(key, "a dense model (no num_experts, expert parallel 1)")
        return
    tp_key = _actor_key(t, "tensor_model_parallel_size")
    tp = int(t.out.get("actor.tensor_parallel_size", 1))
    extend, extend_key = _moe(t, "moe_tp_extend_ep", False)
    etp_value, etp_key = _moe(t, "expert_tensor_parallel_size")
    ep_keys = [ep_key] if t.given(ep_key) else []
    if extend and tp > 1:
        t.translated(extend_key, f"Megatron spreads the experts over the tensor-parallel ranks too (each expert whole): "
                                 f"tensor parallel {tp} x expert parallel {ep} = {tp * ep} ranks, verirl's "
                                 f"actor.expert_parallel_size={tp * ep}", ["actor.expert_parallel_size"])
        ep, ep_keys = tp * ep, ep_keys + [extend_key]
    elif t.given(extend_key):
        t.ignore(extend_key, "tensor parallel 1: nothing to extend" if extend else "false: off")
    etp = int(etp_value) if etp_value is not None else (1 if extend else tp)  # Megatron: unset is the tensor size
    fit_experts(t, "MindSpeed-RL", ep, ep_keys, etp, etp_key, tp_key)
    _aux_loss(t)


def _aux_loss(t: Translation) -> None:
    """Megatron's load-balancing loss (moe_aux_loss_coeff with moe_router_load_balancing_type aux_loss, Megatron's
    default type) as algo.moe_aux_loss_coef."""
    coef, coef_key = _moe(t, "moe_aux_loss_coeff", 0.0)
    kind, type_key = _moe(t, "moe_router_load_balancing_type", "aux_loss")
    coef = float(coef or 0)
    if kind == "none" or coef == 0:
        t.ignore(coef_key, f"{coef:g} with load balancing {kind}: off, verirl's algo.moe_aux_loss_coef 0")
        t.ignore(type_key, f"{kind}: no load-balancing loss" if coef else f"{kind}, with coefficient 0: off")
        return
    _, layers = _num_layers(t)
    top_k = _moe_value(t, "moe_router_topk")
    t.put("algo.moe_aux_loss_coef", coef, coef_key, *([type_key] if t.given(type_key) else []),
          note="the Switch load-balancing loss added times this, in both")
    t.decide(coef_key, aux_scale_words(coef, int(layers) if layers else None, int(top_k) if top_k else None))
    if kind == "seq_aux_loss":
        t.decide(type_key, "seq_aux_loss balances each sequence; verirl's Switch loss balances the whole batch")
    elif kind != "aux_loss":
        t.decide(type_key, f"{kind}: verirl's only load-balancing loss is the Switch loss over the batch "
                           f"(Megatron's aux_loss)")


def _ints(value: Any) -> list[int]:
    """A Megatron list of integers: a YAML list, or a comma-separated string ('7,7,8,8'); raises ValueError."""
    items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", "").split(",")
    return [int(x) for x in items]


def _num_layers(t: Translation) -> tuple[Optional[str], Optional[int]]:
    """(key, value) of Megatron's decoder layer count: num_layers of the actor's keys, else of the model YAML
    section MindSpeed-RL composes (under model: or at the top level); (None, None) where neither has it."""
    key = _actor_key(t, "num_layers")
    name = t.get(_actor_key(t, "model"), None)
    for candidate in (key, *([f"model.{name}.num_layers", f"{name}.num_layers"] if name is not None else [])):
        if t.given(candidate) and t.values[candidate] is not None:
            return candidate, int(t.values[candidate])
    return None, None


def _stages(t: Translation, pp: int) -> None:
    """num_layer_list (Megatron's decoder layers per pipeline rank), num_layers_per_virtual_pipeline_stage (its
    model chunks) and noop_layers (empty layers it inserts, counted by num_layers and num_layer_list) become verirl's
    actor.pipeline_layers (the real decoder layers of each stage) and actor.pipeline_schedule."""
    from verirl.models.pipeline import stages_per_rank

    list_key, vpp_key, noop_key = (_actor_key(t, name) for name in (
        "num_layer_list", "num_layers_per_virtual_pipeline_stage", "noop_layers"))
    raw_list, per_chunk, raw_noop = t.get(list_key, None), t.get(vpp_key, None), t.get(noop_key, None)
    if pp == 1:
        for key, value in ((list_key, raw_list), (vpp_key, per_chunk)):
            t.ignore(key, "null: none" if value is None else "read only with pipeline_model_parallel_size > 1")
        return
    if raw_list is None:
        t.ignore(list_key, "null: an even split, as verirl's default")
    if per_chunk is None:
        t.ignore(vpp_key, "null: one stage per rank")
    layers_key, num_layers = _num_layers(t)
    counts, sources = None, []  # Megatron's layers per pipeline rank, noop layers included
    if raw_list is not None:
        try:
            counts = _ints(raw_list)
        except ValueError:
            t.decide(list_key, f"{raw_list!r} is not a list of layer counts (MindSpeed-RL's '7,7,8,8', one per "
                               f"pipeline rank): verirl's even split (actor.pipeline_layers []) is left")
        if counts is not None and len(counts) != pp:
            t.decide(list_key, f"{len(counts)} layer counts for pipeline_model_parallel_size {pp}: MindSpeed-RL takes "
                               f"one per pipeline rank; verirl's even split (actor.pipeline_layers []) is left: give "
                               f"actor.pipeline_layers {pp} numbers")
            counts = None
        sources = [list_key] if counts is not None else []
    elif num_layers is not None and num_layers % pp == 0:
        counts, sources = [num_layers // pp] * pp, [layers_key]
    per_rank, interleaved = 1, stages_per_rank("interleaved_1f1b")
    if per_chunk is not None:
        per_chunk = int(per_chunk)
        chunks = {c // per_chunk for c in counts} if counts is not None and per_chunk > 0 and not any(
            c % per_chunk for c in counts) else set()
        if counts is None:
            t.decide(vpp_key, f"{per_chunk} layers per model chunk, and the layers per pipeline rank are not known "
                              f"here (num_layers or num_layer_list): verirl's interleaved_1f1b holds {interleaved} "
                              f"stages per rank, so it matches when each rank holds {interleaved} x {per_chunk} "
                              f"layers; its default 1f1b is left: choose actor.pipeline_schedule")
        elif chunks == {1}:
            t.translated(vpp_key, f"{per_chunk} layers per chunk = each rank's layers: one chunk per rank, the stages "
                                  f"of 1F1B, verirl's default actor.pipeline_schedule")
        elif chunks == {interleaved}:
            per_rank = interleaved
            t.put("actor.pipeline_schedule", "interleaved_1f1b", vpp_key, *(sources if raw_list is None else []),
                  note=f"{counts[0]} layers per rank / {per_chunk} per chunk = {interleaved} model chunks per rank "
                       f"under Megatron's interleaved 1F1B: verirl's interleaved_1f1b ({interleaved} stages per rank, "
                       f"stage k x {pp} + r on rank r, as Megatron places its chunks)")
        else:
            t.decide(vpp_key, f"{per_chunk} layers per model chunk over the ranks' {counts} layers: "
                              + (f"{sorted(chunks)} chunks per rank" if chunks else "no whole number of chunks")
                              + f" (Megatron's interleaved 1F1B); verirl's interleaved_1f1b holds {interleaved} stages "
                                f"per rank, and its default 1f1b is left (one stage per rank): choose "
                                f"actor.pipeline_schedule; the schedule changes no result, only the idle share of each "
                                f"pass (verirl plan shows it)")
    noop = []
    if raw_noop is not None:
        try:
            noop = _ints(raw_noop)
        except ValueError:
            t.decide(noop_key, f"{raw_noop!r} is not a list of layer indices (MindSpeed-RL's '5,95')")
    if counts is None or (raw_list is None and not noop):
        return  # verirl's even split, Megatron's where num_layers divides by pp (stages of rank-sized chunks)
    stage_counts = [c // per_rank for c in counts] * per_rank  # stage k x pp + r: chunk k of rank r
    starts = [sum(stage_counts[:s]) for s in range(len(stage_counts))]
    layers = [n - sum(1 for i in noop if a <= i < a + n) for a, n in zip(starts, stage_counts)]
    if min(layers) < 1:
        t.decide(noop_key if noop else list_key, f"stages of {layers} real decoder layers (less the noop layers "
                                                 f"{noop}): verirl's stages hold at least one; its even split is left")
        return
    how = ["MindSpeed-RL's layers per pipeline rank are verirl's per stage, first to last" if raw_list is not None
           else f"Megatron's even split of num_layers {num_layers} over {pp} ranks"]
    if per_rank > 1:
        how.append(f"each rank's split into its {per_rank} chunks (stage k x {pp} + r is chunk k of rank r)")
    if noop:
        how.append(f"less the noop layers {noop}, which Megatron inserts and counts in num_layers and num_layer_list "
                   f"(verirl's stages hold the model's own layers)")
    t.put("actor.pipeline_layers", layers, *sources, *([noop_key] if noop else []),
          *([vpp_key] if per_rank > 1 else []),
          note="; ".join(how) + "; verirl train checks that they sum to config.json's num_hidden_layers")


def _context_parallel(t: Translation) -> tuple[int, str]:
    """context_parallel_size with context_parallel_algo: (verirl's actor.sequence_parallel_size, the size's key).
    MindSpeed-RL takes ulysses_cp_algo (its default) and megatron_cp_algo (ring attention) (validate_config.py)."""
    cp_key, algo_key = _actor_key(t, "context_parallel_size"), _actor_key(t, "context_parallel_algo")
    cp = _size(t, cp_key)
    if cp == 1:
        t.ignore(cp_key, "1: none")
        t.ignore(algo_key, "read only with context_parallel_size > 1")
        return 1, cp_key
    algo = t.get(algo_key)
    t.put("actor.sequence_parallel_size", cp, cp_key,
          note=f"ranks that split each sequence's tokens, in both; {_HEADS}")
    if algo == "ulysses_cp_algo":
        t.translated(algo_key, f"Ulysses in both ({_ULYSSES}): the same {cp} ranks per sequence, the same log-probs",
                     ["actor.sequence_parallel_size"])
    else:
        what = ("ring attention (key/value blocks passed round the group)" if algo == "megatron_cp_algo"
                else "not an algorithm MindSpeed-RL takes (ulysses_cp_algo and megatron_cp_algo, validate_config.py)")
        t.decide(cp_key, f"context_parallel_algo {algo}: {what}; ring attention is not built in verirl, whose "
                         f"sequence parallelism is Ulysses ({_ULYSSES}): actor.sequence_parallel_size={cp} is written "
                         f"(the same {cp} ranks per sequence, the same log-probs, where the heads divide), or set "
                         f"actor.sequence_parallel_size=1 (whole sequences on each rank)")
        t.decide(algo_key, f"{algo}: verirl's sequence parallelism is Ulysses; see context_parallel_size")
    _group_budgets(t, cp, cp_key)
    return cp, cp_key


def _group_budgets(t: Translation, cp: int, cp_key: str) -> None:
    """use_dynamic_bsz's budgets with context parallelism: MindSpeed-RL packs max_packing_token_size tokens per
    micro-batch and splits them over the context-parallel group; verirl's budget is each rank's share (the group
    packs budget x actor.sequence_parallel_size), so it is the budget / cp."""
    divided = []
    for target in ("actor.max_token_len_per_device", "ref.log_prob_max_token_len_per_device"):
        budget = t.out.get(target)
        if not budget:
            continue
        share = max(1, int(budget) // cp)
        t.put(target, share, *t.out_from[target],
              note=f"MindSpeed-RL packs {budget} tokens per micro-batch over the {cp} context-parallel ranks, verirl "
                   f"packs actor.max_token_len_per_device x actor.sequence_parallel_size: {budget} / {cp} = {share} "
                   f"per rank" + ("" if int(budget) % cp == 0 else " (rounded down)"))
        divided.append(target)
    if divided:
        t.note(cp_key, f"{' and '.join(divided)} divided by {cp}: MindSpeed-RL's packing budgets count the group's "
                       f"tokens, verirl's each rank's")

# MindSpeed-RL's LoRA keys (mindspeed_rl/config_cls/megatron_config.py); its config refuses any other key ("The key:
# ... is missing"), so the other lora_* names a file may carry, MindSpeed-LLM's arguments, never ran there.
LORA_KEYS = ("lora_r", "lora_alpha", "lora_target_modules", "lora_fusion", "lora_ckpt_filter")
NOT_MINDSPEED_RL = {
    "lora_load": "MindSpeed-LLM's --lora-load continues from a LoRA checkpoint; verirl starts its adapters at B = 0 "
                 "and continues only its own LoRA checkpoints (trainer.resume)",
    "lora_dropout": "MindSpeed-LLM's --lora-dropout is verirl's actor.lora.dropout (0 left)",
    "lora_modules_to_save": "MindSpeed-LLM's --lora-modules-to-save trains whole modules beside the adapters; verirl "
                            "trains the adapters only",
    "lora_register_forward_hook": "MindSpeed-LLM's --lora-register-forward-hook mends the gradient chain at each "
                                  "pipeline stage's input layers; verirl's stages need none (no trainable parameter)"}


def _lora(t: Translation) -> None:
    """MindSpeed-RL trains LoRA adapters when lora_target_modules names Megatron layers (MindSpeed-LLM's LoRA on
    Megatron-core's layers, rank lora_r, scale lora_alpha / lora_r); the reference is the actor with its adapters off
    (rl_config.share_backbone) or a second copy of the base, the same log-probs either way."""
    modules_key = _actor_key(t, "lora_target_modules")
    modules = t.get(modules_key, None)
    share = RL + "share_backbone"
    if not modules:
        if t.get(share, False):
            t.decide(share, "true without lora_target_modules: MindSpeed-RL refuses it (the shared backbone is "
                            "LoRA's); verirl trains every weight, its reference a copy of the model")
        else:
            t.ignore(share, "LoRA is off: the reference is a copy of the model, as verirl's without LoRA")
        return  # the other lora_* keys: the ignore table's "LoRA is off"
    r_key, alpha_key = _actor_key(t, "lora_r"), _actor_key(t, "lora_alpha")
    if int(t.get(r_key) or 0) <= 0:
        t.decide(r_key, f"{t.get(r_key)} with lora_target_modules {modules}: peft refuses a rank below 1, so "
                        f"MindSpeed-RL does not start; verirl's actor.lora.rank 0 is LoRA off, every weight trained "
                        f"(left)")
        for key in [k for k in t.values if k.startswith((MT + "lora_", AC + "lora_")) and k != r_key] + [share]:
            t.ignore(key, f"LoRA is off in verirl: see {r_key}")
        return
    t.put("actor.lora.rank", int(t.get(r_key)), r_key,
          note="the adapters' rank (MindSpeed-RL's default 8); LoRA is on where lora_target_modules names layers")
    t.put("actor.lora.alpha", float(t.get(alpha_key)), alpha_key,
          note="the adapters' scale is alpha / rank in both (MindSpeed-RL's default 16)")
    megatron_lora_targets(t, modules_key, modules, "MindSpeed-RL")
    t.note(modules_key, "MindSpeed-LLM builds the adapters with peft, whose default initialisation (A Kaiming-uniform, "
                        "B zero) is verirl's actor.lora.init true")
    fusion, ckpt = _actor_key(t, "lora_fusion"), _actor_key(t, "lora_ckpt_filter")
    t.ignore(fusion, "CCLoRA: MindSpeed's LoRA kernels overlapping the adapters' computation with tensor-parallel "
                     "communication; speed, not maths")
    if t.get(ckpt, False):
        t.translated(ckpt, "checkpoints of the LoRA weights only: verirl's LoRA checkpoints hold the adapters only")
    else:
        t.ignore(ckpt, "false: MindSpeed-RL's checkpoints hold the whole model; verirl's LoRA checkpoints hold the "
                       "adapters only (the base comes from model.path)")
    if t.get(share, False):
        t.translated(share, "the reference is the actor with its adapters off (disable_adapter), as verirl's: no copy")
    else:
        t.translated(share, "false: MindSpeed-RL keeps a second copy of the base for the reference; verirl's is the "
                            "actor with its adapters off: the same log-probs, no copy")
    for key in t.values:
        leaf = key.rsplit(".", 1)[-1]
        if key.startswith((MT + "lora_", AC + "lora_")) and leaf not in LORA_KEYS:
            what = NOT_MINDSPEED_RL.get(leaf, "a name this converter does not know")
            t.decide(key, f"not a MindSpeed-RL key: its MegatronConfig holds {', '.join(LORA_KEYS)} and refuses "
                          f"any other, so MindSpeed-RL does not start with it; {what}: check what the run was meant "
                          f"to do (not written)")


def _sampling_defaults(t: Translation) -> None:
    """A sampling_config given replaces MindSpeed-RL's whole; a key it lacks is vLLM's default."""
    given = any(k.startswith(SAMP) for k in t.values)
    for key, value in (VLLM_DEFAULTS if given else SAMPLING_DEFAULTS).items():
        t.defaults[SAMP + key] = value


def _partial_rollout(t: Translation) -> None:
    """rl_config.partial_rollout_max_split (trainer/grpo_trainer_hybrid.py, trainer/utils/data_strategy.py): above 1,
    MindSpeed-RL cuts the longest responses and continues them in the next iterations, each piece sampled with that
    iteration's weights on the same devices, every response finished within that many iterations."""
    key, done_key = RL + "partial_rollout_max_split", RL + "require_max_age_all_finished"
    split = int(t.get(key, 1) or 1)
    if split <= 1:
        t.ignore(key, f"{split}: no partial rollouts, each response sampled whole from its iteration's weights, as "
                      f"verirl's")
        t.ignore(done_key, "read only with partial_rollout_max_split > 1")
        return
    t.decide(key, f"{split}: MindSpeed-RL cuts the longest responses and continues them in the next iterations with "
                  f"their weights (a response spans up to {split} versions), on the training devices; verirl continues "
                  f"a response on newer weights only on producers of its own (rollout.placement=separate, "
                  f"trainer.async_training.partial_rollout with mode bounded, docs/async.md): colocated, each step's "
                  f"responses are sampled whole from its weights")
    t.ignore(done_key, "whether a response at its last split must finish in that iteration: see "
                       "partial_rollout_max_split")


def translate(t: Translation) -> None:
    version, why = _version(t)
    if version == "pre-2.0":
        t.defaults.update(PRE2_DEFAULTS)
    _sampling_defaults(t)
    stage = t.get(_actor_key(t, "stage"))
    t.apply(DIRECT)
    _batches(t, version, why)
    _lengths(t)
    _multi_turn(t)
    _steps_and_warmup(t)
    _optimizer(t)
    _algo(t, stage, version)
    _partial_rollout(t)
    _reward(t, version)
    _data_and_model(t, version)
    _layout(t)
    _experts(t)
    fit_multi_turn(t, "MindSpeed-RL")
