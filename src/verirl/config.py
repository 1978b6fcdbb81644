"""The one typed config of verirl, and the only place defaults live.

Sections mirror the phases of a step: data -> model -> rollout -> reward -> algo ->
actor (the policy update) -> trainer (the loop) -> log. A run is configured by a YAML
file plus ``a.b=c`` overrides on the command line, merged through OmegaConf structured
configs so that unknown keys and wrong types are caught before anything heavy starts.

Batch sizes
-----------
* ``data.prompts_per_step`` counts PROMPTS; each prompt is sampled ``rollout.n`` times,
  so one step sees ``prompts_per_step * n`` sequences.
* ``actor.mini_batch_prompts`` counts PROMPTS too (not sequences: veRL's
  ``ppo_mini_batch_size`` is also in prompts, MindSpeed-RL's is not).  One optimizer
  step is taken per mini-batch.  ``mini_batch_prompts == prompts_per_step`` with
  ``actor.epochs == 1`` is on-policy: the old log-prob pass is skipped.
* ``actor.micro_batch_size`` counts SEQUENCES per forward/backward; gradients are
  accumulated over the micro-batches of a mini-batch, exactly.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError, OmegaConfBaseException


class ConfigError(ValueError):
    """A config problem, with the key, the value and the fix in one paragraph."""


@dataclass
class DataConfig:
    task: str = "arith"  # built-in task generator (see `verirl.data.tasks`)
    train_size: int = 20000  # problems drawn for training by the built-in generator
    val_size: int = 200  # held-out problems, never trained on (accuracy at start and end)
    prompts_per_step: int = 8  # PROMPTS per step (each is sampled rollout.n times)
    max_prompt_length: int = 128  # tokens; longer prompts are filtered or refused (data.too_long)
    too_long: str = "error"  # error (refuse to start, naming the row) | filter (drop and count)
    seed: int = 0  # seeds the task generator and the prompt order
    shuffle: str = "verl"  # verl (torch RandomSampler order) | megatron | sequential
    # Your own data instead of the built-in task: a file or folder, raw or already preprocessed
    # (a .parquet from `verirl preprocess`, with its .manifest.json). Raw files are preprocessed on the
    # fly with the keys below and cached next to the run (RUN_DIR/data/).
    train_path: str = ""
    val_path: str = ""  # held-out data for accuracy at start and end ("" = none, or the built-in split)
    prompt_type: str = "tokenizer"  # template for raw files: a templates.json name, or tokenizer
    templates_file: str = ""  # your own templates.json (MindSpeed-RL format)
    handler_name: str = "R1AlpacaStyleInstructionHandler"  # or VerlParquetHandler
    map_keys: dict[str, str] = field(default_factory=dict)  # canonical -> data set field (see preprocess)
    additional_keys: list[str] = field(default_factory=lambda: ["labels"])  # extra columns kept (task, ...)


@dataclass
class ModelConfig:
    path: str = "tiny"  # "tiny" = the model shipped with verirl, or a Hugging Face directory
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | npu


@dataclass
class RolloutConfig:
    engine: str = "native"  # native (own KV-cache sampler) | hf (transformers generate)
    n: int = 8  # samples per prompt (the GRPO group size)
    max_new_tokens: int = 32  # response length cap, tokens (the stop token counts)
    temperature: float = 1.0  # sampling temperature (0 = greedy); log-probs are taken at the same temperature
    top_p: float = 1.0  # nucleus sampling: keep the smallest set of tokens with this much mass
    top_k: int = 0  # 0 = off
    micro_batch_size: int = 0  # sequences per generate call; 0 = the whole step at once


@dataclass
class RewardConfig:
    verifiers: list[str] = field(default_factory=lambda: ["acc", "format"])  # rule names (see verirl.rewards)
    weights: list[float] = field(default_factory=lambda: [1.0, 0.5])  # one per verifier, same order
    # task -> the rules that score it, e.g. {add: [acc, format], mul: [exact, format]};
    # a task not listed here is scored by every verifier.
    tasks: dict[str, list[str]] = field(default_factory=dict)  # task -> rules; {} = every rule scores every task
    workers: int = -1  # scoring processes: -1 = one per core (at most 8); 0 = in this process, no timeout
    timeout: float = 10.0  # seconds per scoring call; a call past it scores 0 and counts in reward/errors


@dataclass
class AlgoConfig:
    adv_estimator: str = "grpo"  # grpo (group mean/std) / rloo (leave-one-out baseline)
    norm_adv_by_std: bool = True  # GRPO divides by the group std; Dr.GRPO does not
    adv_epsilon: float = 1e-6  # added to the group std (TRL uses 1e-4)
    kl_coef: float = 0.0  # weight of the KL-to-reference loss; 0 skips the reference pass
    kl_type: str = "low_var_kl"  # k3, clamped to [-10, 10]; also: kl (k1), mse (k2), abs
    clip_ratio_low: float = 0.2  # ratio floor 1 - low (for negative advantages)
    clip_ratio_high: float = 0.2  # ratio ceiling 1 + high (DAPO clip-higher: 0.28)
    entropy_coef: float = 0.0  # entropy bonus weight (subtracted from the loss)
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum


@dataclass
class ActorConfig:
    lr: float = 1e-4  # AdamW peak learning rate
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
    logprob_chunk: int = 0  # output-layer rows per log-prob chunk; 0 = auto (about 32M logits per chunk)


@dataclass
class RefConfig:
    # token budget per reference log-prob forward; 0 = the actor's (max_token_len_per_device or micro_batch_size)
    log_prob_max_token_len_per_device: int = 0


@dataclass
class TrainerConfig:
    total_steps: int = 100  # GRPO steps (one rollout each)
    run_dir: str = "runs/default"  # config.yaml, metrics.jsonl, summary.json, final/ go here
    seed: int = 0  # seeds python, numpy, torch and the rollout sampling
    save_freq: int = 100  # write a checkpoint every N steps, and always at the end (0 = only at the end)
    keep_checkpoints: int = 2  # keep the newest N checkpoints in RUN_DIR/checkpoints (0 = keep all)
    resume: str = "auto"  # auto: continue from RUN_DIR's newest checkpoint, if any | false | a checkpoint path
    overwrite: bool = False  # with resume=false: delete the previous run in run_dir instead of refusing
    dump_rollouts: bool = False  # write RUN_DIR/rollouts.jsonl, one line per response
    eval_at_start: bool = True  # held-out accuracy on data.val_size problems
    eval_at_end: bool = True  # the same held-out accuracy after the last step
    eval_samples: int = 4  # sampled responses per held-out problem (plus one greedy)
    # validation logged as val/... metrics: avg@n, pass@k, maj@n, overall and per task / data_source
    test_freq: int = 0  # validate every N steps (0 = never)
    val_before_train: bool = False  # also validate before the first step (logged as step 0)
    val_data: str = ""  # a data file for validation ("" = the held-out split: data.val_path or the built-in one)
    val_n: int = 4  # samples per validation prompt
    threads: int = 0  # torch intra-op threads; 0 = all cores


@dataclass
class LogConfig:
    progress: bool = True  # rich progress bar
    console_every: int = 10  # print a metrics line every N steps (0 = never)


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
    log: LogConfig = field(default_factory=LogConfig)


@dataclass
class SFTConfig:
    """`verirl sft`: supervised warm start on a built-in task (how the tiny model is made)."""
    init: str = "scratch"  # scratch = build the tiny tokenizer + a fresh model; or a model directory
    out_dir: str = "src/verirl/assets/tiny"  # where the Hugging Face directory is written
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


# ---------------------------------------------------------------- loading

def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        out.append(key)
        if is_dataclass(f.type) or (isinstance(f.default_factory, type) and is_dataclass(f.default_factory)):
            out.extend(_all_keys(f.default_factory, key + "."))  # type: ignore[arg-type]
    return out


def _suggest(key: str, cls: type) -> str:
    keys = _all_keys(cls)
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
    if not close:  # match on the last component ("lr" -> actor.lr)
        last = key.split(".")[-1]
        close = [k for k in keys if k.split(".")[-1] == last] or difflib.get_close_matches(
            last, keys, n=3, cutoff=0.6
        )
    return f" Did you mean: {', '.join(close)}?" if close else ""


def _wrap(err: OmegaConfBaseException, source: str, cls: type) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigKeyError) or "not in struct" in str(err) or "Key '" in str(err):
        return ConfigError(
            f"Unknown config key '{key}' in {source}.{_suggest(key, cls)} "
            f"Run `verirl train --help-config` for every key with its default."
        )
    if isinstance(err, ValidationError):
        msg = str(err).splitlines()[0]
        return ConfigError(f"Bad value for config key '{key}' in {source}: {msg}. Fix the value's type.")
    return ConfigError(f"Config error in {source}: {str(err).splitlines()[0]}")


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None, schema_cls: type = Config):
    """Defaults <- YAML file <- ``a.b=c`` overrides; then `validate` (for the GRPO `Config`)."""
    schema = OmegaConf.structured(schema_cls)
    cfg = schema
    if path:
        if not os.path.exists(path):
            raise ConfigError(f"Config file '{path}' does not exist. Pass an existing YAML file to --config.")
        try:
            file_cfg = OmegaConf.load(path)
        except Exception as e:  # yaml errors carry line numbers
            raise ConfigError(f"Config file '{path}' is not valid YAML: {e}") from None
        try:
            cfg = OmegaConf.merge(cfg, file_cfg)
        except OmegaConfBaseException as e:
            raise _wrap(e, f"'{path}'", schema_cls) from None
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"Override '{ov}' is not of the form key.sub=value (e.g. actor.lr=1e-4).")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([ov]))
        except OmegaConfBaseException as e:
            raise _wrap(e, f"override '{ov}'", schema_cls) from None
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, Config):
        validate(obj)
    return obj


def to_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg) -> dict:
    """The config as plain nested dicts (JSON-able)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def describe(schema_cls: type = Config) -> str:
    """Every key with its default, for --help-config."""
    return to_yaml(schema_cls())


