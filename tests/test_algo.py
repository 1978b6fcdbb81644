"""Hand-computed cases for the GRPO maths."""
import math

import pytest
import torch

from verirl.core.algo import aggregate, clipped_policy_loss, grpo_advantages, kl_penalty, logprobs_from_logits
from verirl.core.algo.advantages import rloo_advantages
from verirl.core.algo.logprobs import entropy_from_logits


def test_grpo_advantages_by_hand():
    # group 1: [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3)
    # group 2: [2, 2, 2, 2]: all equal -> zero advantage
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = grpo_advantages(r, group_size=4, epsilon=0.0)
    s = math.sqrt(1 / 3)
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    # Dr. GRPO: no division by the std
    assert grpo_advantages(r, 4, scale="none").tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


def test_grpo_advantages_epsilon_and_shape_errors():
    r = torch.tensor([3.0, 1.0])  # mean 2, std sqrt(2)
    assert grpo_advantages(r, 2, epsilon=1e-6).tolist() == pytest.approx(
        [1 / (math.sqrt(2) + 1e-6), -1 / (math.sqrt(2) + 1e-6)])
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo_advantages(torch.ones(5), 2)


def test_rloo_advantages_by_hand():
    # group 1: [1, 0, 0, 1]: the other three of an r=1 average 1/3 -> 2/3; of an r=0, 2/3 -> -2/3
    #          unbiased std of the group sqrt(1/3)
    # group 2: [2, 2, 2, 2]: all equal -> exactly zero, also divided by a zero std
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    loo = [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    assert rloo_advantages(r, 4, scale="none").tolist() == pytest.approx(loo + [0] * 4)
    s = math.sqrt(1 / 3)
    adv = rloo_advantages(r, 4, scale="group", epsilon=0.0)
    assert adv.tolist() == pytest.approx([a / s for a in loo] + [0] * 4, abs=1e-6)
    assert adv[4:].tolist() == [0.0] * 4  # not NaN
    # epsilon joins the std, as in grpo
    assert rloo_advantages(r[:4], 4, scale="group", epsilon=0.5).tolist() == pytest.approx(
        [a / (s + 0.5) for a in loo])
    with pytest.raises(ValueError, match="multiple of group_size"):
        rloo_advantages(torch.ones(5), 2)


def test_low_var_kl_by_hand_and_clamp():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    # k3 = exp(ref - logp) - (ref - logp) - 1
    expected = [0.5 - math.log(0.5) - 1, 2 - math.log(2) - 1]
    assert kl_penalty(logp, ref, "low_var_kl")[0].tolist() == pytest.approx(expected, abs=1e-6)
    assert kl_penalty(logp, logp, "low_var_kl").abs().max() == 0
    # clamped to 10 when the reference is far more likely than the policy
    assert float(kl_penalty(torch.tensor([[-30.0]]), torch.tensor([[0.0]]), "low_var_kl")) == 10.0
    assert kl_penalty(logp, ref, "kl")[0].tolist() == pytest.approx([math.log(2), -math.log(2)])
    assert kl_penalty(logp, ref, "mse")[0].tolist() == pytest.approx([0.5 * math.log(2) ** 2] * 2)


def test_clipped_loss_by_hand():
    # ratios: e^0.5 = 1.6487 (above 1 + 0.2), 1.0, e^-0.5 = 0.6065 (below 1 - 0.2)
    logp = torch.tensor([[0.5, 0.0, -0.5]])
    old = torch.zeros(1, 3)
    # positive advantage: the high ratio is clipped at 1.2, the low ratio is not (min picks ratio*A)
    loss, clipped = clipped_policy_loss(logp, old, torch.tensor([2.0]), 0.2, 0.2)
    assert loss[0].tolist() == pytest.approx([-1.2 * 2, -1.0 * 2, -math.exp(-0.5) * 2], abs=1e-6)
    assert clipped[0].tolist() == [True, False, False]
    # negative advantage: the low ratio is clipped at 0.8; separate high clip 0.28 is unused
    loss, clipped = clipped_policy_loss(logp, old, torch.tensor([-1.0]), 0.2, 0.28)
    assert loss[0].tolist() == pytest.approx([math.exp(0.5), 1.0, 0.8], abs=1e-6)
    assert clipped[0].tolist() == [False, False, True]
    # asymmetric high clip
    loss, _ = clipped_policy_loss(logp, old, torch.tensor([1.0]), 0.2, 0.28)
    assert float(loss[0, 0]) == pytest.approx(-1.28)


def test_aggregation_modes_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(aggregate(v, m, "token-mean")) == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert float(aggregate(v, m, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(v, m, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    # a micro-batch normalised by the mini-batch totals sums to the mini-batch value
    full = aggregate(v, m, "token-mean")
    parts = aggregate(v[:1], m[:1], "token-mean", num_tokens=4) + aggregate(v[1:], m[1:], "token-mean", num_tokens=4)
    assert float(parts) == pytest.approx(float(full))
    parts = sum(aggregate(v[i:i + 1], m[i:i + 1], "seq-mean-token-mean", num_seqs=2) for i in range(2))
    assert float(parts) == pytest.approx(float(aggregate(v, m, "seq-mean-token-mean")))


def test_logprobs_and_entropy_from_logits():
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])  # p = [.5,.5], [.75,.25]
    labels = torch.tensor([[1, 0]])
    assert logprobs_from_logits(logits, labels)[0].tolist() == pytest.approx([math.log(0.5), math.log(0.75)])
    ent = entropy_from_logits(logits)[0].tolist()
    assert ent == pytest.approx([math.log(2), -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_constant_groups_get_exactly_zero_advantage(dtype, estimator):
    """All right, all wrong, or all partly right: no signal, so exactly 0 (float rounding of the mean
    divided by epsilon used to give eight rewards of -0.4 an advantage of 0.0289 each)."""
    from verirl.core.algo import ADVANTAGE_ESTIMATORS

    fn = ADVANTAGE_ESTIMATORS[estimator]
    for value in (-0.4, 0.3, 0.1, 1.1, -1.0, 0.0, 1e-3, 123.456):
        for n in (2, 3, 4, 7, 8, 16, 64):
            rewards = torch.full((3 * n,), value, dtype=dtype)
            rewards[n:2 * n] = torch.linspace(-1, 1, n, dtype=dtype)  # one informative group in between
            for scale in ("group", "batch", "none"):
                adv = fn(rewards, n, scale=scale, epsilon=1e-6).view(3, n)
                assert torch.equal(adv[0], torch.zeros(n)) and torch.equal(adv[2], torch.zeros(n)), (value, n, scale)
                assert adv[1].abs().sum() > 0
    # the registry's defaults (scale="group") too
    assert fn(torch.full((8,), -0.4, dtype=dtype), 8).tolist() == [0.0] * 8


# ---- advantage scales -------------------------------------------------------------------------

def test_grpo_and_rloo_scales_by_hand():
    # groups of 2: [3, 1] and [2, 2]
    # group [3, 1]: mean 2 -> centred +-1; unbiased std sqrt(((1)^2 + (-1)^2) / 1) = sqrt(2)
    # batch [3, 1, 2, 2]: mean 2, deviations 1, -1, 0, 0 -> unbiased var 2 / 3, std sqrt(2/3)
    # group [2, 2]: constant -> exactly 0 whatever the scale
    r = torch.tensor([3.0, 1.0, 2.0, 2.0])
    g, b = math.sqrt(2), math.sqrt(2 / 3)
    assert grpo_advantages(r, 2, scale="group", epsilon=0.0).tolist() == pytest.approx([1 / g, -1 / g, 0, 0])
    assert grpo_advantages(r, 2, scale="batch", epsilon=0.0).tolist() == pytest.approx([1 / b, -1 / b, 0, 0])
    assert grpo_advantages(r, 2, scale="none").tolist() == [1.0, -1.0, 0.0, 0.0]
    # epsilon joins the batch std: 1 / (sqrt(2/3) + 0.5)
    assert grpo_advantages(r, 2, scale="batch", epsilon=0.5).tolist() == pytest.approx(
        [1 / (b + 0.5), -1 / (b + 0.5), 0, 0])
    # RLOO: 3 - 1 = 2 and 1 - 3 = -2, then the same divisions
    assert rloo_advantages(r, 2, scale="none").tolist() == [2.0, -2.0, 0.0, 0.0]
    assert rloo_advantages(r, 2, scale="group", epsilon=0.0).tolist() == pytest.approx([2 / g, -2 / g, 0, 0])
    assert rloo_advantages(r, 2, scale="batch", epsilon=0.0).tolist() == pytest.approx([2 / b, -2 / b, 0, 0])
    # the default scale is "group"
    assert torch.equal(grpo_advantages(r, 2), grpo_advantages(r, 2, scale="group"))
    with pytest.raises(ValueError, match="scale must be one of"):
        grpo_advantages(r, 2, scale="global")


def test_batch_scale_of_an_all_constant_batch_is_zero_not_nan():
    # every reward equal: batch std 0, epsilon 0 -> 0 / 0 is reported as 0
    adv = grpo_advantages(torch.full((6,), 0.7), 3, scale="batch", epsilon=0.0)
    assert adv.tolist() == [0.0] * 6


def test_reinforce_plus_plus_baseline_by_hand():
    from verirl.core.algo import ADVANTAGE_ESTIMATORS, reinforce_plus_plus_baseline_advantages as rpp

    assert ADVANTAGE_ESTIMATORS["reinforce_plus_plus_baseline"] is rpp
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    # groups [1, 0], [0, 0]: centred c = [0.5, -0.5, 0, 0]
    # every sequence weighs 1: M = 4, mean 0, var = (0.25 + 0.25) / 4 * 4 / 3 = 1/6
    s = math.sqrt(1 / 6)
    assert rpp(r, 2).tolist() == pytest.approx([0.5 / s, -0.5 / s, 0, 0], abs=1e-6)
    # scale and epsilon do not change it (veRL ignores them)
    assert torch.equal(rpp(r, 2, scale="none", epsilon=0.3), rpp(r, 2))
    # lengths [3, 1, 2, 2]: M = 8, mean = (3 * 0.5 + 1 * -0.5) / 8 = 0.125
    # var = (3 * 0.375^2 + 1 * 0.625^2 + 4 * 0.125^2) / 8 * 8 / 7 = 0.875 / 7 = 0.125
    # A = (c - 0.125) / sqrt(0.125): the constant group [0, 0] gets -0.125 / 0.3536, not 0 (as veRL)
    s = math.sqrt(0.125)
    adv = rpp(r, 2, lengths=torch.tensor([3, 1, 2, 2]))
    assert adv.tolist() == pytest.approx([0.375 / s, -0.625 / s, -0.125 / s, -0.125 / s], abs=1e-6)
    # a response of length 0 has no token: it is left out of the statistics and gets 0
    adv0 = rpp(torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 9.0]), 2, lengths=torch.tensor([3, 1, 2, 2, 0, 0]))
    assert adv0[:4].tolist() == pytest.approx(adv.tolist(), abs=1e-6) and adv0[4:].tolist() == [0.0, 0.0]
    # a group of one sample has baseline 0 (veRL): [1, 3] -> mean 2, var (1 + 1) / 2 * 2 / 1 = 2
    assert rpp(torch.tensor([1.0, 3.0]), 1).tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])
    with pytest.raises(ValueError, match="at least two response tokens"):
        rpp(torch.tensor([1.0, 2.0]), 2, lengths=torch.tensor([1, 0]))


