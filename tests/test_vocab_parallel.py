"""The output layer split by vocabulary across tensor-parallel ranks (`vocab_parallel_head_logprobs`),
with two real gloo processes, against the whole head on one process (`head_logprobs`): log-probs,
entropy and every gradient, on Qwen2.5's 151,936-row vocabulary with labels from its real tokenizer."""
from __future__ import annotations


import pytest
import torch

from ranks import launch
from verirl.core.ops.head_logprobs import head_logprobs

V, H, M = 151_936, 32, 48  # Qwen2.5's vocabulary rows (config.json vocab_size), a small hidden size, rows

RANK = r"""
import json, os, sys
import torch
import torch.distributed as dist
from verirl.core.ops.head_logprobs import vocab_parallel_head_logprobs

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
data = torch.load(sys.argv[1])
hidden, weight, labels = data["hidden"], data["weight"], data["labels"]
share = weight.shape[0] // world
start = rank * share
w = weight[start:start + share].clone().requires_grad_(True)
h = hidden.clone().requires_grad_(True)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
    logp, ent = vocab_parallel_head_logprobs(h, w, labels, start, temperature=0.7, chunk=16, with_entropy=True)
    (data["g_logp"] @ logp + data["g_ent"] @ ent).backward()
largest = max(e.self_cpu_memory_usage for e in prof.events())  # bytes, the largest one operation allocated
torch.save({"logp": logp.detach(), "ent": ent.detach(), "g_h": h.grad, "g_w": w.grad, "start": start,
            "largest": largest},
           sys.argv[2] + f".{rank}")
dist.barrier()  # without it a gloo rank may abort at exit, after its result
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def case(tmp_path_factory, qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
    ids = tok("The answer is \\boxed{42}. 答案是四十二。 <|im_end|>", add_special_tokens=False)["input_ids"]
    ids += [151643, 151644, 151645, V - 1, 0, 1]  # the special tokens, the last row and the first
    labels = torch.tensor((ids * M)[:M])
    g = torch.Generator().manual_seed(0)
    data = {"hidden": torch.randn(M, H, generator=g), "weight": torch.randn(V, H, generator=g) * 0.2,
            "labels": labels, "g_logp": torch.randn(M, generator=g), "g_ent": torch.randn(M, generator=g)}
    path = tmp_path_factory.mktemp("vocab_parallel") / "case.pt"
    torch.save(data, path)
    return path, data


def _two_ranks(script_dir, case_path):
    out = script_dir / "out"
    launch(script_dir, RANK, 2, str(case_path), str(out))
    return [torch.load(f"{out}.{r}") for r in range(2)]


@pytest.mark.slow
def test_two_vocabulary_shards_equal_the_whole_head(case, tmp_path):
    path, data = case
    h = data["hidden"].clone().requires_grad_(True)
    w = data["weight"].clone().requires_grad_(True)
    logp, ent = head_logprobs(h, w, data["labels"], temperature=0.7, chunk=16, with_entropy=True)
    (data["g_logp"] @ logp + data["g_ent"] @ ent).backward()
    ranks = _two_ranks(tmp_path, path)
    for r in ranks:
        close = lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6)  # noqa: E731
        assert close(r["logp"], logp.detach()) and close(r["ent"], ent.detach()), (r["logp"] - logp).abs().max()
        assert close(r["g_h"], h.grad), (r["g_h"] - h.grad).abs().max()
    assert ranks[0]["start"] == 0 and ranks[1]["start"] == V // 2
    whole = torch.cat([ranks[0]["g_w"], ranks[1]["g_w"]])  # each rank holds the gradient of its rows
    share_of_logits = M * (V // 2) * 4  # bytes of this rank's half of the whole (M x V) float32 logits
    for r in ranks:  # the largest allocation: a gradient of the rank's rows, or a chunk's logits
        assert r["largest"] <= max((V // 2) * H * 4, 2 * 16 * (V // 2) * 4) < share_of_logits, r["largest"]
    print(f"largest allocation per rank: {max(r['largest'] for r in ranks) / 2**20:.1f} MiB; the whole logits "
          f"{M * V * 4 / 2**20:.1f} MiB, a rank's half {share_of_logits / 2**20:.1f} MiB")
    assert whole.shape == (V, H) and torch.allclose(whole, w.grad, rtol=1e-5, atol=1e-7), (whole - w.grad).abs().max()
