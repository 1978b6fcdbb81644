"""Rules given by reference: a built-in name, ``path/to/file.py:fn`` or ``package.module:fn`` (an
installed package's, not the standard library's), naming a plain Python function.

A rule is written either for ONE response, ``fn(response, label, ...) -> float``, or for a
LIST, ``fn(responses, labels, ...) -> list[float]``. verirl tells which by the
`batched` decorator, else by the first parameter's name (``responses``, ``completions``,
``solutions`` or ``texts`` mean a list). Other parameters are filled BY NAME from the
sample: ``label`` (aliases ``labels``, ``ground_truth``, ``answer``), ``task``, and every
column kept with the data (``data_source``, ...); a ``**kwargs`` parameter receives them all.
In list mode each of these is a list, one entry per response.

A rule is the user's code, so nothing it does at import or call time may stop a run: loading a
file that raises (even ``SystemExit`` from ``sys.exit`` or ``KeyboardInterrupt``) is a
`ConfigError` naming the file, and a call that raises anything scores None with the reason. A
real Ctrl-C (SIGINT) that arrives during a load or a call in the trainer's own process still
stops the run.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

from verirl.core.errors import ConfigError
from verirl.rewards.rules import RULES

LIST_PARAM_NAMES = {"responses", "completions", "solutions", "texts"}
LABEL_ALIASES = ("label", "labels", "ground_truth", "answer")
DEFAULT_MAX_ABS_SCORE = 1e6
# What user code may raise and still only cost its own samples. SystemExit and KeyboardInterrupt are
# BaseExceptions, so `except Exception` would let a rule's sys.exit() end the trainer or a worker.
_USER_FAILURES = (Exception, SystemExit, KeyboardInterrupt)


class _InterruptWatch:
    """Tells a real Ctrl-C apart from a rule that raises KeyboardInterrupt itself.

    In the main thread, while active, SIGINT first sets ``hit`` and then runs the handler that was
    there before (which raises KeyboardInterrupt, by default). Elsewhere (other threads, or a
    scoring worker, which ignores SIGINT) it does nothing and ``hit`` stays False."""

    def __enter__(self) -> "_InterruptWatch":
        self.hit, self._prev = False, None
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if callable(prev):
                def on_sigint(signum, frame):
                    self.hit = True
                    prev(signum, frame)
                signal.signal(signal.SIGINT, on_sigint)
                self._prev = prev
        return self

    def __exit__(self, *exc) -> bool:
        if self._prev is not None:
            signal.signal(signal.SIGINT, self._prev)
        return False


def _describe(e: BaseException) -> str:
    """'ValueError: bad value', 'SystemExit: sys.exit(3)', 'KeyboardInterrupt' (cut to 300 characters)."""
    msg = f"sys.exit({e.code!r})" if isinstance(e, SystemExit) else str(e)
    msg = msg if len(msg) <= 300 else msg[:300] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _raised(e: BaseException) -> str:
    """The reason a call failed, as the warning prints it ("raised ValueError: ...")."""
    return "out of memory (MemoryError)" if isinstance(e, MemoryError) else f"raised {_describe(e)}"


def _line_in(e: BaseException, path: Optional[str]) -> str:
    """' (file, line N)': the deepest frame of ``e``'s traceback in ``path`` (any real file if None)."""
    found = ""
    tb = e.__traceback__
    want = os.path.abspath(path) if path else None
    while tb is not None:
        fname = tb.tb_frame.f_code.co_filename
        if (want and os.path.abspath(fname) == want) or (not want and not fname.startswith("<")):
            found = f" ({fname}, line {tb.tb_lineno})"
        tb = tb.tb_next
    return found


def _import_failure(spec: str, target: str, e: BaseException, path: Optional[str]) -> str:
    where = _line_in(e, path)
    if isinstance(e, SystemExit):
        return (f"reward rule '{spec}': importing '{target}' called sys.exit({e.code!r}){where}: verirl imports "
                f"the file to find the rule, so its top level must not exit. Put the script part under "
                f"`if __name__ == \"__main__\":`.")
    return (f"reward rule '{spec}': importing '{target}' raised {_describe(e)}{where}. Fix the "
            f"file so that it imports without raising: verirl imports it to find the rule.")


def batched(fn: Callable) -> Callable:
    """Mark a rule as taking a list of responses and returning a list of scores."""
    fn._verirl_batched = True  # type: ignore[attr-defined]
    return fn


_KINDS = ("A rule is a built-in name, path/to/file.py:function, or package.module:function of an installed "
          "package that is not Python's standard library")



def standard_library(top: str) -> bool:
    """Whether a module's top-level name is Python's standard library (whose functions verirl never calls as
    a user's rule or tool: os:system would run what a model writes through a shell)."""
    return top in sys.stdlib_module_names or top in sys.builtin_module_names or top == "builtins"

