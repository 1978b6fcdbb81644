"""veRL's reward keys -> verirl's rules and reward services, and its on-policy distillation -> algo.distill.

Read by `verirl.tools.align.convert_verl.translate`. What veRL does, from verl-project/verl at 1dda039b
(2026-08-22): verl/trainer/config/reward/reward.yaml and legacy_reward_impl.yaml; experimental/reward_loop/
reward_loop.py (migrate_legacy_reward_impl copies the top-level custom_reward_function, sandbox_fusion and the
non-null reward_model keys over the reward section; RewardLoopWorker.compute_score: a custom function scores when
set, else a discriminative reward model served by vLLM (/classify, the last logit, the reward model's chat
template over the prompt and response), else the default reward); trainer/ppo/reward.py (the SandboxFusion URL
reaches only the default reward); utils/reward_score/__init__.py, sandbox_fusion/__init__.py, prime_code/__init__.py
(code rows, data_source codecontests / apps / codeforces / taco: the share of the first 10 tests passed, 10 s each,
a fenced block required by the sandbox client); the reward managers (experimental/reward_loop/reward_manager/,
workers/reward_manager/prime.py, batch.py); trainer/config/distillation/distillation.yaml and
trainer/distillation/losses.py (use_policy_gradient: the negated per-token KL estimate is the advantage of a policy
loss; else the estimate is back-propagated as a loss). From volcengine/verl at b178a3cd (2026-01-29): the
reward_model section before the reward section (reward_model/reward_model.yaml, dp_reward_loop.yaml,
workers/reward_manager/naive.py, which returns a reward model's scores in place of the function's).
"""
from __future__ import annotations

from typing import Any, Optional

from verirl.tools.align.convert import Translation, peer_tables

A = "actor_rollout_ref.actor."
D, DL = "distillation.", "distillation.distillation_loss."
LEGACY_FUNCTION = ("custom_reward_function.path", "custom_reward_function.name")
FUNCTION = ("reward.custom_reward_function.path", "reward.custom_reward_function.name")
MANAGER_KEYS = ("reward_model.reward_manager", "reward.reward_manager.name", "reward_manager.name")
# where veRL configs hold the SandboxFusion client, in the order veRL reads them: the top-level section of
# legacy_reward_impl.yaml (copied over reward.sandbox_fusion), reward_model's (veRL until 2026), the reward section's
SANDBOXES = ("sandbox_fusion", "reward_model.sandbox_fusion", "reward.sandbox_fusion")
# reward_model keys that belong to the reward function's side, read elsewhere (the overlong penalty, the manager)
NOT_THE_MODEL = ("reward_model.reward_manager", "reward_model.reward_kwargs", "reward_model.overlong_buffer",
                 "reward_model.sandbox_fusion", "reward_model.num_workers", "reward_model.reward_loop_",
                 "reward_model.launch_reward_fn_async", "reward_model.profiler")
# veRL's default reward on code rows (verl/utils/reward_score/__init__.py): continuous=True in both clients
CODE_TESTS, CODE_TEST_TIMEOUT = 10, 10.0
CODE_SOURCES = "codecontests, apps, codeforces, taco"

# veRL's reward managers: name -> {same: verirl's rules score alike, note}
MANAGERS: dict[str, dict[str, Any]] = peer_tables("verl.yaml")["reward_managers"]


def reward_function_keys(t: Translation) -> tuple[str, str]:
    """(path key, name key) veRL reads: the top-level custom_reward_function where any of its values is set (veRL
    copies it over reward.custom_reward_function, reward_loop.py), else reward.custom_reward_function."""
    if any(t.values.get(k) is not None for k in LEGACY_FUNCTION) or not any(t.given(k) for k in FUNCTION):
        for key in FUNCTION:
            t.ignore(key, "the top-level custom_reward_function is set: veRL copies it over this section")
        return LEGACY_FUNCTION
    for key in LEGACY_FUNCTION:
        t.ignore(key, "null: veRL reads reward.custom_reward_function")
    return FUNCTION


def reward_manager_key(t: Translation) -> Optional[str]:
    """The reward-manager key veRL reads: reward_model.reward_manager where set (veRL copies it over
    reward.reward_manager.name, reward_loop.py), else reward.reward_manager.name, else the old reward_manager.name."""
    keys = [k for k in MANAGER_KEYS if t.values.get(k) is not None]
    return keys[0] if keys else None


