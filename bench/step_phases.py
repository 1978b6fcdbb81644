"""The embedded default's GRPO steps, timed by phase, and where their time goes by operation.

    .venv/bin/python bench/step_phases.py                  # 10 warm-up steps, then 40 timed: medians per phase
    .venv/bin/python bench/step_phases.py --prof 5         # and a torch profile of 5 more steps, by operation
    LD_PRELOAD=... .venv/bin/python bench/step_phases.py   # the same under another allocator, etc.

For A/B runs of a setting on a machine whose speed drifts (BENCHMARKS.md: 1.5x within an hour on
2-core machines), run the variants alternately, several times each, and compare their medians; a
single pair says little. Any `verirl train` override can follow (`rollout.n=4`, `--config FILE`).
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
    ap.add_argument("overrides", nargs="*", help="key=value config overrides, as for verirl train")
    a = ap.parse_args()

    from verirl.config import load_config
    from verirl.train.build import build_run
    from verirl.train.step import PHASES, train_step

    cfg = load_config(a.config, [*a.overrides, f"trainer.run_dir={tempfile.mkdtemp(prefix='verirl-phases-')}",
                                 "eval.before_train=false", "eval.at_end=false", "trainer.save_freq=0"])
    run = build_run(cfg)
    try:
        for step in range(1, a.warmup + 1):
            train_step(run, step)
        times: dict[str, list[float]] = {p: [] for p in PHASES}
        wall = []
        for step in range(a.warmup + 1, a.warmup + a.steps + 1):
            t = time.perf_counter()
            m, _ = train_step(run, step)
            wall.append(time.perf_counter() - t)
            for p in PHASES:
                times[p].append(m.get(f"timing/{p}", 0.0))
        print(f"{a.steps} steps after {a.warmup}: median ms a step  " + "  ".join(
            f"{p} {statistics.median(v) * 1e3:.1f}" for p, v in times.items() if any(v))
              + f"  | wall {statistics.median(wall) * 1e3:.1f} (min {min(wall) * 1e3:.1f}, max {max(wall) * 1e3:.1f})")
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
