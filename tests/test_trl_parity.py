"""Our advantages, losses, reward aggregation and masks equal TRL's GRPOTrainer on the same tensors
(a real trainer, a real model): TRL's attributes are set as its config would set them and its own
methods are called (``_generate_and_score_completions``, ``_compute_loss``, ``get_high_entropy_mask``)."""
import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")


@pytest.fixture(scope="module")
def trl_setup(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from verirl.models import load_model

    tiny = load_model("tiny")  # TRL patches the model's forward: give it its own copy
    captured = {"len": [], "partial": []}

    def reward_len(completions, **kwargs):  # deterministic rewards with ties and spread within groups
        r = [float((3 * i) % 5) + 0.1 * len(str(c)) % 1 for i, c in enumerate(completions)]
        captured["len"].append(r)
        return r

    def reward_partial(completions, **kwargs):  # a rule that does not apply to every sample (None -> NaN)
        r = [None if i % 4 == 0 else float((5 * i + len(str(c))) % 4) for i, c in enumerate(completions)]
        captured["partial"].append(r)
        return r

    rows = [{"prompt": [{"role": "user", "content": "12 + 34 = ? Reply <think> </think> <answer> \\boxed{} </answer>."}]},
            {"prompt": [{"role": "user", "content": "A bus has 23 seats. How many seats in 4 buses? Reply <think> "
                                                    "</think> <answer> \\boxed{} </answer>."}]}]
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=24, beta=0.04, report_to=[], use_cpu=True, bf16=False,
                      logging_steps=1, temperature=1.0, epsilon=0.2, epsilon_high=0.28,
                      reward_weights=[1.0, 0.0],  # the advantage is reward_len's alone unless a test says otherwise
                      use_bias_correction_kl=False)  # plain k3, as veRL and the GRPO paper
    trainer = GRPOTrainer(model=tiny.model, reward_funcs=[reward_len, reward_partial], args=args,
                          train_dataset=Dataset.from_list(rows * 4), processing_class=tiny.tokenizer)
    inputs = [r for r in rows for _ in range(4)]
    torch.manual_seed(0)
    out = trainer._generate_and_score_completions(inputs)
    return SimpleNamespace(trainer=trainer, out=out, captured=captured, tiny=tiny, inputs=inputs)


