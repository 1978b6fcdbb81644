"""The GPU check: what verirl does on one CUDA GPU, in one run of a few minutes, with no network.

Run it through bench/gpu_check.sh on the GPU machine (it installs the small wheels of bench/wheels/ and
puts src/ on the path); here, on a CPU, `--cpu-smoke` runs every section on tiny sizes in float32.

    bash bench/gpu_check.sh                        # the GPU machine: prints the report
    .venv/bin/python bench/gpu_check.py --cpu-smoke

The model is SmolLM2-135M's shape (LlamaForCausalLM: hidden 576, 30 layers, 9 heads, 3 KV heads, MLP
1536, vocabulary 49,152, tied embeddings, rope_theta 100000, rms_norm_eps 1e-5) with random weights
(SmolLM2's files are too large to bring), saved with verirl's tiny tokenizer: its ids are all below
366, so every prompt is valid for the 49,152-row embedding; generated ids above 365 decode to nothing.
A random model never emits EOS, so every response runs to max_new_tokens: the timings are of full-length
responses, and the rewards (all equal) give zero advantages; the update still runs its full forward and
backward.

Sections (each in try/except: a failure is printed and the next section runs):
  1. GRPO steps through `verirl train` (native engine, bf16): per-phase timings, tokens/s, peak memory,
     update MFU;
  2. FSDP2 on one rank (a one-process NCCL group; verirl shards only with 2+ ranks, so `shard` is called
     directly): log-probs against the unsharded model, an AdamW update, the full-weights rollout, the
     gathered state dict;
  3. packed vs padded log-probs in bf16: padded rows (SDPA), verirl's packed buckets (small_attention /
     SDPA), and the packed layout through torch's own variable-length attention where torch has it,
     each against a float32 padded reference.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# Dense bf16 peak of an H100/H200 SXM: 989.4 TFLOP/s (NVIDIA H200 datasheet: 1,979 with 2:4 sparsity).
# A plain 8192^3 bf16 matmul measured 769-798 TFLOP/s on this workplace's H200 (device KINDS.md).
H200_BF16_PEAK = 989.4e12
SMOLLM2_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                    rms_norm_eps=1e-5, max_position_embeddings=8192, hidden_act="silu", initializer_range=0.02)
SMOKE = dict(SMOLLM2_135M, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128)
SKIPPED: list[str] = []


def say(msg: str = "") -> None:
    print(msg, flush=True)


def skip(what: str, why: str) -> None:
    SKIPPED.append(f"{what}: {why}")
    say(f"  SKIPPED {what}: {why}")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, reps: int):
    """(median seconds, last result) over ``reps`` runs after one warm-up run."""
    out = fn()
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def peak_gib(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def section(title: str, budget_s: float):
    """Decorator: run the section, print its error instead of raising, and say when it ran past its budget."""
    def wrap(fn):
        def run(*a, **kw):
            say(f"\n== {title} (budget {budget_s:.0f} s)")
            t = time.perf_counter()
            try:
                fn(*a, **kw)
            except Exception as e:  # a failed section must not stop the others
                say(f"  FAILED: {type(e).__name__}: {e}")
                say("  " + "".join(traceback.format_exc(limit=6)).replace("\n", "\n  "))
                SKIPPED.append(f"{title}: failed ({type(e).__name__}: {str(e)[:200]})")
            took = time.perf_counter() - t
            say(f"  section time {took:.1f} s" + (f"  (OVER its {budget_s:.0f} s budget)" if took > budget_s else ""))
        return run
    return wrap


def environment(device: torch.device) -> None:
    import transformers

    say(f"python {sys.version.split()[0]}  torch {torch.__version__}  transformers {transformers.__version__}  "
        f"cuda {torch.version.cuda}")
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        say(f"device {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, "
            f"capability {p.major}.{p.minor}")
    else:
        say(f"device cpu, {torch.get_num_threads()} threads")
    try:
        import flash_attn  # noqa: F401
        say(f"flash-attn {flash_attn.__version__} installed")
    except ImportError:
        skip("flash-attn varlen path (verirl.core.ops.varlen.varlen_kernel)", "flash-attn is not installed here; torch's varlen_attn stands in")
    try:
        import vllm  # noqa: F401
        say("vllm installed (this check does not run it)")
    except ImportError:
        skip("rollout.engine=vllm", "vLLM is not installed here (its wheels are too large to bring)")


def build_model_dir(out: Path, shape: dict) -> tuple[Path, int]:
    """A SmolLM2-shaped LlamaForCausalLM with random weights and verirl's tiny tokenizer."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from verirl.models.load import TINY_DIR

    cfg = LlamaConfig(**shape, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=2, pad_token_id=0).save_pretrained(out)
    for f in TINY_DIR.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy(f, out / f.name)
    return out, params


