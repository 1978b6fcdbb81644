"""Translate another system's GRPO config into a verirl config, key by key.

    verirl convert-config --from verl ppo_trainer_grpo.yaml actor_rollout_ref.rollout.n=16 -o grpo.yaml
    verirl convert-config --from verl data.train_batch_size=1024 trainer.total_epochs=15 --train-rows 7473
    verirl convert-config --from mindspeed-rl grpo_qwen25_7b.yaml -o grpo.yaml --json

--from verl reads a veRL `ppo_trainer` config (a YAML of its keys, e.g. one with
`defaults: [ppo_trainer, _self_]`) and the dotted command-line overrides of a run script
(`key=value`, `+key=value`, `++key=value`, `~key`, anywhere on the line), applied before anything
is translated; the file may be left out, leaving only the overrides on top of veRL's defaults.
Interpolations resolve against the file merged over veRL's defaults, as Hydra's would.
--from mindspeed-rl reads a MindSpeed-RL GRPO YAML (megatron_training / actor_config /
rl_config / generate_config; actor_config overrides megatron_training, as MindSpeed-RL merges
them).

Out come the verirl YAML (to -o OUT, else standard output), which passes verirl's checks of names and
values (`verirl.run.checks.check(cfg, paths=False)`) but not the file-system checks, since
its paths and model ids are the other machine's; and a table (standard error when the YAML goes
to standard output) with one row per source key:

  translated  the verirl key(s) it became, with the conversion the note spells out
  decide      it needs a decision or a fact the file does not hold (the note says what, e.g.
              --train-rows N); a placeholder or verirl's default stands in the YAML meanwhile
  ignored     verirl needs no equivalent, and why (kernel switches, the other machine's layout,
              features off in this file)
  unknown     a key the converter does not know: check it by hand

A key the source leaves out but whose default (the source system's) the translation used is a
row too, marked "default": veRL's and MindSpeed-RL's defaults are not verirl's. Facts that can
only be checked elsewhere (the model's rms_norm_eps, tokenizer ids, the other machine's paths)
are listed under "check", never guessed. docs/convert-config.md has every mapping and why.
"""
from __future__ import annotations

import functools
import importlib
import json
import sys
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from verirl.config import flatten
from verirl.core.errors import ConfigError

HELP = "translate a veRL or MindSpeed-RL GRPO config into a verirl config, with a table of every source key"

# --from NAME -> the module holding that format's tables and its `translate(t)`.
FORMATS = {"verl": "verirl.tools.align.convert_verl", "mindspeed-rl": "verirl.tools.align.convert_mindspeed"}
STATUSES = ("translated", "decide", "ignored", "unknown")
_RANK = {"": 0, "unknown": 1, "ignored": 2, "translated": 3, "decide": 4}  # a later, stronger status wins
_NO = object()
_SAME = "the same meaning"



def peer_tables(name: str) -> dict[str, Any]:
    """The data file ``name`` beside this module: a format's tables (its defaults, its ignored keys), parsed."""
    import yaml

    return yaml.safe_load((Path(__file__).parent / name).read_text(encoding="utf-8"))


def add_arguments(parser) -> None:
    parser.add_argument("--from", dest="source_format", required=True, metavar="FORMAT",
                        help=f"the system the config is for: {' or '.join(FORMATS)}")
    parser.add_argument("file", metavar="FILE",
                        help="the source YAML (with --from verl it may be left out: only the overrides on top of "
                             "veRL's defaults)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="the source system's dotted overrides (key=value, +key=value, ~key), applied to "
                             "FILE before translating, as on that system's command line; anywhere on the line, "
                             "before or after the options")
    parser.add_argument("-o", "--output", default="", metavar="OUT.yaml",
                        help="write the verirl YAML here (default: standard output, the table on standard error)")
    parser.add_argument("--train-rows", type=int, default=None, metavar="N",
                        help="rows of the training data (after the source's overlong-prompt filter): turns veRL's "
                             "epochs into steps, and with them a warm-up ratio into steps")
    parser.add_argument("--mindspeed-rl-version", default="auto", choices=["auto", "2.0+", "pre-2.0"],
                        help="the MindSpeed-RL that ran the file: 2.0+ multiplies rl_config.mini_batch_size by "
                             "n_samples_per_prompt itself (it counts prompts), releases before 2.0 took it "
                             "already multiplied (sequences). auto: pre-2.0 when mini_batch_size exceeds "
                             "global_batch_size or the file has rl_config.experience_count, else 2.0+")
    parser.add_argument("--json", action="store_true",
                        help="print the table, checks and the config as one JSON object on standard output")


# ---------------------------------------------------------------- the translation record

@dataclass
class Row:
    """One source key: its value, where the value came from, and what became of it."""
    key: str  # dotted, e.g. actor_rollout_ref.rollout.n
    value: Any
    origin: str  # file / override / default (left out of the source: the source system's default was used)
    status: str = ""  # one of STATUSES
    targets: list[str] = field(default_factory=list)  # verirl keys written from it
    note: str = ""  # the conversion, or why it is ignored, or what to decide


class NeedsDecision(Exception):
    """Raised by a conversion (`Direct.convert`) for a value verirl cannot take as it is."""


@dataclass(frozen=True)
class Direct:
    """A source key that becomes one verirl key, through ``convert`` (which may raise NeedsDecision)."""
    source: str
    target: str
    convert: Optional[Callable[[Any], Any]] = None
    note: str = ""


@dataclass
class Options:
    train_rows: Optional[int] = None
    mindspeed_rl_version: str = "auto"
    source: Optional[str] = None  # the source file (relative paths it names may be read from its folder)


