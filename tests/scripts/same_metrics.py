"""Whether a change of code left every training result as it was: the rows of two runs' metrics.jsonl
compared key for key, every key but ``timing/*`` and ``perf/*`` (wall-clock figures).

    # record the reference with the code before the change (a 50-step run of the embedded default)
    python tests/scripts/same_metrics.py run /tmp/before.jsonl
    # after the change: the same run, compared with the reference
    python tests/scripts/same_metrics.py run /tmp/after.jsonl --against /tmp/before.jsonl
    # two files already written (e.g. two `make run`s)
    python tests/scripts/same_metrics.py compare runs/a/metrics.jsonl runs/b/metrics.jsonl

``run`` trains with the ``verirl`` of this interpreter (set PYTHONPATH to a worktree's ``src`` to run
that tree's code); further KEY=VALUE arguments are config overrides, e.g.
``--steps 10 trainer.nproc_per_node=2 actor.strategy=ddp`` for a two-rank run. Exits 0 when equal, 1 with
each difference (step, key, both values) otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WALL_CLOCK = ("timing/", "perf/")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def differences(before: list[dict], after: list[dict]) -> list[str]:
    out = []
    if len(before) != len(after):
        out.append(f"{len(before)} rows before, {len(after)} after")
    for i, (a, b) in enumerate(zip(before, after)):
        where = f"row {i} (step {a.get('step')})"
        keys_a = {k for k in a if not k.startswith(WALL_CLOCK)}
        keys_b = {k for k in b if not k.startswith(WALL_CLOCK)}
        for k in sorted(keys_a ^ keys_b):
            out.append(f"{where}: {k} only {'before' if k in keys_a else 'after'}")
        out += [f"{where}: {k} {a[k]!r} -> {b[k]!r}" for k in sorted(keys_a & keys_b) if not _same(a[k], b[k])]
    return out


def train(out: Path, steps: int, overrides: list[str]) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="same_metrics_"))
    try:
        cmd = [sys.executable, "-c", "import sys; from verirl.cli import main; sys.exit(main())", "train",
               f"trainer.total_steps={steps}", f"trainer.run_dir={run_dir / 'run'}", *overrides]
        subprocess.run(cmd, check=True)
        shutil.copyfile(run_dir / "run" / "metrics.jsonl", out)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train STEPS steps, write OUT, compare with --against if given")
    r.add_argument("out", type=Path)
    r.add_argument("--against", type=Path)
    r.add_argument("--steps", type=int, default=50)
    c = sub.add_parser("compare", help="compare two metrics.jsonl files")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    a, overrides = p.parse_known_args()
    if a.cmd != "run" and overrides or any("=" not in o for o in overrides):
        p.error(f"not a config override (KEY=VALUE): {' '.join(o for o in overrides if '=' not in o) or overrides}")
    a.overrides = [o for o in overrides if o != "--"]
    if a.cmd == "run":
        train(a.out, a.steps, a.overrides)
        if a.against is None:
            print(f"wrote {a.out}: {len(rows(a.out))} rows")
            return 0
        before, after = a.against, a.out
    else:
        before, after = a.before, a.after
    diff = differences(rows(before), rows(after))
    for line in diff[:50]:
        print(line)
    n = len(rows(after))
    print(f"{'EQUAL' if not diff else 'DIFFERENT'}: {before} vs {after}, {n} rows"
          + (f", {len(diff)} differences" if diff else ""))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
