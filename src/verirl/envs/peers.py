"""Tools and environments written for the peers: veRL's tool config files and TRL's ``environment_factory``
classes, and the `Session` s that keep their state per episode.

veRL: a YAML file (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) of
``tools: [{class_name: pkg.mod.Class, config: {...}, tool_schema: {type: function, function: {...}}}]``. A
class is veRL's code (a ``BaseTool`` with async ``create``, ``execute(instance_id, parameters)`` and
``release``), so verirl runs veRL's own built-in classes with an equivalent of its own where it has
one (`VERL_EQUIVALENTS`: the sandbox-fusion code interpreter is the ``python`` tool, the gsm8k answer
checker is `Gsm8kSession`), and any other class that imports here and has ``execute``: one instance per
config entry, shared by the episodes as veRL shares it, ``create`` at an episode's first call and
``release`` at its end, coroutines on one event loop of the factory (`verirl.envs.runner.EventLoop`). The
schema in the file is what the chat template renders, so prompts read as they do under veRL.

TRL: a class whose instance (one per episode) has ``reset(**row)`` returning None or a first
observation (a string), public methods with type hints and Google-style docstrings that are its tools,
and optionally ``get_reward()``, the episode's reward from its state.
"""
from __future__ import annotations

import importlib
import inspect
import math
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any, Optional

from verirl.core.errors import ConfigError
from verirl.envs.runner import EventLoop, in_thread
from verirl.envs.tools import Tool, ToolError, function_tool, result_text

if TYPE_CHECKING:
    from verirl.core.types import Prompt

VERL_EQUIVALENTS = {
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "python",
    "verl.tools.gsm8k_tool.Gsm8kTool": "gsm8k",
}
VERL_REFUSED = {
    "verl.tools.geo3k_tool.Geo3kTool": "it grades geometry answers with mathruler, and verirl has no equivalent "
                                       "tool; score the final answer with a reward rule (reward.verifiers) instead",
    "verl.tools.search_tool.SearchTool": "it queries a retrieval server over HTTP; write a function tool that calls "
                                         "yours (my_tools.py:search) and run it with the sandbox off, since the "
                                         "sandbox has no network",
    "verl.tools.mcp_search_tool.MCPSearchTool": "MCP tools need veRL's MCP client, which verirl does not have",
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": "verirl's multi-turn rollouts are text only",
}
_WARN_LOCK = threading.Lock()
_warned: set[str] = set()


def warn_once(message: str) -> None:
    """``message`` on stderr, once per process (user environments fail the same way on every episode)."""
    import sys

    with _WARN_LOCK:
        if message in _warned:
            return
        _warned.add(message)
    print(message, file=sys.stderr)


def _run(fn, args: tuple, kwargs: dict, events: EventLoop, timeout: float) -> Any:
    """``fn(*args, **kwargs)`` under ``timeout``: a coroutine function on the factory's loop, else in a thread
    (and what it returns awaited on the loop if it is awaitable)."""
    if inspect.iscoroutinefunction(fn):
        return events.run(fn(*args, **kwargs), timeout)
    value = in_thread(lambda: fn(*args, **kwargs), timeout)
    return events.run(value, timeout) if inspect.isawaitable(value) else value


# ----------------------------------------------------------------------------- gsm8k (veRL's Gsm8kTool)


def gsm8k_answer(text: str) -> Optional[str]:
    """The last number of the last 300 characters (veRL's gsm8k ``extract_solution(method="flexible")``)."""
    found = re.findall(r"(\-?[0-9\.\,]+)", text[-300:])
    for candidate in reversed(found):
        if candidate not in ("", "."):
            return candidate
    return None


class Gsm8kSession:
    """veRL's gsm8k answer tool: the answer the model submits scored against the label (1.0 or 0.0, 0 when
    no number is found); its tool reward is 0.0 when the score improves on the episode's best so far, else
    -0.05, and it says ``Current parsed answer=... reward=...`` as veRL's does."""

    def __init__(self, label: str):
        self.label, self.best = label, 0.0

    def call(self, name: str, arguments: dict, timeout: float) -> tuple[Any, Optional[float]]:
        answer = arguments.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        parsed = gsm8k_answer(answer if answer.startswith("#### ") else "#### " + answer)
        reward = 0 if parsed is None else (1.0 if parsed == self.label else 0.0)
        tool_reward = 0.0 if reward > self.best else -0.05
        self.best = max(self.best, reward)
        return f"Current parsed {answer=} {reward=}", tool_reward

    def opening(self) -> Optional[list[dict]]:
        return None

    def turn_reward(self, done: bool) -> Optional[float]:
        return None

    def close(self) -> None:
        pass