class Translation:
    """What a source config becomes: one `Row` per source key, the verirl values (`out`, dotted keys),
    and the checks and warnings. The format modules call `put` / `decide` / `ignore` / ...; `finish`
    classifies what they left with the format's ignore table, the rest as unknown."""

    def __init__(self, values: dict[str, Any], origins: dict[str, str], defaults: dict[str, Any], options: Options):
        self.values, self.defaults, self.options = values, defaults, options
        self.rows: dict[str, Row] = {k: Row(k, v, origins.get(k, "file")) for k, v in values.items()}
        self.out: dict[str, Any] = {}
        self.out_from: dict[str, list[str]] = {}
        self.checks: list[str] = []
        self.warnings: list[str] = []
        self.read: list[str] = []  # the keys read, in order (the culprit is named when a value is unusable)

    # reading the source
    def given(self, key: str) -> bool:
        return key in self.values

    def get(self, key: str, default: Any = _NO) -> Any:
        """The source's value, else the source system's default (from the format's DEFAULTS table)."""
        self.read.append(key)
        if key in self.values:
            return self.values[key]
        if key in self.defaults:
            return self.defaults[key]
        if default is not _NO:
            return default
        raise KeyError(f"{key}: neither in the source nor in the format's DEFAULTS table")

    def under(self, prefix: str) -> list[str]:
        """The source keys under ``prefix`` (e.g. all of actor_rollout_ref.model.override_config)."""
        return [k for k in self.values if k.startswith(prefix + ".")]

    # recording
    def _row(self, key: str) -> Row:
        if key not in self.rows:
            self.rows[key] = Row(key, self.defaults.get(key), "default")
        return self.rows[key]

    def _status(self, key: str, status: str, note: str = "") -> None:
        row = self._row(key)
        if _RANK[status] >= _RANK[row.status]:
            row.status = status
        if status == "decide" and row.note == _SAME:
            row.note = ""
        if note and note not in row.note:
            row.note = f"{row.note}; {note}" if row.note else note

    def put(self, target: str, value: Any, *keys: str, note: str = "") -> None:
        """Write verirl key ``target`` = ``value``, translated from the source ``keys``."""
        if target not in verirl_keys():
            raise KeyError(f"{target} is not a verirl config key (a bug in the translation tables)")
        self.out[target] = value
        self.out_from[target] = list(keys)
        for key in keys:
            row = self._row(key)
            if target not in row.targets:
                row.targets.append(target)
            self._status(key, "translated", note or ("" if row.note else _SAME))

    def translated(self, key: str, note: str, targets: Sequence[str] = ()) -> None:
        """Taken into account without a verirl value of its own (it confirms verirl's behaviour, or shaped
        ``targets`` that other keys wrote)."""
        if self.given(key) or key in self.defaults:
            self._status(key, "translated", note)
            self._row(key).targets += [k for k in targets if k not in self._row(key).targets]

    def decide(self, key: str, what: str) -> None:
        """The key needs a decision or a fact the file does not hold; ``what`` says which."""
        self._status(key, "decide", what)

    def ignore(self, key: str, why: str) -> None:
        """No verirl equivalent is needed; only a key the source holds gets a row."""
        if self.given(key):
            self._status(key, "ignored", why)

    def unknown(self, key: str, why: str) -> None:
        """A key of a section the translation reads that it does not know (finish would take it for a key of a
        switched-off feature)."""
        if not self._row(key).status:
            self._status(key, "unknown", why)

    def note(self, key: str, text: str) -> None:
        if key in self.rows:
            self._status(key, self.rows[key].status or "translated", text)

    def check(self, text: str) -> None:
        if text not in self.checks:
            self.checks.append(text)

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)

    def apply(self, table: Sequence[Direct]) -> None:
        """Each `Direct` whose source key is given (or has a default) becomes its target."""
        for d in table:
            if not self.given(d.source) and d.source not in self.defaults:
                continue
            value = self.get(d.source)
            try:
                out = d.convert(value) if d.convert else value
            except NeedsDecision as e:
                self.decide(d.source, str(e))
                continue
            self.put(d.target, out, d.source, note=d.note)

    def finish(self, ignored: Sequence[tuple[str, str]]) -> None:
        """Rows nothing claimed: the first matching glob of ``ignored`` (pattern, why), else unknown."""
        for row in self.rows.values():
            if row.status:
                continue
            why = next((reason for pattern, reason in ignored if fnmatchcase(row.key, pattern)), None)
            if why is None:
                row.status, row.note = "unknown", "not a key this converter knows: check it by hand"
            else:
                row.status, row.note = "ignored", why


