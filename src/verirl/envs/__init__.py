"""Tools and environments for multi-turn rollouts (docs/agents.md).

`build_environments` turns ``rollout.multi_turn.*`` (as plain arguments) into an `EnvFactory`: its
``schemas`` go to the chat template's ``tools=``, ``new()`` makes one `Environment` per episode.

- base.py: the `Environment` protocol and `EnvStep`.
- tools.py: the `Tool` record, function tools (schema by transformers' get_json_schema), the
  ``calculator`` and ``python`` built-ins, user functions (``file.py:function`` / ``module:function``).
- parsers.py: tool calls read from a turn by model family (`PARSERS`: hermes, llama3, answer; auto).
- runner.py: each call under its deadline: in-process, in the sandbox, or in the tool pool's workers.
- peers.py: veRL tool config files and TRL ``environment_factory`` classes.

A `ToolEnvironment` answers each turn: a turn with tool calls gets one tool message per call (an error
message for a call it could not read); a turn without one ends the episode, or goes to the user's
environment when there is one. This package imports neither torch nor transformers at import time: the
tool workers import it.
"""
from __future__ import annotations

import inspect
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from verirl.core.errors import ConfigError
from verirl.envs.base import COUNT_KEYS, OBSERVATION_ROLES, EnvStep, Environment, zero_counts
from verirl.envs.parsers import PARSERS, CallError, Parser, ToolCall, parser_for, pick_parser
from verirl.envs.runner import EventLoop, Runner, in_thread
from verirl.envs.tools import (BUILTINS, Tool, ToolResult, builtin_tool, calculator, cut, evaluate,
                               function_tool, load_object, user_function_tool)

if TYPE_CHECKING:
    from verirl.core.types import Prompt

ENVIRONMENT_KEY = "rollout.multi_turn.environment"


def _message(role: str, content: str, name: Optional[str] = None) -> dict:
    return {"role": role, "name": name, "content": content} if name is not None else {"role": role, "content": content}


class ToolEnvironment:
    """One episode with ``tools``: each turn is parsed (``parser``), its calls run (``runner``, shared by the
    episodes) and answered with one tool message each, in the turn's order. A turn without a call (and
    without a malformed one) ends the episode, or, with ``inner`` (the user's `Environment`), is that
    environment's to answer."""

    def __init__(self, tools: Sequence[Tool], parser: Parser, runner: Runner,
                 inner: Optional[Environment] = None, max_chars: int = 0):
        self.tools = {t.name: t for t in tools}
        self._params = {t.name: t.parameters for t in tools}
        self.parser, self.runner, self.inner, self.max_chars = parser, runner, inner, max_chars
        self._sessions: dict[str, Any] = {}
        self._opened: list[Any] = []

    def reset(self, prompt: "Prompt") -> Optional[list[dict]]:
        by_provider: dict[int, Any] = {}
        messages: list[dict] = []
        for tool in self.tools.values():
            if tool.kind == "session":
                if id(tool.fn) not in by_provider:
                    session = by_provider[id(tool.fn)] = tool.fn.open(prompt)
                    self._opened.append(session)
                    messages += session.opening() or []
                self._sessions[tool.name] = by_provider[id(tool.fn)]
        if self.inner is not None:
            messages += self.inner.reset(prompt) or []
        return messages or None

    def _session_rewards(self, done: bool) -> Optional[float]:
        got = [r for s in self._opened if (r := s.turn_reward(done)) is not None]
        return sum(got) if got else None

    def step(self, turn: str) -> EnvStep:
        calls, errors = self.parser(turn, self._params) if self.tools else ([], [])
        if not calls and not errors:
            step = self.inner.step(turn) if self.inner is not None else EnvStep(None, done=True)
            extra = self._session_rewards(step.done)
            if extra is not None:
                step.reward = extra if step.reward is None else step.reward + extra
            return step
        counts = zero_counts()
        started = time.monotonic()
        results = self.runner.run([(c, self.tools[c.name]) for c in calls], self._sessions) if calls else []
        counts["tool_seconds"] = time.monotonic() - started
        placed: list[tuple[int, dict]] = []
        rewards = []
        for call, r in zip(calls, results):
            placed.append((call.index, _message("tool", r.text, r.name)))
            counts["tool_calls"] += 1
            counts["tool_errors"] += r.error
            counts["tool_timeouts"] += r.timed_out
            if r.reward is not None:
                rewards.append(r.reward)
        for e in errors:
            placed.append((getattr(e, "index", len(calls)), _message("tool", cut(f"Error: {e}", self.max_chars),
                                                                     "error")))
        counts["parse_errors"] = float(len(errors))
        extra = self._session_rewards(False)
        if extra is not None:
            rewards.append(extra)
        placed.sort(key=lambda p: p[0])  # stable: a call's result before an error of the same place
        return EnvStep([m for _, m in placed], sum(rewards) if rewards else None, False, counts)

    def close(self) -> None:
        opened, self._opened, self._sessions = self._opened, [], {}
        for s in opened:
            s.close()
        if self.inner is not None:
            self.inner.close()


