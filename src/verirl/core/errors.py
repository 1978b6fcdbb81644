"""The one error type a user can fix, and its kinds.

The CLI prints a `UserError` as one paragraph and exits with status 2; every other exception
is a bug in verirl (or in a library under it) and keeps its traceback. So raise a `UserError`
only for what the person running verirl can change: a config key, a file, a row of data, a
checkpoint, a model directory. Its message names the thing that is wrong and the fix.

`UserError` derives from `ValueError` so that code catching bad values keeps working.
"""
from __future__ import annotations


class UserError(ValueError):
    """Something the user can fix; the message names what is wrong and how to fix it."""


class ConfigError(UserError):
    """A config key, value or file: the key, the value and the fix."""


class DataError(UserError):
    """A data file, row or column: the file, the row and the fix."""


class CheckpointError(UserError):
    """A checkpoint or run directory that cannot be used as asked."""


class ModelError(UserError):
    """A model directory, tokenizer or device that cannot be used as asked."""


# verirl's switches in the environment (docs/performance.md): name -> (default, the values it takes)
ENV_SWITCHES = {
    "VERIRL_ONEDNN": ("1", ("0", "1")),  # float32 CPU products through oneDNN
    "VERIRL_CUDA_GRAPHS": ("1", ("0", "1")),  # the native engine's decoding step as a CUDA graph
    # packed attention on CUDA: a varlen kernel (torch's called directly), torch's varlen_attn function, or buckets
    "VERIRL_VARLEN": ("auto", ("auto", "torch", "buckets")),
}


def env_choice(name: str) -> str:
    """The value of the switch ``name`` of `ENV_SWITCHES` (its default when unset or empty). A value it does
    not take raises, rather than silently meaning the default."""
    import os

    default, choices = ENV_SWITCHES[name]
    value = os.environ.get(name, "").strip() or default
    if value not in choices:
        raise ConfigError(f"{name}={os.environ[name]!r} in the environment is not one of {', '.join(choices)}; "
                          f"set it to one of them, or unset it for the default ({default}; docs/performance.md).")
    return value


def check_env() -> None:
    """Every switch of `ENV_SWITCHES`, checked at start (before a bad one is first read mid-run)."""
    for name in ENV_SWITCHES:
        env_choice(name)
