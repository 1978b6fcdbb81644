"""`verirl preprocess`: raw data set -> tokenized prompts + the keys the rewards need.

The config keys (`verirl.config.PreprocessConfig`) are MindSpeed-RL's, so its data configs carry over:
``input``, ``tokenizer_name_or_path``, ``output_prefix``, ``handler_name``, ``tokenizer_type``,
``workers``, ``log_interval``, ``prompt_type``, ``map_keys``, ``dataset_additional_keys``.

Handlers
* ``R1AlpacaStyleInstructionHandler`` (alias ``instruction``): prompt [+ "\\n" + query]
  (+ system) -> templated prompt ids; ``labels`` = the response field (the ground truth).
* ``VerlParquetHandler`` (alias ``verl``): veRL's rows: ``prompt`` is a list of chat
  messages, ``labels`` = ``reward_model.ground_truth``, ``task`` = ``ability``.

Output: ``PREFIX.parquet`` (``prompt_ids``, ``prompt``, ``labels`` and every additional key)
and ``PREFIX.manifest.json`` (source files, counts, tokenizer, template, the config), the
manifest written last.

With ``workers >= 2`` rows are tokenized in spawned processes, in chunks, and the results
come back in order. A bad row crosses the process boundary as plain data (its message and
reason) and is rebuilt as a `RowError` here; a worker that dies (killed, out of memory, a
crash in a native library) is a `DataError` naming the rows that were being processed.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time
from collections import Counter, deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from verirl.config import PreprocessConfig
from verirl.data.load import RowError, list_files, read_rows
from verirl.core.errors import ConfigError, DataError
from verirl.core.registry import Registry

HANDLERS = Registry("data.handler_name", {"R1AlpacaStyleInstructionHandler": "instruction", "instruction": "instruction",
                                          "VerlParquetHandler": "verl", "verl": "verl"})
DEFAULT_MAP = {"instruction": {"prompt": "problem", "query": "", "response": "answer", "system": ""},
               "verl": {"prompt": "prompt", "query": "", "response": "reward_model.ground_truth", "system": ""}}


def get_field(row: dict, path: str) -> Any:
    """``row['a']['b']`` for path 'a.b'; KeyError naming the missing part."""
    cur: Any = row
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(part)
        cur = cur[part]
    return cur


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(where: str, what: str, text: str) -> None:
    """A str that cannot be written as UTF-8 (a lone surrogate, e.g. from the JSON escape "\\ud800"
    without its pair) can be neither tokenized nor saved: a bad row, not a crash."""
    m = _SURROGATE.search(text)
    if m:
        near = text[max(0, m.start() - 20): m.start() + 20]
        raise RowError(f"{where}: {what} holds a lone surrogate U+{ord(m.group()):04X} (in {near!r}), "
                       f"which is not valid Unicode text (e.g. a JSON escape \\u{ord(m.group()):04x} without its "
                       f"pair), so it cannot be tokenized or saved. Fix the data, or set on_bad_row=skip to count "
                       f"and drop such rows.", "encoding_error")


def _label_text(where: str, src: str, v: Any) -> str:
    """A label is text: a number or a boolean becomes its text (``4`` -> ``"4"``); a list, a dict or a
    null has no one text the rules could compare with, so it is a bad row."""
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float, bool)):
        return str(v)
    what = "null" if v is None else f"a {type(v).__name__} {json.dumps(v, default=str)[:40]}"
    raise RowError(f"{where}: label key '{src}' (map_keys.response) is {what}; a label must be one text or "
                   f"number (the ground truth the verifiers compare with). Fix the data, or set on_bad_row=skip "
                   f"to count and drop such rows.", "bad_label")


def _as_column(v: Any) -> Any:
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return json.dumps(v, ensure_ascii=False, default=str)


class RowProcessor:
    """Turns chunks of raw rows into output records or `RowError`s, in order. Built once per worker."""

    def __init__(self, cfg: PreprocessConfig):
        from verirl.data.templates import get_template
        from verirl.models.load import resolve_path
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.kind = HANDLERS[cfg.handler_name]
        self.map = {**DEFAULT_MAP[self.kind], **{k: v for k, v in cfg.map_keys.items()}}
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_path(cfg.tokenizer_name_or_path))
        self.template = None if cfg.prompt_type == "tokenizer" else get_template(
            cfg.prompt_type, cfg.templates_file or None)

    def _field(self, row: dict, canon: str, where: str, required: bool) -> Any:
        src = self.map.get(canon) or ""
        if not src:
            return None
        try:
            return get_field(row, src)
        except KeyError as e:
            if not required:
                return None
            raise RowError(f"{where}: key '{src}' (map_keys.{canon}) is missing at '{e.args[0]}'; the row has "
                           f"keys {sorted(row)[:12]}. Fix map_keys.{canon} or the data.", f"missing_{canon}") from None

    def _messages(self, row: dict, where: str) -> list[dict]:
        prompt = self._field(row, "prompt", where, required=True)
        if self.kind == "verl" and isinstance(prompt, list):
            msgs = prompt
            if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
                raise RowError(f"{where}: key '{self.map['prompt']}' must be a list of {{role, content}} "
                               f"messages.", "bad_prompt_type")
            if not "".join(m["content"] for m in msgs).strip():
                raise RowError(f"{where}: key '{self.map['prompt']}' (map_keys.prompt) is empty.", "empty_prompt")
            return [dict(role=str(m.get("role", "user")), content=m["content"]) for m in msgs]
        if not isinstance(prompt, str):
            raise RowError(f"{where}: key '{self.map['prompt']}' (map_keys.prompt) must be a string, got "
                           f"{type(prompt).__name__} {str(prompt)[:40]!r}.", "bad_prompt_type")
        query = self._field(row, "query", where, required=True)
        if query:
            prompt = f"{prompt}\n{query}"
        if not prompt.strip():
            raise RowError(f"{where}: key '{self.map['prompt']}' (map_keys.prompt) is empty.", "empty_prompt")
        msgs = [{"role": "user", "content": prompt}]
        system = self._field(row, "system", where, required=False)
        if isinstance(system, str) and system:
            msgs.insert(0, {"role": "system", "content": system})
        return msgs

    def _encode(self, texts: list[str]) -> list[list[int]]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer directly: same ids, without the per-row Python wrapping
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def render(self, messages: list[dict]) -> str:
        if self.template is None:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.template.render(messages, self.tokenizer.bos_token or "", self.tokenizer.eos_token or "")

    def _encode_rows(self, texts: list[str], wheres: list[str]) -> list[list[int] | RowError]:
        """`_encode`, and should the batch fail, each text alone: a text the tokenizer refuses is a bad row."""
        try:
            return list(self._encode(texts))
        except Exception:  # find the row(s) at fault below
            pass
        out: list[list[int] | RowError] = []
        for text, where in zip(texts, wheres):
            try:
                out.append(self._encode([text])[0])
            except Exception as e:  # the tokenizer's own error types vary
                out.append(RowError(f"{where}: the tokenizer cannot encode this prompt ({type(e).__name__}: {e}). "
                                    f"Fix the data, or set on_bad_row=skip to count and drop such rows.",
                                    "encoding_error"))
        return out

    def chunk(self, items: list[tuple[str, int, dict]]) -> list[dict | RowError]:
        """Process rows in order; tokenization is one batched call (the Rust tokenizer's fast path)."""
        out: list[dict | RowError] = []
        for f, i, row in items:
            try:
                out.append(self.fields(f"{f} row {i}", row))
            except RowError as e:
                out.append(e)
        good = [k for k, r in enumerate(out) if not isinstance(r, RowError)]
        ids = self._encode_rows([out[k]["prompt"] for k in good],  # type: ignore[index]
                                [f"{items[k][0]} row {items[k][1]}" for k in good]) if good else []
        limit = self.cfg.max_prompt_length
        for k, x in zip(good, ids):
            if isinstance(x, RowError):
                out[k] = x
            elif limit and len(x) > limit:
                f, i, _ = items[k]
                out[k] = RowError(f"{f} row {i}: prompt is {len(x)} tokens, over max_prompt_length={limit}.",
                                  "too_long")
            else:
                out[k]["prompt_ids"] = x  # type: ignore[index]
        return out

    def kept_keys(self, row: dict) -> list[str]:
        """The configured dataset_additional_keys; veRL rows also keep their ``data_source`` and their
        ``ability`` (as ``task``) whenever they have them, as veRL users expect: rewards routed by
        task and metrics per data source, without listing the keys."""
        keys = list(self.cfg.dataset_additional_keys)
        if self.kind == "verl":
            keys += [k for k, present in (("data_source", "data_source" in row),
                                          ("task", "task" in row or "ability" in row)) if present and k not in keys]
        return keys

    def fields(self, where: str, row: dict) -> dict:
        """Everything but the token ids: the templated prompt text and the kept keys."""
        text = self.render(self._messages(row, where))
        _check_text(where, "the prompt", text)
        out: dict[str, Any] = {"prompt_ids": None, "prompt": text}
        for key in self.kept_keys(row):
            if key == "labels":
                val = _label_text(where, self.map["response"], self._field(row, "response", where, required=True))
            elif self.kind == "verl" and key == "task" and "task" not in row:
                val = row.get("ability")
            else:
                try:
                    val = get_field(row, key)
                except KeyError:
                    raise RowError(f"{where}: additional key '{key}' (dataset_additional_keys) is missing; the row "
                                   f"has keys {sorted(row)[:12]}.", f"missing_{key}") from None
            out[key] = _as_column(val)
            if isinstance(out[key], str):
                _check_text(where, f"key '{key}' (dataset_additional_keys)", out[key])
        return out


_WORKER: Optional[RowProcessor] = None


def _init_worker(cfg: PreprocessConfig) -> None:
    global _WORKER
    _WORKER = RowProcessor(cfg)


def _process_chunk(chunk: list[tuple[str, int, dict]]) -> list[dict | tuple[str, str]]:
    """Records as dicts, bad rows as plain ``(message, reason)`` tuples: only plain data crosses
    the process boundary, so the parent never depends on unpickling an exception."""
    assert _WORKER is not None
    return _plain(_WORKER.chunk(chunk))


def _plain(results: list[dict | RowError]) -> list[dict | tuple[str, str]]:
    return [(str(r), r.reason) if isinstance(r, RowError) else r for r in results]


def _rebuild(results: list[dict | tuple[str, str]]) -> list[dict | RowError]:
    return [RowError(*r) if isinstance(r, tuple) else r for r in results]


def _span(chunks: list[list[tuple[str, int, dict]]]) -> str:
    """'a.jsonl rows 64-191', or 'a.jsonl row 1000 to b.jsonl row 63': the rows of these chunks."""
    (f0, r0, _), (f1, r1, _) = chunks[0][0], chunks[-1][-1]
    return f"{f0} rows {r0}-{r1}" if f0 == f1 else f"{f0} row {r0} to {f1} row {r1}"


def _write_atomically(path: Path, write) -> None:
    """``write(tmp)`` then rename onto ``path``: a reader never sees half a file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _run_in_workers(cfg: PreprocessConfig, chunks, consume, progress) -> None:
    """Chunks to ``cfg.workers`` spawned processes, at most two each in flight; results to ``consume`` in order."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn"),  # tokenizers and fork do not mix
                               initializer=_init_worker, initargs=(cfg,))
    pending: deque = deque()  # (future, chunk), in input order

    def died() -> DataError:
        return DataError(
            f"preprocess: a worker process died while {_span([c for _, c in pending])} were being tokenized "
            f"(workers={cfg.workers}): it was killed (e.g. for memory: lower workers) or crashed in a native "
            f"library. Re-run with workers=1 to see the error of the row at fault.")

    def take() -> None:
        fut, _ = pending[0]
        while True:
            try:
                results = fut.result(timeout=1.0)
                break
            except BrokenProcessPool:
                raise died() from None
            except FutureTimeout:  # a worker killed while it started can leave the pool waiting: look
                if any(p.exitcode not in (None, 0) for p in list(getattr(pool, "_processes", {}).values())):
                    raise died() from None
        pending.popleft()
        consume(results)
        progress()

    finished = False
    try:
        for ch in chunks:
            try:
                pending.append((pool.submit(_process_chunk, ch), ch))
            except BrokenProcessPool:  # a worker died before this chunk could even be handed out
                pending.append((None, ch))
                raise died() from None
            while len(pending) >= 2 * cfg.workers:
                take()
        while pending:
            take()
        finished = True
    finally:
        if not finished:  # an error, a dead worker (which the pool may not notice), Ctrl-C: end the workers
            for p in list(getattr(pool, "_processes", {}).values()):
                p.kill()
        pool.shutdown(wait=finished, cancel_futures=True)


