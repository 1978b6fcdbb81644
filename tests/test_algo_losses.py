"""Hand-computed cases for the policy losses in `verirl.core.algo.loss.POLICY_LOSSES`.

Where veRL is the reference (dual_clip, clip_cov, kl_cov) it cannot be installed here, so parity is by
derivation from verl/trainer/ppo/core_algos.py (compute_policy_loss_vanilla, compute_policy_loss_clip_cov,
compute_policy_loss_kl_cov) and the cases below; GSPO and CISPO are also checked against TRL's real
trainer in tests/test_trl_parity.py.

Known differences from veRL, on purpose:
- veRL's "vanilla" applies the dual clip for A < 0 too; ours is "dual_clip", "vanilla" is TRL's loss.
- veRL's cispo clamps the weight to [1 - clip_low, 1 + clip_high]; ours (and TRL's, MiniMax-M1's) caps
  it above at clip_ratio_max only.
- clip_cov draws with a generator seeded from the candidates' values, not torch's global RNG.
"""
import math

import pytest
import torch

from verirl.core.algo import CLIP_DEFAULTS, POLICY_LOSSES, PolicyLossParams, aggregate, clipped_policy_loss, policy_loss
from verirl.core.errors import ConfigError


def test_registry_names_defaults_and_params():
    assert set(POLICY_LOSSES) == {"vanilla", "dual_clip", "gspo", "cispo", "clip_cov", "kl_cov"}
    assert set(CLIP_DEFAULTS) == set(POLICY_LOSSES)
    assert CLIP_DEFAULTS["gspo"] == (3e-4, 4e-4) and CLIP_DEFAULTS["vanilla"] == (0.2, 0.2)
    p = PolicyLossParams()
    # veRL's defaults (ActorConfig.clip_ratio_c, PolicyLossConfig)
    assert (p.clip_ratio_c, p.clip_cov_ratio, p.clip_cov_lb, p.clip_cov_ub, p.kl_cov_ratio, p.ppo_kl_coef) == (
        3.0, 0.0002, 1.0, 5.0, 0.0002, 0.1)
    with pytest.raises(ConfigError, match="algo.policy_loss"):
        policy_loss("ppo", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1))


def test_vanilla_is_the_clipped_loss_and_ignores_masked_positions():
    logp = torch.tensor([[0.5, 0.0, 0.5]])  # ratio e^0.5 = 1.65 on tokens 0 and 2
    old, mask = torch.zeros(1, 3), torch.tensor([[1.0, 1.0, 0.0]])
    loss, clipped = policy_loss("vanilla", logp, old, torch.tensor([2.0]), mask, PolicyLossParams())
    ref, ref_clipped = clipped_policy_loss(logp, old, torch.tensor([2.0]), 0.2, 0.2)
    assert torch.equal(loss, ref)  # [-2.4, -2, -2.4]
    assert ref_clipped.tolist() == [[True, False, True]] and clipped.tolist() == [[True, False, False]]


def test_dual_clip_by_hand():
    # ratios e^0.5 = 1.6487, 1, e^-0.5 = 0.6065, e^1.5 = 4.4817; clip 0.2, clip_ratio_c 3
    logp = torch.tensor([[0.5, 0.0, -0.5, 1.5]], requires_grad=True)
    old, mask = torch.zeros(1, 4), torch.ones(1, 4)
    p = PolicyLossParams(clip_ratio_c=3.0)
    # A = -1: vanilla = max(r, clip(r)) = [1.6487, 1, 0.8, 4.4817]; dual: min(., -A * 3 = 3) caps the last at 3
    loss, clipped = policy_loss("dual_clip", logp, old, torch.tensor([-1.0]), mask, p)
    assert loss[0].tolist() == pytest.approx([math.exp(0.5), 1.0, 0.8, 3.0], abs=1e-6)
    # the PPO clip acts on token 2 (pg_clipfrac), the dual clip on token 3 (pg_clipfrac_lower)
    assert clipped.tolist() == [[False, False, True, True]]
    # gradient of the sum: d(-A r)/dlogp = r for tokens 0 and 1; 0 where a clip holds the loss constant
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([math.exp(0.5), 1.0, 0.0, 0.0], abs=1e-6)
    # A = +2: the dual clip never acts, the loss is vanilla's
    loss, clipped = policy_loss("dual_clip", logp.detach(), old, torch.tensor([2.0]), mask, p)
    ref, ref_clipped = clipped_policy_loss(logp.detach(), old, torch.tensor([2.0]), 0.2, 0.2)
    assert torch.equal(loss, ref) and torch.equal(clipped, ref_clipped)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss("dual_clip", logp.detach(), old, torch.tensor([-1.0]), mask, PolicyLossParams(clip_ratio_c=1.0))