def test_reinforce_plus_plus_baseline_is_verl_masked_whiten_over_tokens():
    """veRL (core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage) tiles c_i over the
    response tokens and calls verl_F.masked_whiten(scores, response_mask): mean and unbiased var over the
    masked tokens, (x - mean) * rsqrt(var + 1e-8). Those lines on a token matrix, against ours on lengths."""
    from verirl.core.algo import reinforce_plus_plus_baseline_advantages as rpp

    gen = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 3, (12,), generator=gen).float()
    lengths = torch.randint(0, 7, (12,), generator=gen)
    lengths[0] = 5
    mask = (torch.arange(7).unsqueeze(0) < lengths.unsqueeze(1)).float()  # (12, 7)
    g = rewards.view(-1, 4)
    scores = (g - g.mean(1, keepdim=True)).reshape(-1, 1).tile(1, 7) * mask
    mean = (scores * mask).sum() / (mask.sum() + 1e-8)
    var = ((scores - mean) ** 2 * mask).sum() / (mask.sum() + 1e-8) * mask.sum() / (mask.sum() - 1)
    verl = (scores - mean) * torch.rsqrt(var + 1e-8) * mask  # (12, 7)
    ours = rpp(rewards, 4, lengths=lengths)
    assert torch.allclose(ours.unsqueeze(1) * mask, verl, atol=1e-5)


