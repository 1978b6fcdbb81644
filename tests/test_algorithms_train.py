"""The algorithm options inside real steps of the tiny model: the mismatch guard, dynamic sampling
(filter_groups), overlong shaping, truncated-response masking, and exact gradient accumulation for
every policy loss and aggregation whose definition allows it."""
import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from verirl.cli import main
from verirl.config import load_config
from verirl.rollout import NativeEngine, SamplingParams
from verirl.train.update import Correction, LogprobPass, UpdateParams, build_optimizer, compute_logprobs, update_policy
from verirl.train.build import build_run
from verirl.train.step import train_step
from verirl.core.types import TrainBatch

SMALL = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=20",
         "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
         "reward.workers=0", "data.train_size=256", "eval.size=8"]
VOLATILE = ("timing/", "perf/")


def _run(tmp_path, *overrides):
    cfg = load_config("tiny", [f"trainer.run_dir={tmp_path}", *SMALL, *overrides])
    return build_run(cfg)


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


# ------------------------------------------------------------------ the train/inference mismatch guard

def test_native_engine_on_policy_has_ratio_one_and_masks_nothing(tmp_path):
    run = _run(tmp_path / "r", "model.compute_dtype=null")  # the trainer's numbers are then the engine's
    try:
        m, _ = train_step(run, 1)
    finally:
        run.lock.release()
    assert run.step.update.correction == Correction()  # on by default: sequence rejection at 3
    assert abs(m["mismatch/ratio_p05"] - 1) < 1e-5 and abs(m["mismatch/ratio_p95"] - 1) < 1e-5, m
    assert abs(m["mismatch/ratio_p50"] - 1) < 1e-5
    assert m["mismatch/kl"] < 1e-9 and m["mismatch/masked_frac"] == 0.0
    assert m["rollout/logprob_diff/max"] < 1e-5  # the same pair of log-probs


def test_mixed_precision_shows_as_a_small_mismatch_and_masks_nothing(tmp_path):
    """model.compute_dtype=bfloat16: the engine samples in float32 and the trainer computes in bfloat16, so
    the ratios leave 1 by about bfloat16's rounding; far inside the guard's bounds, nothing is masked."""
    run = _run(tmp_path / "r", "model.compute_dtype=bfloat16")
    try:
        m, _ = train_step(run, 1)
    finally:
        run.lock.release()
    spread = max(abs(m["mismatch/ratio_p05"] - 1), abs(m["mismatch/ratio_p95"] - 1))
    assert 1e-5 < spread < 0.05, m
    assert m["mismatch/masked_frac"] == 0.0


def test_a_sampler_at_another_temperature_is_detected_and_masked(tmp_path):
    """The engine samples at temperature 0.3 while the trainer computes log-probs at 1.0: the ratios
    move away from 1, the guard sees it, and its sequence rejection takes the worst responses out
    (the tiny model is confident on most tokens, so the colder sampler changes few of them)."""
    run = _run(tmp_path / "r", "rollout.max_new_tokens=32")
    how = run.step
    run.step = dataclasses.replace(how, sampling=dataclasses.replace(how.sampling, temperature=0.3))
    try:
        m, _ = train_step(run, 1)
    finally:
        run.lock.release()
    assert m["mismatch/kl"] > 5e-3, m  # against < 1e-9 when the engine and the trainer agree
    assert m["mismatch/ratio_p05"] < 0.9, m
    assert m["mismatch/masked_frac"] > 0.0, m


@pytest.fixture(scope="module")
def guarded(tiny, arith):
    """A rollout whose engine log-probs disagree with the trainer's on rows 1 and 6 (by a sequence
    ratio far above 3), and agree elsewhere."""
    train, _ = arith
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    roll = engine.generate([p.ids for p in train[:2]], 4, SamplingParams(max_new_tokens=16, seed=5))
    lp = roll.sample_logprobs.clone()
    lp[[1, 6]] -= 0.5 * roll.response_mask[[1, 6]].float()  # the engine thought these tokens less likely
    roll = dataclasses.replace(roll, sample_logprobs=lp)
    return roll, torch.linspace(-1.0, 1.0, 8)


