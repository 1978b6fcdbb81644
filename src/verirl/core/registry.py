"""Name -> implementation tables picked by a config key. The table owns the "unknown name" error,
so every place that looks a name up says the same thing: the key, the value, the known names."""
from __future__ import annotations

import difflib

from verirl.core.errors import ConfigError


class Registry(dict):
    """A dict for one config key; ``registry[name]`` with an unknown name raises `ConfigError`
    naming the key, the value and the known names (``in`` and ``get`` behave as for a dict)."""

    def __init__(self, key: str, entries=(), **more):
        super().__init__(entries, **more)
        self.key = key

    def unknown(self, name, key: str = "") -> ConfigError:
        """The error for an unknown ``name``, naming ``key`` (default: the registry's own key)."""
        close = difflib.get_close_matches(str(name), [str(k) for k in self], n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return ConfigError(f"{key or self.key}={name!r} is not a known name; known: {', '.join(map(str, self))}."
                           f"{hint}")

    def __missing__(self, name):
        raise self.unknown(name)

    def check(self, name, key: str = "") -> None:
        """Raise `ConfigError` unless ``name`` is known (``key``: the config key to name instead)."""
        if name not in self:
            raise self.unknown(name, key)
