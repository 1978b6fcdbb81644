"""veRL's `ppo_trainer` config -> verirl: the tables `verirl convert-config --from verl` reads.

Keys, defaults and meanings as of volcengine/verl main, January 2026, checked against verl-project/verl
at 1dda039b (2026-08-22: its _generated_ppo_trainer.yaml and _generated_ppo_megatron_trainer.yaml with the
overrides of examples/grpo_trainer/*.sh, tests/scripts/convert_peers.py; the reward section and
experimental/reward_loop/reward_loop.py's migration of the old one, the v1 trainer, distillation, skip)
(verl/trainer/config/ppo_trainer.yaml and its flattened _generated_ppo_trainer.yaml; the code paths
named in the notes: verl/trainer/ppo/ray_trainer.py, verl/trainer/main_ppo.py,
verl/workers/fsdp_workers.py, verl/workers/actor/dp_actor.py, verl/trainer/ppo/core_algos.py,
verl/trainer/ppo/rollout_corr_helper.py, verl/workers/reward_manager/dapo.py), and of its DAPO recipe
(recipe/dapo: dapo_trainer.yaml, dapo_ray_trainer.py, main_dapo.py; in verl-project/verl-recipe since
January 2026), and of its multi-turn rollouts (verl/workers/config/rollout.py: MultiTurnConfig, AgentLoopConfig;
verl/experimental/agent_loop/tool_agent_loop.py and tool_parser.py; verl/tools/function_tool.py; the
examples/sglang_multiturn configs of volcengine/verl at b178a3cd), and of its LoRA (verl-project/verl at 1dda039b:
verl/trainer/config/model/hf_model.yaml, verl/workers/config/model.py, verl/workers/engine/fsdp/transformer_impl.py's
peft adapters, verl/workers/config/megatron_peft.py's Megatron-Bridge ones, ray_trainer.py's ref_in_actor,
vllm_rollout/vllm_async_server.py; examples/tuning/lora/*.sh). Where an older veRL behaves differently and a
config may come from it, the note says so.

Its asynchronous trainers, checked against verl-project/verl at 1dda039b: the fully-async recipe
(verl/experimental/fully_async_policy: config/fully_async_ppo_trainer.yaml, fully_async_main.py,
fully_async_rollouter.py, fully_async_trainer.py, docs/advance/fully_async.md, the shell/ scripts; and its keys of
volcengine/verl at b178a3cd, January 2026), the one-step-off recipe (verl/experimental/one_step_off_policy) and the v1
trainer's colocate_async and separate_async modes (verl/trainer/ppo/v1: trainer_base.py, trainer_separate_async.py,
replay_buffer.py; docs/advance/v1_async_trainer.md): the ones with a rollout on GPUs of its own become
rollout.placement=separate with trainer.async_training (_async).

Three kinds of entries: `DIRECT` (one key to one key, with a conversion), the functions called by
`translate` (keys whose meaning depends on other keys: batch sizes, KL, clipping, steps, warm-up),
and `IGNORED` (glob, why) for what verirl needs no equivalent of. Anything else is "unknown".
veRL's defaults and ignored keys are data: verl.yaml beside this file (TRAINER_DEFAULTS holds those of its
asynchronous trainers that differ from ppo_trainer's).
"""
from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Optional

from verirl.tools.align.convert import (Direct, NeedsDecision, Translation, aux_scale_words, calls_per_turn_words,
                                       fit_experts, fit_multi_turn, megatron_lora_targets, model_parallel_fits,
                                       peer_tables, pipeline_stages, tool_config_rows)
from verirl.tools.align.convert_verl_rewards import reward_manager_key, translate_distillation, translate_rewards

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
REF = "actor_rollout_ref.ref."
M = "actor_rollout_ref.model."
MG = A + "megatron."
SP = "ulysses_sequence_parallel_size"
PL = A + "policy_loss."
RC = "algorithm.rollout_correction."
FG = "algorithm.filter_groups."

_TABLES = peer_tables("verl.yaml")
# veRL's defaults for the keys the translation reads; (glob, why) for the keys verirl needs no equivalent of,
# the first match wins; the loss modes verirl has no loss for.
DEFAULTS: dict[str, Any] = _TABLES["defaults"]
IGNORED: list[tuple[str, str]] = list(_TABLES["ignored"].items())
NO_LOSS_MODE: dict[str, str] = _TABLES["no_loss_mode"]
# veRL's multi_turn.format (its ToolParser registry, verl/experimental/agent_loop/tool_parser.py) -> verirl's
# rollout.multi_turn.parser of the same call format; the others have no verirl parser.
TOOL_FORMATS: dict[str, str] = _TABLES["tool_formats"]

# veRL's KL types, loss aggregations, advantage estimators and loss modes carry the names verirl's registries
# use (verirl.core.algo: KL_ESTIMATORS, AGGREGATIONS, ADVANTAGE_ESTIMATORS, POLICY_LOSSES): a name in the registry is
# verirl's of the same meaning, except these loss modes. veRL's vanilla applies the dual clip
# (compute_policy_loss_vanilla), which is verirl's dual_clip; verirl's vanilla has none.
RENAMED_LOSS_MODES = {"vanilla": "dual_clip"}


def _kl_type(v: str) -> str:
    from verirl.core.algo.kl import KL_ESTIMATORS

    if v not in KL_ESTIMATORS:
        raise NeedsDecision(f"kl_loss_type {v!r} has no verirl estimator (verirl: {', '.join(KL_ESTIMATORS)}; "
                            f"'full' and the straight-through '+' variants are not available); verirl's default "
                            f"low_var_kl is left")
    return v


def _loss_agg(v: str) -> str:
    from verirl.core.algo.loss import AGGREGATIONS

    if v not in AGGREGATIONS:
        raise NeedsDecision(f"loss_agg_mode {v!r} is not one of verirl's ({', '.join(AGGREGATIONS)}); verirl's "
                            f"token-mean is left")
    return v


def _top_k(v: Optional[int]) -> int:
    return 0 if v is None or v < 0 else int(v)


def _adv(v: str) -> str:
    from verirl.core.algo.advantages import ADVANTAGE_ESTIMATORS

    if v not in ADVANTAGE_ESTIMATORS:
        raise NeedsDecision(f"algorithm.adv_estimator={v!r}: verirl has {', '.join(ADVANTAGE_ESTIMATORS)} (no critic, "
                            f"so no GAE); grpo (verirl's default) is left")
    return v


def _loss_mode(mode: str) -> Optional[str]:
    """verirl's algo.policy_loss for veRL's loss_mode, None where verirl has no such loss."""
    from verirl.core.algo.loss import POLICY_LOSSES

    target = RENAMED_LOSS_MODES.get(mode, mode)
    return target if target in POLICY_LOSSES else None


DIRECT = [
    Direct("data.max_prompt_length", "data.max_prompt_length", note="tokens, the same cap"),
    Direct("data.max_response_length", "rollout.max_new_tokens",
           note="the response cap in tokens; both count a generated stop token inside it"),
    Direct(R + "n", "rollout.n", note="samples per prompt"),
    Direct(R + "temperature", "rollout.temperature"),
    Direct(R + "top_p", "rollout.top_p"),
    Direct(R + "top_k", "rollout.top_k", _top_k, note="vLLM's -1 (off) is verirl's 0"),
    Direct(A + "ppo_epochs", "actor.epochs", note="passes over each step's rollouts"),
    Direct(A + "entropy_coeff", "algo.entropy_coef", float),
    Direct(A + "loss_agg_mode", "algo.loss_agg_mode", _loss_agg),
    Direct(A + "optim.lr", "actor.lr", float),
    Direct(A + "optim.betas", "actor.betas", lambda v: [float(b) for b in v]),
    Direct(A + "optim.weight_decay", "actor.weight_decay", float,
           note="veRL's default is 0.01, verirl's 0.0: written either way"),
    Direct(M + "use_remove_padding", "actor.use_remove_padding",
           note="verirl packs sequences with cumulative lengths; veRL's default was false before 2025"),
    Direct("algorithm.adv_estimator", "algo.adv_estimator", _adv),
    Direct("trainer.val_before_train", "eval.before_train", bool),
    Direct(M + "path", "model.path", note="the other machine's path or hub id"),
]

# ---------------------------------------------------------------- derived keys

