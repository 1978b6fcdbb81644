"""Compare two training runs' metric curves against a tolerance: PASS (exit 0) or FAIL (exit 1).

For each metric (default reward/mean), over the steps both runs logged it:

  curve      the largest |A - B| between the two curves, each smoothed first with a trailing
             moving average over --smooth K logged steps (K=1, the default: raw values);
  converged  |mean A - mean B| over the last 10% of the common steps (at least one step),
             of the raw values.

A metric passes when curve <= --tol and converged <= --final-tol; the runs pass when every
metric does. The defaults are the bar used in practice for calling a run on one system equal to a run on
another: reward curve within 4%, converged reward within 5%, read as ABSOLUTE errors on a
reward in [0, 1] (0.04 and 0.05 reward units). --relative makes both tolerances fractions of
the metric's full scale instead (the largest |value| of either compared curve), for metrics
not on a 0..1 scale such as response_length/mean.

A run is a verirl run directory (its metrics.jsonl) or a metrics file from another system:
  - JSONL, one object per line with a step key (step, training/global_step or global_step;
    or name one with --step-key); nested objects are flattened with '/';
  - veRL's `file` logger (trainer.logger=[file], VERL_FILE_LOGGER_PATH): {"step": N, "data": {...}};
  - veRL's `console` logger, as captured in a log file: lines "step:N - key:value - ...".
Rows without the metric (verirl's step 0 holds only val/ keys) are skipped. --map OLD=NEW
renames a key in every run that has it, e.g. --map critic/score/mean=reward/mean for veRL.

examples:
  verirl compare-runs runs/gpu runs/npu
  verirl compare-runs runs/gpu runs/npu --smooth 10 --png compare.png
  verirl compare-runs runs/ours verl_metrics.jsonl --map critic/score/mean=reward/mean \\
      --map actor/kl_loss=actor/kl --metric reward/mean --metric response_length/mean --relative
  verirl compare-runs runs/a runs/b --json > verdict.json
"""
from __future__ import annotations

import difflib
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from verirl.core.errors import UserError
from verirl.run.jsonl import BadLine, read_lines
from verirl.run.rundir import metrics_file

HELP = "two runs' metric curves against a tolerance: PASS exit 0, FAIL exit 1, an overlay PNG"

STEP_KEYS = ("step", "training/global_step", "global_step")  # tried in this order, after --step-key
_CONSOLE_LINE = re.compile(r"(?:^|\s)step:(\d+) - (.*)$")  # veRL's console logger (concat_dict_to_str)


# ---------------------------------------------------------------------------------------------
# records

@dataclass
class Run:
    """One run's numeric metrics by step, read from a run directory or a metrics file."""
    label: str  # "A" or "B"
    path: str  # as the user gave it
    source: str  # what was read: "verirl run directory", "veRL file logger JSONL", ...
    step_key: str  # the key the steps were read from
    steps: dict[int, dict[str, float]]  # step -> metric -> value (non-finite values kept)
    notes: list[str] = field(default_factory=list)  # rows skipped, values overwritten, ...

    @property
    def name(self) -> str:
        """A short name for legends: the directory, or the file name."""
        p = Path(self.path)
        return p.parent.name if p.name == "metrics.jsonl" and p.parent.name else p.name or self.path

    def metrics(self) -> list[str]:
        return sorted({k for row in self.steps.values() for k in row})

    def curve(self, metric: str) -> tuple[dict[int, float], int]:
        """(step -> finite value, how many non-finite values were dropped)."""
        out: dict[int, float] = {}
        dropped = 0
        for step in sorted(self.steps):
            value = self.steps[step].get(metric)
            if value is None:
                continue
            if math.isfinite(value):
                out[step] = value
            else:
                dropped += 1
        return out, dropped


@dataclass(frozen=True)
class Tolerance:
    tol: float = 0.04  # curve: largest |A - B| of the smoothed curves
    final_tol: float = 0.05  # converged: |mean A - mean B| over the last `final_fraction` of the steps
    relative: bool = False  # tolerances as fractions of the metric's full scale instead of its units
    smooth: int = 1  # trailing moving average over this many logged steps (1 = raw)
    final_fraction: float = 0.1


