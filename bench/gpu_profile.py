"""Where the packed log-prob pass spends its time on a GPU (section 3 of gpu_check.py, taken apart)."""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as gc  # noqa: E402


def main():
    smoke = "--cpu-smoke" in sys.argv
    device = torch.device("cpu" if smoke else "cuda:0")
    from verirl.models import load_model
    from verirl.train import packing
    from verirl.train.actor import LogprobPass, sequence_logprobs
    from verirl.train.packing import PackCache, pack_rows

    work = Path(tempfile.mkdtemp())
    model_dir, _ = gc.build_model_dir(work / "model", gc.SMOKE if smoke else gc.SMOLLM2_135M)
    dtype = "float32" if smoke else "bfloat16"
    model = load_model(str(model_dir), dtype, device.type).model.eval()
    groups, n = (2, 4) if smoke else (8, 8)
    roll = gc.synthetic_rollout(366, groups, n, (16, 48) if smoke else (32, 256), (8, 40) if smoke else (16, 1024), device)
    micro = 16
    N = roll.response_ids.shape[0]
    mbs = [list(range(s, min(N, s + micro))) for s in range(0, N, micro)]

    def run(how, cache=None, grad=False):
        for rows in mbs:
            with torch.set_grad_enabled(grad):
                lp, _, m = sequence_logprobs(model, roll, rows, how, layouts=cache)
                if grad:
                    (lp * m).sum().backward()
    caches = {}

    def variant(name, how, cached=False, kernel="default", grad=False, reps=3):
        saved = dict(packing._KERNEL)
        if kernel != "default":
            packing._KERNEL["fn"] = kernel  # None: the buckets
        cache = caches.setdefault(how.share_prompt, PackCache(roll)) if cached else None
        try:
            t, _ = gc.timed(lambda: run(how, cache, grad), device, reps)
            gc.say(f"  {name:<64} {t * 1e3:9.1f} ms")
        except Exception as e:
            gc.say(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
        finally:
            packing._KERNEL.clear()
            packing._KERNEL.update(saved)
            model.zero_grad(set_to_none=True)

    t = time.perf_counter()
    for rows in mbs:
        pack_rows(roll, rows, True)
    gc.say(f"  pack_rows for all {len(mbs)} micro-batches: {(time.perf_counter() - t) * 1e3:.1f} ms (CPU)")
    kernel = packing._varlen_kernel(torch.zeros(1, device=device, dtype=model.dtype))
    gc.say(f"  default kernel: {getattr(kernel, '__module__', None)}.{getattr(kernel, '__qualname__', None)}")
    for grad in (False, True):
        gc.say(f"-- {'forward + backward' if grad else 'forward, no grad'}")
        variant("padded", LogprobPass(remove_padding=False), grad=grad)
        variant("packed as before: buckets, 85-row chunks, layouts made each pass", LogprobPass(chunk=85), kernel=None, grad=grad)
        variant("packed, buckets, layouts cached", LogprobPass(), cached=True, kernel=None, grad=grad)
        variant("packed default (layouts made each pass)", LogprobPass(), grad=grad)
        variant("packed default, layouts cached", LogprobPass(), cached=True, grad=grad)
        variant("packed default, no prompt sharing, cached", LogprobPass(share_prompt=False), cached=True, grad=grad)
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    how = LogprobPass()
    cache = PackCache(roll)
    run(how, cache)
    with profile(activities=acts) as prof:
        run(how, cache)
        gc.sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    gc.say(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=50))


if __name__ == "__main__":
    main()
