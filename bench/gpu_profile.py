"""Where a GPU's time goes in two of verirl's passes, taken apart (bench/gpu_check.py runs them whole).

    python3 bench/gpu_profile.py               # both, on the GPU machine (set up as gpu_check.sh does)
    python3 bench/gpu_profile.py decode        # one of: packed, decode, packed-small (a GRPO step of grpo_vs_trl)
    .venv/bin/python bench/gpu_profile.py --cpu-smoke   # tiny sizes on the CPU (tests this script)

packed: the packed log-prob pass (buckets or a variable-length kernel; head chunk sizes; layouts cached
or not) against padded rows, forward and forward + backward, and a profile of the default.
decode: the native engine's decoding steps captured as a CUDA graph against the same steps run eagerly
(one shape; and growing with the cache, with compaction): time, tokens/s, and whether tokens agree.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check as gc  # noqa: E402


def packed(model_dir, device, smoke, small=False):
    """``small``: one micro-batch of a GRPO step of bench/grpo_vs_trl.py (8 prompts of 30-40 tokens x 8
    responses of 32), where launches and host work, not arithmetic, set the time."""
    from verirl.models import load_model
    from verirl.core.ops import varlen
    from verirl.train.update import LogprobPass, sequence_logprobs
    from verirl.train.packing import PackCache, pack_rows

    dtype = "float32" if smoke else "bfloat16"
    model = load_model(str(model_dir), dtype, device.type).model.eval()
    groups, n = (2, 4) if smoke else (8, 8)
    p_range, r_range, micro = ((16, 48), (8, 40), 16) if smoke else ((32, 256), (16, 1024), 16)
    if small:
        p_range, r_range, micro = (30, 40), (32, 32), groups * n
    roll = gc.synthetic_rollout(366, groups, n, p_range, r_range, device)
    gc.say(f"  {groups} prompts x n={n}, prompts {p_range}, responses {r_range} tokens, {micro} rows per micro-batch")
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
        saved = dict(varlen._KERNEL)
        if kernel != "default":
            varlen._KERNEL["fn"] = kernel  # None: the buckets
        cache = caches.setdefault(how.share_prompt, PackCache(roll)) if cached else None
        try:
            t, _ = gc.timed(lambda: run(how, cache, grad), device, reps)
            gc.say(f"  {name:<64} {t * 1e3:9.1f} ms")
        except Exception as e:
            gc.say(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
        finally:
            varlen._KERNEL.clear()
            varlen._KERNEL.update(saved)
            model.zero_grad(set_to_none=True)

    t = time.perf_counter()
    for rows in mbs:
        pack_rows(roll, rows, True)
    gc.say(f"  pack_rows for all {len(mbs)} micro-batches: {(time.perf_counter() - t) * 1e3:.1f} ms (CPU)")
    kernel = varlen.varlen_kernel(torch.zeros(1, 1, 64, device=device, dtype=model.dtype))  # a head size it takes
    gc.say(f"  default kernel: {getattr(kernel, '__module__', None)}.{getattr(kernel, '__qualname__', None)}")
    for grad in (False, True):
        gc.say(f"-- {'forward + backward' if grad else 'forward, no grad'}")
        variant("padded", LogprobPass(remove_padding=False), grad=grad)
        variant("packed as before: buckets, 85-row chunks, layouts made each pass", LogprobPass(chunk=85), kernel=None, grad=grad)
        variant("packed, buckets, layouts cached", LogprobPass(), cached=True, kernel=None, grad=grad)
        variant("packed default (layouts made each pass)", LogprobPass(), grad=grad)
        variant("packed default, layouts cached", LogprobPass(), cached=True, grad=grad)
        variant("packed default, no prompt sharing, cached", LogprobPass(share_prompt=False), cached=True, grad=grad)
        if device.type == "cuda":  # the default calls torch's flash kernels directly; its varlen_attn function:
            variant("packed, torch's varlen_attn function, cached", LogprobPass(), cached=True,
                    kernel=varlen.torch_varlen(direct=False), grad=grad)
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
    if small:  # where the host's time goes
        gc.say(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=50))


def decode(model_dir, device, smoke):
    from verirl.models import load_model
    from verirl.rollout import NativeEngine, SamplingParams, native

    dtype = "float32" if smoke else "bfloat16"
    model = load_model(str(model_dir), dtype, device.type).model.eval()
    prompts, n, new = (2, 2, 8) if smoke else (32, 8, 256)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 366, (int(L),), generator=g).tolist() for L in torch.linspace(20, 48, prompts)]
    eng = NativeEngine(model, 0, [2])
    gc.say(f"-- decode: {prompts} prompts x n={n}, {new} new tokens (a random model rarely stops), {dtype}")
    outs = {}
    grow = "eager, growing steps, compaction"
    for name, shape in [(grow, (False, False)), ("eager, one shape", (True, False)), ("CUDA graph", (True, True))]:
        if shape[1] and device.type != "cuda":
            continue
        orig = native._one_shape
        native._one_shape = lambda d, s=shape: s
        try:
            for params, tag in [(SamplingParams(max_new_tokens=new, temperature=0), "greedy"),
                                (SamplingParams(max_new_tokens=new, temperature=1.0, seed=1), "sampled")]:
                t, r = gc.timed(lambda: eng.generate(ids, n, params), device, 1 if smoke else 2)
                outs[(name, tag)] = r
                gc.say(f"  {name:<36} {tag:<8} {t:7.3f} s  {int(r.response_mask.sum()) / t:9.0f} tok/s")
        except Exception as e:
            gc.say(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
            gc.say("  " + "".join(gc.traceback.format_exc(limit=8)).replace("\n", "\n  "))
        finally:
            native._one_shape = orig
    for (name, tag), r in outs.items():
        ref = outs.get((grow, tag))
        if ref is None or name == grow:
            continue
        same = (r.response_ids == ref.response_ids).float().mean().item()
        diff = (r.response_ids != ref.response_ids).any(0).nonzero()
        gc.say(f"  {name}, {tag}: tokens equal to the growing steps' at {same:.2%} of positions (first difference "
               f"at column {int(diff[0]) if len(diff) else None})")
    one, graph = outs.get(("eager, one shape", "sampled")), outs.get(("CUDA graph", "sampled"))
    if one is not None and graph is not None:
        gc.say(f"  CUDA graph vs eager one shape, sampled: identical tokens {torch.equal(one.response_ids, graph.response_ids)}")


def main():
    smoke = "--cpu-smoke" in sys.argv
    which = [a for a in sys.argv[1:] if not a.startswith("--")] or ["packed", "decode"]  # or packed-small
    device = torch.device("cpu" if smoke else "cuda:0")
    work = Path(tempfile.mkdtemp())
    model_dir, _ = gc.build_model_dir(work / "model", gc.SMOKE if smoke else gc.SMOLLM2_135M)
    for name in which:
        t = time.perf_counter()
        try:
            {"packed": packed, "decode": decode, "packed-small": lambda *a: packed(*a, small=True)}[name](
                model_dir, device, smoke)
        except Exception:
            gc.say(gc.traceback.format_exc())
        gc.say(f"  ({name}: {time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
