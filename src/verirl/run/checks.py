"""The one check of a config before a run: `check` runs `RULES` in order, and the first rule that fails
raises one paragraph (`ConfigError` or another `UserError`) naming the key, the value and the fix.

The rules: the values alone (`verirl.config.values.VALUE_RULES`: finiteness, each key's declared
bounds and names, the batch arithmetic), the layout of ranks (`verirl.config.layout.check_layout`),
the names each room's registry knows, the reward rules, the algorithm options, the layout an activation
dump runs on (data-parallel only), then what needs this
machine: installed packages, paths, the run directory, the model directory (`verirl.models.diagnose`,
no weights read), the launch, the data's template, the modules an activation dump names. They live here, above the config, because the
names are the rooms' (models, data, rollout, rewards). `verirl train` and `verirl plan` run them
before anything heavy (no model loaded, nothing written); `verirl eval` runs them on the config its
flags make, without the run directory it does not write; `verirl convert-config` runs the values and
names alone, for a config that names another machine's files.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from verirl.config import Config
from verirl.config.layout import check_layout, data_parallel_size, rollout_tensor_parallel, world_size
from verirl.config.values import VALUE_RULES
from verirl.core.errors import ConfigError


class Ask(NamedTuple):
    """What one `check` was asked for, as its rules read it."""
    paths: bool  # this machine's files may be read
    import_rules: bool  # custom reward rules are imported (their top level runs), not only read
    devices: Optional[tuple[str, int]]  # (kind, count) of the local launcher's devices; None: no limit
    run_dir: bool = True  # the command writes trainer.run_dir (`verirl eval` writes none)


class Rule(NamedTuple):
    name: str
    run: Callable[[Config, Ask], None]
    machine: bool  # reads this machine: files, the model directory, installed packages, imports, the launch


def check(cfg: Config, *, paths: bool = True, import_rules: bool = True,
          devices: Optional[tuple[str, int]] = None, run_dir: bool = True) -> None:
    """Every rule of `RULES`, in order; raises the first failure's one paragraph.

    ``paths=False``: names and values only (no files, no model directory, no imports, no devices, no
    installed packages). ``import_rules=False`` (`verirl plan`): rule files are read, not run.
    ``devices``: (kind, count) of the accelerators the local launcher would use; None: those visible here
    (`local_devices`). ``run_dir=False``: trainer.run_dir is not checked (nothing is written there)."""
    if paths and devices is None:
        devices = local_devices(cfg)
    ask = Ask(paths, import_rules and paths, devices if paths else None, run_dir)
    for rule in RULES:
        if paths or not rule.machine:
            rule.run(cfg, ask)


def check_names(cfg: Config, ask: Optional[Ask] = None) -> None:
    """Every name of the config is known to its room's registry."""
    from verirl.core.algo import ADVANTAGE_ESTIMATORS, AGGREGATIONS, KL_ESTIMATORS
    from verirl.data.prompts import SHUFFLES, TOO_LONG
    from verirl.data.tasks import TASKS
    from verirl.models.device import DEVICES, check_compute_dtype
    from verirl.models.load import DTYPES
    from verirl.rollout import ENGINES
    from verirl.rollout.replay import REPLAY_EOS, REPLAY_PROMPTS

    for registry, name in [(ENGINES, cfg.rollout.engine), (DTYPES, cfg.model.dtype), (DEVICES, cfg.model.device),
                           (REPLAY_PROMPTS, cfg.rollout.replay_prompts), (REPLAY_EOS, cfg.rollout.replay_eos),
                           (ADVANTAGE_ESTIMATORS, cfg.algo.adv_estimator), (KL_ESTIMATORS, cfg.algo.kl_type),
                           (AGGREGATIONS, cfg.algo.loss_agg_mode), (SHUFFLES, cfg.data.shuffle),
                           (TOO_LONG, cfg.data.too_long)]:
        registry.check(name)
    check_compute_dtype(cfg.model.compute_dtype, cfg.model.dtype)
    if not cfg.data.train_path:
        TASKS.check(cfg.data.task)


def _value_rule(fn: Callable[[Config], None]) -> Rule:
    return Rule(fn.__name__, lambda cfg, ask: fn(cfg), False)


def check_data_reading(handler_name: str, prompt_type: str, templates_file: str) -> None:
    """The handler is known and the template exists (in templates.json or the user's file)."""
    from verirl.data.preprocess import HANDLERS
    from verirl.data.templates import get_template

    HANDLERS.check(handler_name)
    if prompt_type != "tokenizer":
        try:
            get_template(prompt_type, templates_file or None)
        except ConfigError as e:  # preprocess's key is prompt_type, the run's data.prompt_type
            text = str(e)
            raise ConfigError(f"data.{text}" if text.startswith("prompt_type ") else text) from None


def check_model(path: str, template: str = "", templates_file: str = "", key: str = "model.path") -> None:
    """`verirl.models.diagnose`'s error-level findings on a model directory (its config.json, tokenizer files
    and weight file names; no weights read) stop a run, in one paragraph: each is a crash or a run that
    cannot end. The shipped tiny model is consistent (its tests say so)."""
    from verirl.core.errors import ModelError
    from verirl.models.diagnose import diagnose

    if path == "tiny":
        return
    try:
        report = diagnose(path, template if template != "tokenizer" else "", templates_file)
    except ModelError as e:
        raise ModelError(f"{key}='{path}': {e}") from None
    errors = [f for f in report.findings if f.level == "error" and not _other_systems_only(f, report)]
    if errors:
        raise ModelError(f"{key}='{path}' cannot be used as it is (`verirl doctor {path}` says more): "
                         + " ".join(f"[{f.code}] {f.message}" for f in errors))