# ---- aggregation: Dr. GRPO ----------------------------------------------------------------------

def test_seq_mean_token_sum_norm_by_hand_and_micro_batches():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # sum under the mask = 1 + 2 + 3 + 4 = 10; 2 sequences; scale factor defaults to the width 3
    assert float(aggregate(v, m, "seq-mean-token-sum-norm")) == pytest.approx(10 / (2 * 3))
    assert float(aggregate(v, m, "seq-mean-token-sum-norm", scale_factor=24)) == pytest.approx(10 / (2 * 24))
    # other modes ignore scale_factor
    assert float(aggregate(v, m, "token-mean", scale_factor=24)) == pytest.approx(10 / 4)
    # micro-batches with the mini-batch's num_seqs and a constant scale factor sum to the full value,
    # also when a micro-batch is padded to a narrower width (row 2 cut to its one real token)
    full = aggregate(v, m, "seq-mean-token-sum-norm", scale_factor=24)
    parts = (aggregate(v[:1], m[:1], "seq-mean-token-sum-norm", num_seqs=2, scale_factor=24)
             + aggregate(v[1:, :1], m[1:, :1], "seq-mean-token-sum-norm", num_seqs=2, scale_factor=24))
    assert float(parts) == pytest.approx(float(full))  # 6 / 48 + 4 / 48


