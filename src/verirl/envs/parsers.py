"""Tool calls read from an assistant turn, by model family (`PARSERS`, key ``rollout.multi_turn.parser``).

A parser is ``parse(turn, tools) -> (calls, errors)``: ``turn`` is the decoded text of the sampled turn
(special tokens kept), ``tools`` maps each tool's name to its JSON-schema ``parameters``. A call the
model wrote but got wrong (bad JSON, an unknown tool, arguments that are not an object, a missing or
unexpected parameter, a value of the wrong JSON type) is not dropped: it is an error string the model
will read as an observation (counted in ``tools/parse_errors``), as the peers do. No call and no error
means the turn is an answer.

- ``hermes`` (Qwen2.5, Qwen3, Hermes): one or more ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  blocks. What stands inside a ``<think>`` block is reasoning, not a call.
- ``llama3`` (Llama 3.1 / 3.2 JSON tool calling): a turn that is a JSON object ``{"name": ...,
  "parameters": {...}}`` (several separated by ``;``), optionally after ``<|python_tag|>``.
- ``answer``: never a tool call (the turn is the answer).
- ``auto`` (`parser_for`): by the chat template's text, hermes if it holds ``<tool_call>``, llama3 if
  it holds ``<|python_tag|>`` or ``ipython``, else hermes.

Bounded: at most `MAX_CALLS` calls a turn are read (the rest is one error), and a call's JSON text of
more than `MAX_CALL_CHARS` characters is an error without being parsed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from verirl.core.registry import Registry

MAX_CALLS = 8  # tool calls read from one turn
MAX_CALL_CHARS = 16384  # of one call's JSON text
NAME_CHARS = 64  # of a name quoted back in an error


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    index: int = 0  # its place among the turn's calls (0-based): results and errors keep the turn's order


class CallError(str):
    """An error the model will read (a str), with the place of the call among the turn's calls (``index``)."""
    index: int

    def __new__(cls, message: str, index: int = 0) -> "CallError":
        self = super().__new__(cls, message)
        self.index = index
        return self


Parsed = tuple[list[ToolCall], list[str]]
Parser = Callable[[str, Mapping[str, dict]], Parsed]

_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
               "array": (list,), "object": (dict,), "null": (type(None),)}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object"}.get(type(value), type(value).__name__)


def _fits(value: Any, declared: Any) -> bool:
    """Whether ``value`` has the JSON type ``declared`` (a name or a list of names; unknown: yes)."""
    names = declared if isinstance(declared, list) else [declared]
    known = [n for n in names if n in _JSON_TYPES]
    if not known:
        return True
    if isinstance(value, bool):  # a JSON true is not an integer or a number
        return "boolean" in known
    return any(isinstance(value, _JSON_TYPES[n]) for n in known)


def _short(name: Any) -> str:
    text = name if isinstance(name, str) else json.dumps(name)
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS] + "..."