def _other_systems_only(finding, report) -> bool:
    """A chat template's turn end that verirl's own stop ids hold: only other systems' generation runs on."""
    end = (report.chat_template or {}).get("turn_end") or {}
    return finding.code == "turn-end-not-stop" and end.get("id") in report.ids["verirl"]["eos"]


def local_devices(cfg: Config):
    """(kind, count) of the accelerators the local launcher's ranks take one each of; None for the CPU
    or for ranks that Ray places."""
    from verirl.models.device import visible_devices

    return visible_devices(cfg.model.device) if cfg.trainer.launcher == "local" else None


def check_rules(verifiers, tasks, import_rules: bool = True, paths: bool = True) -> None:
    """Each verifier is a built-in rule or a ``file.py:fn`` / ``module:fn`` that defines the function
    (read first, without running it: `verirl.rewards.check_reference`; then, with ``import_rules``,
    imported, before training writes anything; ``paths=False``: any name is taken as a rule of the machine
    the config is for); each rule a task is routed to is one of the verifiers."""
    from verirl.rewards import RULES, check_reference, load_rule
    from verirl.rewards.services import SERVICES

    names_ok = set(verifiers)
    for name in verifiers:
        if name in RULES or name in SERVICES:
            continue
        if not paths:  # another machine's file or module, or another system's rule: checked where it runs
            names_ok.add(name.rsplit(":", 1)[-1])
            continue
        try:
            names_ok.add(check_reference(name))
            if import_rules:
                load_rule(name)
        except ValueError as e:
            raise ConfigError(str(e) if str(e).startswith("reward.verifiers") else f"reward.verifiers: {e}") from None
    for task, names in tasks.items():
        for name in names:
            if name not in names_ok:
                raise ConfigError(
                    f"reward.tasks.{task} names rule '{name}', which is not in reward.verifiers "
                    f"{list(verifiers)}. Add it there (with a weight) or remove it from the task.")


def check_services(cfg: Config, ask: Ask) -> None:
    """The rules that are services (`verirl.rewards.service`) have what they need: 'remote' a URL, 'judge' a URL
    and a model, 'model' a path; a URL or path given for a service that reward.verifiers does not name is
    refused (it would be silently unused); a named key variable is set (on this machine); the teacher of
    algo.distill is given as a directory."""
    r, names = cfg.reward, set(cfg.reward.verifiers)
    given = {"remote": ("reward.remote.url", r.remote.url), "judge": ("reward.judge.url", r.judge.url),
             "model": ("reward.model.path", r.model.path)}
    for name, (key, value) in given.items():
        if name in names and not value:
            raise ConfigError(f"reward.verifiers names '{name}' but {key} is not set: give it "
                              f"({'the server URL' if name != 'model' else 'the reward model directory'}), "
                              f"or remove '{name}' from reward.verifiers (docs/rewards.md).")
        if value and name not in names:
            raise ConfigError(f"{key}={value!r} is set but reward.verifiers {list(r.verifiers)} does not name "
                              f"'{name}', so it would never be called. Add '{name}' to reward.verifiers with a "
                              f"weight in reward.weights, or unset {key}.")
    if "judge" in names and not r.judge.model:
        raise ConfigError("reward.judge.model is not set: name the model the judge's server serves (what its "
                          "/v1/models lists), e.g. reward.judge.model=Qwen/Qwen2.5-7B-Instruct.")
    for key, url in (("reward.remote.url", r.remote.url), ("reward.judge.url", r.judge.url)):
        if url and not str(url).startswith(("http://", "https://")):
            raise ConfigError(f"{key}={url!r} is not an http:// or https:// URL.")
    for key, var, name in (("reward.remote.api_key_env", r.remote.api_key_env, "remote"),
                           ("reward.judge.api_key_env", r.judge.api_key_env, "judge")):
        if var and name in names and ask.paths and not os.environ.get(var):
            raise ConfigError(f"{key}={var!r} names an environment variable that is not set here: export {var}=<the "
                              f"key> before the run (the key itself is never put in a config).")
    d = cfg.algo.distill
    if d.teacher and cfg.actor.pipeline_parallel_size > 1:
        raise ConfigError(f"algo.distill.teacher with actor.pipeline_parallel_size={cfg.actor.pipeline_parallel_size}"
                          f" is not available: the teacher's layers would need stages of their own. Use tensor "
                          f"parallelism or FSDP2 for the student (the teacher is split the same way).")
    if d.teacher and not d.rewards and d.coef == 0:
        raise ConfigError("algo.distill.coef=0 with algo.distill.rewards=false leaves no advantage: every token "
                          "would get 0. Give coef > 0, or rewards=true.")
    if ask.paths:
        for key, path in (("reward.model.path", r.model.path), ("algo.distill.teacher", cfg.algo.distill.teacher)):
            if path and not os.path.isdir(os.path.expanduser(path)):
                raise ConfigError(f"{key}={path!r} is not a directory: give a Hugging Face model directory "
                                  f"(config.json and weights).")