# ---- reward shaping, multi-rule aggregation, group filtering ------------------------------------

def test_overlong_penalty_by_hand():
    from verirl.core.algo import overlong_penalty

    # max_len 20, buffer 4: no penalty up to 16 tokens, then -(L - 16) / 4, capped at -1 (times factor)
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    assert overlong_penalty(lengths, 20, 4, 1.0).tolist() == pytest.approx([0, 0, -0.25, -0.5, -1.0, -1.0])
    assert overlong_penalty(lengths, 20, 4, 0.5).tolist() == pytest.approx([0, 0, -0.125, -0.25, -0.5, -0.5])
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(lengths, 20, 0, 1.0)


def test_normalize_then_sum_by_hand():
    from verirl.core.algo import normalize_then_sum

    nan = float("nan")
    per_rule = {
        # group 1 [1, 2, 3]: mean 2, unbiased std 1 -> [-1, 0, 1]; group 2 [5, 5, 5]: constant -> 0
        "a": torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]),
        # group 1 applies to [0, 4]: mean 2, unbiased std sqrt(8) -> [-, -1/sqrt2, 1/sqrt2], NaN adds 0;
        # group 2 applies to one sample only -> 0
        "b": torch.tensor([nan, 0.0, 4.0, 1.0, nan, nan]),
    }
    h = 1 / math.sqrt(2)
    out = normalize_then_sum(per_rule, {"a": 1.0, "b": 2.0}, 3, epsilon=0.0)
    assert out.tolist() == pytest.approx([-1.0, -2 * h, 1 + 2 * h, 0.0, 0.0, 0.0])
    # epsilon joins the std: rule a's group 1 becomes [-1, 0, 1] / (1 + 0.5)
    out = normalize_then_sum({"a": per_rule["a"]}, {}, 3, epsilon=0.5)
    assert out.tolist() == pytest.approx([-1 / 1.5, 0.0, 1 / 1.5, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="no scores"):
        normalize_then_sum(per_rule, {"c": 1.0}, 3)


def test_informative_groups_by_hand():
    from verirl.core.algo import informative_groups

    metric = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.3, 0.3, 0.3])
    assert informative_groups(metric, 3).tolist() == [False, True, False]
    assert informative_groups(torch.tensor([0.0, 1.0]), 1).tolist() == [True, True]  # one sample: kept (veRL)
    with pytest.raises(ValueError, match="multiple of group_size"):
        informative_groups(metric, 2)


# ---- rollout / trainer mismatch -----------------------------------------------------------------

_L2, _LH, _L4, _LQ = math.log(2), math.log(0.5), math.log(4), math.log(0.25)


def _mismatch():
    # log ratio trainer - rollout: row 0 [ln2, ln2, (masked)], row 1 [ln0.5, ln4, ln0.25]
    # row 0: exp(sum) = 4, exp(mean) = 2; row 1: exp(sum) = 0.5 * 4 * 0.25 = 0.5, exp(mean) = 0.5^(1/3) = 0.794
    trainer = torch.tensor([[_L2, _L2, 7.0], [_LH, _L4, _LQ]], requires_grad=True)
    rollout = torch.tensor([[0.0, 0.0, float("nan")], [0.0, 0.0, 0.0]])  # the masked position is garbage
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return trainer, rollout, mask


@pytest.mark.parametrize("rollout_is,expected", [
    (None, [[1, 1, 0], [1, 1, 1]]),
    ("token", [[2, 2, 0], [0.5, 3, 0.25]]),  # 4 truncated at 3
    ("sequence", [[3, 3, 0], [0.5, 0.5, 0.5]]),  # row 0's 4 truncated at 3
])
def test_rollout_correction_importance_weights_by_hand(rollout_is, expected):
    from verirl.core.algo import rollout_correction

    w, rejected = rollout_correction(*_mismatch(), rollout_is, 3.0, None, 3.0)
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float32), atol=1e-6), w
    assert w.dtype == torch.float32 and not w.requires_grad and not rejected.any()