def _reward_manager(t: Translation) -> Optional[str]:
    key = reward_manager_key(t)
    if key is None:
        return None
    for other in MANAGER_KEYS:
        if other != key:
            t.ignore(other, f"{key} is the reward manager veRL uses")
    name = str(t.get(key))
    known = MANAGERS.get(name)
    if known is None:
        t.decide(key, f"reward manager {name!r}: verirl scores each response with reward.verifiers, as veRL's naive "
                      f"manager; check what {name!r} adds")
    elif known["same"]:
        t.translated(key, f"{name}: {known['note']}")
    else:
        t.decide(key, f"{name}: {known['note']}")
    if name == "prime":
        t.put("reward.timeout", 300.0, key, note="prime gives each response 300 s, then scores it 0, as verirl's "
                                                 "reward.timeout")
    return name


def _model_keys(t: Translation) -> tuple[str, Optional[str]]:
    """(enable key, model path key or None) veRL reads: reward_model.* where set (migrate_legacy_reward_impl copies
    them over reward.reward_model), else reward.reward_model.*."""
    enable = "reward_model.enable" if t.values.get("reward_model.enable") is not None or not t.given(
        "reward.reward_model.enable") else "reward.reward_model.enable"
    paths = [k for k in ("reward_model.model.path", "reward.reward_model.model_path") if t.values.get(k) is not None]
    for keys, chosen in ((("reward_model.enable", "reward.reward_model.enable"), enable),
                         (("reward_model.model.path", "reward.reward_model.model_path"), paths[0] if paths else None)):
        for other in keys:
            if other != chosen and chosen is not None:
                t.ignore(other, f"veRL copies {chosen} over it" if other.startswith("reward.") else
                         f"null: veRL reads {chosen}")
    return enable, paths[0] if paths else None


def _engine_key(t: Translation, leaf: str) -> str:
    """The reward model's serving key ``leaf`` veRL reads: reward_model.rollout.* where set (copied over), else
    reward.reward_model.rollout.*."""
    legacy = f"reward_model.rollout.{leaf}"
    return legacy if t.values.get(legacy) is not None else f"reward.reward_model.rollout.{leaf}"


def _model_sections(t: Translation) -> list[str]:
    """The keys of the reward model itself, in both layouts (not the reward function's side under reward_model)."""
    return [k for k in t.under("reward_model") + t.under("reward.reward_model") if not k.startswith(NOT_THE_MODEL)]


def _unclaimed(t: Translation, keys: list[str], why) -> None:
    for key in keys:
        if not t.rows[key].status:
            t.ignore(key, why(key))


def _longest(t: Translation) -> int:
    from verirl.config import Config

    cfg = Config()
    return int(t.out.get("data.max_prompt_length", cfg.data.max_prompt_length)) + int(
        t.out.get("rollout.max_new_tokens", cfg.rollout.max_new_tokens))


def _budget(t: Translation, budget: int, keys: list[str], how: str) -> None:
    longest = _longest(t)
    if budget < longest:
        t.put("reward.model.max_token_len", longest, *keys,
              note=f"{how} = {budget} tokens, under the longest sequence (prompt + response = {longest}), which one "
                   f"forward pass must hold: {longest} written")
    else:
        t.put("reward.model.max_token_len", budget, *keys, note=f"{how} = {budget} tokens per forward pass, packed "
                                                                f"greedily as verirl's log-prob passes")


