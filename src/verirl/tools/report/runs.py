"""Reading what a training run wrote into its directory, for `verirl report`.

RUN_DIR/metrics.jsonl (required; read by `verirl.tools.align.compare_runs.load_run`, so both commands
see a run the same way: rows merged by step, nested objects flattened, a line cut off by a killed
writer skipped), RUN_DIR/config.yaml (the resolved config), RUN_DIR/summary.json (written when
the run ends) and RUN_DIR/rollouts.jsonl (trainer.dump_rollouts=true: one line per response).
Only the last three may be missing; the page says so."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from verirl.tools.align.compare_runs import Run, load_run
from verirl.core.errors import DataError
from verirl.run.jsonl import read_lines
from verirl.run.rundir import metrics_file

TEXT_CAP = 3000  # characters of a prompt or response kept for the page (a 4k-token answer is ~16 kB)


@dataclass
class Sample:
    """One response of rollouts.jsonl, as the page shows it."""
    step: int
    task: str
    reward: float
    scores: dict[str, Optional[float]]  # rule -> score, None where the rule does not apply
    prompt: str
    response: str
    label: str
    response_length: Optional[int]
    stopped: Optional[bool]
    turns: list = None  # a multi-turn episode's (role, text) segments; None for a single-turn response


@dataclass
class StepSamples:
    """The best and the worst response (by reward) of one logged step, out of ``count``."""
    step: int
    best: Sample
    worst: Sample
    count: int


@dataclass
class RunData:
    path: Path  # the run directory
    name: str  # for legends and headings: the directory's name (more of the path if two runs share it)
    metrics: Run
    config_text: Optional[str]  # config.yaml as written; None when absent
    summary: Any  # summary.json parsed; None when absent or unreadable
    samples: list[StepSamples] = field(default_factory=list)
    sample_steps: int = 0  # logged steps in rollouts.jsonl (samples shows at most the asked number of them)
    has_rollouts: bool = False
    notes: list[str] = field(default_factory=list)

    def curve(self, key: str) -> dict[int, float]:
        """step -> finite value of ``key`` (empty when the run never logged it)."""
        return self.metrics.curve(key)[0]

    def keys(self) -> set[str]:
        return {k for row in self.metrics.steps.values() for k in row}

    def train_steps(self) -> int:
        """Logged steps with a training metric (step 0, the evaluation before training, is not one)."""
        return sum(1 for row in self.metrics.steps.values() if any(not k.startswith("val/") for k in row))


def _metrics_file(path: Path) -> Path:
    """RUN_DIR/metrics.jsonl, or a `DataError` that names the path and the fix."""
    if not path.exists():
        raise DataError(f"{path}: no such run directory. Give the directory a training run wrote "
                        f"(its trainer.run_dir, e.g. runs/tiny_grpo/20260101-120000), which holds metrics.jsonl.")
    if path.is_file():
        if path.name == "metrics.jsonl":
            return path
        raise DataError(f"{path} is a file, not a run directory. Give the directory a training run wrote "
                        f"(its trainer.run_dir), which holds metrics.jsonl.")
    file = metrics_file(path)
    if not file.is_file():
        found = sorted((p.parent for p in path.glob("*/metrics.jsonl")), key=lambda p: p.stat().st_mtime)
        hint = (f" It holds run directories: {', '.join(p.name for p in found[-6:])}"
                f"{' (and more)' if len(found) > 6 else ''}; give one of those, e.g. the newest: {found[-1]}."
                if found else " Give the directory of a training run (its trainer.run_dir); a run writes "
                              "metrics.jsonl when it starts (the evaluation before training, step 0) and after "
                              "each step.")
        raise DataError(f"{path} has no metrics.jsonl, so it is not a run directory (or the run has not logged "
                        f"anything yet).{hint}")
    size = file.stat().st_size
    if size == 0 or (size < 4096 and not file.read_text(encoding="utf-8", errors="replace").strip()):
        raise DataError(f"{file} is empty: the run has logged nothing yet (it writes a line after the evaluation "
                        f"before training and after each step). Wait for its first step, or give another run.")
    return file


def load(path: str, name: str, samples: int) -> RunData:
    """Read the run directory ``path``: its metrics, config, summary, and the best and worst response of
    at most ``samples`` evenly spaced logged steps of rollouts.jsonl (0: none)."""
    file = _metrics_file(Path(path))
    run_dir = file.parent
    metrics = load_run(str(file), name)
    data = RunData(run_dir, name, metrics, None, None, notes=list(metrics.notes))
    config = run_dir / "config.yaml"
    if config.is_file():
        data.config_text = config.read_text(encoding="utf-8", errors="replace")
    else:
        data.notes.append("no config.yaml in the run directory")
    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            data.summary = json.loads(summary.read_text(encoding="utf-8", errors="replace"))
        except json.JSONDecodeError as e:
            data.notes.append(f"summary.json is not valid JSON ({e.msg}, line {e.lineno}); not shown")
    else:
        data.notes.append("no summary.json: the run has not finished, or stopped before writing it")
    rollouts = run_dir / "rollouts.jsonl"
    if rollouts.is_file():
        data.has_rollouts = True
        if samples > 0:
            data.samples, data.sample_steps, bad = read_samples(rollouts, samples)
            if bad:
                data.notes.append(f"rollouts.jsonl: {bad} line(s) that are not a response record skipped")
    return data


def _cap(text: Any) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= TEXT_CAP else f"{text[:TEXT_CAP]}… ({len(text) - TEXT_CAP} more characters)"


def _sample(row: dict) -> Optional[Sample]:
    step, reward = row.get("step"), row.get("reward")
    if not isinstance(step, int) or isinstance(reward, bool) or not isinstance(reward, (int, float)) \
            or not math.isfinite(reward):
        return None
    scores = row.get("scores") if isinstance(row.get("scores"), dict) else {}
    length = row.get("response_length")
    return Sample(step=step, task=str(row.get("task") or ""), reward=float(reward),
                  scores={str(k): (v if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
                          for k, v in scores.items()},
                  prompt=_cap(row.get("prompt")), response=_cap(row.get("response")), label=_cap(row.get("label")),
                  response_length=length if isinstance(length, int) else None,
                  stopped=row.get("stopped") if isinstance(row.get("stopped"), bool) else None,
                  turns=_turns(row.get("turns")))


def _turns(turns: Any) -> Optional[list]:
    """A multi-turn record's turns as (role, text) pairs, each text capped; None when there are none."""
    if not isinstance(turns, list) or not turns:
        return None
    out = [(str(t.get("role", "")), _cap(t.get("text"))) for t in turns[:64] if isinstance(t, dict)]
    return out or None


