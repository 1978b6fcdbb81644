"""The mixture-of-experts layer's forward + backward: transformers' experts computed as one grouped matrix
product per projection (grouped_mm) against its per-expert loop (eager), and expert parallelism 1 against
2 (verirl.models.expert_parallel: 2 gloo processes of one thread each, each with half of the tokens and
half of the experts, against one process of --threads threads with all of them). Random weights, float32
on a CPU. The load average is printed: on a shared machine the figures move with it.

    PYTHONPATH=src .venv/bin/python bench/moe.py                 # the tiny-moe layer (E 8, k 2, H 128, I 128)
    PYTHONPATH=src .venv/bin/python bench/moe.py --gpu           # grouped vs loop on a Qwen3-30B-A3B layer, bf16

Prints one line per measure: milliseconds per forward + backward (the median of --repeat), and the ratios.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def layer(experts: int, top_k: int, hidden: int, inter: int, implementation: str, device: str, dtype):
    """A Qwen3-MoE experts module of random weights, computed by ``implementation``."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                         num_experts_per_tok=top_k, num_hidden_layers=1)
    cfg._experts_implementation = implementation
    torch.manual_seed(0)
    ex = Qwen3MoeExperts(cfg).to(device, dtype)
    with torch.no_grad():
        for p in ex.parameters():
            p.normal_(0, 0.02)
    return ex


def inputs(tokens: int, experts: int, top_k: int, hidden: int, device: str, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    ids = torch.rand(tokens, experts, generator=g).topk(top_k, dim=-1).indices.to(device)
    w = torch.rand(tokens, top_k, generator=g).softmax(-1).to(device, dtype)
    up = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    return h, ids, w, up


def step_ms(ex, h, ids, w, up, repeat: int, sync=lambda: None) -> float:
    """Median milliseconds of one forward + backward (a real upstream gradient)."""
    times = []
    for i in range(repeat + 2):
        x = h.clone().requires_grad_(True)
        sync()
        t = time.perf_counter()
        (ex(x, ids, w) * up).sum().backward()
        sync()
        if i >= 2:  # two warm-up rounds
            times.append((time.perf_counter() - t) * 1e3)
        ex.zero_grad(set_to_none=True)
    return statistics.median(times)


def _ep_rank(rank: int, port: int, args, out) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("ep",))["ep"]
    from verirl.models.expert_parallel import register, shard_experts_module

    register()
    ex = layer(args.experts, args.top_k, args.hidden, args.inter, "verirl_ep", "cpu", torch.float32)
    shard_experts_module(ex, mesh)
    h, ids, w, up = inputs(args.tokens // 2, args.experts, args.top_k, args.hidden, "cpu", torch.float32, seed=rank)
    ms = step_ms(ex, h, ids, w, up, args.repeat, sync=dist.barrier)
    if rank == 0:
        out.put(ms)
    dist.barrier()
    dist.destroy_process_group()


def ep2_ms(args) -> float:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_ep_rank, args=(r, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    ms = out.get(timeout=600)
    for p in procs:
        p.join()
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the one-process measures (CPU)")
    ap.add_argument("--gpu", action="store_true", help="grouped vs loop on a Qwen3-30B-A3B-shaped layer (E 128, "
                                                       "k 8, H 2048, I 768), bf16, on cuda")
    args = ap.parse_args()
    if args.gpu:
        dev, dtype = "cuda", torch.bfloat16
        args.experts, args.top_k, args.hidden, args.inter = 128, 8, 2048, 768
        sync = torch.cuda.synchronize
        print(f"device {torch.cuda.get_device_name()}, bf16, {args.tokens} tokens, E {args.experts}, k {args.top_k}, "
              f"H {args.hidden}, I {args.inter}")
    else:
        dev, dtype, sync = "cpu", torch.float32, (lambda: None)
        torch.set_num_threads(args.threads)
        print(f"cpu, load average {os.getloadavg()[0]:.1f}, {torch.get_num_threads()} thread(s), float32, {args.tokens} tokens, E {args.experts}, "
              f"k {args.top_k}, H {args.hidden}, I {args.inter}")
    h, ids, w, up = inputs(args.tokens, args.experts, args.top_k, args.hidden, dev, dtype)
    grouped = step_ms(layer(args.experts, args.top_k, args.hidden, args.inter, "grouped_mm", dev, dtype),
                      h, ids, w, up, args.repeat, sync)
    loop = step_ms(layer(args.experts, args.top_k, args.hidden, args.inter, "eager", dev, dtype),
                   h, ids, w, up, args.repeat, sync)
    print(f"grouped_mm fwd+bwd {grouped:.2f} ms; per-expert loop {loop:.2f} ms; loop / grouped {loop / grouped:.2f}")
    if not args.gpu:
        ep2 = ep2_ms(args)
        print(f"ep1 (1 process, {args.threads} thread(s)) {grouped:.2f} ms; ep2 (2 gloo processes, 1 thread each, half the tokens "
              f"each) {ep2:.2f} ms; ep2 / ep1 {ep2 / grouped:.2f}")


if __name__ == "__main__":
    main()