def _discriminative(t: Translation, enable: str, path_key: str, legacy_worker: bool) -> None:
    """A reward model whose score is the reward: verirl's rule 'model' alone, as veRL's reward."""
    path = str(t.get(path_key))
    t.put("reward.model.path", path, path_key, enable,
          note="a sequence-classification model scoring the prompt and response under its own chat template; veRL "
               "takes its last logit (a one-label head's only one), verirl reward.model.index 0")
    t.put("reward.verifiers", ["model"], enable, note="the reward model's score is the reward, as in veRL (its "
                                                      "naive manager returns the model's scores in place of rules')")
    t.put("reward.weights", [1.0], enable)
    t.check(f"reward.model.path ({path}) is the other machine's: point it at the reward model's Hugging Face "
            f"directory (AutoModelForSequenceClassification)")
    t.ignore("data.reward_fn_key", "the reward model scores every response: veRL's default reward is not used")
    if legacy_worker:  # veRL's FSDP reward-model worker: micro-batches of sequences or a token budget
        if t.get("reward_model.use_dynamic_bsz", False):
            key = "reward_model.forward_max_token_len_per_gpu"
            _budget(t, int(t.get(key, 32768)), [key, "reward_model.use_dynamic_bsz"],
                    "forward_max_token_len_per_gpu (veRL's default: the critic's 32768)")
        else:
            key = next((k for k in ("reward_model.micro_batch_size_per_gpu", "reward_model.micro_batch_size")
                        if t.values.get(k) is not None), None)
            micro = int(t.get(key)) if key else 1
            _budget(t, micro * _longest(t), [key] if key else [enable],
                    f"{micro} sequence{'' if micro == 1 else 's'} per micro-batch x the longest")
        max_length = t.get("reward_model.max_length", None)
        if max_length is not None and int(max_length) < _longest(t):
            t.decide("reward_model.max_length", f"veRL cuts the reward model's input at {max_length} tokens (when its "
                                                f"chat template differs from the policy's); verirl scores whole "
                                                f"sequences")
        t.translated("reward_model.use_reward_loop", "false: veRL's reward-model worker scores on the trainer's GPUs, "
                                                     "as verirl's rule 'model' does")
    else:  # the reward loop: a vLLM / SGLang server of the reward model
        key = _engine_key(t, "max_num_batched_tokens")
        _budget(t, int(t.get(key)), [key], "the reward server's tokens per scheduler step")
        dtype_key = _engine_key(t, "dtype")
        dtype = str(t.get(dtype_key))
        if dtype in ("bfloat16", "float16", "float32"):
            t.put("reward.model.dtype", dtype, dtype_key, note="the reward model's weights and compute")
        t.translated("reward_model.use_reward_loop", "veRL's reward loop serves the reward model; verirl runs it in "
                                                     "the trainer's process (rule 'model')")
        for key in ("reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu", "reward_model.max_length",
                    "reward_model.use_dynamic_bsz", "reward_model.forward_max_token_len_per_gpu"):
            t.ignore(key, "read by veRL's reward-model worker only (use_reward_loop false)")
    _unclaimed(t, _model_sections(t), _serving)


def _serving(key: str) -> str:
    if ".rollout." in key:
        return ("the reward model's vLLM / SGLang server (its lengths, memory share, parallel layout): verirl runs the "
                "reward model in the trainer's process and scores each whole sequence")
    if key.endswith(("n_gpus_per_node", "nnodes", "enable_resource_pool", "strategy", "parallel_size")):
        return "where the reward model runs: verirl's runs on the trainer's devices"
    if key.endswith("input_tokenizer"):
        return "the policy's tokenizer, which decodes the response before the reward model's template: as verirl's"
    return "how veRL loads or shards the reward model: verirl loads the Hugging Face directory as it is"


def _generative(t: Translation, enable: str, path_key: Optional[str], fn_key: str) -> None:
    """A reward model beside a custom function: veRL serves it and the function calls it (a generative judge)."""
    where = path_key or enable
    t.decide(where, f"veRL serves the reward model ({t.get(path_key) if path_key else 'no path given'}) for "
                    f"{fn_key}, which calls it at reward_router_address (a generative reward model); verirl serves no "
                    f"model for a rule: serve it with an OpenAI-compatible server (vllm serve PATH) and name 'judge' "
                    f"in reward.verifiers with reward.judge.url / model / template / parse (docs/rewards.md), or give "
                    f"your function the server's URL")
    if path_key:
        t.note(enable, f"see {path_key}")
    _unclaimed(t, _model_sections(t), lambda key: f"the generative reward model's serving, which verirl does not "
                                                  f"run (see {where})")