def _batches(t: Translation, kind: str) -> None:
    """Step, mini-batch and micro-batch sizes, and token budgets."""
    if kind == FULLY_ASYNC:
        _fully_async_batches(t)
    else:
        _step_batch(t)
    mini = t.get(A + "ppo_mini_batch_size")
    t.put("actor.mini_batch_prompts", mini, A + "ppo_mini_batch_size",
          note="prompts in both: veRL multiplies it by rollout.n inside its workers (ppo_mini_batch_size *= n), "
               "verirl counts prompts and says so")
    dynamic = bool(t.get(A + "use_dynamic_bsz"))
    micro_keys = (A + "ppo_micro_batch_size_per_gpu", A + "ppo_micro_batch_size")
    if dynamic:
        budget = t.get(A + "ppo_max_token_len_per_gpu")
        t.put("actor.max_token_len_per_device", budget, A + "use_dynamic_bsz", A + "ppo_max_token_len_per_gpu",
              note="use_dynamic_bsz: micro-batches of at most this many tokens per device in both")
        sp = _sequence_parallel(t)
        if sp > 1:
            t.note(A + "ppo_max_token_len_per_gpu",
                   f"with sequence parallelism {sp} veRL packs budget x {sp} tokens per micro-batch over the {sp} "
                   f"ranks (prepare_micro_batches), as verirl packs actor.max_token_len_per_device x "
                   f"actor.sequence_parallel_size: the budget carries over unchanged")
        for key in micro_keys:
            t.ignore(key, "with use_dynamic_bsz veRL sizes micro-batches by tokens (ppo_max_token_len_per_gpu)")
        if t.given(REF + "log_prob_max_token_len_per_gpu") and t.get(REF + "log_prob_max_token_len_per_gpu") != budget:
            t.put("ref.log_prob_max_token_len_per_device", t.get(REF + "log_prob_max_token_len_per_gpu"),
                  REF + "log_prob_max_token_len_per_gpu", note="the reference pass's token budget per device")
        else:
            t.translated(REF + "log_prob_max_token_len_per_gpu",
                         "the actor's budget, as verirl's ref.log_prob_max_token_len_per_device=0 takes it")
    else:
        t.ignore(A + "ppo_max_token_len_per_gpu", "read only with use_dynamic_bsz=true")
        t.ignore(REF + "log_prob_max_token_len_per_gpu", "read only with use_dynamic_bsz=true")
        if t.given(A + "use_dynamic_bsz"):
            t.translated(A + "use_dynamic_bsz", "false: micro-batches of ppo_micro_batch_size_per_gpu sequences, "
                                                "verirl's actor.micro_batch_size")
        per_gpu = t.get(micro_keys[0])
        if per_gpu is not None:
            t.put("actor.micro_batch_size", int(per_gpu), micro_keys[0],
                  note="sequences per forward/backward on one device in both")
            t.ignore(micro_keys[1], "ppo_micro_batch_size_per_gpu is set")
        elif t.get(micro_keys[1]) is not None:
            world = int(t.get("trainer.n_gpus_per_node")) * int(t.get("trainer.nnodes"))
            t.put("actor.micro_batch_size", max(1, int(t.get(micro_keys[1])) // world), micro_keys[1],
                  "trainer.n_gpus_per_node", "trainer.nnodes",
                  note=f"the deprecated global micro-batch, divided by the {world} devices as veRL does")


def _step_batch(t: Translation) -> None:
    """data.train_batch_size prompts per step, drawn in batches of data.gen_batch_size."""
    prompts = t.get("data.train_batch_size")
    t.put("data.prompts_per_step", prompts, "data.train_batch_size", note="prompts per step in both")
    if not t.given("data.gen_batch_size"):
        pass
    elif t.get("data.gen_batch_size") is None:
        t.translated("data.gen_batch_size", "null: veRL draws train_batch_size prompts per batch (ray_trainer.py)")
    elif t.get("data.gen_batch_size") == prompts:
        t.translated("data.gen_batch_size", "= train_batch_size: one batch of prompts per step, as verirl draws")
    else:
        t.decide("data.gen_batch_size", "veRL draws gen_batch_size prompts and trains on train_batch_size of them "
                                        "(DAPO's dynamic sampling): verirl draws and trains on data.prompts_per_step")


def _fully_async_batches(t: Translation) -> None:
    """veRL's fully-async trainer updates on require_batches x ppo_mini_batch_size prompts at a time, drawn one by one
    by its rollouter (fully_async_trainer.py: required_samples); it asserts train_batch_size 0 and gen_batch_size 1."""
    prompts = _step_prompts(t, FULLY_ASYNC)
    rb, mini = int(t.get(AT + "require_batches")), int(t.get(A + "ppo_mini_batch_size"))
    t.put("data.prompts_per_step", prompts, AT + "require_batches", A + "ppo_mini_batch_size",
          note=f"veRL's fully-async trainer updates on require_batches x ppo_mini_batch_size = {rb} x {mini} = "
               f"{prompts} prompts at a time: one verirl step")
    for key, want, what in (("data.train_batch_size", 0, "the prompts of an update are require_batches x "
                                                         "ppo_mini_batch_size (data.prompts_per_step)"),
                            ("data.gen_batch_size", 1, "the rollouter draws the prompts one at a time and streams "
                                                       "them; verirl's producer draws a step's prompts at once")):
        value = t.get(key)
        if value == want:
            t.translated(key, f"{want}, as veRL's fully-async rollouter asserts: {what}")
        else:
            t.decide(key, f"{value}: veRL's fully-async rollouter refuses anything but {want} (an assert); {what}")


def _step_prompts(t: Translation, kind: str) -> int:
    """The prompts of one verirl step: the fully-async trainer's update (require_batches x ppo_mini_batch_size), else
    data.train_batch_size."""
    if kind == FULLY_ASYNC:
        return int(t.get(AT + "require_batches")) * int(t.get(A + "ppo_mini_batch_size"))
    return int(t.get("data.train_batch_size"))


def _gen_batch(t: Translation, kind: str) -> int:
    """Prompts per generation batch: data.gen_batch_size, where null means train_batch_size (ray_trainer.py); the
    fully-async rollouter's stream is cut into updates of the step's prompts."""
    if kind == FULLY_ASYNC:
        return _step_prompts(t, kind)
    gen = t.get("data.gen_batch_size")
    return int(t.get("data.train_batch_size") if gen is None else gen)


def _kl(t: Translation) -> None:
    """KL: veRL's KL loss (use_kl_loss) is verirl's; its in-reward KL penalty has no verirl equivalent."""
    if bool(t.get(A + "use_kl_loss")):
        t.put("algo.kl_coef", float(t.get(A + "kl_loss_coef")), A + "use_kl_loss", A + "kl_loss_coef",
              note="the KL-to-reference term of the loss")
        try:
            kind = _kl_type(t.get(A + "kl_loss_type"))
            t.put("algo.kl_type", kind, A + "kl_loss_type",
                  note="the same estimator" + (" (k3, clamped to [-10, 10] in both)" if kind == "low_var_kl" else ""))
        except NeedsDecision as e:
            t.decide(A + "kl_loss_type", str(e))
    else:
        t.put("algo.kl_coef", 0.0, A + "use_kl_loss", note="no KL loss: verirl skips the reference pass")
        t.ignore(A + "kl_loss_coef", "use_kl_loss is false")
        t.ignore(A + "kl_loss_type", "use_kl_loss is false")
    if bool(t.get("algorithm.use_kl_in_reward")):
        t.decide("algorithm.use_kl_in_reward", "veRL subtracts a KL penalty from the reward; verirl has the KL loss "
                                               "only (algo.kl_coef): drop the penalty or move it to the loss")
        for key in ["algorithm.kl_penalty", *t.under("algorithm.kl_ctrl")]:
            t.ignore(key, "a setting of the in-reward KL penalty: see use_kl_in_reward")
    else:
        t.translated("algorithm.use_kl_in_reward", "false, as verirl (no KL in the reward)")
        for key in ["algorithm.kl_penalty", *t.under("algorithm.kl_ctrl")]:
            t.ignore(key, "use_kl_in_reward is false")


def _clip(t: Translation) -> None:
    """veRL clips at [1 - low, 1 + high], with low/high falling back to clip_ratio where null."""
    ratio = t.get(A + "clip_ratio")
    low, high = t.get(A + "clip_ratio_low"), t.get(A + "clip_ratio_high")
    for name, value in (("low", low), ("high", high)):
        key = A + f"clip_ratio_{name}"
        if value is None:
            t.put(f"algo.clip_ratio_{name}", float(ratio), A + "clip_ratio", key,
                  note=f"clip_ratio_{name} is null: veRL uses clip_ratio")
        else:
            t.put(f"algo.clip_ratio_{name}", float(value), key)
    if low is not None and high is not None:
        t.ignore(A + "clip_ratio", "veRL reads clip_ratio only where clip_ratio_low/high are null; they are set "
                                   "(veRL's defaults are 0.2 since April 2025)")
        if t.given(A + "clip_ratio") and not (t.given(A + "clip_ratio_low") and t.given(A + "clip_ratio_high")) \
                and float(ratio) != 0.2:
            t.warn(f"{A}clip_ratio={ratio} has no effect in veRL since April 2025 (clip_ratio_low/high default to "
                   f"0.2 and win): the translation uses 0.2, as veRL ran")


def _pl(t: Translation, name: str, fallback: float) -> float:
    """A policy_loss.* parameter as veRL's loss reads it (its code's fallback where the value is null)."""
    value = t.get(PL + name)
    return fallback if value is None else float(value)


def _policy_loss(t: Translation) -> None:
    """policy_loss.loss_mode and its parameters (core_algos.py, compute_policy_loss_*). veRL's vanilla loss is
    the dual-clip PPO loss, verirl's dual_clip; the other modes map by name where verirl has them."""
    mode_key, c_key = PL + "loss_mode", A + "clip_ratio_c"
    mode = t.get(mode_key)
    if mode != "vanilla":
        t.ignore(c_key, "the dual-clip bound: read by veRL's vanilla loss only")
    target = _loss_mode(mode)
    if target is None:
        from verirl.core.algo.loss import POLICY_LOSSES

        what = NO_LOSS_MODE.get(mode, "a policy loss verirl does not have")
        t.decide(mode_key, f"loss_mode {mode!r} ({what}) is not available in verirl (algo.policy_loss: "
                           f"{', '.join(POLICY_LOSSES)}); verirl's vanilla "
                           f"(the clipped loss without dual clip) is left")
        return
    if mode == "vanilla":
        c = float(t.get(c_key))
        t.put("algo.policy_loss", target, mode_key,
              note="veRL's vanilla loss (compute_policy_loss_vanilla) is the clipped surrogate with the dual clip of "
                   "clip_ratio_c: verirl's dual_clip (verirl's vanilla has no dual clip)")
        if c <= 1.0:
            t.decide(c_key, f"clip_ratio_c={c:g}: veRL's vanilla loss refuses a dual-clip bound <= 1 (an assert), "
                            f"verirl's dual_clip too: give one above 1 (verirl's 3.0 is left)")
        else:
            t.put("algo.clip_ratio_c", c, c_key, note="the dual-clip bound: for a negative advantage the loss is at "
                                                      "most -A x clip_ratio_c, in both")
        return
    t.put("algo.policy_loss", target, mode_key, note=f"veRL's {mode} loss (compute_policy_loss_{mode})")
    low_high = [k for name in ("low", "high") for k in t.out_from.get(f"algo.clip_ratio_{name}", [])]
    if mode == "gspo":
        t.note(mode_key, "the log of the sequence ratio is clamped at 10 above in veRL, to [-20, 20] in verirl: only "
                         "an extreme ratio tells them apart")
        for key in low_high:
            t.note(key, "written as veRL uses it: verirl's null would mean GSPO's own 3e-4 / 4e-4")
        agg_key, agg = A + "loss_agg_mode", t.get(A + "loss_agg_mode")
        t.put("algo.loss_agg_mode", "seq-mean-token-mean", mode_key,
              note="veRL's gspo aggregates its policy loss with seq-mean-token-mean whatever loss_agg_mode says")
        if agg != "seq-mean-token-mean":
            if t.out.get("algo.kl_coef", 0) or t.out.get("algo.entropy_coef", 0):
                t.decide(agg_key, f"with gspo veRL takes the policy loss's seq-mean-token-mean but aggregates the KL "
                                  f"and entropy terms with {agg}; verirl uses one mode for all three "
                                  f"(seq-mean-token-mean written)")
            else:
                t.note(agg_key, "not read by veRL's gspo policy loss, which is seq-mean-token-mean (written); it "
                                "would aggregate the KL and entropy terms, which are off")
    elif mode == "cispo":
        low, high = t.out.get("algo.clip_ratio_low", 0.2), t.out.get("algo.clip_ratio_high", 0.2)
        t.put("algo.clip_ratio_max", 1.0 + float(high), mode_key, *t.out_from.get("algo.clip_ratio_high", []),
              note="1 + clip_ratio_high: veRL's cap on the stop-gradient importance weight")
        t.decide(mode_key, f"veRL's cispo clamps the stop-gradient weight to [1 - clip_ratio_low, 1 + "
                           f"clip_ratio_high] = [{1 - low:g}, {1 + high:g}]; verirl's cispo caps it above only "
                           f"(algo.clip_ratio_max = {1 + high:g} written): a token whose ratio is below {1 - low:g} "
                           f"weighs its ratio in verirl, {1 - low:g} in veRL")
    elif mode == "clip_cov":
        for name, fallback in (("clip_cov_ratio", 0.0002), ("clip_cov_lb", 1.0), ("clip_cov_ub", 5.0)):
            t.put(f"algo.{name}", _pl(t, name, fallback), PL + name)
        t.note(mode_key, "the tokens whose gradient is cut are drawn at random among the candidates: veRL with the "
                         "global torch generator, verirl with one seeded by the batch's values, so the tokens cut "
                         "differ (not their number); veRL does not clamp the log-ratio, verirl clamps it to [-20, 20]")
    elif mode == "kl_cov":
        t.put("algo.kl_cov_ratio", _pl(t, "kl_cov_ratio", 0.0002), PL + "kl_cov_ratio")
        t.put("algo.ppo_kl_coef", _pl(t, "ppo_kl_coef", 1.0), PL + "ppo_kl_coef",
              note="veRL's default 0.1, verirl's 1.0: written either way")
        t.note(mode_key, "veRL does not clamp the log-ratio, verirl clamps it to [-20, 20]: only an extreme ratio "
                         "tells them apart")


def _loss_scale(t: Translation) -> None:
    """seq-mean-token-sum-norm's divisor (actor.loss_scale_factor) and the scale veRL's actor gives that loss."""
    key, agg_key = A + "loss_scale_factor", A + "loss_agg_mode"
    if t.out.get("algo.loss_agg_mode") != "seq-mean-token-sum-norm":
        t.ignore(key, "read by loss_agg_mode seq-mean-token-sum-norm only")
        return
    factor, impl = t.get(key), t.get("trainer.use_legacy_worker_impl")
    if factor is None:
        t.put("algo.loss_scale_factor", 0.0, key,
              note="null: veRL divides by the response tensor's width, which its rollout pads to "
                   "data.max_response_length; verirl's 0 means rollout.max_new_tokens, the same number")
    elif impl != "disable":
        t.put("algo.loss_scale_factor", 0.0, key)
        t.decide(key, f"loss_scale_factor={factor}: veRL's legacy actor workers (trainer.use_legacy_worker_impl="
                      f"{impl}, the default auto) do not hand it to the policy loss, which divides by the padded "
                      f"response width, data.max_response_length (only the logged entropy uses it): 0 (= "
                      f"rollout.max_new_tokens) written, as veRL ran; with use_legacy_worker_impl=disable it is "
                      f"{factor}")
    else:
        t.put("algo.loss_scale_factor", float(factor), key, "trainer.use_legacy_worker_impl",
              note="veRL's new engine workers divide by it, as verirl")
    micro = t.get(A + "ppo_micro_batch_size_per_gpu")
    scale = ("its loss is verirl's x the use_dynamic_bsz micro-batch's share of sequences, not a constant"
             if t.get(A + "use_dynamic_bsz") else
             f"with veRL's legacy actor (1 / gradient accumulation per micro-batch) its loss is verirl's x "
             f"ppo_micro_batch_size_per_gpu ({micro}): actor.grad_clip = grad_clip / {micro} clips as veRL does "
             f"(not written)")
    t.decide(agg_key, "seq-mean-token-sum-norm: veRL divides each micro-batch's token sum by the factor alone "
                      "(agg_loss), verirl by the factor x the mini-batch's sequences (TRL's dr_grpo): the same "
                      "direction and the same AdamW step except where grad clipping acts; " + scale)


def _advantages(t: Translation) -> None:
    """norm_adv_by_std_in_grpo -> algo.scale_rewards; veRL reads it in its GRPO estimators only."""
    est, key = t.get("algorithm.adv_estimator"), "algorithm.norm_adv_by_std_in_grpo"
    if est == "rloo":
        t.put("algo.scale_rewards", "none", "algorithm.adv_estimator",
              note="veRL's rloo never divides by a std (compute_rloo_outcome_advantage); verirl's rloo divides as "
                   "algo.scale_rewards says: none written")
        t.ignore(key, "read by veRL's GRPO estimators only")
    elif est == "reinforce_plus_plus_baseline":
        t.ignore(key, "read by veRL's GRPO estimators only; REINFORCE++-baseline whitens over the batch's tokens, "
                      "in both")
    else:
        t.put("algo.scale_rewards", "group" if t.get(key) else "none", key,
              note="true: divide by the group's std (GRPO); false: Dr. GRPO, no division (verirl's scale_rewards none)")


def _k1_bounds(spec: Any) -> tuple[float, float]:
    """veRL's *_k1 threshold ("lower_upper", or one upper with lower 1 / upper) -> (lower, upper)."""
    if isinstance(spec, bool) or spec is None:
        raise NeedsDecision("no threshold")
    if isinstance(spec, (int, float)):
        upper = float(spec)
        return 1.0 / upper, upper
    text = str(spec).strip()
    if "," in text:
        raise NeedsDecision(f"several thresholds ({text})")
    if "_" in text:
        lower, upper = (float(x) for x in text.split("_", 1))
        return lower, upper
    upper = float(text)
    return 1.0 / upper, upper


RS_K1 = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}


def _rollout_correction(t: Translation, k: int) -> None:
    """algorithm.rollout_correction (rollout_corr_helper.py). Off in veRL by default, on in verirl (rollout_rs
    sequence at 3.0): both modes are always written. ``k``: the max_staleness of the translation, which verirl
    trains with only under a correction."""
    is_key, rs_key, lp_key = RC + "rollout_is", RC + "rollout_rs", R + "calculate_log_probs"
    is_mode, rs_mode = t.get(is_key), t.get(rs_key)
    others = [RC + "rollout_is_threshold", RC + "rollout_rs_threshold", RC + "rollout_rs_threshold_lower",
              RC + "rollout_is_batch_normalize"]
    if is_mode is None and rs_mode is None:
        note = "null: veRL's default, off"
        if k:
            _staleness_correction(t, k, [is_key, rs_key], note)
        else:
            note += "; verirl's default rejects sequences (rollout_rs sequence, 3.0): null written"
            t.put("algo.rollout_correction.rollout_is", None, is_key, note=note)
            t.put("algo.rollout_correction.rollout_rs", None, rs_key, note=note)
        for key in others:
            t.ignore(key, "the correction is off")
        if k:
            t.translated(lp_key, "the rollout engine's log-probs, which verirl's correction compares with the "
                                 "trainer's: its native and vllm engines return them")
        else:
            t.ignore(lp_key, "rollout log-probs: only the rollout correction reads them, and it is off")
    elif not t.get(lp_key):
        why = (f"veRL corrects only with the rollout engine's log-probs, which it keeps only with {lp_key}=true (false "
               f"here): it ran without the correction")
        if k:
            _staleness_correction(t, k, [is_key, rs_key, lp_key], why)
        else:
            note = f"{why}; null written (verirl's default would reject sequences)"
            t.put("algo.rollout_correction.rollout_is", None, is_key, lp_key, note=note)
            t.put("algo.rollout_correction.rollout_rs", None, rs_key, lp_key, note=note)
        for key in others:
            t.ignore(key, "the correction does not run (calculate_log_probs is false)")
    else:
        t.translated(lp_key, "the rollout engine's log-probs, which the correction compares with the trainer's: "
                             "verirl's native and vllm engines return them")
        _rollout_is(t, is_mode)
        _rollout_rs(t, rs_mode)
        modes = [t.out.get(f"algo.rollout_correction.rollout_{name}") for name in ("is", "rs")]
        if k and not any(modes):
            _staleness_correction(t, k, [is_key, rs_key], "none of veRL's modes here is one verirl has")
    if t.get(RC + "bypass_mode"):
        t.decide(RC + "bypass_mode", "bypass mode: veRL takes the rollout's log-probs as the old policy's (no "
                                     "recomputation, loss_type's loss); verirl always recomputes them")
    else:
        t.ignore(RC + "bypass_mode", "false: the old log-probs are recomputed, as verirl does")
    for key, what in ((RC + "rollout_token_veto_threshold", "a per-token veto (veRL before January 2026)"),
                      (RC + "bypass_old_logprob_for_rollout", "bypass of the old log-prob pass (veRL, November 2025)"),
                      (RC + "use_pure_rollout_correction", "a pure policy-gradient loss (veRL, November 2025)"),
                      (RC + "use_policy_gradient", "a policy-gradient loss without clipping (veRL, late 2025)")):
        if t.get(key, None):
            t.decide(key, f"{what}: not available in verirl")
        else:
            t.ignore(key, "off")


def _rollout_is(t: Translation, mode: Optional[str]) -> None:
    key, thr_key = RC + "rollout_is", RC + "rollout_is_threshold"
    threshold = t.get(thr_key)
    if mode is None or threshold is None:
        t.put("algo.rollout_correction.rollout_is", None, key, *([thr_key] if mode is not None else []),
              note="no importance weights" + (" (veRL applies none without rollout_is_threshold)" if mode else ""))
        t.ignore(thr_key, "rollout_is is null")
    elif mode in ("token", "sequence"):
        t.put("algo.rollout_correction.rollout_is", mode, key,
              note="truncated importance weights exp(old - rollout log-prob), per token or per sequence, on the "
                   "policy loss, as veRL")
        lower, _, upper = str(threshold).strip().rpartition("_")
        t.put("algo.rollout_correction.rollout_is_threshold", float(upper), thr_key, note="the weights' cap")
        if lower:
            t.decide(thr_key, f"'{threshold}' is veRL's lower_upper form: veRL also raises a weight under {lower} to "
                              f"{lower}, verirl caps the weights above only (cap {upper} written)")
    else:
        t.put("algo.rollout_correction.rollout_is", None, key)
        t.decide(key, f"rollout_is {mode!r}: verirl has token and sequence; none written")
    if t.get(RC + "rollout_is_batch_normalize") and mode is not None:
        t.decide(RC + "rollout_is_batch_normalize", "veRL rescales the weights to mean 1 over the batch: verirl does "
                                                    "not")
    else:
        t.ignore(RC + "rollout_is_batch_normalize", "false (or no weights): raw truncated weights, as verirl")


def _rollout_rs(t: Translation, mode: Optional[str]) -> None:
    key, thr_key, low_key = RC + "rollout_rs", RC + "rollout_rs_threshold", RC + "rollout_rs_threshold_lower"
    if mode is None:
        t.put("algo.rollout_correction.rollout_rs", None, key, note="no rejection (verirl's default rejects: null "
                                                                    "written)")
        t.ignore(thr_key, "rollout_rs is null")
        t.ignore(low_key, "rollout_rs is null")
        return
    spec = t.get(thr_key)
    if spec is None:
        t.put("algo.rollout_correction.rollout_rs", None, key)
        t.decide(thr_key, "rollout_rs is set without rollout_rs_threshold, which veRL refuses: give the threshold "
                          "(null written meanwhile)")
        return
    if mode in ("token", "sequence", "geometric"):  # veRL of November-December 2025
        upper = float(spec)
        lower = t.get(low_key, None)
        lower = 1.0 / upper if lower is None else float(lower)
        target, how = mode, (f"rollout_rs_threshold_lower is null: veRL's lower bound is 1 / upper = {lower:g}, "
                             f"verirl's 0 would mean none; {lower:g} written" if t.get(low_key, None) is None
                             else "the ratio's lower bound")
        sources = [low_key] if t.given(low_key) else [thr_key]
        t.put("algo.rollout_correction.rollout_rs_threshold", upper, thr_key, note="the ratio's upper bound")
    elif mode in RS_K1:
        try:
            lo, hi = _k1_bounds(spec)
        except (NeedsDecision, ValueError) as e:
            t.put("algo.rollout_correction.rollout_rs", None, key)
            t.decide(thr_key, f"rollout_rs_threshold {spec!r} ({e}): one 'lower_upper' or one upper bound per "
                              f"option; null written")
            return
        target, lower, upper = RS_K1[mode], 1.0 / hi, 1.0 / lo
        how = (f"veRL keeps a ratio r when -log r lies in [log {lo:g}, log {hi:g}], i.e. r in [1/{hi:g}, 1/{lo:g}] "
               f"= [{lower:.6g}, {upper:.6g}] (the same interval when lower = 1 / upper): written as verirl's lower "
               f"and upper bounds")
        sources = [thr_key]
    else:
        t.put("algo.rollout_correction.rollout_rs", None, key)
        t.decide(key, f"rollout_rs {mode!r}: verirl rejects by the ratio of a token (token_k1), of a sequence "
                      f"(seq_sum_k1) or by its geometric mean (seq_mean_k1) only; the k2 / k3 divergences, max and "
                      f"chained options are not available; null written")
        return
    if not 0 <= lower < upper:
        t.put("algo.rollout_correction.rollout_rs", None, key)
        t.decide(thr_key, f"bounds [{lower:g}, {upper:g}] keep no ratio: null written")
        return
    t.put("algo.rollout_correction.rollout_rs", target, key,
          note=f"reject by the ratio exp(old - rollout log-prob) of a token / sequence / its geometric mean "
               f"({mode} -> {target})")
    if mode in RS_K1:
        t.put("algo.rollout_correction.rollout_rs_threshold", upper, *sources, note=how)
    t.put("algo.rollout_correction.rollout_rs_threshold_lower", lower, *sources, note=how)
    t.warn("rollout rejection: veRL removes a rejected token from the response mask, so it leaves the loss's token "
           "and sequence counts; verirl gives it weight 0 and keeps it in them (as TRL): the same tokens are "
           "rejected, the loss is divided by a larger count when any is")


