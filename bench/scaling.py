"""Scaling on this machine: the embedded recipe (or a model of SmolLM2-135M's size) with 1 rank and with
several ranks laid out as data parallel (ddp, fsdp2) or tensor parallel, one thread each, the same global
batch (so the same rollouts and updates).

    .venv/bin/python bench/scaling.py                           # 1 rank, then 2 ranks with ddp and with fsdp2
    .venv/bin/python bench/scaling.py --ranks 1 2 --strategies fsdp2 --steps 20
    .venv/bin/python bench/scaling.py --model smollm2-8h --layouts 1 dp2 tp2 sp2 pp2 --budget 512

A layout is ``1`` (one rank), ``dpN`` (N ranks, data parallel with --strategies' first, or ``dpN-ddp`` /
``dpN-fsdp2``), ``tpN`` (N ranks, each layer split over them), ``spN`` (each micro-batch's tokens split over
them), ``ppN`` (stages of layers), or several joined by x (``dp2xtp2``). ``--model smollm2-8h`` is
SmolLM2-135M's shape (576 wide, 30 layers, 49,152-token vocabulary, tied) with 8 attention heads and 4
key/value heads instead of 9 and 3 (which 2 ranks cannot split), random weights, the tiny tokenizer;
built once under the verirl cache. Its responses are random tokens, so every one runs to
``--max-new-tokens``.

Each configuration runs `verirl train` in its own process tree (the ranks through torch's elastic
launcher) and reads its metrics.jsonl: s/step from the mean `timing/all` of the measured steps (rank 0's
step time; `timing/all_max` is the slowest rank's), tokens/s = (prompt + response tokens of the global
batch) / step time. Ratios are against 1 rank. Absolute figures differ between machines of this kind by 2x
or more; the ratio is the figure to compare. Memory per rank, the largest over the ranks:
`perf/model_states_gb` (parameters, gradients, AdamW state and the reference's parameters this rank
holds: what FSDP2 shards and tensor parallelism splits) and `perf/max_rss_gb` (the rank process's peak
resident memory, the Python runtime, torch and the activations included).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PART = re.compile(r"(dp|tp|sp|pp)(\d+)")


def parse_layout(name: str, strategy: str) -> tuple[int, dict[str, int], str]:
    """(ranks, {"tp": .., "sp": .., "pp": ..}, strategy) of a layout name: 1, or parts such as dp2, tp2, sp2,
    pp2 joined by x (dp2xtp2), optionally -ddp / -fsdp2."""
    sizes = {"dp": 1, "tp": 1, "sp": 1, "pp": 1}
    if name == "1":
        return 1, sizes, "-"
    body, _, chosen = name.partition("-")
    parts = body.split("x")
    if chosen not in ("", "ddp", "fsdp2") or not all(PART.fullmatch(part) for part in parts):
        raise SystemExit(f"--layouts: {name!r} is not 1 or parts dpN, tpN, spN, ppN joined by x (optionally -ddp / "
                         f"-fsdp2)")
    for part in parts:
        kind, n = PART.fullmatch(part).groups()
        sizes[kind] = int(n)
    ranks = sizes["dp"] * sizes["tp"] * sizes["sp"] * sizes["pp"]
    return ranks, sizes, chosen or strategy


def model_dir(name: str) -> str:
    if name == "tiny":
        return "tiny"
    from verirl.core.cache import cache_root

    out = cache_root() / "bench-smollm2-shape-8-heads"
    if not (out / "config.json").exists():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import gpu_check

        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        gpu_check.build_model_dir(tmp, dict(gpu_check.SMOLLM2_135M, num_attention_heads=8, num_key_value_heads=4))
        tmp.rename(out)
    return str(out)


def run(layout: str, ranks: int, sizes: dict, strategy: str, a) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"scaling-{layout}-"))
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={out}", f"model.path={model_dir(a.model)}",
           f"trainer.total_steps={a.warmup + a.steps}", f"trainer.nproc_per_node={ranks}",
           f"actor.strategy={strategy if sizes['dp'] > 1 else 'fsdp2'}",
           *(f"actor.{key}_parallel_size={sizes[k]}" for k, key in (("tp", "tensor"), ("sp", "sequence"), ("pp", "pipeline"))
             if sizes[k] > 1),
           "trainer.threads=1", "reward.workers=1", f"data.prompts_per_step={a.prompts}",
           f"actor.mini_batch_prompts={a.prompts}", "eval.before_train=false", "eval.at_end=false",
           "log.progress=false", "log.console_every=0", "trainer.save_freq=0"]
    if a.max_new_tokens:
        cmd.append(f"rollout.max_new_tokens={a.max_new_tokens}")
    if a.budget:
        cmd.append(f"actor.max_token_len_per_device={a.budget}")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][a.warmup:]
    step = sum(r["timing/all"] for r in rows) / len(rows)
    slowest = sum(r.get("timing/all_max", r["timing/all"]) for r in rows) / len(rows)
    tokens = sum((r["prompt_length/mean"] + r["response_length/mean"]) * a.prompts * 8 for r in rows) / len(rows)
    shutil.rmtree(out, ignore_errors=True)
    return {"layout": layout, "ranks": ranks, "strategy": strategy if sizes["dp"] > 1 else "-", "step_s": step,
            "step_max_s": slowest, "steps_per_s": 1 / step, "tokens_per_s": tokens / step,
            "states_mb": rows[-1]["perf/model_states_gb"] * 1024, "rss_mb": rows[-1]["perf/max_rss_gb"] * 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="data-parallel layouts (without --layouts)")
    ap.add_argument("--strategies", nargs="+", default=["ddp", "fsdp2"], help="for the runs with more than 1 rank")
    ap.add_argument("--layouts", nargs="+", default=None, help="1, dpN, tpN, dpMxtpN (instead of --ranks)")
    ap.add_argument("--model", choices=["tiny", "smollm2-8h"], default="tiny")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (x 8 samples), the global batch")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="rollout.max_new_tokens (0: the recipe's)")
    ap.add_argument("--budget", type=int, default=0, help="actor.max_token_len_per_device (needed with ppN; 0: none)")
    a = ap.parse_args()
    if a.layouts:
        configs = [(name, *parse_layout(name, a.strategies[0])) for name in a.layouts]
    else:
        configs = [("1", *parse_layout("1", "-")) if r == 1 else (f"dp{r}-{s}", *parse_layout(f"dp{r}-{s}", s))
                   for r in a.ranks for s in (a.strategies if r > 1 else ["-"])]
    results = [run(name, ranks, sizes, s, a) for name, ranks, sizes, s in configs]
    base = results[0]
    print(f"model {a.model}; {a.prompts} prompts x 8 samples per step; {a.steps} measured steps after {a.warmup}"
          + (f"; token budget {a.budget} per rank" if a.budget else ""))
    print(f"{'layout':>10} {'ranks':>5} {'strategy':>8} {'s/step':>8} {'slowest':>8} {'steps/s':>8} {'tokens/s':>9} "
          f"{'speed-up':>9} {'states MB/rank':>15} {'x 1 rank':>9} {'peak RSS MB/rank':>17}")
    for r in results:
        print(f"{r['layout']:>10} {r['ranks']:>5} {r['strategy']:>8} {r['step_s']:>8.3f} {r['step_max_s']:>8.3f} "
              f"{r['steps_per_s']:>8.2f} {r['tokens_per_s']:>9.0f} {base['step_s'] / r['step_s']:>8.2f}x "
              f"{r['states_mb']:>15.2f} {r['states_mb'] / base['states_mb']:>8.2f}x {r['rss_mb']:>17.0f}")


if __name__ == "__main__":
    main()
