"""A training run's report: PNG figures and one HTML page that opens from file:// (docs/report.md).

  verirl report RUN_DIR [RUN_DIR ...] [-o OUT_DIR] [--smooth K] [--samples N]

Figures (800 x 450 px each, written where a run logged their metrics): reward.png (reward/mean),
reward_rules.png (reward/<rule>/mean), reward_tasks.png (reward/task/<task>/mean),
response_length.png (mean, max, clip ratio), actor.png (KL, entropy, clip fraction), timing.png
(each phase's seconds stacked per step), throughput.png (perf/tps*, perf/mfu), async.png (an asynchronous
run's async/* staleness, queue depth, idle and weight sync seconds), validation.png
(val/* at step 0 = before training and at each evaluation), filter_mismatch.png (filter/kept_groups,
mismatch/kl, mismatch/masked_frac). Per-step curves are drawn thin, with a trailing moving average
bold. The page, index.html, shows them with each run's config.yaml, summary.json and the best and
worst response of up to --samples logged steps of rollouts.jsonl (trainer.dump_rollouts=true).

Several runs are overlaid in the same figures, one colour per run, named in the legends; the page
has a section per run. OUT_DIR defaults to RUN_DIR/report for one run, ./report for several. The
page's path is printed last.

examples:
  verirl report runs/tiny_grpo/20260101-120000
  verirl report runs/a runs/b -o compare/ --smooth 10
"""
from __future__ import annotations

from pathlib import Path

from verirl.core.errors import UserError

HELP = "a run's figures (PNG) and one HTML page with its config, summary and sample completions"


def add_arguments(parser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="a training run's directory (trainer.run_dir); several are overlaid")
    parser.add_argument("-o", "--out", default="", metavar="OUT_DIR",
                        help="where to write index.html and the PNGs (default: RUN_DIR/report for one run, "
                             "./report for several)")
    parser.add_argument("--smooth", type=int, default=0, metavar="K",
                        help="moving average over K steps drawn over the raw curves (default 0: about a "
                             "twentieth of the steps; 1: none)")
    parser.add_argument("--samples", type=int, default=10, metavar="N",
                        help="logged steps of rollouts.jsonl to show the best and worst response of, evenly "
                             "spaced (default 10; 0: none)")


def build(paths: list[str], out: str = "", smooth: int = 0, samples: int = 10) -> Path:
    """Write the report of the runs at ``paths`` and return the page's path."""
    from verirl.tools.report import figures, page, runs as runs_mod

    if smooth < 0:
        raise UserError(f"--smooth {smooth}: give a window of at least 1 step (1 = no smoothing), or 0 for auto.")
    if samples < 0:
        raise UserError(f"--samples {samples}: give a number of steps >= 0 (0 = no sample completions).")
    names = runs_mod.names(paths)
    runs = [runs_mod.load(p, n, samples) for p, n in zip(paths, names)]
    out_dir = Path(out) if out else (runs[0].path / "report" if len(runs) == 1 else Path("report"))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out_dir}: cannot create the report directory ({e.strerror or e}). Give a writable "
                        f"directory with -o OUT_DIR.") from None
    charts = figures.make_figures(runs, smooth)
    for stale in set(figures.NAMES) - {c.name for c in charts}:  # a previous report's, not redrawn
        (out_dir / f"{stale}.png").unlink(missing_ok=True)
    figures.write_figures(charts, runs, out_dir)
    try:
        return page.write_page(runs, charts, out_dir)
    except OSError as e:
        raise UserError(f"{out_dir / 'index.html'}: cannot write the page there ({e.strerror or e}). Give a "
                        f"writable directory with -o OUT_DIR.") from None


def run(args) -> int:
    path = build(args.runs, args.out, args.smooth, args.samples)
    print(path)
    return 0
