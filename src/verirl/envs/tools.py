"""Tools a model may call: the `Tool` record, function tools, the built-in ``calculator`` and ``python``,
and the user's own (``file.py:function`` / ``module:function``).

A tool is a name, the JSON schema the chat template renders (the OpenAI / transformers function format
``{"type": "function", "function": {"name", "description", "parameters"}}``, made from a function's
signature and docstring by transformers' `get_json_schema`, as TRL does), and how it runs (`Tool.kind`,
the runner's table in `verirl.envs.runner`):

- ``local``: ``fn(**arguments)`` in the calling thread. Only for code of ours that bounds itself: the
  calculator walks the syntax tree with bounds on length, exponents and sizes, and never evaluates code.
- ``program``: the ``python`` tool; each call is a fresh program in `verirl.sandbox.run_program`, with its
  limits (wall clock, CPU, memory, processes, output), its output cut.
- ``worker``: a user's function, called in a process of the tool pool (the reward pool's workers, with
  their deadline, memory cap, captured output and clean-up of what a call starts; inside the sandbox
  unless it is off).
- ``session``: a tool with state kept per episode (a veRL tool class, a TRL environment's methods, the
  gsm8k answer checker); ``fn`` opens the episode's session (`verirl.envs.peers`), which runs in this
  process, each call under its deadline.

A tool's result is text: a ``str`` as it is, anything else as JSON when it can be (else ``str()``).
"""
from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from verirl.core.errors import ConfigError
from verirl.core.registry import Registry

HARD_MAX_CHARS = 65536  # of one tool result's text, whatever rollout.multi_turn.max_tool_response_chars says
TRUNCATED = "...(truncated)"  # veRL's marker: max_tool_response_chars counts the text before it
KINDS = ("local", "program", "worker", "session")


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict  # {"type": "function", "function": {"name", "description", "parameters"}}: what the template renders
    kind: str  # how it runs: local / program / worker / session (the module docstring)
    fn: Any = None  # local: fn(**arguments) -> result; session: the provider whose open(prompt) starts a session
    spec: str = ""  # worker: the file.py:function reference the workers import; else where the tool came from

    @property
    def parameters(self) -> dict:
        """The JSON schema of its arguments (an object schema: properties, required)."""
        return self.schema.get("function", {}).get("parameters") or {}


@dataclass
class ToolResult:
    """One call's outcome, as the observation shows it."""
    name: str
    text: str  # the tool message's content (an error's reason too), cut to the character limit
    error: bool = False  # counted in tools/errors
    timed_out: bool = False  # counted in tools/timeouts (and errors)
    reward: Optional[float] = None  # a reward the tool gave (veRL's tools do)
    seconds: float = 0.0


class ToolError(Exception):
    """A tool's own refusal (the calculator's): its message is what the model reads, without a type name."""


def result_text(value: Any) -> str:
    """A tool's return value as the text the model reads: a str as it is, else JSON, else str()."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return str(value)


def cut(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters (0 = no limit) and never past `HARD_MAX_CHARS`, with veRL's
    "...(truncated)" marker after the kept part."""
    limit = min(max_chars, HARD_MAX_CHARS) if max_chars > 0 else HARD_MAX_CHARS
    return text if len(text) <= limit else text[:limit] + TRUNCATED


def function_tool(fn: Callable, kind: str = "local", spec: str = "") -> Tool:
    """A tool whose schema comes from ``fn``'s signature and Google-style docstring (transformers'
    `get_json_schema`: a type hint on every parameter, an ``Args:`` line for each)."""
    from transformers.utils import get_json_schema  # a tool worker never needs transformers

    where = spec or getattr(fn, "__qualname__", repr(fn))
    try:
        schema = get_json_schema(fn)
    except Exception as e:  # noqa: BLE001  (DocstringParsingException, TypeHintParsingException, ...)
        raise ConfigError(
            f"tool '{where}': its JSON schema cannot be made from its signature and docstring "
            f"({type(e).__name__}: {e}). A tool function needs a type hint on every parameter and a "
            f"Google-style docstring: a first line saying what it does, then an 'Args:' section with one "
            f"'name: description' line per parameter (transformers' get_json_schema reads them, as TRL "
            f"does).") from None
    return Tool(schema["function"]["name"], schema, kind, fn if kind == "local" else None, spec)


# ----------------------------------------------------------------------------- calculator

MAX_EXPRESSION_CHARS = 200
MAX_DIGITS = 1000  # of an integer result or operand; past it the expression is refused
_MAX_BITS = int(MAX_DIGITS * math.log2(10)) + 1

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def _checked(value: int | float) -> int | float:
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        raise ToolError(f"the result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is too large for a floating-point number")
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    return value


