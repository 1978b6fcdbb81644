"""JSON Lines files: the run's append-only logs (flushed per line), cut back to a checkpoint's size,
read back (`read_lines`, the one reader: the run's own logs, and the tools that read other runs')."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, NamedTuple, Optional, Union


class JsonlSink:
    """One JSON object per line, flushed per write so a killed run keeps every finished step."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._f.flush()

    def tell(self) -> int:
        """Bytes written so far (every line flushed): where a resumed run continues."""
        self._f.flush()
        return self._f.tell()

    def close(self) -> None:
        self._f.close()


def truncate(path: Path, size: int) -> int:
    """Cut a log back to ``size`` bytes (the length it had at a checkpoint); a missing file is created.

    Never extends a log: one shorter than ``size`` has lost lines, and padding it would write NUL
    bytes. It is left as it is. Returns the log's size afterwards (``size``, or less)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        end = f.seek(0, os.SEEK_END)
        if size < end:
            f.truncate(size)
            return size
        return end


class BadLine(NamedTuple):
    """A line that is not JSON."""
    error: json.JSONDecodeError
    cut: bool  # the file's last line, without its newline: a writer killed while writing it


def read_lines(path: str | Path, errors: str = "strict") -> Iterator[tuple[int, Union[object, BadLine]]]:
    """(line number, its JSON value or a `BadLine`) for each line that is not blank, streamed (a dump can
    be gigabytes). ``errors``: how bytes that are not UTF-8 are decoded (`open`'s)."""
    with open(path, encoding="utf-8", errors=errors) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as e:
                yield number, BadLine(e, not line.endswith("\n"))


def read_jsonl(path: str | Path) -> list[dict]:
    """Every line's value; a line that is not JSON raises its `json.JSONDecodeError`."""
    out = []
    for _, value in read_lines(path):
        if isinstance(value, BadLine):
            raise value.error
        out.append(value)
    return out


def mean_of(records: list[dict], key: str, first: Optional[int] = None, last: Optional[int] = None) -> float:
    rows = records[:first] if first else records[-last:] if last else records
    vals = [r[key] for r in rows if key in r]
    return sum(vals) / len(vals) if vals else float("nan")