def _table(records: list[dict]):
    """The output table; a kept key whose values are of several types (an integer ``task`` among strings)
    is a `DataError` naming the key and the types, not pyarrow's."""
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(records)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        for key in records[0]:
            kinds = sorted({type(r.get(key)).__name__ for r in records if r.get(key) is not None})
            if len(kinds) > 1:
                raise DataError(f"preprocess: key '{key}' (dataset_additional_keys) holds values of several types "
                                f"({', '.join(kinds)}), and a column has one. Make them one type in the data (e.g. "
                                f"all strings).") from None
        raise


def validate_preprocess(cfg: PreprocessConfig) -> None:
    if not cfg.input:
        raise ConfigError("preprocess: 'input' is empty: give a data file or folder.")
    if not cfg.output_prefix:
        raise ConfigError("preprocess: 'output_prefix' is empty: give a path prefix, e.g. data/math/train.")
    HANDLERS.check(cfg.handler_name, "handler_name")
    if cfg.tokenizer_type not in ("HuggingFaceTokenizer", "hf"):
        raise ConfigError(f"preprocess: tokenizer_type={cfg.tokenizer_type!r}: only HuggingFaceTokenizer is supported.")
    if cfg.on_bad_row not in ("error", "skip") or cfg.too_long not in ("filter", "error"):
        raise ConfigError("preprocess: on_bad_row must be error|skip and too_long must be filter|error.")
    unknown = set(cfg.map_keys) - {"prompt", "query", "response", "system"}
    if unknown:
        raise ConfigError(f"preprocess: map_keys has unknown canonical fields {sorted(unknown)}; "
                          f"use prompt, query, response, system.")
    if cfg.workers < 1:
        raise ConfigError(f"preprocess: workers={cfg.workers} must be >= 1.")