def check_call(obj: Any, tools: Mapping[str, dict], index: int, where: str,
               keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | CallError:
    """A decoded call checked against the tools' schemas: a `ToolCall`, or the `CallError` the model reads.
    ``where`` names the call in errors ("tool call 2: ..."); ``keys``: where its arguments may stand."""
    if not isinstance(obj, dict):
        return CallError(f"{where}: a tool call is a JSON object {{\"name\": ..., \"{keys[0]}\": {{...}}}}, "
                         f"not {_type_name(obj)}", index)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return CallError(f"{where}: the call has no \"name\" (a string naming the tool)", index)
    if name not in tools:
        known = ", ".join(tools) or "none"
        return CallError(f"{where}: there is no tool named {_short(name)!r}; the tools are: {known}", index)
    where = f"{where} ({name})"
    args = next((obj[k] for k in keys if k in obj), {})
    if args is None:
        args = {}
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return CallError(f"{where}: \"{keys[0]}\" is a string that is not a JSON object", index)
    if not isinstance(args, dict):
        return CallError(f"{where}: \"{keys[0]}\" must be a JSON object, not {_type_name(args)}", index)
    params = tools[name] or {}
    props = params.get("properties") or {}
    missing = [p for p in params.get("required") or [] if p not in args]
    if missing:
        return CallError(f"{where}: missing required parameter{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(p) for p in missing)}", index)
    if props and params.get("additionalProperties") is not True:
        extra = [k for k in args if k not in props]
        if extra:
            return CallError(f"{where}: unexpected parameter{'s' if len(extra) > 1 else ''} "
                             f"{', '.join(repr(_short(k)) for k in extra)}; it takes {', '.join(props)}", index)
    for key, value in args.items():
        declared = (props.get(key) or {}).get("type") if isinstance(props.get(key), dict) else None
        if declared is not None and not _fits(value, declared):
            want = " or ".join(declared) if isinstance(declared, list) else declared
            return CallError(f"{where}: parameter {key!r} must be {want}, not {_type_name(value)}", index)
    return ToolCall(name, args, index)


def _decode(text: str, index: int, where: str) -> Any:
    """The JSON value of one call's text, or a `CallError`."""
    if len(text) > MAX_CALL_CHARS:
        return CallError(f"{where}: the call is {len(text)} characters long; at most {MAX_CALL_CHARS} are read", index)
    try:
        return json.loads(text)
    except RecursionError:
        return CallError(f"{where}: the call's JSON is nested too deeply", index)
    except ValueError as e:
        return CallError(f"{where}: not valid JSON ({e})", index)


def _split(items: list, total: int) -> Parsed:
    calls = [x for x in items if isinstance(x, ToolCall)]
    errors: list[str] = [x for x in items if isinstance(x, CallError)]
    if total > MAX_CALLS:
        errors.append(CallError(f"{total} tool calls in one turn: only the first {MAX_CALLS} are run", MAX_CALLS))
    return calls, errors


def _where(i: int, n: int) -> str:
    return f"tool call {i + 1}" if n > 1 else "tool call"


def without_reasoning(turn: str) -> str:
    """The turn without its reasoning: what follows the last ``</think>`` (Qwen3 thinking), or what comes
    before an unclosed ``<think>``."""
    if "</think>" in turn:
        return turn.rsplit("</think>", 1)[1]
    if "<think>" in turn:
        return turn.split("<think>", 1)[0]
    return turn


OPEN, CLOSE = "<tool_call>", "</tool_call>"


def hermes(turn: str, tools: Mapping[str, dict]) -> Parsed:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes). A block
    left open at the end of the turn is read if its JSON is whole."""
    text = without_reasoning(turn)
    blocks: list[tuple[str, bool]] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            blocks.append((text[start + len(OPEN):], False))
            break
        blocks.append((text[start + len(OPEN):end], True))
        pos = end + len(CLOSE)
    n = len(blocks)
    items: list = []
    for i, (body, closed) in enumerate(blocks[:MAX_CALLS]):
        where = _where(i, n)
        if not body.strip():
            items.append(CallError(f"{where}: {OPEN}{CLOSE} holds no call", i))
            continue
        obj = _decode(body.strip(), i, where)
        if isinstance(obj, CallError):
            if not closed:
                obj = CallError(f"{where}: {OPEN} is not closed with {CLOSE}, and what follows it is not a "
                                f"whole JSON object", i)
            items.append(obj)
            continue
        items.append(check_call(obj, tools, i, where))
    return _split(items, n)


PYTHON_TAG = "<|python_tag|>"
_LLAMA_ENDS = ("<|eom_id|>", "<|eot_id|>")


def llama3(turn: str, tools: Mapping[str, dict]) -> Parsed:
    """A turn that is a JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.1 / 3.2), several
    separated by ``;``, optionally after ``<|python_tag|>``; a turn that starts otherwise is an answer."""
    text = without_reasoning(turn).strip()
    for end in _LLAMA_ENDS:
        text = text.removesuffix(end).rstrip()
    tagged = PYTHON_TAG in text
    if tagged:
        text = text.split(PYTHON_TAG, 1)[1].strip()
    if not text.startswith("{"):
        if tagged and text:
            return [], [CallError("tool call: only JSON calls are read after <|python_tag|>: "
                                  "{\"name\": ..., \"parameters\": {...}}", 0)]
        return [], []
    if len(text) > MAX_CALL_CHARS * MAX_CALLS:
        return [], [CallError(f"tool call: the turn is {len(text)} characters long; at most "
                              f"{MAX_CALL_CHARS * MAX_CALLS} are read as calls", 0)]
    decoder = json.JSONDecoder()
    objs: list = []
    pos, n = 0, 0
    while pos < len(text):
        if n >= MAX_CALLS:
            n += text.count(";", pos) + 1  # the rest is not parsed, only counted
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except RecursionError:
            objs.append(CallError(f"{_where(n, 2)}: the call's JSON is nested too deeply", n))
            n += 1
            break
        except ValueError as e:
            objs.append(CallError(f"{_where(n, 2)}: not valid JSON ({e})", n))
            n += 1
            break
        if end - pos > MAX_CALL_CHARS:
            obj = CallError(f"{_where(n, 2)}: the call is {end - pos} characters long; at most {MAX_CALL_CHARS} "
                            f"are read", n)
        objs.append(obj)
        n += 1
        pos = end
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
    items = [o if isinstance(o, CallError) else check_call(o, tools, i, _where(i, n), ("parameters", "arguments"))
             for i, o in enumerate(objs)]
    if n == 1:  # one call: no number in its messages
        items = [CallError(str(x).replace("tool call 1", "tool call", 1), 0) if isinstance(x, CallError) else x
                 for x in items]
    return _split(items, n)


def answer(turn: str, tools: Mapping[str, dict]) -> Parsed:
    """Never a tool call: the turn is the answer."""
    return [], []


PARSERS: Registry = Registry("rollout.multi_turn.parser", {"hermes": hermes, "llama3": llama3, "answer": answer})


def pick_parser(name: str, template: Optional[str]) -> str:
    """The parser ``name`` stands for: itself, or with ``auto`` the one the chat template's text calls for."""
    if name != "auto":
        PARSERS.check(name)
        return name
    text = template or ""
    if OPEN in text:
        return "hermes"
    if PYTHON_TAG in text or "ipython" in text:
        return "llama3"
    return "hermes"


def parser_for(name: str, template: Optional[str] = None) -> Parser:
    """The parse function for ``rollout.multi_turn.parser=name`` (``auto``: by ``template``'s text)."""
    return PARSERS[pick_parser(name, template)]