@functools.lru_cache(maxsize=1)
def verirl_keys() -> frozenset[str]:
    """Every settable key of verirl's GRPO config, dotted (section.field, and section.sub.field for the
    sub-sections such as algo.filter_groups or reward.overlong_buffer)."""
    from verirl.config import Config

    def leaves(cls: type, prefix: str) -> list[str]:
        out = []
        for f in fields(cls):
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            out += leaves(type(default), f"{prefix}{f.name}.") if is_dataclass(default) else [prefix + f.name]
        return out

    return frozenset(leaves(Config, ""))


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """verirl's dotted keys -> nested sections (algo.filter_groups.enable -> {algo: {filter_groups: {enable}}});
    a value that is itself a mapping (model.override_config) stays one value."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


# ---------------------------------------------------------------- parallel layouts (both formats)

def layout_words(tp: int, sp: int, pp: int) -> str:
    """The sizes above 1 as verirl keys: 'actor.tensor_parallel_size=2 and actor.pipeline_parallel_size=4'."""
    return " and ".join(f"actor.{name}_parallel_size={size}" for name, size in
                        (("tensor", tp), ("sequence", sp), ("pipeline", pp)) if size > 1)


def size_words(tp: int, sp: int, pp: int) -> str:
    """The sizes above 1 in words, multiplied: 'tensor parallelism 2 x pipeline parallelism 4 = 8 ranks'."""
    sizes = [(name, size) for name, size in (("tensor", tp), ("sequence", sp), ("pipeline", pp)) if size > 1]
    words = " x ".join(f"{name} parallelism {size}" for name, size in sizes)
    return words + (f" = {tp * sp * pp} ranks" if len(sizes) > 1 else "")


# What the packed passes split in each layout: why verirl runs them on packed sequences only.
PACKED = {"tensor": "the vocabulary split over the ranks", "sequence": "the tokens split over the ranks",
          "pipeline": "one packed row per micro-batch sent between the stages"}


def packed_words(tp: int, sp: int, pp: int) -> str:
    return ", ".join(PACKED[name] for name, size in (("tensor", tp), ("sequence", sp), ("pipeline", pp)) if size > 1)


def pipeline_stages(t: Translation, key: str, pp: int) -> None:
    """``key``'s pipeline size, above 1, as actor.pipeline_parallel_size (verirl's stages compose with the
    source's tensor and sequence parallelism, each written as the source ran it)."""
    from verirl.models.parallel import TP_FAMILIES

    t.put("actor.pipeline_parallel_size", pp, key,
          note=f"stages of decoder layers, one per rank, in both (docs/parallelism.md); without virtual stages "
               f"Megatron's schedule is 1F1B, verirl's default actor.pipeline_schedule; verirl train refuses it "
               f"unless config.json's model_type has stages in verirl ({', '.join(TP_FAMILIES)}) and the layers "
               f"split over the stages")


def model_parallel_fits(t: Translation, tp: int, sp: int, pp: int, keys: Sequence[str], peer: str, padding_key: str,
                        pipeline_keys: Sequence[str], ran: Callable[[], str]) -> None:
    """What actor.tensor_parallel_size x actor.sequence_parallel_size x actor.pipeline_parallel_size > 1 needs of the
    rest of the converted config (any rollout engine takes it): packed sequences, a number of ranks it divides,
    and for pipeline stages a token budget; ``keys`` wrote the sizes. ``peer`` names the other system,
    ``padding_key`` its use_remove_padding key, ``pipeline_keys`` its pipeline size key, ``ran`` its device
    count in words ("" when unknown), asked only when the note needs it."""
    layout = layout_words(tp, sp, pp)
    if t.out.get("actor.use_remove_padding") is False:
        t.put("actor.use_remove_padding", True, padding_key,
              note=f"false in {peer}: verirl runs {layout} on the packed passes ({packed_words(tp, sp, pp)}), so true "
                   f"is written (packing changes no result)")
    if pp > 1:
        fit_pipeline(t, pipeline_keys)
    world = int(t.out.get("trainer.nproc_per_node", 1)) * int(t.out.get("trainer.nnodes", 1))
    group = tp * sp * pp
    if world % group:
        devices = ran()
        t.put("trainer.nproc_per_node", group, *keys,
              note=f"{size_words(tp, sp, pp)} does not divide verirl's default world of {world} "
                   f"rank{'' if world == 1 else 's'}: trainer.nproc_per_node={group} written, one group, the fewest "
                   f"ranks the layout runs on" + (f" ({devices})" if devices else "")
                   + f"; set trainer.nproc_per_node / nnodes for this machine, a multiple of {group} ranks in all")


def fit_pipeline(t: Translation, keys: Sequence[str]) -> None:
    """What actor.pipeline_parallel_size > 1 (written from ``keys``) needs of the rest of the converted config: a
    token budget, which every micro-batch is padded to between stages (the micro-batch size's sequences of the
    longest length where the source gave none)."""
    from verirl.config import Config

    cfg = Config()
    if not t.out.get("actor.max_token_len_per_device"):
        prompt = int(t.out.get("data.max_prompt_length", cfg.data.max_prompt_length))
        response = int(t.out.get("rollout.max_new_tokens", cfg.rollout.max_new_tokens))
        sp = int(t.out.get("actor.sequence_parallel_size", 1))
        micro_keys = t.out_from.get("actor.micro_batch_size", [])
        micro = int(t.out.get("actor.micro_batch_size", 1))
        budget = -(-micro * (prompt + response) // sp)
        share = f" / actor.sequence_parallel_size {sp} (each rank's share)" if sp > 1 else ""
        t.put("actor.max_token_len_per_device", budget, *keys, *micro_keys,
              note=f"pipeline stages need a token budget (verirl pads every micro-batch to "
                   f"actor.max_token_len_per_device between stages) and the source sizes micro-batches by sequences: "
                   f"{micro} sequence{'' if micro == 1 else 's'} x the longest, prompt {prompt} + response "
                   f"{response}{share} = {budget} tokens written, micro-batches of at least {micro} sequence"
                   f"{'' if micro == 1 else 's'}; verirl's gradient accumulation is exact, so how a mini-batch is "
                   f"cut changes no gradient (docs/algorithms.md); a larger budget packs more per micro-batch")


# ---------------------------------------------------------------- LoRA on Megatron's layers (both formats)

# The linear layers of a Megatron-core GPT decoder layer, by the names LoRA's target modules give them (MindSpeed-RL's
# lora_target_modules, veRL's Megatron engine's model.lora.target_modules) -> the Hugging Face model's layers verirl
# puts its adapters on (peft's names). linear_qkv (query, key and value) and linear_fc1 (the gated MLP's gate and up
# projections) are one fused layer each, with one adapter; the canonical names (Megatron-Bridge's canonical_lora)
# are one layer each, as in the Hugging Face model.
MEGATRON_LINEARS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                    "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",),
                    "linear_q": ("q_proj",), "linear_k": ("k_proj",), "linear_v": ("v_proj",),
                    "linear_fc1_gate": ("gate_proj",), "linear_fc1_up": ("up_proj",)}