@contextlib.contextmanager
def _set(obj, **attrs):
    """Set TRL trainer attributes for one test and put the old values back."""
    old = {k: getattr(obj, k) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(obj, k, v)


# ---- advantages and multi-rule aggregation (TRL _generate_and_score_completions) ---------------

@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_trl(trl_setup, scale):
    from verirl.core.algo import grpo_advantages

    s = trl_setup
    out = s.out
    if scale != "group":  # the fixture's batch was scored with TRL's default, "group"
        with _set(s.trainer, scale_rewards=scale):
            torch.manual_seed(1)
            out = s.trainer._generate_and_score_completions(s.inputs)
    rewards = torch.tensor(s.captured["len"][-1])
    ours = grpo_advantages(rewards, group_size=4, scale=scale, epsilon=1e-4)  # TRL adds 1e-4 to the std
    assert torch.allclose(ours, out["advantages"].float(), atol=1e-6), (scale, ours, out["advantages"])
    assert ours.abs().sum() > 0  # the case is not degenerate
    if scale == "none":
        assert not torch.allclose(ours, grpo_advantages(rewards, 4, "group", 1e-4))  # the scales do differ


def test_normalize_then_sum_matches_trl(trl_setup):
    """TRL (multi_objective_aggregation="normalize_then_sum") normalises each rule within its group,
    takes the weighted nansum (our `normalize_then_sum`), then whitens that over the batch:
    advantages = (x - nanmean(x)) / (nanstd(x) + 1e-4). Ours, whitened the same way, equals its output."""
    from verirl.core.algo import grpo_advantages, normalize_then_sum

    s = trl_setup
    with _set(s.trainer, multi_objective_aggregation="normalize_then_sum", reward_weights=torch.tensor([0.7, 1.5])):
        torch.manual_seed(2)
        out = s.trainer._generate_and_score_completions(s.inputs)
    per_rule = {"len": torch.tensor(s.captured["len"][-1]),
                "partial": torch.tensor([math.nan if v is None else v for v in s.captured["partial"][-1]])}
    assert per_rule["partial"].isnan().sum() == 2  # the rule does not apply to two samples
    x = normalize_then_sum(per_rule, {"len": 0.7, "partial": 1.5}, group_size=4)  # TRL's epsilon, 1e-4
    ours = (x - x.mean()) / (x.std() + 1e-4)
    assert torch.allclose(ours, out["advantages"].float(), atol=1e-5), (ours, out["advantages"])
    # each rule's normalised scores sum to 0 in a group, so TRL's batch whitening is our batch scale
    assert torch.allclose(grpo_advantages(x, 4, scale="batch", epsilon=1e-4), out["advantages"].float(), atol=1e-5)
    # the weights matter: swapped, they give other advantages
    y = normalize_then_sum(per_rule, {"len": 1.5, "partial": 0.7}, group_size=4)
    assert not torch.allclose((y - y.mean()) / (y.std() + 1e-4), out["advantages"].float(), atol=1e-3)


# ---- losses (TRL _compute_loss): value and gradient --------------------------------------------

def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _both(s, ours_fn, extra=None, grad=False):
    """TRL's loss and ours on the same batch: an off-policy old policy and a reference that differ from
    the current one, so clipping and KL matter. ours_fn(logp, old, ref, adv, mask, inputs) -> scalar;
    extra(inputs, width) -> entries to add to TRL's inputs. Returns (theirs, ours, their gradient, our
    gradient) over the model's parameters, the gradients None unless ``grad``."""
    from verirl.train.update import response_logprobs
    from verirl.core.types import Rollout

    model = s.tiny.model
    model.eval()
    inputs = dict(s.out)
    roll = Rollout(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                   inputs["completion_mask"], inputs["completion_mask"].clone(),
                   torch.ones(len(inputs["prompt_ids"]), dtype=torch.bool))
    if not hasattr(s, "logp_now"):
        with torch.no_grad():
            s.logp_now = response_logprobs(model, roll)[0]
    w = s.logp_now.shape[1]
    noise = 0.3 * torch.randn(inputs["completion_ids"].shape, generator=torch.Generator().manual_seed(1))
    inputs["old_per_token_logps"] = torch.zeros_like(noise)
    inputs["old_per_token_logps"][:, :w] = s.logp_now + noise[:, :w]
    inputs["ref_per_token_logps"] = torch.zeros_like(noise)
    inputs["ref_per_token_logps"][:, :w] = s.logp_now - noise[:, :w].flip(0)
    inputs["advantages"] = torch.linspace(-1.5, 1.5, len(noise))
    inputs.update(extra(inputs, w) if extra else {})

    def run(fn):
        model.zero_grad()
        with torch.set_grad_enabled(grad):
            loss = fn()
        if not grad:
            return loss, None
        loss.backward()
        g = _grads(model).clone()
        model.zero_grad()
        return loss.detach(), g

    def ours():
        logp, _, mask = response_logprobs(model, roll)
        return ours_fn(logp, inputs["old_per_token_logps"][:, :w], inputs["ref_per_token_logps"][:, :w],
                       inputs["advantages"], mask, inputs)

    theirs, g_theirs = run(lambda: s.trainer._compute_loss(model, inputs))
    mine, g_mine = run(ours)
    return theirs, mine, g_theirs, g_mine


def _assert_same(theirs, ours, g_theirs=None, g_ours=None):
    assert float(ours) == pytest.approx(float(theirs), abs=1e-5, rel=1e-5)
    if g_theirs is not None:  # float32 through two forward paths: agree to 1e-4 of the largest entry
        assert g_theirs.abs().max() > 0
        assert torch.allclose(g_ours, g_theirs, rtol=1e-4, atol=1e-4 * float(g_theirs.abs().max())), (
            float((g_ours - g_theirs).abs().max()), float(g_theirs.abs().max()))


def _kl(logp, ref, mask, agg, **kw):
    from verirl.core.algo import aggregate, kl_penalty
    return 0.04 * aggregate(kl_penalty(logp, ref, "low_var_kl"), mask, agg, **kw)


@pytest.mark.parametrize("loss_type,agg", [("bnpo", "token-mean"), ("grpo", "seq-mean-token-mean")])
def test_loss_matches_trl(trl_setup, loss_type, agg):
    from verirl.core.algo import aggregate, clipped_policy_loss

    def ours(logp, old, ref, adv, mask, _):
        pg, _ = clipped_policy_loss(logp, old, adv, 0.2, 0.28)
        return aggregate(pg, mask, agg) + _kl(logp, ref, mask, agg)

    with _set(trl_setup.trainer, loss_type=loss_type):
        _assert_same(*_both(trl_setup, ours))


@pytest.mark.parametrize("loss_type,agg", [("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean")])
def test_gspo_matches_trl(trl_setup, loss_type, agg):
    """TRL importance_sampling_level="sequence": one (B, 1) ratio exp(mean log ratio) per sequence,
    broadcast over its tokens; ours carries it per token with the gradient of each token's log-prob."""
    from verirl.core.algo import PolicyLossParams, aggregate, policy_loss

    p = PolicyLossParams(clip_low=0.02, clip_high=0.03)  # narrow, so some sequences are clipped
    clipped_rows = []

    def ours(logp, old, ref, adv, mask, _):
        pg, clipped = policy_loss("gspo", logp, old, adv, mask, p)
        clipped_rows.append(clipped.any(-1))
        return aggregate(pg, mask, agg) + _kl(logp, ref, mask, agg)

    with _set(trl_setup.trainer, loss_type=loss_type, importance_sampling_level="sequence",
              epsilon_low=p.clip_low, epsilon_high=p.clip_high):
        _assert_same(*_both(trl_setup, ours, grad=True))
    assert 0 < int(clipped_rows[0].sum()) < len(clipped_rows[0])  # some sequences clipped, some not


def test_cispo_matches_trl(trl_setup):
    """TRL loss_type="cispo", epsilon_high=5: -sg[min(ratio, 5)] * A * logp, summed over the tokens and
    divided by num_items_in_batch (the batch's tokens: token-mean). The old log-probs of a few tokens
    are lowered by 2 (ratio e^2 = 7.4 > 5 at most noise) so that the cap acts."""
    from verirl.core.algo import PolicyLossParams, aggregate, policy_loss

    capped = []

    def extra(inputs, w):
        old = inputs["old_per_token_logps"].clone()
        old[[0, 5], :3] -= 2.0  # row 0 has A < 0, row 5 A > 0
        return {"old_per_token_logps": old}

    def ours(logp, old, ref, adv, mask, inputs):
        n = float(inputs["num_items_in_batch"])
        assert n == float(mask.sum())
        pg, clipped = policy_loss("cispo", logp, old, adv, mask, PolicyLossParams(clip_ratio_max=5.0))
        capped.append(clipped)
        return aggregate(pg, mask, "token-mean", num_tokens=n) + _kl(logp, ref, mask, "token-mean", num_tokens=n)

    with _set(trl_setup.trainer, loss_type="cispo", epsilon_high=5.0):
        _assert_same(*_both(trl_setup, ours, extra, grad=True))
    assert capped[0][5].any() and not capped[0][0].any()  # counted where A > 0 only, as TRL's cispo_clip_ratio


def test_dr_grpo_matches_trl(trl_setup):
    """TRL loss_type="dr_grpo": sum(loss * mask) / (B * max_completion_length) =
    our seq-mean-token-sum-norm with scale_factor = max_completion_length."""
    from verirl.core.algo import aggregate, clipped_policy_loss

    def ours(logp, old, ref, adv, mask, _):
        pg, _ = clipped_policy_loss(logp, old, adv, 0.2, 0.28)
        return (aggregate(pg, mask, "seq-mean-token-sum-norm", scale_factor=24)
                + _kl(logp, ref, mask, "seq-mean-token-sum-norm", scale_factor=24))

    with _set(trl_setup.trainer, loss_type="dr_grpo"):
        assert trl_setup.trainer.max_completion_length == 24
        _assert_same(*_both(trl_setup, ours))


# ---- train/inference mismatch (TRL vllm_importance_sampling_*) ---------------------------------

def _trl_vllm_is_ratio(old_logps, sampling_logps, mask, mode, clip_min, clip_max):
    """TRL 1.16 GRPOTrainer._generate_and_score_completions, the block under
    ``if self.use_vllm and self.vllm_importance_sampling_correction`` (grpo_trainer.py ~2660-2705),
    reproduced: it runs only after a vLLM generation, which this machine cannot do."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    logps_diff = diff.sum(dim=-1, keepdim=True) if mode in ["sequence_mask", "sequence_truncate"] else diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        lo = clip_min if clip_min is not None else -math.inf
        hi = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)
    return ratio


@pytest.mark.parametrize("mode,ours_args", [
    ("sequence_mask", ("sequence", 3.0, "sequence", 3.0, 0.0)),
    ("token_mask", ("token", 3.0, "token", 3.0, 0.0)),
    ("sequence_truncate", ("sequence", 3.0, None, 3.0, 0.0)),
    ("token_truncate", ("token", 3.0, None, 3.0, 0.0)),
])
def test_rollout_correction_matches_trl_modes(mode, ours_args):
    from verirl.core.algo import rollout_correction

    gen = torch.Generator().manual_seed(4)
    old = -torch.rand(16, 12, generator=gen) * 3
    sampling = old + 0.6 * torch.randn(16, 12, generator=gen)
    mask = (torch.arange(12) < torch.randint(1, 13, (16, 1), generator=gen)).float()
    theirs = (_trl_vllm_is_ratio(old, sampling, mask, mode, None, 3.0) * mask).expand(16, 12)
    w, rejected = rollout_correction(old, sampling, mask, *ours_args)
    assert torch.allclose(w, theirs, rtol=1e-5, atol=1e-6)
    assert (theirs == 0).logical_and(mask > 0).any() or "truncate" in mode  # something is rejected
    assert torch.equal(rejected, (w == 0) & (mask > 0)) or "truncate" in mode


def test_rollout_correction_in_trl_loss(trl_setup):
    """TRL multiplies the per-token loss by importance_sampling_ratio (before adding the KL) and keeps the
    rejected tokens in its token-mean denominator: our weights, applied the same way, give its loss."""
    from verirl.core.algo import aggregate, clipped_policy_loss, rollout_correction

    kept = []

    def extra(inputs, w):
        gen = torch.Generator().manual_seed(5)
        sampling = inputs["old_per_token_logps"] + 0.3 * torch.randn(inputs["old_per_token_logps"].shape,
                                                                      generator=gen)
        inputs["sampling_logps"] = sampling
        ratio = _trl_vllm_is_ratio(inputs["old_per_token_logps"], sampling, inputs["completion_mask"].float(),
                                   "sequence_mask", None, 3.0)
        return {"importance_sampling_ratio": ratio}

    def ours(logp, old, ref, adv, mask, inputs):
        weights, rejected = rollout_correction(old, inputs["sampling_logps"][:, :old.shape[1]], mask,
                                               "sequence", 3.0, "sequence", 3.0)
        kept.append(rejected.any(-1))
        pg, _ = clipped_policy_loss(logp, old, adv, 0.2, 0.28)
        return aggregate(pg * weights, mask, "token-mean") + _kl(logp, ref, mask, "token-mean")

    with _set(trl_setup.trainer, loss_type="bnpo", use_vllm=True, vllm_importance_sampling_correction=True):
        _assert_same(*_both(trl_setup, ours, extra))
    assert 0 < int(kept[0].sum()) < len(kept[0])  # some sequences rejected, some kept


# ---- high-entropy tokens (TRL top_entropy_quantile) --------------------------------------------

@pytest.mark.parametrize("quantile", [0.2, 0.5, 1.0])
def test_high_entropy_mask_matches_trl(trl_setup, quantile):
    from verirl.core.algo import high_entropy_mask

    gen = torch.Generator().manual_seed(6)
    ent = torch.rand(6, 10, generator=gen) * 4
    mask = (torch.arange(10) < torch.randint(1, 11, (6, 1), generator=gen)).float()
    theirs = trl_setup.trainer.get_high_entropy_mask(ent, mask, 1 - quantile)
    ours = high_entropy_mask(ent, mask, quantile)
    assert torch.equal(ours, theirs)
    assert 0 < int(ours.sum()) <= int(mask.sum())
