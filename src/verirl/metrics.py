"""Timers, pure metric functions and the metrics sinks (JSONL file, console)."""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import torch



class Timer:
    """``with timer("rollout"): ...`` accumulates seconds under ``timing/rollout``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self, names: tuple[str, ...] = ()) -> dict[str, float]:
        out = {f"timing/{k}": 0.0 for k in names}
        out.update({f"timing/{k}": v for k, v in self.seconds.items()})
        return out


def length_metrics(response_lengths: torch.Tensor, prompt_lengths: torch.Tensor,
                   stopped: torch.Tensor) -> dict[str, float]:
    """response_lengths, prompt_lengths (N,) tokens; stopped (N,) bool: ended on a stop token."""
    resp = response_lengths.float()
    prompt = prompt_lengths.float()
    return {
        "response_length/mean": float(resp.mean()), "response_length/max": float(resp.max()),
        "response_length/min": float(resp.min()),
        # fraction of responses cut at max_new_tokens without a stop token
        "response_length/clip_ratio": float((~stopped.bool()).float().mean()),
        "prompt_length/mean": float(prompt.mean()), "prompt_length/max": float(prompt.max()),
    }


def throughput(prompt_len_mean: float, response_len_mean: float, prompts: int, n: int,
               world_size: int, seconds: float) -> float:
    """perf/tps = (mean prompt len + mean response len) * prompts * n / world size / step seconds."""
    return (prompt_len_mean + response_len_mean) * prompts * n / world_size / max(seconds, 1e-9)


def advantage_metrics(adv: torch.Tensor, rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    groups = rewards.view(-1, group_size)
    solved_none = (groups.max(1).values == groups.min(1).values).float().mean()
    return {"adv/mean": float(adv.mean()), "adv/max": float(adv.max()), "adv/min": float(adv.min()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "reward/zero_std_groups": float(solved_none)}  # groups that teach nothing (all rewards equal)


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


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mean_of(records: list[dict], key: str, first: Optional[int] = None, last: Optional[int] = None) -> float:
    rows = records[:first] if first else records[-last:] if last else records
    vals = [r[key] for r in rows if key in r]
    return sum(vals) / len(vals) if vals else float("nan")