def _filter_groups(t: Translation, kind: str) -> None:
    """DAPO's dynamic sampling (recipe/dapo/dapo_ray_trainer.py; verl.trainer.main_ppo does not read it)."""
    en_key, metric_key, max_key = FG + "enable", FG + "metric", FG + "max_num_gen_batches"
    if kind in RECIPES:
        for key in t.under(FG[:-1]):
            t.ignore(key, f"veRL's {kind} trainer does not read algorithm.filter_groups (its scripts pass it): no "
                          f"dynamic sampling")
        return
    if not t.get(en_key, False):
        if t.given(en_key):
            t.translated(en_key, "false: no dynamic sampling, as verirl's default")
        t.ignore(metric_key, "filter_groups is off")
        t.ignore(max_key, "filter_groups is off")
        return
    t.put("algo.filter_groups.enable", True, en_key,
          note="DAPO's dynamic sampling: groups whose metric is equal for every sample are dropped and more prompts "
               "generated (veRL's DAPO trainer, recipe/dapo; verl.trainer.main_ppo does not read it)")
    metric = t.get(metric_key, None)
    custom = t.get("custom_reward_function.path")
    if metric in ("seq_reward", "seq_final_reward"):
        t.put("algo.filter_groups.metric", "reward", metric_key,
              note="the sum of the token-level " + ("scores" if metric == "seq_reward" else "rewards (scores less "
                                                                                            "the in-reward KL)")
                   + ": the reward function's score plus the overlong penalty, verirl's total (reward)")
    elif metric in ("acc", "score") and custom is not None:
        name = str(t.get("custom_reward_function.name"))
        t.put("algo.filter_groups.metric", name, metric_key, "custom_reward_function.name",
              note=f"veRL's dapo reward manager records the function's score as {metric} (a number returned is both "
                   f"acc and score; a dict, its '{metric}' entry): verirl's rule of the function, named {name} (name "
                   f"your wrapper's rule here if it has another name)")
    else:
        t.put("algo.filter_groups.metric", "reward", metric_key)
        t.decide(metric_key, (f"metric {metric!r}: " if metric is not None else "null: veRL's DAPO trainer needs one; ")
                 + "verirl filters on the total (reward) or a rule's score; reward written: name a rule of "
                   "reward.verifiers if the other run filtered on one")
    max_b = int(t.get(max_key, 0) or 0)
    train = _step_prompts(t, kind)
    gen = _gen_batch(t, kind)
    end = "; at the limit veRL stops the run with an error, verirl trains the step on the groups it has"
    if max_b <= 0:
        t.put("algo.filter_groups.max_num_gen_batches", 0, max_key, note="no limit (veRL: non-positive)" + end)
    elif gen == train:
        t.put("algo.filter_groups.max_num_gen_batches", max_b, max_key, note="generation batches per step" + end)
    else:
        batches = -(-max_b * gen // train)
        t.put("algo.filter_groups.max_num_gen_batches", batches, max_key, "data.gen_batch_size",
              note=f"veRL generates data.gen_batch_size={gen} prompts per batch, verirl data.prompts_per_step={train}: "
                   f"{max_b} x {gen} prompts = {batches} batches of {train}" + end)


OVERLONG = (("reward.reward_kwargs.overlong_buffer_cfg.", "reward.reward_kwargs.max_resp_len"),
            ("reward_model.reward_kwargs.overlong_buffer_cfg.", "reward_model.reward_kwargs.max_resp_len"),
            ("reward_model.overlong_buffer.", None))
"""Where veRL configs hold DAPO's overlong penalty: reward_kwargs of the reward section (veRL after January 2026,
and the verl-recipe DAPO configs), reward_kwargs of reward_model (main_ppo's reward manager arguments
before), and the DAPO recipe's own reward_model.overlong_buffer (recipe/dapo until January 2026, which measures it
from data.max_response_length)."""


def _overlong(t: Translation) -> None:
    """DAPO's overlong penalty (workers/reward_manager/dapo.py): -factor x min(1, (L - (max - len)) / len) when
    positive, as verirl's reward.overlong_buffer."""
    found = [(prefix, max_key) for prefix, max_key in OVERLONG if t.under(prefix[:-1])]
    if not found:
        return
    (prefix, max_key), rest = found[0], found[1:]
    for other, _ in rest:
        for key in t.under(other[:-1]):
            t.decide(key, f"a second overlong-penalty section: {prefix[:-1]} is read")
    en_key, len_key, factor_key = prefix + "enable", prefix + "len", prefix + "penalty_factor"
    t.ignore(prefix + "log", "logs the overlong penalty: verirl logs it as the rule reward/overlong")
    if not t.get(en_key, False):
        if t.given(en_key):
            t.translated(en_key, "false: no overlong penalty, as verirl's default")
        for key in (len_key, factor_key, *([max_key] if max_key else [])):
            t.ignore(key, "the overlong penalty is off")
        return
    t.put("reward.overlong_buffer.enable", True, en_key,
          note="DAPO's soft overlong penalty, added to the score by veRL's dapo reward manager")
    length = int(t.get(len_key, 0) or 0)
    if length <= 0:
        t.decide(len_key, f"len {length}: veRL divides by it (a response in the buffer fails); verirl's 0 means a "
                          f"fifth of rollout.max_new_tokens: set reward.overlong_buffer.len")
    else:
        t.put("reward.overlong_buffer.len", length, len_key, note="the buffer in tokens: the penalty starts at "
                                                                  "max - len, in both")
    t.put("reward.overlong_buffer.penalty_factor", float(t.get(factor_key, 0.0) or 0.0), factor_key,
          note="the penalty at the response cap, in both")
    response = int(t.get("data.max_response_length"))
    if max_key is None:
        t.translated("data.max_response_length", "the DAPO recipe measures the overlong buffer from it, verirl from "
                                                 "rollout.max_new_tokens, the same number")
    else:
        max_len = t.get(max_key, None)
        if max_len is None:
            t.decide(max_key if t.given(max_key) else en_key,
                     f"{max_key} is not set: veRL's dapo reward manager refuses the overlong buffer without it; "
                     f"verirl measures the buffer from rollout.max_new_tokens ({response})")
        elif int(max_len) != response:
            t.decide(max_key, f"veRL measures the buffer from max_resp_len {max_len}, verirl from "
                              f"rollout.max_new_tokens ({response}): the penalty starts at another length")
        else:
            t.translated(max_key, "= data.max_response_length: the buffer is measured from rollout.max_new_tokens, as "
                                  "verirl's", ["reward.overlong_buffer.len"])
    key = reward_manager_key(t)
    if key is not None and t.get(key) != "dapo":
        t.decide(key, f"reward manager {t.get(key)!r}: only veRL's dapo manager applies the overlong penalty "
                      f"(written enabled, as the config asks)")


def _optimizer(t: Translation) -> None:
    name = str(t.get(A + "optim.optimizer"))
    if name.lower() == "adamw":
        t.translated(A + "optim.optimizer", "AdamW, as verirl's")
    elif name.lower() == "adam" and t.get(A + "strategy") == "megatron":
        t.translated(A + "optim.optimizer", "Megatron's adam decouples the weight decay: AdamW, as verirl's")
    else:
        t.decide(A + "optim.optimizer", f"optimizer {name!r}: verirl trains with AdamW")
    legacy, new = A + "grad_clip", A + "optim.clip_grad"
    if t.given(legacy) and t.given(new) and t.get(legacy) != t.get(new):
        t.warn(f"{legacy}={t.get(legacy)} and {new}={t.get(new)} differ: veRL's legacy workers read grad_clip, its "
               f"new engine optim.clip_grad; the translation takes grad_clip")
    key = legacy if t.given(legacy) or not t.given(new) else new
    t.put("actor.grad_clip", float(t.get(key)), key, note="max global gradient norm")
    if key == legacy and t.given(new):
        t.translated(new, "see grad_clip")
    schedule = t.get(A + "optim.warmup_style") or t.get(A + "optim.lr_scheduler_type")
    sched_key = A + ("optim.warmup_style" if t.get(A + "optim.warmup_style") else "optim.lr_scheduler_type")
    if schedule == "constant":
        t.translated(sched_key, "constant after the warm-up, as verirl's")
        t.ignore(A + "optim.warmup_style", "deprecated name of lr_scheduler_type")
    else:
        t.decide(sched_key, f"lr schedule {schedule!r}: verirl keeps the lr constant after the warm-up")
    style = t.get(A + "optim.lr_decay_style", None)  # the Megatron optimizer's own schedule
    if style is not None:
        if style == "constant":
            t.translated(A + "optim.lr_decay_style", "constant after the warm-up, as verirl's")
        else:
            t.decide(A + "optim.lr_decay_style", f"lr_decay_style {style!r}: verirl keeps the lr constant after the "
                                                 f"warm-up")
    init = t.get(A + "optim.lr_warmup_init", None)
    if init is not None:
        if float(init) == 0:
            t.translated(A + "optim.lr_warmup_init", "the warm-up starts from 0, as verirl's")
        else:
            t.decide(A + "optim.lr_warmup_init", f"the warm-up starts from {init}: verirl's starts from 0")


def _steps(t: Translation, kind: str) -> Optional[int]:
    """trainer.total_steps: total_training_steps, else total_epochs x batches per epoch (needs the rows)."""
    if kind == FULLY_ASYNC:
        return _fully_async_steps(t)
    steps_key, epochs_key = "trainer.total_training_steps", "trainer.total_epochs"
    batch = _gen_batch(t, kind)
    if t.get(steps_key) is not None:
        steps = int(t.get(steps_key))
        t.put("trainer.total_steps", steps, steps_key, note="GRPO steps, one rollout each, in both")
        t.ignore(epochs_key, "total_training_steps is set, and wins over total_epochs in veRL")
        return steps
    t.ignore(steps_key, "null: the steps come from total_epochs")
    epochs, rows = int(t.get(epochs_key)), t.options.train_rows
    if rows is None:
        t.decide(epochs_key, "veRL counts epochs; verirl counts steps = total_epochs x floor(rows / "
                             "train_batch_size) (veRL's data loader drops the last partial batch): pass "
                             "--train-rows N (the rows left after veRL's overlong-prompt filter), or set "
                             "trainer.total_steps")
        return None
    per_epoch = rows // batch
    if per_epoch == 0:
        from verirl.core.errors import ConfigError

        raise ConfigError(f"--train-rows {rows} is less than one batch of data.train_batch_size={batch} prompts: "
                          f"veRL would run 0 steps. Give the number of training rows.")
    steps = epochs * per_epoch
    t.put("trainer.total_steps", steps, epochs_key,
          note=f"{epochs} epochs x floor({rows} rows / {batch}) = {epochs} x {per_epoch} steps (--train-rows)")
    if epochs > 1 and rows % batch:
        t.warn(f"veRL drops the last {rows % batch} rows of each epoch (drop_last); verirl's prompt order runs on "
               f"across epochs, so from epoch 2 its steps draw other prompts than veRL's. For identical steps use a "
               f"row count divisible by {batch}")
    return steps


def _fully_async_steps(t: Translation) -> Optional[int]:
    """The fully-async rollouter draws min(rollout.total_rollout_steps, rows x total_epochs) prompts
    (fully_async_rollouter.py), the trainer updates on data.prompts_per_step of them at a time."""
    per_step, total_key = _step_prompts(t, FULLY_ASYNC), "rollout.total_rollout_steps"
    t.ignore("trainer.total_training_steps", "not read by veRL's fully-async trainer: its updates follow "
                                             "rollout.total_rollout_steps")
    epochs_keys = ["trainer.total_epochs", *(["rollout.total_epochs"] if t.given("rollout.total_epochs") else [])]
    epochs = min(int(t.get(k)) for k in epochs_keys)  # volcengine/verl of January 2026 loops over rollout.total_epochs
    total, rows = t.get(total_key), t.options.train_rows
    prompts = [int(total)] if total is not None else []
    if rows is not None:
        prompts.append(rows * epochs)
    if not prompts:
        t.decide(total_key, "null: veRL's rollouter draws rows x total_epochs prompts: pass --train-rows N, or set "
                            "trainer.total_steps")
        return None
    drawn = min(prompts)
    steps = drawn // per_step
    if steps == 0:
        from verirl.core.errors import ConfigError

        raise ConfigError(f"{total_key}={total} (with --train-rows {rows}: {drawn} prompts) is less than one update of "
                          f"require_batches x ppo_mini_batch_size = {per_step} prompts: veRL would train 0 steps. Give "
                          f"the prompts of the run.")
    used = [total_key] if total is not None and drawn == int(total) else [*epochs_keys]
    t.put("trainer.total_steps", steps, *used,
          note=f"the rollouter draws {drawn} prompts"
               + ("" if total is None or drawn == int(total) else f" ({rows} rows x {epochs} epochs, fewer than "
                                                                  f"{total_key}={total})")
               + f", the trainer updates on {per_step} at a time: floor({drawn} / {per_step}) = {steps} steps")
    if rows is None:
        t.note(total_key, f"veRL stops sooner where the data's rows x total_epochs ({epochs}) is under {total}: pass "
                          f"--train-rows N to check")
    for key in epochs_keys:
        if key not in used:
            t.translated(key, f"rows x {epochs} epochs is not under {total_key}: the rollouter stops at {total}"
                         if rows is not None else f"the rollouter also stops after {epochs} epochs of the data")
    if total is not None and total_key not in used:
        t.translated(total_key, f"over the {drawn} prompts of {rows} rows x {epochs} epochs, where the rollouter stops")
    return steps


def _scheduler(t: Translation, kind: str, steps: Optional[int]) -> tuple[int, str, Optional[int], str]:
    """veRL's lr scheduler, which steps once per update_actor call: (optimizer steps per scheduler step, what a
    scheduler step is, the scheduler's horizon where verirl's step count is known, what it counts). A scheduler step
    is a step of the classic and v1 sync trainers; an update of the fully-async trainer, whose horizon is its
    parameter versions (set_total_train_steps); a mini-batch of v1 separate_async, whose horizon is steps x
    parameter_sync_step (trainer_base.py)."""
    epochs, mini = int(t.get(A + "ppo_epochs")), int(t.get(A + "ppo_mini_batch_size"))
    if kind == FULLY_ASYNC:
        every = int(t.get(AT + "trigger_parameter_sync_step"))
        return (int(t.get(AT + "require_batches")) * epochs, "update", None if steps is None else steps // every,
                f"parameter versions (the fully-async trainer's horizon: {steps} steps / trigger_parameter_sync_step "
                f"{every})")
    if kind == "separate_async":
        sync = int(t.get(V1 + "separate_async.parameter_sync_step"))
        return (epochs, "mini-batch", None if steps is None else steps * sync,
                f"mini-batches (separate_async's horizon: {steps} steps x parameter_sync_step {sync})")
    return (_step_prompts(t, kind) // mini) * epochs, "step", steps, "steps"


def _warmup(t: Translation, steps: Optional[int], kind: str) -> None:
    """veRL warms up over RL steps (its scheduler steps once per update_actor call); verirl over optimizer steps."""
    ratio_key, steps_key = A + "optim.lr_warmup_steps_ratio", A + "optim.lr_warmup_steps"
    per_step, unit, horizon, counts = _scheduler(t, kind, steps)
    units, per = {"step": ("veRL steps", "train_batch_size / ppo_mini_batch_size x ppo_epochs"),
                  "update": ("updates", "require_batches x ppo_epochs"),
                  "mini-batch": ("mini-batches", "ppo_epochs")}[unit]
    explicit = t.get(steps_key)
    ratio = float(t.get(ratio_key))
    if explicit is not None and int(explicit) > 0:
        rl_steps, source = int(explicit), steps_key
        t.ignore(ratio_key, "lr_warmup_steps is set, and wins over the ratio in veRL")
        how = f"{rl_steps} {units}"
    elif ratio > 0:
        if horizon is None:
            t.decide(ratio_key, f"a warm-up of {ratio:g} of the run's steps, which are not known (epochs without "
                                f"--train-rows): set actor.warmup_steps = {ratio:g} x total steps x {per_step} "
                                f"optimizer steps per step")
            t.warn(f"warm-up left as a ratio ({ratio:g}): actor.warmup_steps is not written until the step count is "
                   f"known")
            t.ignore(steps_key, "unset (-1): the ratio applies")
            return
        rl_steps, source = int(ratio * horizon), ratio_key
        how = f"int({ratio:g} x {horizon} {counts}) = {rl_steps} {units}"
        t.ignore(steps_key, "unset (-1): the ratio applies")
    else:
        if t.given(ratio_key) or t.given(steps_key):
            t.put("actor.warmup_steps", 0, *[k for k in (ratio_key, steps_key) if t.given(k)], note="no warm-up")
        return
    t.put("actor.warmup_steps", rl_steps * per_step, source,
          note=f"{how} x {per_step} optimizer steps per {unit} ({per}); veRL holds the lr for a whole {unit} and "
               f"starts at 0, verirl ramps per optimizer step from lr/warmup")


def _data(t: Translation) -> None:
    files = t.get("data.train_files", None)
    if files is None:
        t.check("data.train_files is not set: point data.train_path at the training parquet")
    else:
        listed = list(files) if isinstance(files, (list, tuple)) else [files]
        t.put("data.train_path", str(listed[0]), "data.train_files", note="the other machine's path")
        t.put("data.handler_name", "VerlParquetHandler", "data.train_files",
              note="veRL's rows: chat-message prompt, reward_model.ground_truth, data_source, ability")
        t.put("data.prompt_type", "tokenizer", "data.train_files", note="veRL applies the tokenizer's chat template")
        if len(listed) > 1:
            t.decide("data.train_files", f"{len(listed)} files; verirl reads one file or folder: put them in one "
                                         f"folder and point data.train_path at it (the first file stands in)")
        t.check(f"data.train_path ({listed[0]}) is the other machine's: copy the data and point it at the copy")
    val = t.get("data.val_files", None)
    if val is not None:
        listed = list(val) if isinstance(val, (list, tuple)) else [val]
        t.put("eval.data", str(listed[0]), "data.val_files", note="the other machine's path")
        if len(listed) > 1:
            t.decide("data.val_files", f"{len(listed)} files; verirl evaluates one file or folder (the first "
                                       f"stands in)")
    key = t.get("data.prompt_key")
    if key != "prompt":
        t.put("data.map_keys", {"prompt": key}, "data.prompt_key", note="the column holding the prompt")
    else:
        t.translated("data.prompt_key", "'prompt', the VerlParquetHandler's default")
    shuffle = bool(t.get("data.shuffle"))
    t.put("data.shuffle", "verl" if shuffle else "sequential", "data.shuffle",
          note="verl: torch RandomSampler with a seeded generator, veRL's order" if shuffle else
          "false: the file's order (veRL's SequentialSampler)")
    seed = t.get("data.seed")
    if not shuffle:
        t.ignore("data.seed", "data.shuffle is false: no seed orders the prompts")
    elif seed is None:
        t.put("data.seed", 1, "data.seed")
        t.decide("data.seed", "veRL before October 2025 seeded the order with 1 when data.seed was absent "
                              "(written: 1); "
                              "since then an absent or null seed leaves veRL's order unseeded, a different order each "
                              "run, which no other run can match step by step")
    else:
        t.put("data.seed", int(seed), "data.seed", note="seeds the sampler's generator, as veRL does")
    t.put("data.too_long", "filter" if t.get("data.filter_overlong_prompts") else "error",
          "data.filter_overlong_prompts", note="drop prompts over data.max_prompt_length (filter), or refuse (error)")
    trunc = t.get("data.truncation")
    if trunc == "error":
        t.translated("data.truncation", "error: verirl never truncates a prompt either")
    else:
        t.decide("data.truncation", f"veRL truncates over-long prompts ({trunc}); verirl never does: it drops them "
                                    f"(data.too_long=filter) or refuses (error)")
    for key in ("data.tokenizer", "data.custom_cls.path", "data.sampler.class_path", "data.datagen.path"):
        if t.get(key, None) is not None:
            t.decide(key, f"{key} is set ({t.get(key)}): verirl has no such hook; make the data and order match "
                          f"by hand")
    for key in [k for k in ["data.apply_chat_template_kwargs", *t.under("data.apply_chat_template_kwargs")]
                if t.values.get(k) not in (None, {})]:
        t.decide(key, "extra chat-template arguments (e.g. enable_thinking): check that "
                                                    "verirl's template gives the same prompt ids")
    if int(t.get("data.train_max_samples", -1) or -1) > 0:
        t.decide("data.train_max_samples", "veRL trains on the first N rows: cut the file to them")


# Megatron's transformer-config keys that move layers between pipeline stages (placement, not maths), and what each
# does to the split.
STAGE_SPLIT = {
    "num_layers_in_first_pipeline_stage": "the first stage holds this many decoder layers, the middle stages split "
                                          "the rest evenly",
    "num_layers_in_last_pipeline_stage": "the last stage holds this many decoder layers, the middle stages split the "
                                         "rest evenly",
    "account_for_embedding_in_pipeline_split": "the embedding counts as one layer of the first stage's share",
    "account_for_loss_in_pipeline_split": "the output layer and loss count as one layer of the last stage's share",
    "pipeline_model_parallel_layout": "each stage's layers, stages split by '|' (E the embedding, t a decoder layer, "
                                      "L the loss)",
}


def _layout_layers(layout: str) -> list[int]:
    """Decoder layers per stage of Megatron's pipeline_model_parallel_layout in its plain form ('Et*3|t*3|tL'); raises
    ValueError for what the plain form does not cover (parentheses, MTP layers 'm', unknown letters)."""
    import re

    stages = []
    for stage in str(layout).replace(" ", "").split("|"):
        parts = re.findall(r"([EtL])(?:\*(\d+))?", stage)
        if "".join(f"{kind}*{n}" if n else kind for kind, n in parts) != stage:
            raise ValueError(f"stage {stage!r}")
        stages.append(sum(int(n or 1) for kind, n in parts if kind == "t"))
    return stages


def _stage_split(t: Translation, key: str, leaf: str) -> None:
    """A Megatron override of how the layers split over the pipeline stages, as verirl's actor.pipeline_layers (each
    stage's decoder layers): the plain pipeline_model_parallel_layout names them; the other overrides give part of
    the split, whose rest needs the model's layer count (config.json, not in veRL's config)."""
    from verirl.models.pipeline import stages_per_rank

    value, pp = t.get(key), t.out.get("actor.pipeline_parallel_size", 1)
    stages = pp * stages_per_rank(t.out.get("actor.pipeline_schedule", "1f1b"))
    if pp == 1:
        t.ignore(key, "read only with pipeline parallelism, which is off")
    elif value is False or value is None:
        t.ignore(key, f"{'false' if value is False else 'null'}: Megatron splits the decoder layers alone, as verirl")
    elif leaf == "pipeline_model_parallel_layout":
        try:
            layers = _layout_layers(value)
        except ValueError as e:
            t.decide(key, f"{leaf}={value}: {STAGE_SPLIT[leaf]}; {e} is not in the plain form read here (E, t, L and "
                          f"*N per stage): write each stage's decoder layers as actor.pipeline_layers, {stages} "
                          f"numbers (the even split is left; placement, not maths)")
            return
        if len(layers) != stages or min(layers) < 1:
            t.decide(key, f"{leaf}={value}: {len(layers)} stages of {layers} decoder layers; verirl runs {stages} "
                          f"stages of at least one: write actor.pipeline_layers (the even split is left)")
            return
        t.put("actor.pipeline_layers", layers, key,
              note=f"{STAGE_SPLIT[leaf]}: the decoder layers of each stage, first to last; verirl train checks that "
                   f"they sum to config.json's num_hidden_layers")
    else:
        t.decide(key, f"{leaf}={value}: {STAGE_SPLIT[leaf]} in Megatron; verirl's stages split the layers evenly "
                      f"(actor.pipeline_layers [], left) or as actor.pipeline_layers lists them, {stages} numbers "
                      f"that sum to config.json's num_hidden_layers: write the same split there (placement, not "
                      f"maths)")


def _model(t: Translation) -> None:
    path = t.get(M + "path", None)
    if path is not None:
        t.check(f"model.path ({path}) is the other machine's path or a hub id: run `verirl doctor` on both copies "
                f"(EOS / pad / BOS ids, rms_norm_eps, rope_theta, vocabulary size)")
    overrides, sources = {}, []
    for key in t.under(M + "override_config"):
        name = key[len(M + "override_config."):]
        if t.get(key) == {} or name.startswith("moe_config."):
            t.ignore(key, "empty, or MoE router settings: nothing of the model's numerics")
            continue
        overrides[name] = t.get(key)
        sources.append(key)
    if overrides:  # the same key, the same meaning: values that replace the model's config.json at load
        t.put("model.override_config", overrides, *sources)
        t.check(f"veRL's run overrides the model's config.json ({', '.join(f'{k}={v}' for k, v in overrides.items())}); "
                f"model.override_config carries them. A key the model's config does not have is refused at load.")
    for key in t.under(A + "megatron.override_transformer_config"):
        leaf = key.rsplit(".", 1)[1]
        if leaf in STAGE_SPLIT:
            _stage_split(t, key, leaf)
        elif leaf in MOE_LOSS:
            continue  # _experts'
        elif not any(fnmatchcase(key, pattern) for pattern, _ in IGNORED if "override_transformer_config" in pattern):
            t.decide(key, f"a Megatron transformer-config override ({leaf}={t.get(key)}): if it changes the model's "
                          f"numerics, set the same in model.override_config (check with `verirl doctor`)")
    _lora(t)
    for key in (M + "custom_chat_template", M + "tokenizer_path", M + "hf_config_path"):
        if t.get(key, None) is not None:
            t.decide(key, f"{key} is set: make verirl's tokenizer and template give the same ids (`verirl doctor`)")
    t.check("tokenizer ids: EOS, pad and BOS must agree between the two runs' tokenizers and configs (`verirl doctor`; "
            "an EOS equal to pad is stripped as padding and training collapses)")


LORA = M + "lora."  # veRL's Megatron engine's LoRA (Megatron-Bridge's settings)
# The rest of model.lora.*, each an ignored row with what it is (none changes the maths).
_LORA_MECHANICS = {
    "merge": "how veRL hands the adapters to vLLM: merged into the weights (true) or as a LoRA adapter (false); "
             "verirl's vLLM engine gets them as a LoRA request, its native engine merges them as it lays the "
             "weights out: the same policy sampled either way",
    "a2a_experimental": "Megatron-Bridge's all-to-all communication of the adapters: placement, not maths",
    "fully_sharded_loras": "a vLLM LoRA kernel setting",
    "freeze_vision_model": "vision-language models (type vlm_lora) only",
    "freeze_vision_projection": "vision-language models (type vlm_lora) only",
    "freeze_language_model": "vision-language models (type vlm_lora) only"}


def _adapter_words(path: Any) -> str:
    return (f"{path}: veRL continues training this LoRA adapter (its reference: the base without it); verirl starts "
            f"its adapters at B = 0 and loads no adapter to train on (trainer.resume continues verirl's own LoRA "
            f"checkpoints): model.path={path} would load its base with the adapter merged, verirl's adapters on top "
            f"and the reference the merged model; not written")


def _lora(t: Translation) -> None:
    """veRL's LoRA. Its FSDP engine puts peft's LoRA layers on the Hugging Face model from model.lora_rank,
    lora_alpha, target_modules, exclude_modules (workers/engine/fsdp/transformer_impl.py), as verirl does; its Megatron
    engine Megatron-Bridge's from model.lora.* (workers/config/megatron_peft.py). Either way the reference is the actor
    with its adapters off (ray_trainer.py's ref_in_actor), as verirl's."""
    if _megatron(t):
        _megatron_lora(t)
        if not t.get(M + "lora_rank"):
            t.ignore(M + "lora_rank", "0: the FSDP engine's LoRA is off")
        for key in (M + "lora_rank", M + "lora_adapter_path"):
            if t.get(key, None):
                t.decide(key, f"{key}={t.get(key)}: veRL's Megatron engine reads model.lora.* (rank, adapter_path), "
                              f"not this, while its trainer then takes the reference from the actor: set "
                              f"actor.lora.* for what the run was meant to train (not written)")
        return
    on = _fsdp_lora(t)
    for key in t.under(LORA[:-1]):
        leaf = key[len(LORA):]
        if leaf == "rank" and int(t.get(key) or 0) > 0:
            t.decide(key, f"lora.rank={t.get(key)}: read by veRL's Megatron engine (and its vLLM rollout, which then "
                          f"expects adapters); its FSDP engine trains the adapters of model.lora_rank: set "
                          f"actor.lora.rank for what the run was meant to train (not written)")
        elif on and leaf in ("merge", "fully_sharded_loras"):
            t.ignore(key, _LORA_MECHANICS[leaf])
        elif on:
            t.ignore(key, "Megatron-Bridge's LoRA settings, read by veRL's Megatron engine only (its FSDP engine takes "
                          "model.lora_rank, lora_alpha, target_modules)")


def _fsdp_lora(t: Translation) -> bool:
    """model.lora_rank & co. (veRL's FSDP engine); whether LoRA is on."""
    rank_key, path_key = M + "lora_rank", M + "lora_adapter_path"
    path = t.get(path_key, None)
    if path is not None:
        t.decide(path_key, _adapter_words(path))
    rank = int(t.get(rank_key) or 0)
    if rank <= 0:
        t.ignore(rank_key, "0: LoRA is off, every weight trained (verirl's actor.lora.rank 0)")
        return False  # the other LoRA keys: the ignore table's "LoRA is off"
    t.put("actor.lora.rank", rank, rank_key,
          note="the adapters' rank; veRL's FSDP engine puts peft's LoRA layers on the Hugging Face model as verirl "
               "does (A Kaiming-uniform, B zero: peft's default, verirl's actor.lora.init true; no dropout, verirl's "
               "default), and takes the reference from the actor with its adapters off, as verirl")
    t.put("actor.lora.alpha", float(t.get(M + "lora_alpha")), M + "lora_alpha",
          note="peft's lora_alpha in both: the adapters' scale is alpha / rank")
    key = M + "target_modules"
    targets = t.get(key)
    if isinstance(targets, str) and targets.strip() != "all-linear":
        t.decide(key, f"{targets!r}: a string other than all-linear is a regular expression peft matches against each "
                      f"module's full name; verirl's actor.lora.target_modules takes all-linear or a list of the "
                      f"layers' names: write the layers it matches (verirl's all-linear left)")
    elif isinstance(targets, str):
        t.put("actor.lora.target_modules", "all-linear", key,
              note="peft's all-linear in both: every linear layer but the output layer")
    elif isinstance(targets, (list, tuple)) and targets and all(
            isinstance(n, str) and n.isidentifier() for n in targets):
        t.put("actor.lora.target_modules", list(targets), key, note="the layers' names, peft's target_modules in both")
    else:
        t.decide(key, f"{targets!r}: peft matches each name against the end of a module's full name; verirl's "
                      f"actor.lora.target_modules takes the layers' own names (q_proj, down_proj, ...): write them "
                      f"(verirl's all-linear left)")
    for key, what in ((M + "exclude_modules", "layers peft leaves without adapters"),
                      (M + "target_parameters", "parameters (not linear layers) peft adapts, e.g. MoE experts' fused "
                                                "weights")):
        value = t.get(key, None)
        if value:
            t.decide(key, f"{value!r}: {what}; verirl's adapters sit on the linear layers actor.lora.target_modules "
                          f"names, with no exclusions: list the layers to adapt there (not written)")
        else:
            t.ignore(key, f"{'null' if value is None else value}: none")
    t.ignore(R + "layered_summon", "how veRL gathers the FSDP-sharded adapters for its vLLM push (layer by layer, "
                                   "less memory): verirl pushes the adapters whole; memory, not maths")
    return True


def _megatron_lora(t: Translation) -> None:
    """Megatron-Bridge's LoRA (model.lora.*, on when rank > 0): type lora puts one adapter on each of Megatron's fused
    layers, canonical_lora on each part; A xavier-normal or kaiming (peft's), B zero; scale alpha / rank."""
    rank = int(t.get(LORA + "rank") or 0)
    if rank <= 0:
        return  # every model.lora.* key: the ignore table's "LoRA is off (lora.rank 0)"
    kind = str(t.get(LORA + "type"))
    t.put("actor.lora.rank", rank, LORA + "rank",
          note="the adapters' rank; the reference is the actor with its adapters off in both")
    t.put("actor.lora.alpha", float(t.get(LORA + "alpha")), LORA + "alpha",
          note="the adapters' scale is alpha / rank in both (Megatron-Bridge's default alpha is 32, verirl's 16)")
    if kind == "canonical_lora":
        t.translated(LORA + "type", "an adapter on each of the query, key, value, gate and up projections, as verirl's")
    elif kind == "lora":
        if t.given(LORA + "type"):
            t.translated(LORA + "type", "one adapter on each of Megatron's fused layers: see target_modules")
    else:
        t.decide(LORA + "type", f"{kind}: verirl's adapters are plain LoRA (no DoRA, no vision-language variant): "
                                f"plain LoRA written")
    megatron_lora_targets(t, LORA + "target_modules", t.get(LORA + "target_modules"),
                          "veRL's Megatron engine (Megatron-Bridge's type lora)")
    dropout = float(t.get(LORA + "dropout") or 0.0)
    if t.given(LORA + "dropout") or dropout > 0:
        t.put("actor.lora.dropout", dropout, LORA + "dropout", note="dropout on the adapters' input while training")
    position = t.get(LORA + "dropout_position")
    if dropout <= 0:
        t.ignore(LORA + "dropout_position", "no dropout")
    elif position == "pre":
        t.translated(LORA + "dropout_position", "on the adapter's input, as verirl's", ["actor.lora.dropout"])
    else:
        t.decide(LORA + "dropout_position", f"{position}: Megatron-Bridge drops the adapter's output, verirl its input "
                                            f"(actor.lora.dropout)")
    a_init, b_init = t.get(LORA + "lora_A_init_method"), t.get(LORA + "lora_B_init_method")
    if a_init == "kaiming":
        t.put("actor.lora.init", "true", LORA + "lora_A_init_method",
              note="A Kaiming-uniform (a = sqrt 5), B zero: peft's default in both")
    else:
        t.decide(LORA + "lora_A_init_method",
                 f"{a_init}: Megatron-Bridge draws A {'Xavier-normal' if a_init == 'xavier' else f'by {a_init}'}; "
                 f"verirl's actor.lora.init is peft's: true (Kaiming-uniform, left), gaussian or orthogonal; B zero "
                 f"in all, so the start is the base either way, the steps after it differ")
    if b_init == "zero":
        if t.given(LORA + "lora_B_init_method"):
            t.translated(LORA + "lora_B_init_method", "B zero: the adapted model starts as the base, as verirl's")
    else:
        t.decide(LORA + "lora_B_init_method", f"{b_init}: verirl starts every adapter at B A = 0 (the reference is the "
                                              f"base with the adapters off)")
    for leaf, value in (("exclude_modules", t.get(LORA + "exclude_modules", None)),
                        ("dtype", t.get(LORA + "dtype", None)), ("adapter_path", t.get(LORA + "adapter_path", None))):
        if not value:
            t.ignore(LORA + leaf, f"{value!r}: none" if leaf != "dtype" else "null: the model's dtype, as verirl's")
        elif leaf == "adapter_path":
            t.decide(LORA + leaf, _adapter_words(value))
        elif leaf == "dtype":
            t.decide(LORA + leaf, f"{value}: verirl's adapters take the model's dtype (model.dtype)")
        else:
            t.decide(LORA + leaf, f"{value}: layers Megatron-Bridge leaves without adapters; verirl has no exclusions: "
                                  f"list the layers to adapt in actor.lora.target_modules")
    for key in t.under(LORA[:-1]):
        leaf = key[len(LORA):]
        if leaf in _LORA_MECHANICS:
            t.ignore(key, _LORA_MECHANICS[leaf])
        elif not t.rows[key].status:
            t.unknown(key, "a Megatron-Bridge LoRA setting this converter does not know: check it by hand")


def _engine(t: Translation) -> None:
    name = t.get(R + "name", None)
    if name in ("vllm", "hf"):
        t.put("rollout.engine", name, R + "name", note=f"veRL's {name} engine, verirl's {name} engine"
              + ("; on a machine without vLLM (a CPU) use rollout.engine=native (docs/vllm.md)" if name == "vllm"
                 else ""))
        _vllm_layout(t, name)
    elif name is not None:
        t.put("rollout.engine", "native", R + "name",
              note=f"veRL's {name} engine: verirl has none; its native engine (or vllm on a GPU) samples with the same "
                   f"temperature / top_p / top_k")
    else:
        t.ignore(R + "name", "unset (???): the run script names veRL's engine; verirl's default (native) stands")
    response = t.get(R + "response_length", None)
    if response is not None and response != t.get("data.max_response_length"):
        t.put("rollout.max_new_tokens", int(response), R + "response_length",
              note="veRL caps generation at rollout.response_length (data.max_response_length is its default)")
    elif response is not None:
        t.translated(R + "response_length", "= data.max_response_length: the generation cap, rollout.max_new_tokens",
                     ["rollout.max_new_tokens"])
    if not t.get(R + "do_sample"):
        t.put("rollout.temperature", 0.0, R + "do_sample", note="do_sample=false: greedy decoding")
    elif t.given(R + "do_sample"):
        t.translated(R + "do_sample", "sampling, as verirl's")
    if t.get(R + "ignore_eos", False):
        t.decide(R + "ignore_eos", "veRL ignores EOS while sampling: verirl always stops at it")
    t.ignore(R + "enable_sleep_mode", "vLLM's sleep mode, with which veRL frees vLLM's memory while the actor trains: "
                                      "a vLLM engine setting (verirl's rollout.free_cache_engine)")


MTK, AGENT = R + "multi_turn.", R + "agent."
# how veRL's tool agent loop cuts a tool response of more than max_tool_response_length characters, by version
# (tool_agent_loop.py: volcengine/verl of January 2026, verl-project/verl at 1dda039b, which swapped left and right)
_CUT_SIDES = {"left": "volcengine/verl of January 2026 keeps the first N characters, verl-project/verl at 1dda039b "
                      "(2026-08) the last N",
              "right": "volcengine/verl of January 2026 keeps the last N characters, verl-project/verl at 1dda039b "
                       "(2026-08) the first N"}
_VERIRL_CUT = ("verirl keeps an observation's first rollout.multi_turn.max_tool_response_chars characters and marks "
               "the cut with veRL's ...(truncated); it has no other side")


def _multi_turn(t: Translation) -> None:
    """veRL's multi-turn rollouts, its tool agent loop (verl/experimental/agent_loop/tool_agent_loop.py, reading
    rollout.multi_turn.*), become rollout.multi_turn: the turns and the tools' responses one token sequence, the
    responses loss-masked, in both."""
    loop = t.get(AGENT + "default_agent_loop", "single_turn_agent")
    _agent_loop(t, loop)
    switches = [k for k, on in ((MTK + "enable", bool(t.get(MTK + "enable", False))),
                                (AGENT + "default_agent_loop", loop == "tool_agent")) if on]
    if not switches:
        _tools_in_single_turn_prompts(t)
        return
    tools = _tools(t)
    if not tools:
        for key in switches:
            t.decide(key, "multi-turn rollouts without tools (no multi_turn.tool_config_path or function_tool_path "
                          "verirl can read): verirl refuses rollout.multi_turn.enable with nothing to call, so it is "
                          "left false; give rollout.multi_turn.tools (or an environment class, "
                          "rollout.multi_turn.environment) and set rollout.multi_turn.enable=true")
    else:
        t.put("rollout.multi_turn.enable", True, *switches,
              note="veRL's tool agent loop: the model's turns and the tools' responses are one token sequence, the "
                   "responses loss-masked, as verirl's (token in, token out, docs/agents.md)")
        t.put("rollout.multi_turn.tools", tools, *[k for k in (MTK + "tool_config_path", MTK + "function_tool_path")
                                                    if t.get(k, None)])
        t.check("veRL's agent loop runs the tool agent for the rows whose agent_name column is tool_agent (the rest "
                "run actor_rollout_ref.rollout.agent.default_agent_loop): verirl runs every prompt multi-turn; check "
                "the data's agent_name")
    _turns(t)
    _tool_responses(t)
    fmt = t.get(MTK + "format", "hermes")
    if fmt in TOOL_FORMATS:
        t.put("rollout.multi_turn.parser", TOOL_FORMATS[fmt], MTK + "format",
              note=f"veRL's {fmt} tool-call parser, verirl's {TOOL_FORMATS[fmt]}; a call that does not parse (not "
                   f"JSON, no name or arguments) veRL skips, so a turn of only such calls ends its episode, where "
                   f"verirl answers it with an error the model reads (counted in tools/parse_errors)")
    else:
        t.decide(MTK + "format", f"veRL's {fmt!r} tool-call parser: verirl reads {', '.join(sorted(set(TOOL_FORMATS.values())))} "
                                 f"tool calls (rollout.multi_turn.parser; auto picks by the chat template, which "
                                 f"stands): a model that writes its calls another way needs a parser of its own")
    for key in ("data.tool_config_path", "data.function_tool_path"):
        same = MTK + key.split(".", 1)[1]
        if t.given(key) and t.get(key) is None:
            t.ignore(key, "null: veRL's data set renders no tools into the prompt")
        elif t.given(key) and t.get(key) == t.get(same, None):
            t.translated(key, f"= {same}: veRL's data set renders these tools' schemas into the prompt (and counts "
                              f"them in its length); the same tools, rollout.multi_turn.tools",
                         ["rollout.multi_turn.tools"])
        elif t.given(key):
            t.decide(key, f"veRL's prompts list the tools of {t.get(key)}, its agent loop calls {same}'s "
                          f"({t.get(same, None)}): verirl's prompts and calls share one list, rollout.multi_turn.tools")
    if t.get(MTK + "interaction_config_path", None):
        t.decide(MTK + "interaction_config_path",
                 "veRL's interactions (a user simulator: the YAML's classes, each row's extra_info.interaction_kwargs "
                 "naming one, answer every turn that calls no tool): verirl's equivalent is an environment class, "
                 "rollout.multi_turn.environment=file.py:Class, whose reset(prompt) and step(turn) return the next "
                 "user message, a reward and whether the episode is done (docs/agents.md); write one from the "
                 "interaction's generate_response")
    else:
        t.ignore(MTK + "interaction_config_path", "null: no user simulator")
    if t.get(MTK + "use_inference_chat_template", False):
        t.decide(MTK + "use_inference_chat_template",
                 "veRL trains on the conversation re-rendered by the chat template (which may drop earlier turns' "
                 "reasoning, as Qwen3's does): verirl trains on the tokens sampled plus each observation rendered "
                 "once, never re-rendered (`verirl doctor --template` names where the template would differ)")
    else:
        t.translated(MTK + "use_inference_chat_template",
                     "false: veRL trains on the token ids the rollout recorded, as verirl (token in, token out)")
    t.ignore(MTK + "tokenization_sanity_check_mode",
             "veRL compares its turn-by-turn tokenization with the whole conversation tokenized again: verirl never "
             "re-tokenizes (the sampled tokens are trained on as sampled), so there is nothing to check")
    t.ignore(MTK + "num_repeat_rollouts", "declared in veRL's MultiTurnConfig and read by none of its code (1dda039b)")
    for key in t.under(MTK[:-1]):
        if not key.endswith("._target_"):
            t.unknown(key, "a multi_turn key this converter does not know (of another veRL version?): check it by hand")


def _null(v: Any) -> str:
    return "null" if v is None else str(v)


def _agent_loop(t: Translation, loop: str) -> None:
    """agent.default_agent_loop / agent.agent_loop_config_path: veRL's agent loops by name."""
    key = AGENT + "default_agent_loop"
    if loop == "single_turn_agent":
        t.ignore(key, "single_turn_agent: one response per prompt, as verirl without rollout.multi_turn")
    elif loop == "tool_agent":
        t.translated(key, "tool_agent: every row runs veRL's tool agent loop (multi-turn)",
                     ["rollout.multi_turn.enable"])
    else:
        t.decide(key, f"veRL's agent loop {loop!r} (registered by a module or agent_loop_config_path): verirl's "
                      f"equivalent is an environment class, rollout.multi_turn.environment=file.py:Class with "
                      f"reset(prompt) and step(turn) (docs/agents.md)")
    if t.get(AGENT + "agent_loop_config_path", None):
        t.decide(AGENT + "agent_loop_config_path",
                 "veRL's own agent loop classes: verirl's equivalent is an environment class, "
                 "rollout.multi_turn.environment=file.py:Class (docs/agents.md)")


def _tools(t: Translation) -> list[str]:
    """rollout.multi_turn.tools from multi_turn.tool_config_path (a veRL tool config YAML, which verirl reads) and
    multi_turn.function_tool_path (a file of @function_tool functions: each one file.py:function)."""
    tools: list[str] = []
    path = t.get(MTK + "tool_config_path", None)
    if path:
        tools.append(str(path))
        t.translated(MTK + "tool_config_path", "veRL's tool config YAML (tools: - class_name, config, tool_schema), "
                                               "which verirl reads as it is", ["rollout.multi_turn.tools"])
        tool_config_rows(t, MTK + "tool_config_path", str(path), "veRL")
    elif t.given(MTK + "tool_config_path"):
        t.ignore(MTK + "tool_config_path", "null: no tool config")
    key = MTK + "function_tool_path"
    file = t.get(key, None)
    if not file:
        t.ignore(key, "null: no function tools")
        return tools
    found = _function_tools(str(file), t.options.source)
    if found is None:
        t.decide(key, f"veRL's tools are the @function_tool functions of {file}, which cannot be read here: name each "
                      f"in rollout.multi_turn.tools as {file}:function")
        return tools
    where, names, renamed, coroutines, imports_verl = found
    tools += [f"{where}:{name}" for name in names]
    note = (f"the @function_tool functions of {where}: {', '.join(names) or 'none'}, each a verirl tool "
            f"{where}:function (its schema from its signature and docstring, as veRL's)")
    if names:
        t.translated(key, note, ["rollout.multi_turn.tools"])
    else:
        t.decide(key, note)
    if renamed:
        t.decide(key, "renamed by their decorator, which verirl does not read (verirl names a tool by its "
                      "function): " + ", ".join(f"{fn} is {name!r} to the model in veRL" for fn, name in renamed))
    if coroutines:
        t.decide(key, f"async functions ({', '.join(coroutines)}): verirl's tool workers call plain functions, so "
                      f"write each as def (left out of rollout.multi_turn.tools)")
    if imports_verl:
        t.check(f"{where} imports veRL (for its @function_tool decorator): verirl imports the file to find the "
                f"tools, so veRL must be installed here, or the decorator and its import removed")
    return tools


def _function_tools(path: str, source: Optional[str]):
    """(the file as found, its @function_tool function names, [(function, tool name)] of the renamed ones, the async
    ones, whether it imports verl) of veRL's function_tool_path, read as source (not run); None if it cannot be read
    here (relative paths are tried from here, then from the source config's folder)."""
    import ast
    import os

    candidates = [path] + ([os.path.join(os.path.dirname(source), path)] if source and not os.path.isabs(path) else [])
    for where in candidates:
        try:
            tree = ast.parse(open(where, encoding="utf-8").read(), filename=where)
        except (OSError, SyntaxError, ValueError):
            continue
        names, renamed, coroutines = [], [], []
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                target = call.func if call else dec
                if (target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")) != "function_tool":
                    continue
                given = [a.value for a in (call.args[:1] if call else []) if isinstance(a, ast.Constant)]
                given += [k.value.value for k in (call.keywords if call else [])
                          if k.arg == "name" and isinstance(k.value, ast.Constant)]
                if isinstance(node, ast.AsyncFunctionDef):
                    coroutines.append(node.name)
                    continue
                names.append(node.name)
                if given and given[0] != node.name:
                    renamed.append((node.name, given[0]))
        imports_verl = any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "verl"
                           or isinstance(n, ast.Import) and any(a.name.split(".")[0] == "verl" for a in n.names)
                           for n in ast.walk(tree))
        return where, names, renamed, coroutines, imports_verl
    return None


def _turns(t: Translation) -> None:
    """max_assistant_turns / max_user_turns (null or 0: no limit of their own, veRL tests them for truth)."""
    from verirl.config import Config

    budget = int(t.out.get("rollout.max_new_tokens", Config().rollout.max_new_tokens))
    key = MTK + "max_assistant_turns"
    if t.given(MTK + "max_turns") and not t.given(key):  # veRL before max_assistant_turns (2025)
        key = MTK + "max_turns"
        t.decide(key, "veRL's multi_turn.max_turns of 2025 (before max_assistant_turns and max_user_turns): written as "
                      "rollout.multi_turn.max_turns, assistant turns; check how that veRL counted its turns")
    turns = t.get(key, None)
    if turns:
        t.put("rollout.multi_turn.max_turns", int(turns), key, note="assistant turns per episode at most, in both")
    else:
        t.put("rollout.multi_turn.max_turns", budget, key,
              note=f"{_null(turns)}: no limit in veRL but the response length; each turn samples at least one token, so "
                   f"max_turns = rollout.max_new_tokens ({budget}) is the same bound (set fewer where the episodes "
                   f"are known to be shorter)")
    user = t.get(MTK + "max_user_turns", None)
    if user:
        t.put("rollout.multi_turn.max_env_turns", int(user), MTK + "max_user_turns",
              note="rounds of tool results (or interaction messages) per episode at most, one per turn that called "
                   "tools, in both; the model answers once more after the last")
    else:
        t.translated(MTK + "max_user_turns", f"{_null(user)}: no limit of its own; verirl's max_env_turns 0 (= max_turns) "
                                             f"bounds it the same way, each observation follows an assistant turn")
    for key in ("data.max_response_length", R + "response_length"):
        t.note(key, "multi-turn: the whole episode's response (every turn and tool response) in both, "
                    "rollout.multi_turn.max_total_tokens and max_tokens_per_turn 0 (= this)")


def _tool_responses(t: Translation) -> None:
    """max_tool_response_length (characters), tool_response_truncate_side, max_parallel_calls."""
    from verirl.config import Config

    budget = int(t.out.get("rollout.max_new_tokens", Config().rollout.max_new_tokens))
    key = MTK + "max_tool_response_length"
    chars = int(t.get(key, 256) or 0)
    if chars > 0:
        t.put("rollout.multi_turn.max_tool_response_chars", chars, key,
              note="characters, in both: veRL cuts a tool's response text at this many characters (then marks the "
                   "cut ...(truncated))")
        t.put("rollout.multi_turn.max_tool_response_tokens", budget, key,
              note=f"veRL has no token cap on a tool response (the response length bounds the episode): "
                   f"max_tool_response_tokens = rollout.max_new_tokens ({budget}), only the character cut applies")
    else:
        t.decide(key, f"{chars}: veRL cuts every tool response to nothing but its marker; verirl's 0 is no "
                      f"character limit: set rollout.multi_turn.max_tool_response_chars")
    side = t.get(MTK + "tool_response_truncate_side", "middle")
    what = _CUT_SIDES.get(side, "veRL keeps the first N/2 and the last N/2 characters around ...(truncated)...")
    t.decide(MTK + "tool_response_truncate_side", f"{side}: {what}; {_VERIRL_CUT}")
    t.decide(MTK + "max_parallel_calls", calls_per_turn_words("veRL", int(t.get(MTK + "max_parallel_calls", 1))))


def _tools_in_single_turn_prompts(t: Translation) -> None:
    """data.tool_config_path / data.function_tool_path without multi-turn: veRL's single-turn agent renders the
    tools' schemas into the prompt and runs none."""
    for key in ("data.tool_config_path", "data.function_tool_path"):
        if t.get(key, None):
            t.decide(key, f"veRL's single-turn prompts list the tools of {t.get(key)} (the chat template's tools) and "
                          f"no tool runs: verirl shows tools only in multi-turn episodes (rollout.multi_turn.enable "
                          f"with rollout.multi_turn.tools)")


def _vllm_layout(t: Translation, name: str) -> None:
    """vLLM's tensor parallelism and memory share, which verirl's vllm engine takes too."""
    if name != "vllm":
        return
    for key, target, kind in ((R + "tensor_model_parallel_size", "rollout.tensor_parallel_size", int),
                              (R + "gpu_memory_utilization", "rollout.gpu_memory_utilization", float)):
        if t.get(key, None) is not None:
            t.put(target, kind(t.get(key)), key, note="the same vLLM setting")
        else:
            t.ignore(key, "null: vLLM's default, as verirl's")


def _size(t: Translation, key: str) -> int:
    """A parallel size as veRL reads it: unset or null is 1."""
    return int(t.get(key, 1) or 1)


def _ulysses_key(t: Translation, role: str) -> str:
    """The key veRL's FSDP engine takes ``role``'s (A or REF) Ulysses size from: the deprecated role-level key when
    it is above 1 (FSDPActorConfig.__post_init__ copies it over fsdp_config's), else fsdp_config's."""
    return role + SP if _size(t, role + SP) > 1 else role + "fsdp_config." + SP


def _ulysses(t: Translation, role: str) -> int:
    """The Ulysses size veRL's FSDP engine runs ``role`` (A or REF) with."""
    return _size(t, _ulysses_key(t, role))


def _megatron(t: Translation) -> bool:
    """Whether veRL's Megatron workers read actor.megatron.*: actor.strategy is megatron, or the source leaves the
    strategy out and sets Megatron keys (a run of ppo_megatron_trainer given as overrides)."""
    if t.given(A + "strategy"):
        return t.get(A + "strategy") == "megatron"
    return bool(t.under(MG[:-1]))


def _sequence_parallel(t: Translation) -> int:
    """The ranks veRL splits each micro-batch's tokens over: Megatron's context parallel size, FSDP's Ulysses size."""
    return _size(t, MG + "context_parallel_size") if _megatron(t) else _ulysses(t, A)


# How verirl's sequence parallelism (Ulysses) splits the work, and what verirl train asks of the model for it
# (run/checks.py: check_model_parallel).
_ULYSSES = ("each rank holds 1/sp of a packed micro-batch's tokens, all-to-alls exchange them for 1/sp of the "
            "attention heads around attention, docs/parallelism.md")
_HEADS = "verirl train refuses it unless each tensor-parallel rank's attention heads and key/value heads divide by it"


def _layout(t: Translation) -> None:
    """The actor's parallel layout: Megatron's tensor parallelism is verirl's actor.tensor_parallel_size; FSDP's
    Ulysses sequence parallelism and Megatron's context parallelism are verirl's actor.sequence_parallel_size;
    Megatron's pipeline parallelism is verirl's actor.pipeline_parallel_size (its virtual stages verirl's interleaved
    schedule where they are 2 per rank). The rollout's tensor parallelism for the native and hf engines (vLLM's is
    _vllm_layout's)."""
    if _megatron(t):
        tp, sp, pp, keys = _megatron_layout(t)
        for role in (A, REF):
            for key in (role + SP, role + "fsdp_config." + SP):
                t.ignore(key, "read by veRL's FSDP workers only, not its Megatron ones")
    else:
        for key in (MG + "tensor_model_parallel_size", REF + "megatron.tensor_model_parallel_size",
                    *[MG + name for name in ("pipeline_model_parallel_size", "context_parallel_size",
                                             "virtual_pipeline_model_parallel_size")],
                    REF + "megatron.context_parallel_size", REF + "megatron.pipeline_model_parallel_size"):
            t.ignore(key, f"read by veRL's Megatron workers only; actor.strategy is {t.get(A + 'strategy')}")
        tp, pp, (sp, keys) = 1, 1, _ulysses_layout(t)
    _rollout_layout(t, tp)
    if tp * sp * pp > 1:
        model_parallel_fits(t, tp, sp, pp, keys, "veRL", M + "use_remove_padding", [MG + "pipeline_model_parallel_size"],
                            lambda: f"veRL's run had n_gpus_per_node x nnodes = "
                                    f"{int(t.get('trainer.n_gpus_per_node')) * int(t.get('trainer.nnodes'))} GPUs")


def _megatron_layout(t: Translation) -> tuple[int, int, int, list[str]]:
    """actor.megatron.*'s sizes: (tensor parallel, context parallel, pipeline parallel, the keys that wrote a size
    above 1)."""
    tp_key, cp_key, pp_key = (MG + "tensor_model_parallel_size", MG + "context_parallel_size",
                              MG + "pipeline_model_parallel_size")
    tp, cp, pp = _size(t, tp_key), _size(t, cp_key), _size(t, pp_key)
    if t.given(tp_key):
        t.put("actor.tensor_parallel_size", tp, tp_key,
              note="ranks that split each layer, in both (Megatron's tensor parallelism, verirl's tensor-parallel "
                   "plan: heads, MLP width and vocabulary 1/tp per rank)")
    if cp > 1:
        t.put("actor.sequence_parallel_size", cp, cp_key,
              note=f"ranks that split each sequence's tokens, in both: Megatron's context parallelism is ring "
                   f"attention (key/value blocks passed round the group), verirl's sequence parallelism Ulysses "
                   f"({_ULYSSES}); the same {cp} ranks per sequence, the same log-probs; {_HEADS}")
    else:
        t.ignore(cp_key, "1: none")
    if pp > 1:
        pipeline_stages(t, pp_key, pp)
        t.note(pp_key, "without a layer-split override (override_transformer_config) Megatron splits the layers "
                       "evenly over the stages, as verirl's default actor.pipeline_layers []")
    else:
        t.ignore(pp_key, "1: none")
    _virtual_stages(t, pp)
    for name, size, what, how in (("tensor_model_parallel_size", tp, "tensor parallelism", "split {} ways"),
                                  ("context_parallel_size", cp, "context parallelism", "split {} ways"),
                                  ("pipeline_model_parallel_size", pp, "pipeline parallelism", "over {} stages")):
        ref_key = REF + "megatron." + name
        if not t.given(ref_key):
            continue
        ref = _size(t, ref_key)
        if ref == size:
            t.ignore(ref_key, "the actor's: verirl's reference runs on the actor's layout")
        else:
            t.decide(ref_key, f"veRL's reference ran with {what} {ref}, its actor with {size}: verirl's reference "
                              f"runs on the actor's layout ({size}), which has no setting of its own (the same "
                              f"log-probs, computed {how.format(size)})")
    return tp, cp, pp, [k for k, v in ((tp_key, tp), (cp_key, cp), (pp_key, pp)) if v > 1]


def _virtual_stages(t: Translation, pp: int) -> None:
    """virtual_pipeline_model_parallel_size: Megatron's model chunks per pipeline rank, run by its interleaved
    1F1B schedule; verirl's interleaved_1f1b holds 2 stages per rank (stage s on rank s mod pp, as Megatron places
    its chunks)."""
    from verirl.models.pipeline import stages_per_rank

    key, per_rank = MG + "virtual_pipeline_model_parallel_size", stages_per_rank("interleaved_1f1b")
    chunks = t.get(key, None)
    if chunks is None:
        t.ignore(key, "null: none")
    elif pp == 1:
        t.ignore(key, "read only with pipeline_model_parallel_size > 1: no stages to interleave")
    elif int(chunks) == 1:
        t.translated(key, "1 model chunk per rank: the stages of 1F1B, verirl's default actor.pipeline_schedule")
    elif int(chunks) == per_rank:
        t.put("actor.pipeline_schedule", "interleaved_1f1b", key,
              note=f"{per_rank} model chunks per rank under Megatron's interleaved 1F1B: verirl's interleaved_1f1b, "
                   f"{per_rank} stages per rank (stage s on rank s mod {pp}, as Megatron places its chunks), the "
                   f"layers split over {pp} x {per_rank} = {pp * per_rank} stages")
    else:
        t.decide(key, f"{chunks} model chunks per rank (Megatron's interleaved 1F1B): verirl's interleaved_1f1b holds "
                      f"{per_rank} stages per rank; its default 1f1b is left (one stage per rank): choose "
                      f"actor.pipeline_schedule=1f1b or interleaved_1f1b ({per_rank} per rank); the schedule changes "
                      f"no result, only the idle share of each pass (verirl plan shows it)")


def _ulysses_layout(t: Translation) -> tuple[int, list[str]]:
    """FSDP's Ulysses sizes, the actor's and the reference's: (the actor's, the keys that wrote one above 1)."""
    actor_key, sp = _ulysses_key(t, A), _ulysses(t, A)
    if sp > 1:
        t.put("actor.sequence_parallel_size", sp, actor_key,
              note=f"ranks that split each packed micro-batch's tokens, Ulysses in both ({_ULYSSES}); {_HEADS}")
    else:
        t.ignore(actor_key, "1: none")
    if actor_key == A + SP:
        t.ignore(A + "fsdp_config." + SP, f"replaced by {A + SP} (above 1), as veRL's FSDPActorConfig does")
    else:
        t.ignore(A + SP, "1: veRL reads fsdp_config's" if sp > 1 else "1: none")
    ref_key, ref = _ulysses_key(t, REF), _ulysses(t, REF)
    for key in (REF + SP, REF + "fsdp_config." + SP):
        if key != ref_key:
            t.ignore(key, f"veRL's reference reads {ref_key}")
        elif ref == sp:
            t.ignore(key, "1: none" if sp == 1 else f"the actor's Ulysses size ({sp}): verirl's reference runs on the "
                                                    f"actor's layout")
        elif t.given(key):
            t.decide(key, f"veRL's reference ran with Ulysses size {ref}, its actor with {sp}: verirl's reference runs "
                          f"on the actor's layout (actor.sequence_parallel_size={sp}), which has no setting of its "
                          f"own (the same log-probs, the tokens split {sp} ways)")
    return sp, [actor_key] if sp > 1 else []


def _rollout_layout(t: Translation, tp: int) -> None:
    """rollout.tensor_model_parallel_size with verirl's native or hf engine: 1 decodes with the whole weights on each
    rank, the actor's tensor-parallel size decodes on its plan (native only); another size needs a decision."""
    engine, key = t.out.get("rollout.engine", "native"), R + "tensor_model_parallel_size"
    if engine == "vllm" or not t.given(key):
        return
    size = _size(t, key)
    if size == 1:
        t.put("rollout.tensor_parallel_size", 1, key, note=f"1: verirl's {engine} engine decodes with the whole "
                                                          f"weights on each rank")
    elif size == tp and engine == "native":
        t.put("rollout.tensor_parallel_size", size, key,
              note="= the actor's tensor parallelism: verirl's native engine decodes on the tensor-parallel plan, "
                   "the group's ranks together")
    else:
        plan = (f" or on the actor's tensor-parallel plan (rollout.tensor_parallel_size = actor.tensor_parallel_size, "
                f"both {size} for veRL's layout)" if engine == "native" else "")
        t.decide(key, f"veRL's rollout engine decoded over {size} devices; verirl's {engine} engine decodes with the "
                      f"whole weights on each rank (rollout.tensor_parallel_size=1){plan}: choose by whether "
                      f"the model fits one device")


# ---------------------------------------------------------------- mixture-of-experts models

OTC = MG + "override_transformer_config."
MOE_LOSS = ("moe_aux_loss_coeff", "moe_router_load_balancing_type")  # Megatron's load-balancing loss: _experts'
RR = A + "router_replay."


def _experts(t: Translation) -> None:
    """A MoE run's settings: Megatron's expert parallel sizes (fit_experts: verirl's layout), the routing replay
    mode, the load-balancing loss's coefficient; the rollout's own expert parallelism is placement (verl.yaml)."""
    ep_key, etp_key = MG + "expert_model_parallel_size", MG + "expert_tensor_parallel_size"
    if not _megatron(t):
        for key in (ep_key, etp_key):
            t.ignore(key, f"read by veRL's Megatron workers only; actor.strategy is {t.get(A + 'strategy')}")
    else:
        etp_value = t.get(etp_key, None)
        tp = _size(t, MG + "tensor_model_parallel_size")
        etp = tp if etp_value is None else int(etp_value)  # Megatron: null is the tensor-parallel size
        if etp_value is None and t.given(etp_key):
            t.note(etp_key, f"null: Megatron takes the tensor-parallel size ({tp})")
        if _size(t, ep_key) > 1:  # a MoE model (veRL's file does not say otherwise)
            fit_experts(t, "veRL", _size(t, ep_key), [ep_key], etp, etp_key, MG + "tensor_model_parallel_size")
        else:
            t.ignore(ep_key, "1: none")
            if etp == 1:
                t.ignore(etp_key, "1: none")
            else:
                t.ignore(etp_key, f"{etp}: read with expert parallelism, which is 1 here (a dense model, or every "
                                  f"rank holds every expert as in verirl)")
    _router_replay(t)
    _aux_loss(t)


def _router_replay(t: Translation) -> None:
    """router_replay.mode: veRL's disabled / R2 / R3 are verirl's algo.router_replay off / R2 / R3 (R3 on verirl's
    native engine, which records the experts it routed to; verirl's vllm engine returns none)."""
    key, rollout_key = RR + "mode", R + "enable_rollout_routing_replay"
    mode = str(t.get(key, "disabled"))
    if mode.lower() in ("disabled", "none", "off", "false"):
        t.ignore(key, "disabled: every pass routes by its own router, verirl's algo.router_replay off (the default)")
        return
    engine = t.out.get("rollout.engine", "native")
    if mode.upper() == "R2":
        t.put("algo.router_replay", "R2", key,
              note="the update routes by the experts the trainer's old-log-prob pass chose, in both")
    elif mode.upper() == "R3" and engine == "native":
        t.put("algo.router_replay", "R3", key, *([rollout_key] if t.given(rollout_key) else []),
              note="the old-log-prob pass and the update route by the experts the rollout engine chose, in both "
                   "(verirl's native engine records them)")
    elif mode.upper() == "R3":
        t.put("algo.router_replay", "R2", key, note="R2 written")
        t.decide(key, f"R3 replays the rollout engine's experts; verirl's {engine} engine returns none (vLLM's "
                      f"routed experts are not read in this version): algo.router_replay=R2 written (the trainer's "
                      f"own routes of the old-log-prob pass), or rollout.engine=native with R3")
        t.translated(rollout_key, "the rollout engine's routes, for R3")
    else:
        t.decide(key, f"mode {mode}: verirl's algo.router_replay is off / R2 / R3 (veRL's values); veRL's routing "
                      f"files are not read, algo.router_replay off left")
    if mode.upper() == "R3" and not t.get(rollout_key, False):
        t.decide(rollout_key, "false with router_replay.mode R3: veRL replays the rollout's routes only when its "
                              "engine returns them (true); verirl's native engine always records them")


def _aux_loss(t: Translation) -> None:
    """Megatron's load-balancing loss (override_transformer_config.moe_aux_loss_coeff, with
    moe_router_load_balancing_type aux_loss) as algo.moe_aux_loss_coef; model.override_config's router_aux_loss_coef
    reaches veRL's Megatron models through its config converter only."""
    coef_key, type_key = OTC + "moe_aux_loss_coeff", OTC + "moe_router_load_balancing_type"
    hf_key = M + "override_config.router_aux_loss_coef"
    kind = str(t.get(type_key, "aux_loss"))
    if t.given(hf_key):
        t.note(hf_key, "veRL's FSDP actor adds no router loss (its loss is the policy loss); its Megatron config "
                       "converter takes it as moe_aux_loss_coeff but sets Qwen-MoE's load balancing to none: "
                       "algo.moe_aux_loss_coef not written from it (0, off)")
    if not t.given(coef_key):
        t.ignore(type_key, f"{kind}: without moe_aux_loss_coeff, Megatron's coefficient is veRL's model converter's")
        return
    coef = float(t.get(coef_key))
    if kind == "none" or coef == 0:
        t.ignore(coef_key, f"{coef:g} with load balancing {kind}: off, verirl's algo.moe_aux_loss_coef 0")
        t.ignore(type_key, f"{kind}: no load-balancing loss")
        return
    t.put("algo.moe_aux_loss_coef", coef, coef_key, *([type_key] if t.given(type_key) else []),
          note="the Switch load-balancing loss added times this, in both")
    t.decide(coef_key, aux_scale_words(coef, None, None))
    if kind not in ("aux_loss", "seq_aux_loss"):
        t.decide(type_key, f"{kind}: verirl's only load-balancing loss is the Switch loss over the batch "
                           f"(Megatron's aux_loss)")
    elif kind == "seq_aux_loss":
        t.decide(type_key, "seq_aux_loss balances each sequence; verirl's Switch loss balances the whole batch")


# ---------------------------------------------------------------- asynchronous training

AT, V1 = "async_training.", "trainer.v1."
FULLY_ASYNC, ONE_STEP_OFF = "fully_async_policy", "one_step_off_policy"
RECIPES = (FULLY_ASYNC, ONE_STEP_OFF)
"""veRL's asynchronous recipes (verl/experimental/NAME): trainers of their own, run by their own main, each with a
top-level rollout section for the rollout's GPUs that the main copies into actor_rollout_ref.rollout."""
V1_MODES = ("sync", "colocate_async", "separate_async")

# veRL's defaults, by trainer, for the keys its asynchronous trainers read that verl.yaml (ppo_trainer's) lacks or that
# their configs set otherwise: the recipes' fully_async_ppo_trainer.yaml and one_step_off_ppo_trainer.yaml (each
# `defaults: [ppo_trainer, _self_]`) and the v1 trainer's section of ppo_trainer.yaml, verl-project/verl at 1dda039b.
TRAINER_DEFAULTS: dict[str, dict[str, Any]] = {
    FULLY_ASYNC: {AT + "staleness_threshold": 0.1, AT + "trigger_parameter_sync_step": 4, AT + "require_batches": 1,
                  AT + "partial_rollout": True, "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8,
                  "rollout.total_rollout_steps": 100, "data.gen_batch_size": 1, R + "calculate_log_probs": True,
                  RC + "bypass_mode": True, M + "use_remove_padding": True},
    ONE_STEP_OFF: {"rollout.nnodes": 1, "rollout.n_gpus_per_node": 8, R + "calculate_log_probs": True,
                   RC + "bypass_mode": True},
    "separate_async": {V1 + "separate_async.parameter_sync_step": 4, V1 + "sampler.max_off_policy_threshold": 8,
                       V1 + "sampler.max_off_policy_strategy": "drop", R + "nnodes": 0},
}


def _which_trainer(t: Translation) -> str:
    """The veRL trainer the keys are for: the fully-async recipe (fully_async_main: an async_training section or
    rollout.total_rollout_steps), the one-step-off recipe (its main_ppo: the rollout's GPUs, rollout.nnodes /
    rollout.n_gpus_per_node, without them), else verl.trainer.main_ppo's: with trainer.use_v1 the v1 trainer's
    trainer.v1.trainer_mode, without it the classic trainer ("sync")."""
    if t.under("async_training") or t.given("rollout.total_rollout_steps"):
        return FULLY_ASYNC
    if t.given("rollout.nnodes") or t.given("rollout.n_gpus_per_node"):
        return ONE_STEP_OFF
    if t.get("trainer.use_v1", False):
        return str(t.get(V1 + "trainer_mode", "sync"))
    return "sync"


def _async(t: Translation, kind: str) -> None:
    """veRL's trainers with a rollout on GPUs of its own become rollout.placement=separate (docs/async.md): the
    rollout's GPUs are rollout.nproc producers beside the trainers, on one machine; the staleness veRL allows is
    trainer.async_training.max_staleness, counted in verirl's updates (one per step)."""
    _hybrid_engine(t, kind)
    _recipe_keys(t, kind)
    mode_key = V1 + "trainer_mode"
    if kind == "colocate_async":
        t.decide(mode_key, "colocate_async: veRL's v1 trainer generates the next batches on the trainer's GPUs while "
                           "it trains (partial rollouts across its steps); verirl runs ahead only with producers on "
                           "devices of their own (rollout.placement=separate, trainer.async_training): colocated, it "
                           "trains synchronously, one rollout then its update")
    elif kind not in (*RECIPES, *V1_MODES):
        t.decide(mode_key, f"{kind!r} is not a mode of veRL's v1 trainer ({', '.join(V1_MODES)}): verirl trains "
                           f"synchronously")
    if kind not in (*RECIPES, "separate_async"):
        return
    if kind == FULLY_ASYNC:
        k, partial = _fully_async_schedule(t)
    elif kind == ONE_STEP_OFF:
        k, partial = _one_step_off_schedule(t), None
    else:
        k, partial = _separate_async_schedule(t), (mode_key, "veRL's v1 async client always continues them, within "
                                                             "max_off_policy_threshold versions")
    keys = _producers(t, kind, k)
    t.put("rollout.placement", "separate", *keys,
          note=f"veRL's {kind} generates on GPUs of its own while the trainer's GPUs train: verirl's producers")
    if partial is not None:
        _partial(t, *partial, k)
    for key in t.under(AT[:-1]) + t.under("rollout"):
        t.unknown(key, f"a key of veRL's {kind} recipe this converter does not know: check it by hand")


def _max_staleness(t: Translation, kind: str) -> int:
    """The updates by which the weights that train a sample may be newer than the ones that sampled it, in veRL's
    trainer ``kind``: the schedules below say how each follows."""
    if kind == FULLY_ASYNC:
        per_step = _step_prompts(t, kind)
        most = int(per_step * (float(t.get(AT + "staleness_threshold")) + 1) * int(
            t.get(AT + "trigger_parameter_sync_step")))  # the rollouter's max_required_samples
        return -(-most // per_step) - 1
    if kind == ONE_STEP_OFF:
        return 1
    if kind == "separate_async":
        return max(int(t.get(V1 + "sampler.max_off_policy_threshold")) - 1, 0)
    return 0


def _fully_async_schedule(t: Translation) -> tuple[int, Optional[tuple[str, str]]]:
    """staleness_threshold, trigger_parameter_sync_step and partial_rollout (fully_async_rollouter.py): the
    rollouter pauses once it holds max_required_samples prompts of the current parameter version, in flight or
    queued; the trainer takes data.prompts_per_step of them per update and syncs the weights every
    trigger_parameter_sync_step updates. Returns max_staleness and the partial-rollout request (None: none)."""
    s_key, sync_key, p_key = AT + "staleness_threshold", AT + "trigger_parameter_sync_step", AT + "partial_rollout"
    per_step, s, every = _step_prompts(t, FULLY_ASYNC), float(t.get(s_key)), int(t.get(sync_key))
    most, k = int(per_step * (s + 1) * every), _max_staleness(t, FULLY_ASYNC)
    target = "trainer.async_training.max_staleness"
    t.put(target, k, s_key,
          note=f"veRL's rollouter samples at most int(require_batches x ppo_mini_batch_size x (1 + "
               f"staleness_threshold) x trigger_parameter_sync_step) = int({per_step} x {1 + s:g} x {every}) = {most} "
               f"prompts from one parameter version, and the trainer takes {per_step} per update: the last of them "
               f"is trained by the update ceil({most} / {per_step}) = {k + 1} after that version, with weights {k} "
               f"updates newer than the ones that sampled it. staleness_threshold is a fraction of a sync period's "
               f"prompts, max_staleness whole updates: rounded up")
    for key in (sync_key, AT + "require_batches"):  # in the arithmetic too: one note, on staleness_threshold
        t.translated(key, "max_staleness: see staleness_threshold", [target])
        t.out_from[target].append(key)
    t.put("trainer.async_training.sync_every", every, sync_key,
          note="the trainer hands its weights to the rollout every trigger_parameter_sync_step updates, in both")
    t.put("trainer.async_training.mode", "bounded" if k else "fixed", s_key)
    t.note(s_key, "veRL's rollouter runs ahead as fast as its bound lets it, and an update trains on the prompts the "
                  "queue holds: verirl's bounded mode (the producer samples from the newest weights it has, at most "
                  "max_staleness updates old)" if k else
                  "staleness_threshold 0 and trigger_parameter_sync_step 1: each update trains on prompts sampled from "
                  "its own weights (veRL's on-policy pipeline), verirl's synchronous step (mode fixed)")
    wanted = bool(t.get(p_key))
    if not wanted:
        t.translated(p_key, "false: a sequence in flight when new weights arrive is dropped (verl-project/verl at "
                            "1dda039b; volcengine/verl of January 2026 waits for it to finish); verirl's producer "
                            "finishes it on the weights it started with")
        return k, None
    if s == 0:
        t.ignore(p_key, "staleness_threshold 0: the rollouter samples exactly the prompts of a sync period and the "
                        "trainer waits for all of them, so no sequence is in flight when new weights arrive")
        return k, None
    return k, (p_key, "veRL does not bound how many versions one sequence spans (fully_async/partial/"
                      "max_partial_span reports it)")


def _one_step_off_schedule(t: Translation) -> int:
    """one_step_off_policy/ray_trainer.py: step s waits for its batch, hands the weights (after s - 1 updates) to the
    rollout, starts batch s + 1 with them and trains on batch s, sampled from the weights after s - 2 updates."""
    keys = [k for k in ("rollout.nnodes", "rollout.n_gpus_per_node") if t.given(k)]
    note = ("veRL's one_step_off_policy recipe (a top-level rollout section, no async_training): step s trains on "
            "the batch sampled while step s - 1 trained, from the weights after s - 2 updates; verirl's fixed mode "
            "with max_staleness 1 samples step s from version max(0, s - 2): the same schedule")
    t.put("trainer.async_training.max_staleness", 1, *keys, note=note)
    t.put("trainer.async_training.mode", "fixed", *keys, note=note)
    return 1


def _separate_async_schedule(t: Translation) -> int:
    """The v1 trainer's separate_async mode (trainer_separate_async.py, replay_buffer.py): standalone rollout GPUs
    generate continuously; each step trains parameter_sync_step mini-batches as they come and then hands the weights
    to the rollout; the replay buffer bounds how many versions a trained group spans."""
    mode_key, sync_key = V1 + "trainer_mode", V1 + "separate_async.parameter_sync_step"
    thr_key, how_key = V1 + "sampler.max_off_policy_threshold", V1 + "sampler.max_off_policy_strategy"
    threshold, k = int(t.get(thr_key)), _max_staleness(t, "separate_async")
    t.translated("trainer.use_v1", "veRL's v1 trainer (see trainer.v1.trainer_mode)")
    t.translated(mode_key, "separate_async: veRL's standalone rollout GPUs generate while the trainer's GPUs train: "
                           "the rollout.nproc producers of verirl's rollout.placement=separate")
    t.put("trainer.async_training.max_staleness", k, thr_key,
          note=f"veRL trains a group only while global_steps - the step that sent its prompt + 1 <= "
               f"max_off_policy_threshold (replay_buffer.py), so the weights that train it are at most {threshold} - 1 "
               f"= {k} updates newer than the ones its first token was sampled from")
    t.put("trainer.async_training.mode", "bounded" if k else "fixed", mode_key, thr_key,
          note="veRL's rollout runs ahead as fast as the replay buffer lets it: verirl's bounded mode" if k else
          "max_off_policy_threshold 1: every group is sampled from the weights that train it, verirl's synchronous "
          "step")
    t.put("trainer.async_training.sync_every", 1, mode_key,
          note="veRL's separate_async hands the weights to the rollout after every step (on_step_end), as verirl's "
               "sync_every 1")
    strategy = t.get(how_key)
    if strategy == "wait":
        t.translated(how_key, "wait: veRL holds the sampling until the groups at the threshold finish, none dropped; "
                              "verirl's producers likewise sample nothing older than max_staleness")
    elif strategy == "drop":
        t.decide(how_key, "drop: veRL drops the finished groups past the threshold (long responses more often than "
                          "short ones) and trains on new prompts in their place; verirl's producers run at most "
                          "max_staleness steps ahead, so no group grows too old and none is dropped (veRL's wait)")
    else:
        t.decide(how_key, f"{strategy!r} is not one of veRL's strategies (drop, wait): verirl drops no group")
    train, mini, sync = (int(t.get("data.train_batch_size")), int(t.get(A + "ppo_mini_batch_size")),
                         int(t.get(sync_key)))
    if train == sync * mini:
        t.translated(sync_key, f"= train_batch_size / ppo_mini_batch_size = {train} / {mini}: the mini-batches of a "
                               f"step, which separate_async trains one by one as they come (verirl's "
                               f"actor.mini_batch_prompts); the weights go to the rollout once a step",
                     ["data.prompts_per_step", "actor.mini_batch_prompts"])
    else:
        t.decide(sync_key, f"{sync} x ppo_mini_batch_size {mini} = {sync * mini} is not train_batch_size {train}, "
                           f"which veRL's separate_async refuses (an assert): verirl trains data.prompts_per_step="
                           f"{train} prompts a step in mini-batches of {mini}")
    sa = V1 + "separate_async."
    if t.get(sa + "hybrid_rollout.enable_switch", False):
        t.decide(sa + "hybrid_rollout.enable_switch", "veRL lends the trainer's GPUs to generation while they would "
                                                      "wait for samples: verirl's trainers do not generate")
        for key in t.under(sa + "hybrid_rollout"):
            t.ignore(key, "how veRL switches its trainer GPUs between training and generation")
    else:
        for key in t.under(sa + "hybrid_rollout"):
            t.ignore(key, "read only with hybrid_rollout.enable_switch, which is off")
    t.ignore(sa + "num_warmup_batches", "batches veRL sends to the rollout before the first update: verirl's "
                                        "producers start max_staleness + 1 steps at once")
    path_key = V1 + "sampler.custom_sampler.path"
    if t.get(path_key, None):
        t.decide(path_key, "a sampler class of veRL's own: verirl draws its prompts with its own sampler "
                           "(docs/data.md)")
    for key in t.under(V1 + "sampler"):
        if not t.rows[key].status:
            t.ignore(key, "null or empty: veRL's replay buffer, no custom sampler" if "custom_sampler" in key or
                     "sampler_kwargs" in key else "read by the v1 sync trainer only")
    return k


def _producers(t: Translation, kind: str, k: int) -> list[str]:
    """The other run's devices: its trainer GPUs (trainer.n_gpus_per_node x trainer.nnodes) train, its rollout GPUs
    (the recipes' rollout.nnodes x rollout.n_gpus_per_node, v1's actor_rollout_ref.rollout.*) generate. verirl's
    producers and trainers share one machine, a device each: rollout.nproc producers out of trainer.nproc_per_node
    processes. Returns the keys of the rollout's GPUs."""
    from math import gcd

    prefix = "rollout." if kind in RECIPES else R
    nodes_key, gpus_key = prefix + "nnodes", prefix + "n_gpus_per_node"
    if kind in RECIPES:
        for key in (R + "nnodes", R + "n_gpus_per_node"):
            t.ignore(key, f"the recipe's main replaces it with {prefix}{key.rsplit('.', 1)[1]}")
    t_nodes, t_gpus = int(t.get("trainer.nnodes")), int(t.get("trainer.n_gpus_per_node"))
    r_nodes = int(t.get(nodes_key, 0) or 0)
    r_gpus = int(t.get(gpus_key, None) or t_gpus)  # v1's default: ${oc.select:trainer.n_gpus_per_node,8}
    trainers, rollout = t_nodes * t_gpus, r_nodes * r_gpus
    keys = [key for key in (nodes_key, gpus_key) if t.given(key) or key in t.defaults]
    gpus = f"{nodes_key} {r_nodes} x {gpus_key.rsplit('.', 1)[1]} {r_gpus} = {rollout} rollout GPUs"
    nproc, idle = rollout, ""
    if rollout == 0:
        nproc = 1
        t.decide(nodes_key, f"{gpus}: veRL's {kind} needs GPUs of its own for the rollout (an assert): rollout.nproc=1 "
                            f"written; give the rollout's GPUs")
    elif rollout > 1 and t.out.get("algo.filter_groups.enable"):
        nproc = 1
        t.decide(gpus_key, f"{gpus}, with DAPO's dynamic sampling: verirl knows a filtered step's prompts only once "
                           f"the step before is done, so its steps go to one producer after another: rollout.nproc=1 "
                           f"written")
    elif rollout > k + 1:
        idle = (f"; verirl hands out at most max_staleness + 1 = {k + 1} steps at a time, one to each producer, so "
                f"{rollout - k - 1} of them would idle: fewer producers do as well, or raise max_staleness")
    t.put("rollout.nproc", nproc, *keys,
          note=f"{gpus}: one producer process each, which generates and scores whole steps with the whole weights on "
               f"its device{idle}" if nproc == rollout else "")
    group = 1
    for name in ("tensor", "sequence", "pipeline"):
        group *= int(t.out.get(f"actor.{name}_parallel_size", 1))
    prompts, mini = int(t.out["data.prompts_per_step"]), int(t.out["actor.mini_batch_prompts"])
    ranks = max(1, trainers // group)
    fit = gcd(ranks, gcd(prompts, mini))
    train_keys = ["trainer.n_gpus_per_node", "trainer.nnodes"]
    layout = [key for key in t.out_from.get("trainer.nproc_per_node", []) if key not in train_keys]
    t.put("trainer.nproc_per_node", group * fit + nproc, *train_keys, *keys,
          note=f"veRL's trainer GPUs, trainer.n_gpus_per_node {t_gpus} x trainer.nnodes {t_nodes} = {trainers}, and "
               f"its rollout GPUs: {group * fit} trainers + rollout.nproc={nproc} producers = {group * fit + nproc} "
               f"processes on one machine, a device each")
    for key in layout:
        t.note(key, f"trainer.nproc_per_node={group * fit + nproc} written instead: the other run's {trainers} trainer "
                    f"GPUs and its rollout GPUs (rollout.placement=separate)")
    if fit != ranks or trainers % group:
        split = f" / the {group} of a model-parallel group = {ranks} data-parallel ranks" if group > 1 else ""
        t.decide("trainer.n_gpus_per_node",
                 f"verirl splits a step's {prompts} prompts and each mini-batch's {mini} over the data-parallel ranks "
                 f"in whole groups of rollout.n samples, which {trainers} trainer GPUs{split} do not divide (veRL "
                 f"splits sequences): {group * fit} trainers written, the most that divide them")
    if t_nodes > 1 or r_nodes > 1:
        t.decide("trainer.nnodes" if t_nodes > 1 else nodes_key,
                 f"veRL's run spanned {t_nodes} trainer and {r_nodes} rollout machines: verirl's producers take the "
                 f"weights through shared memory, so an asynchronous run is on one machine (trainer.nnodes 1) and the "
                 f"devices are written as one machine's; with fewer, keep the ratio of trainers to producers")
    _producer_layout(t, nproc)
    return keys


def _producer_layout(t: Translation, nproc: int) -> None:
    """A producer is one process decoding with the whole weights (rollout.tensor_parallel_size 1)."""
    key, engine = R + "tensor_model_parallel_size", t.out.get("rollout.engine", "native")
    size = int(t.out.get("rollout.tensor_parallel_size", 0) or 0) or (
        1 if engine == "hf" else int(t.out.get("actor.tensor_parallel_size", 1)))
    if size > 1:
        t.put("rollout.tensor_parallel_size", 1, key)
        t.decide(key, f"the rollout decoded over {size} devices a replica: a verirl producer is one process decoding "
                      f"with the whole weights on its device, so rollout.tensor_parallel_size=1 is written and each of "
                      f"the {nproc} producers holds the whole model (it must fit one device; the trainers may stay "
                      f"split)")


def _partial(t: Translation, key: str, bound: str, k: int) -> None:
    """Partial rollouts: a sequence still decoding when new weights arrive continues on them (verirl's native engine
    loads each newer version between decoding steps, in mode bounded, single-turn, without a filtered step)."""
    engine = t.out.get("rollout.engine", "native")
    why = ("max_staleness 0: no weights arrive while a step decodes" if not k else
           f"rollout.engine={engine} decodes each call to its end (verirl's native engine loads new weights between "
           f"decoding steps)" if engine != "native" else
           "verirl's multi-turn episodes keep one version per episode" if t.out.get("rollout.multi_turn.enable") else
           "a filtered step (algo.filter_groups) reorders its groups" if t.out.get("algo.filter_groups.enable") else "")
    if why:
        t.put("trainer.async_training.partial_rollout", False, key)
        t.decide(key, f"veRL continues the sequences in flight on new weights (partial rollouts); verirl cannot here: "
                      f"{why}. false written: they finish on the weights they started with")
        return
    t.put("trainer.async_training.partial_rollout", True, key,
          note=f"a sequence still decoding when new weights arrive goes on with them, each token's version and "
               f"log-prob recorded, in both; {bound}; verirl samples a step's first tokens at most max_staleness "
               f"versions old")


def _staleness_correction(t: Translation, k: int, keys: list[str], what: str) -> None:
    """verirl trains on samples up to k > 0 versions old only with an off-policy correction (run/checks.py): its
    default is written where veRL's run had none."""
    from verirl.config import Config

    rc = Config().algo.rollout_correction
    bypass = ("; veRL's PPO ratio was taken to the rollout's log-probs (bypass_mode), its clip the only guard"
              if t.get(RC + "bypass_mode") else "")
    t.put("algo.rollout_correction.rollout_is", None, *keys)
    for name in ("rollout_rs", "rollout_rs_threshold", "rollout_rs_threshold_lower"):
        t.put(f"algo.rollout_correction.{name}", getattr(rc, name), *keys)
    for key in keys:
        t.decide(key, f"{what}{bypass}. With max_staleness {k} verirl trains on samples up to {k} "
                      f"version{'' if k == 1 else 's'} old only "
                      f"under an off-policy correction, so its default is written: a sequence whose ratio exp(old - "
                      f"rollout log-prob) is above {rc.rollout_rs_threshold:g} is rejected (rollout_rs "
                      f"{rc.rollout_rs}); rollout_is=token adds truncated importance weights (AReaL's decoupled loss, "
                      f"docs/async.md)")


def _hybrid_engine(t: Translation, kind: str) -> None:
    """actor_rollout_ref.hybrid_engine: main_ppo's trainers assert it, the recipes assert it off."""
    key = "actor_rollout_ref.hybrid_engine"
    if not t.given(key):
        return
    on = bool(t.get(key))
    if kind in RECIPES:
        if on:
            t.decide(key, f"true: veRL's {kind} recipe refuses it (an assert): its rollout runs on GPUs of its own, "
                          f"verirl's rollout.placement=separate")
        else:
            t.translated(key, "false: the rollout on GPUs of its own, as the recipe asserts: rollout.placement="
                              "separate", ["rollout.placement"])
    elif on:
        t.ignore(key, "true: actor, rollout and reference share the trainer's devices (veRL's trainer asserts it), "
                      "verirl's rollout.placement=colocated" + ("; separate_async's standalone rollout GPUs are "
                                                               "rollout.nproc" if kind == "separate_async" else ""))
    else:
        t.decide(key, "false: veRL's trainer refuses it (only the hybrid engine is supported); verirl colocates")


def _recipe_keys(t: Translation, kind: str) -> None:
    """The recipes' keys that shape no verirl setting, and those of the fully-async recipe of January 2026
    (volcengine/verl b178a3cd: async_training.use_rollout_log_probs, compute_prox_log_prob, checkpoint_engine)."""
    if kind not in RECIPES:
        return
    t.ignore("rollout.n", "not read: the samples per prompt are actor_rollout_ref.rollout.n")
    t.ignore(A + "use_rollout_log_probs", "the actor's copy of async_training.use_rollout_log_probs (January 2026: "
                                          "the update then takes the batch's old log-probs); read by no code of "
                                          "verl-project/verl at 1dda039b, where they follow "
                                          "algorithm.rollout_correction.bypass_mode")
    t.ignore(R + "standalone_gpu_memory_utilization", "vLLM's memory share on the rollout's own GPUs: set "
                                                      "rollout.gpu_memory_utilization for this machine")
    t.ignore(AT + "use_trainer_do_validate", "which GPUs validate: the same evaluation")
    t.ignore(AT + "concurrent_samples_per_replica", "requests in flight per vLLM replica: throughput only")
    engine = "actor_rollout_ref.checkpoint_engine"  # January 2026: ${oc.select:async_training.checkpoint_engine}
    for key in [*t.under(AT + "checkpoint_engine"), *t.under(engine), *([engine] if t.given(engine) else [])]:
        t.ignore(key, "how veRL moves the weights to the rollout's GPUs: verirl's producers read them from shared "
                      "memory")
    dynamic = AT + "use_dynamic_resource_scheduling"
    if t.get(dynamic, False):
        t.decide(dynamic, "veRL lends the trainer's GPUs to generation between updates: verirl's trainers do not "
                          "generate")
    else:
        t.ignore(dynamic, "false: the rollout keeps its own GPUs")
    for key in t.under(AT[:-1]):
        if key.startswith(AT + "dynamic_schedule_"):
            t.ignore(key, "read only with use_dynamic_resource_scheduling")
    use, prox = AT + "use_rollout_log_probs", AT + "compute_prox_log_prob"
    if t.given(use):
        if t.get(use) and not t.get(prox, False):
            t.decide(use, "true with compute_prox_log_prob false: veRL takes the rollout's log-probs as the old "
                          "policy's; verirl recomputes them with the weights that train the step and corrects the "
                          "difference (algo.rollout_correction)")
            t.ignore(prox, "false: see use_rollout_log_probs")
        elif t.get(use):
            t.translated(use, "with compute_prox_log_prob: the trainer recomputes the old log-probs, as verirl")
            t.translated(prox, "veRL recomputes them with the weights of the sync period's first update, verirl with "
                               "the weights that train the step: the same with trigger_parameter_sync_step 1")
        else:
            t.translated(use, "false: the trainer recomputes the old log-probs with its weights, as verirl")
            t.ignore(prox, "read only with use_rollout_log_probs")


# (switch, what it turns on, the section read only with it): off, the switch and its section are ignored.
SWITCHES = [
    (A + "qat.enable", "quantization-aware training: not available in verirl", A + "qat"),
    *[(f"skip.{name}.enable", "veRL reuses rollouts cached in dump_dir: verirl's rollout.engine=replay replays a "
                              "rollouts.jsonl (docs/alignment.md)", f"skip.{name}")
      for name in ("rollout", "rollout_tq", "async_rollout")],
]


def _v1_trainer(t: Translation, kind: str) -> None:
    """trainer.use_v1 (true at veRL's head): the v1 trainer, whose sync mode is one rollout then its update, as verirl
    trains; its asynchronous modes are _async's."""
    mode_key = "trainer.v1.trainer_mode"
    mode = t.get(mode_key, "sync")
    if kind in RECIPES:
        for key in ["trainer.use_v1", *t.under("trainer.v1")]:
            t.ignore(key, f"read by verl.trainer.main_ppo only: the {kind} recipe runs a trainer of its own")
        return
    if not t.get("trainer.use_v1", False):
        t.ignore("trainer.use_v1", "false: veRL's classic trainer, one rollout then its update, as verirl")
        for key in t.under("trainer.v1"):
            t.ignore(key, "read only with trainer.use_v1, which is off")
        return
    if mode == "sync":
        t.translated("trainer.use_v1", "veRL's v1 trainer, here in sync mode: one rollout then its update, as verirl")
        t.translated(mode_key, "sync: on-policy rollouts, as verirl's")
    else:
        t.translated("trainer.use_v1", "veRL's v1 trainer (see trainer.v1.trainer_mode)")
    for key in t.under("trainer.v1"):
        if not t.rows[key].status:
            section = key.split(".")[2]
            t.ignore(key, f"a setting of the v1 trainer's {section} mode or sampler"
                          + (f", not used in {mode} mode" if section != mode and (mode == "sync" or section in V1_MODES)
                             else "; see trainer_mode"))


def _switches(t: Translation) -> None:
    for key, what, section in SWITCHES:
        if t.get(key, False):
            t.decide(key, what)
        else:
            t.ignore(key, "false: off")
            for other in t.under(section):
                t.ignore(other, f"read only with {key}, which is off")


def _trainer(t: Translation, kind: str) -> None:
    # the fully-async trainer saves and validates every N parameter versions, trigger_parameter_sync_step updates each
    # (fully_async_trainer.py: current_param_version); volcengine/verl of January 2026 read rollout.test_freq
    every = int(t.get(AT + "trigger_parameter_sync_step")) if kind == FULLY_ASYNC else 1
    test_key = "rollout.test_freq" if kind == FULLY_ASYNC and t.given("rollout.test_freq") else "trainer.test_freq"
    if test_key != "trainer.test_freq":
        t.ignore("trainer.test_freq", "volcengine/verl's fully-async trainer of January 2026 validates every "
                                      "rollout.test_freq parameter versions")
    versions = f" parameter versions x trigger_parameter_sync_step {every} updates each" if every > 1 else ""
    save = int(t.get("trainer.save_freq"))
    t.put("trainer.save_freq", max(save, 0) * every, "trainer.save_freq",
          note=(f"every {save}{versions} = {save * every} steps" if versions else "every N steps") if save > 0
          else "veRL's -1 never saves; verirl's 0 saves only at the end")
    test = int(t.get(test_key))
    t.put("eval.every", max(test, 0) * every, test_key,
          note=f"evaluate every {test}{versions} = {test * every} steps" if versions and test > 0
          else "evaluate every N steps")
    t.put("eval.at_end", test > 0, test_key,
          note="veRL also evaluates after the last step when test_freq > 0")
    if t.given(R + "val_kwargs.do_sample") or t.given(R + "val_kwargs.n") or t.given("trainer.test_freq"):
        if t.get(R + "val_kwargs.do_sample"):
            t.put("eval.n", int(t.get(R + "val_kwargs.n")), R + "val_kwargs.n", R + "val_kwargs.do_sample",
                  note="sampled responses per problem")
            t.put("eval.temperature", float(t.get(R + "val_kwargs.temperature")), R + "val_kwargs.temperature")
            t.put("eval.greedy", False, R + "val_kwargs.do_sample")
            if t.given(R + "val_kwargs.top_p"):
                t.put("eval.top_p", float(t.get(R + "val_kwargs.top_p")), R + "val_kwargs.top_p")
            if t.given(R + "val_kwargs.top_k"):
                t.put("eval.top_k", _top_k(t.get(R + "val_kwargs.top_k")), R + "val_kwargs.top_k",
                      note="vLLM's -1 (off) is verirl's 0")
        else:
            t.put("eval.n", 0, R + "val_kwargs.do_sample", note="do_sample=false: veRL validates greedily, once")
            t.put("eval.greedy", True, R + "val_kwargs.do_sample")
            t.ignore(R + "val_kwargs.n", "do_sample=false: one greedy response")
            t.ignore(R + "val_kwargs.temperature", "do_sample=false: greedy")
            t.ignore(R + "val_kwargs.top_p", "do_sample=false: greedy")
            t.ignore(R + "val_kwargs.top_k", "do_sample=false: greedy")
    if t.given("trainer.experiment_name") or t.given("trainer.project_name"):
        run_dir = f"runs/{t.get('trainer.project_name')}/{t.get('trainer.experiment_name')}"
        t.put("trainer.run_dir", run_dir, "trainer.project_name", "trainer.experiment_name",
              note="verirl's run folder, named after the experiment")
    mode = t.get("trainer.resume_mode", "auto")
    if not t.given("trainer.resume_mode"):
        pass
    elif mode in ("auto", "disable"):
        t.put("trainer.resume", "auto" if mode == "auto" else "false", "trainer.resume_mode",
              note="auto: continue from the run folder's newest checkpoint")
    else:
        t.decide("trainer.resume_mode", f"resume_mode={mode}: the checkpoint is the other machine's (veRL's format); "
                                        f"start fresh or convert it")
    keep = t.get("trainer.max_actor_ckpt_to_keep", None)
    if keep is not None:
        t.put("trainer.keep_checkpoints", int(keep), "trainer.max_actor_ckpt_to_keep")
    if t.get("trainer.rollout_data_dir", None) is not None:
        t.put("trainer.dump_rollouts", True, "trainer.rollout_data_dir",
              note="verirl writes RUN_DIR/rollouts.jsonl (with token ids, for replay)")
    if t.get("trainer.val_only", False):
        t.decide("trainer.val_only", "evaluation only: use `verirl eval`")
    if t.given("actor_rollout_ref.nccl_timeout"):
        t.put("trainer.dist_timeout_s", int(t.get("actor_rollout_ref.nccl_timeout")), "actor_rollout_ref.nccl_timeout",
              note="seconds before a stuck collective ends the run")
    strategy = t.get(A + "strategy")
    if t.given(A + "strategy"):
        t.put("actor.strategy", "fsdp2", A + "strategy",
              note="verirl shards by data parallelism with FSDP2" + (
                  "; Megatron's tensor, context and pipeline parallelism are translated (actor.tensor_parallel_size, "
                  "actor.sequence_parallel_size, actor.pipeline_parallel_size)" if strategy == "megatron" else ""))


def translate(t: Translation) -> None:
    """Every veRL key the tables know, in the order a step uses them."""
    kind = _which_trainer(t)
    t.defaults.update(TRAINER_DEFAULTS.get(kind, {}))
    t.apply(DIRECT)
    _advantages(t)
    _batches(t, kind)
    _engine(t)
    _multi_turn(t)
    _layout(t)
    _experts(t)
    _kl(t)
    _clip(t)
    _policy_loss(t)
    _loss_scale(t)
    _rollout_correction(t, _max_staleness(t, kind))
    _optimizer(t)
    steps = _steps(t, kind)
    _warmup(t, steps, kind)
    _data(t)
    _model(t)
    translate_rewards(t)
    translate_distillation(t)
    _filter_groups(t, kind)
    _overlong(t)
    _trainer(t, kind)
    _async(t, kind)
    _switches(t)
    _v1_trainer(t, kind)
    fit_multi_turn(t, "veRL")
