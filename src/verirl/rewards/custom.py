"""Rules given by reference: a built-in name, ``path/to/file.py:fn`` or ``package.module:fn``.

A rule is written either for ONE response, ``fn(response, label, ...) -> float``, or for a
LIST, ``fn(responses, labels, ...) -> list[float]``. verirl tells which by the
`batched` decorator, else by the first parameter's name (``responses``, ``completions``,
``solutions`` or ``texts`` mean a list). Other parameters are filled BY NAME from the
sample: ``label`` (aliases ``labels``, ``ground_truth``, ``answer``), ``task``, and every
column kept with the data (``data_source``, ...); a ``**kwargs`` parameter receives them all.
In list mode each of these is a list, one entry per response.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

from verirl.errors import ConfigError
from verirl.rewards.rules import RULES

LIST_PARAM_NAMES = {"responses", "completions", "solutions", "texts"}
LABEL_ALIASES = ("label", "labels", "ground_truth", "answer")


def batched(fn: Callable) -> Callable:
    """Mark a rule as taking a list of responses and returning a list of scores."""
    fn._verirl_batched = True  # type: ignore[attr-defined]
    return fn


@lru_cache(maxsize=None)
def resolve(spec: str) -> Callable:
    """The function a rule reference names (cached per process)."""
    if spec in RULES:
        return RULES[spec]
    if ":" not in spec:
        raise ConfigError(f"{RULES.unknown(spec)} Your own rule is named path/to/file.py:function or "
                          f"package.module:function.")
    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise ConfigError(f"reward rule '{spec}': file '{target}' does not exist.")
        mod_name = f"verirl_user_rule_{abs(hash(os.path.abspath(target)))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, target)
        module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
        sys.modules[mod_name] = module
        loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ConfigError(f"reward rule '{spec}': cannot import module '{target}' ({e}).") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"reward rule '{spec}': '{target}' has no function '{name}'.")
    return fn


@dataclass(frozen=True)
class Rule:
    spec: str  # how the config names it
    name: str  # metric name: reward/<name>/mean
    batched: bool
    params: Optional[tuple[str, ...]]  # keyword parameters filled from the sample; None = **kwargs (all)


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


def call_rule(rule: Rule, responses: Sequence[str], samples: Sequence[dict]) -> list[tuple[Optional[float], str]]:
    """Scores for ``responses``: one (score, "") per response, or (None, why) where it failed.

    Never raises: an exception, a non-number, a NaN/inf, or a list of the wrong length
    becomes (None, reason) for the samples it affects."""
    import math

    fn = resolve(rule.spec)

    def check(v: Any) -> tuple[Optional[float], str]:
        try:
            f = float(v)
        except (TypeError, ValueError):
            return None, f"returned {type(v).__name__} {str(v)[:40]!r}, not a number"
        return (f, "") if math.isfinite(f) else (None, f"returned {f}")

    if not rule.batched:
        out = []
        for resp, sample in zip(responses, samples):
            try:
                out.append(check(fn(resp, **_kwargs(rule, sample))))
            except Exception as e:  # a user's rule may raise anything; it must not stop the run
                out.append((None, f"raised {type(e).__name__}: {e}"))
        return out
    per_sample = [_kwargs(rule, s) for s in samples]
    keys = per_sample[0].keys() if per_sample else []
    kw = {k: [p.get(k) for p in per_sample] for k in keys}
    try:
        scores = fn(list(responses), **kw)
    except Exception as e:
        return [(None, f"raised {type(e).__name__}: {e}")] * len(responses)
    try:
        scores = list(scores)
    except TypeError:
        return [(None, f"returned {type(scores).__name__}, not a list")] * len(responses)
    if len(scores) != len(responses):
        return [(None, f"returned {len(scores)} scores for {len(responses)} responses")] * len(responses)
    return [check(v) for v in scores]