@dataclass
class Curves:
    """The two curves on their common steps, as compared (and plotted)."""
    steps: list[int]
    a: list[float]
    b: list[float]
    a_smooth: list[float]
    b_smooth: list[float]


@dataclass
class MetricResult:
    metric: str
    steps: int  # common steps compared
    first_step: int
    last_step: int
    max_diff: float  # largest |A - B| of the smoothed curves
    max_diff_step: int  # where it is
    tol: float  # the curve tolerance in the metric's units (tol * scale with --relative)
    final_a: float  # mean of A over the last final_steps common steps (raw values)
    final_b: float
    final_diff: float
    final_tol: float  # in the metric's units
    final_steps: int
    scale: float  # full scale: the largest |value| of either smoothed curve (what --relative multiplies)
    curve_ok: bool
    final_ok: bool

    @property
    def passed(self) -> bool:
        return self.curve_ok and self.final_ok


# ---------------------------------------------------------------------------------------------
# pure maths

def moving_average(values: list[float], k: int) -> list[float]:
    """Trailing moving average over ``k`` points; the first k-1 points average what there is.

    >>> moving_average([1.0, 2.0, 3.0, 4.0], 2)
    [1.0, 1.5, 2.5, 3.5]
    """
    if k <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= k:
            total -= values[i - k]
        out.append(total / min(i + 1, k))
    return out


def tail_count(n: int, fraction: float) -> int:
    """How many of ``n`` steps make the last ``fraction`` of them: ceil, at least 1.

    >>> tail_count(30, 0.1), tail_count(5, 0.1), tail_count(101, 0.1)
    (3, 1, 11)
    """
    return max(1, min(n, math.ceil(n * fraction - 1e-9)))


def compare_curves(metric: str, a: dict[int, float], b: dict[int, float],
                   tol: Tolerance) -> tuple[MetricResult, Curves]:
    """Compare two curves (step -> value) on their common steps; there must be at least one."""
    steps = sorted(set(a) & set(b))
    assert steps, "compare_curves needs at least one common step"
    ra, rb = [a[s] for s in steps], [b[s] for s in steps]
    sa, sb = moving_average(ra, tol.smooth), moving_average(rb, tol.smooth)
    diffs = [abs(x - y) for x, y in zip(sa, sb)]
    worst = max(range(len(steps)), key=diffs.__getitem__)
    k = tail_count(len(steps), tol.final_fraction)
    final_a, final_b = sum(ra[-k:]) / k, sum(rb[-k:]) / k
    scale = max(abs(v) for v in sa + sb)
    unit = scale if tol.relative else 1.0
    curve_tol, final_tol = tol.tol * unit, tol.final_tol * unit
    slack = 1e-12 * max(1.0, scale)  # rounding only: a difference equal to the tolerance passes
    result = MetricResult(
        metric=metric, steps=len(steps), first_step=steps[0], last_step=steps[-1],
        max_diff=diffs[worst], max_diff_step=steps[worst], tol=curve_tol,
        final_a=final_a, final_b=final_b, final_diff=abs(final_a - final_b), final_tol=final_tol,
        final_steps=k, scale=scale,
        curve_ok=diffs[worst] <= curve_tol + slack, final_ok=abs(final_a - final_b) <= final_tol + slack)
    return result, Curves(steps, ra, rb, sa, sb)


# ---------------------------------------------------------------------------------------------
# reading runs