def _power(base: int | float, exp: int | float) -> int | float:
    if isinstance(base, int) and isinstance(exp, int) and exp >= 0:
        # the result's bits are about bits(base) * exp: refused before computing (9**9**9, 2**10**6)
        if abs(base) > 1 and (abs(base).bit_length() - 1) * exp > _MAX_BITS:
            raise ToolError(f"the result has more than {MAX_DIGITS} digits")
        return base ** exp  # 0, 1 and -1 to any power: quick (square-and-multiply over the exponent's bits)
    try:
        return float(base) ** float(exp)  # floats: the C library's pow, quick for any size
    except OverflowError:
        raise ToolError("the result is too large for a floating-point number") from None
    except ZeroDivisionError:
        raise ToolError("division by zero (0 to a negative power)") from None


def _binary(op: ast.operator, a: int | float, b: int | float) -> int | float:
    try:
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Div):
            return a / b
        if isinstance(op, ast.FloorDiv):
            return a // b
        if isinstance(op, ast.Mod):
            return a % b
        return _power(a, b)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("the result is too large for a floating-point number") from None


def _walk(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant):
        if type(node.value) in (int, float):  # not bool, complex or str
            return _checked(node.value)
        raise ToolError(f"{node.value!r} is not a number")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _checked(_binary(node.op, _walk(node.left), _walk(node.right)))
    if isinstance(node, ast.Name):
        raise ToolError(f"names such as {node.id!r} are not allowed: only numbers, + - * / // % ** and parentheses")
    what = type(node).__name__
    raise ToolError(f"only numbers, + - * / // % ** and parentheses are allowed (not {what})")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression: int and float numbers, ``+ - * / // % **``, unary ``+ -`` and
    parentheses, read by walking its syntax tree (nothing is evaluated as code). Raises `ToolError` for
    anything else, for an expression over `MAX_EXPRESSION_CHARS` characters, for division by zero and for
    results past `MAX_DIGITS` digits (``9**9**9`` is refused at once, not computed)."""
    if not isinstance(expression, str):
        raise ToolError("the expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is {len(expression)} characters long; at most {MAX_EXPRESSION_CHARS}")
    if not expression.strip():
        raise ToolError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        msg = getattr(e, "msg", "") or type(e).__name__
        raise ToolError(f"not an arithmetic expression ({msg})") from None
    try:
        return _walk(tree)
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. "4821 * 317".
    """
    value = evaluate(expression)
    return str(value) if isinstance(value, int) else repr(value)


# ----------------------------------------------------------------------------- python


def python(code: str) -> str:
    """Run a Python program in a sandbox and return what it prints (stdout, then the end of stderr).

    Args:
        code: The whole program; print what you want to see.
    """
    raise RuntimeError("the python tool runs in verirl.sandbox (verirl.envs.tools.run_python), not in-process")


STDERR_TAIL_CHARS = 2000


def run_python(code: str, seconds: float, memory_mb: int, hide: tuple[str, ...] = (),
               max_chars: int = 0) -> ToolResult:
    """``code`` as a fresh program in `verirl.sandbox.run_program` (nothing on stdin), limited to ``seconds``
    of wall clock, ``memory_mb`` of address space and `HARD_MAX_CHARS` bytes of output; the result is its
    stdout, the end of its stderr and its exit status when not 0, cut to ``max_chars``."""
    from verirl.sandbox import Limits, run_program

    if not isinstance(code, str):
        return ToolResult("python", "Error: the code must be a string", error=True)
    limits = Limits(seconds=seconds, cpu_s=max(1, math.ceil(seconds)) + 1, memory_mb=memory_mb,
                    output_bytes=HARD_MAX_CHARS)
    r = run_program(code, stdin="", limits=limits, hide=hide)
    parts = [r.stdout] if r.stdout else []
    err = r.stderr.strip()
    if err:
        parts.append(err if len(err) <= STDERR_TAIL_CHARS else "..." + err[-STDERR_TAIL_CHARS:])
    if r.timed_out:
        parts.append(f"(timed out after {seconds:g}s: the program was stopped)")
    elif r.truncated:
        parts.append(f"(the output passed {HARD_MAX_CHARS} bytes: the program was stopped)")
    elif r.returncode:
        parts.append(f"(exit status {r.returncode})")
    text = "\n".join(p.rstrip("\n") for p in parts) if parts else "(no output)"
    return ToolResult("python", cut(text, max_chars), error=not r.ok, timed_out=r.timed_out, seconds=r.seconds)


def _calculator_tool() -> Tool:
    return function_tool(calculator, "local", "calculator")


def _python_tool() -> Tool:
    return Tool("python", function_tool(python).schema, "program", None, "python")


# name -> the built-in tool's maker (schemas are made when first asked for: a tool worker never imports transformers)
BUILTINS: Registry = Registry("rollout.multi_turn.tools", {"calculator": _calculator_tool, "python": _python_tool})


@functools.lru_cache(maxsize=None)
def builtin_tool(name: str) -> Tool:
    """The built-in tool ``name`` (`BUILTINS`)."""
    return BUILTINS[name]()


# ----------------------------------------------------------------------------- the user's code

_loaded: dict[str, Any] = {}
_load_lock = threading.RLock()  # a file being imported may load another


