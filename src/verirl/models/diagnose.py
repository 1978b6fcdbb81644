"""What a model directory holds, read without its weights (config.json, generation_config.json, the
tokenizer files, the weight files' names): the EOS / pad / BOS ids of each source and the stop ids verirl
would use, the chat template's end of turn, the vocabulary against the embedding rows, the numerics two
systems must share, and the findings where they disagree (docs/doctor.md lists every one).

`diagnose` returns a `Report`; `verirl doctor` prints it and `verirl.run.checks` stops a run on its
error-level findings."""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from verirl.core.errors import ModelError

LEVELS = ("error", "warning", "info")
QWEN_TRAP = ("the Qwen2.5 base-vs-instruct trap: the base model's files say <|endoftext|> 151643, the instruct "
             "model's config.json says <|im_end|> 151645 and its generation_config.json [151645, 151643]")
# config.json keys whose values two systems must share to compute the same forward pass
NUMERIC_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "rope_theta", "rope_scaling",
                "partial_rotary_factor", "tie_word_embeddings", "torch_dtype", "dtype", "max_position_embeddings",
                "hidden_act", "attention_bias", "mlp_bias", "attention_dropout", "use_sliding_window",
                "sliding_window", "max_window_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
                "head_dim", "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
# a tokenizer's vocabulary is in one of these (without any, transformers builds an empty tokenizer, silently)
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "qwen.tiktoken")
SPECIAL_MARKER = re.compile(r"<\|[^|<>\s]+\|>")  # <|im_start|>, <|eot_id|>, ...: meant to be one token


@dataclass
class Finding:
    level: str  # error / warning / info
    code: str  # stable name, e.g. turn-end-not-stop (docs/doctor.md lists them)
    message: str  # the file, the key, the value and the fix


@dataclass
class Report:
    model_dir: str
    model_type: Optional[str] = None
    architectures: list[str] = field(default_factory=list)
    # source -> {"eos": [ids] | None, "pad": id | None, "bos": id | None}; tokenizer entries also carry
    # the token strings ("eos_token", ...); "verirl" holds the stop ids and pad id verirl would use
    ids: dict[str, dict[str, Any]] = field(default_factory=dict)
    vocab: dict[str, Any] = field(default_factory=dict)  # tokenizer length, embedding rows
    chat_template: dict[str, Any] = field(default_factory=dict)  # present, rendered, after_answer, turn_end {token, id}
    template: Optional[dict[str, Any]] = None  # --template: name, stop words -> ids, replace_eos, stop ids
    numerics: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> {value, source}
    findings: list[Finding] = field(default_factory=list)

    def add(self, level: str, code: str, message: str) -> None:
        assert level in LEVELS, level
        self.findings.append(Finding(level, code, message))

    @property
    def exit_code(self) -> int:
        return 1 if any(f.level == "error" for f in self.findings) else 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["findings"] = sorted(out["findings"], key=lambda f: LEVELS.index(f["level"]))
        out["counts"] = {lv: sum(f.level == lv for f in self.findings) for lv in LEVELS}
        out["exit_code"] = self.exit_code
        return out


# --- reading the directory ---------------------------------------------------------------------