# ---------------------------------------------------------------- validation

def _choice(key: str, value: Any, allowed: list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {allowed}. Pick one of them.")


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}={value} must be {'>= 0' if allow_zero else '> 0'}.")


def validate(cfg: Config) -> None:
    """Refuse impossible settings before anything heavy starts, with the arithmetic spelled out."""
    from verirl.algo import AGGREGATIONS, KL_ESTIMATORS, ADVANTAGE_ESTIMATORS
    from verirl.rewards import RULES

    d, r, a, act, t = cfg.data, cfg.rollout, cfg.algo, cfg.actor, cfg.trainer
    for key, val in [("data.prompts_per_step", d.prompts_per_step), ("rollout.n", r.n),
                     ("rollout.max_new_tokens", r.max_new_tokens), ("data.max_prompt_length", d.max_prompt_length),
                     ("actor.mini_batch_prompts", act.mini_batch_prompts),
                     ("actor.micro_batch_size", act.micro_batch_size), ("actor.epochs", act.epochs),
                     ("trainer.total_steps", t.total_steps), ("actor.lr", act.lr), ("trainer.val_n", t.val_n)]:
        _positive(key, val)
    for key, val in [("rollout.temperature", r.temperature), ("algo.kl_coef", a.kl_coef),
                     ("algo.clip_ratio_low", a.clip_ratio_low), ("algo.clip_ratio_high", a.clip_ratio_high),
                     ("trainer.save_freq", t.save_freq), ("actor.warmup_steps", act.warmup_steps),
                     ("rollout.micro_batch_size", r.micro_batch_size),
                     ("actor.max_token_len_per_device", act.max_token_len_per_device),
                     ("ref.log_prob_max_token_len_per_device", cfg.ref.log_prob_max_token_len_per_device),
                     ("actor.logprob_chunk", act.logprob_chunk), ("trainer.keep_checkpoints", t.keep_checkpoints),
                     ("trainer.test_freq", t.test_freq)]:
        _positive(key, val, allow_zero=True)
    longest = d.max_prompt_length + r.max_new_tokens
    for key, budget in [("actor.max_token_len_per_device", act.max_token_len_per_device),
                        ("ref.log_prob_max_token_len_per_device", cfg.ref.log_prob_max_token_len_per_device)]:
        if 0 < budget < longest:
            raise ConfigError(
                f"{key}={budget} is smaller than the longest possible sequence: data.max_prompt_length "
                f"{d.max_prompt_length} + rollout.max_new_tokens {r.max_new_tokens} = {longest} tokens. "
                f"Set it to at least {longest} (a few times more packs several sequences per forward), or 0.")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p={r.top_p} must be in (0, 1].")
    if d.prompts_per_step % act.mini_batch_prompts:
        raise ConfigError(
            f"data.prompts_per_step={d.prompts_per_step} is not divisible by actor.mini_batch_prompts="
            f"{act.mini_batch_prompts}: {d.prompts_per_step} / {act.mini_batch_prompts} = "
            f"{d.prompts_per_step / act.mini_batch_prompts:.3g} mini-batches per step. Both count prompts; "
            f"choose a mini-batch that divides the step (e.g. actor.mini_batch_prompts={d.prompts_per_step})."
        )
    if r.n < 2 and a.adv_estimator == "grpo":
        raise ConfigError(f"rollout.n={r.n}: GRPO normalises rewards within a group of samples of one prompt, "
                          f"so it needs rollout.n >= 2 (8 is typical).")
    _choice("rollout.engine", r.engine, ["native", "hf"])
    _choice("model.dtype", cfg.model.dtype, ["float32", "bfloat16", "float16"])
    _choice("model.device", cfg.model.device, ["auto", "cpu", "cuda", "npu"])
    _choice("algo.adv_estimator", a.adv_estimator, sorted(ADVANTAGE_ESTIMATORS))
    _choice("algo.kl_type", a.kl_type, sorted(KL_ESTIMATORS))
    _choice("algo.loss_agg_mode", a.loss_agg_mode, sorted(AGGREGATIONS))
    if len(act.betas) != 2 or not all(0 <= b < 1 for b in act.betas):
        raise ConfigError(f"actor.betas={list(act.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99].")
    rw = cfg.reward
    if not rw.verifiers:
        raise ConfigError("reward.verifiers is empty: name at least one rule, e.g. [acc, format].")
    if len(rw.weights) != len(rw.verifiers):
        raise ConfigError(
            f"reward.weights has {len(rw.weights)} entries but reward.verifiers has {len(rw.verifiers)} "
            f"({list(rw.verifiers)}): give one weight per verifier, in the same order."
        )
    names_ok = set(rw.verifiers)
    for name in rw.verifiers:
        if name in RULES:
            continue
        if ":" not in name:
            close = difflib.get_close_matches(name, list(RULES), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"reward.verifiers: unknown rule '{name}'. Known rules: {sorted(RULES)}, or your own "
                              f"as path/to/file.py:function or package.module:function.{hint}")
        from verirl.rewards import load_rule
        try:
            names_ok.add(load_rule(name).name)
        except Exception as e:
            raise ConfigError(f"reward.verifiers: {e}") from None
    if rw.timeout <= 0:
        raise ConfigError(f"reward.timeout={rw.timeout} must be > 0 seconds.")
    for task, names in rw.tasks.items():
        for name in names:
            if name not in names_ok:
                raise ConfigError(
                    f"reward.tasks.{task} names rule '{name}', which is not in reward.verifiers "
                    f"{list(rw.verifiers)}. Add it there (with a weight) or remove it from the task."
                )
    if str(t.resume).lower() not in ("auto", "false", "none", "") and not os.path.exists(str(t.resume)):
        raise ConfigError(f"trainer.resume={t.resume!r} is neither auto, false nor an existing path. Give auto "
                          f"(continue the run in trainer.run_dir), false (start fresh) or a checkpoint directory.")
    _choice("data.shuffle", d.shuffle, ["verl", "megatron", "sequential"])
    _choice("data.too_long", d.too_long, ["error", "filter"])
    for key, p in [("data.train_path", d.train_path), ("data.val_path", d.val_path),
                   ("data.templates_file", d.templates_file), ("trainer.val_data", t.val_data)]:
        if p and not os.path.exists(p):
            raise ConfigError(f"{key}='{p}' does not exist. Give an existing file or folder.")
    if cfg.model.path != "tiny" and not os.path.isdir(cfg.model.path):
        raise ConfigError(
            f"model.path='{cfg.model.path}' is not a directory. Give a Hugging Face model directory "
            f"(config.json, weights, tokenizer) or model.path=tiny for the model shipped with verirl."
        )