def read_samples(path: Path, most: int) -> tuple[list[StepSamples], int, int]:
    """(best and worst response of at most ``most`` evenly spaced steps, the steps logged, lines skipped).

    One pass, line by line: a long run's dump can be gigabytes, so only each step's current best and
    worst are kept (texts capped at `TEXT_CAP`). Ties keep the first best and the last worst, so a step
    whose responses all score the same still shows two different ones."""
    best: dict[int, Sample] = {}
    worst: dict[int, Sample] = {}
    count: dict[int, int] = {}
    bad = 0
    for _, row in read_lines(path, errors="replace"):
        sample = _sample(row) if isinstance(row, dict) else None  # a BadLine: cut off by a killed writer, or not ours
        if sample is None:
            bad += 1
            continue
        s = sample.step
        count[s] = count.get(s, 0) + 1
        if s not in best or sample.reward > best[s].reward:
            best[s] = sample
        if s not in worst or sample.reward <= worst[s].reward:
            worst[s] = sample
    steps = sorted(count)
    return [StepSamples(s, best[s], worst[s], count[s]) for s in evenly_spaced(steps, most)], len(steps), bad


def evenly_spaced(items: list, most: int) -> list:
    """At most ``most`` of ``items``, evenly spaced, the first and the last included.

    >>> evenly_spaced(list(range(1, 101)), 4)
    [1, 34, 67, 100]
    >>> evenly_spaced([5, 6], 10)
    [5, 6]
    """
    if most <= 0:
        return []
    if len(items) <= most:
        return list(items)
    if most == 1:
        return [items[-1]]
    picks = sorted({round(i * (len(items) - 1) / (most - 1)) for i in range(most)})
    return [items[i] for i in picks]


def names(paths: list[str]) -> list[str]:
    """A short, distinct name per run directory: its own name, or more of its path where two share one.

    >>> names(["runs/a/1", "runs/b/2"])
    ['1', '2']
    >>> names(["runs/a/x", "runs/b/x"])
    ['a/x', 'b/x']
    """
    full = [Path(p).resolve() for p in paths]
    full = [p.parent if p.name == "metrics.jsonl" else p for p in full]
    for depth in range(1, 1 + max(len(p.parts) for p in full)):
        out = ["/".join(p.parts[-depth:]) for p in full]
        if len(set(out)) == len(out):
            return out
    return [f"{p} ({i + 1})" for i, p in enumerate(out)]  # the same directory given twice
