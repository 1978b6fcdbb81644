"""docs/config.md: every key of the config with its default and meaning (`python -m verirl.config >
docs/config.md`; a test checks that it is current)."""
from __future__ import annotations

from dataclasses import fields, is_dataclass

from verirl.config.load import PEER_NAMES, RECIPES
from verirl.config.schema import Config, PreprocessConfig, SFTConfig
from verirl.config.values import bounds_text

_DOC_HEAD = """# Configuration reference

Generated from `src/verirl/config/schema.py` by `python -m verirl.config > docs/config.md` (a test
checks that it is current).

A run is `verirl train --config FILE.yaml key.sub=value ...`: the defaults below, then the
file, then the overrides. `--config` also takes the name of a recipe shipped inside the package
(`src/verirl/recipes/NAME.yaml`); `verirl train` with no `--config` runs the `tiny` recipe, the
embedded default that `make run` runs. The defaults below are for a real model; the `tiny`
recipe sets what the 1M-parameter model needs. `verirl train --help-config` prints every key with
its default. Unknown keys and wrong types are refused with the closest valid names; impossible
batch shapes are refused with the arithmetic spelled out. The resolved config is written to
`RUN_DIR/config.yaml`.

**Counting rule**: `data.prompts_per_step` and `actor.mini_batch_prompts` count *prompts*;
each prompt is sampled `rollout.n` times, so a step holds `prompts_per_step * n` sequences.
`actor.micro_batch_size` and `rollout.micro_batch_size` count *sequences*. veRL's
`ppo_mini_batch_size` also counts prompts; MindSpeed-RL's mini-batch is already multiplied by n.
"""


def _allowed(meta) -> str:
    """What a key must be, from its `setting`: a range or the names of its registry."""
    if meta.get("choices") is not None:
        return " / ".join(meta["choices"])
    if all(meta.get(k) is None for k in ("ge", "gt", "le")):
        return ""
    return bounds_text(meta.get("ge"), meta.get("gt"), meta.get("le"))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "/")


def _table(cls: type, prefix: str) -> list[str]:
    """The rows of ``cls``'s keys: default, what it must be, meaning; a nested section is a row of what it is
    for, then its own keys."""
    inst = cls()
    rows = ["| key | default | must be | meaning |", "|---|---|---|---|"]
    for f in fields(cls):
        value = getattr(inst, f.name)
        if is_dataclass(value):
            rows.append(f"| `{prefix}{f.name}.*` | | | {_cell(f.metadata['help'])} |")
            rows += _table(type(value), f"{prefix}{f.name}.")[2:]
            continue
        rows.append(f"| `{prefix}{f.name}` | `{'null' if value is None else value}` | {_allowed(f.metadata)} | "
                    f"{_cell(f.metadata['help'])} |")
    return rows


def markdown_reference() -> str:
    out = [_DOC_HEAD]
    for f in fields(Config):
        out += [f"## `{f.name}`", "", f.metadata["help"], ""] + _table(f.default_factory, f"{f.name}.") + [""]  # type: ignore[arg-type]
    out += ["## `verirl sft`", ""] + _table(SFTConfig, "") + [""]
    out += ["## `verirl preprocess`", "", "MindSpeed-RL's data keys; see docs/data.md.", ""]
    out += _table(PreprocessConfig, "") + [""]
    out += ["## Recipes", "", "| `--config` | what |", "|---|---|"]
    out += [f"| `{name}` | {what} |" for name, what in RECIPES.items()] + [""]
    out += ["## veRL's names", "", "Accepted on the command line and in files; each prints one line naming verirl's key.",
            "", "| veRL | verirl |", "|---|---|"]
    for names in PEER_NAMES.values():
        out += [f"| `{peer}` | `{ours}` |" for peer, ours in names.items()]
    return "\n".join(out) + "\n"