class Gsm8kProvider:
    def open(self, prompt: "Prompt") -> Gsm8kSession:
        return Gsm8kSession(str(prompt.label))


# ----------------------------------------------------------------------------- other veRL tool classes


class _Schema(dict):
    """A tool schema with attribute access and ``model_dump`` (what veRL's tools read of theirs), for a class
    that is not veRL's own; veRL's get its `OpenAIFunctionToolSchema`."""

    def __getattr__(self, key: str) -> Any:
        try:
            value = self[key]
        except KeyError:
            raise AttributeError(key) from None
        return _Schema(value) if isinstance(value, dict) else value

    def model_dump(self, **_: Any) -> dict:
        return dict(self)


def _schema_object(schema: dict) -> Any:
    try:
        from verl.tools.schemas import OpenAIFunctionToolSchema  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001  (veRL absent or broken here)
        return _Schema(schema)
    return OpenAIFunctionToolSchema.model_validate(schema)


class VerlProvider:
    """One veRL tool object, shared by every episode (as veRL shares it)."""

    def __init__(self, tool: Any, name: str, events: EventLoop):
        self.tool, self.name, self.events = tool, name, events

    def open(self, prompt: "Prompt") -> "VerlSession":
        return VerlSession(self, prompt)


def _create_kwargs(prompt: "Prompt", name: str) -> dict:
    """veRL's per-sample ``tools_kwargs[name].create_kwargs`` where the data kept it, else the label as the
    ground truth (what veRL's example datasets put there)."""
    extra = prompt.extra or {}
    for holder in (extra, extra.get("extra_info") or {}):
        tools_kwargs = holder.get("tools_kwargs") if isinstance(holder, dict) else None
        if isinstance(tools_kwargs, dict) and isinstance(tools_kwargs.get(name), dict):
            return dict(tools_kwargs[name].get("create_kwargs") or {})
    return {"ground_truth": prompt.label}


class VerlSession:
    def __init__(self, provider: VerlProvider, prompt: "Prompt"):
        self.provider, self.prompt = provider, prompt
        self.instance_id: Optional[str] = None
        self.broken: Optional[str] = None

    def call(self, name: str, arguments: dict, timeout: float) -> tuple[Any, Optional[float]]:
        if self.broken:
            raise ToolError(self.broken)
        tool, events = self.provider.tool, self.provider.events
        try:
            if self.instance_id is None:
                self.instance_id = str(uuid.uuid4())
                if callable(getattr(tool, "create", None)):
                    made = _run(tool.create, (), {"instance_id": self.instance_id,
                                                   "create_kwargs": _create_kwargs(self.prompt, name)},
                                events, timeout)
                    made = made[0] if isinstance(made, (tuple, list)) and made else made
                    self.instance_id = made if isinstance(made, str) else self.instance_id
            out = _run(tool.execute, (self.instance_id, arguments), {}, events, timeout)
        except TimeoutError:
            self.broken = "not run: an earlier call of this tool in this episode timed out"
            raise
        response, reward = (out[0], out[1] if len(out) > 1 else None) if isinstance(out, (tuple, list)) else (out, None)
        text = getattr(response, "text", response)
        reward = float(reward) if isinstance(reward, (int, float)) and math.isfinite(reward) else None
        return ("" if text is None else text if isinstance(text, str) else result_text(text)), reward

    def opening(self) -> Optional[list[dict]]:
        return None

    def turn_reward(self, done: bool) -> Optional[float]:
        return None

    def close(self) -> None:
        tool = self.provider.tool
        if self.instance_id is not None and not self.broken and callable(getattr(tool, "release", None)):
            try:
                _run(tool.release, (self.instance_id,), {}, self.provider.events, 10.0)
            except Exception as e:  # noqa: BLE001  (the episode is over; the next ones go on)
                warn_once(f"veRL tool {self.provider.name!r}: release() raised {type(e).__name__}: {e}")


def _refusal(path: str, index: int, cls: str, why: str) -> ConfigError:
    known = ", ".join(f"{k.rsplit('.', 1)[1]} (as {v})" for k, v in VERL_EQUIVALENTS.items())
    return ConfigError(
        f"veRL tool config '{path}', tools[{index}] (class_name {cls}): {why}. verirl runs veRL's {known} with its "
        f"own equivalents, and any other class that can be imported here and has execute(instance_id, "
        f"parameters); or give the tool as a function (rollout.multi_turn.tools: [my_tools.py:fn], schema from its "
        f"docstring). Remove this entry or replace it.")