FUSED_LINEARS = {"linear_qkv": "one A for the query, key and value projections, where verirl gives q_proj, k_proj and "
                               "v_proj an A each (2 x rank x hidden parameters more a layer)",
                 "linear_fc1": "one A for the gate and up projections, where verirl gives gate_proj and up_proj an A "
                               "each (rank x hidden more)"}


def megatron_lora_targets(t: Translation, key: str, names: Any, peer: str) -> None:
    """``key``'s LoRA target modules, Megatron's layer names, as actor.lora.target_modules (the Hugging Face model's
    layers): translated where each name is one Hugging Face layer; a decision, with the layers written, where a name
    is a fused layer (one adapter over several of verirl's); a decision, nothing written, for a name this table
    does not hold (a pattern, an MLA or MoE router layer)."""
    listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else [str(n) for n in names]
    unknown = [n for n in listed if n not in MEGATRON_LINEARS]
    if unknown:
        t.decide(key, f"{', '.join(unknown)}: not a Megatron layer name this converter maps to the Hugging Face "
                      f"model's ({', '.join(MEGATRON_LINEARS)}); write actor.lora.target_modules as the model's "
                      f"linear layer names (verirl plan lists them when one is wrong), verirl's all-linear left")
        return
    targets = list(dict.fromkeys(hf for n in listed for hf in MEGATRON_LINEARS[n]))
    words = ", ".join(f"{n} -> {'/'.join(MEGATRON_LINEARS[n])}" for n in listed)
    t.put("actor.lora.target_modules", targets, key,
          note=f"Megatron's layers as the Hugging Face model's ({words}); verirl train checks that the model has them")
    fused = [n for n in listed if n in FUSED_LINEARS]
    if fused:
        shared = "; ".join(f"{n}: {FUSED_LINEARS[n]}" for n in fused)
        t.decide(key, f"{peer} puts one adapter on each fused Megatron layer ({shared}); verirl has no fused adapter. "
                      f"The same layers adapted, the same start (B = 0), an update space that holds the fused one: "
                      f"{targets} written")


# ---------------------------------------------------------------- multi-turn rollouts (both formats)

def fit_multi_turn(t: Translation, peer: str) -> None:
    """What rollout.multi_turn.enable needs of the rest of the converted config: verirl's multi-turn loop keys
    each turn row by row, so a vLLM engine decodes on one rank (rollout.tensor_parallel_size 1)."""
    if not t.out.get("rollout.multi_turn.enable") or t.out.get("rollout.engine") != "vllm":
        return
    size = int(t.out.get("rollout.tensor_parallel_size", 0) or 0) or int(t.out.get("actor.tensor_parallel_size", 1))
    if size <= 1:
        return
    keys = t.out_from.get("rollout.tensor_parallel_size") or t.out_from.get("actor.tensor_parallel_size", [])
    why = (f"{peer}'s vLLM engine decoded the multi-turn episodes over {size} devices; verirl's multi-turn loop "
           f"keys each turn row by row, which a tensor-parallel vLLM engine (its group's prompts taken together) "
           f"cannot: rollout.tensor_parallel_size=1 written, each rank decodes with the whole weights, so the "
           f"model must fit one device's rollout.gpu_memory_utilization (else rollout.engine=native, which "
           f"decodes on the actor's tensor-parallel plan)")
    t.put("rollout.tensor_parallel_size", 1, *keys, note=why)
    for key in keys:
        t.decide(key, why)


def calls_per_turn_words(peer: str, calls: int) -> str:
    """The decide note of a peer's cap on tool calls per turn (veRL's and MindSpeed-RL's max_parallel_calls)."""
    from verirl.envs.parsers import MAX_CALLS

    verirl = (f"verirl runs every call of a turn, up to {MAX_CALLS} (past them, one error the model reads), and has no "
              f"setting for it")
    if calls <= 0:
        return f"{calls}: {peer} runs none of a turn's tool calls and answers them with an empty tool response; {verirl}"
    first = "only the first tool call" if calls == 1 else f"the first {calls} tool calls"
    return (f"{calls}: {peer} runs {first} of a turn and drops the rest unanswered; {verirl}: the same where the model "
            f"makes at most {min(calls, MAX_CALLS)} a turn")