def check_algorithms(cfg: Config, ask: Optional[Ask] = None) -> None:
    """The algorithm options' names: policy loss, reward scaling, the mismatch guard's modes, and the
    metric the group filter tests."""
    from verirl.core.algo import POLICY_LOSSES
    from verirl.core.algo.advantages import SCALES
    from verirl.core.algo.correction import MODES_IS, MODES_RS

    algo, rc = cfg.algo, cfg.algo.rollout_correction
    POLICY_LOSSES.check(algo.policy_loss)
    for key, value, known in [("algo.scale_rewards", algo.scale_rewards, SCALES),
                              ("algo.rollout_correction.rollout_is", rc.rollout_is, MODES_IS),
                              ("algo.rollout_correction.rollout_rs", rc.rollout_rs, MODES_RS)]:
        if value not in known:
            raise ConfigError(f"{key}={value!r} is not a known name; known: "
                              f"{', '.join('null' if k is None else k for k in known)}.")
    if algo.filter_groups.enable and cfg.rollout.engine == "replay":
        raise ConfigError("algo.filter_groups.enable=true with rollout.engine=replay: a dump holds one generation "
                          "batch per step, so there are no further responses to draw. Turn one of them off.")
    metric, rules = algo.filter_groups.metric, [os.path.basename(v).split(":")[-1] for v in cfg.reward.verifiers]
    if algo.filter_groups.enable and metric != "reward" and metric not in rules:
        raise ConfigError(f"algo.filter_groups.metric={metric!r} is neither reward (the weighted total) nor one of "
                          f"the rules in reward.verifiers ({', '.join(rules)}).")


def check_launch(cfg: Config, ask: Optional[Ask] = None) -> None:
    """Offload settings are ones the strategy can honour, and several machines have a rendezvous."""
    from verirl.config.layout import data_parallel_size

    world = world_size(cfg)
    shards = data_parallel_size(cfg) * cfg.actor.sequence_parallel_size  # the ranks FSDP2 shards over
    if cfg.actor.offload == "params" and (shards == 1 or cfg.actor.strategy != "fsdp2"):
        why = ("one rank" if world == 1 else f"actor.strategy={cfg.actor.strategy}" if cfg.actor.strategy != "fsdp2"
               else f"{world} ranks that all hold parts of one model (tensor x pipeline parallel = the world), "
                    f"so there is no data-parallel rank to shard over")
        raise ConfigError(f"actor.offload=params keeps the parameter shards on the host, which needs FSDP2: it is not "
                          f"available with {why}. Use actor.strategy=fsdp2 with trainer.nproc_per_node >= 2, or "
                          f"actor.offload=optimizer (the optimizer state leaves the device between updates).")
    if cfg.trainer.nnodes > 1 and cfg.trainer.launcher == "local" and not cfg.trainer.rdzv_endpoint:
        raise ConfigError(f"trainer.nnodes={cfg.trainer.nnodes} needs trainer.rdzv_endpoint=HOST:PORT, the same on every "
                          f"machine (e.g. the first machine's address and a free port such as 29400).")


def check_trackers(cfg: Config, ask: Optional[Ask] = None) -> None:
    """log.backends are known and installed; rank 0 alone opens the trackers."""
    from verirl.run.trackers import check_backends

    if os.environ.get("RANK", "0") == "0":
        check_backends(cfg.log.backends)


def check_engine(cfg: Config, ask: Optional[Ask] = None) -> None:
    """An optional engine is installed here and runs in this launch's ranks (a converted config's
    tensor-parallel size is the other machine's)."""
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine=vllm but vLLM is not installed in this environment. Install it with pip "
                          "install 'verirl[vllm]' (on a CPU: make test-vllm builds .venv-vllm; docs/vllm.md), or "
                          "use rollout.engine=native.")
    tp = rollout_tensor_parallel(cfg)
    if cfg.rollout.engine == "vllm" and world_size(cfg) % tp:
        given = "" if cfg.rollout.tensor_parallel_size else " (0: actor.tensor_parallel_size)"
        raise ConfigError(f"rollout.tensor_parallel_size={tp}{given} must divide the {world_size(cfg)} ranks: each "
                          f"group of tensor_parallel_size consecutive ranks runs one vLLM engine (docs/vllm.md).")


def check_launcher(cfg: Config, ask: Optional[Ask] = None) -> None:
    """The launcher the config names is installed here."""
    if cfg.trainer.launcher == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("trainer.launcher=ray but Ray is not installed. Install it with pip install "
                          "'verirl[ray]' (or pip install ray), or use trainer.launcher=local.")


def check_paths(cfg: Config, ask: Optional[Ask] = None) -> None:
    """Data files, the templates file, the evaluation data, the model directory and an explicit
    resume checkpoint exist."""
    if cfg.rollout.engine == "replay" and not cfg.rollout.replay_path:
        raise ConfigError("rollout.engine=replay needs rollout.replay_path: a rollouts.jsonl (a run with "
                          "trainer.dump_rollouts=true writes one) or another system's JSONL dump.")
    for key, path in [("data.train_path", cfg.data.train_path), ("data.templates_file", cfg.data.templates_file),
                      ("eval.data", cfg.eval.data), ("rollout.replay_path", cfg.rollout.replay_path)]:
        if path and not os.path.exists(path):
            raise ConfigError(f"{key}='{path}' does not exist. Give an existing file or folder.")
    from verirl.models.load import resolve_path  # tiny-tools: the shipped directory

    from verirl.models.lora import is_adapter_dir  # a LoRA adapter directory: its base, the adapter merged

    if cfg.model.path != "tiny" and not os.path.isfile(os.path.join(resolve_path(cfg.model.path), "config.json")) \
            and not is_adapter_dir(cfg.model.path):
        what = "has no config.json" if os.path.isdir(cfg.model.path) else "is not a directory"
        raise ConfigError(
            f"model.path='{cfg.model.path}' {what}. Give a Hugging Face model directory "
            f"(config.json, weights, tokenizer) or model.path=tiny for the model shipped with verirl.")
    if ask is None or ask.run_dir:
        check_run_dir(cfg.trainer.run_dir)
    resume = str(cfg.trainer.resume)
    if resume.lower() not in ("auto", "false", "none", "") and not os.path.exists(resume):
        raise ConfigError(f"trainer.resume={resume!r} is neither auto, false nor an existing path. Give auto "
                          f"(continue the run in trainer.run_dir), false (start fresh) or a checkpoint directory.")