def _code(t: Translation, section: str) -> None:
    url_key = section + ".url"
    t.put("reward.verifiers", ["code"], url_key,
          note=f"veRL's default reward runs the code rows' programs (data_source {CODE_SOURCES}) against their tests "
               f"in SandboxFusion; verirl's rule 'code' runs them in its own sandbox (verirl.sandbox, "
               f"docs/sandbox.md), not a SandboxFusion server: the URL is not used")
    t.put("reward.weights", [1.0], url_key)
    t.put("reward.code.mode", "fraction", url_key, note="the share of the tests passed (veRL: continuous=True)")
    t.put("reward.code.max_tests", CODE_TESTS, url_key, note=f"veRL scores the first {CODE_TESTS} tests")
    t.put("reward.code.test_timeout_s", CODE_TEST_TIMEOUT, url_key, note="10 s per test, veRL's")
    t.put("reward.code.extract", "block", url_key,
          note="a response without a fenced block scores 0 in both (veRL takes the last ```python block, else the "
               "first ``` block; verirl the last fenced block)")
    for leaf, target, default, what in (
            ("memory_limit_mb", "reward.code.memory_mb", 1024, "memory per program under test, MB"),
            ("max_concurrent", "reward.code.concurrency", 64,
             "programs under test at once: veRL's test runs in flight at the service, verirl's samples at once on "
             "this machine (each running its tests in turn); set it to this machine's cores (0: one per core)")):
        key = section + "." + leaf
        value = t.values.get(key)
        t.put(target, int(default if value is None else value), key if value is not None else url_key,
              note=what if value is not None else f"{leaf} unset: veRL's {default}; {what}")
    t.check(f"{url_key}: the rule 'code' reads each row's tests from its label (veRL's reward_model.ground_truth, "
            f"{{inputs, outputs}} or {{inputs, outputs, fn_name}}) and runs Python; rows of other data sources need "
            f"verirl's rules beside it, routed with reward.tasks (task = veRL's ability column)")
    t.decide("data.reward_fn_key", f"veRL's default reward picks a scorer by each row's data_source: the code rows "
                                   f"({CODE_SOURCES}) are verirl's rule 'code' (written); name verirl's rules for "
                                   f"the others (gsm8k: gsm8k; MATH sets: exact) and route them with reward.tasks")


def _sandbox(t: Translation, used: str) -> None:
    """The SandboxFusion client: verirl's rule 'code' where veRL's default reward uses it (``used`` is "" then,
    else why it is unused)."""
    given = [s for s in SANDBOXES if t.values.get(s + ".url") is not None]
    if not given:
        return
    section = given[0]
    for other in given[1:]:
        for key in t.under(other):
            t.ignore(key, f"veRL reads {section}")
    if used:
        for key in t.under(section):
            t.ignore(key, f"veRL hands the SandboxFusion client to its default reward only, which is not used: {used}")
        return
    _code(t, section)


def translate_rewards(t: Translation) -> None:
    """The reward function, its manager, a reward model, the code sandbox: reward.verifiers and the services."""
    path_key, name_key = reward_function_keys(t)
    path = t.get(path_key, None)
    manager = _reward_manager(t)
    enable, model_key = _model_keys(t)
    model_on = bool(t.get(enable, False))
    legacy_worker = t.values.get("reward_model.use_reward_loop") is False
    if model_on and model_key is None:
        t.decide(enable, "a reward model without a path (veRL before 2026 defaulted reward_model.model.path to "
                         "~/models/FsfairX-LLaMA3-RM-v0.1): give reward.model.path and name 'model' in "
                         "reward.verifiers")
    discriminative = model_on and model_key is not None and (path is None or legacy_worker)
    if path is not None and not discriminative:
        name = t.get(name_key, None) or "compute_score"
        t.put("reward.verifiers", [f"{path}:{name}"], path_key, name_key)
        t.put("reward.weights", [1.0], path_key)
        wrapper = (f"def rule(responses, ground_truth, data_source, extra_info): return {name}(data_sources="
                   f"data_source, solution_strs=responses, ground_truths=ground_truth, extra_infos=extra_info) "
                   f"(a list rule, as the batch manager calls it)" if manager == "batch" else
                   f"def rule(response, ground_truth, data_source): return {name}(data_source, response, ground_truth)")
        t.decide(path_key,
                 f"veRL calls {name}(data_source, solution_str, ground_truth, extra_info); verirl passes the response "
                 f"first and the rest by name (label or ground_truth, data_source, task): wrap it, e.g. {wrapper}, "
                 f"and name the wrapper in reward.verifiers")
        t.check(f"the reward function {path} is the other machine's file: copy it")
        t.ignore("data.reward_fn_key", "the column veRL hands the reward function as data_source: verirl passes "
                                       "data_source by name to a rule that takes it")
    elif path is not None:
        t.decide(path_key, "veRL's reward-model worker (use_reward_loop false) returns the reward model's scores in "
                           "place of this function's: the rule 'model' is written alone")
        t.ignore(name_key, f"{path_key} is not used")
    else:
        t.ignore(path_key, "null: veRL's default reward, by data_source" if not discriminative else
                 "null: the reward model scores")
        t.ignore(name_key, f"{path_key} is null: the name is unused")
    if discriminative:
        _discriminative(t, enable, model_key, legacy_worker)
    elif model_on:
        _generative(t, enable, model_key, path_key)
    else:
        t.ignore("reward_model.use_reward_loop", "the reward model is off")
    _sandbox(t, "custom_reward_function is set" if path is not None else
             "the reward model scores every response" if discriminative else "")
    row = t.rows.get("data.reward_fn_key")
    if path is None and not discriminative and not (row and row.status):
        t.decide("data.reward_fn_key",
                 "veRL's default reward picks a scorer by each row's data_source (gsm8k: 1/0 on the number after "
                 "####, as verirl's gsm8k rule; MATH sets: 1/0 on the boxed answer, nearest verirl rule exact; code "
                 f"sets ({CODE_SOURCES}): the share of the first {CODE_TESTS} tests passed, run locally without a "
                 f"sandbox URL, verirl's rule 'code' with reward.code.max_tests={CODE_TESTS}); name verirl's rules in "
                 f"reward.verifiers (verirl's defaults [acc, format] are left)")