def _read_json(path: Path) -> Optional[dict]:
    """The object in ``path``, or None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}). Fix or replace the file.") from None
    except UnicodeDecodeError:
        raise ModelError(f"{path}: not UTF-8 text. Replace the file with the model's original.") from None
    if not isinstance(obj, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(obj).__name__}. Replace the file.")
    return obj


def _id_list(value: Any, where: str) -> Optional[list[int]]:
    """An eos_token_id as written (an int, a list or null) -> a list of ints, or None when unset."""
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ModelError(f"{where} eos_token_id={value!r}: expected a token id or a list of ids. Fix the file.")
    return list(values)


def _token_string(value: Any) -> Optional[str]:
    """A special token as tokenizer files write it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def diagnose(model_dir: str, template: str = "", templates_file: str = "") -> Report:
    """Every check on ``model_dir``; raises `ModelError` only when it is not a readable model directory."""
    from verirl.models.load import resolve_path
    from verirl.models.lora import adapter_base, is_adapter_dir

    real = Path(resolve_path(model_dir))
    if not real.is_dir():
        raise ModelError(f"MODEL_DIR '{model_dir}' is not a directory. Give a Hugging Face model directory "
                         f"(config.json and the tokenizer files; weights are not read), or tiny.")
    raw = _read_json(real / "config.json")
    if raw is None and is_adapter_dir(real):  # a LoRA adapter directory: the model is its base, merged with it
        base = adapter_base(real)
        if base:
            return diagnose(base, template, templates_file)
    if raw is None:
        raise ModelError(f"MODEL_DIR '{model_dir}' has no config.json, so it is not a Hugging Face model directory. "
                         f"Point at the folder that holds config.json and the tokenizer files.")
    prompt_template = None
    if template and template != "tokenizer":  # an unknown name: ConfigError (exit 2), before any loading
        from verirl.data.templates import get_template
        prompt_template = get_template(template, templates_file or None)
    report = Report(str(real), raw.get("model_type"), list(raw.get("architectures") or []))
    config = _effective_config(real, report)
    gen_raw = _read_json(real / "generation_config.json")
    tokenizer = _load_tokenizer(real, report)

    _collect_ids(real, raw, gen_raw, tokenizer, report)
    stops, pad = _verirl_ids(real, config, raw, gen_raw, tokenizer, report)
    if tokenizer is not None:
        _check_vocab(raw, config, tokenizer, report)
        _check_chat_template(tokenizer, report, uses_chat_template=prompt_template is None)
        if prompt_template is not None:
            stops = _check_template(prompt_template, tokenizer, stops, report)
        _check_eos_is_pad(stops, pad, report)
    _numerics(raw, config, report)
    _check_weight_format(real, report)
    return report


def _check_weight_format(real: Path, report: Report) -> None:
    from verirl.models.load import pickle_refusal, pickle_weights

    if pickled := pickle_weights(str(real)):
        report.add("error", "pickle-weights", pickle_refusal(str(real), pickled))