def check_run_dir(run_dir: str) -> None:
    """trainer.run_dir is a directory this process may write in, or can be made one: its nearest existing
    ancestor is a writable directory."""
    path = Path(run_dir)
    existing = path
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        where = "is a file" if existing == path else f"would be made inside {existing}, which is a file"
        raise ConfigError(f"trainer.run_dir='{run_dir}' {where}, not a directory. Choose another trainer.run_dir "
                          f"(a new directory, or the directory of a run to continue).")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"trainer.run_dir='{run_dir}' cannot be written: {existing.resolve()} is read-only (a "
                          f"read-only file system, or no write permission for this user). Choose a trainer.run_dir "
                          f"on a writable disk.")


def check_model_dir(cfg: Config, ask: Optional[Ask] = None) -> None:
    """model.path passes `check_model` with the template its prompts are built with."""
    template = cfg.data.prompt_type if (cfg.data.train_path or cfg.eval.data) else ""
    check_model(cfg.model.path, template, cfg.data.templates_file)


def check_started_ranks(cfg: Config, ask: Optional[Ask] = None) -> None:
    """A process started as one of several ranks (torchrun's WORLD_SIZE) matches the config's world size."""
    started, world = os.environ.get("WORLD_SIZE"), world_size(cfg)
    if started is not None and int(started) != world:
        raise ConfigError(f"this process was started as one of {started} ranks (WORLD_SIZE={started}, e.g. by "
                          f"torchrun) but trainer.nproc_per_node={cfg.trainer.nproc_per_node} x trainer.nnodes="
                          f"{cfg.trainer.nnodes} = {world}. Set them to match the launch.")


def check_templates(cfg: Config, ask: Optional[Ask] = None) -> None:
    """How the user's files are read: their handler and template."""
    if cfg.data.train_path or cfg.eval.data:
        check_data_reading(cfg.data.handler_name, cfg.data.prompt_type, cfg.data.templates_file)


def check_activation_modules(cfg: Config, ask: Optional[Ask] = None) -> None:
    """trainer.dump_activations.modules matches a module of the model, built from its config.json on the
    meta device (shapes only: no weights read, no memory)."""
    d = cfg.trainer.dump_activations
    if not d.steps:
        return
    names = _module_names(cfg.model.path, dict(cfg.model.override_config))
    if not any(re.search(d.modules, name) for name in names):
        raise ConfigError(f"trainer.dump_activations.modules={d.modules!r} matches no module of {cfg.model.path} "
                          f"(its modules are named like {', '.join(names[:4])}, ...).")


def check_activation_dump(cfg: Config, ask: Optional[Ask] = None) -> None:
    """trainer.dump_activations runs on data-parallel layouts only: `verirl compare-activations` merges a
    step's rank files as shares of the batch (each token once, one shape per module), which tensor,
    sequence and pipeline parallel ranks are not."""
    d, a = cfg.trainer.dump_activations, cfg.actor
    if not d.steps:
        return
    why = {"tensor": f"the ranks of a tensor-parallel group hold the same tokens (the merge would count each "
                     f"{a.tensor_parallel_size} times) and each records its own columns of the split layers (their "
                     f"shapes differ between ranks)",
           "sequence": "each rank of a sequence-parallel group records its slice of every packed row, cut where "
                       "no other layout cuts it, and the slices are not checked to merge into the row's "
                       "statistics",
           "pipeline": "each stage records only its own layers, numbered in execution order from 0 on every "
                       "stage (the merge would interleave the stages)"}
    split = [(k, v) for k, v in (("tensor", a.tensor_parallel_size), ("sequence", a.sequence_parallel_size),
                                 ("pipeline", a.pipeline_parallel_size)) if v > 1]
    if not split:
        return
    raise ConfigError(f"trainer.dump_activations.steps={list(d.steps)} with "
                      f"{' x '.join(f'actor.{k}_parallel_size={v}' for k, v in split)}: an activation dump's rank "
                      f"files are merged as data-parallel shares of the batch, and here "
                      f"{'; '.join(why[k] for k, _ in split)}. Dump on a data-parallel-only layout (actor."
                      f"tensor_parallel_size, sequence_parallel_size and pipeline_parallel_size 1, any number of "
                      f"ranks, fsdp2 or ddp) or on one rank: the statistics do not depend on the data-parallel "
                      f"layout, so `verirl compare-activations` compares that dump with any other the same way; or "
                      f"set trainer.dump_activations.steps=[].")


