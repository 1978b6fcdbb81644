"""A config from a YAML file or a shipped recipe, ``a.b=c`` overrides on the command line, or the dict a
launcher hands its ranks; merged through OmegaConf structured configs so that unknown keys and wrong
types are caught before anything heavy starts, then checked by `verirl.config.values.validate`."""
from __future__ import annotations

import difflib
import os
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError, OmegaConfBaseException

from verirl.config.schema import Config
from verirl.config.values import validate
from verirl.core.errors import ConfigError

# veRL's names for verirl's keys: accepted on the command line and in files, with one line naming verirl's key.
PEER_NAMES: dict[type, dict[str, str]] = {
    Config: {"trainer.test_freq": "eval.every", "trainer.val_before_train": "eval.before_train"},
}
# Names an earlier verirl wrote into a checkpoint's config.yaml: read on resume (`upgrade_dict`), refused elsewhere.
OLD_NAMES: dict[str, str] = {
    "trainer.eval_at_start": "eval.before_train", "trainer.eval_at_end": "eval.at_end",
    "trainer.eval_samples": "eval.n", "trainer.val_n": "eval.n", "trainer.val_data": "eval.data",
    "data.val_path": "eval.data", "data.val_size": "eval.size", "data.additional_keys": "data.dataset_additional_keys",
}

# Recipes shipped inside the package: `--config NAME` (`verirl train` alone = `--config tiny`).
RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"
RECIPES = {"tiny": "the embedded default: GRPO on the shipped 1M-parameter model and the built-in arithmetic "
                   "task, 700 steps on a CPU (what `make run` runs)",
           "tiny_moe": "the tiny recipe with model.path=tiny-moe, the shipped Qwen3-MoE (8 experts, top-2; "
                       "docs/moe.md)"}



def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        out.append(key)
        if is_dataclass(f.type) or (isinstance(f.default_factory, type) and is_dataclass(f.default_factory)):
            out.extend(_all_keys(f.default_factory, key + "."))  # type: ignore[arg-type]
    return out


def _suggest(key: str, cls: type) -> str:
    if cls is Config and key in OLD_NAMES:
        return f" Did you mean: {OLD_NAMES[key]}? (an earlier verirl's name for it)"
    keys = _all_keys(cls)
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
    if not close:  # match on the last component ("lr" -> actor.lr)
        last = key.split(".")[-1]
        close = [k for k in keys if k.split(".")[-1] == last] or difflib.get_close_matches(
            last, keys, n=3, cutoff=0.6
        )
    return f" Did you mean: {', '.join(close)}?" if close else ""


def _wrap(err: OmegaConfBaseException, source: str, cls: type) -> ConfigError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigKeyError) or "not in struct" in str(err) or "Key '" in str(err):
        return ConfigError(
            f"Unknown config key '{key}' in {source}.{_suggest(key, cls)} "
            f"Run `verirl train --help-config` for every key with its default."
        )
    if isinstance(err, ValidationError):
        msg = str(err).splitlines()[0]
        return ConfigError(f"Bad value for config key '{key}' in {source}: {msg}. Fix the value's type.")
    return ConfigError(f"Config error in {source}: {str(err).splitlines()[0]}")


def _section_error(key: str, value: Any, source: str, section: type) -> ConfigError:
    names = [f.name for f in fields(section)]
    return ConfigError(f"'{key}' in {source} is a section of keys ({', '.join(f'{key}.{n}' for n in names[:4])}, ...), "
                       f"not one value ({value!r}). Set one of its keys, e.g. {key}.{names[0]}=..., or give it as a "
                       f"mapping of keys ({key}: {{{names[0]}: ...}}).")


def _check_sections(values: Any, schema_cls: type, source: str, prefix: str = "") -> None:
    """A section of the schema (actor, algo.filter_groups) given one value in a file instead of its keys."""
    if not isinstance(values, dict):
        return
    for f in fields(schema_cls):
        default = getattr(schema_cls(), f.name)
        if f.name in values and is_dataclass(default):
            if values[f.name] is not None and not isinstance(values[f.name], dict):
                raise _section_error(prefix + f.name, values[f.name], source, type(default))
            _check_sections(values[f.name], type(default), source, f"{prefix}{f.name}.")


def _tab_hint(file: Path) -> str:
    """" Line N is indented with a tab ..." for the first such line of ``file``, else ""."""
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for n, line in enumerate(lines, start=1):
        if "\t" in line[:len(line) - len(line.lstrip())]:
            return (f" Line {n} is indented with a tab: YAML indents with spaces only. Replace the tab with "
                    f"spaces (e.g. `expand -t 2 {file}`).")
    return ""


def recipe_file(name: str) -> Path:
    """The YAML file of a recipe shipped inside the package."""
    return RECIPE_DIR / f"{name}.yaml"


def _source(path: str) -> tuple[Path, str]:
    """(file to read, how to name it in messages) for --config: a recipe name or a YAML file."""
    if path in RECIPES:
        return recipe_file(path), f"recipe '{path}' ({recipe_file(path)})"
    if not os.path.exists(path):
        raise ConfigError(f"Config file '{path}' does not exist. Pass an existing YAML file to --config, or a "
                          f"recipe shipped with verirl: {', '.join(RECIPES)}.")
    return Path(path), f"'{path}'"


