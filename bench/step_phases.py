"""The embedded default's GRPO steps, timed by phase, and where their time goes by operation.

    .venv/bin/python bench/step_phases.py                  # 10 warm-up steps, then 40 timed: medians per phase
    .venv/bin/python bench/step_phases.py --prof 5         # and a torch profile of 5 more steps, by operation
    LD_PRELOAD=... .venv/bin/python bench/step_phases.py   # the same under another allocator, etc.
    .venv/bin/python bench/step_phases.py --alternate model.compute_dtype=null   # A/B step by step in one run

For A/B runs of a setting on a machine whose speed drifts (BENCHMARKS.md: 1.5x within an hour on
2-core machines), run the variants alternately, several times each, and compare their medians; a
single pair says little. A setting of the step itself (what `step_settings` reads, and the native
engine's compute dtype) can be alternated step by step inside one run instead, `--alternate KEY=VALUE`:
the timed steps run the config and the config with that override in turn; the two share the model, so
their timings meet the same machine state. Any `verirl train` override can follow (`rollout.n=4`, `--config FILE`).
Runs in a temporary run directory, without evaluations, checkpoints or logs.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps (default 40)")
    ap.add_argument("--warmup", type=int, default=10, help="steps run first, not timed (default 10)")
    ap.add_argument("--prof", type=int, default=0, help="then profile this many steps with torch.profiler")
    ap.add_argument("--config", default="tiny", help="recipe or YAML file (default: the embedded default)")
    ap.add_argument("--alternate", action="append", default=[], metavar="KEY=VALUE",
                    help="even steps run with this override too (repeatable); medians are printed for both")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides, as for verirl train")
    a = ap.parse_args()

    from verirl.config import load_config
    from verirl.train.build import build_run, step_settings, training_dtype
    from verirl.train.step import train_step
    from verirl.train.step_metrics import PHASES

    cfg = load_config(a.config, [*a.overrides, f"trainer.run_dir={tempfile.mkdtemp(prefix='verirl-phases-')}",
                                 "eval.before_train=false", "eval.at_end=false", "trainer.save_freq=0"])
    run = build_run(cfg)
    variants = [("config", run.step, getattr(run.engine, "compute_dtype", None))]
    if a.alternate:
        other = load_config(a.config, [*a.overrides, *a.alternate, f"trainer.run_dir={cfg.trainer.run_dir}"])
        variants.append((" ".join(a.alternate), step_settings(other, run.model, 1, run.step.peak_flops),
                         training_dtype(other, run.model)))
    try:
        for step in range(1, a.warmup + 1):
            train_step(run, step)
        times = [{p: [] for p in PHASES} for _ in variants]
        wall: list[list[float]] = [[] for _ in variants]
        for step in range(a.warmup + 1, a.warmup + a.steps + 1):
            v = (step - a.warmup - 1) % len(variants)  # the config first, then the override, and so on
            _, run.step, low = variants[v]
            if hasattr(run.engine, "compute_dtype"):
                run.engine.compute_dtype = low
            t = time.perf_counter()
            m, _ = train_step(run, step)
            wall[v].append(time.perf_counter() - t)
            for p in PHASES:
                times[v][p].append(m.get(f"timing/{p}", 0.0))
        for (name, _, _), tv, wv in zip(variants, times, wall):
            print(f"{len(wv)} steps after {a.warmup} ({name}): median ms a step  " + "  ".join(
                f"{p} {statistics.median(v) * 1e3:.1f}" for p, v in tv.items() if any(v))
                  + f"  | wall {statistics.median(wv) * 1e3:.1f} (min {min(wv) * 1e3:.1f}, max {max(wv) * 1e3:.1f})")
        _, run.step, low = variants[0]  # the config's own for the profile
        if hasattr(run.engine, "compute_dtype"):
            run.engine.compute_dtype = low
        if a.prof:
            from torch.profiler import ProfilerActivity, profile

            first = a.warmup + a.steps + 1
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                for step in range(first, first + a.prof):
                    train_step(run, step)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
            print(prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=30, max_shapes_column_width=60))
    finally:
        run.scorer.close()
        run.lock.release()


if __name__ == "__main__":
    main()
