"""Training prompts from your own files: preprocessed Parquet, or raw files preprocessed on the fly.

A preprocessed file is the ``.parquet`` written by `verirl preprocess` (it has a
``prompt_ids`` column and a ``.manifest.json`` beside it). Anything else is raw and goes
through the same preprocessing, cached under ``$VERIRL_CACHE/data`` (default
``~/.cache/verirl/data``) keyed by the files' sizes and mtimes, the tokenizer and the settings.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from verirl.cache import cache_root
from verirl.data.load import list_files
from verirl.errors import DataError
from verirl.types import Prompt


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


def _cache_key(path: str, settings: dict) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for f in list_files(path):
        st = f.stat()
        h.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def load_prompts(path: str, tokenizer_path: str, *, prompt_type: str, templates_file: str, handler_name: str,
                 map_keys: dict, additional_keys: list[str], max_prompt_length: int, too_long: str,
                 cache_dir: Optional[str] = None) -> LoadedData:
    import pyarrow.parquet as pq

    from verirl.config import PreprocessConfig
    from verirl.data.preprocess import preprocess

    p = Path(path)
    if not _is_preprocessed(p):
        keys = list(dict.fromkeys(["labels", *additional_keys]))
        pcfg = PreprocessConfig(input=path, tokenizer_name_or_path=tokenizer_path, handler_name=handler_name,
                                prompt_type=prompt_type, templates_file=templates_file, map_keys=dict(map_keys),
                                dataset_additional_keys=keys, on_bad_row="error")
        settings = {k: v for k, v in asdict(pcfg).items() if k not in ("input", "output_prefix")}
        root = (Path(cache_dir) if cache_dir else cache_root()) / "data"
        prefix = root / f"{p.stem}-{_cache_key(path, settings)}"
        if not Path(str(prefix) + ".parquet").exists():
            pcfg.output_prefix = str(prefix)
            preprocess(pcfg)
        p = Path(str(prefix) + ".parquet")
    manifest_path = p.with_name(p.name[: -len(".parquet")] + ".manifest.json")
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    table = pq.read_table(p)
    if "labels" not in table.column_names:
        raise DataError(f"{p}: no 'labels' column, so the verifiers have no ground truth. Preprocess with "
                         f"dataset_additional_keys including labels.")
    prompts, dropped = [], 0
    for i, row in enumerate(table.to_pylist()):
        ids = row.pop("prompt_ids")
        if len(ids) > max_prompt_length:
            if too_long == "error":
                raise DataError(f"{p} row {i}: prompt is {len(ids)} tokens, over data.max_prompt_length="
                                 f"{max_prompt_length}. Raise it, or set data.too_long=filter to drop such rows.")
            dropped += 1
            continue
        label = row.pop("labels")
        task = row.get("task") or row.get("data_source") or "default"
        prompts.append(Prompt(messages=[], label=str(label), task=str(task), ids=list(ids), extra=row))
    if not prompts:
        raise DataError(f"{path}: no usable prompts ({dropped} over data.max_prompt_length={max_prompt_length}).")
    return LoadedData(prompts, list(manifest.get("stop_words") or []), bool(manifest.get("replace_eos")),
                      dropped, str(p))