def _weights_after(tiny, batch, p):
    model = copy.deepcopy(tiny.model)
    opt, sched = build_optimizer(model, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    update_policy(model, opt, sched, batch, p)
    return model.state_dict()


def test_rejected_responses_contribute_nothing_but_stay_in_the_denominator(tiny, guarded):
    roll, adv = guarded
    p = UpdateParams(group_size=4, mini_batch_prompts=2, forward=LogprobPass(micro_batch_size=3), grad_clip=0.0,
                     correction=Correction())
    guarded_w = _weights_after(tiny, TrainBatch(roll, adv), p)
    zeroed = adv.clone()
    zeroed[[1, 6]] = 0.0  # what rejection means: no policy gradient from those rows, same token count
    plain = dataclasses.replace(p, correction=None)
    expected = _weights_after(tiny, TrainBatch(roll, zeroed), plain)
    unguarded = _weights_after(tiny, TrainBatch(roll, adv), plain)
    assert all(torch.allclose(guarded_w[k], expected[k], atol=1e-6) for k in expected)
    assert any(not torch.allclose(unguarded[k], expected[k], atol=1e-6) for k in expected)


# ------------------------------------------------------------------ exact gradient accumulation

@pytest.fixture(scope="module")
def off_policy(tiny, arith):
    """Three prompts x 4 samples, an old policy and a reference that differ from the current one, so
    that every clip and the KL term matter."""
    train, _ = arith
    engine = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids)
    roll = engine.generate([p.ids for p in train[:3]], 4, SamplingParams(max_new_tokens=20, seed=3))
    now = compute_logprobs(tiny.model, roll, LogprobPass(micro_batch_size=12))
    g = torch.Generator().manual_seed(0)
    old = now + 0.3 * torch.randn(now.shape, generator=g)
    engine_lp = (old + 0.2 * torch.randn(now.shape, generator=g)) * roll.response_mask  # the engine disagrees a bit
    engine_lp[[2, 7]] -= 0.5 * roll.response_mask[[2, 7]]  # and on two responses a lot: the guard rejects them
    roll = dataclasses.replace(roll, stopped=torch.tensor([True, False] * 6),  # some "truncated" rows
                               sample_logprobs=engine_lp)
    ref = now - 0.05 * torch.arange(now.shape[1]).float()
    return TrainBatch(roll, torch.linspace(-1.0, 1.0, 12), old_logprobs=old, ref_logprobs=ref)


def _grads(tiny, batch, micro, **kw):
    model = copy.deepcopy(tiny.model)
    opt, sched = build_optimizer(model, lr=0.0, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0)
    p = UpdateParams(group_size=4, mini_batch_prompts=3, forward=LogprobPass(micro_batch_size=micro), kl_coef=0.1,
                     entropy_coef=0.01, grad_clip=0.0, **kw)
    stats = update_policy(model, opt, sched, batch, p)
    return {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}, stats


@pytest.mark.parametrize("loss", ["vanilla", "dual_clip", "gspo", "cispo"])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_micro_batches_give_the_full_batch_gradient_for_every_loss(tiny, off_policy, loss, mode):
    from verirl.core.algo import CLIP_DEFAULTS, PolicyLossParams

    low, high = CLIP_DEFAULTS[loss]
    guard = Correction("token", 2.0, "sequence", 3.0)  # token weights and some rejected responses
    kw = dict(policy_loss=loss, loss=PolicyLossParams(clip_low=low, clip_high=high), loss_agg_mode=mode,
              loss_scale_factor=20.0, mask_truncated=True, correction=guard)
    roll = off_policy.rollout
    weights, rejected = guard.apply(off_policy.old_logprobs, roll.sample_logprobs, roll.response_mask.float())
    assert rejected.any() and (weights[~rejected & roll.response_mask.bool()] != 1).any()  # the guard acts
    full, s_full = _grads(tiny, off_policy, 12, **kw)
    assert any(g.abs().max() > 0 for g in full.values())
    for micro in (1, 5):
        part, s_part = _grads(tiny, off_policy, micro, **kw)
        for name, g in full.items():
            assert torch.allclose(part[name], g, atol=1e-6, rtol=1e-4), (loss, mode, micro, name)
        assert s_part["actor/pg_loss"] == pytest.approx(s_full["actor/pg_loss"], abs=1e-6)
        assert s_part["actor/pg_clipfrac"] == pytest.approx(s_full["actor/pg_clipfrac"], abs=1e-6)


def test_mask_truncated_takes_truncated_responses_out_of_the_loss(tiny, off_policy):
    """With mask_truncated, a truncated response's advantage does not matter: changing it changes no
    gradient."""
    changed = dataclasses.replace(off_policy, advantages=off_policy.advantages.clone())
    changed.advantages[1::2] += 3.0  # the rows marked not stopped
    a, _ = _grads(tiny, off_policy, 12, mask_truncated=True)
    b, _ = _grads(tiny, changed, 12, mask_truncated=True)
    assert all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)
    c, _ = _grads(tiny, changed, 12)
    assert any(not torch.allclose(a[k], c[k], atol=1e-6) for k in a)