def _number(value) -> Optional[float]:
    """A metric value as a float, or None for what is not a number (strings, lists, booleans)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _flatten(row: dict, prefix: str = "") -> dict:
    """Nested objects joined with '/'; veRL's file logger's top-level "data" object is unwrapped."""
    out: dict = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(_flatten(value, "" if (not prefix and key == "data") else f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read_jsonl(path: Path, label: str, notes: list[str]) -> list[dict]:
    rows = []
    for number, row in read_lines(path, errors="replace"):
        if isinstance(row, BadLine):
            if row.cut:  # a line cut off by a killed writer
                notes.append(f"the last line of {path} is cut off (the run was killed while writing?); skipped")
                continue
            raise UserError(f"run {label}: {path}, line {number}: not JSON ({row.error.msg}). A metrics file holds "
                            f"one JSON object per line; fix or delete that line.") from None
        if not isinstance(row, dict):
            raise UserError(f"run {label}: {path}, line {number}: a JSON {type(row).__name__}, not an object. "
                            f"A metrics file holds one JSON object per line.")
        rows.append(_flatten(row))
    return rows


def _read_console(text: str) -> list[dict]:
    """veRL's console logger lines, `step:N - key:value - key:value`, anywhere in a log (after a
    Ray prefix such as `(TaskRunner pid=1234)`); other lines are ignored."""
    rows = []
    for line in text.splitlines():
        m = _CONSOLE_LINE.search(line)
        if not m:
            continue
        row: dict = {"step": int(m.group(1))}
        for item in m.group(2).split(" - "):
            key, sep, value = item.strip().rpartition(":")
            if sep and key:
                try:
                    row[key] = float(value)
                except ValueError:
                    pass
        rows.append(row)
    return rows


def _metrics_file(path: Path, label: str) -> Path:
    """The metrics file of ``path``: itself, or a run directory's metrics.jsonl."""
    if not path.exists():
        raise UserError(f"run {label}: {path}: no such file or directory. Give a verirl run directory (with "
                        f"metrics.jsonl) or a metrics file (JSONL, or a veRL console log).")
    if metrics_file(path).is_file():
        return metrics_file(path)
    found = sorted(str(p) for p in path.glob("*/metrics.jsonl"))
    found += sorted(str(p) for p in path.glob("*.jsonl") if p.name != "metrics.jsonl")
    hint = (f" It holds: {', '.join(found[:6])}{' ...' if len(found) > 6 else ''}: give one of those."
            if found else " Give a run directory or a metrics file.")
    raise UserError(f"run {label}: {path} is a directory without metrics.jsonl, so not a verirl run "
                    f"directory.{hint}")


def load_run(path: str, label: str, step_key: str = "", mapping: Optional[dict[str, str]] = None) -> Run:
    """Read a run directory or metrics file into step -> numeric metrics.

    ``step_key`` is tried first, then `STEP_KEYS`; ``mapping`` (OLD -> NEW) renames keys before the
    step key is looked for. Rows for the same step are merged, later values winning (a resumed
    run that logged a step again, or a logger that writes validation and training apart)."""
    file = _metrics_file(Path(path), label)
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"run {label}: cannot read {file}: {e.strerror}.") from None
    if not text.strip():
        raise UserError(f"run {label}: {file} is empty: nothing has been logged there yet.")
    notes: list[str] = []
    try:
        first = json.loads(text.lstrip().split("\n", 1)[0])
    except json.JSONDecodeError:
        first = None
    if isinstance(first, dict):
        rows = _read_jsonl(file, label, notes)
        source = ("veRL file logger JSONL" if isinstance(first.get("data"), dict) else
                  "verirl run directory" if file != Path(path) else "metrics JSONL")
    else:
        rows = _read_console(text)
        source = "veRL console log"
        if not rows:
            raise UserError(f"run {label}: {file} is neither a metrics JSONL (its first line is not a JSON "
                            f"object) nor a veRL console log (no line 'step:N - key:value - ...'). Give a run "
                            f"directory, a JSONL of metrics, or the console log of a veRL run.")
    for old, new in (mapping or {}).items():
        for row in rows:
            if old in row:
                row[new] = row.pop(old)
    candidates = ([step_key] if step_key else []) + [k for k in STEP_KEYS if k != step_key]
    key = next((k for k in candidates if any(k in row for row in rows)), None)
    if key is None:
        keys = sorted({k for row in rows for k in row})
        raise UserError(f"run {label}: {file} has no step key ({', '.join(candidates)}) in any row. Name the "
                        f"key that counts the steps with --step-key (its keys: {_listing(keys)}).")
    steps: dict[int, dict[str, float]] = {}
    skipped = overwritten = 0
    for row in rows:
        step = _number(row.get(key))
        if step is None or not step.is_integer():
            skipped += 1
            continue
        merged = steps.setdefault(int(step), {})
        for k, v in row.items():
            value = _number(v)
            if k == key or value is None:
                continue
            if k in merged and merged[k] != value and not (math.isnan(value) and math.isnan(merged[k])):
                overwritten += 1
            merged[k] = value
    if skipped:
        notes.append(f"{skipped} row(s) without an integer '{key}' skipped")
    if overwritten:
        notes.append(f"{overwritten} value(s) logged twice for one step (a resumed run?): the later kept")
    if not steps:
        raise UserError(f"run {label}: {file} has no row with an integer step under '{key}'.")
    return Run(label, path, source, key, steps, notes)


