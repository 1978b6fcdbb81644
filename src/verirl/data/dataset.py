"""Training prompts from your own files: preprocessed Parquet, or raw files preprocessed on the fly.

A preprocessed file is the ``.parquet`` written by `verirl preprocess` (it has a
``prompt_ids`` column and a ``.manifest.json`` beside it). Its ids are checked against the
tokenizer in use: an id outside its vocabulary, or an empty prompt, is a `DataError` naming
the row (the file was made with another tokenizer, or by another tool).

Anything else is raw and goes through the same preprocessing, cached under
``verirl.core.cache.cache_root() / "data"`` (``$VERIRL_CACHE/data``, default ``~/.cache/verirl/data``).
The cache key is a hash of the content of everything that shapes the output: the data files,
the templates file (and the built-in templates), the tokenizer's files, and the settings (handler,
keys, prompt type). Edit any of them and the next load preprocesses again; a load with nothing
changed reads the cached file.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from verirl.core.cache import cache_root
from verirl.data.load import list_files
from verirl.core.errors import DataError
from verirl.config import DataConfig
from verirl.core.types import Prompt
from verirl.data.prompts import encode_prompts
from verirl.data.tasks import TASKS


def check_prompt_ids(table, path: Path, tokenizer_path: str, tokenizer_dir: str, manifest: dict) -> None:
    """Every row's ``prompt_ids`` is a non-empty list of ids in ``[0, len(tokenizer))``, else a
    `DataError` naming the file, the first bad row and the fix."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from transformers import AutoTokenizer

    col = table.column("prompt_ids")
    made_with = f" (its manifest says it was made with tokenizer '{manifest['tokenizer']}')" \
        if manifest.get("tokenizer") else ""
    fix = (f"Re-run `verirl preprocess` on the raw data with this model's tokenizer "
           f"(tokenizer_name_or_path={tokenizer_path}), or give the raw files as data.train_path.")
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) \
            or not pa.types.is_integer(col.type.value_type):
        raise DataError(f"{path}: column 'prompt_ids' has type {col.type}, not a list of integer token ids. {fix}")
    if len(col) == 0:
        return
    col = col.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(col), 0)
    if pc.min(lengths).as_py() == 0:
        row = pc.index(lengths, 0).as_py()
        raise DataError(f"{path} row {row}: 'prompt_ids' is empty, so there is no prompt to generate from. {fix}")
    vocab = len(AutoTokenizer.from_pretrained(tokenizer_dir))
    flat = pc.list_flatten(col)
    if flat.null_count:
        row = pc.list_parent_indices(col)[pc.index(pc.is_null(flat), True).as_py()].as_py()
        raise DataError(f"{path} row {row}: 'prompt_ids' holds a null where a token id should be. {fix}")
    lo, hi = pc.min_max(flat).values()
    if lo.as_py() < 0 or hi.as_py() >= vocab:
        bad = pc.or_(pc.less(flat, 0), pc.greater_equal(flat, vocab))
        k = pc.index(bad, True).as_py()
        row, token = pc.list_parent_indices(col)[k].as_py(), flat[k].as_py()
        raise DataError(f"{path} row {row}: token id {token} is outside the vocabulary of the tokenizer "
                        f"'{tokenizer_path}' (ids 0..{vocab - 1}): the file was preprocessed with another "
                        f"tokenizer{made_with}. {fix}")


@dataclass
class LoadedData:
    prompts: list[Prompt]
    stop_words: list[str] = field(default_factory=list)  # from the template, for the rollout
    replace_eos: bool = False
    too_long: int = 0  # prompts dropped for data.max_prompt_length
    source: str = ""


def _is_preprocessed(path: Path) -> bool:
    if path.suffix != ".parquet" or not path.is_file():
        return False
    import pyarrow.parquet as pq
    try:
        return "prompt_ids" in pq.read_schema(path).names
    except Exception:
        return False


CACHE_FORMAT = 3  # bump when preprocessing changes what it writes for the same inputs