class GuardedEnvironment:
    """The user's `Environment` (``file.py:Class``), each of its calls under the deadline, its answers
    checked. An exception, a missed deadline or an answer of the wrong shape ends the episode (counted
    in tools/errors or tools/timeouts) and is said once on stderr: the run goes on, as with a reward rule
    that raises."""

    def __init__(self, cls: Callable[[], Any], spec: str, timeout: float, max_chars: int):
        self.cls, self.spec, self.timeout, self.max_chars = cls, spec, timeout, max_chars
        self.env: Any = None
        self.broken = False

    def _warn(self, what: str, e: BaseException) -> None:
        from verirl.envs.peers import warn_once

        reason = str(e) if isinstance(e, TimeoutError) else f"raised {type(e).__name__}: {e}"
        warn_once(f"{ENVIRONMENT_KEY} '{self.spec}': {what} {reason}; those episodes end there.")

    def _observation(self, value: Any, what: str) -> Optional[list[dict]]:
        if value is None:
            return None
        if isinstance(value, str):
            value = [_message("user", value)]
        elif isinstance(value, dict):
            value = [value]
        if not isinstance(value, list):
            raise TypeError(f"{what} returned {type(value).__name__}; an observation is None, a str (a user "
                            f"message) or a list of messages")
        out = []
        for m in value:
            ok = isinstance(m, dict) and m.get("role") in OBSERVATION_ROLES and isinstance(m.get("content"), str)
            if not ok:
                raise TypeError(f"{what} returned the message {str(m)[:80]!r}; a message is {{'role': 'tool' or "
                                f"'user', 'content': str}}")
            out.append({**m, "content": cut(m["content"], self.max_chars)})
        return out or None

    def reset(self, prompt: "Prompt") -> Optional[list[dict]]:
        what = "creating it"
        try:
            self.env = in_thread(self.cls, self.timeout)  # one instance per episode
            what = "reset(prompt)"
            return self._observation(in_thread(lambda: self.env.reset(prompt), self.timeout), "reset")
        except Exception as e:  # noqa: BLE001  (the user's code must not stop the run)
            self._warn(what, e)
            self.broken = True
            return None

    def step(self, turn: str) -> EnvStep:
        counts = zero_counts()
        if self.broken:
            counts["tool_errors"] = 1.0
            return EnvStep(None, done=True, counts=counts)
        started = time.monotonic()
        try:
            got = in_thread(lambda: self.env.step(turn), self.timeout)
            if isinstance(got, EnvStep):
                obs, reward, done, more = got.observation, got.reward, got.done, dict(got.counts)
            elif isinstance(got, tuple) and len(got) == 3:
                (obs, reward, done), more = got, {}
            else:
                raise TypeError(f"step returned {type(got).__name__}; it returns an EnvStep or (observation, reward, "
                                f"done)")
            obs = self._observation(obs, "step")
            if reward is not None:
                reward = float(reward)
                if not math.isfinite(reward):
                    raise ValueError(f"step returned the reward {reward}")
        except Exception as e:  # noqa: BLE001
            self._warn("step(turn)", e)
            self.broken = True
            counts["tool_timeouts" if isinstance(e, TimeoutError) else "tool_errors"] = 1.0
            counts["tool_seconds"] = time.monotonic() - started
            return EnvStep(None, done=True, counts=counts)
        for k, v in more.items():
            if k in COUNT_KEYS and isinstance(v, (int, float)):
                counts[k] = float(v)
        return EnvStep(obs, reward, bool(done), counts)

    def close(self) -> None:
        if self.env is None or not callable(getattr(self.env, "close", None)):
            return
        try:
            in_thread(self.env.close, self.timeout)
        except Exception as e:  # noqa: BLE001
            self._warn("close()", e)


class EnvFactory:
    """What `build_environments` makes: ``schemas`` (the tools' JSON schemas for the chat template's
    ``tools=``; None without tools), ``new()`` (one environment per episode, from any thread) and
    ``close()`` (the tool workers, the event loop)."""

    def __init__(self, tools: Sequence[Tool], parser: Parser, parser_name: str, runner: Runner,
                 make_inner: Optional[Callable[[], Environment]] = None, events: Optional[EventLoop] = None,
                 max_chars: int = 0):
        self.tools = list(tools)
        self.parser, self.parser_name, self.runner = parser, parser_name, runner
        self.make_inner, self.events, self.max_chars = make_inner, events, max_chars

    @property
    def schemas(self) -> Optional[list[dict]]:
        return [t.schema for t in self.tools] or None

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def new(self) -> ToolEnvironment:
        inner = self.make_inner() if self.make_inner is not None else None
        return ToolEnvironment(self.tools, self.parser, self.runner, inner, self.max_chars)

    def close(self) -> None:
        self.runner.close()
        if self.events is not None:
            self.events.close()

    def __enter__(self) -> "EnvFactory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tools_of(spec: str, events: EventLoop) -> list[Tool]:
    from verirl.envs.peers import load_verl_tools

    if spec in BUILTINS:
        return [builtin_tool(spec)]
    if spec.endswith((".yaml", ".yml")):
        return load_verl_tools(spec, events)
    if ":" in spec:
        return [user_function_tool(spec)]
    raise ConfigError(f"{BUILTINS.unknown(spec)} A tool of yours is path/to/file.py:function or "
                      f"package.module:function, and a veRL tool config a .yaml file.")