def _effective_config(real: Path, report: Report):
    """transformers' config (defaults filled in), or None when transformers cannot read it."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(real))
    except (ValueError, KeyError, OSError, TypeError) as e:
        report.add("warning", "config-not-loadable",
                   f"{real}/config.json: transformers cannot read it ({type(e).__name__}: {e}); the defaults of keys "
                   f"absent from config.json are unknown, and verirl could not load this model. Check model_type and "
                   f"the transformers version.")
        return None


def _load_tokenizer(real: Path, report: Report):
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if not any((real / name).is_file() for name in VOCAB_FILES):
        report.add("error", "tokenizer-not-loadable",
                   f"{real} has no tokenizer vocabulary (none of {', '.join(VOCAB_FILES)}). Copy the tokenizer files "
                   f"(tokenizer.json, tokenizer_config.json) from the model the weights came from.")
        return None
    try:
        return AutoTokenizer.from_pretrained(str(real))
    except (OSError, ValueError, KeyError, TypeError) as e:
        report.add("error", "tokenizer-not-loadable",
                   f"{real}: the tokenizer cannot be loaded ({type(e).__name__}: {e}). Copy tokenizer.json and "
                   f"tokenizer_config.json (and special_tokens_map.json) from the model the weights came from.")
        return None


# --- ids per source --------------------------------------------------------------------------------

def _collect_ids(real: Path, raw: dict, gen_raw: Optional[dict], tokenizer, report: Report) -> None:
    report.ids["config.json"] = {"eos": _id_list(raw.get("eos_token_id"), "config.json"),
                                 "pad": raw.get("pad_token_id"), "bos": raw.get("bos_token_id")}
    if gen_raw is None:
        report.ids["generation_config.json"] = {"present": False, "eos": None, "pad": None, "bos": None}
        report.add("info", "no-generation-config",
                   f"{real} has no generation_config.json: transformers' generate() and vLLM take the EOS from "
                   f"config.json (eos_token_id={raw.get('eos_token_id')}). Write one that names every id a "
                   f"response may end on (verirl's export does).")
    else:
        report.ids["generation_config.json"] = {
            "present": True, "eos": _id_list(gen_raw.get("eos_token_id"), "generation_config.json"),
            "pad": gen_raw.get("pad_token_id"), "bos": gen_raw.get("bos_token_id")}
    files = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        obj = _read_json(real / name)
        if obj is not None:
            files[name] = {k: _token_string(obj.get(f"{k}_token")) for k in ("eos", "pad", "bos")}
    if len(files) == 2:
        for kind in ("eos", "pad", "bos"):
            a, b = files["tokenizer_config.json"][kind], files["special_tokens_map.json"][kind]
            if a is not None and b is not None and a != b:
                report.add("warning", "tokenizer-files-disagree",
                           f"{real}: tokenizer_config.json says {kind}_token={a!r}, special_tokens_map.json says "
                           f"{b!r}; which one wins depends on the library and its version, so two systems can read "
                           f"different ids. Make both files say the same token.")
    if tokenizer is None:
        report.ids["tokenizer"] = {"eos": None, "pad": None, "bos": None, "files": files}
        return
    entry: dict[str, Any] = {"files": files}
    for kind in ("eos", "pad", "bos"):
        token = getattr(tokenizer, f"{kind}_token", None)
        tid = getattr(tokenizer, f"{kind}_token_id", None)
        entry[f"{kind}_token"] = token
        entry[kind] = [tid] if kind == "eos" and tid is not None else tid
        if token is not None and tid is not None and tokenizer.convert_ids_to_tokens(tid) != token:
            report.add("error", "token-not-in-vocabulary",
                       f"{real}: the tokenizer's {kind}_token {token!r} is not a token of its vocabulary (it maps to "
                       f"{tid}, {tokenizer.convert_ids_to_tokens(tid)!r}). Set {kind}_token in tokenizer_config.json "
                       f"to a token of tokenizer.json.")
    report.ids["tokenizer"] = entry

    for kind in ("pad", "bos"):
        found = {src: v[kind] for src, v in report.ids.items() if v.get(kind) is not None}
        if len(set(found.values())) > 1:
            detail = ", ".join(f"{src} {i} ({_tok(tokenizer, i)})" for src, i in found.items())
            report.add("info", f"{kind}-disagree",
                       f"{kind} ids differ: {detail}. verirl takes the tokenizer's"
                       + (" pad id, and masks by position, so the pad value changes nothing in its losses; a system "
                          "that takes pad_token_id from config.json pads (and may mask) with another id."
                          if kind == "pad" else
                          f" (it {'adds' if _adds_bos(tokenizer) else 'does not add'} a BOS when encoding with "
                          f"special tokens); the {kind}_token_id of config.json matters to a system that builds "
                          f"inputs from it. Make them agree when aligning two systems."))


def _generation_eos(report: Report) -> tuple[str, list[int]]:
    """(where it comes from, the ids) of the EOS that transformers' generate() and vLLM stop on:
    generation_config.json's eos_token_id, else config.json's."""
    gen = report.ids["generation_config.json"]
    if gen.get("present") and gen.get("eos") is not None:
        return "generation_config.json", list(gen["eos"])
    why = "no generation_config.json" if not gen.get("present") else "generation_config.json sets no eos_token_id"
    return f"config.json ({why})", list(report.ids["config.json"]["eos"] or [])


def _tok(tokenizer, tid: Optional[int]) -> str:
    """'<|im_end|>' for an id (or '?' when the tokenizer does not know it)."""
    if tokenizer is None or tid is None or not 0 <= tid < len(tokenizer):
        return "?"
    return str(tokenizer.convert_ids_to_tokens(int(tid)))


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bos is not None and bool(ids) and ids[0] == bos


def _verirl_ids(real: Path, config, raw: dict, gen_raw: Optional[dict], tokenizer,
                report: Report) -> tuple[list[int], Optional[int]]:
    """The stop ids and the pad id verirl's `load_model` would pick, by its own rule
    (`verirl.models.load.stop_token_ids`), and the EOS disagreements that rule warns about."""
    from transformers import GenerationConfig

    from verirl.models.load import eos_disagree, eos_sources, pad_token_id

    cfg = config if config is not None else SimpleNamespace(eos_token_id=raw.get("eos_token_id"))
    if gen_raw is not None:
        gen = SimpleNamespace(eos_token_id=gen_raw.get("eos_token_id"))
    elif config is not None:  # what from_pretrained does without the file
        gen = GenerationConfig.from_model_config(config)
    else:
        gen = None
    tok = tokenizer if tokenizer is not None else SimpleNamespace(eos_token_id=None, pad_token_id=None)
    sources = eos_sources(cfg, gen, tok)  # verirl's own rule (`verirl.models.load.stop_token_ids`)
    stops = sorted({i for v in sources.values() for i in v})
    if not stops:
        report.add("error", "no-eos",
                   f"{real}: no EOS id in generation_config.json, config.json or the tokenizer, so no response "
                   f"would ever end. Set eos_token_id in generation_config.json and config.json (and eos_token "
                   f"in tokenizer_config.json).")
    pad = pad_token_id(tok, stops) if stops or tok.pad_token_id is not None else None
    report.ids["verirl"] = {"eos": stops, "pad": pad, "bos": None}
    if tokenizer is not None and tokenizer.pad_token_id is None and stops:
        report.add("info", "no-pad-token",
                   f"{real}: the tokenizer has no pad_token; verirl pads with the first stop id {stops[0]} "
                   f"({_tok(tokenizer, stops[0])}), which is safe because it masks by position (see eos-is-pad).")
    if eos_disagree(sources):
        gen_src, gen_list = _generation_eos(report)
        gen_ids = set(gen_list)
        extra = {}
        for src in ("config.json", "tokenizer"):
            missing = sorted(set(report.ids[src]["eos"] or []) - gen_ids)
            if missing:
                extra[src] = missing
        detail = "; ".join(f"{src} has {ids} ({', '.join(_tok(tokenizer, i) for i in ids)})"
                           for src, ids in extra.items())
        report.add("warning", "eos-disagree",
                   f"EOS ids disagree: {gen_src} eos_token_id is {sorted(gen_ids)}, but {detail}. verirl stops on "
                   f"any of {stops}; transformers' generate() and vLLM stop only on the ids of {gen_src}, so the two "
                   f"systems end responses at different tokens. Fix: list every id a response may end on in "
                   f"generation_config.json eos_token_id (and check that the tokenizer and config come from the same "
                   f"model; {QWEN_TRAP}).")
    for src, entry in report.ids.items():
        for kind in ("eos", "pad", "bos"):
            vals = entry.get(kind)
            for tid in (vals if isinstance(vals, list) else [vals]):
                _check_id_in_range(src, kind, tid, config, raw, tokenizer, report)
    return stops, pad


def _check_id_in_range(src: str, kind: str, tid: Optional[int], config, raw: dict, tokenizer,
                       report: Report) -> None:
    if tid is None or src == "verirl":
        return
    rows = getattr(config, "vocab_size", None) or raw.get("vocab_size")
    key = f"{kind}_token_id" if src != "tokenizer" else f"{kind}_token"
    if tid < 0 or (rows and tid >= rows):
        report.add("error", "id-out-of-range",
                   f"{src} {key}={tid} is outside the embedding (vocab_size={rows} rows): the model cannot read or "
                   f"emit it. Fix {key} in {src} to the model's token id.")
    elif tokenizer is not None and tid >= len(tokenizer):
        report.add("warning", "id-not-a-token",
                   f"{src} {key}={tid} is an embedding row no token of the tokenizer ({len(tokenizer)} tokens) maps "
                   f"to: decoding drops it and nothing encodes to it. Fix {key} in {src}, or use the tokenizer that "
                   f"came with these files.")


# --- vocabulary, chat template, prompt template --------------------------------------------------

def _check_vocab(raw: dict, config, tokenizer, report: Report) -> None:
    n_tok = len(tokenizer)
    rows = getattr(config, "vocab_size", None) or raw.get("vocab_size")
    report.vocab = {"tokenizer": n_tok, "embedding_rows": rows}
    if rows is None:
        report.add("warning", "no-vocab-size",
                   f"config.json has no vocab_size: the embedding size is unknown, so tokenizer ids ({n_tok}) cannot "
                   f"be checked against it. Write vocab_size in config.json.")
    elif rows < n_tok:
        first = [f"{i} {tokenizer.convert_ids_to_tokens(i)!r}" for i in range(rows, min(n_tok, rows + 3))]
        report.add("error", "embedding-too-small",
                   f"config.json vocab_size={rows} embedding rows, but the tokenizer has {n_tok} tokens (added and "
                   f"special tokens included): ids {rows}..{n_tok - 1} ({', '.join(first)}, ...) index past the "
                   f"embedding (an index error on CPU, a device-side assert on GPU). Fix: use the tokenizer that came "
                   f"with these weights, or resize the embedding (model.resize_token_embeddings({n_tok})) and save "
                   f"the model again.")
    elif rows > n_tok:
        report.add("info", "embedding-padding",
                   f"config.json vocab_size={rows} embedding rows for {n_tok} tokens: {rows - n_tok} padding rows no "
                   f"token maps to. Normal (Qwen2.5: 151936 rows up to 3B, 152064 from 7B, for 151665 tokens, "
                   f"rounded up for the hardware); both systems must use the same vocab_size for their logits to "
                   f"match.")


def _check_chat_template(tokenizer, report: Report, uses_chat_template: bool) -> None:
    """Render a one-turn conversation and find the token that ends the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        report.chat_template = {"present": False}
        report.add("info", "no-chat-template",
                   "the tokenizer has no chat template (tokenizer_config.json chat_template or chat_template.jinja): "
                   "prompts need a verirl template (data.prompt_type, --template), e.g. qwen_r1 or empty for data "
                   "already templated.")
        return
    answer = "The answer is 2."
    msgs = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": answer}]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False)
    except Exception as e:  # a template's own raise_exception(), or any Jinja error: reported, not fatal
        report.chat_template = {"present": True, "error": f"{type(e).__name__}: {e}"}
        report.add("warning", "chat-template-error",
                   f"the chat template cannot render a user turn and an assistant turn ({type(e).__name__}: {e}). "
                   f"Check chat_template in tokenizer_config.json (or chat_template.jinja).")
        return
    at = text.rfind(answer)
    tail = text[at + len(answer):] if at >= 0 else ""
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    end = next((i for i in ids if i in special), None)
    report.chat_template = {"present": True, "rendered": text, "after_answer": tail,
                            "turn_end": None if end is None else {"token": _tok(tokenizer, end), "id": end}}
    if end is None:
        report.add("warning", "turn-end-not-special",
                   f"the chat template ends the assistant's turn with {tail!r}, no special token: a response can "
                   f"only end on an EOS id, which the template never shows the model at the end of a turn. Check "
                   f"the chat template.")
        return
    gen_src, gen_ids = _generation_eos(report)
    if end in gen_ids:
        return
    verirl_stops = report.ids["verirl"]["eos"]
    if end in verirl_stops:
        in_verirl = (f"verirl itself stops on it (its stop ids {verirl_stops} take in the tokenizer's EOS too), but "
                     f"transformers' generate(), vLLM and other systems read {gen_src}")
    else:
        in_verirl = (f"verirl's stop ids {verirl_stops} miss it too, so rollouts run to the length cap and the "
                     f"policy never learns to stop")
    used = ("" if uses_chat_template else
            " (Reported as info: with --template the prompts come from that template, not the chat template.)")
    report.add("error" if uses_chat_template else "info", "turn-end-not-stop",
               f"the chat template ends the assistant's turn with {_tok(tokenizer, end)} ({end}), but {gen_src} "
               f"eos_token_id is {gen_ids}: generation does not stop at the end of a turn, and training on what runs "
               f"past it never shows the model its real end ({QWEN_TRAP}). {in_verirl}. Fix: add {end} to "
               f"eos_token_id in generation_config.json (as Qwen2.5-Instruct ships it), or use the tokenizer and "
               f"config of the model these weights are.{used}")


