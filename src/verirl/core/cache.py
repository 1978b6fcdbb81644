"""Where verirl keeps what it builds once and reuses (converted models, tokenizers, preprocessed data)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$VERIRL_CACHE``, or ``~/.cache/verirl`` when it is unset. Read at each call, so a change to
    the environment takes effect at once."""
    return Path(os.environ.get("VERIRL_CACHE", Path.home() / ".cache" / "verirl"))