# The files of a tokenizer directory that shape its ids and its chat template. config.json is in:
# AutoTokenizer reads it when tokenizer_config.json does not name the tokenizer class.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "chat_template.json", "chat_template.jinja", "config.json")


def tokenizer_files(tokenizer_dir: str | Path) -> list[Path]:
    """The files of a tokenizer directory that shape preprocessing (`TOKENIZER_FILES`, then any
    ``additional_chat_templates/*.jinja``); [] when it is not a directory."""
    d = Path(tokenizer_dir)
    if not d.is_dir():
        return []
    extra = sorted((d / "additional_chat_templates").glob("*.jinja"))
    return [d / n for n in TOKENIZER_FILES if (d / n).is_file()] + extra


def _hash_files(h, files: Iterable[Path], base: Optional[Path] = None) -> None:
    """Feed each file's name and content (streamed) into ``h``."""
    for f in files:
        name = str(f.relative_to(base)) if base is not None else str(f.resolve())
        h.update(f"\0{name}\0{f.stat().st_size}\0".encode())
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)


def cache_key(path: str, settings: dict, tokenizer_dir: str, templates_file: str = "") -> str:
    """Hash of the content of everything that shapes the preprocessed output of ``path``: its data
    files, the tokenizer's files, the templates (built-in and ``templates_file``) and ``settings``."""
    from verirl.data.templates import BUILTIN_FILE

    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"format": CACHE_FORMAT, **settings}, sort_keys=True, default=str).encode())
    _hash_files(h, list_files(path))
    h.update(b"\0tokenizer")
    _hash_files(h, tokenizer_files(tokenizer_dir), base=Path(tokenizer_dir))
    h.update(b"\0templates")
    _hash_files(h, [BUILTIN_FILE] + ([Path(templates_file)] if templates_file and Path(templates_file).is_file()
                                     else []))
    return h.hexdigest()


# PreprocessConfig fields that do not change the output, so not in the cache key (the input is
# hashed by content; the templates file by content too, not by its path).
_NOT_IN_KEY = ("input", "output_prefix", "workers", "log_interval", "templates_file")


def _source_row(path: str, i: int) -> str:
    """'FILE row R' of the ``i``-th row of the raw data under ``path``: the cache of raw files holds
    every row of them, in order (bad rows stop preprocessing on the fly)."""
    from verirl.data.load import read_rows

    for k, (f, r, _) in enumerate(read_rows(path)):
        if k == i:
            return f"{f} row {r}"
    return f"{path} row {i}"


