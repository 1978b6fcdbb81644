"""The policy update on the real tiny model: exact gradient accumulation, on-policy ratio."""
import copy

import pytest
import torch

from verirl.rollout import NativeEngine, SamplingParams
from verirl.train.update import LogprobPass, UpdateParams, build_optimizer, compute_logprobs, response_logprobs, update_policy
from verirl.core.types import TrainBatch


@pytest.fixture(scope="module")
def batch(tiny, arith):
    train, _ = arith
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    roll = engine.generate([p.ids for p in train[:3]], 4, SamplingParams(max_new_tokens=20, seed=3))
    assert len(set(roll.response_lengths.tolist())) > 1, "want responses of different lengths"
    adv = torch.linspace(-1.0, 1.0, 12)
    ref = compute_logprobs(tiny.model, roll, LogprobPass(micro_batch_size=12)) - 0.05 * torch.arange(roll.response_ids.shape[1]).float()
    return TrainBatch(roll, adv, ref_logprobs=ref)


def _grads(tiny, batch, micro, mode):
    model = copy.deepcopy(tiny.model)
    opt, sched = build_optimizer(model, lr=0.0, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    p = UpdateParams(group_size=4, mini_batch_prompts=3, forward=LogprobPass(micro_batch_size=micro), kl_coef=0.1,
                     entropy_coef=0.01, loss_agg_mode=mode, grad_clip=0.0)
    stats = update_policy(model, opt, sched, batch, p)
    return {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}, stats


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_give_the_full_batch_gradient(tiny, batch, mode):
    full, s_full = _grads(tiny, batch, 12, mode)
    for micro in (1, 5):
        part, s_part = _grads(tiny, batch, micro, mode)
        for name, g in full.items():
            assert torch.allclose(part[name], g, atol=1e-6, rtol=1e-4), (mode, micro, name)
        assert s_part["actor/pg_loss"] == pytest.approx(s_full["actor/pg_loss"], abs=1e-6)
        assert s_part["actor/kl"] == pytest.approx(s_full["actor/kl"], abs=1e-6)
    assert any(g.abs().max() > 0 for g in full.values())


def test_on_policy_ratio_is_one_and_nothing_is_clipped(tiny, batch):
    _, stats = _grads(tiny, batch, 6, "token-mean")
    assert stats["actor/pg_clipfrac"] == 0.0
    # on-policy, the token-mean loss is -mean(A) over the tokens trained on
    mask = batch.rollout.loss_mask.float()
    expected = -(batch.advantages.unsqueeze(1) * mask).sum() / mask.sum()
    assert stats["actor/pg_loss"] == pytest.approx(float(expected), abs=1e-6)


def test_logprobs_do_not_depend_on_batch_composition(tiny, batch):
    """Trimming pads per micro-batch and restarting positions must not change a sequence's log-probs."""
    whole = compute_logprobs(tiny.model, batch.rollout, LogprobPass(micro_batch_size=12))
    single = compute_logprobs(tiny.model, batch.rollout, LogprobPass(micro_batch_size=1))
    mask = batch.rollout.response_mask.bool()
    assert (whole - single)[mask].abs().max() < 1e-5


def test_eos_equal_to_pad_is_still_trained_on(tiny, arith):
    """Seed 000 section 3.1: with eos == pad, the EOS token must stay in the response mask."""
    train, _ = arith
    eos = tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = NativeEngine(tiny.model, pad_id=eos, stop_ids=[eos])
    roll = engine.generate([p.ids for p in train[:4]], 2, SamplingParams(max_new_tokens=32, temperature=0))
    assert bool(roll.stopped.all())
    for ids, m in zip(roll.response_ids.tolist(), roll.response_mask.tolist()):
        last = sum(m) - 1
        assert ids[last] == eos and m[last] == 1  # the EOS itself is inside the mask
    logp, _, mask = response_logprobs(tiny.model, roll)
    assert float((mask * (roll.response_ids[:, :logp.shape[1]] == eos)).sum()) == 8