# ---------------------------------------------------------------- on-policy distillation

def _teachers(t: Translation) -> list[str]:
    """The teacher entries veRL uses: teacher_model is dropped when other entries are added (distillation.yaml)."""
    names = list(dict.fromkeys(k.split(".")[2] for k in t.under(D + "teacher_models")))
    others = [n for n in names if n != "teacher_model"]
    for key in t.under(D + "teacher_models.teacher_model") if others else []:
        t.ignore(key, "veRL drops the teacher_model entry when other teachers are added")
    return others or names


def translate_distillation(t: Translation) -> None:
    """distillation.* -> algo.distill: one teacher whose per-token reverse KL (k1) is a policy-gradient advantage."""
    on = D + "enabled"
    if not t.get(on, False):
        t.ignore(on, "false: off")
        for key in t.under(D[:-1]):
            t.ignore(key, f"read only with {on}, which is off")
        return
    teachers = _teachers(t)
    paths = {n: t.values.get(f"{D}teacher_models.{n}.model_path") for n in teachers}
    if len(teachers) > 1:
        t.decide(on, f"{len(teachers)} teachers ({', '.join(teachers)}), each scoring the rows whose "
                     f"{t.get(D + 'teacher_key', 'data_source')} is its key: verirl distills from one teacher "
                     f"(algo.distill.teacher); none written")
    elif not teachers or paths[teachers[0]] is None:
        t.decide(on, "no teacher model_path: give algo.distill.teacher (a model with the student's tokenizer)")
    else:
        key = f"{D}teacher_models.{teachers[0]}.model_path"
        t.put("algo.distill.teacher", str(paths[teachers[0]]), key, on,
              note="the teacher scores each sampled token; verirl runs it in the trainer's processes, token-budgeted "
                   "and packed like the reference pass (timing/teacher), and refuses one whose tokenizer differs")
        t.check(f"algo.distill.teacher ({paths[teachers[0]]}) is the other machine's: point it at the teacher's "
                f"Hugging Face directory")
    _distill_loss(t)
    for key in t.under(D[:-1]):
        if not t.rows[key].status:
            t.ignore(key, "the teacher's vLLM server and its devices: verirl computes the teacher's log-probs in the "
                          "trainer's processes" if ".teacher_models." in key or key.endswith(("n_gpus_per_node",
                                                                                               "nnodes"))
                     else "routes rows among several teachers: one here" if key == D + "teacher_key"
                     else "a setting of another distillation loss mode")


