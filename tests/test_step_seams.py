"""The step's seams for what comes next: a loss mask apart from the response mask (multi-turn
rollouts' tool tokens), on the real tiny model; the step as a producer and a consumer sharing only
the batch record (asynchronous rollouts); the ranks' named device mesh (model parallelism)."""
import copy
import dataclasses

import pytest
import torch

from ranks import launch
from verirl.core.types import Rollout, TrainBatch
from verirl.rollout import NativeEngine, SamplingParams, concat_rollouts, left_pad
from verirl.config import load_config
from verirl.train.build import build_run
from verirl.train.step import as_training_rollout, consume, produce, take_rows, train_step
from verirl.train.step_metrics import Timer
from verirl.train.update import LogprobPass, UpdateParams, build_optimizer, compute_logprobs, update_policy

HEAD, TAIL = 0, 1  # row HEAD: its first tokens not trained on; row TAIL: its last ones


@pytest.fixture(scope="module")
def rollout(tiny, arith):
    train, _ = arith
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    roll = engine.generate([p.ids for p in train[:2]], 3, SamplingParams(max_new_tokens=16, seed=5))
    assert int(roll.response_lengths.min()) >= 6, "want responses long enough to mask a part of"
    return roll


def _rollout(prompts, responses, trained, pad) -> Rollout:
    """A rollout from token lists; ``trained`` (one list of 0/1 per response) is its loss mask."""
    p_ids, p_mask = left_pad(prompts, pad)
    width = max(len(r) for r in responses)
    ids = torch.full((len(responses), width), pad)
    mask, loss = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (r, t) in enumerate(zip(responses, trained)):
        ids[i, :len(r)], mask[i, :len(r)], loss[i, :len(t)] = torch.tensor(r), 1, torch.tensor(t)
    return Rollout(p_ids, p_mask, ids, mask, loss, torch.ones(len(responses), dtype=torch.bool))


def masked_and_cut(roll: Rollout, k: int, pad: int) -> tuple[Rollout, Rollout]:
    """(the rollout with no loss on row HEAD's first k tokens and row TAIL's last k, the same sequences
    with those tokens moved into row HEAD's prompt and cut from row TAIL): what the update trains on,
    and every token's context, are the same in both."""
    lengths, p_lengths = roll.response_lengths.tolist(), roll.prompt_lengths.tolist()
    prompts = [roll.prompt_ids[i, roll.prompt_ids.shape[1] - p_lengths[i]:].tolist() for i in range(len(lengths))]
    responses = [roll.response_ids[i, :lengths[i]].tolist() for i in range(len(lengths))]
    trained = [[1] * n for n in lengths]
    trained[HEAD][:k] = [0] * k
    trained[TAIL][-k:] = [0] * k
    masked = _rollout(prompts, responses, trained, pad)
    prompts[HEAD] = prompts[HEAD] + responses[HEAD][:k]
    responses[HEAD] = responses[HEAD][k:]
    responses[TAIL] = responses[TAIL][:-k]
    return masked, _rollout(prompts, responses, [[1] * len(r) for r in responses], pad)