def _listing(keys: list[str], most: int = 40) -> str:
    shown = ", ".join(keys[:most])
    return f"{shown}, ... ({len(keys) - most} more)" if len(keys) > most else shown or "none"


def _curve(run: Run, metric: str) -> dict[int, float]:
    """The run's finite values of ``metric``; a metric it never logged is an error naming the run."""
    have = run.metrics()
    if metric not in have:
        close = difflib.get_close_matches(metric, have, n=3, cutoff=0.5)
        guess = f" Did you mean {' or '.join(close)}?" if close else ""
        raise UserError(f"run {run.label} ({run.path}) has no metric '{metric}'.{guess} Its metrics: "
                        f"{_listing(have)}. Rename a key with --map OLD=NEW (e.g. --map "
                        f"critic/score/mean=reward/mean for a veRL run), or choose others with --metric.")
    values, dropped = run.curve(metric)
    if dropped:
        run.notes.append(f"{metric}: {dropped} non-finite value(s) (nan/inf) left out")
    if not values:
        raise UserError(f"run {run.label} ({run.path}): every value of '{metric}' is nan or inf.")
    return values


def compare(run_a: Run, run_b: Run, metrics: list[str], tol: Tolerance) -> list[tuple[MetricResult, Curves]]:
    out = []
    for metric in metrics:
        a, b = _curve(run_a, metric), _curve(run_b, metric)
        if not set(a) & set(b):
            raise UserError(f"{metric}: no step in common: run A ({run_a.path}) logs it at steps {_span(a)}, run B "
                            f"({run_b.path}) at steps {_span(b)}. Check that both count steps the same way "
                            f"(A's step key is '{run_a.step_key}', B's '{run_b.step_key}'; change it with "
                            f"--step-key).")
        out.append(compare_curves(metric, a, b, tol))
    return out


def _span(curve: dict[int, float]) -> str:
    steps = sorted(curve)
    return f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"


# ---------------------------------------------------------------------------------------------
# the figure

def write_figure(out: Path, run_a: Run, run_b: Run, results: list[tuple[MetricResult, Curves]],
                 tol: Tolerance) -> None:
    """One panel per metric: both curves (raw faint, smoothed bold), A's smoothed curve +- the curve
    tolerance (the band B must stay in), the converged window with both means, the worst step."""
    try:
        from matplotlib.figure import Figure  # object API: no pyplot, no global backend switched
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UserError("--png needs matplotlib, which is not installed here: pip install matplotlib.") from None
    fig = Figure(figsize=(9, 3.4 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 1, squeeze=False)[:, 0]
    colors = {"A": "tab:blue", "B": "tab:orange"}
    for ax, (r, c) in zip(axes, results):
        for label, raw, smooth in (("A", c.a, c.a_smooth), ("B", c.b, c.b_smooth)):
            name = f"{label}: {run_a.name if label == 'A' else run_b.name}"
            if tol.smooth > 1:
                ax.plot(c.steps, raw, color=colors[label], alpha=0.3, linewidth=0.9)
                ax.plot(c.steps, smooth, color=colors[label], linewidth=2.0, label=f"{name} (mean of {tol.smooth})")
            else:
                ax.plot(c.steps, raw, color=colors[label], linewidth=1.8, label=name)
        ax.fill_between(c.steps, [v - r.tol for v in c.a_smooth], [v + r.tol for v in c.a_smooth],
                        color=colors["A"], alpha=0.12, linewidth=0, label=f"A ± {r.tol:.4g} (curve tolerance)")
        window = c.steps[-r.final_steps:]
        ax.axvspan(window[0] - 0.5, window[-1] + 0.5, color="grey", alpha=0.12, linewidth=0,
                   label=f"last {r.final_steps} step(s): converged means (dashed, tol {r.final_tol:.4g})")
        for label, value in (("A", r.final_a), ("B", r.final_b)):
            ax.hlines(value, window[0] - 0.5, window[-1] + 0.5, colors=colors[label], linestyles="dashed")
        ax.axvline(r.max_diff_step, color="tab:red" if not r.curve_ok else "grey", linestyle=":", linewidth=1)
        verdict = "PASS" if r.passed else "FAIL"
        ax.set_title(f"{r.metric}: {verdict}   max |Δ| {r.max_diff:.4g} at step {r.max_diff_step} "
                     f"(tol {r.tol:.4g});  converged |Δ| {r.final_diff:.4g} (tol {r.final_tol:.4g})",
                     fontsize=9, color="black" if r.passed else "tab:red")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(r.metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"A: {run_a.path}\nB: {run_b.path}", fontsize=8)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=110)
    except OSError as e:
        raise UserError(f"--png {out}: cannot write there ({e.strerror or e}). Give a writable path.") from None