def grpo_steps(model_dir: Path, params: int, device: torch.device, dtype: str, smoke: bool, work: Path) -> None:
    from verirl.cli import main

    prompts, n, new = (4, 4, 16) if smoke else (32, 8, 256)
    steps = 1 if smoke else 4
    run_dir = work / "grpo"
    args = ["train", "--config", "tiny", f"model.path={model_dir}", f"model.dtype={dtype}",
            f"model.device={device.type}", "rollout.engine=native", f"data.prompts_per_step={prompts}",
            f"actor.mini_batch_prompts={prompts}", f"rollout.n={n}", f"rollout.max_new_tokens={new}",
            "actor.max_token_len_per_device=16384", "actor.lr=1e-6", f"trainer.total_steps={steps}",
            f"trainer.run_dir={run_dir}", "trainer.resume=false", "trainer.overwrite=true", "trainer.save_freq=0",
            "eval.before_train=false", "eval.at_end=false", "reward.workers=2", "log.progress=false",
            "log.console_every=1"]
    say(f"  verirl train: {prompts} prompts x n={n}, {new} new tokens, on-policy (no old-log-prob pass), "
        f"kl_coef 0.001 (a reference pass), token budget 16384, {steps} steps, {dtype} on {device.type}")
    reset_peak(device)
    t = time.perf_counter()
    rc = main(args)
    wall = time.perf_counter() - t
    if rc != 0:
        raise RuntimeError(f"verirl train returned {rc}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    say(f"  {len(rows)} steps in {wall:.1f} s wall (model load, reward workers and the final save included)")
    phases = ["rollout", "reward", "old_log_prob", "ref", "update", "all"]
    say("  step " + " ".join(f"{p:>12}" for p in phases) + "   tok/s  gen tok/s  peak GiB  update MFU")
    for r in rows:
        seqs = prompts * n
        tokens = (r["prompt_length/mean"] + r["response_length/mean"]) * seqs
        gen = r["response_length/mean"] * seqs / max(r["timing/rollout"], 1e-9)
        mfu = 6 * params * tokens / max(r["timing/update"], 1e-9) / H200_BF16_PEAK
        mem = r.get("perf/max_memory_allocated_gb", r.get("perf/max_rss_gb", float("nan")))
        say(f"  {r['step']:>4} " + " ".join(f"{r.get('timing/' + p, 0.0):>11.3f}s" for p in phases)
            + f" {r['perf/tps']:>7.0f} {gen:>10.0f} {mem:>9.2f} {mfu:>10.1%}")
    say(f"  prompt length {rows[-1]['prompt_length/mean']:.1f}, response length {rows[-1]['response_length/mean']:.1f} "
        f"(clip ratio {rows[-1]['response_length/clip_ratio']:.2f}); MFU = 6 x {params:,} params x (prompt + response) "
        f"tokens of the step / timing/update / {H200_BF16_PEAK / 1e12:.1f} TFLOP/s (H200 dense bf16 peak); "
        f"step 1 includes warm-up")


def synthetic_rollout(vocab: int, groups: int, n: int, p_range, r_range, device, seed: int = 0):
    """groups x n rows, each group one prompt (length spread over p_range) and n responses (lengths spread
    over r_range); random ids below ``vocab``."""
    from verirl.rollout.base import left_pad
    from verirl.core.types import Rollout

    g = torch.Generator().manual_seed(seed)
    N = groups * n
    p_lens = torch.linspace(*p_range, groups).round().long().tolist()
    r_lens = torch.linspace(*r_range, N).round().long()[torch.randperm(N, generator=g)].tolist()
    prompts = []
    for L in p_lens:
        p = torch.randint(3, vocab, (L,), generator=g).tolist()
        prompts += [p] * n
    p_ids, p_mask = left_pad(prompts, 0)
    R = max(r_lens)
    r_ids = torch.zeros((N, R), dtype=torch.long)
    r_mask = torch.zeros((N, R), dtype=torch.long)
    for i, L in enumerate(r_lens):
        r_ids[i, :L] = torch.randint(3, vocab, (L,), generator=g)
        r_mask[i, :L] = 1
    return Rollout(p_ids.to(device), p_mask.to(device), r_ids.to(device), r_mask.to(device), r_mask.to(device, copy=True),
                   torch.zeros(N, dtype=torch.bool, device=device))


def all_logprobs(model, roll, how, micro: int) -> torch.Tensor:
    """(N, R) float32 log-probs of every response token (0 elsewhere), ``micro`` sequences per forward."""
    from verirl.train.update import sequence_logprobs

    N, R = roll.response_ids.shape
    out = torch.zeros((N, R), dtype=torch.float32, device=roll.response_ids.device)
    with torch.no_grad():
        for s in range(0, N, micro):
            rows = list(range(s, min(N, s + micro)))
            lp, _, m = sequence_logprobs(model, roll, rows, how)
            out[rows, :lp.shape[1]] = lp.float() * m
    return out


def diff_line(name: str, x: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> str:
    d = (x - ref).abs()[mask.bool()]
    return f"max |diff| {d.max().item():.3e}, mean {d.mean().item():.3e} ({name})"


def fsdp_one_rank(model_dir: Path, device: torch.device, smoke: bool) -> None:
    import torch.distributed as tdist

    from verirl.models import load_model
    from verirl.rollout import build_engine
    from verirl.rollout.base import SamplingParams
    from verirl.train.update import LogprobPass, UpdateParams, build_optimizer, update_policy
    from verirl.train.distributed import Dist
    from verirl.train.strategy import full_state_dict, full_weights, shard
    from verirl.core.types import TrainBatch

    backend = "nccl" if device.type == "cuda" else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tdist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        dist = Dist(0, 1, 0, 1)
        lm = load_model(str(model_dir), "float32", device.type)
        plain = load_model(str(model_dir), "bfloat16" if device.type == "cuda" else "float32", device.type).model
        from torch.distributed.device_mesh import init_device_mesh

        model = shard(lm.model, init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))["dp"], device)
        say(f"  {backend} group of 1 rank; fully_shard on {len(model.get_decoder().layers)} layers + root; "
            f"float32 parameters" + (", bf16 compute, fp32 gradient reduction" if device.type == "cuda" else ""))
        groups, n = (2, 4) if smoke else (16, 8)
        roll = synthetic_rollout(model.config.vocab_size if smoke else 366, groups, n, (16, 64), (8, 32) if smoke
                                 else (64, 512), device)
        how = LogprobPass(max_tokens=0, micro_batch_size=64, remove_padding=True)
        reset_peak(device)
        t_sh, lp_sh = timed(lambda: all_logprobs(model, roll, how, 64), device, 1 if smoke else 3)
        t_pl, lp_pl = timed(lambda: all_logprobs(plain, roll, how, 64), device, 1 if smoke else 3)
        say(f"  log-probs (packed, no grad): sharded {t_sh * 1e3:.1f} ms, plain "
            f"{'bf16' if device.type == 'cuda' else 'fp32'} model {t_pl * 1e3:.1f} ms; "
            + diff_line("sharded vs plain", lp_sh, lp_pl, roll.response_mask))
        optimizer, scheduler = build_optimizer(model, 1e-6, (0.9, 0.999), 0.01, 0)
        adv = torch.randn(roll.response_ids.shape[0], device=device)
        params = UpdateParams(group_size=n, mini_batch_prompts=groups,
                              forward=LogprobPass(max_tokens=8192, micro_batch_size=64, remove_padding=True))
        before = {k: v.detach().clone() for k, v in full_state_dict(model).items()}
        reset_peak(device)
        t_up, stats = timed(lambda: update_policy(model, optimizer, scheduler, TrainBatch(roll, adv), params, dist=dist),
                            device, 1 if smoke else 2)
        after = full_state_dict(model)
        moved = sum(int((after[k].float() != before[k].float()).any()) for k in before)
        tokens = int(roll.prompt_lengths.sum() + roll.response_lengths.sum())
        say(f"  AdamW update: {t_up * 1e3:.1f} ms for {tokens} tokens, grad_norm {stats.get('actor/grad_norm', float('nan')):.3g}, "
            f"{moved}/{len(before)} tensors changed, peak {peak_gib(device):.2f} GiB")
        engine = build_engine("native", model, lm.pad_id, lm.stop_ids)
        with full_weights(model):
            t = time.perf_counter()
            out = engine.generate([p for p in roll.prompt_ids[::n].tolist()], 2, SamplingParams(max_new_tokens=16, seed=0))
            sync(device)
        say(f"  rollout inside full_weights (every unit gathered once): {out.response_ids.shape[0]} x "
            f"{out.response_ids.shape[1]} tokens in {(time.perf_counter() - t) * 1e3:.0f} ms")
        sd = full_state_dict(model)
        say(f"  full_state_dict: {len(sd)} tensors, {sum(v.numel() for v in sd.values()):,} elements gathered")
    finally:
        tdist.destroy_process_group()


