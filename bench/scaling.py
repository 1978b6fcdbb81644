"""Data-parallel scaling on this machine: the embedded recipe with 1 rank and with N ranks (ddp and
fsdp2), one thread each, the same global batch (so the same rollouts and updates).

    .venv/bin/python bench/scaling.py                 # 1 rank, then 2 ranks with ddp and with fsdp2
    .venv/bin/python bench/scaling.py --ranks 1 2 --strategies fsdp2 --steps 20

Each configuration runs `verirl train` in its own process tree (the ranks through torch's elastic
launcher) and reads its metrics.jsonl: steps/s from the mean `timing/all` of the measured steps
(rank 0's step time; `timing/all_max` is the slowest rank's), tokens/s = (prompt + response tokens
of the global batch) / step time. Ratios are against 1 rank. Absolute figures differ between
machines of this kind by 2x or more; the ratio is the figure to compare. Memory per rank, the
largest over the ranks: `perf/model_states_gb` (parameters, gradients, AdamW state and the
reference's parameters this rank holds: what FSDP2 shards) and `perf/max_rss_gb` (the rank
process's peak resident memory, the Python runtime, torch and the activations included).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(ranks: int, strategy: str, steps: int, warmup: int, prompts: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"scaling-{ranks}-{strategy}-"))
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={out}",
           f"trainer.total_steps={warmup + steps}", f"trainer.nproc_per_node={ranks}", f"actor.strategy={strategy}",
           "trainer.threads=1", "reward.workers=1", f"data.prompts_per_step={prompts}",
           f"actor.mini_batch_prompts={prompts}", "eval.before_train=false", "eval.at_end=false",
           "log.progress=false", "log.console_every=0", "trainer.save_freq=0"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][warmup:]
    step = sum(r["timing/all"] for r in rows) / len(rows)
    slowest = sum(r.get("timing/all_max", r["timing/all"]) for r in rows) / len(rows)
    tokens = sum((r["prompt_length/mean"] + r["response_length/mean"]) * prompts * 8 for r in rows) / len(rows)
    return {"ranks": ranks, "strategy": strategy if ranks > 1 else "-", "step_s": step, "step_max_s": slowest,
            "steps_per_s": 1 / step, "tokens_per_s": tokens / step,
            "states_mb": rows[-1]["perf/model_states_gb"] * 1024, "rss_mb": rows[-1]["perf/max_rss_gb"] * 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--strategies", nargs="+", default=["ddp", "fsdp2"], help="for the runs with more than 1 rank")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (x 8 samples), the global batch")
    a = ap.parse_args()
    configs = [(r, s) for r in a.ranks for s in (a.strategies if r > 1 else ["ddp"])]
    results = [run(r, s, a.steps, a.warmup, a.prompts) for r, s in configs]
    base = results[0]
    print(f"{'ranks':>5} {'strategy':>8} {'s/step':>8} {'slowest':>8} {'steps/s':>8} {'tokens/s':>9} {'speed-up':>9} "
          f"{'states MB/rank':>15} {'peak RSS MB/rank':>17}")
    for r in results:
        print(f"{r['ranks']:>5} {r['strategy']:>8} {r['step_s']:>8.3f} {r['step_max_s']:>8.3f} {r['steps_per_s']:>8.2f} "
              f"{r['tokens_per_s']:>9.0f} {base['step_s'] / r['step_s']:>8.2f}x {r['states_mb']:>15.2f} "
              f"{r['rss_mb']:>17.0f}")


if __name__ == "__main__":
    main()
