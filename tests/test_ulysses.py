"""Ulysses sequence parallelism (`verirl.core.ops.ulysses`) with two real gloo processes: the all-to-alls
against slices of a tensor made whole on one process, and the tiny model in float32 over a packed row
split across the two ranks against the ordinary packed pass in one process (the response tokens'
log-probs, and every parameter's gradient summed over the ranks); the split of a row and the shapes
that cannot split, without processes."""
from __future__ import annotations

import pytest
import torch

from ranks import results
from verirl.core.errors import ConfigError
from verirl.core.ops.ulysses import check_ulysses, split_packed

PRIMITIVES = r"""
import json
import torch
import torch.distributed as dist
from verirl.core.ops.ulysses import gather_tokens, heads_to_seq, seq_to_heads, split_packed

torch.set_num_threads(1)
dist.init_process_group("gloo")
group, r = dist.group.WORLD, dist.get_rank()


def run() -> dict:
    x = torch.arange(4 * 6 * 2, dtype=torch.float64).view(1, 4, 6, 2)  # (1, H=4, T=6, d=2), the whole tensor
    w = torch.arange(4 * 6 * 2, dtype=torch.float64).view(1, 4, 6, 2) % 5 - 2  # a loss's weights
    mine = x[:, :, 3 * r:3 * r + 3].clone().requires_grad_()  # this rank's tokens
    y = seq_to_heads(mine, group)
    (y * w[:, 2 * r:2 * r + 2]).sum().backward()
    seq_major = x.transpose(1, 2)  # (1, T, H, d), the layout attention returns
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6]])
    pred = torch.tensor([2, 3, 4, 5, 0, 6])
    shard = split_packed(pos, pos, pred, r, 2)
    values = (shard.pred_pos + shard.start).double().requires_grad_()
    full = gather_tokens(values, shard, group)
    (full * torch.arange(6.0, dtype=torch.float64)).sum().backward()
    return {
        "heads": torch.equal(y, x[:, 2 * r:2 * r + 2]),
        "round_trip": torch.equal(heads_to_seq(y, group), mine),
        "grad": torch.equal(mine.grad, w[:, :, 3 * r:3 * r + 3]),
        "seq_major": torch.equal(heads_to_seq(seq_major[:, :, 2 * r:2 * r + 2], group, seq_dim=1, head_dim=2),
                                 seq_major[:, 3 * r:3 * r + 3]),
        "gathered": full.tolist(), "gather_grad": values.grad.tolist(), "owned": shard.owned.tolist()}


print("RESULT", json.dumps(run()), flush=True)
dist.barrier()  # without it a rank now and then aborts at exit ("terminate called without an active exception")
dist.destroy_process_group()
"""