# ------------------------------------------------------------------ dynamic sampling (filter_groups)

FILTER = ["algo.filter_groups.enable=true", "data.prompts_per_step=8", "actor.mini_batch_prompts=8",
          "algo.kl_coef=0"]


def test_filter_groups_drops_constant_groups_and_refills_the_step(tmp_path):
    run = _run(tmp_path / "r", *FILTER, "algo.filter_groups.max_num_gen_batches=0")
    try:
        before = run.sampler.state_dict()
        m, records = train_step(run, 1)
        after = run.sampler.state_dict()
    finally:
        run.lock.release()
    assert m["filter/gen_batches"] >= 2, m  # the first batch had groups all right or all wrong
    assert m["filter/kept_groups"] == 8 and m["filter/shortfall"] == 0
    assert m["reward/zero_std_groups"] == 0.0  # every group trained on has a spread of rewards
    assert m["adv/max"] > 0
    # the sampler advanced by every prompt taken: 8 per generation batch
    fresh = _run(tmp_path / "s", *FILTER)
    try:
        fresh.sampler.load_state_dict(before)
        fresh.sampler.take(8 * int(m["filter/gen_batches"]))
        assert fresh.sampler.state_dict() == after
    finally:
        fresh.lock.release()


def test_filter_groups_out_of_budget_trains_on_fewer_groups(tmp_path):
    run = _run(tmp_path / "r", *FILTER, "algo.filter_groups.max_num_gen_batches=1", "trainer.dump_rollouts=true")
    try:
        m, records = train_step(run, 1)
    finally:
        run.lock.release()
    informative = int(m["filter/informative_groups"])
    assert 0 < informative < 8, m  # the case this test is about: one batch with some constant groups
    assert m["filter/gen_batches"] == 1
    assert m["filter/kept_groups"] == informative and m["filter/shortfall"] == 8 - informative
    assert len(records) == 4 * informative  # the step's batch is the informative groups, rollout.n each
    assert m["reward/zero_std_groups"] == 0.0


def test_a_metric_without_spread_keeps_one_group_per_rank(tmp_path):
    """A metric no group has any spread in (format scores all 0 on a 2-token budget): the step still
    trains on one group (a rank's minimum) and says the shortfall."""
    run = _run(tmp_path / "r", *FILTER, "algo.filter_groups.max_num_gen_batches=2", "algo.filter_groups.metric=format",
               "rollout.max_new_tokens=2")
    try:
        m, _ = train_step(run, 1)
    finally:
        run.lock.release()
    assert m["filter/informative_groups"] == 0 and m["filter/gen_batches"] == 2
    assert m["filter/kept_groups"] == 1 and m["filter/shortfall"] == 7