def preprocess(cfg: PreprocessConfig, console=None) -> dict:
    """Run the whole pipeline; returns the manifest (also written next to the output)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from rich.console import Console
    from rich.progress import Progress

    validate_preprocess(cfg)
    template = None  # loaded here too so that a bad prompt_type stops us before any data is read
    if cfg.prompt_type != "tokenizer":
        from verirl.data.templates import get_template
        template = get_template(cfg.prompt_type, cfg.templates_file or None)
    console = console or Console(stderr=True)
    t0 = time.time()
    files = list_files(cfg.input)
    skipped: Counter = Counter()
    skip_bad = cfg.on_bad_row == "skip"
    unparsed: Counter = Counter()  # lines or files read_rows skipped: read, but never rows
    rows = read_rows(cfg.input, skip_bad=skip_bad, skipped=unparsed)
    records: list[dict] = []
    n_read = 0
    chunk_size = max(64, min(cfg.log_interval, 2048))

    def chunks():
        nonlocal n_read
        buf = []
        for item in rows:
            buf.append(item)
            n_read += 1
            if len(buf) >= chunk_size:
                yield buf
                buf = []
        if buf:
            yield buf

    def consume(results: list) -> None:
        for r in _rebuild(results):
            if isinstance(r, RowError):
                if r.reason == "too_long" and cfg.too_long == "filter":
                    skipped["too_long"] += 1
                elif skip_bad and r.reason != "too_long":
                    skipped[r.reason] += 1
                else:
                    raise r
            else:
                records.append(r)

    local = RowProcessor(cfg)  # also with workers: a bad tokenizer or template fails here, with its own message
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("preprocessing", total=None)
        if cfg.workers == 1:
            for ch in chunks():
                consume(_plain(local.chunk(ch)))
                bar.update(task, completed=n_read, description=f"preprocessing: {n_read} rows read")
        else:
            _run_in_workers(cfg, chunks(), consume,
                            lambda: bar.update(task, completed=n_read, description=f"preprocessing: {n_read} rows read"))
    n_read += sum(unparsed.values())
    if not n_read:
        raise DataError(f"data '{cfg.input}' is empty: {', '.join(map(str, files))} "
                        f"{'holds' if len(files) == 1 else 'hold'} no rows. Give a file with at least one row.")
    out = Path(cfg.output_prefix + ".parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    table = _table(records)
    _write_atomically(out, lambda tmp: pq.write_table(table, tmp))
    skipped.update(unparsed)
    manifest = {
        "output": str(out), "source": [str(f) for f in files], "rows_read": n_read, "rows_written": len(records),
        "rows_skipped": sum(skipped.values()), "skipped_by_reason": dict(skipped),
        "tokenizer": cfg.tokenizer_name_or_path, "prompt_type": cfg.prompt_type,
        "stop_words": template.stop_words if template else [], "replace_eos": template.replace_eos if template else False,
        "seconds": round(time.time() - t0, 3), "config": asdict(cfg),
    }
    _write_atomically(Path(cfg.output_prefix + ".manifest.json"),  # last: its presence means the output is whole
                      lambda tmp: tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8"))
    why = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "none"
    console.print(f"preprocess: {n_read} rows read, {len(records)} written, {sum(skipped.values())} skipped "
                  f"({why}) in {manifest['seconds']:.1f}s -> {out}")
    return manifest
