"""Asynchronous training against the synchronous step, on the embedded default (docs/async.md).

Three runs per seed, each `verirl train` in its own process, with ``reward.workers`` the same in all:

* ``sync``: the colocated synchronous run on both cores (one process, ``trainer.threads=2``);
* ``async``: one producer and one trainer, one core each (``rollout.placement=separate``,
  ``trainer.nproc_per_node=2``, ``trainer.threads=1``), ``max_staleness=1``, ``mode=fixed``, the same
  number of steps: steps/s against ``sync``, and held-out pass@1 at an equal number of steps;
* ``async_wall``: the same asynchronous run for as many steps as fit in the synchronous run's training
  time (steps x sync seconds / async seconds): held-out pass@1 at equal wall clock.

Steps/s is steps / the summary's train_seconds (the sum of the steps' times, start-up and evaluation
excluded). Held-out: the run's own evaluation after its last step (eval.size=200 problems, 4 samples
each: val/pass@1, and greedy: val/greedy_acc). Each figure is the mean of the seeds.

    .venv/bin/python bench/async.py                    # seeds 0,1,2, the default's 700 steps (~25 min)
    .venv/bin/python bench/async.py --seeds 0 --steps 100
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(run: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={run}", "log.progress=off",
           "log.console_every=0", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads((run / "summary.json").read_text())


def figures(summary: dict) -> dict:
    end = summary.get("eval_end", {})
    return {"steps": summary["steps"], "seconds": summary["train_seconds"],
            "steps_per_s": summary["steps"] / summary["train_seconds"],
            "pass@1": end.get("val/pass@1", float("nan")), "greedy": end.get("val/greedy_acc", float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=700, help="the synchronous run's steps (the default's 700)")
    ap.add_argument("--workers", type=int, default=1, help="reward.workers in every run")
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--mode", default="fixed", choices=["fixed", "bounded"])
    args = ap.parse_args()
    common = [f"trainer.total_steps={args.steps}", f"reward.workers={args.workers}"]
    separate = ["rollout.placement=separate", "trainer.nproc_per_node=2", "rollout.nproc=1", "trainer.threads=1",
                f"trainer.async_training.max_staleness={args.staleness}", f"trainer.async_training.mode={args.mode}"]
    rows: dict[str, list[dict]] = {"sync": [], "async": [], "async_wall": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            s = [f"trainer.seed={seed}"]
            sync = figures(train(Path(tmp) / f"sync{seed}", *common, *s, "trainer.threads=2"))
            rows["sync"].append(sync)
            fast = figures(train(Path(tmp) / f"async{seed}", *common, *s, *separate))
            rows["async"].append(fast)
            wall_steps = max(1, round(args.steps * sync["seconds"] / fast["seconds"]))
            rows["async_wall"].append(figures(train(Path(tmp) / f"wall{seed}", *s, *separate,
                                                    f"trainer.total_steps={wall_steps}",
                                                    f"reward.workers={args.workers}")))
            print(f"seed {seed}: " + "; ".join(f"{k} {v[-1]['steps']} steps {v[-1]['seconds']:.1f}s "
                                              f"pass@1 {v[-1]['pass@1']:.3f} greedy {v[-1]['greedy']:.3f}"
                                              for k, v in rows.items()), flush=True)
    mean = {k: {f: statistics.mean(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    print(f"\n{'run':<11} {'steps':>7} {'train s':>8} {'steps/s':>8} {'pass@1':>7} {'greedy':>7}")
    for k, m in mean.items():
        print(f"{k:<11} {m['steps']:>7.0f} {m['seconds']:>8.1f} {m['steps_per_s']:>8.2f} {m['pass@1']:>7.3f} "
              f"{m['greedy']:>7.3f}")
    print(f"\nsteps/s async / sync: {mean['async']['steps_per_s'] / mean['sync']['steps_per_s']:.2f}x "
          f"(k={args.staleness}, mode={args.mode}); pass@1 at equal steps {mean['async']['pass@1']:.3f} vs "
          f"{mean['sync']['pass@1']:.3f} ({100 * (mean['async']['pass@1'] - mean['sync']['pass@1']):+.1f} points); "
          f"at equal wall clock {mean['async_wall']['pass@1']:.3f} ({100 * (mean['async_wall']['pass@1'] - mean['sync']['pass@1']):+.1f} points)")


if __name__ == "__main__":
    main()