def test_resume_after_filtered_steps_is_exact(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    args = ["train", "--config", "tiny", *SMALL, *FILTER, "trainer.save_freq=2", "algo.filter_groups.max_num_gen_batches=3",
            "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=8"]
    assert main([*args, f"trainer.run_dir={a}", "trainer.total_steps=4"]) == 0
    assert main([*args, f"trainer.run_dir={b}", "trainer.total_steps=2"]) == 0
    assert main([*args, f"trainer.run_dir={b}", "trainer.total_steps=4"]) == 0
    ma, mb = _metrics(a), _metrics(b)
    assert [r["step"] for r in mb] == [1, 2, 3, 4]
    assert ma == mb
    assert any(r["filter/gen_batches"] > 1 for r in ma)  # regeneration happened in this run
    assert all("reward/overlong/mean" in r for r in ma)


# ------------------------------------------------------------------ reward shaping and the options' wiring

def test_overlong_shaping_is_its_own_rule_and_enters_the_reward(tmp_path):
    run = _run(tmp_path / "r", "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=10",
               "reward.overlong_buffer.penalty_factor=0.5", "trainer.dump_rollouts=true")
    try:
        m, records = train_step(run, 1)
    finally:
        run.lock.release()
    for r in records:  # max_new_tokens 20, buffer 10: the penalty starts past 10 tokens
        want = -0.5 * min(1.0, (r["response_length"] - 10) / 10) if r["response_length"] > 10 else 0.0
        assert r["scores"]["overlong"] == pytest.approx(want)
        others = sum(w * (r["scores"][k] or 0.0) for k, w in (("acc", 1.0), ("exact", 1.0), ("format", 0.1)))
        assert r["reward"] == pytest.approx(others + want)
    assert m["reward/overlong/mean"] == pytest.approx(sum(r["scores"]["overlong"] for r in records) / len(records))
    assert m["reward/overlong/mean"] < 0


def test_entropy_is_split_by_task(tmp_path):
    run = _run(tmp_path / "r", "trainer.dump_rollouts=true")
    try:
        m, records = train_step(run, 1)
        m["_records"] = records
    finally:
        run.lock.release()
    tasks = [k for k in m if k.startswith("actor/entropy/task/")]
    assert len(tasks) == 2 and all(m[k] > 0 for k in tasks)  # add and mul
    # token-mean over one mini-batch: actor/entropy is the token-weighted mean of the task splits
    records = m["_records"]
    tokens = {t: sum(r["response_length"] for r in records if r["task"] == t) for t in ("add", "mul")}
    mean = sum(m[f"actor/entropy/task/{t}"] * tokens[t] for t in tokens) / sum(tokens.values())
    assert mean == pytest.approx(m["actor/entropy"], rel=1e-5)


TWO_MINI = ["actor.mini_batch_prompts=2", "actor.lr=5e-3",  # the second mini-batch is well off-policy
            "algo.filter_groups.enable=true", "algo.filter_groups.max_num_gen_batches=0"]  # and every group has signal


@pytest.fixture(scope="module")
def default_step(tmp_path_factory):
    """One step of the default settings with two mini-batches (the second off-policy)."""
    run = _run(tmp_path_factory.mktemp("default") / "r", *TWO_MINI)
    try:
        return train_step(run, 1)[0]
    finally:
        run.lock.release()


# 18 new tokens cut 3 in 4 of this step's responses (20 cut none): what mask_truncated acts on
TRUNCATING = ["rollout.max_new_tokens=18"]


@pytest.mark.parametrize("option,key,shared", [
    (["algo.policy_loss=gspo"], "actor/pg_clipfrac", []),  # its own clips, 3e-4 / 4e-4: far more clipping
    # c just above 1: some tokens of the off-policy mini-batch have A < 0 and r > c, where the dual clip acts
    (["algo.policy_loss=dual_clip", "algo.clip_ratio_c=1.001"], "actor/pg_clipfrac", []),
    (["algo.policy_loss=cispo", "algo.clip_ratio_max=1.0"], "actor/pg_loss", []),
    (["algo.policy_loss=clip_cov", "algo.clip_cov_ratio=0.5", "algo.clip_cov_lb=-5"], "actor/grad_norm", []),
    (["algo.policy_loss=kl_cov", "algo.kl_cov_ratio=0.5"], "actor/pg_loss", []),
    (["algo.scale_rewards=batch"], "adv/max", []),
    (["algo.adv_estimator=reinforce_plus_plus_baseline"], "adv/min", []),
    (["algo.adv_estimator=rloo"], "adv/max", []),
    (["algo.top_entropy_quantile=0.2"], "actor/pg_loss", []),
    (["algo.rollout_correction.rollout_is=token", "algo.rollout_correction.rollout_is_threshold=0.5"], "actor/pg_loss",
     []),
    (["algo.loss_agg_mode=seq-mean-token-sum-norm", "algo.loss_scale_factor=7"], "actor/pg_loss", []),
    (["algo.mask_truncated=true"], "actor/pg_loss", TRUNCATING),
])
def test_each_option_reaches_the_step(tmp_path, default_step, option, key, shared):
    """Every option, set in the config, changes what the step computes: the same seed, data and ``shared``
    settings as the step without it, so anything that differs is the option's doing."""
    base = default_step
    if shared:
        run = _run(tmp_path / "base", *TWO_MINI, *shared)
        try:
            base = train_step(run, 1)[0]
        finally:
            run.lock.release()
    run = _run(tmp_path / "r", *TWO_MINI, *shared, *option)
    try:
        m, _ = train_step(run, 1)
    finally:
        run.lock.release()
    assert torch.isfinite(torch.tensor(m["actor/grad_norm"]))
    assert m["reward/mean"] == base["reward/mean"]  # the same rollouts: only what the option does differs
    assert m[key] != pytest.approx(base[key], rel=1e-6, abs=1e-9), (option, key, m[key])
    if option[0].startswith("algo.policy_loss="):
        assert run.step.update.policy_loss == option[0].split("=")[1]
    if option == ["algo.policy_loss=gspo"]:
        assert (run.step.update.loss.clip_low, run.step.update.loss.clip_high) == (3e-4, 4e-4)
    if "algo.clip_ratio_c=1.001" in option:  # the dual clip adds its tokens to the PPO clip's
        assert m["actor/pg_clipfrac"] > base["actor/pg_clipfrac"]
    if shared == TRUNCATING:  # some responses are cut, not all
        assert 0 < base["response_length/clip_ratio"] < 1 and m["response_length/clip_ratio"] == \
            base["response_length/clip_ratio"]


def test_normalize_then_sum_logs_the_plain_reward(tmp_path):
    """normalize_then_sum changes what the advantages are computed from, not the logged reward."""
    from verirl.core.algo import normalize_then_sum

    run = _run(tmp_path / "r", "reward.aggregate=normalize_then_sum", "algo.scale_rewards=none",
               "trainer.dump_rollouts=true")
    try:
        m, records = train_step(run, 1)
    finally:
        run.lock.release()
    weights = {"acc": 1.0, "exact": 1.0, "format": 0.1}
    for r in records:
        assert r["reward"] == pytest.approx(sum(w * (r["scores"][k] or 0.0) for k, w in weights.items()))
    assert m["reward/mean"] == pytest.approx(sum(r["reward"] for r in records) / len(records))
    # the advantages come from the normalised sum (scale none: only its group mean is taken off)
    per_rule = {k: torch.tensor([float("nan") if r["scores"][k] is None else r["scores"][k] for r in records],
                                dtype=torch.float64) for k in weights}
    summed = normalize_then_sum(per_rule, weights, 4).view(-1, 4)
    adv = summed - summed.mean(1, keepdim=True)
    assert m["adv/max"] == pytest.approx(float(adv.max()), abs=1e-6)
    assert m["adv/min"] == pytest.approx(float(adv.min()), abs=1e-6)


@pytest.mark.parametrize("bad,match", [
    (["algo.policy_loss=ppo"], "algo.policy_loss"),
    (["algo.scale_rewards=global"], "algo.scale_rewards"),
    (["algo.rollout_correction.rollout_rs=seq"], "rollout_rs"),
    (["algo.filter_groups.enable=true", "algo.filter_groups.metric=accuracy"], "filter_groups.metric"),
    (["algo.top_entropy_quantile=0"], "top_entropy_quantile"),
    (["algo.norm_adv_by_std=true", "algo.scale_rewards=none"], "norm_adv_by_std"),
    (["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=20"], "overlong_buffer.len"),
    (["algo.policy_loss=dual_clip", "algo.clip_ratio_c=1"], "clip_ratio_c"),
    (["algo.rollout_correction.rollout_rs_threshold=0"], "rollout_rs_threshold"),
    (["algo.filter_groups.enable=true", "rollout.engine=replay", "rollout.replay_path=x.jsonl"], "replay"),
])
def test_bad_algorithm_options_are_one_paragraph_errors(tmp_path, capsys, bad, match):
    assert main(["train", "--config", "tiny", f"trainer.run_dir={tmp_path}", *SMALL, *bad]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 50, 1.0), (1.0, 0, 0.9)])