def packed_vs_padded(model_dir: Path, device: torch.device, smoke: bool) -> None:
    from verirl.models import load_model
    from verirl.core.ops import varlen
    from verirl.train.update import LogprobPass

    dtype = "bfloat16" if device.type == "cuda" else "float32"
    model = load_model(str(model_dir), dtype, device.type).model.eval()
    ref = load_model(str(model_dir), "float32", device.type).model.eval()
    groups, n = (2, 4) if smoke else (8, 8)
    roll = synthetic_rollout(366, groups, n, (16, 48) if smoke else (32, 256), (8, 40) if smoke else (16, 1024), device)
    real = int(roll.prompt_lengths.sum() + roll.response_lengths.sum())
    say(f"  {groups} prompts x n={n}: prompts {roll.prompt_lengths.min().item()}..{roll.prompt_lengths.max().item()} "
        f"tokens, responses {roll.response_lengths.min().item()}..{roll.response_lengths.max().item()}; {real} real tokens; "
        f"{dtype}; reference: padded float32")
    micro = 16
    reps = 1 if smoke else 5
    padded = LogprobPass(remove_padding=False)
    lp_ref = all_logprobs(ref, roll, padded, micro)
    del ref
    mask = roll.response_mask
    runs = [("padded rows, SDPA", padded, "none"),
            ("packed, prompt shared, buckets (small_attention / SDPA)", LogprobPass(remove_padding=True), None),
            ("packed, no prompt sharing, buckets", LogprobPass(remove_padding=True, share_prompt=False), None)]
    fn = varlen.torch_varlen()
    if fn is None:
        skip("packed log-probs through torch's variable-length attention", f"torch {torch.__version__} has no varlen_attn")
    elif device.type != "cuda":
        skip("packed log-probs through torch's variable-length attention", "CUDA only (torch's varlen_attn is flash-attention)")
    else:
        fn_torch = varlen.torch_varlen(direct=False)  # torch's varlen_attn function (custom-op dispatch)
        fn_direct = varlen.torch_varlen(direct=True)  # its flash kernels called directly: the default
        if fn_torch is None:
            skip("packed log-probs through torch's varlen_attn function", "a signature the adapter does not know")
        else:
            runs.append(("packed, prompt shared, torch varlen_attn", LogprobPass(remove_padding=True), fn_torch))
        runs.append(("packed, prompt shared, flash kernels direct", LogprobPass(remove_padding=True), fn_direct))
        runs.append(("packed, no prompt sharing, flash kernels direct", LogprobPass(remove_padding=True, share_prompt=False),
                     fn_direct))
    try:
        from flash_attn import flash_attn_varlen_func
        if device.type == "cuda":
            runs.append(("packed, prompt shared, flash-attn varlen", LogprobPass(remove_padding=True), flash_attn_varlen_func))
    except ImportError:
        pass
    base = None
    for name, how, kernel in runs:
        saved = dict(varlen._KERNEL)
        try:
            varlen._KERNEL["fn"] = None if kernel == "none" else kernel  # None: the buckets, whatever is installed
            t, lp = timed(lambda: all_logprobs(model, roll, how, micro), device, reps)
        except Exception as e:
            say(f"  {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
            SKIPPED.append(f"{name}: failed ({type(e).__name__})")
            continue
        finally:
            varlen._KERNEL.clear()
            varlen._KERNEL.update(saved)
        base = base or t
        say(f"  {name:<58} {t * 1e3:8.1f} ms ({base / t:4.2f}x padded)  vs fp32: " + diff_line(name.split(',')[0], lp, lp_ref, mask))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes, float32, on the CPU (tests this script)")
    ap.add_argument("--only", default="grpo,fsdp,packed", help="sections to run (comma-separated)")
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not a.cpu_smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --cpu-smoke on a CPU")
    device = torch.device("cpu" if a.cpu_smoke else "cuda:0")
    if a.cpu_smoke:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    t0 = time.perf_counter()
    say(f"verirl GPU check ({'CPU smoke: tiny sizes, float32' if a.cpu_smoke else 'CUDA, bf16'})")
    environment(device)
    work = Path(tempfile.mkdtemp(prefix="verirl-gpu-check-"))
    try:
        model_dir, params = build_model_dir(work / "model", SMOKE if a.cpu_smoke else SMOLLM2_135M)
        say(f"model: LlamaForCausalLM, {params:,} parameters, random weights (seed 0), tiny tokenizer ({model_dir})")
        only = set(a.only.split(","))
        dtype = "float32" if a.cpu_smoke else "bfloat16"
        if "grpo" in only:
            section("1. GRPO steps, native engine", 200)(grpo_steps)(model_dir, params, device, dtype, a.cpu_smoke, work)
        if "fsdp" in only:
            section("2. FSDP2 on one rank", 90)(fsdp_one_rank)(model_dir, device, a.cpu_smoke)
        if "packed" in only:
            section("3. packed vs padded log-probs", 90)(packed_vs_padded)(model_dir, device, a.cpu_smoke)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"\nskipped or failed ({len(SKIPPED)}):" + "".join(f"\n  - {s}" for s in SKIPPED))
    say(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