def _split(spec: str) -> tuple[str, str]:
    """(file or module, function name) of a reference that is not a built-in name; refuses the
    references verirl does not run: no ``:``, a standard-library or builtin module."""
    if ":" not in spec:
        raise ConfigError(f"{RULES.unknown(spec)} Your own rule is named path/to/file.py:function or "
                          f"package.module:function.")
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise ConfigError(f"reward rule '{spec}': file '{target}' does not exist.")
        return target, name
    top = target.split(".")[0]
    if standard_library(top):
        raise ConfigError(f"reward rule '{spec}': '{top}' is Python's standard library, and verirl does not call "
                          f"its functions as reward rules (os:system would run every response through a shell). "
                          f"{_KINDS}. Write the rule as a function in a file of yours.")
    return target, name


def _not_a_function(spec: str, target: str, name: str, fn: object) -> str:
    kind = "a class" if inspect.isclass(fn) else "a C builtin" if inspect.isbuiltin(fn) else type(fn).__name__
    return (f"reward rule '{spec}': '{name}' in '{target}' is {kind}, not a plain Python function. {_KINDS}, and "
            f"it names a function defined with def; wrap anything else in one.")


@lru_cache(maxsize=None)
def resolve(spec: str) -> Callable:
    """The function a rule reference names (cached per process): importing its file or module runs
    that code. `check_reference` checks a reference without running anything."""
    if spec in RULES:
        return RULES[spec]
    target, name = _split(spec)
    if target.endswith(".py"):
        mod_name = f"verirl_user_rule_{abs(hash(os.path.abspath(target)))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, target)
        module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
        sys.modules[mod_name] = module
        with _InterruptWatch() as watch:
            try:
                loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
            except _USER_FAILURES as e:
                sys.modules.pop(mod_name, None)
                if watch.hit:  # a real Ctrl-C, not the file's doing
                    raise
                raise ConfigError(_import_failure(spec, target, e, target)) from None
    else:
        with _InterruptWatch() as watch:
            try:
                module = importlib.import_module(target)
            except ModuleNotFoundError as e:
                raise ConfigError(f"reward rule '{spec}': cannot import module '{target}' ({e}).") from None
            except _USER_FAILURES as e:
                if watch.hit:
                    raise
                raise ConfigError(_import_failure(spec, target, e, None)) from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(f"reward rule '{spec}': '{target}' has no function '{name}'.")
    if not inspect.isfunction(fn):
        raise ConfigError(_not_a_function(spec, target, name, fn))
    return fn


def _source_of(target: str) -> Optional[str]:
    """The source file of module ``target``, found without importing it or its packages; None when
    it has none (a C extension, a namespace package)."""
    parts = target.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level name: imports nothing
    if spec is None:
        raise ModuleNotFoundError(f"No module named '{parts[0]}'")
    where, origin = spec.submodule_search_locations, spec.origin
    for part in parts[1:]:
        found = [c for d in (where or []) for c in (os.path.join(d, part + ".py"), os.path.join(d, part, "__init__.py"))
                 if os.path.isfile(c)]
        if not found:
            return None
        origin = found[0]
        where = [os.path.dirname(origin)] if origin.endswith("__init__.py") else None
    return origin if origin and origin.endswith(".py") else None


def _module_level(body: list) -> list:
    """The statements that run at a module's top level, those inside ``if``, ``try`` and ``with`` too."""
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            inner += [s for h in getattr(node, "handlers", []) for s in h.body]
            out += _module_level(inner)
    return out


def _top_level_names(path: str, spec: str) -> dict[str, ast.AST]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"reward rule '{spec}': cannot read '{path}' ({e}).") from None
    except SyntaxError as e:
        raise ConfigError(f"reward rule '{spec}': '{path}' line {e.lineno}: {e.msg}. Fix the file's syntax.") from None
    names: dict[str, ast.AST] = {}
    for node in _module_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update({n.id: node for n in ast.walk(t) if isinstance(n, ast.Name)})
    return names


def check_reference(spec: str) -> str:
    """The metric name of rule reference ``spec``, checked WITHOUT running its code (``verirl plan``):
    a built-in name, or a file or module whose source parses and defines ``function`` at its top
    level (a ``def``, or a name it imports or assigns, which only the import can check)."""
    if spec in RULES:
        return spec
    target, name = _split(spec)
    try:
        path = target if target.endswith(".py") else _source_of(target)
    except (ImportError, ValueError) as e:
        raise ConfigError(f"reward rule '{spec}': cannot find module '{target}' ({e}).") from None
    if path is None:
        return name  # no Python source to read: the import when training starts checks it
    node = _top_level_names(path, spec).get(name)
    if node is None:
        raise ConfigError(f"reward rule '{spec}': '{target}' has no function '{name}'.")
    if isinstance(node, ast.ClassDef):
        raise ConfigError(f"reward rule '{spec}': '{name}' in '{target}' is a class, not a plain Python function. "
                          f"{_KINDS}, and it names a function defined with def; wrap anything else in one.")
    if isinstance(node, ast.AsyncFunctionDef):
        raise ConfigError(f"reward rule '{spec}': '{name}' in '{target}' is an async function; a rule returns its "
                          f"score, so define it with def.")
    return name