# ---------------------------------------------------------------- reference docs

_DOC_HEAD = """# Configuration reference

Generated from `src/verirl/config.py` by `python -m verirl.config > docs/config.md` (a test
checks that it is current).

A run is `verirl train --config FILE.yaml key.sub=value ...`: defaults, then the file, then the
overrides. `verirl train --help-config` prints every key with its default. Unknown keys and
wrong types are refused with the closest valid names; impossible batch shapes are refused
with the arithmetic spelled out. The resolved config is written to `RUN_DIR/config.yaml`.

**Counting rule**: `data.prompts_per_step` and `actor.mini_batch_prompts` count *prompts*;
each prompt is sampled `rollout.n` times, so a step holds `prompts_per_step * n` sequences.
`actor.micro_batch_size` and `rollout.micro_batch_size` count *sequences*. veRL's
`ppo_mini_batch_size` also counts prompts; MindSpeed-RL's mini-batch is already multiplied by n.
"""


def _table(cls: type, prefix: str) -> list[str]:
    import inspect
    import re

    src = inspect.getsource(cls)
    inst = cls()
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for f in fields(cls):
        m = re.search(rf"^\s+{f.name}:[^\n]*?(?:#\s*([^\n]*))?$", src, re.M)
        comment = ((m.group(1) or "") if m else "").replace("|", "/")
        rows.append(f"| `{prefix}{f.name}` | `{getattr(inst, f.name)}` | {comment} |")
    return rows


def markdown_reference() -> str:
    out = [_DOC_HEAD]
    for f in fields(Config):
        out += [f"## `{f.name}`", ""] + _table(f.default_factory, f"{f.name}.") + [""]  # type: ignore[arg-type]
    out += ["## `verirl sft`", ""] + _table(SFTConfig, "") + [""]
    from verirl.data.preprocess import PreprocessConfig
    out += ["## `verirl preprocess`", "", "MindSpeed-RL's data keys; see docs/data.md.", ""]
    out += _table(PreprocessConfig, "") + [""]
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown_reference(), end="")