def check_experts(cfg: Config, ask: Optional[Ask] = None) -> None:
    """The model fits actor.expert_parallel_size: a mixture-of-experts model whose
    experts divide by it; and a MoE model is not tensor parallel (its expert layers have no tensor-parallel
    plan); and no router noise (Mixtral's ``router_jitter_noise`` multiplies the router's input by random
    noise in training mode: the update's log-probs would be random, unlike the engine's and the old pass's).
    Reads the model's config.json (no weights)."""
    from verirl.models.load import model_config
    from verirl.models.moe import routing

    config = model_config(cfg.model.path, dict(cfg.model.override_config))
    jitter = getattr(getattr(config, "get_text_config", lambda: config)(), "router_jitter_noise", 0.0) or 0.0
    if jitter > 0 and (ask is None or ask.run_dir):  # `verirl eval` (no run directory) decodes in eval mode: no noise
        raise ConfigError(f"model.path={cfg.model.path}: its config.json sets router_jitter_noise={jitter}, which "
                          f"multiplies every router's input by random noise while the model trains, so the update "
                          f"would route, and score each token, differently from the rollout and the old-log-prob "
                          f"pass at random. Set model.override_config.router_jitter_noise=0.")
    if cfg.actor.expert_parallel_size == 1 and cfg.actor.tensor_parallel_size == 1:
        return
    ep, tp = cfg.actor.expert_parallel_size, cfg.actor.tensor_parallel_size
    r = routing(config)
    kind = getattr(config, "model_type", "?")
    if r is None:
        if ep > 1:
            raise ConfigError(f"actor.expert_parallel_size={ep}: model.path={cfg.model.path} ({kind}) is a dense "
                              f"model, with no experts to split. Set actor.expert_parallel_size=1, or use a "
                              f"mixture-of-experts model (e.g. model.path=tiny-moe).")
        return
    if tp > 1:
        raise ConfigError(f"actor.tensor_parallel_size={tp} with model.path={cfg.model.path}, a mixture-of-experts "
                          f"model ({kind}, {r.num_experts} experts): its expert layers have no tensor-parallel plan. "
                          f"Split the experts with actor.expert_parallel_size instead, and set "
                          f"actor.tensor_parallel_size=1.")
    if r.num_experts % ep:
        raise ConfigError(f"actor.expert_parallel_size={ep} does not divide the {r.num_experts} experts of "
                          f"model.path={cfg.model.path} ({r.num_experts} % {ep} = {r.num_experts % ep}): each rank "
                          f"of an expert-parallel group holds {r.num_experts} / ep of them. Choose a divisor of "
                          f"{r.num_experts}.")


def check_router_replay(cfg: Config, ask: Optional[Ask] = None) -> None:
    """algo.router_replay R2 / R3 and algo.moe_aux_loss_coef > 0 need a mixture-of-experts model (read from its
    config.json, no weights) whose passes are not pipelined; R3 needs an engine that records the experts it
    routed each token to (native, single-turn, colocated)."""
    from verirl.models.router_tap import replay_mode

    a, pp = cfg.algo, cfg.actor.pipeline_parallel_size
    mode = replay_mode(a.router_replay)
    if mode == "off" and not a.moe_aux_loss_coef:
        return
    from verirl.models.load import model_config
    from verirl.models.moe import routing

    key = f"algo.router_replay={a.router_replay}" if mode != "off" else f"algo.moe_aux_loss_coef={a.moe_aux_loss_coef}"
    config = model_config(cfg.model.path, dict(cfg.model.override_config))
    if routing(config) is None:
        raise ConfigError(f"{key}: model.path={cfg.model.path} ({getattr(config, 'model_type', '?')}) is a dense "
                          f"model, with no routers to replay or balance. Set algo.router_replay=off and "
                          f"algo.moe_aux_loss_coef=0, or use a mixture-of-experts model (e.g. model.path=tiny-moe).")
    if pp > 1:
        raise ConfigError(f"{key} with actor.pipeline_parallel_size={pp}: the routers of a pipelined model are not "
                          f"tapped in this version. Use actor.pipeline_parallel_size=1, or algo.router_replay=off "
                          f"and algo.moe_aux_loss_coef=0.")
    if mode != "r3":
        return
    r = cfg.rollout
    if r.engine == "vllm":
        raise ConfigError(
            "algo.router_replay=R3 with rollout.engine=vllm: vLLM's routed experts (enable_return_routed_experts) are "
            "not read by verirl's vllm engine in this version, so the rollouts carry none. vllm 0.32 returns them "
            "(CompletionOutput.routed_experts) only from its Model Runner V2, which needs Triton for the device; the "
            "CPU build's Triton has no CPU backend (triton-cpu), so on a CPU vLLM runs its V1 runner and refuses the "
            "option (\"AuxOutput Connector requires Model Runner V2\", vllm/config/vllm.py, "
            "_verify_aux_output_compatibility). Use algo.router_replay=R2: the update routes by the trainer's own "
            "routes of the old-log-prob pass, which needs one (actor.mini_batch_prompts < data.prompts_per_step, or "
            "actor.epochs > 1); or rollout.engine=native, which records them for R3.")
    if r.engine != "native":
        raise ConfigError(f"algo.router_replay=R3 with rollout.engine={r.engine}: rollout.engine={r.engine} returns no "
                          f"routed experts. Use rollout.engine=native (which records them), or algo.router_replay=R2: "
                          f"the update routes by the trainer's own routes of the old-log-prob pass.")
    if r.multi_turn.enable:
        raise ConfigError("algo.router_replay=R3 with rollout.multi_turn.enable=true: a multi-turn episode's routes "
                          "are not recorded in this version. Use algo.router_replay=R2, or single-turn rollouts.")
    if r.placement == "separate":
        raise ConfigError("algo.router_replay=R3 with rollout.placement=separate: the producers' batches do not "
                          "carry the routed experts in this version. Use rollout.placement=colocated, or "
                          "algo.router_replay=R2.")