MODEL = r"""
import copy, functools, json
import torch
import torch.distributed as dist
from transformers import AttentionInterface
from verirl.core.ops.head_logprobs import head_logprobs
from verirl.core.ops.ulysses import gather_tokens, split_packed, ulysses_attention
from verirl.core.types import Rollout
from verirl.models import load_model
from verirl.rollout.base import left_pad
from verirl.train import packing
from verirl.train.strategy import final_hidden

torch.set_num_threads(1)
dist.init_process_group("gloo")
group = dist.group.WORLD
rank, sp = dist.get_rank(), dist.get_world_size()
gen = torch.Generator().manual_seed(0)
tok = lambda n: torch.randint(3, 366, (n,), generator=gen).tolist()  # noqa: E731
a, b, c = tok(5), tok(9), tok(3)
prompts = [a, a, b, c]
responses = [tok(7), tok(12), tok(30), tok(5)]  # shared prompt: 71 tokens, the 30 at 33..62 straddle 36
p_ids, p_mask = left_pad(prompts, 0)
r_ids = torch.zeros((4, 30), dtype=torch.long)
r_mask = torch.zeros((4, 30), dtype=torch.long)
for i, resp in enumerate(responses):
    r_ids[i, :len(resp)], r_mask[i, :len(resp)] = torch.tensor(resp), 1
rollout = Rollout(p_ids, p_mask, r_ids, r_mask, r_mask.clone(), torch.ones(4, dtype=torch.bool))
rows = [0, 1, 2, 3]


def sp_logprobs(model, pb):
    # what packed_logprobs does with a sequence-parallel group: this rank's slice through the model,
    # Ulysses around the packed attention, its own labels through the output layer, then gathered
    shard = split_packed(pb.input_ids, pb.position_ids, pb.pred_pos, rank, sp)
    AttentionInterface.register("verirl_packed_sp_test", functools.partial(
        ulysses_attention, group=group, inner=packing.packed_attention, tokens=shard.tokens))
    with packing._packed_attention(model, pb.layout):
        model.config._attn_implementation_internal = "verirl_packed_sp_test"  # the block restores it
        hidden = final_hidden(model, shard.input_ids, shard.position_ids)[0]
    head = model.get_output_embeddings()
    lp, _ = head_logprobs(hidden.index_select(0, shard.pred_pos), head.weight, pb.labels[shard.owned], head.bias)
    return gather_tokens(lp, shard, group), shard


def run(model0, share: bool) -> dict:
    ref, model = copy.deepcopy(model0), copy.deepcopy(model0)
    pb = packing.pack_rows(rollout, rows, share)
    logp, _, _ = packing.packed_logprobs(ref, rollout, rows, share_prompt=share)
    want = logp[pb.out_row, pb.out_col]
    want.sum().backward()
    got, shard = sp_logprobs(model, pb)
    got.sum().backward()
    grads, alone = {}, {}
    grads_ref = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        g, w = p.grad.clone(), grads_ref[name].grad
        alone[name] = float((g - w).abs().max() / w.abs().max())
        dist.all_reduce(g, group=group)
        grads[name] = float((g - w).abs().max() / w.abs().max())
    return {"tokens": shard.tokens, "local": shard.input_ids.shape[1], "labels": len(want), "owned": len(shard.owned),
            "logp": float((got - want).abs().max().detach() / want.abs().max()), "grads": grads,
            "one_rank_alone": max(alone.values())}


model0 = load_model("tiny", device="cpu").model
print("RESULT", json.dumps({str(share): run(model0, share) for share in (True, False)}), flush=True)
dist.barrier()  # without it a rank now and then aborts at exit ("terminate called without an active exception")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_all_to_alls_swap_a_sequence_shard_for_a_head_shard(tmp_path):
    """(1, 4 heads, 3 tokens, 2) on each rank: seq_to_heads gives the whole tensor's 2 heads of the rank, for
    all 6 tokens; heads_to_seq undoes it; the gradient comes back to the tokens it came from. gather_tokens
    puts each rank's labels in their rows of the whole row's."""
    for rank, result in enumerate(results(tmp_path, PRIMITIVES)):
        assert result["heads"] and result["round_trip"] and result["grad"] and result["seq_major"], result
        assert result["gathered"] == [2.0, 3.0, 4.0, 5.0, 0.0, 6.0]  # pred_pos, each from the rank holding it
        assert result["owned"] == ([0, 1, 4] if rank == 0 else [2, 3, 5])
        assert result["gather_grad"] == ([0.0, 1.0, 4.0] if rank == 0 else [2.0, 3.0, 5.0])


@pytest.mark.slow
def test_tiny_over_two_sequence_parallel_ranks_equals_one_process(tmp_path):
    """A packed row of 71 tokens (a shared prompt; a 30-token response across the boundary at 36; one pad)
    and of 76 without sharing: the response tokens' log-probs within 1e-5, and every parameter's gradient of
    their sum within 1e-5 once summed over the two ranks (one rank's alone is not: it covers its tokens)."""
    per_rank = results(tmp_path, MODEL)
    for result in per_rank:
        for share, tokens in (("True", 71), ("False", 76)):
            r = result[share]
            assert r["tokens"] == tokens and r["local"] == (tokens + 1) // 2 and r["labels"] == 54, r
            assert r["logp"] < 1e-5, r
            assert len(r["grads"]) == 4 * 12 + 2 and max(r["grads"].values()) < 1e-5, r["grads"]
            assert r["one_rank_alone"] > 1e-2, r
    for share in ("True", "False"):
        assert sum(result[share]["owned"] for result in per_rank) == 54


def test_a_packed_row_splits_into_slices_with_pads_at_its_end():
    """7 tokens over 3 ranks: slices of 3, the last with 2 pads (id 0, position 0); each label belongs to
    the rank holding the position that predicts it, once."""
    ids = torch.tensor([[11, 12, 13, 14, 15, 16, 17]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1]])
    pred = torch.tensor([2, 3, 4, 1, 6, 5])
    shards = [split_packed(ids, pos, pred, r, 3, pad_id=0) for r in range(3)]
    assert [s.input_ids.tolist() for s in shards] == [[[11, 12, 13]], [[14, 15, 16]], [[17, 0, 0]]]
    assert [s.position_ids.tolist() for s in shards] == [[[0, 1, 2]], [[3, 4, 0]], [[1, 0, 0]]]
    assert [s.owned.tolist() for s in shards] == [[0, 3], [1, 2, 5], [4]]
    assert [s.pred_pos.tolist() for s in shards] == [[2, 1], [0, 1, 2], [0]]
    assert all(s.tokens == 7 and s.total_labels == 6 for s in shards)
    even = split_packed(ids[:, :6], pos[:, :6], pred[pred < 6], 1, 2)
    assert even.input_ids.tolist() == [[14, 15, 16]] and even.start == 3


@pytest.mark.parametrize("heads,kv_heads,sp,words", [
    (4, 2, 3, "does not divide num_attention_heads=4 (4 / 3 = 1.33)"),
    (4, 2, 4, "is more than num_key_value_heads=2 (2 / 4 = 0.5): more sp than key/value heads needs ring "
              "attention, not built"),
    (12, 6, 4, "does not divide num_key_value_heads=6 (6 / 4 = 1.5)"),
])
def test_heads_that_cannot_split_are_refused_with_the_arithmetic(heads, kv_heads, sp, words):
    check_ulysses(4, 2, 2)
    check_ulysses(4, 2, 1)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_ulysses(heads, kv_heads, sp)