def _read_yaml(path: str) -> Any:
    from omegaconf import OmegaConf  # safe loading: OmegaConf reads YAML with a SafeLoader

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"veRL tool config '{path}' cannot be read ({e.strerror or e}).") from None
    try:
        return OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except Exception as e:  # noqa: BLE001  (yaml's and OmegaConf's errors)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"veRL tool config '{path}' is not YAML verirl can read ({first}). Fix the file: it "
                          f"holds `tools:`, a list of {{class_name, config, tool_schema}}.") from None


def _check_schema(path: str, index: int, cls: str, schema: Any) -> dict:
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ConfigError(f"veRL tool config '{path}', tools[{index}] (class_name {cls}): tool_schema must be "
                          f"{{type: function, function: {{name, description, parameters}}}}; it is {schema!r}.")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ConfigError(f"veRL tool config '{path}', tools[{index}] ({fn['name']}): tool_schema.function.parameters "
                          f"must be a JSON-schema object, not {type(params).__name__}.")
    return {"type": "function", **{k: v for k, v in schema.items() if k != "type"}}


def _import_class(path: str, index: int, cls: str) -> Any:
    module_name, _, attr = cls.rpartition(".")
    if not module_name:
        raise _refusal(path, index, cls, "class_name must be a dotted path, package.module.Class")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001  (a missing package or a module that raises at import)
        raise _refusal(path, index, cls, f"it cannot be imported here ({type(e).__name__}: {e})") from None
    found = getattr(module, attr, None)
    if found is None:
        raise _refusal(path, index, cls, f"module '{module_name}' has no '{attr}'")
    if not callable(getattr(found, "execute", None)):
        raise _refusal(path, index, cls, "it has no execute(instance_id, parameters) method")
    return found


def load_verl_tools(path: str, events: EventLoop) -> list[Tool]:
    """The tools of veRL tool config ``path`` (see the module docstring); errors name the file, the entry and
    the class."""
    data = _read_yaml(path)
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"veRL tool config '{path}' has no `tools:` list; veRL's format is tools: [{{class_name: "
                          f"pkg.mod.Class, config: {{...}}, tool_schema: {{type: function, function: {{...}}}}}}].")
    tools = []
    for i, entry in enumerate(entries):
        cls = entry.get("class_name") if isinstance(entry, dict) else None
        if not isinstance(cls, str) or not cls:
            raise ConfigError(f"veRL tool config '{path}', tools[{i}] has no class_name (a dotted class path).")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"veRL tool config '{path}', tools[{i}] (class_name {cls}): config must be a mapping.")
        if str(config.get("type", "native")).lower() == "mcp" or "mcp" in entry:
            raise _refusal(path, i, cls, "it is an MCP tool (config.type: mcp), and verirl has no MCP client")
        if cls in VERL_REFUSED:
            raise _refusal(path, i, cls, VERL_REFUSED[cls])
        where = f"{path}: tools[{i}]"
        equivalent = VERL_EQUIVALENTS.get(cls)
        if equivalent is not None and entry.get("tool_schema") is None:
            raise _refusal(path, i, cls, "it has no tool_schema, which the prompt needs")
        if equivalent == "python":
            language = str(config.get("default_language", "python")).lower()
            if language not in ("python", "python3", "py"):
                raise _refusal(path, i, cls, f"its default_language is {language!r}; verirl's python tool runs Python")
            schema = _check_schema(path, i, cls, entry["tool_schema"])
            tools.append(Tool(schema["function"]["name"], schema, "program", None, where))
            continue
        if equivalent == "gsm8k":
            schema = _check_schema(path, i, cls, entry["tool_schema"])
            tools.append(Tool(schema["function"]["name"], schema, "session", Gsm8kProvider(), where))
            continue
        klass = _import_class(path, i, cls)
        raw = entry.get("tool_schema")
        schema = _check_schema(path, i, cls, raw) if raw is not None else None
        try:
            obj = klass(config=config, tool_schema=_schema_object(schema) if schema else None)
            if schema is None:
                got = obj.get_openai_tool_schema()
                got = got.model_dump(exclude_unset=True, exclude_none=True) if hasattr(got, "model_dump") else got
                schema = _check_schema(path, i, cls, got)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001  (the class's own constructor)
            raise _refusal(path, i, cls, f"creating it raised {type(e).__name__}: {e}") from None
        name = schema["function"]["name"]
        tools.append(Tool(name, schema, "session", VerlProvider(obj, name, events), where))
    return tools


# ----------------------------------------------------------------------------- TRL's environment_factory


TRL_RESERVED = ("reset", "get_reward")


def trl_tool_names(cls: type) -> list[str]:
    """The tool methods of a TRL environment class: its public functions but reset and get_reward (as TRL
    lists them: functions of the class, inherited ones included)."""
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if n not in TRL_RESERVED and not n.startswith("_")]