def _peer_name(key: str, schema_cls: type, source: str) -> str:
    """verirl's name for ``key``; a peer's name prints one line naming verirl's."""
    new = PEER_NAMES.get(schema_cls, {}).get(key)
    if new is None:
        return key
    print(f"config: {key} ({source}) is veRL's name for {new}; using it as {new}. Write {new} to silence this line.",
          file=sys.stderr)
    return new


def upgrade_dict(old: dict, schema_cls: type = Config) -> dict:
    """A config saved by an earlier verirl (a checkpoint's), as nested dicts, with its old key names (`OLD_NAMES`)
    and peers' names moved to the current ones (silently: nothing is being configured)."""
    out = {section: dict(values) if isinstance(values, dict) else values for section, values in old.items()}
    renames = {**OLD_NAMES, **PEER_NAMES.get(schema_cls, {})} if schema_cls is Config else {}
    for old_key, new_key in renames.items():
        *parents, leaf = old_key.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new_key.split(".")
        target = out
        for p in new_parents:
            target = target.setdefault(p, {})
        target.setdefault(new_leaf, value)
    return out


def _peer_file_keys(file_cfg: DictConfig, schema_cls: type, source: str) -> None:
    for old, new in PEER_NAMES.get(schema_cls, {}).items():
        *parents, leaf = old.split(".")
        node = OmegaConf.select(file_cfg, ".".join(parents)) if parents else file_cfg
        if not isinstance(node, DictConfig) or leaf not in node:
            continue
        value = node[leaf]
        del node[leaf]
        _peer_name(old, schema_cls, f"in {source}")
        if OmegaConf.select(file_cfg, new) is None:  # verirl's name, when also given, wins
            OmegaConf.update(file_cfg, new, value, force_add=True)


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None, schema_cls: type = Config):
    """Defaults <- YAML file or recipe <- ``a.b=c`` overrides; then `validate` (for the GRPO `Config`).

    veRL's names (`PEER_NAMES`) are accepted with one line naming verirl's key."""
    schema = OmegaConf.structured(schema_cls)
    cfg = schema
    if path:
        file, source = _source(path)
        try:
            file_cfg = OmegaConf.load(file)
        except Exception as e:  # yaml errors carry line numbers
            raise ConfigError(f"Config file {source} is not valid YAML: {e}{_tab_hint(file)}") from None
        if not isinstance(file_cfg, DictConfig):
            raise ConfigError(f"Config file {source} must hold a mapping of sections (data:, actor:, ...) at its "
                              f"top level, not a {type(file_cfg).__name__}.")
        _peer_file_keys(file_cfg, schema_cls, source)
        _check_sections(OmegaConf.to_container(file_cfg, resolve=False), schema_cls, source)
        try:
            cfg = OmegaConf.merge(cfg, file_cfg)
        except OmegaConfBaseException as e:
            raise _wrap(e, source, schema_cls) from None
    for ov in overrides or []:
        if "=" not in ov:
            raise ConfigError(f"Override '{ov}' is not of the form key.sub=value (e.g. actor.lr=1e-4).")
        key, value = ov.split("=", 1)
        key = _peer_name(key.strip(), schema_cls, "on the command line")
        ov = f"{key}={value}"
        try:
            parsed = OmegaConf.select(OmegaConf.from_dotlist([ov]), key)
            current = OmegaConf.select(cfg, key, default=None)
            section = isinstance(current, DictConfig) and is_dataclass(OmegaConf.get_type(current))
            if section and not isinstance(parsed, DictConfig):
                raise _section_error(key, parsed, f"override '{ov}'", OmegaConf.get_type(current))
            if isinstance(parsed, DictConfig) and not section:  # a mapping replaces the file's, not merged into it
                OmegaConf.update(cfg, key, parsed, merge=False)
            else:  # a plain value, or a mapping onto a section of the schema: its keys are set, the rest kept
                cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([ov]))
        except OmegaConfBaseException as e:
            raise _wrap(e, f"override '{ov}'", schema_cls) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{ov}': the value is not valid YAML ({' '.join(str(e).split())}). Quote "
                              f"strings with backslashes in single quotes, e.g. modules: 'layers\\.0\\.'.") from None
    obj = OmegaConf.to_object(cfg)
    if isinstance(obj, Config):
        validate(obj)
    return obj


def load_config_dict(values: dict, schema_cls: type = Config):
    """A config from `to_dict`'s output (how a launcher hands the resolved config to its ranks)."""
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema_cls), values))
    if isinstance(obj, Config):
        validate(obj)
    return obj


def to_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg) -> dict:
    """The config as plain nested dicts (JSON-able)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted leaves; lists and empty mappings are leaves."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def describe(schema_cls: type = Config) -> str:
    """Every key with its default, for --help-config."""
    return to_yaml(schema_cls())