# ---------------------------------------------------------------------------------------------
# the command

def add_arguments(parser) -> None:
    parser.add_argument("run_a", metavar="RUN_A", help="the reference run: a verirl run directory or a metrics file")
    parser.add_argument("run_b", metavar="RUN_B", help="the run judged against it, the same way")
    parser.add_argument("--metric", action="append", default=None, metavar="KEY",
                        help="a metric to compare; repeat, or separate with commas (default reward/mean)")
    parser.add_argument("--tol", type=float, default=0.04,
                        help="largest allowed |A - B| of the (smoothed) curves (default 0.04: 4%% of a reward in [0, 1])")
    parser.add_argument("--final-tol", type=float, default=0.05,
                        help="largest allowed |A - B| of the converged values (default 0.05: 5%% of a reward in [0, 1])")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--absolute", dest="relative", action="store_false", default=False,
                      help="tolerances in the metric's own units (the default; right for a reward in [0, 1])")
    mode.add_argument("--relative", dest="relative", action="store_true",
                      help="tolerances as fractions of the metric's full scale (largest |value| of either curve)")
    parser.add_argument("--smooth", type=int, default=1, metavar="K",
                        help="trailing moving average over K logged steps before the curve check (default 1: raw)")
    parser.add_argument("--final-fraction", type=float, default=0.1, metavar="F",
                        help="the converged value is the mean of the last F of the common steps (default 0.1)")
    parser.add_argument("--map", action="append", default=[], metavar="OLD=NEW",
                        help="rename a key in every run that has it (repeatable), "
                             "e.g. critic/score/mean=reward/mean for veRL")
    parser.add_argument("--step-key", default="", metavar="KEY",
                        help=f"the key counting steps, tried before {', '.join(STEP_KEYS)}")
    parser.add_argument("--png", default="", metavar="OUT", help="write an overlay figure of each metric here (PNG)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object instead of a table")


def _tolerance(args) -> Tolerance:
    if not (args.tol >= 0 and args.final_tol >= 0):
        raise UserError(f"--tol {args.tol} / --final-tol {args.final_tol}: a tolerance is a number >= 0.")
    if args.smooth < 1:
        raise UserError(f"--smooth {args.smooth}: give a window of at least 1 step (1 = no smoothing).")
    if not 0 < args.final_fraction <= 1:
        raise UserError(f"--final-fraction {args.final_fraction}: give a fraction in (0, 1], e.g. 0.1.")
    return Tolerance(args.tol, args.final_tol, args.relative, args.smooth, args.final_fraction)