def test_gspo_by_hand_value_and_gradient():
    # row 0: log ratios [0.1, 0.3, (pad 5.0)] -> mean 0.2, s = e^0.2 = 1.2214; A = +1
    # row 1: log ratios [-0.4, 0.0, (pad)]   -> mean -0.2, s = e^-0.2 = 0.8187; A = -1
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.5, -2.0]])
    logp = (old + torch.tensor([[0.1, 0.3, 5.0], [-0.4, 0.0, 9.0]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    s0, s1 = math.exp(0.2), math.exp(-0.2)
    # clip [0.8, 1.3]: neither sequence ratio is clipped; every token of a row carries its row's ratio
    loss, clipped = policy_loss("gspo", logp, old, adv, mask, PolicyLossParams(clip_low=0.2, clip_high=0.3))
    assert torch.allclose(loss * mask, torch.tensor([[-s0, -s0, 0.0], [s1, s1, 0.0]]), atol=1e-6)
    assert not clipped.any()
    # seq-mean-token-mean: mean over rows of (mean over a row's tokens); d/dlogp_t = -A s / (2 rows * 2 tokens)
    aggregate(loss, mask, "seq-mean-token-mean").backward()
    assert torch.allclose(logp.grad, torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [s1 / 4, s1 / 4, 0.0]]), atol=1e-6)
    # the same gradient as differentiating -A exp(mean log ratio) directly (GSPO's definition)
    lp = logp.detach().clone().requires_grad_(True)
    seq = ((lp - old) * mask).sum(-1) / mask.sum(-1)
    (-(adv * torch.exp(seq)).mean()).backward()
    assert torch.allclose(lp.grad, logp.grad, atol=1e-6)
    # clip_high 0.1: row 0's s = 1.2214 > 1.1 with A > 0 -> loss -1.1, no gradient, clipped on its real tokens
    logp.grad = None
    loss, clipped = policy_loss("gspo", logp, old, adv, mask, PolicyLossParams(clip_low=0.2, clip_high=0.1))
    assert (loss * mask)[0].tolist() == pytest.approx([-1.1, -1.1, 0.0], abs=1e-6)
    assert clipped.tolist() == [[True, True, False], [False, False, False]]
    aggregate(loss, mask, "token-mean").backward()
    assert logp.grad[0].tolist() == [0.0, 0.0, 0.0]
    assert logp.grad[1].tolist() == pytest.approx([s1 / 4, s1 / 4, 0.0], abs=1e-6)  # token-mean over 4 tokens


def test_cispo_by_hand_value_and_gradient():
    # ratios: 0.5 / 0.25 = 2.0 and 0.9 / 0.8 = 1.125; cap clip_ratio_max 1.5 -> weights [1.5, 1.125]
    old = torch.tensor([[math.log(0.25), math.log(0.8)]])
    logp = torch.tensor([[math.log(0.5), math.log(0.9)]], requires_grad=True)
    mask = torch.ones(1, 2)
    p = PolicyLossParams(clip_ratio_max=1.5, clip_low=0.9, clip_high=0.0)  # clip_low / high are unused
    # A = 2: loss = -w * A * logp = [-1.5 * 2 * ln0.5, -1.125 * 2 * ln0.9]
    loss, clipped = policy_loss("cispo", logp, old, torch.tensor([2.0]), mask, p)
    assert loss[0].tolist() == pytest.approx([-3.0 * math.log(0.5), -2.25 * math.log(0.9)], abs=1e-6)
    assert clipped.tolist() == [[True, False]]  # ratio 2 > 1.5 and A > 0
    # the weight is a constant: d/dlogp = -w * A = [-3, -2.25], also where the cap holds (unlike PPO's clip)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-3.0, -2.25], abs=1e-6)
    # A < 0: nothing counts as clipped (TRL's cispo_clip_ratio counts A > 0 only)
    _, clipped = policy_loss("cispo", logp.detach(), old, torch.tensor([-1.0]), mask, p)
    assert not clipped.any()


def _cov_case():
    # 4 valid tokens and 1 masked; A per token [5, 1, 1, 1] -> mean 2 -> centred [3, -1, -1, -1]
    # logp [-1, -3, -2, -2] -> mean -2 -> centred [1, -1, 0, 0]; covariance terms [3, 1, 0, 0]
    # the masked token (A 100, logp 0) would have a large term if it were counted
    logp = torch.tensor([[-1.0, -3.0, -2.0, -2.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[5.0, 1.0, 1.0, 1.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    return logp, adv, mask


def test_clip_cov_by_hand():
    logp, adv, mask = _cov_case()
    old = logp.detach().clone()  # ratio 1: the PPO clip acts nowhere, loss = -A
    # candidates: 1 < term < 5 -> token 0 only (term 1 is not > 1); max(int(0.0002 * 4), 1) = 1 token cut
    loss, clipped = policy_loss("clip_cov", logp, old, adv, mask, PolicyLossParams())
    assert clipped.tolist() == [[True, False, False, False, False]]
    assert (loss * mask).tolist() == [[0.0, -1.0, -1.0, -1.0, 0.0]]
    (loss * mask).sum().backward()  # d(-A r)/dlogp = -A r = -A, 0 on the cut token
    assert logp.grad.tolist() == [[0.0, -1.0, -1.0, -1.0, 0.0]]
    # token 0 clipped by PPO (ratio e^0.5 > 1.2 with A > 0) is no candidate: nothing is cut
    old0 = old.clone()
    old0[0, 0] -= 0.5
    loss, clipped = policy_loss("clip_cov", logp.detach(), old0, adv, mask, PolicyLossParams())
    assert not clipped.any() and float(loss[0, 0]) == pytest.approx(-1.2 * 5)
    # lb -1: all four valid tokens are candidates (terms 3, 1, 0, 0); ratio 0.5 -> int(0.5 * 4) = 2 cut
    p = PolicyLossParams(clip_cov_lb=-1.0, clip_cov_ratio=0.5)
    _, cut = policy_loss("clip_cov", logp.detach(), old, adv, mask, p)
    assert int(cut.sum()) == 2 and not cut[0, 4]
    # deterministic, and torch's global RNG is neither read nor advanced
    state = torch.get_rng_state()
    _, again = policy_loss("clip_cov", logp.detach(), old, adv, mask, p)
    assert torch.equal(cut, again) and torch.equal(state, torch.get_rng_state())


def test_kl_cov_by_hand():
    logp, adv, mask = _cov_case()
    old = logp.detach() - torch.tensor([[0.5, 0.2, 0.0, 0.0, 0.0]])  # log ratios [0.5, 0.2, 0, 0, 0]
    # top max(1, int(4 * 0.0002)) = 1 term: token 0 (term 3); the masked token is not counted
    loss, chosen = policy_loss("kl_cov", logp, old, adv, mask, PolicyLossParams(ppo_kl_coef=0.1))
    assert chosen.tolist() == [[True, False, False, False, False]]
    # loss = -A e^lr (+ 0.1 * |lr| on token 0) = [-5 e^0.5 + 0.05, -e^0.2, -1, -1]
    expected = [-5 * math.exp(0.5) + 0.05, -math.exp(0.2), -1.0, -1.0, 0.0]
    assert (loss * mask)[0].tolist() == pytest.approx(expected, abs=1e-5)
    (loss * mask).sum().backward()  # token 0: -A e^lr + 0.1 * sign(lr) = -5 e^0.5 + 0.1
    assert float(logp.grad[0, 0]) == pytest.approx(-5 * math.exp(0.5) + 0.1, abs=1e-5)
    # ratio 0.5: max(1, int(4 * 0.5)) = 2 -> tokens 0 and 1 (terms 3 and 1)
    _, chosen = policy_loss("kl_cov", logp.detach(), old, adv, mask, PolicyLossParams(kl_cov_ratio=0.5))
    assert chosen.tolist() == [[True, True, False, False, False]]
    # no valid token: no selection, no error
    loss, chosen = policy_loss("kl_cov", logp.detach(), old, adv, torch.zeros_like(mask), PolicyLossParams())
    assert not chosen.any()


def test_losses_take_sequence_or_token_advantages_alike():
    gen = torch.Generator().manual_seed(0)
    logp, old = -torch.rand(3, 5, generator=gen), -torch.rand(3, 5, generator=gen)
    adv = torch.randn(3, generator=gen)
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    for name in POLICY_LOSSES:
        a, ca = policy_loss(name, logp, old, adv, mask)
        b, cb = policy_loss(name, logp, old, adv.unsqueeze(1).expand(3, 5), mask)
        assert a.shape == (3, 5) and torch.allclose(a, b) and torch.equal(ca, cb), name
        assert not ca[1, 3:].any(), name  # never counted where mask == 0