def _reset_kwargs(reset, prompt: "Prompt") -> dict:
    """What TRL passes to reset (the dataset row): the prompt's messages as ``prompt``, the label (also as
    ``ground_truth`` and ``answer``), the task and the kept columns; only the names reset takes, unless it
    takes ``**kwargs``."""
    row = {"prompt": prompt.messages, "task": prompt.task, **(prompt.extra or {})}
    for alias in ("label", "ground_truth", "answer"):
        row.setdefault(alias, prompt.label)
    try:
        params = inspect.signature(reset).parameters.values()
    except (TypeError, ValueError):
        return row
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return row
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in row.items() if k in names}


class TrlProvider:
    def __init__(self, cls: type, spec: str, timeout: float, events: EventLoop):
        self.cls, self.spec, self.timeout, self.events = cls, spec, timeout, events

    def open(self, prompt: "Prompt") -> "TrlSession":
        return TrlSession(self, prompt)


class TrlSession:
    """One TRL environment instance for one episode. ``get_reward()`` is reported as increments: after the
    first turn and after each turn that called its methods (its state changes by those calls alone), the
    difference from what was reported before, so that the episode's rewards sum to ``get_reward()`` of its
    final state wherever the episode stops (TRL scores a rollout once, at its end;
    rollout.multi_turn.reward: sum, the default, gives the same)."""

    def __init__(self, provider: TrlProvider, prompt: "Prompt"):
        self.provider = provider
        self.broken: Optional[str] = None
        self.observation: Optional[list[dict]] = None
        self.reported, self.asked, self.dirty = 0.0, False, False
        spec, timeout = provider.spec, provider.timeout
        try:
            self.env = in_thread(provider.cls, timeout)
            reset = self.env.reset
            first = _run(reset, (), _reset_kwargs(reset, prompt), provider.events, timeout)
        except Exception as e:  # noqa: BLE001  (the user's code: this episode's tools fail, the run goes on)
            self.broken = f"not run: the environment's reset failed ({type(e).__name__}: {e})"
            warn_once(f"rollout.multi_turn.environment '{spec}': creating or resetting it raised "
                      f"{type(e).__name__}: {e}; its episodes run without it (each tool call is an error).")
            return
        if first is not None:
            text = first if isinstance(first, str) else result_text(first)
            self.observation = [{"role": "user", "content": text}]
        self.has_reward = callable(getattr(self.env, "get_reward", None))

    def call(self, name: str, arguments: dict, timeout: float) -> tuple[Any, Optional[float]]:
        if self.broken:
            raise ToolError(self.broken)
        self.dirty = True
        try:
            return _run(getattr(self.env, name), (), arguments, self.provider.events, timeout), None
        except TimeoutError:
            self.broken = "not run: an earlier call of this environment timed out, and it may still be running"
            raise

    def opening(self) -> Optional[list[dict]]:
        return self.observation

    def turn_reward(self, done: bool) -> Optional[float]:
        if self.broken or not self.has_reward or not (self.dirty or not self.asked):  # the state changes by calls alone
            return None
        self.asked, self.dirty = True, False
        try:
            value = float(_run(self.env.get_reward, (), {}, self.provider.events, self.provider.timeout))
        except Exception as e:  # noqa: BLE001
            warn_once(f"rollout.multi_turn.environment '{self.provider.spec}': get_reward() failed "
                      f"({type(e).__name__}: {e}); those episodes get no environment reward.")
            return None
        if not math.isfinite(value):
            return None
        delta, self.reported = value - self.reported, value
        return delta

    def close(self) -> None:
        pass


def trl_tools(cls: type, spec: str, timeout: float, events: EventLoop) -> list[Tool]:
    """The tools of TRL environment class ``cls`` (schemas from one probe instance's methods, as TRL does)."""
    try:
        probe = cls()
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"rollout.multi_turn.environment '{spec}': creating it with no arguments raised "
                          f"{type(e).__name__}: {e}. A TRL environment class is created once per episode as "
                          f"Class(), so its __init__ takes no required arguments.") from None
    provider = TrlProvider(cls, spec, timeout, events)
    tools = []
    for name in trl_tool_names(cls):
        made = function_tool(getattr(probe, name), "local", f"{spec}.{name}")
        tools.append(Tool(made.name, made.schema, "session", provider, f"{spec}.{name}"))
    return tools


__all__ = ["VERL_EQUIVALENTS", "VERL_REFUSED", "load_verl_tools", "trl_tools", "trl_tool_names", "gsm8k_answer"]