def check_model_parallel(cfg: Config, ask: Optional[Ask] = None) -> None:
    """actor.tensor_parallel_size > 1: the model has a tensor-parallel plan and its heads, key/value heads,
    MLP width and vocabulary split evenly (read from its config.json, no weights); actor.sequence_parallel_size
    > 1: each tensor-parallel rank's heads and key/value heads split again over it; and the passes they need
    are the ones that run split (packed log-probs; the native or hf engine decoding with whole weights)."""
    tp, rollout_tp, engine = cfg.actor.tensor_parallel_size, rollout_tensor_parallel(cfg), cfg.rollout.engine
    if engine in ("native", "hf") and rollout_tp not in (1, tp):
        raise ConfigError(f"rollout.tensor_parallel_size={rollout_tp} with rollout.engine={engine}: this engine decodes "
                          f"with the whole weights on every rank (1) or"
                          f"{' (native only)' if engine == 'hf' else ''} on the actor's tensor-parallel plan "
                          f"(actor.tensor_parallel_size={tp}). Set rollout.tensor_parallel_size="
                          f"{'1' if engine == 'hf' or tp == 1 else f'1 or {tp}'}.")
    if engine == "hf" and rollout_tp > 1:
        raise ConfigError(f"rollout.tensor_parallel_size={rollout_tp} with rollout.engine=hf: transformers' generate "
                          f"decodes with the whole weights. Use rollout.engine=native to decode on the tensor-parallel "
                          f"plan, or rollout.tensor_parallel_size=1.")
    sp, pp = cfg.actor.sequence_parallel_size, cfg.actor.pipeline_parallel_size
    if tp == 1 and sp == 1 and pp == 1:
        return
    from verirl.core.ops.ulysses import check_ulysses
    from verirl.models.load import model_config
    from verirl.models.parallel import check_tensor_parallel

    split = " with ".join(f"actor.{k}_parallel_size={v}" for k, v in (("tensor", tp), ("sequence", sp),
                                                                      ("pipeline", pp)) if v > 1)
    if not cfg.actor.use_remove_padding:
        raise ConfigError(f"{split} needs actor.use_remove_padding=true: the passes that run split over the ranks "
                          f"(a vocabulary split by tensor parallelism, the tokens split by sequence parallelism) are "
                          f"the packed ones; the padded pass computes whole rows and whole logits.")
    if cfg.ref.offload and cfg.algo.kl_coef > 0 and (tp > 1 or pp > 1):
        raise ConfigError(f"ref.offload=true with {split}: the reference is split like the actor, each rank holding "
                          f"its share, and moving a share to the host and back is not available in this version. Set "
                          f"ref.offload=false (the reference's share per rank is the actor's parameters' share).")
    config = model_config(cfg.model.path, dict(cfg.model.override_config))
    check_tensor_parallel(config, tp)
    if pp > 1:
        check_pipeline(cfg, config)
    if sp > 1:
        from verirl.models.parallel import SP_FAMILIES

        kind = getattr(config, "model_type", "?")
        if kind not in SP_FAMILIES:
            raise ConfigError(f"actor.sequence_parallel_size={sp}: model_type '{kind}' has no sequence-parallel "
                              f"attention in verirl (its passes are not the packed ones that split the tokens); the "
                              f"families that have it: {', '.join(SP_FAMILIES)}. Use actor.sequence_parallel_size=1.")
        heads = getattr(config, "num_attention_heads", 0)
        kv = getattr(config, "num_key_value_heads", None) or heads
        check_ulysses(heads // tp, kv // tp, sp, key="actor.sequence_parallel_size")


def check_pipeline(cfg: Config, config) -> None:
    """actor.pipeline_parallel_size > 1: a schedule verirl runs, a token budget to pad every micro-batch to,
    stages that split the model's layers, and (1F1B, interleaved or not) at least one sequence per stage in
    each data-parallel rank's mini-batch. Micro-batches are token-budgeted bins of a mini-batch's sequences,
    so their count is known before the step only as at most its sequences; a mini-batch with fewer than the
    stages can never fill the pipeline, the rest is checked when the step is laid out (`at_least`)."""
    from verirl.models.parallel import TP_FAMILIES
    from verirl.models.pipeline import SCHEDULES, stage_layers, stages_per_rank

    a = cfg.actor
    pp, schedule = a.pipeline_parallel_size, a.pipeline_schedule
    if schedule not in SCHEDULES:
        raise ConfigError(f"actor.pipeline_schedule={schedule!r} is not a known name; known: {', '.join(SCHEDULES)}.")
    kind = getattr(config, "model_type", "?")
    if kind not in TP_FAMILIES:
        raise ConfigError(f"actor.pipeline_parallel_size={pp}: model_type '{kind}' has no pipeline stages in verirl; "
                          f"the families that have them: {', '.join(TP_FAMILIES)}. Use actor.pipeline_parallel_size=1.")
    if a.max_token_len_per_device <= 0:
        raise ConfigError(f"actor.pipeline_parallel_size={pp} needs actor.max_token_len_per_device > 0: a pipeline "
                          f"schedule fixes the shape its stages send when it starts, so every micro-batch is one packed "
                          f"row padded to that budget between stages (the padding costs transfers and receive "
                          f"buffers, no compute). Set it to a few times data.max_prompt_length + "
                          f"rollout.max_new_tokens.")
    stages = pp * stages_per_rank(schedule)
    stage_layers(config.num_hidden_layers, stages, a.pipeline_layers or None)
    dp, n = data_parallel_size(cfg), cfg.rollout.n
    sequences = a.mini_batch_prompts // dp * n
    if schedule != "gpipe" and sequences < stages:
        raise ConfigError(f"actor.pipeline_parallel_size={pp} with actor.pipeline_schedule={schedule} needs at least "
                          f"{stages} micro-batches in every optimizer step ({pp} pipeline ranks x {stages // pp} "
                          f"stage{'s' if stages > pp else ''} each: one micro-batch per stage), and a micro-batch "
                          f"holds at least one sequence; each data-parallel rank's mini-batch holds "
                          f"actor.mini_batch_prompts={a.mini_batch_prompts} / {dp} data-parallel rank"
                          f"{'s' if dp > 1 else ''} x rollout.n={n} = {sequences} sequences, fewer than {stages}, so "
                          f"no split of it fills the pipeline. Raise actor.mini_batch_prompts or rollout.n to make "
                          f"{stages} or more sequences per rank, use actor.pipeline_schedule=gpipe (any number of "
                          f"micro-batches), or fewer stages.")


def _module_names(path: str, override: dict) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM

    from verirl.models.load import model_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(path, override))
    return [name for name, _ in model.named_modules() if name]