def _check_template(t, tokenizer, stops: list[int], report: Report) -> list[int]:
    """Map a verirl template's (`verirl.data.templates.Template`) stop words to token ids; returns the
    stop ids verirl would use with it (the rule of `verirl.train.build._stop_word_ids`: the stop words
    instead of the EOS ids with replace_eos, else both)."""
    name = t.name
    words: dict[str, list[int]] = {}
    for w in t.stop_words:
        ids = tokenizer(w, add_special_tokens=False)["input_ids"]
        words[w] = ids
        if len(ids) != 1:
            report.add("error", "stop-word-not-one-token",
                       f"template '{name}' stop word {w!r} is {len(ids)} tokens in this tokenizer ({ids}): a stop "
                       f"word must be a single token (verirl refuses to train with it). Fix: choose a template made "
                       f"for this model, or set stop_words in your templates.json to a token of this vocabulary.")
    rendered = t.render([{"role": "user", "content": "What is 1 + 1?"}],
                        tokenizer.bos_token or "", tokenizer.eos_token or "")
    for marker in sorted(set(SPECIAL_MARKER.findall(rendered))):
        n = len(tokenizer(marker, add_special_tokens=False)["input_ids"])
        if n != 1:
            report.add("warning", "template-marker-not-a-token",
                       f"template '{name}' writes {marker} into prompts, which is {n} tokens in this tokenizer, not "
                       f"one special token: the template was written for another model. Choose a template for this "
                       f"model.")
    single = [ids[0] for ids in words.values() if len(ids) == 1]
    if len(single) == len(words) and words:
        new_stops = sorted(set(single) if t.replace_eos else set(single) | set(stops))
    else:
        new_stops = stops
    report.template = {"name": name, "stop_words": {w: ids for w, ids in words.items()},
                       "replace_eos": t.replace_eos, "stop_ids": new_stops}
    report.ids["verirl"]["eos"] = new_stops
    if words:
        gen_src, gen_list = _generation_eos(report)
        gen_ids = set(gen_list)
        mapping = ", ".join(f"{w} -> {ids}" for w, ids in words.items())
        outside = sorted(set(single) - gen_ids)
        report.add("info", "template-stops",
                   f"template '{name}': stop words {mapping}; replace_eos={str(t.replace_eos).lower()}, so verirl "
                   f"stops on {new_stops}"
                   + (f". {outside} are not in {gen_src} eos_token_id {sorted(gen_ids)}: a system that does not "
                      f"pass the template's stop words to its engine runs past them." if outside else "."))
    else:
        report.add("info", "template-stops",
                   f"template '{name}' has no stop words: verirl stops on the model's EOS ids {new_stops}.")
    return new_stops


