"""Prompt templates in MindSpeed-RL's ``templates.json`` format.

A file holds a list of objects::

    {"name": "qwen_r1",
     "format_user": {"slots": ["<|im_start|>user\\n...{{content}}<|im_end|>\\n<|im_start|>assistant\\n"]},
     "format_assistant": {"slots": ["{{content}}<|im_end|>\\n"]},
     "format_system": {"slots": ["<|im_start|>system\\n{{content}}<|im_end|>\\n"]},
     "format_observation": {"slots": [...]}, "format_separator": {"slots": ["\\n"]},
     "format_prefix": {"slots": ["{{bos_token}}"]},
     "default_system": "You are a helpful assistant.", "stop_words": ["<|im_end|>"], "replace_eos": true}

A slot is a string (``{{content}}``, ``{{bos_token}}`` and ``{{eos_token}}`` are filled in)
or ``{"token": "<|im_start|>"}``. ``stop_words`` become the rollout's stop tokens; with
``replace_eos`` they replace the tokenizer's EOS as the token a response ends on.
Built-ins (``src/verirl/data/templates.json``): empty, qwen, qwen_r1, qwen_math_r1, llama3.
``prompt_type: tokenizer`` uses the tokenizer's own chat template instead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verirl.core.errors import ConfigError

BUILTIN_FILE = Path(__file__).resolve().parent / "templates.json"
SLOT_KEYS = ("format_prefix", "format_user", "format_assistant", "format_system", "format_observation",
             "format_separator")


@dataclass
class Template:
    name: str
    slots: dict[str, list]  # format_* -> slots
    default_system: str = ""
    stop_words: list[str] = field(default_factory=list)
    replace_eos: bool = False

    def _fill(self, key: str, content: str, bos: str, eos: str) -> str:
        out = []
        for slot in self.slots.get(key, ["{{content}}"] if key != "format_prefix" else []):
            if isinstance(slot, dict):
                out.append(str(slot.get("token", "")))
            else:
                out.append(str(slot).replace("{{content}}", content).replace("{{bos_token}}", bos)
                           .replace("{{eos_token}}", eos))
        return "".join(out)

    def render(self, messages: list[dict[str, str]], bos_token: str = "", eos_token: str = "") -> str:
        """Render a conversation that ends with a user (or tool) turn, generation prompt included
        (as in MindSpeed-RL, the user slot ends by opening the assistant turn)."""
        text = self._fill("format_prefix", "", bos_token, eos_token)
        system = next((m["content"] for m in messages if m.get("role") == "system"), self.default_system)
        if system and "format_system" in self.slots:
            text += self._fill("format_system", system, bos_token, eos_token)
        turns = [m for m in messages if m.get("role") != "system"]
        for i, m in enumerate(turns):
            role = m.get("role")
            key = {"user": "format_user", "assistant": "format_assistant", "tool": "format_observation",
                   "observation": "format_observation"}.get(str(role))
            if key is None:
                raise ConfigError(f"template '{self.name}': message {i} has role {role!r}; "
                                 f"expected system, user, assistant or tool.")
            if role == "user" and i > 0:
                text += self._fill("format_separator", "", bos_token, eos_token)
            text += self._fill(key, m["content"], bos_token, eos_token)
        return text


def _parse(obj: dict, source: str, index: int) -> Template:
    if not isinstance(obj, dict) or "name" not in obj:
        raise ConfigError(f"{source}: entry {index} is not an object with a 'name'.")
    slots = {}
    for key in SLOT_KEYS:
        if key in obj:
            val = obj[key]
            if not isinstance(val, dict) or not isinstance(val.get("slots"), list):
                raise ConfigError(f"{source}: template '{obj['name']}' key '{key}' must be "
                                 f'{{"slots": [...]}}, got {val!r}.')
            slots[key] = val["slots"]
    unknown = set(obj) - set(SLOT_KEYS) - {"name", "default_system", "stop_words", "replace_eos", "efficient_eos",
                                           "format_function", "format_tools", "tool_format", "mm_plugin"}
    if unknown:
        raise ConfigError(f"{source}: template '{obj['name']}' has unknown keys {sorted(unknown)}.")
    return Template(obj["name"], slots, obj.get("default_system") or "", list(obj.get("stop_words") or []),
                    bool(obj.get("replace_eos", False)))


def load_templates(path: Optional[str | Path] = None) -> dict[str, Template]:
    """Built-ins, then (overriding by name) the templates of a user's templates.json."""
    out = {}
    for src in [BUILTIN_FILE] + ([Path(path)] if path else []):
        if not Path(src).is_file():
            raise ConfigError(f"templates file '{src}' does not exist (or is not a file). Fix data.templates_file "
                              f"(templates_file for `verirl preprocess`).")
        raw = Path(src).read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            raise ConfigError(f"templates file '{src}' line {line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                              f"byte offset {e.start}). Save it as UTF-8.") from None
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"templates file '{src}' is not valid JSON: line {e.lineno}: {e.msg}.") from None
        if not isinstance(entries, list):
            raise ConfigError(f"templates file '{src}' must hold a JSON list of templates.")
        for i, obj in enumerate(entries):
            t = _parse(obj, str(src), i)
            out[t.name] = t
    return out


def get_template(name: str, path: Optional[str | Path] = None) -> Template:
    templates = load_templates(path)
    if name not in templates:
        raise ConfigError(f"prompt_type '{name}' is not a template; known: {sorted(templates)} "
                         f"(or 'tokenizer' for the tokenizer's own chat template).")
    return templates[name]