def check_multi_turn(cfg: Config, ask: Optional[Ask] = None) -> None:
    """rollout.multi_turn: an engine that decodes episodes turn by turn, limits that fit the response
    budget, and something to talk to."""
    mt, r = cfg.rollout.multi_turn, cfg.rollout
    if not mt.enable:
        return
    from verirl.envs.parsers import PARSERS

    if mt.parser != "auto":
        PARSERS.check(mt.parser, "rollout.multi_turn.parser")
    if r.engine == "hf":
        raise ConfigError("rollout.multi_turn.enable=true with rollout.engine=hf: transformers' generate samples from "
                          "torch's global generator, so an episode's turns would depend on what else is decoded with "
                          "them (its batch, the number of ranks) and a resumed run would not repeat them. Use "
                          "rollout.engine=native (its KV cache kept across turns) or vllm.")
    tp = rollout_tensor_parallel(cfg)
    if tp > 1:
        given = "" if r.tensor_parallel_size else " (0: actor.tensor_parallel_size)"
        raise ConfigError(f"rollout.multi_turn.enable=true with rollout.tensor_parallel_size={tp}{given}: the ranks of "
                          f"a tensor-parallel group would decode the same episodes together, each running their tools "
                          f"itself, and one tool answering differently on one rank (a deadline is wall-clock) would "
                          f"leave the group's collectives waiting. Set rollout.tensor_parallel_size=1: each rank "
                          f"decodes its share of the episodes with the whole weights (the actor stays split).")
    for key in ("max_total_tokens", "max_tokens_per_turn"):
        v = getattr(mt, key)
        if v > r.max_new_tokens:
            raise ConfigError(f"rollout.multi_turn.{key}={v} is over rollout.max_new_tokens={r.max_new_tokens}: a "
                              f"multi-turn episode's response (every turn and observation after the prompt) is at "
                              f"most rollout.max_new_tokens tokens, which the log-prob passes and the update are "
                              f"laid out for. Raise rollout.max_new_tokens to {v}, or lower {key}.")
    if not mt.tools and not mt.environment and r.engine != "replay":  # a replay runs no tool
        raise ConfigError("rollout.multi_turn.enable=true but neither rollout.multi_turn.tools nor "
                          "rollout.multi_turn.environment is set: the model would have nothing to call. Give tools "
                          "(e.g. rollout.multi_turn.tools=[calculator]) or an environment (file.py:Class).")


def check_lora(cfg: Config, ask: Optional[Ask] = None) -> None:
    """actor.lora (docs/lora.md): target_modules names linear layers, the initialisation fits the rank,
    and the engine can decode with the adapters."""
    lo = cfg.actor.lora
    if not lo.rank:
        return
    targets = lo.target_modules
    if not (isinstance(targets, str) and targets.strip()) and not (
            isinstance(targets, (list, tuple)) and targets and all(isinstance(t, str) and t for t in targets)):
        raise ConfigError(f"actor.lora.target_modules={targets!r} is neither all-linear nor a list of module names; "
                          f"give e.g. actor.lora.target_modules=all-linear or [q_proj,k_proj,v_proj,o_proj].")
    if str(lo.init).lower() == "orthogonal" and lo.rank % 2:
        raise ConfigError(f"actor.lora.init=orthogonal with actor.lora.rank={lo.rank}: the orthogonal "
                          f"initialisation splits one rank x rank orthogonal matrix into A's and B's halves, so "
                          f"the rank must be even. Use rank {lo.rank + 1} or init=true.")


