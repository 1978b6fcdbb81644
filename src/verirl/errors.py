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
