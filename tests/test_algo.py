"""Hand-computed cases for the GRPO maths."""
import math

import pytest
import torch

from verirl.algo import aggregate, clipped_policy_loss, grpo_advantages, kl_penalty, logprobs_from_logits
from verirl.algo.advantages import rloo_advantages
from verirl.algo.logprobs import entropy_from_logits


def test_grpo_advantages_by_hand():
    # group 1: [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3)
    # group 2: [2, 2, 2, 2]: all equal -> zero advantage
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = grpo_advantages(r, group_size=4, epsilon=0.0)
    s = math.sqrt(1 / 3)
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    # Dr. GRPO: no division by the std
    assert grpo_advantages(r, 4, norm_by_std=False).tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])


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
    assert rloo_advantages(r, 4, norm_by_std=False).tolist() == pytest.approx(loo + [0] * 4)
    s = math.sqrt(1 / 3)
    adv = rloo_advantages(r, 4, norm_by_std=True, epsilon=0.0)
    assert adv.tolist() == pytest.approx([a / s for a in loo] + [0] * 4, abs=1e-6)
    assert adv[4:].tolist() == [0.0] * 4  # not NaN
    # epsilon joins the std, as in grpo
    assert rloo_advantages(r[:4], 4, norm_by_std=True, epsilon=0.5).tolist() == pytest.approx(
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
    from verirl.algo import ADVANTAGE_ESTIMATORS

    fn = ADVANTAGE_ESTIMATORS[estimator]
    for value in (-0.4, 0.3, 0.1, 1.1, -1.0, 0.0, 1e-3, 123.456):
        for n in (2, 3, 4, 7, 8, 16, 64):
            rewards = torch.full((3 * n,), value, dtype=dtype)
            rewards[n:2 * n] = torch.linspace(-1, 1, n, dtype=dtype)  # one informative group in between
            for norm in (True, False):
                adv = fn(rewards, n, norm_by_std=norm, epsilon=1e-6).view(3, n)
                assert torch.equal(adv[0], torch.zeros(n)) and torch.equal(adv[2], torch.zeros(n)), (value, n, norm)
                assert adv[1].abs().sum() > 0