def tool_config_rows(t: Translation, key: str, path: str, peer: str) -> None:
    """What verirl makes of the tool config YAML ``path`` (veRL's format: tools: - class_name, config, tool_schema),
    source key ``key``, which becomes rollout.multi_turn.tools: where the file is readable here, each class as
    verirl's loader (`verirl.envs.peers`) takes it (verirl's own equivalent, refused, or imported here), and the
    code interpreter's time limit as rollout.multi_turn.tool_timeout_s; else checks to make."""
    import os

    import yaml

    from verirl.envs.peers import VERL_EQUIVALENTS, VERL_REFUSED

    source = t.options.source
    copy = (f"rollout.multi_turn.tools: the tool config {path} is the other machine's path (a relative path is read "
            f"from the directory verirl runs in): copy it, and point rollout.multi_turn.tools at the copy")
    entries = None
    for where in [path] + ([os.path.join(os.path.dirname(source), path)] if source and not os.path.isabs(path) else []):
        try:
            data = yaml.safe_load(open(where, encoding="utf-8").read())
        except (OSError, yaml.YAMLError, ValueError):
            continue
        entries = data.get("tools") if isinstance(data, dict) else None
        break
    if not isinstance(entries, list):
        t.check(f"{copy}; check that each class_name it names imports here ({peer}'s own tool classes need {peer} "
                f"installed; veRL's sandbox-fusion code interpreter and gsm8k checker are verirl's python tool and "
                f"gsm8k checker, docs/agents.md); a tool call's deadline is rollout.multi_turn.tool_timeout_s (10 s)")
        return
    t.check(copy)
    timeouts = []
    for i, entry in enumerate(entries):
        entry = entry if isinstance(entry, dict) else {}
        cls, config = str(entry.get("class_name") or ""), entry.get("config") or {}
        config = config if isinstance(config, dict) else {}
        name = ((entry.get("tool_schema") or {}).get("function") or {}).get("name", "?") if isinstance(
            entry.get("tool_schema"), dict) else "?"
        what = f"tools[{i}] {name} ({cls or 'no class_name'})"
        if str(config.get("type", "native")).lower() == "mcp" or cls in VERL_REFUSED:
            why = VERL_REFUSED.get(cls, "an MCP tool, and verirl has no MCP client")
            t.decide(key, f"{what}: verirl refuses it ({why}): remove or replace the entry")
        elif VERL_EQUIVALENTS.get(cls) == "python":
            language = str(config.get("default_language", "python")).lower()
            if language not in ("python", "python3", "py"):
                t.decide(key, f"{what}: default_language {language!r}, where verirl's python tool runs Python")
            else:
                t.note(key, f"{what}: verirl's python tool, each call a program in verirl's sandbox (its memory cap "
                            f"reward.max_memory_mb, 0: 4096 MB, not the service's memory_limit_mb "
                            f"{config.get('memory_limit_mb', 1024)})")
                timeouts.append(float(config.get("default_timeout", 30)))
        elif VERL_EQUIVALENTS.get(cls):
            t.note(key, f"{what}: verirl's own {VERL_EQUIVALENTS[cls]} tool, the same answer check")
        else:
            t.check(f"{path}, {what}: a class verirl imports and calls as {peer} does (create / execute / release): it "
                    f"must import here ({peer} installed, and any service it calls reachable)")
    if timeouts:
        t.put("rollout.multi_turn.tool_timeout_s", max(timeouts), key,
              note=f"the code interpreter's default_timeout ({max(timeouts):g} s), each call's deadline in verirl")


# ---------------------------------------------------------------- reading the source

def _load_tree(path: str) -> dict:
    from omegaconf import DictConfig, OmegaConf

    try:
        cfg = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"Config file '{path}' does not exist. Give the source system's YAML file.") from None
    except IsADirectoryError:
        raise ConfigError(f"'{path}' is a directory, not a config file. Give the source system's YAML file.") from None
    except OSError as e:
        raise ConfigError(f"Config file '{path}' cannot be read: {e.strerror}. Give a readable file.") from None
    except Exception as e:  # yaml errors carry the line and column
        first = " ".join(str(e).split())
        raise ConfigError(f"Config file '{path}' is not valid YAML: {first}. Fix the file, or give the right one.") \
            from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"Config file '{path}' must hold a mapping of keys at its top level, not a "
                          f"{type(cfg).__name__}. Give the source system's config YAML.")
    return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


def _parse_value(key: str, raw: str) -> Any:
    from omegaconf import OmegaConf

    if raw == "":
        return ""
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]), resolve=False)["v"]
    except Exception as e:  # noqa: BLE001  (omegaconf/yaml raise several kinds)
        if "\\" in raw:  # Hydra's escaped characters (\{ \* ...), which YAML does not read: kept as text
            return raw
        raise ConfigError(f"Override '{key}={raw}': the value is not valid YAML ({' '.join(str(e).split())}). "
                          f"Quote it, e.g. {key}='{raw}'.") from None


def _apply_override(tree: dict, text: str) -> str:
    """Apply one Hydra-style override to ``tree``; returns the dotted key it set."""
    if text.startswith("~"):
        key = text[1:].split("=", 1)[0]
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
        return key
    body = text[2:] if text.startswith("++") else text[1:] if text.startswith("+") else text
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"Override '{text}' is not of the form key.sub=value (e.g. actor_rollout_ref.rollout.n=16). "
                          f"Give the source system's dotted overrides after FILE.")
    *parents, leaf = key.split(".")
    node = tree
    for i, p in enumerate(parents):
        if node.get(p) is None:  # Hydra adds a key under a null section, making it one
            node[p] = {}
        elif isinstance(node[p], str) and node[p].startswith("${"):  # under an interpolated section: its copy
            node[p] = _interpolated_section(tree, ".".join(parents[:i + 1]))
        child = node[p]
        if not isinstance(child, dict):
            raise ConfigError(f"Override '{text}': {'.'.join(parents[:i + 1])} holds a value, not a section, so it "
                              f"has no key {leaf}. Check the key's spelling.")
        node = child
    node[leaf] = _parse_value(key, raw)
    return key


def _interpolated_section(tree: dict, key: str) -> Any:
    """The section an interpolation at ``key`` resolves to (a copy to add keys to), else an empty one."""
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.select(OmegaConf.create(tree), key, throw_on_missing=False)
        value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    except Exception:  # noqa: BLE001  (an interpolation to a key the file lacks)
        value = None
    return value if isinstance(value, dict) else {}


def _under_defaults(tree: dict, defaults: dict[str, Any]):
    """``tree`` merged over the source system's defaults (dotted), as Hydra merges a file over the configs
    its defaults list names; ``tree`` alone where the two do not merge."""
    from omegaconf import OmegaConf

    base: dict[str, Any] = {}
    for dotted, value in defaults.items():
        *parents, leaf = dotted.split(".")
        node = base
        for p in parents:
            child = node.setdefault(p, {})
            node = child if isinstance(child, dict) else {}  # a default both a value and a section: the value stays
        node[leaf] = value
    try:
        return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(tree))
    except Exception:  # noqa: BLE001  (a section of the file where a default is a value)
        return OmegaConf.create(tree)


