"""Reading raw data sets: JSON, JSONL, Parquet and Arrow files, or a folder of them.

Rows come out as ``(file, row_number, dict)``; row numbers are 0-based data rows (for
JSONL, the line number is reported in errors too). A bad file or line is a `RowError`
naming the file and the line; `read_rows` either raises it or, with ``skip_bad=True``,
counts it and goes on. JSON and JSONL files must be UTF-8 (a byte-order mark is allowed);
bytes that are not are reported with the line they are on (``not_utf8``).
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

from verirl.core.errors import DataError

SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}


class RowError(DataError):
    """A row or file that cannot be used; ``reason`` is the short key it is counted under."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # pickles as (message, reason), e.g. from a worker process
        return (type(self), (str(self), self.reason))


def list_files(path: str | Path) -> list[Path]:
    p = Path(path)
    if not p.exists():
        raise DataError(f"input '{path}' does not exist. Give a .json, .jsonl, .parquet or .arrow file, "
                                f"or a folder of them.")
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
        if not files:
            raise DataError(f"input folder '{path}' holds no .json, .jsonl, .parquet or .arrow file.")
        return files
    if p.suffix not in SUFFIXES:
        raise DataError(f"input '{path}': unknown file type '{p.suffix}'; use .json, .jsonl, .parquet or .arrow.")
    return [p]


SAVE_AS_UTF8 = ("JSON and JSONL data must be UTF-8: save the file as UTF-8 (e.g. "
                "`iconv -f LATIN1 -t UTF-8 in.jsonl > out.jsonl`, naming the file's real encoding).")


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # what surrogateescape turns a non-UTF-8 byte into


def _undecodable(line: str) -> Optional[int]:
    """Index of the first character that stands for a byte that was not UTF-8, or None."""
    m = _ESCAPED_BYTE.search(line)
    return m.start() if m else None


def _utf16_hint(f: Path, line_no: int) -> str:
    if line_no == 1:
        with open(f, "rb") as fh:
            if fh.read(2) in (b"\xff\xfe", b"\xfe\xff"):
                return "; the file starts with a UTF-16 byte-order mark, so it is UTF-16"
    return ""


def _arrow_table(f: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if f.suffix == ".parquet":
        return pq.read_table(f)
    with pa.memory_map(str(f)) as source:  # Arrow IPC: stream (as `datasets` writes) or file format
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()


def _rows_of(f: Path) -> Iterator[tuple[int, dict]]:
    kind = SUFFIXES[f.suffix]
    if kind == "jsonl":
        # surrogateescape: a byte that is not UTF-8 becomes one character in U+DC80..U+DCFF, so a bad
        # line can be named (and skipped) while the rest of the file is read.
        with open(f, encoding="utf-8", errors="surrogateescape") as fh:
            n = 0
            for line_no, line in enumerate(fh, start=1):
                if line_no == 1:
                    line = line.removeprefix("\ufeff")
                bad = _undecodable(line)
                if bad is not None:
                    yield n, RowError(f"{f} line {line_no}: not valid UTF-8 (byte 0x{ord(line[bad]) - 0xDC00:02x} at "
                                      f"column {bad + 1}){_utf16_hint(f, line_no)}. {SAVE_AS_UTF8}", "not_utf8")
                    n += 1
                    continue
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    yield n, RowError(f"{f} line {line_no}: invalid JSON ({e.msg} at column {e.colno}).",
                                      "invalid_json")
                    n += 1
                    continue
                if not isinstance(obj, dict):
                    yield n, RowError(f"{f} line {line_no}: expected a JSON object, got {type(obj).__name__}.",
                                      "not_an_object")
                else:
                    yield n, obj
                n += 1
    elif kind == "json":
        raw = f.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            line = raw.count(b"\n", 0, e.start) + 1
            yield 0, RowError(f"{f} line {line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte offset "
                              f"{e.start} of the file){_utf16_hint(f, line)}. {SAVE_AS_UTF8}", "not_utf8")
            return
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            yield 0, RowError(f"{f} line {e.lineno}: invalid JSON ({e.msg}).", "invalid_json")
            return
        if isinstance(data, dict):  # {"data": [...]} or a single record
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        for i, obj in enumerate(data):
            yield i, obj if isinstance(obj, dict) else RowError(
                f"{f} row {i}: expected a JSON object, got {type(obj).__name__}.", "not_an_object")
    else:
        try:
            table = _arrow_table(f)
        except Exception as e:  # pyarrow raises several types for a damaged file
            yield 0, RowError(f"{f}: cannot be read as {kind} ({type(e).__name__}: {e}). Check the file is "
                              f"complete and really {kind}.", "unreadable_file")
            return
        for i, obj in enumerate(table.to_pylist()):
            yield i, obj


def read_rows(path: str | Path, skip_bad: bool = False, skipped: Optional[Counter] = None
              ) -> Iterator[tuple[str, int, dict]]:
    """Every row of every file under ``path``, in file order."""
    for f in list_files(path):
        for i, row in _rows_of(f):
            if isinstance(row, RowError):
                if not skip_bad:
                    raise row
                if skipped is not None:
                    skipped[row.reason] += 1
                continue
            yield str(f), i, row