def _environment(spec: str, timeout_s: float, max_chars: int, events: EventLoop):
    """(tools, make_inner) of ``rollout.multi_turn.environment``: a verirl Environment class (it has
    ``step``) or a TRL environment_factory class (``reset`` and tool methods)."""
    from verirl.envs.peers import trl_tools

    cls = load_object(spec, ENVIRONMENT_KEY)
    if not inspect.isclass(cls):
        raise ConfigError(f"{ENVIRONMENT_KEY} '{spec}' is {type(cls).__name__}, not a class. Give a class with "
                          f"reset(prompt) and step(turn) (verirl's protocol), or one written for TRL's "
                          f"environment_factory (reset(**row) and tool methods).")
    if callable(getattr(cls, "step", None)):
        if not callable(getattr(cls, "reset", None)):
            raise ConfigError(f"{ENVIRONMENT_KEY} '{spec}' has step(turn) but no reset(prompt); an environment has "
                              f"both (and optionally close()).")
        try:
            params = inspect.signature(cls).parameters.values()
        except (TypeError, ValueError):
            params = []
        if any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise ConfigError(f"{ENVIRONMENT_KEY} '{spec}': its __init__ takes required arguments; verirl creates one "
                              f"instance per episode as Class(), so give every parameter a default.")
        return [], lambda: GuardedEnvironment(cls, spec, timeout_s, max_chars)
    if callable(getattr(cls, "reset", None)):
        return trl_tools(cls, spec, timeout_s, events), None
    raise ConfigError(f"{ENVIRONMENT_KEY} '{spec}' has neither step(turn) nor reset(): give a class with reset(prompt) "
                      f"and step(turn) (verirl's protocol), or one written for TRL's environment_factory (reset() and "
                      f"tool methods with docstrings).")


def build_environments(tools: Sequence[str], environment: str, parser: str, template: Optional[str],
                       timeout_s: float, workers: int, max_chars: int, sandbox: bool, *,
                       hide: Sequence[str] = (), memory_mb: int = 0) -> EnvFactory:
    """The environments of ``rollout.multi_turn``: ``tools`` (built-in names, file.py:function /
    module:function, veRL tool config YAML files), ``environment`` (file.py:Class / module:Class, verirl's
    protocol or TRL's environment_factory convention; "" = none), ``parser`` (a `PARSERS` name or auto,
    read from ``template``, the chat template's text), each call's deadline ``timeout_s``, ``workers``
    tool processes, results cut to ``max_chars`` (0: only the hard cap), user functions in the sandbox
    (``sandbox``; ``hide``: more paths it covers, e.g. the run directory; ``memory_mb``: the address-space
    cap of a tool process, 0 = 4096)."""
    events = EventLoop()
    found: list[Tool] = []
    for spec in tools:
        found += _tools_of(str(spec), events)
    make_inner = None
    if environment:
        env_tools, make_inner = _environment(environment, timeout_s, max_chars, events)
        found += env_tools
    seen: dict[str, Tool] = {}
    for t in found:
        if t.name in seen:
            raise ConfigError(f"rollout.multi_turn: two tools are named {t.name!r} ({seen[t.name].spec or t.name} and "
                              f"{t.spec or t.name}); the model calls tools by name, so rename one.")
        seen[t.name] = t
    name = pick_parser(parser, template)
    if name == "answer" and found:
        raise ConfigError(f"rollout.multi_turn.parser=answer reads no tool calls, but tools are given "
                          f"({', '.join(seen)}); choose auto, hermes or llama3, or give no tools.")
    runner = Runner(timeout_s, workers, max_chars, sandbox, hide=hide, memory_mb=memory_mb,
                    preload=[t.spec for t in found if t.kind == "worker"])
    if runner.preload:
        runner.warm()  # the workers start while the model decodes its first turns
    return EnvFactory(found, PARSERS[name], name, runner, make_inner, events, max_chars)


__all__ = ["EnvStep", "Environment", "COUNT_KEYS", "Tool", "ToolResult", "ToolCall", "CallError", "PARSERS",
           "parser_for", "pick_parser", "Runner", "ToolEnvironment", "GuardedEnvironment", "EnvFactory",
           "build_environments", "function_tool", "calculator", "evaluate", "load_object"]
