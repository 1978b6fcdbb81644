"""Compare two activation dumps (trainer.dump_activations) module by module, forward and backward.

Prints, for each direction, the first module in execution order whose statistics differ beyond the
tolerance, and a table of the modules that differ most. A module's statistics (over the positions
that predict response tokens, so packed and padded runs compare) are: tokens, L2 norm, mean, std,
min, max, and a sample of values at the positions with the largest norm.

Each of DUMP_A and DUMP_B is one dump file (rank0.json), a step directory (step_000003/: its rank
files are merged, so a 2-rank run compares with a 1-rank run), or a dump directory (trainer.
dump_activations.dir: every step both hold is compared).

Two values a and b of a statistic agree when |a - b| <= rtol * max(|a|, |b|, rms_a, rms_b), rms being
the module's root mean square (l2 / sqrt(elements)): a mean or a sample value near zero is measured
against the size of the module's values, not against itself. Token counts and per-token shapes must
be equal. Modules present in only one dump are listed and skipped.

Exit status: 0 when every common module agrees, 1 when one diverges, 2 when a dump cannot be read.
Execution order is the order in which outputs were produced (a layer after its sub-modules) for the
forward, and the order in which gradients arrived for the backward. See docs/activations.md.

examples:
  verirl compare-activations runs/a/activations runs/b/activations
  verirl compare-activations runs/a/activations/step_000001 runs/b/activations/step_000001 --rtol 2e-2
  verirl compare-activations a/step_000001/rank0.json b/step_000001/rank0.json --json > diff.json
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Optional

from verirl.core.errors import UserError

HELP = "compare two activation dumps: the first module where they diverge, and the worst, forward and backward"

FORMAT = "verirl-activations/1"  # = verirl.train.record.FORMAT (not imported: that module imports torch)
STATS = ("l2", "mean", "std", "min", "max")
DIRECTIONS = ("forward", "backward")
_STEP_DIR = re.compile(r"^step_(\d+)$")
_RANK_FILE = re.compile(r"^rank(\d+)\.json$")


def add_arguments(parser) -> None:
    parser.add_argument("dump_a", metavar="DUMP_A", help="a dump file, step directory or dump directory")
    parser.add_argument("dump_b", metavar="DUMP_B", help="the same kind of thing from the other run")
    parser.add_argument("--rtol", type=float, default=1e-3,
                        help="relative tolerance per statistic (default 1e-3: float32 runs agree to about 1e-6; "
                             "for bfloat16 runs, or two systems' kernels, try 1e-2 to 3e-2)")
    parser.add_argument("--top", type=int, default=10, help="rows of the table of the worst modules (default 10)")
    parser.add_argument("--json", action="store_true", help="print the comparison as one JSON object")


def run(args) -> int:
    if not args.rtol > 0:
        raise UserError(f"--rtol {args.rtol}: the tolerance must be a positive number, e.g. --rtol 1e-3.")
    if args.top < 0:
        raise UserError(f"--top {args.top}: give the number of rows of the table, 0 or more.")
    result = compare(Path(args.dump_a), Path(args.dump_b), args.rtol, args.top)
    if args.json:
        print(json.dumps(_plain(result), indent=2))
    else:
        print(render(result))
    return 1 if result["diverged"] else 0


# --- reading ------------------------------------------------------------------------------------

def _read(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}); it is not a whole activation dump. "
                        f"Dump the step again.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot be read ({e}).") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise UserError(f"{path}: not an activation dump (no \"format\": \"{FORMAT}\"). Give a file written by "
                        f"trainer.dump_activations (DIR/step_NNNNNN/rankR.json), its step directory or DIR.")
    return obj


def _rank_files(d: Path) -> list[Path]:
    return sorted((p for p in d.iterdir() if _RANK_FILE.match(p.name)),
                  key=lambda p: int(_RANK_FILE.match(p.name).group(1)))


def steps_of(path: Path) -> dict[Optional[int], list[Path]]:
    """The steps a dump path holds: step -> rank files. A file or a step directory is one step (its
    number from the directory name or the file's meta, None when neither says); a dump directory is
    every step_NNNNNN/ in it."""
    if path.is_file():
        m = _STEP_DIR.match(path.parent.name)
        return {int(m.group(1)) if m else None: [path]}
    if not path.is_dir():
        raise UserError(f"{path}: no such file or directory. Give a dump file (DIR/step_NNNNNN/rankR.json), "
                        f"a step directory or the dump directory (trainer.dump_activations.dir).")
    ranks = _rank_files(path)
    if ranks:
        m = _STEP_DIR.match(path.name)
        return {int(m.group(1)) if m else None: ranks}
    steps = {int(_STEP_DIR.match(d.name).group(1)): _rank_files(d)
             for d in path.iterdir() if d.is_dir() and _STEP_DIR.match(d.name)}
    steps = {s: f for s, f in sorted(steps.items()) if f}
    if not steps:
        raise UserError(f"{path}: holds no activation dump (no rankR.json, no step_NNNNNN/ with one). Point at "
                        f"trainer.dump_activations.dir of a run that reached a step listed in "
                        f"trainer.dump_activations.steps.")
    return steps


def _merge_rows(rows: list[dict]) -> dict:
    """One module's rows from several ranks -> the row of all their positions together."""
    if len(rows) == 1:
        return rows[0]
    first = rows[0]
    for r in rows[1:]:
        if r["shape"] != first["shape"]:
            raise UserError(f"module {first['module']}: per-token shape {r['shape']} on one rank and "
                            f"{first['shape']} on another; the rank files are not from one run.")
    feat = max(math.prod(first["shape"]), 1)
    tokens = sum(r["tokens"] for r in rows)
    n = tokens * feat
    live = [r for r in rows if r["tokens"]]
    mean = sum(r["mean"] * r["tokens"] * feat for r in rows) / n if n else 0.0
    q = sum(r["l2"] ** 2 for r in rows)
    sample = sorted(((nm, v) for r in rows for nm, v in zip(r["sample_norms"], r["sample"])),
                    key=lambda t: -t[0])[:max(len(r["sample"]) for r in rows)]
    return {**first, "order": min(r["order"] for r in rows), "tokens": tokens, "l2": math.sqrt(q), "mean": mean,
            "std": math.sqrt(max(q / n - mean * mean, 0.0)) if n else 0.0,
            "min": min((r["min"] for r in live), default=0.0), "max": max((r["max"] for r in live), default=0.0),
            "sample": [v for _, v in sample], "sample_norms": [nm for nm, _ in sample]}


def load(files: list[Path]) -> dict[str, Any]:
    """The rank files of one step, merged: {"meta", "ranks", "forward": {module: row}, "backward": ...,
    "skipped": {module: reason}}, each direction in execution order."""
    dumps = [_read(f) for f in files]
    out: dict[str, Any] = {"meta": dumps[0].get("meta", {}), "ranks": len(dumps), "files": [str(f) for f in files],
                           "skipped": {s["module"]: s["reason"] for d in dumps for s in d.get("skipped", [])}}
    for direction in DIRECTIONS:
        by_module: dict[str, list[dict]] = {}
        for d in dumps:
            for row in d.get(direction, []):
                by_module.setdefault(row["module"], []).append(row)
        merged = [_merge_rows(rows) for rows in by_module.values()]
        out[direction] = {r["module"]: r for r in sorted(merged, key=lambda r: r["order"])}
    return out


# --- comparing ----------------------------------------------------------------------------------

def _rms(row: dict) -> float:
    n = row["tokens"] * max(math.prod(row["shape"]), 1)
    return row["l2"] / math.sqrt(n) if n else 0.0


def relative(a: float, b: float, scale: float) -> float:
    """|a - b| / max(|a|, |b|, scale); 0 for equal values, inf where only one is finite or either is NaN."""
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    s = max(abs(a), abs(b), scale)
    return abs(a - b) / s if s > 0 else 0.0


def compare_rows(a: dict, b: dict) -> tuple[float, str, Any, Any]:
    """The largest relative difference between two rows of one module: (rel, statistic, value in a, in b)."""
    if a["shape"] != b["shape"]:
        return math.inf, "shape", a["shape"], b["shape"]
    if a["tokens"] != b["tokens"]:
        return math.inf, "tokens", a["tokens"], b["tokens"]
    scale = max(_rms(a), _rms(b))
    worst = (0.0, "l2", a["l2"], b["l2"])
    for s in STATS:
        rel = relative(a[s], b[s], scale)
        if rel > worst[0]:
            worst = (rel, s, a[s], b[s])
    sa, sb = a.get("sample", []), b.get("sample", [])
    if len(sa) != len(sb) or any(len(r) != len(sa[0]) for r in sa + sb):
        return math.inf, "sample", [len(r) for r in sa], [len(r) for r in sb]
    for i, rel, k, x, y in _matched_sample(sa, sb, scale):
        if rel > worst[0]:
            worst = (rel, f"sample[{i}][{k}]", x, y)
    return worst


def _matched_sample(sa: list[list[float]], sb: list[list[float]], scale: float):
    """(row, rel, feature, value in a, value in b) for each sampled row of either dump against the
    nearest row of the other, rows indexed in a: sampled positions whose norms are within the
    tolerance of each other may change places between two runs, and still hold the same values."""
    def row_rel(ra, rb):  # the largest difference over the features: (rel, feature)
        return max(((relative(x, y, scale), k) for k, (x, y) in enumerate(zip(ra, rb))), default=(0.0, 0))
    out = []
    for i, ra in enumerate(sa):
        (rel, k), j = min((row_rel(ra, rb), j) for j, rb in enumerate(sb))
        out.append((i, rel, k, ra[k], sb[j][k]))
    for j, rb in enumerate(sb):
        (rel, k), i = min((row_rel(sa[i], rb), i) for i in range(len(sa)))
        out.append((i, rel, k, sa[i][k], rb[k]))
    return out


def compare_direction(a: dict[str, dict], b: dict[str, dict], rtol: float, top: int = 10) -> dict[str, Any]:
    """One direction of two loaded steps: the first divergence in a's execution order, the worst modules."""
    rows = []
    for name, ra in a.items():
        if name in b:
            rel, stat, va, vb = compare_rows(ra, b[name])
            rows.append({"module": name, "order": ra["order"], "stat": stat, "a": va, "b": vb, "rel": rel,
                         "dtype": [ra["dtype"], b[name]["dtype"]]})
    first = next((r for r in rows if r["rel"] > rtol), None)
    worst = sorted(rows, key=lambda r: (-r["rel"], r["order"]))[:top]
    return {"compared": len(rows), "diverged": first is not None, "first": first, "worst": worst,
            "only_a": [m for m in a if m not in b], "only_b": [m for m in b if m not in a],
            "dtype_differs": [r["module"] for r in rows if r["dtype"][0] != r["dtype"][1]]}


def compare(a: Path, b: Path, rtol: float = 1e-3, top: int = 10) -> dict[str, Any]:
    """Compare dump paths ``a`` and ``b`` (files, step directories or dump directories; see the module
    docstring). Returns {"rtol", "a", "b", "diverged", "steps": [{"step", "a", "b", "forward",
    "backward"}]}, each direction as `compare_direction` gives it."""
    sa, sb = steps_of(Path(a)), steps_of(Path(b))
    single_a, single_b = _is_single(Path(a)), _is_single(Path(b))
    if single_a and single_b:  # one step each: compared whatever their numbers
        (step_a, fa), (step_b, fb) = next(iter(sa.items())), next(iter(sb.items()))
        pairs = [(step_a if step_a is not None else step_b, fa, fb)]
    elif single_a or single_b:
        raise UserError(f"{a} and {b} are not the same kind of path. Give two dump files, two "
                        f"step directories (step_NNNNNN/) or two dump directories (trainer.dump_activations.dir).")
    else:
        common = [s for s in sa if s in sb]
        if not common:
            raise UserError(f"{a} holds steps {sorted(sa)} and {b} steps {sorted(sb)}: none in "
                            f"common. List the same steps in trainer.dump_activations.steps for both runs.")
        pairs = [(s, sa[s], sb[s]) for s in common]
    only = {"steps_only_a": [s for s in sa if s not in sb and s is not None],
            "steps_only_b": [s for s in sb if s not in sa and s is not None]} if not single_a else {}
    steps = []
    for step, fa, fb in pairs:
        da, db = load(fa), load(fb)
        if step is None:
            step = da["meta"].get("step", db["meta"].get("step"))
        entry: dict[str, Any] = {"step": step, "a": {"files": da["files"], "ranks": da["ranks"]},
                                 "b": {"files": db["files"], "ranks": db["ranks"]}}
        for direction in DIRECTIONS:
            entry[direction] = compare_direction(da[direction], db[direction], rtol, top)
        if not entry["forward"]["compared"] and da["forward"] and db["forward"]:
            raise UserError(f"step {step}: no module name in common (A: "
                            f"{', '.join(list(da['forward'])[:3])}, ...; B: {', '.join(list(db['forward'])[:3])}, "
                            f"...). The dumps come from different model families; dump the same modules.")
        steps.append(entry)
    return {"rtol": rtol, "a": str(a), "b": str(b), "steps": steps, **only,
            "diverged": any(s[d]["diverged"] for s in steps for d in DIRECTIONS)}


def _is_single(path: Path) -> bool:
    """A dump file, or a directory that holds rank files (one step)."""
    return path.is_file() or (path.is_dir() and bool(_rank_files(path)))


# --- printing -----------------------------------------------------------------------------------

def _plain(obj: Any) -> Any:
    """``obj`` with every non-finite float written as a string ("inf", "nan"), so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def render(result: dict[str, Any]) -> str:
    """The comparison as text: per step and direction, the first divergence and the worst modules."""
    lines = [f"A: {result['a']}", f"B: {result['b']}", f"rtol {result['rtol']:g}"]
    for k in ("steps_only_a", "steps_only_b"):
        if result.get(k):
            lines.append(f"steps only in {k[-1].upper()} (not compared): {', '.join(map(str, result[k]))}")
    for s in result["steps"]:
        ranks = f" (ranks: A {s['a']['ranks']}, B {s['b']['ranks']})" if max(s["a"]["ranks"], s["b"]["ranks"]) > 1 \
            else ""
        lines.append("")
        lines.append(f"step {s['step'] if s['step'] is not None else '?'}{ranks}")
        for d in DIRECTIONS:
            c = s[d]
            extra = "".join(f", {len(c[k])} only in {k[-1].upper()}" for k in ("only_a", "only_b") if c[k])
            if not c["compared"]:
                lines.append(f"  {d}: nothing to compare{extra}"
                             + (" (dump with backward: true for gradients)" if d == "backward" else ""))
                continue
            f = c["first"]
            verdict = (f"first divergence: #{f['order']} {f['module']}: {f['stat']} {_fmt(f['a'])} vs {_fmt(f['b'])} "
                       f"(rel {f['rel']:.2e} > {result['rtol']:g})" if f else "all within tolerance")
            lines.append(f"  {d}: {c['compared']} modules compared{extra}; {verdict}")
            for k in ("only_a", "only_b"):
                if c[k]:
                    more = f", ... ({len(c[k])})" if len(c[k]) > 4 else ""
                    lines.append(f"    only in {k[-1].upper()}: {', '.join(c[k][:4])}{more}")
            if c["dtype_differs"]:
                lines.append(f"    dtype differs: {', '.join(c['dtype_differs'][:4])}")
            if not c["worst"]:
                continue
            width = max(len(r["module"]) for r in c["worst"])
            lines.append(f"    {'#':>4}  {'module':<{width}}  {'stat':<14} {'A':>13} {'B':>13} {'rel':>9}")
            for r in c["worst"]:
                mark = " *" if r["rel"] > result["rtol"] else ""
                lines.append(f"    {r['order']:>4}  {r['module']:<{width}}  {r['stat']:<14} {_fmt(r['a']):>13} "
                             f"{_fmt(r['b']):>13} {r['rel']:>9.2e}{mark}")
    verdict = "DIVERGED" if result["diverged"] else "AGREE"
    lines += ["", f"{verdict} (rtol {result['rtol']:g}; * = beyond it)"]
    return "\n".join(lines)
