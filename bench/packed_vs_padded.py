"""Packed (padding-free) vs padded log-prob passes on a batch with lengths spread 16..1024.

The batch: --seqs sequences whose total lengths run evenly from 16 to 1024 tokens, in random
order (random token ids, an 8-token prompt each, distinct prompts so nothing is shared). Both paths run
on the same model and tensors in this process, alternating, and the script prints the
median time of each, the speed-up, and the largest |log-prob difference| in float32.

    .venv/bin/python bench/packed_vs_padded.py                     # the embedded tiny model
    .venv/bin/python bench/packed_vs_padded.py --model smollm2 --seqs 8 --reps 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def spread_rollout(vocab: int, seqs: int, lo: int, hi: int, prompt_len: int = 8, seed: int = 0):
    from verirl.rollout.base import left_pad
    from verirl.core.types import Rollout

    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(lo, hi, seqs).round().long()[torch.randperm(seqs, generator=g)].tolist()
    prompts = [torch.randint(10, vocab, (prompt_len,), generator=g).tolist() for _ in lengths]
    p_ids, p_mask = left_pad(prompts, 0)
    R = max(lengths) - prompt_len
    r_ids = torch.zeros((seqs, R), dtype=torch.long)
    r_mask = torch.zeros((seqs, R), dtype=torch.long)
    for i, L in enumerate(lengths):
        r_ids[i, :L - prompt_len] = torch.randint(10, vocab, (L - prompt_len,), generator=g)
        r_mask[i, :L - prompt_len] = 1
    return Rollout(p_ids, p_mask, r_ids, r_mask, r_mask.clone(), torch.ones(seqs, dtype=torch.bool)), lengths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny (default), smollm2, or a model directory")
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=0, help="sequences per micro-batch (default 0: the whole batch)")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    from verirl.models import load_model
    from verirl.train.update import plan_micro_batches, response_logprobs
    from verirl.train.packing import packed_logprobs

    path = a.model
    if path == "smollm2":
        from verirl.models.smollm2 import smollm2_dir
        path = str(smollm2_dir())
    model = load_model(path, "float32", "cpu").model
    roll, lengths = spread_rollout(model.config.vocab_size, a.seqs, a.min_len, a.max_len)
    rows = list(range(a.seqs))
    real = sum(lengths)
    # the padded path in micro-batches of --micro sequences, trimmed to each one's longest (our padded
    # reference); the packed path under a token budget holding the same number of real tokens
    micro = a.micro or a.seqs
    padded_mbs = [rows[s:s + micro] for s in range(0, a.seqs, micro)]
    padded_tokens = sum(len(mb) * max(lengths[i] for i in mb) for mb in padded_mbs)
    budget = max(max(lengths), -(-real // len(padded_mbs)))
    packed_mbs = plan_micro_batches(roll, rows, 0, budget, share_prompt=False)
    print(f"{a.seqs} sequences, {a.min_len}..{a.max_len} tokens: {real} real tokens; padded micro-batches of "
          f"{micro} hold {padded_tokens} ({padded_tokens / real:.2f}x); packed: {len(packed_mbs)} micro-batches "
          f"under {budget} tokens")

    def passes(fn, mbs, grad: bool):
        out = []
        for mb in mbs:
            with torch.set_grad_enabled(grad):
                lp, _, m = fn(mb)
                if grad:
                    (lp * m).sum().backward()
            out.append((mb, lp.detach(), m))
        return out

    def padded(grad: bool):
        return passes(lambda mb: response_logprobs(model, roll, mb), padded_mbs, grad)

    def packed(grad: bool):
        return passes(lambda mb: packed_logprobs(model, roll, mb, share_prompt=False), packed_mbs, grad)

    def full(parts):
        R = roll.response_ids.shape[1]
        lp = torch.zeros(a.seqs, R)
        for mb, x, m in parts:
            lp[mb, :x.shape[1]] = x * m
        return lp

    model.eval()
    diff = (full(padded(False)) - full(packed(False))).abs().max().item()
    for grad, name in ((False, "forward (old / ref log-probs)"), (True, "forward + backward (update)")):
        t = {"padded": [], "packed": []}
        for _ in range(a.reps):
            for label, fn in (("padded", padded), ("packed", packed)):
                model.zero_grad(set_to_none=True)
                s = time.perf_counter()
                fn(grad)
                t[label].append(time.perf_counter() - s)
        pad, pack = statistics.median(t["padded"]), statistics.median(t["packed"])
        print(f"{name}: padded {pad:.3f}s  packed {pack:.3f}s  speed-up {pad / pack:.2f}x")
    print(f"max |log-prob packed - padded| = {diff:.2e} (float32)")


if __name__ == "__main__":
    main()