def _mapping(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        old, sep, new = item.partition("=")
        if not (sep and old.strip() and new.strip()):
            raise UserError(f"--map {item}: write OLD=NEW, e.g. --map critic/score/mean=reward/mean.")
        out[old.strip()] = new.strip()
    return out


def _notes(run_a: Run, run_b: Run, results: list[tuple[MetricResult, Curves]], tol: Tolerance) -> list[str]:
    notes = [f"{run.label}: {note}" for run in (run_a, run_b) for note in run.notes]
    for r, _ in results:
        if not tol.relative and r.scale > 2:
            notes.append(f"{r.metric} reaches {r.scale:.4g}: the absolute tolerances ({tol.tol:g}, "
                         f"{tol.final_tol:g}) are in its units; for a metric not on a 0..1 scale use --relative")
        n_a, n_b = len(run_a.curve(r.metric)[0]), len(run_b.curve(r.metric)[0])
        if r.steps < max(n_a, n_b):
            notes.append(f"{r.metric}: compared on the {r.steps} steps both runs logged "
                         f"(A has {n_a}, B has {n_b})")
    return notes


def _to_json(run_a: Run, run_b: Run, results: list[tuple[MetricResult, Curves]], tol: Tolerance,
             png: str, notes: list[str]) -> dict:
    passed = all(r.passed for r, _ in results)
    return {
        "verdict": "PASS" if passed else "FAIL", "passed": passed,
        "tolerance": {**asdict(tol), "mode": "relative" if tol.relative else "absolute"},
        "runs": {run.label: {"path": run.path, "source": run.source, "step_key": run.step_key,
                             "steps": len(run.steps)} for run in (run_a, run_b)},
        "metrics": [{**asdict(r), "passed": r.passed} for r, _ in results],
        "png": png or None, "notes": notes,
    }


def _print_table(run_a: Run, run_b: Run, results: list[tuple[MetricResult, Curves]], tol: Tolerance,
                 png: str, notes: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # logs: no squeezed table
    for run in (run_a, run_b):
        console.print(f"{run.label}: {run.path}  [dim]({run.source}, {len(run.steps)} steps, "
                      f"step key '{run.step_key}')[/dim]")
    mode = "relative to full scale" if tol.relative else "absolute"
    smooth = f"moving average of {tol.smooth}" if tol.smooth > 1 else "raw"
    table = Table(title=f"curve ({smooth}) within {tol.tol:g}; final = converged value (mean of the last "
                        f"{tol.final_fraction:.0%} of the common steps) within {tol.final_tol:g}; {mode}")
    for name in ["metric", "steps", "curve |Δ| max", "at step", "tol", "final A", "final B", "final |Δ|", "tol ",
                 "verdict"]:
        table.add_column(name, justify="left" if name in ("metric", "verdict") else "right", no_wrap=True)
    for r, _ in results:
        def mark(ok: bool, text: str) -> str:
            return text if ok else f"[bold red]{text}[/bold red]"
        table.add_row(r.metric, f"{r.first_step}..{r.last_step} ({r.steps})", mark(r.curve_ok, f"{r.max_diff:.4g}"),
                      str(r.max_diff_step), f"{r.tol:.4g}", f"{r.final_a:.4g}", f"{r.final_b:.4g}",
                      mark(r.final_ok, f"{r.final_diff:.4g}"), f"{r.final_tol:.4g}",
                      "[green]PASS[/green]" if r.passed else "[bold red]FAIL[/bold red]")
    console.print(table)
    for note in notes:
        console.print(f"[dim]note: {note}[/dim]")
    if png:
        console.print(f"figure: {png}")
    failed = [r for r, _ in results if not r.passed]
    if not failed:
        console.print(f"[bold green]PASS[/bold green]: B matches A on {', '.join(r.metric for r, _ in results)}")
        return
    why = []
    for r in failed:
        parts = ([f"curve |Δ| {r.max_diff:.4g} at step {r.max_diff_step} > {r.tol:.4g}"] if not r.curve_ok else []) + (
            [f"converged |Δ| {r.final_diff:.4g} > {r.final_tol:.4g}"] if not r.final_ok else [])
        why.append(f"{r.metric} ({'; '.join(parts)})")
    console.print(f"[bold red]FAIL[/bold red]: {', '.join(why)}")


def run(args) -> int:
    tol = _tolerance(args)
    metrics = [m.strip() for item in (args.metric or ["reward/mean"]) for m in item.split(",") if m.strip()]
    if not metrics:
        raise UserError("--metric: give at least one metric key, e.g. --metric reward/mean.")
    metrics = list(dict.fromkeys(metrics))  # once each, in the order given
    mapping = _mapping(args.map)
    run_a = load_run(args.run_a, "A", args.step_key, mapping)
    run_b = load_run(args.run_b, "B", args.step_key, mapping)
    results = compare(run_a, run_b, metrics, tol)
    if args.png:
        write_figure(Path(args.png), run_a, run_b, results, tol)
    notes = _notes(run_a, run_b, results, tol)
    if args.json:
        print(json.dumps(_to_json(run_a, run_b, results, tol, args.png, notes), indent=2))
    else:
        _print_table(run_a, run_b, results, tol, args.png, notes)
    return 0 if all(r.passed for r, _ in results) else 1