def _distill_loss(t: Translation) -> None:
    mode_key, pg_key, tasks_key, coef_key = DL + "loss_mode", DL + "use_policy_gradient", DL + "use_task_rewards", \
        DL + "distillation_loss_coef"
    mode = str(t.get(mode_key, "k3"))
    pg = bool(t.get(pg_key, False))
    if not pg:
        t.decide(pg_key, f"false: veRL back-propagates the {mode} estimate of the KL to the teacher as a loss "
                         f"(supervised, GKD's form); verirl's distillation is the policy-gradient form only (veRL's "
                         f"use_policy_gradient true with loss_mode k1): the reverse KL estimate as each token's "
                         f"advantage")
    elif mode in ("k1", "kl"):
        t.translated(pg_key, "true: the negated per-token distillation loss is the advantage of a policy loss, as "
                             "verirl's", ["algo.distill.teacher"])
        t.translated(mode_key, f"{mode}: student log-prob - teacher log-prob of each sampled token, whose negation is "
                               f"verirl's advantage (teacher - student)", ["algo.distill.teacher"])
    else:
        t.decide(mode_key, f"{mode}: veRL's advantage is minus the {mode} estimate; verirl's is minus k1 (teacher "
                           f"log-prob - student log-prob)")
    if mode != "forward_kl_topk":
        t.ignore(DL + "topk", "read only with loss_mode forward_kl_topk")
    tasks = bool(t.get(tasks_key, True))
    t.put("algo.distill.rewards", tasks, tasks_key,
          note="the rules' group advantage added to the distillation's" if tasks else
          "false: the distillation advantage alone")
    if tasks:
        coef = float(t.get(coef_key, 1.0))
        t.put("algo.distill.coef", coef, coef_key,
              note="the distillation term's weight; veRL adds a second policy loss with the distillation advantage "
                   "to the task one, verirl adds the advantages under one loss: the same while the ratio stays "
                   "inside the clip (an on-policy update), the clip acting on the sum after")
    else:
        t.put("algo.distill.coef", 1.0, tasks_key, note="use_task_rewards false: veRL weighs the distillation loss 1")
        t.ignore(coef_key, "read only with use_task_rewards true")
    clamp = t.get(DL + "loss_max_clamp", None)
    if clamp is None:
        t.ignore(DL + "loss_max_clamp", "null: no clamp, as verirl")
    else:
        t.decide(DL + "loss_max_clamp", f"{clamp}: veRL clamps each token's distillation loss to [-{clamp}, {clamp}]; "
                                        f"verirl does not clamp the distillation advantage")
    if mode != "forward_kl_topk":
        t.ignore(DL + "log_prob_min_clamp", "read only with loss_mode forward_kl_topk (its top-k log-probs)")
    if pg:
        _distill_clip(t)
    else:
        for leaf in ("policy_loss_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            t.ignore(DL + leaf, "read only with use_policy_gradient true")


def _distill_clip(t: Translation) -> None:
    """With use_policy_gradient veRL runs the distillation advantage through a policy loss of its own; verirl through
    the actor's (algo.policy_loss, algo.clip_ratio_low/high)."""
    loss = t.get(DL + "policy_loss_mode", "vanilla")
    actor_loss = t.get(A + "policy_loss.loss_mode", "vanilla")
    if loss == actor_loss:
        t.translated(DL + "policy_loss_mode", f"{loss}, the actor's: verirl's one policy loss (algo.policy_loss)")
    else:
        t.decide(DL + "policy_loss_mode", f"{loss}, where the actor's is {actor_loss}: verirl runs the distillation "
                                          f"advantage through the actor's policy loss (algo.policy_loss)")
    ratio = t.get(DL + "clip_ratio", 0.2)
    for side in ("low", "high"):
        key = f"{DL}clip_ratio_{side}"
        value = t.get(key, None)
        value = float(ratio if value is None else value)
        actor = t.out.get(f"algo.clip_ratio_{side}")
        if actor is None or abs(value - float(actor)) < 1e-12:
            t.translated(key, f"{value:g}, the actor's clip_ratio_{side}", [f"algo.clip_ratio_{side}"])
        else:
            t.decide(key, f"{value:g}, where the actor clips at {actor:g}: verirl clips the summed advantage at "
                          f"algo.clip_ratio_{side}")
    t.translated(DL + "clip_ratio", "the fallback of clip_ratio_low / high")