def test_sampled_tokens_come_with_their_logprobs(temperature, top_k, top_p):
    """The native engine's log-probs: the same tokens as plain sampling, and log softmax(logits / T) of
    each, before truncation (what the trainer computes), from the sampling's own weights and total."""
    from verirl.rollout.sampling import sample_and_score, sample_next

    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(16, 151936, generator=g)  # Qwen2.5's vocabulary
    u = torch.rand(16, generator=g, dtype=torch.float64)
    tokens, logp = sample_and_score(logits, temperature, top_k, top_p, uniforms=u)
    assert torch.equal(tokens, sample_next(logits, temperature, top_k, top_p, uniforms=u))
    want = torch.log_softmax(logits.double() / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert (logp.double() - want).abs().max() < 2e-5


def test_an_engine_without_logprobs_turns_the_guard_off_and_says_so_once_a_run(tmp_path, capsys):
    runs = [_run(tmp_path / f"r{i}", "rollout.engine=hf") for i in range(2)]
    try:
        assert all(r.step.update.correction is None for r in runs)
        m, _ = train_step(runs[0], 1)
    finally:
        for r in runs:
            r.lock.release()
    err = capsys.readouterr().err
    assert err.count("mismatch guard is off") == 2 and "rollout.engine=hf" in err  # once a run, not each step
    assert not any(k.startswith("mismatch/") for k in m)