def _kinds(what: str) -> str:
    return (f"A {what} is given as path/to/file.py:{'Class' if 'environment' in what else 'function'} or "
            f"package.module:{'Class' if 'environment' in what else 'function'} (an installed package's, not "
            f"Python's standard library)")


def split_reference(spec: str, what: str) -> tuple[str, str]:
    """(file or module, name) of ``file.py:name`` / ``module:name``; refuses the standard library (its
    functions are not tools: ``os:system`` would run what the model writes through a shell)."""
    if ":" not in spec:
        raise ConfigError(f"{what} '{spec}' is not a reference: {_kinds(what)}.")
    target, name = spec.rsplit(":", 1)
    if not name.isidentifier():
        raise ConfigError(f"{what} '{spec}': '{name}' is not a Python name. {_kinds(what)}.")
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ConfigError(f"{what} '{spec}': file '{target}' does not exist (relative paths are read from "
                              f"{os.getcwd()}).")
        return target, name
    top = target.split(".")[0]
    from verirl.rewards.custom import standard_library

    if standard_library(top):
        raise ConfigError(f"{what} '{spec}': '{top}' is Python's standard library, and verirl does not call its "
                          f"functions or classes as tools (os:system would run what the model writes through a "
                          f"shell). {_kinds(what)}; write a function of yours that does only what the tool must.")
    return target, name


def _import(spec: str, target: str, what: str):
    from verirl.rewards.custom import _USER_FAILURES, _describe, _InterruptWatch, _line_in

    key = os.path.abspath(target) if target.endswith(".py") else target
    with _load_lock:
        if key in _loaded:
            return _loaded[key]
        with _InterruptWatch() as watch:
            try:
                if target.endswith(".py"):
                    mod_name = f"verirl_user_tools_{abs(hash(key))}"
                    loader_spec = importlib.util.spec_from_file_location(mod_name, target)
                    module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
                    sys.modules[mod_name] = module
                    try:
                        loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
                    except BaseException:
                        sys.modules.pop(mod_name, None)
                        raise
                else:
                    module = importlib.import_module(target)
            except ModuleNotFoundError as e:
                if target.endswith(".py"):
                    raise ConfigError(f"{what} '{spec}': importing '{target}' raised {_describe(e)}"
                                      f"{_line_in(e, target)}. Install what it imports, or fix the import.") from None
                raise ConfigError(f"{what} '{spec}': cannot import module '{target}' ({e}). Install its package, or "
                                  f"give the file instead: path/to/file.py:name.") from None
            except _USER_FAILURES as e:
                if watch.hit:  # a real Ctrl-C
                    raise
                where = _line_in(e, target if target.endswith(".py") else None)
                if isinstance(e, SystemExit):
                    raise ConfigError(f"{what} '{spec}': importing '{target}' called sys.exit({e.code!r}){where}: "
                                      f"verirl imports the file to find the {what}, so its top level must not exit. "
                                      f"Put the script part under `if __name__ == \"__main__\":`.") from None
                raise ConfigError(f"{what} '{spec}': importing '{target}' raised {_describe(e)}{where}. Fix the "
                                  f"file so that it imports without raising: verirl imports it to find the "
                                  f"{what}.") from None
        _loaded[key] = module
        return module


def load_object(spec: str, what: str) -> Any:
    """The object ``file.py:name`` or ``module:name`` names (importing the file or module runs it, once per
    process). ``what`` names it in errors: "tool", "rollout.multi_turn.environment"."""
    target, name = split_reference(spec, what)
    module = _import(spec, target, what)
    if not hasattr(module, name):
        raise ConfigError(f"{what} '{spec}': '{target}' has no '{name}' at its top level.")
    return getattr(module, name)


def user_function_tool(spec: str) -> Tool:
    """The tool a user's ``file.py:function`` / ``module:function`` makes: a plain function (def), schema from
    its signature and docstring, run in the tool pool's workers."""
    fn = load_object(spec, "tool")
    if not inspect.isfunction(fn):
        kind = "a class" if inspect.isclass(fn) else "a C builtin" if inspect.isbuiltin(fn) else type(fn).__name__
        hint = (" A class with reset() and tool methods is an environment: give it as rollout.multi_turn.environment."
                if inspect.isclass(fn) else "")
        raise ConfigError(f"tool '{spec}': '{spec.rsplit(':', 1)[1]}' is {kind}, not a plain Python function "
                          f"(def).{hint} {_kinds('tool')}.")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(f"tool '{spec}': it is an async function; a tool run in the tool workers returns its "
                          f"result, so define it with def.")
    return function_tool(fn, "worker", absolute(spec))


def absolute(spec: str) -> str:
    """``file.py:name`` with the file's absolute path (workers and sandboxes do not share the working
    directory); a module reference as it is."""
    target, _, name = spec.rpartition(":")
    return f"{os.path.abspath(target)}:{name}" if target.endswith(".py") else spec