def _update(tiny, roll: Rollout, ref_model, mode: str):
    """The update's statistics, gradients and per-response entropy for ``roll`` with a KL to ``ref_model``."""
    model = copy.deepcopy(tiny.model)
    opt, sched = build_optimizer(model, lr=0.0, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    ref = compute_logprobs(ref_model, roll, LogprobPass())
    batch = TrainBatch(roll, torch.tensor([1.0, -0.5, 0.25, -1.0, 0.75, -0.5]), ref_logprobs=ref)
    p = UpdateParams(group_size=3, mini_batch_prompts=2, forward=LogprobPass(micro_batch_size=4), kl_coef=0.1,
                     entropy_coef=0.01, loss_agg_mode=mode, grad_clip=0.0)
    entropy = torch.zeros(roll.response_ids.shape[0])
    stats = update_policy(model, opt, sched, batch, p, entropy_out=entropy)
    return stats, {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}, entropy


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_tokens_off_the_loss_mask_leave_the_loss_kl_and_entropy(tiny, rollout, mode):
    """Response tokens with loss mask 0 (they exist: they are the context of later tokens) add nothing
    to the policy loss, the KL, the entropy or the gradient: the update equals the one over the same
    sequences with those tokens moved into the prompt (leading ones) or cut away (trailing ones)."""
    masked, cut = masked_and_cut(rollout, 3, tiny.pad_id)
    assert torch.equal(masked.response_lengths, rollout.response_lengths)
    ref_model = copy.deepcopy(tiny.model)
    with torch.no_grad():
        for q in ref_model.parameters():
            q.add_(0.01 * torch.randn(q.shape, generator=torch.Generator().manual_seed(q.numel())))
    s_masked, g_masked, e_masked = _update(tiny, masked, ref_model, mode)
    s_cut, g_cut, e_cut = _update(tiny, cut, ref_model, mode)
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert s_masked[key] == pytest.approx(s_cut[key], rel=1e-5, abs=1e-7), key
    for name, g in g_cut.items():
        torch.testing.assert_close(g_masked[name], g, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(e_masked, e_cut, atol=1e-5, rtol=1e-5)
    assert s_masked["actor/kl"] > 0 and s_masked["actor/entropy"] > 0


def test_the_loss_mask_survives_joining_and_exchanging_rows(tiny, rollout):
    """concat_rollouts and the exchange between ranks (take_rows, as_training_rollout) carry the loss mask with its
    rows, zeros inside the response included."""
    masked, _ = masked_and_cut(rollout, 3, tiny.pad_id)
    joined = concat_rollouts([take_rows(masked, [3, 4, 5]), take_rows(masked, [0, 1, 2])], tiny.pad_id)
    back = as_training_rollout(joined, masked)
    order = [3, 4, 5, 0, 1, 2]
    width = back.loss_mask.shape[1]
    assert back.loss_mask.dtype == masked.loss_mask.dtype
    assert torch.equal(back.loss_mask, masked.loss_mask[order, :width])
    assert torch.equal(back.response_mask, masked.response_mask[order, :width])
    assert int(back.loss_mask.sum()) == int(masked.response_mask.sum()) - 6


@pytest.mark.slow
def test_a_batch_produced_without_the_reference_trains_as_the_whole_step(tmp_path):
    """The producer needs neither the reference model nor the optimizer: a batch produced by a run
    that has none, consumed by one that has them, gives the update `train_step` gives, with the KL to
    the reference; the weight version goes from the producer's to one more."""
    small = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=16",
             "eval.before_train=false", "eval.at_end=false", "log.progress=false", "reward.workers=0",
             "data.train_size=64", "eval.size=4", "algo.kl_coef=0.01"]
    whole = build_run(load_config("tiny", [f"trainer.run_dir={tmp_path / 'a'}", *small]))
    metrics, _ = train_step(whole, 1)
    run = build_run(load_config("tiny", [f"trainer.run_dir={tmp_path / 'b'}", *small]))
    producer = dataclasses.replace(run, ref=None, optimizer=None, scheduler=None)
    batch = produce(producer, 1, Timer(), weight_version=0)
    trained = consume(run, batch, Timer())
    assert trained.weight_version == 1 and "actor/kl" in trained.update
    for key, value in trained.update.items():
        assert metrics[key] == value, key
    whole.scorer.close()
    run.scorer.close()


MESH_RANK = r"""
import os, sys, torch
from verirl.models import load_model
from verirl.train.distributed import DP, init
from verirl.core.dtensors import local
from verirl.train.strategy import shard

dist = init(torch.device("cpu"), 60)
p = torch.nn.Parameter(torch.zeros(3))
p.grad = torch.full((3,), float(dist.rank + 1))
dist.sum_gradients([p])
model = shard(load_model("tiny").model, dist.mesh[DP], torch.device("cpu"))
w = model.get_decoder().layers[0].mlp.up_proj.weight
print("RESULT", dist.mesh.mesh_dim_names, dist.mesh.get_group(DP) is torch.distributed.group.WORLD,
      p.grad.tolist(), w.device_mesh.mesh_dim_names, tuple(local(w).shape), tuple(w.shape), flush=True)
torch.distributed.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_form_a_mesh_with_a_named_data_parallel_dimension(tmp_path):
    """Two real gloo ranks: `Dist` holds a DeviceMesh whose one dimension is "dp" (its group the default
    one), the ddp gradient sum runs over it, and FSDP2 shards the model over ``mesh["dp"]``."""
    outs = launch(tmp_path, MESH_RANK, 2)
    for out in outs:
        line = next(l for l in out.splitlines() if l.startswith("RESULT"))
        assert line.split(" ", 1)[1] == "('dp',) True [3.0, 3.0, 3.0] ('dp',) (256, 128) (512, 128)", line
