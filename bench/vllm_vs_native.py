"""vLLM against verirl's native engine on SmolLM2-135M-Instruct, on this CPU, in one run.

    .venv/bin/python -c "from verirl.models.smollm2 import smollm2_dir; print(smollm2_dir())"   # build the HF dir once
    .venv-vllm/bin/python bench/vllm_vs_native.py --model DIR          # DIR: what the line above printed

Rollout: the same prompts (the built-in arithmetic task, chat-templated), n samples each, the same
max_new_tokens, temperature 1, each engine in this process; tokens/s = generated tokens / wall time
of the generate call (median of --repeats, after one warm-up call). Steps: `verirl train` with each
engine, the same config, the mean `timing/all` and `timing/rollout` of the steps after the first.
Ratios are vllm / native (above 1: vLLM faster). Absolute figures differ between machines of this
kind by 2x or more; the ratio is the figure to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rollout_rate(engine, prompts, n: int, max_new_tokens: int, repeats: int) -> float:
    from verirl.rollout import SamplingParams

    rates = []
    for r in range(repeats + 1):
        params = SamplingParams(max_new_tokens, 1.0, seed=100 + r)
        t = time.perf_counter()
        out = engine.generate(prompts, n, params)
        took = time.perf_counter() - t
        if r:  # the first call warms up
            rates.append(float(out.response_lengths.sum()) / took)
    return statistics.median(rates)


def step_times(model: str, engine: str, steps: int, prompts: int, n: int, max_new_tokens: int) -> tuple[float, float]:
    run = Path(tempfile.mkdtemp(prefix=f"vllm-bench-{engine}-"))
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"model.path={model}", f"rollout.engine={engine}",
           f"trainer.run_dir={run}", f"trainer.total_steps={steps}", f"data.prompts_per_step={prompts}",
           f"actor.mini_batch_prompts={prompts}", f"rollout.n={n}", f"rollout.max_new_tokens={max_new_tokens}",
           "eval.before_train=false", "eval.at_end=false", "log.progress=false", "trainer.save_freq=0",
           "reward.workers=1", "algo.kl_coef=0", "data.max_prompt_length=128", "actor.lr=1e-6"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]
    return (statistics.mean(r["timing/all"] for r in rows), statistics.mean(r["timing/rollout"] for r in rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face directory (SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps per engine (the first is not counted)")
    a = ap.parse_args()

    import torch

    from verirl.data import arith_split, encode_prompts
    from verirl.models import load_model
    from verirl.rollout import build_engine
    from verirl.rollout.vllm import vllm_options
    from verirl.config import RolloutConfig

    threads = torch.get_num_threads()
    lm = load_model(a.model, "float32", "cpu")
    _, val = arith_split(0, 0, a.prompts)
    ids = [p.ids for p in encode_prompts(val, lm.tokenizer, 128, "bench", "filter")]
    native = build_engine("native", lm.model, lm.pad_id, lm.stop_ids)
    native_rate = rollout_rate(native, ids, a.n, a.max_new_tokens, a.repeats)
    options = vllm_options(RolloutConfig(), lm, "float32", {}, a.prompts * a.n, 128 + a.max_new_tokens, 0)
    started = time.perf_counter()
    vllm = build_engine("vllm", lm.model, lm.pad_id, lm.stop_ids, **options)
    start_s = time.perf_counter() - started
    vllm_rate = rollout_rate(vllm, ids, a.n, a.max_new_tokens, a.repeats)
    del vllm
    print(f"rollout, {a.prompts} prompts x {a.n}, <= {a.max_new_tokens} new tokens, T=1, {threads} threads:")
    print(f"  native {native_rate:8.0f} tok/s   vllm {vllm_rate:8.0f} tok/s   ratio vllm/native {vllm_rate / native_rate:.2f}x"
          f"   (vLLM engine start {start_s:.0f} s)")
    steps = {e: step_times(a.model, e, a.steps, a.prompts // 2, a.n, a.max_new_tokens // 2) for e in ("native", "vllm")}
    print(f"GRPO step, {a.prompts // 2} prompts x {a.n}, <= {a.max_new_tokens // 2} new tokens (mean of steps 2..{a.steps}):")
    for e, (step, roll) in steps.items():
        print(f"  {e:6} {step:7.2f} s/step   rollout {roll:6.2f} s")
    print(f"  ratio native/vllm step time {steps['native'][0] / steps['vllm'][0]:.2f}x")


if __name__ == "__main__":
    main()