def _check_eos_is_pad(stops: list[int], pad: Optional[int], report: Report) -> None:
    eos_ids = set(stops) | {i for src, v in report.ids.items() if src != "verirl" for i in (v.get("eos") or [])}
    pads = {src: v["pad"] for src, v in report.ids.items() if v.get("pad") is not None}
    same = {src: p for src, p in pads.items() if p in eos_ids}
    if not same:
        return
    detail = ", ".join(f"{src} {p}" for src, p in same.items())
    report.add("warning", "eos-is-pad",
               f"the pad id is also an EOS id ({detail}; EOS ids {sorted(eos_ids)}). Safe in verirl: it masks a "
               f"response by position, up to and including its first stop token (build_rollout), never by comparing "
               f"ids with the pad id, so the EOS is kept and trained on. Not safe in a tool that drops pad ids by "
               f"value (remove-padding by input_ids != pad_id): it strips every EOS, the policy never sees where to "
               f"stop, and response length collapses (within a few hundred steps). When aligning with such a tool, "
               f"give it a pad token that is no EOS (an unused special token).")


# --- numerics ------------------------------------------------------------------------------------------

def _numerics(raw: dict, config, report: Report) -> None:
    """Values two systems must share, as config.json writes them, or transformers' default when absent."""
    rope = raw.get("rope_parameters") if isinstance(raw.get("rope_parameters"), dict) else {}
    for key in NUMERIC_KEYS:
        if key in raw:
            report.numerics[key] = {"value": raw[key], "source": "config.json"}
        elif key == "rope_theta" and "rope_theta" in rope:
            report.numerics[key] = {"value": rope["rope_theta"], "source": "config.json rope_parameters"}
        elif key == "rope_scaling" and rope:
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
            report.numerics[key] = {"value": None if scaling.get("rope_type", "default") == "default" else scaling,
                                    "source": "config.json rope_parameters"}
        elif config is not None and key not in ("torch_dtype", "dtype"):
            value = _default(config, key)
            if value is not None or key == "rope_scaling":
                report.numerics[key] = {"value": value, "source": "default (not in config.json)"}
    if not any(k in raw for k in NORM_EPS_KEYS):
        value = next((report.numerics[k]["value"] for k in NORM_EPS_KEYS if k in report.numerics), None)
        default = f"its default ({value})" if value is not None else "the architecture's default"
        report.add("warning", "norm-eps-not-set",
                   f"config.json sets no rms_norm_eps: transformers uses {default} and another system its own "
                   f"(MindSpeed-RL: 1e-6 unless the model yaml sets rms_norm_eps). A different eps makes every "
                   f"layer's output differ a little and the reward drift over a long run (after about "
                   f"1,500 steps). Write the value into config.json and into the other system's model config.")
    else:
        key = next(k for k in NORM_EPS_KEYS if k in raw)
        report.add("info", "norm-eps",
                   f"config.json {key}={raw[key]}: the other system must use the same value (MindSpeed-RL: "
                   f"rms_norm_eps in the model yaml, default 1e-6; verirl: model.override_config to change it).")


def _default(config, key: str) -> Any:
    """transformers' value of ``key`` for this architecture (a plain value), or None."""
    if key == "rope_theta":
        params = getattr(config, "rope_parameters", None) or {}
        return params.get("rope_theta", getattr(config, "rope_theta", None)) if isinstance(params, dict) else None
    if key == "rope_scaling":  # transformers 5 shows rope_parameters here, the default type included
        value = getattr(config, key, None)
        return value if isinstance(value, dict) and value.get("rope_type", "default") != "default" else None
    value = getattr(config, key, None)
    return value if isinstance(value, (int, float, str, bool, list, dict)) else None