def check_async(cfg: Config, ask: Optional[Ask] = None) -> None:
    """rollout.placement and trainer.async_training (docs/async.md): producers and trainers both present,
    on one machine, and the options each mode can honour."""
    r, t, a = cfg.rollout, cfg.trainer, cfg.trainer.async_training
    k = a.max_staleness
    if r.placement != "separate":
        if k > 0:
            raise ConfigError(f"trainer.async_training.max_staleness={k} needs rollout.placement=separate: with "
                              f"colocated placement every process generates, then trains, so there is nothing to run "
                              f"ahead. Set rollout.placement=separate (rollout.nproc of the trainer.nproc_per_node "
                              f"processes generate), or max_staleness=0.")
        if a.partial_rollout:
            raise ConfigError("trainer.async_training.partial_rollout=true needs rollout.placement=separate and "
                              "mode=bounded: only a producer that runs beside the trainer receives weights mid-rollout.")
        return
    total = t.nproc_per_node * t.nnodes
    if t.nnodes > 1:
        raise ConfigError(f"rollout.placement=separate with trainer.nnodes={t.nnodes}: the producers are started by "
                          f"trainer rank 0 and take the weights through shared memory on its machine, so an "
                          f"asynchronous run is on one machine today. Use trainer.nnodes=1, or "
                          f"rollout.placement=colocated across machines.")
    if r.nproc >= total:
        raise ConfigError(f"rollout.nproc={r.nproc} producers out of trainer.nproc_per_node={t.nproc_per_node} "
                          f"processes leaves {total - r.nproc} to train. Raise trainer.nproc_per_node to at least "
                          f"{r.nproc + 1} (the producers and the trainers together), or lower rollout.nproc.")
    if r.engine == "replay":
        raise ConfigError("rollout.placement=separate with rollout.engine=replay: a replayed dump has nothing to "
                          "generate beside the update. Use rollout.placement=colocated.")
    if rollout_tensor_parallel(cfg) > 1:
        raise ConfigError(f"rollout.placement=separate with rollout.tensor_parallel_size="
                          f"{rollout_tensor_parallel(cfg)}: a producer is one process decoding with the whole weights. "
                          f"Set rollout.tensor_parallel_size=1 (the trainers may stay tensor-parallel).")
    from verirl.config.layout import data_parallel_size

    if cfg.algo.filter_groups.enable and data_parallel_size(cfg) > 1:
        raise ConfigError(f"algo.filter_groups.enable=true with rollout.placement=separate and "
                          f"{data_parallel_size(cfg)} data-parallel trainers: the producer decides how many groups a "
                          f"short filtered step keeps, for one rank. Use one data-parallel trainer (the others "
                          f"tensor-, sequence- or pipeline-parallel), or rollout.placement=colocated.")
    if t.launcher == "ray" and cfg.model.device not in ("cpu",):
        raise ConfigError(f"rollout.placement=separate with trainer.launcher=ray and model.device="
                          f"{cfg.model.device}: the producers start beside trainer rank 0's actor, and Ray gives that "
                          f"actor only its own devices, so a producer would have none. Use trainer.launcher=local on "
                          f"one machine, or model.device=cpu.")
    if r.nproc > 1 and cfg.algo.filter_groups.enable:
        raise ConfigError(f"rollout.nproc={r.nproc} with algo.filter_groups.enable=true: a filtered step takes as "
                          f"many prompts as it needs, so step t + 1's prompts are known only once step t is done, "
                          f"and the steps cannot be handed to producers side by side. Use rollout.nproc=1.")
    if a.mode == "fixed" and a.sync_every > 1:
        raise ConfigError(f"trainer.async_training.sync_every={a.sync_every} with mode=fixed: step s samples from "
                          f"exactly the weights after max(0, s - 1 - k) updates, so every version must reach the "
                          f"producers. Use sync_every=1, or mode=bounded.")
    if a.sync_every > k + 1:
        raise ConfigError(f"trainer.async_training.sync_every={a.sync_every} is over max_staleness + 1 = {k + 1}: "
                          f"step s needs weights at most k={k} versions old, which the producers would not have "
                          f"between two hand-overs {a.sync_every} updates apart. Lower sync_every, or raise "
                          f"max_staleness to {a.sync_every - 1}.")
    if a.partial_rollout:
        why = ("mode=fixed samples each step from one given version (a switch mid-rollout would depend on timing)"
               if a.mode == "fixed" else
               f"rollout.engine={r.engine} decodes each call to its end (the native engine loads new weights "
               f"between decoding steps)" if r.engine != "native" else
               "multi-turn episodes keep one version per episode today" if r.multi_turn.enable else
               "a filtered step reorders its groups, so the per-token versions could not follow"
               if cfg.algo.filter_groups.enable else "")
        if why:
            raise ConfigError(f"trainer.async_training.partial_rollout=true is not available here: {why}. Turn "
                              f"partial_rollout off, or use mode=bounded with rollout.engine=native, single-turn "
                              f"rollouts and no algo.filter_groups.")
    rc = cfg.algo.rollout_correction
    if k > 0 and rc.rollout_is is None and rc.rollout_rs is None:
        raise ConfigError(f"trainer.async_training.max_staleness={k} with algo.rollout_correction off (rollout_is "
                          f"and rollout_rs null): samples up to {k} versions old would be trained on as if the "
                          f"current policy had drawn them. Set algo.rollout_correction.rollout_is=token (truncated "
                          f"importance weights from the engine's log-probs to the trainer's, AReaL's decoupled loss) "
                          f"and/or rollout_rs=sequence (docs/async.md).")
    if k > 0 and (r.engine == "hf" or r.temperature <= 0):
        raise ConfigError(f"trainer.async_training.max_staleness={k} needs the engine's log-probs of its samples for "
                          f"the off-policy correction: "
                          f"{'rollout.engine=hf returns none' if r.engine == 'hf' else 'greedy decoding has none'}. "
                          f"Use rollout.engine=native or vllm with rollout.temperature > 0.")


RULES: list[Rule] = [
    *(_value_rule(fn) for fn in VALUE_RULES),
    Rule("lora", check_lora, False),
    Rule("asynchronous training", check_async, False),  # before the layout: it says what the trainers' count is
    Rule("layout", lambda cfg, ask: check_layout(cfg, ask.devices), False),  # first: it spells the arithmetic out
    Rule("names", check_names, False),
    Rule("reward rules", lambda cfg, ask: check_rules(cfg.reward.verifiers, cfg.reward.tasks, ask.import_rules,
                                                      ask.paths), False),
    Rule("reward services", check_services, False),
    Rule("algorithm names", check_algorithms, False),
    Rule("launch", check_launch, False),
    Rule("multi-turn", check_multi_turn, False),
    Rule("activation dump layout", check_activation_dump, False),
    Rule("trackers", check_trackers, True),
    Rule("engine", check_engine, True),
    Rule("launcher", check_launcher, True),
    Rule("paths", check_paths, True),
    Rule("model directory", check_model_dir, True),
    Rule("started ranks", check_started_ranks, True),
    Rule("templates", check_templates, True),
    Rule("activation modules", check_activation_modules, True),
    Rule("experts", check_experts, True),  # before the tensor-parallel plan: a MoE model has none
    Rule("model parallel", check_model_parallel, True),
    Rule("routing replay", check_router_replay, True),
]