def load_prompts(path: str, tokenizer_path: str, *, prompt_type: str, templates_file: str, handler_name: str,
                 map_keys: dict, additional_keys: list[str], max_prompt_length: int, too_long: str,
                 cache_dir: Optional[str] = None) -> LoadedData:
    """Prompts from a preprocessed ``.parquet`` or raw files, checked against the tokenizer at
    ``tokenizer_path``. Raw files are preprocessed once into ``CACHE/data`` (``CACHE`` is
    ``cache_dir`` if given, else `verirl.core.cache.cache_root`) under a key from `cache_key`."""
    import pyarrow.parquet as pq

    from verirl.config import PreprocessConfig
    from verirl.data.preprocess import preprocess
    from verirl.models.load import resolve_path

    p = Path(path)
    tokenizer_dir = resolve_path(tokenizer_path)
    raw = not _is_preprocessed(p)
    if raw:
        keys = list(dict.fromkeys(["labels", *additional_keys]))
        pcfg = PreprocessConfig(input=path, tokenizer_name_or_path=tokenizer_path, handler_name=handler_name,
                                prompt_type=prompt_type, templates_file=templates_file, map_keys=dict(map_keys),
                                dataset_additional_keys=keys, on_bad_row="error")
        settings = {k: v for k, v in asdict(pcfg).items() if k not in _NOT_IN_KEY}
        root = (Path(cache_dir) if cache_dir else cache_root()) / "data"
        prefix = root / f"{p.stem}-{cache_key(path, settings, tokenizer_dir, templates_file)}"
        if not Path(str(prefix) + ".manifest.json").exists():  # written last: the output is whole
            pcfg.output_prefix = str(prefix)
            preprocess(pcfg)
        p = Path(str(prefix) + ".parquet")
    manifest_path = p.with_name(p.name[: -len(".parquet")] + ".manifest.json")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    table = pq.read_table(p)
    if "labels" not in table.column_names:
        raise DataError(f"{p}: no 'labels' column, so the verifiers have no ground truth. Preprocess with "
                         f"dataset_additional_keys including labels.")
    check_prompt_ids(table, p, tokenizer_path, tokenizer_dir, manifest)
    prompts, dropped = [], 0
    for i, row in enumerate(table.to_pylist()):
        ids = row.pop("prompt_ids")
        if len(ids) > max_prompt_length:
            if too_long == "error":
                where = _source_row(path, i) if raw else f"{p} row {i}"
                raise DataError(f"{where}: prompt is {len(ids)} tokens, over data.max_prompt_length="
                                f"{max_prompt_length}. Raise it, or set data.too_long=filter to drop such rows.")
            dropped += 1
            continue
        label = row.pop("labels")
        if label is None or isinstance(label, (list, dict)):
            raise DataError(f"{p} row {i}: label {'null' if label is None else repr(label)[:40]} is not one text "
                            f"or number, so the verifiers have no ground truth to compare with. Fix the data "
                            f"(one answer per row).")
        task = row.get("task") or row.get("data_source") or "default"
        prompts.append(Prompt(messages=[], label=str(label), task=str(task), ids=list(ids), extra=row))
    if not prompts:
        raise DataError(f"{path}: no usable prompts ({dropped} over data.max_prompt_length={max_prompt_length}).")
    return LoadedData(prompts, list(manifest.get("stop_words") or []), bool(manifest.get("replace_eos")),
                      dropped, str(p))


def data_loading_options(data: DataConfig, too_long: str) -> dict:
    """`load_prompts`' keyword arguments from the data config: template, handler, keys, length limit."""
    return dict(prompt_type=data.prompt_type, templates_file=data.templates_file, handler_name=data.handler_name,
                map_keys=data.map_keys, additional_keys=list(data.dataset_additional_keys),
                max_prompt_length=data.max_prompt_length, too_long=too_long)


def load_data(data: DataConfig, eval_size: int, lm) -> tuple[list[Prompt], list[Prompt], list[int]]:
    """(train prompts, the built-in task's held-out prompts (empty for files), stop ids) from the
    built-in task or the user's files."""
    stop_ids = lm.stop_ids
    if not data.train_path:
        generated, val = TASKS[data.task](data.seed, data.train_size, eval_size)
        train = encode_prompts(generated, lm.tokenizer, data.max_prompt_length, f"{data.task} train", data.too_long)
        val = encode_prompts(val, lm.tokenizer, data.max_prompt_length, f"{data.task} val", data.too_long)
        dropped, source = len(generated) - len(train), f"the built-in {data.task} task"
    else:
        loaded = load_prompts(data.train_path, lm.path, **data_loading_options(data, data.too_long))
        train, val, dropped, source = loaded.prompts, [], loaded.too_long, loaded.source
        if loaded.stop_words:  # the template's stop words end a response (replace_eos: instead of the EOS)
            stop_ids = _stop_word_ids(loaded.stop_words, loaded.replace_eos, lm)
    if not train:
        raise DataError(f"data: every prompt of {source} is over data.max_prompt_length={data.max_prompt_length}.")
    if dropped:
        print(f"data: dropped {dropped} prompts over data.max_prompt_length={data.max_prompt_length} from {source}")
    return train, val, stop_ids


def _stop_word_ids(words: list[str], replace_eos: bool, lm) -> list[int]:
    ids = []
    for w in words:
        tok = lm.tokenizer(w, add_special_tokens=False)["input_ids"]
        if len(tok) != 1:
            raise DataError(f"template stop word {w!r} is {len(tok)} tokens in {lm.path}'s tokenizer; "
                            f"stop words must be single tokens.")
        ids.append(tok[0])
    return sorted(set(ids) if replace_eos else set(ids) | set(lm.stop_ids))