@pytest.mark.parametrize("rollout_rs,upper,lower,rejected", [
    ("token", 3.0, 0.0, [[0, 0, 0], [0, 1, 0]]),  # 4 > 3
    ("token", 3.0, 0.3, [[0, 0, 0], [0, 1, 1]]),  # and 0.25 < 0.3
    ("sequence", 3.0, 0.0, [[1, 1, 0], [0, 0, 0]]),  # row 0: 4 > 3 (the masked position stays False)
    ("sequence", 5.0, 0.6, [[0, 0, 0], [1, 1, 1]]),  # row 1: 0.5 < 0.6
    ("geometric", 3.0, 0.8, [[0, 0, 0], [1, 1, 1]]),  # row 1: 0.794 < 0.8
    ("geometric", 1.5, 0.0, [[1, 1, 0], [0, 0, 0]]),  # row 0: 2 > 1.5
])
def test_rollout_correction_rejection_by_hand(rollout_rs, upper, lower, rejected):
    from verirl.core.algo import rollout_correction

    w, rej = rollout_correction(*_mismatch(), None, 3.0, rollout_rs, upper, lower)
    assert rej.tolist() == [[bool(x) for x in row] for row in rejected]
    keep = [[float(not x) * m for x, m in zip(row, mrow)] for row, mrow in zip(rejected, [[1, 1, 0], [1, 1, 1]])]
    assert w.tolist() == keep  # weight 1 (no IS) where kept, 0 where rejected or masked


def test_rollout_correction_combined_overflow_and_errors():
    from verirl.core.algo import MODES_IS, MODES_RS, rollout_correction

    assert MODES_IS == (None, "token", "sequence") and MODES_RS == (None, "token", "sequence", "geometric")
    # TRL's sequence_mask with clip_max 3: weight exp(sum) when <= 3, else 0
    w, _ = rollout_correction(*_mismatch(), "sequence", 3.0, "sequence", 3.0)
    assert torch.allclose(w, torch.tensor([[0.0, 0, 0], [0.5, 0.5, 0.5]]), atol=1e-6), w
    # huge log ratios: clamped before exp, so nothing is inf or NaN; a NaN rollout log-prob counts as ratio 1
    trainer = torch.tensor([[100.0, 0.0], [-100.0, 5.0]])
    rollout = torch.tensor([[0.0, float("nan")], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    for is_mode in MODES_IS:
        for rs_mode in MODES_RS:
            w, _ = rollout_correction(trainer, rollout, mask, is_mode, 2.0, rs_mode, 1e30)
            assert torch.isfinite(w).all(), (is_mode, rs_mode)
    w, _ = rollout_correction(trainer, rollout, mask, "token", 2.0, None, 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 1.0], [math.exp(-20), 2.0]]), rtol=1e-5, atol=0), w
    with pytest.raises(ValueError, match="rollout_is must be one of"):
        rollout_correction(trainer, rollout, mask, "seq", 2.0, None, 2.0)
    with pytest.raises(ValueError, match="rollout_rs must be one of"):
        rollout_correction(trainer, rollout, mask, None, 2.0, "seq", 2.0)
    with pytest.raises(ValueError, match="rs_threshold_lower"):
        rollout_correction(trainer, rollout, mask, None, 2.0, "token", 2.0, 3.0)


# ---- high-entropy tokens ------------------------------------------------------------------------

def test_high_entropy_mask_by_hand():
    from verirl.core.algo import high_entropy_mask

    ent = torch.tensor([[0.1, 0.5, 0.9, 2.0], [0.3, 0.7, 5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # masked entropies sorted: [0.1, 0.3, 0.5, 0.7, 0.9]; keeping the top 40% = the 0.6 quantile:
    # rank 0.6 * 4 = 2.4 -> 0.5 + 0.4 * (0.7 - 0.5) = 0.58 -> 0.9 and 0.7 kept; 2.0 and 5.0 are masked out
    assert high_entropy_mask(ent, mask, 0.4).tolist() == [[False, False, True, False], [False, True, False, False]]
    assert high_entropy_mask(ent, mask, 1.0).tolist() == mask.bool().tolist()  # quantile 0 = the minimum
    assert high_entropy_mask(ent, mask, 0.0).tolist() == [[False, False, True, False], [False] * 4]  # the maximum
    assert not high_entropy_mask(ent, torch.zeros_like(mask), 0.5).any()
    with pytest.raises(ValueError, match="quantile"):
        high_entropy_mask(ent, mask, 1.5)