def _resolve(tree: dict, flat: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """OmegaConf interpolations (``${oc.select:...}``, as in veRL's generated config, or ``${data.train_batch_size}``
    in a file over veRL's defaults) resolved against the file merged over the source system's defaults, where they
    can be; a value that cannot be resolved stays as written, and ``???`` (unset) becomes None."""
    from omegaconf import OmegaConf

    if not any(isinstance(v, str) and "${" in v or v == "???" for v in flat.values()):
        return flat
    try:
        cfg = _under_defaults(tree, defaults)
    except Exception:  # noqa: BLE001
        return flat
    out = dict(flat)
    for key, value in flat.items():
        if value == "???":
            out[key] = None
        elif isinstance(value, str) and "${" in value:
            try:
                node = OmegaConf.select(cfg, key, throw_on_missing=False)
                out[key] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
            except Exception:  # noqa: BLE001  (an interpolation to a key this file lacks)
                pass
    return out


def read_source(path: Optional[str], overrides: Sequence[str],
                defaults: Optional[dict[str, Any]] = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(dotted key -> value, dotted key -> origin) of a source file plus its overrides; interpolations resolve
    against ``defaults`` (the source system's, dotted) where the file lacks the key."""
    tree = _load_tree(path) if path else {}
    touched = [_apply_override(tree, text) for text in overrides]
    flat = _resolve(tree, flatten(tree), defaults or {})
    origins = {k: "file" for k in flat}
    for key in touched:
        for k in flat:
            if k == key or k.startswith(key + "."):
                origins[k] = "override"
    return flat, origins


# ---------------------------------------------------------------- the result

@dataclass
class Result:
    source_format: str
    file: str
    overrides: list[str]
    rows: list[Row]
    config: dict[str, dict[str, Any]]  # verirl sections -> keys (-> sub-section keys) -> values (translated only)
    out_from: dict[str, list[str]]  # verirl dotted key -> the source keys it came from
    checks: list[str]
    warnings: list[str]

    def by_status(self, status: str) -> list[Row]:
        return [r for r in self.rows if r.status == status]

    def row(self, key: str) -> Row:
        for r in self.rows:
            if r.key == key:
                return r
        raise KeyError(key)

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def to_json(self) -> dict:
        return {"from": self.source_format, "file": self.file, "overrides": self.overrides,
                "rows": [asdict(r) for r in self.rows], "checks": self.checks, "warnings": self.warnings,
                "counts": {s: len(self.by_status(s)) for s in STATUSES}, "config": self.config}


def convert(source_format: str, file: Optional[str], overrides: Sequence[str] = (), *,
            train_rows: Optional[int] = None, mindspeed_rl_version: str = "auto") -> Result:
    """Translate ``file`` (+ ``overrides``) from ``source_format`` (a key of FORMATS); raises ConfigError for a
    file that cannot be read or a translation that fails verirl's schema checks."""
    if source_format not in FORMATS:
        raise ConfigError(f"--from {source_format!r} is not a format convert-config reads. Use one of: "
                          f"{', '.join(FORMATS)}.")
    if train_rows is not None and train_rows < 1:
        raise ConfigError(f"--train-rows {train_rows}: give the number of training rows, a positive integer.")
    module = importlib.import_module(FORMATS[source_format])
    values, origins = read_source(file, overrides, dict(module.DEFAULTS))
    t = Translation(values, origins, dict(module.DEFAULTS), Options(train_rows, mindspeed_rl_version, file))
    try:
        module.translate(t)
    except (TypeError, ValueError) as e:
        suspects = [k for k in t.read[-3:][::-1] if k in t.values and not isinstance(t.values[k], (int, float, bool))]
        if not suspects:
            raise  # not a value's fault: a bug in the tables
        key, value = suspects[0], t.values[suspects[0]]
        raise ConfigError(f"{key}={value!r} in '{file or '(overrides)'}' is not a value {source_format} takes there "
                          f"({e}). Fix the value (an override on the command line will do).") from None
    _fit_budgets(t)
    t.finish(module.IGNORED)
    _check_format(t, source_format, file)
    config = nest(t.out)
    order = list(t.rows)  # the source's order, then the defaults the translation used
    result = Result(source_format, file or "", list(overrides), [t.rows[k] for k in order], config, t.out_from,
                    t.checks, t.warnings)
    _validate(result)
    return result


def _check_format(t: Translation, source_format: str, file: Optional[str]) -> None:
    """A file none of whose keys the format knows is not that format's: say so, before verirl's checks talk about
    the defaults that stood in for it."""
    if not file or any(r.status != "unknown" for r in t.rows.values() if r.origin != "default"):
        return
    top = sorted({k.split(".", 1)[0] for k in t.values})
    other = [f for f in FORMATS if f != source_format]
    raise ConfigError(f"'{file}' is not a {source_format} config: none of its keys is one {source_format} has "
                      + (f"(its top-level keys: {', '.join(top)})" if top else "(it holds no keys)")
                      + f". Give a {source_format} config, or --from {' or '.join(other)} if it is that system's; a "
                        f"verirl config needs no conversion (verirl train --config FILE).")


def _fit_budgets(t: Translation) -> None:
    """A token budget whose group (budget x actor.sequence_parallel_size tokens) is under the longest possible
    sequence is raised to fit it: verirl refuses a smaller one (a sequence that long would fit no micro-batch),
    where the source system may have let it pass."""
    from verirl.config import Config

    cfg = Config()
    longest = int(t.out.get("data.max_prompt_length", cfg.data.max_prompt_length)) + int(
        t.out.get("rollout.max_new_tokens", cfg.rollout.max_new_tokens))
    sp = int(t.out.get("actor.sequence_parallel_size", cfg.actor.sequence_parallel_size))
    least = -(-longest // sp)  # the per-rank budget whose group holds the longest sequence
    group = "" if sp == 1 else f" x actor.sequence_parallel_size {sp}"
    for target in ("actor.max_token_len_per_device", "ref.log_prob_max_token_len_per_device"):
        budget = t.out.get(target)
        if budget and 0 < int(budget) < least:
            t.out[target] = least
            for key in t.out_from[target]:
                t.decide(key, f"a budget of {budget} tokens{group} is under the longest sequence, prompt + response = "
                              f"{longest}, which verirl refuses (such a sequence would fit no micro-batch): "
                              f"{least} written")


def _validate(result: Result) -> None:
    """verirl's checks of names and values (`verirl.run.checks.check` without paths: the files and model it
    names are the other machine's) on the translated values."""
    from omegaconf.errors import OmegaConfBaseException

    from verirl.config import load_config_dict
    from verirl.run.checks import check

    try:
        check(load_config_dict(result.config), paths=False)
    except (ConfigError, OmegaConfBaseException) as e:
        why = " ".join(str(e).split("\n")[0].split()) if isinstance(e, OmegaConfBaseException) else str(e)
        involved = sorted({k for keys in result.out_from.values() for k in keys
                           if any(part in why for part in _targets_of(result, k))})
        raise ConfigError(f"The translation of '{result.file or '(overrides only)'}' fails verirl's checks: {why} "
                          + (f"It came from the source keys {', '.join(involved)}. " if involved else "")
                          + "Fix the source value (an override on the command line will do), or check the table "
                            "with --json.") from None


def _targets_of(result: Result, key: str) -> list[str]:
    return [target for target, keys in result.out_from.items() if key in keys]


# ---------------------------------------------------------------- output

def _scalar(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).strip()
    return text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").rstrip()


def to_yaml(result: Result, command: str = "") -> str:
    """The verirl config: a header (source, decisions, checks), then each translated key with the source keys
    it came from as a comment."""
    from verirl.config import Config

    counts = ", ".join(f"{len(result.by_status(s))} {s}" for s in STATUSES)
    lines = [f"# verirl config translated from {result.source_format} config "
             f"{result.file or '(no file: overrides on the defaults)'} by `verirl convert-config`."]
    if result.overrides:
        lines.append(f"# Source overrides: {' '.join(result.overrides)}")
    if command:
        lines.append(f"# Command: {command}")
    lines.append(f"# Source keys: {counts}. Keys not written here take verirl's defaults (docs/config.md).")
    lines.append("# Paths and model ids are the other machine's: point them at this machine's copies.")
    decide = result.by_status("decide")
    if decide:
        lines.append("# DECIDE before training (a placeholder or verirl's default stands until then):")
        lines += [f"#   - {r.key}: {r.note}" for r in decide]
    if result.checks:
        lines.append("# CHECK elsewhere (not guessed here):")
        lines += [f"#   - {c}" for c in result.checks]
    if result.warnings:
        lines.append("# WARNINGS:")
        lines += [f"#   - {w}" for w in result.warnings]

    def section_lines(cls: type, values: dict, prefix: str, indent: str) -> None:
        for f in fields(cls):
            if f.name not in values:
                continue
            default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
            if is_dataclass(default) and isinstance(values[f.name], dict):  # a sub-section: its keys, indented
                lines.append(f"{indent}{f.name}:")
                section_lines(type(default), values[f.name], f"{prefix}{f.name}.", indent + "  ")
                continue
            sources = result.out_from.get(f"{prefix}{f.name}", [])
            comment = f"  # <- {', '.join(sources)}" if sources else ""
            lines.append(f"{indent}{f.name}: {_scalar(values[f.name])}{comment}")

    for section in fields(Config):
        values = result.config.get(section.name)
        if not values:
            continue
        lines.append(f"{section.name}:")
        section_lines(section.default_factory, values, f"{section.name}.", "  ")  # type: ignore[arg-type]
    return "\n".join(lines) + "\n"


def _show(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit - 3] + "..."


def print_table(result: Result, file) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    style = {"translated": "green", "decide": "bold yellow", "ignored": "dim", "unknown": "bold red"}
    table = Table(title=f"{result.source_format} -> verirl: {result.file or '(overrides only)'}", show_lines=False,
                  expand=False)
    for name in ("source key", "value", "status", "verirl", "note"):
        table.add_column(name, overflow="fold")
    for r in result.rows:
        value = _show(r.value) + ("  (default)" if r.origin == "default" else "  (override)" if r.origin == "override"
                                  else "")
        written = ", ".join(f"{k}={_show(result.get(k))}" for k in r.targets)
        table.add_row(r.key, value, f"[{style[r.status]}]{r.status}[/]", written, r.note)
    console = Console(file=file, width=max(Console(file=file).width, 160))
    console.print(table)
    counts = ", ".join(f"{len(result.by_status(s))} {s}" for s in STATUSES)
    console.print(f"source keys: {counts}")
    for title, items in (("decide", [f"{r.key}: {r.note}" for r in result.by_status("decide")]),
                         ("check", result.checks), ("warning", result.warnings)):
        for item in items:
            console.print(Text.assemble((title, "bold"), ": ", item), highlight=False)


def run(args) -> int:
    file, overrides = args.file, list(args.overrides)
    if args.source_format == "verl" and "=" in file and not file.endswith((".yaml", ".yml")):
        import os

        if not os.path.exists(file):  # no FILE: the first argument is an override
            file, overrides = None, [file, *overrides]
    result = convert(args.source_format, file, overrides, train_rows=args.train_rows,
                     mindspeed_rl_version=args.mindspeed_rl_version)
    command = " ".join(["verirl", "convert-config", "--from", args.source_format, *([file] if file else []),
                        *overrides] + ([f"--train-rows {args.train_rows}"] if args.train_rows else [])
                       + ([f"--mindspeed-rl-version {args.mindspeed_rl_version}"]
                          if args.mindspeed_rl_version != "auto" else []))
    text = to_yaml(result, command)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise ConfigError(f"Cannot write {args.output}: {e.strerror}. Give -o a writable path.") from None
    if args.json:
        print(json.dumps(result.to_json(), indent=1, ensure_ascii=False, default=str))
        return 0
    if args.output:
        print_table(result, sys.stdout)
        print(f"wrote {args.output}")
    else:
        print_table(result, sys.stderr)
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------- mixture-of-experts layouts (both formats)

def fit_experts(t: Translation, peer: str, ep: int, ep_keys: Sequence[str], etp: int, etp_key: str,
                tp_key: str) -> None:
    """A mixture-of-experts run's layout as verirl builds it (docs/moe.md): ``ep`` (from ``ep_keys``) as
    actor.expert_parallel_size on a world it divides; experts whole on their rank (expert tensor parallel ``etp`` from ``etp_key``: 1 only); no tensor
    parallelism (verirl's expert layers have no tensor-parallel plan: actor.tensor_parallel_size from ``tp_key``
    becomes 1); no expert parallelism inside pipeline stages."""
    import math

    if etp == 1:
        t.translated(etp_key, "experts whole on their rank (expert tensor parallel 1), verirl's "
                              "actor.expert_tensor_parallel_size 1")
    else:
        t.decide(etp_key, f"{peer} cut each expert's matrices over {etp} ranks (expert tensor parallel {etp}); not "
                          f"built in verirl: each expert stays whole on its rank (actor.expert_tensor_parallel_size=1, "
                          f"the default); the same maths, more expert memory per rank (verirl plan shows it)")
    tp = int(t.out.get("actor.tensor_parallel_size", 1))
    if tp > 1:
        t.put("actor.tensor_parallel_size", 1, tp_key,
              note=f"{peer} split the attention and dense layers over {tp} ranks; verirl's mixture-of-experts "
                   f"layers have no tensor-parallel plan (verirl train refuses tensor parallelism on a MoE model): "
                   f"actor.tensor_parallel_size=1 written, the experts split by actor.expert_parallel_size instead")
        t.decide(tp_key, f"tensor parallelism {tp} on a mixture-of-experts model: each rank holds the whole "
                         f"attention and dense weights in verirl; check the memory with `verirl plan`")
        if t.out.get("rollout.engine") != "vllm" and t.out.get("rollout.tensor_parallel_size") == tp:
            t.put("rollout.tensor_parallel_size", 1, *t.out_from.get("rollout.tensor_parallel_size", []),
                  note="1: the actor is not tensor parallel, verirl's engine decodes with the whole weights on each rank")
    if ep <= 1:
        for key in ep_keys:
            t.ignore(key, "1: none")
        return
    pp = int(t.out.get("actor.pipeline_parallel_size", 1))
    if pp > 1:
        for key in ep_keys:
            t.decide(key, f"expert parallelism {ep} inside {pp} pipeline stages: not built in verirl (refused); "
                          f"actor.expert_parallel_size 1 left, every rank of a stage holds all its layers' experts; "
                          f"or actor.pipeline_parallel_size=1 with actor.expert_parallel_size={ep}")
        return
    t.put("actor.expert_parallel_size", ep, *ep_keys,
          note=f"ranks that split the routed experts, in both: E/{ep} experts per rank, tokens dispatched to them "
               f"and combined by all-to-all; the same log-probs as one rank (docs/moe.md)")
    nproc, nnodes = int(t.out.get("trainer.nproc_per_node", 1)), int(t.out.get("trainer.nnodes", 1))
    sp = int(t.out.get("actor.sequence_parallel_size", 1))
    if (nproc * nnodes) % ep:
        written = math.lcm(nproc, ep, sp)
        t.put("trainer.nproc_per_node", written, *t.out_from.get("trainer.nproc_per_node", []), *ep_keys,
              note=f"actor.expert_parallel_size={ep} divides the data-parallel x sequence-parallel ranks: "
                   f"trainer.nproc_per_node={written} written, the fewest that hold it; set trainer.nproc_per_node "
                   f"/ nnodes for this machine, a multiple of {ep} ranks in all")


def aux_scale_words(coef: float, layers: Optional[int], top_k: Optional[int]) -> str:
    """The decide note of a Megatron load-balancing coefficient written as algo.moe_aux_loss_coef: Megatron adds
    coef x the Switch loss of each MoE layer (token shares of the top-k assignments), summed over the layers;
    verirl's (transformers' load_balancing_loss_func) pools the layers' tokens and counts every top-k assignment,
    top_k times Megatron's per-layer value."""
    scale = (f": with the run's {layers} layers and top-{top_k}, {coef:g} x {layers} / {top_k} = "
             f"{coef * layers / top_k:g}" if layers and top_k else " (L: the MoE layers, k: the router's top-k, "
                                                                     "in config.json)")
    return (f"{coef:g} written; Megatron adds {coef:g} x each MoE layer's Switch loss (summed over the layers, token "
            f"shares of the top-k picks), verirl's transformers' loss pools the layers and counts the top-k picks "
            f"(k x Megatron's per-layer value): the same pull per router is algo.moe_aux_loss_coef = coef x L / k"
            f"{scale}")