@dataclass(frozen=True)
class Rule:
    spec: str  # how the config names it
    name: str  # metric name: reward/<name>/mean
    batched: bool
    params: Optional[tuple[str, ...]]  # keyword parameters filled from the sample; None = **kwargs (all)
    scores: bool = True  # False: a helper whose values (any picklable object) come back unchecked


def load_rule(spec: str) -> Rule:
    fn = resolve(spec)
    name = spec if spec in RULES else spec.rsplit(":", 1)[1]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return Rule(spec, name, bool(getattr(fn, "_verirl_batched", False)), None)
    ps = list(sig.parameters.values())
    if not ps:
        raise ConfigError(f"reward rule '{spec}' takes no arguments; it must take the response(s) first.")
    is_batched = bool(getattr(fn, "_verirl_batched", False)) or ps[0].name in LIST_PARAM_NAMES
    if any(p.kind is p.VAR_KEYWORD for p in ps[1:]):
        params = None
    else:
        params = tuple(p.name for p in ps[1:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return Rule(spec, name, is_batched, params)


def _kwargs(rule: Rule, sample: dict) -> dict:
    full = dict(sample)
    for alias in LABEL_ALIASES:
        full.setdefault(alias, sample.get("label"))
    if rule.params is None:
        return full
    return {k: full[k] for k in rule.params if k in full}


def check_score(v: Any, max_abs_score: float = DEFAULT_MAX_ABS_SCORE) -> tuple[Optional[float], str]:
    """(score, "") for a usable score, else (None, why): a str (even "1e9") is not a number, and
    a value that is not finite or beyond +-``max_abs_score`` (reward.max_abs_score) is refused."""
    if isinstance(v, (str, bytes)):
        return None, f"returned {type(v).__name__} {v[:40]!r}, not a number"
    try:
        f = float(v)
    except Exception:  # noqa: BLE001  (a user's object may raise anything from __float__)
        return None, f"returned {type(v).__name__} {str(v)[:40]!r}, not a number"
    if not math.isfinite(f):
        return None, f"returned {f}"
    if abs(f) > max_abs_score:
        return None, f"returned {f:g}, beyond reward.max_abs_score={max_abs_score:g}"
    return f, ""


def call_rule(rule: Rule, responses: Sequence[str], samples: Sequence[dict],
              max_abs_score: float = DEFAULT_MAX_ABS_SCORE) -> list[tuple[Optional[float], str]]:
    """Scores for ``responses``: one (score, "") per response, or (None, why) where it failed.

    Never raises (but for a real Ctrl-C in the main thread): an exception of any kind
    (SystemExit and KeyboardInterrupt included), a rule that cannot be loaded, a non-number, a
    score `check_score` refuses, or a list of the wrong length becomes (None, reason) for the
    samples it affects."""
    with _InterruptWatch() as watch:
        try:
            fn = resolve(rule.spec)
        except _USER_FAILURES as e:
            if watch.hit:
                raise
            why = str(e) if isinstance(e, ConfigError) else _raised(e)
            return [(None, f"could not be loaded: {why}")] * len(responses)
        if not rule.batched:
            out = []
            for resp, sample in zip(responses, samples):
                try:
                    value = fn(resp, **_kwargs(rule, sample))
                    out.append(check_score(value, max_abs_score) if rule.scores else (value, ""))
                except _USER_FAILURES as e:  # a user's rule may raise anything; it must not stop the run
                    if watch.hit:
                        raise
                    out.append((None, _raised(e)))
            return out
        per_sample = [_kwargs(rule, s) for s in samples]
        keys = per_sample[0].keys() if per_sample else []
        kw = {k: [p.get(k) for p in per_sample] for k in keys}
        try:
            returned = fn(list(responses), **kw)
        except _USER_FAILURES as e:
            if watch.hit:
                raise
            return [(None, _raised(e))] * len(responses)
        try:
            scores = list(returned)
        except TypeError:
            return [(None, f"returned {type(returned).__name__}, not a list")] * len(responses)
        except _USER_FAILURES as e:  # a generator that raises part-way
            if watch.hit:
                raise
            return [(None, _raised(e))] * len(responses)
        if len(scores) != len(responses):
            return [(None, f"returned {len(scores)} scores for {len(responses)} responses")] * len(responses)
        return [check_score(v, max_abs_score) for v in scores]
