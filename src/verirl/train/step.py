"""One GRPO step, read top to bottom as the picture in docs/design.md:

    prompts -> rollout -> rewards (scored while the passes run) -> old / ref log-probs
            -> group advantages -> policy update -> metrics

The step reads no config: `verirl.train.build` turned it into the `Run` it is given. With
several ranks each takes whole groups of the step's prompts, the update sums the gradients over
the ranks, and the advantages and metrics are those of the global batch. With
``algo.filter_groups`` the rollout phase repeats until the step has enough groups whose rewards
differ (`dynamic_sampling`); otherwise there is one rollout per step. Rewards are outcome rewards
(one scalar per response).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from verirl.core.algo import informative_groups, kl_penalty, normalize_then_sum, overlong_penalty
from verirl.core.errors import DataError
from verirl.train.evaluate import decode_responses
from verirl.models.perf import mfu, step_flops
from verirl.train.step_metrics import Timer, advantage_metrics, length_metrics, throughput
from verirl.rewards import RewardResult
from verirl.rollout import concat_rollouts, generate_chunked
from verirl.train.update import Correction, compute_logprobs, update_policy
from verirl.train.build import Run
from verirl.train.settings import RewardShaping, StepSettings
from verirl.train.distributed import Dist
from verirl.train.packing import PackCache
from verirl.train.strategy import full_weights, memory_metrics
from verirl.core.types import Prompt, Rollout, TrainBatch

PHASES = ("rollout", "reward", "old_log_prob", "ref", "update", "sync_weights", "all")


def train_step(run: Run, step: int) -> tuple[dict[str, float], list[dict]]:
    """One GRPO step. Returns (metrics of the global batch, one record per response of the global
    batch when the run dumps rollouts; on every rank)."""
    dist = run.dist
    timer = Timer(run.watchdog)
    with timer("all"):
        got = sample_step(run, step, timer)  # rollout (+ regeneration of uninformative groups)
        how, rollout = got.how, got.rollout
        per_response = [p for p in got.prompts for _ in range(how.group_size)]
        layouts = PackCache(rollout)  # the passes below pack the same rows: lay them out once
        old_logprobs = ref_logprobs = None
        if how.old_pass is not None:
            with timer("old_log_prob"):
                old_logprobs = compute_logprobs(run.model, rollout, how.old_pass, layouts, dist)
        if run.ref is not None:
            with timer("ref"):
                ref_logprobs = compute_logprobs(run.ref, rollout, how.ref_pass, layouts, dist)
        with timer("reward"):  # what is left of the scoring once the passes are done
            rewards, trained_on = got.rewards()
            scores = torch.tensor(trained_on, dtype=torch.float32)
            advantages = global_advantages(how, dist, scores, rollout.response_lengths.cpu())
            advantages = advantages.to(rollout.response_ids.device)
        batch = TrainBatch(rollout, advantages, old_logprobs, ref_logprobs)
        trainer_logp = old_logprobs if old_logprobs is not None or rollout.sample_logprobs is None else \
            torch.zeros_like(rollout.sample_logprobs)  # on-policy: filled by the update with its own
        entropy = torch.zeros(rollout.response_ids.shape[0], dtype=torch.float32, device=rollout.response_ids.device)
        with timer("update"), recording(run, step):
            actor_stats = update_policy(run.model, run.optimizer, run.scheduler, batch, how.update, layouts, dist,
                                        on_policy_out=trainer_logp, entropy_out=entropy)
        with timer("sync_weights"):  # an engine with its own copy of the weights (vLLM) gets the new ones
            pushed = run.engine.sync_weights(run.model) or {}
    actor_stats.update({k: dist.all_max([v])[0] for k, v in pushed.items()})
    actor_stats.update(memory_metrics(run.model, run.optimizer, run.ref, dist))
    actor_stats.update(logprob_check(rollout, trainer_logp, dist))
    actor_stats.update(mismatch_metrics(rollout, trainer_logp, how.update.correction, dist))
    actor_stats.update(got.stats)
    local = StepData([p.task for p in per_response], [p.extra.get("data_source") for p in per_response], rewards,
                     scores, advantages.cpu(), rollout, entropy.cpu())
    metrics = step_metrics(step, how, dist, local, actor_stats, timer)
    records = rollout_records(step, run.tokenizer, per_response, got.texts, rollout, rewards) \
        if how.dump_rollouts else []
    return metrics, in_batch_order(dist.gather(records), how, dist.world) if records else []


@dataclass
class Sampled:
    """The rollout phase's result on this rank."""
    how: StepSettings  # the step's settings (fewer groups when a filtered step ran short)
    prompts: list[Prompt]  # this rank's, one per group
    rollout: Rollout
    texts: list[str]
    rewards: Callable[[], tuple[RewardResult, list[float]]]  # `shape_rewards`' (waits for the scoring workers)
    stats: dict[str, float]  # filter/* of a filtered step


def sample_step(run: Run, step: int, timer: Timer) -> Sampled:
    """This rank's prompts, their rollouts and (pending) rewards for ``step``."""
    how, dist = run.step, run.dist
    if how.filter is not None:
        return dynamic_sampling(run, step, timer)
    batch_prompts = [run.train[i] for i in run.sampler.take(how.prompts_per_step)]  # the same on every rank
    mine = how.positions(dist.rank, dist.world)  # this rank's whole groups
    prompts = [batch_prompts[i] for i in mine]
    rollout, texts = generate(run, prompts, mine, how.sampling_at(step), timer)
    with timer("reward"):  # scoring runs in the reward workers during the log-prob passes
        pending = run.scorer.submit(texts, [reward_fields(p) for p in prompts for _ in range(how.group_size)])
    return Sampled(how, prompts, rollout, texts, lambda: shape_rewards(how.shaping, pending.result(), rollout,
                                                                     how.group_size, run.scorer.weights), {})


def generate(run: Run, prompts: list[Prompt], positions: list[int], sampling, timer: Timer) -> tuple[Rollout, list[str]]:
    """``rollout.n`` responses to each prompt (at ``positions`` of the global batch), and their text."""
    how = run.step
    with timer("rollout"), decoding_weights(run):  # whole weights, no collective inside
        rollout = generate_chunked(run.engine, [p.ids for p in prompts], how.group_size, sampling,
                                   how.generate_batch, run.pad_id, positions)
        return rollout, decode_responses(run.tokenizer, rollout)


def dynamic_sampling(run: Run, step: int, timer: Timer) -> Sampled:
    """DAPO's dynamic sampling (algo.filter_groups): generation batches of ``prompts_per_step`` prompts,
    each scored at once, until the step has that many groups whose metric differs between samples (the
    others have zero advantage: no signal), or ``max_gen_batches`` ran out. The step then trains on the
    first informative groups in (generation batch, position) order: all it needs, or as many as the
    mini-batch and rank layout allow (`StepSettings.trainable`; at least one group per rank, filled
    with uninformative ones if need be) with the shortfall logged. Every rank generates its usual
    positions of each generation batch; the chosen groups are then exchanged so that each rank holds
    its positions of the step's batch. Sampling is keyed by (seed, step, generation batch, position),
    and the prompt sampler advances by every batch taken, so a resumed run repeats the step exactly."""
    how, dist = run.step, run.dist
    n, f = how.group_size, how.filter
    mine = how.positions(dist.rank, dist.world)
    held: dict[tuple[int, int], dict] = {}  # (generation batch, position) -> this rank's group
    informative: list[tuple[int, int]] = []  # every rank's informative groups, in order
    generated: list[tuple[int, int]] = []
    errors, b = 0, 0
    epoch = -(-len(run.train) // how.prompts_per_step)  # generation batches that take every prompt once
    while True:
        batch_prompts = [run.train[i] for i in run.sampler.take(how.prompts_per_step)]
        prompts = [batch_prompts[i] for i in mine]
        rollout, texts = generate(run, prompts, mine, how.sampling_at(step, b), timer)
        with timer("reward"):
            fields = [reward_fields(p) for p in prompts for _ in range(n)]
            rewards, trained_on = shape_rewards(how.shaping, run.scorer(texts, fields), rollout, n, run.scorer.weights)
        errors += rewards.errors
        metric = trained_on if f.metric == "reward" else [0.0 if v is None else v for v in rewards.per_rule[f.metric]]
        good = informative_groups(torch.tensor(metric, dtype=torch.float64), n).tolist()
        for part in dist.gather([(pos, bool(g)) for pos, g in zip(mine, good)]):
            generated += [(b, pos) for pos, _ in part]
            informative += [(b, pos) for pos, g in part if g]
        for j, pos in enumerate(mine):
            rows = list(range(j * n, (j + 1) * n))
            held[(b, pos)] = {"prompt": prompts[j], "rollout": take_rows(rollout, rows), "texts": texts[j * n:(j + 1) * n],
                              "totals": rewards.totals[j * n:(j + 1) * n], "trained_on": trained_on[j * n:(j + 1) * n],
                              "per_rule": {k: v[j * n:(j + 1) * n] for k, v in rewards.per_rule.items()}}
        b += 1
        if len(informative) >= how.prompts_per_step or (f.max_gen_batches and b >= f.max_gen_batches):
            break
        if not informative and b >= epoch:  # no limit, and a whole pass over the data found no signal
            raise DataError(f"algo.filter_groups: {b} generation batches ({b * how.prompts_per_step} prompts, every "
                            f"training prompt at least once) found no group whose {f.metric} differs between its "
                            f"rollout.n={n} samples, so every group would have zero advantage. Check the metric "
                            f"(algo.filter_groups.metric) and the rules, or set algo.filter_groups.max_num_gen_batches "
                            f"to train on what there is.")
    informative.sort()
    groups = how.trainable(len(informative), dist.world)
    chosen = (informative + sorted(set(generated) - set(informative)))[:groups]
    step_how = how if groups == how.prompts_per_step else how.fewer_groups(groups, dist.world)
    wanted = [chosen[k] for k in step_how.positions(dist.rank, dist.world)]
    pool: dict[tuple[int, int], dict] = {}
    for part in dist.gather({key: held[key] for key in chosen if key in held}):
        pool.update(part)
    parts = [pool[key] for key in wanted]
    joined = restore(concat_rollouts([p["rollout"] for p in parts], run.pad_id), rollout)
    result = RewardResult([x for p in parts for x in p["totals"]],
                          {k: [x for p in parts for x in p["per_rule"][k]] for k in parts[0]["per_rule"]},
                          errors)  # reward/errors: every generation batch's, kept or not
    trained_on = [x for p in parts for x in p["trained_on"]]
    stats = {"filter/gen_batches": float(b), "filter/informative_groups": float(len(informative)),
             "filter/kept_groups": float(groups), "filter/shortfall": float(how.prompts_per_step - groups)}
    return Sampled(step_how, [p["prompt"] for p in parts], joined, [t for p in parts for t in p["texts"]],
                   lambda: (result, trained_on), stats)


def take_rows(r: Rollout, rows: list[int]) -> Rollout:
    """Rows ``rows`` of a rollout, on the host and compact (int32 ids, bool masks: to be exchanged
    between ranks), trimmed of all-pad columns; `restore` makes it a training rollout again."""
    idx = torch.as_tensor(rows, dtype=torch.long, device=r.response_ids.device)
    pm, rm = r.prompt_mask[idx], r.response_mask[idx]
    p, w = int(pm.sum(-1).max()), max(int(rm.sum(-1).max()), 1)
    return Rollout(r.prompt_ids[idx][:, -p:].int().cpu(), pm[:, -p:].bool().cpu(), r.response_ids[idx][:, :w].int().cpu(),
                   rm[:, :w].bool().cpu(), r.loss_mask[idx][:, :w].bool().cpu(), r.stopped[idx].cpu(),
                   None if r.sample_logprobs is None else r.sample_logprobs[idx][:, :w].cpu())


def restore(r: Rollout, like: Rollout) -> Rollout:
    """A rollout made of `take_rows` pieces, with ``like``'s dtypes on ``like``'s device."""
    device = like.response_ids.device
    return Rollout(r.prompt_ids.to(device, like.prompt_ids.dtype), r.prompt_mask.to(device, like.prompt_mask.dtype),
                   r.response_ids.to(device, like.response_ids.dtype),
                   r.response_mask.to(device, like.response_mask.dtype), r.loss_mask.to(device, like.loss_mask.dtype),
                   r.stopped.to(device),
                   None if r.sample_logprobs is None else r.sample_logprobs.to(device, torch.float32))


def shape_rewards(shaping: RewardShaping, raw: RewardResult, rollout: Rollout, group_size: int,
                  weights: dict[str, float]) -> tuple[RewardResult, list[float]]:
    """(the rewards to log and dump, the rewards the advantages are computed from). Both add DAPO's
    overlong penalty, logged as the rule ``overlong``, to the weighted sum of the rules. With
    ``normalize_then_sum`` (GDPO) the second is instead the weighted sum of each rule's scores
    normalised within the group (plus the penalty): that sum is 0 on average in every group, so the
    logs keep the plain weighted sum, which says how well the policy does."""
    totals, per_rule = list(raw.totals), dict(raw.per_rule)
    trained_on = None  # None: the same as totals
    if shaping.aggregate == "normalize_then_sum":
        scores = {k: torch.tensor([float("nan") if x is None else x for x in v], dtype=torch.float64)
                  for k, v in per_rule.items()}
        trained_on = normalize_then_sum(scores, weights, group_size).tolist()
    if shaping.overlong is not None:
        max_len, buffer, factor = shaping.overlong
        penalty = overlong_penalty(rollout.response_lengths.cpu(), max_len, buffer, factor).tolist()
        per_rule["overlong"] = penalty
        totals = [t + p for t, p in zip(totals, penalty)]
        trained_on = None if trained_on is None else [t + p for t, p in zip(trained_on, penalty)]
    return RewardResult(totals, per_rule, raw.errors), list(totals if trained_on is None else trained_on)


def global_advantages(how: StepSettings, dist: Dist, scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """This rank's advantages, computed over the GLOBAL batch (batch scaling and whitening see every
    rank's rewards): the ranks' scores and response lengths are gathered into batch order (a few
    numbers per response), the estimator runs on them, and this rank takes its rows."""
    n = how.group_size
    total = how.prompts_per_step * n
    g_scores, g_lengths = torch.zeros(total), torch.zeros(total)
    for rank, (s, l) in enumerate(dist.gather((scores.tolist(), lengths.tolist()))):
        for j, pos in enumerate(how.positions(rank, dist.world)):
            g_scores[pos * n:(pos + 1) * n] = torch.tensor(s[j * n:(j + 1) * n])
            g_lengths[pos * n:(pos + 1) * n] = torch.tensor(l[j * n:(j + 1) * n], dtype=torch.float32)
    adv = how.advantages(g_scores, lengths=g_lengths)
    return torch.cat([adv[pos * n:(pos + 1) * n] for pos in how.positions(dist.rank, dist.world)])


def in_batch_order(parts: list[list[dict]], how: StepSettings, world: int) -> list[dict]:
    """Every rank's records (``rollout.n`` per prompt, in its own order) in the global batch's order."""
    at: dict[int, list[dict]] = {}
    for rank, part in enumerate(parts):
        for j, position in enumerate(how.positions(rank, world)):
            at[position] = part[j * how.group_size:(j + 1) * how.group_size]
    return [r for position in sorted(at) for r in at[position]]


def decoding_weights(run: Run):
    """Whole weights while an engine that reads the live model decodes (a sharded model is gathered
    once, resharded after); an engine with its own copy (vLLM, fed by `sync_weights`) or a dump
    (replay) needs nothing."""
    return full_weights(run.model) if run.engine.reads_live_model else contextlib.nullcontext()


@contextlib.contextmanager
def recording(run: Run, step: int) -> Iterator[None]:
    """trainer.dump_activations: the block's forwards and backwards recorded at the listed steps, saved
    per rank (`verirl.train.record`)."""
    a = run.step.activations
    if a is None or step not in a.steps:
        yield
        return
    from verirl.train.record import ActivationRecorder, dump_path

    with ActivationRecorder(run.model, a.modules, a.backward) as recorder:
        yield
    recorder.save(dump_path(a.dir, step, run.dist.rank),
                  {**a.meta, "step": step, "rank": run.dist.rank, "world_size": run.dist.world})


def logprob_check(rollout: Rollout, trainer_logp, dist: Dist) -> dict[str, float]:
    """``rollout/logprob_diff/mean`` and ``/max``: |log p under the engine - log p under the trainer|
    over the global batch's sampled response tokens (the loss mask), both of the distribution each token was sampled from
    (after temperature), for engines that return their log-probs (vLLM). A weight push that did not
    happen shows at once (the importance ratio engine / trainer is then far from 1)."""
    if rollout.sample_logprobs is None or trainer_logp is None:
        return {}
    mask = rollout.loss_mask.float()
    width = min(rollout.sample_logprobs.shape[1], trainer_logp.shape[1], mask.shape[1])
    diff = (rollout.sample_logprobs[:, :width].float() - trainer_logp[:, :width].float()).abs() * mask[:, :width]
    total, count = dist.all_sum([float(diff.sum()), float(mask[:, :width].sum())])
    return {"rollout/logprob_diff/mean": total / max(count, 1.0),
            "rollout/logprob_diff/max": dist.all_max([float(diff.max()) if diff.numel() else 0.0])[0]}


QUANTILE_SAMPLE = 65536  # ratios behind mismatch/ratio_p*: an evenly spaced sample of each rank's sorted ones


def mismatch_metrics(rollout: Rollout, trainer_logp, correction: Optional[Correction], dist: Dist) -> dict[str, float]:
    """The train/inference mismatch guard's view of the global batch, from the same pair of log-probs as
    ``rollout/logprob_diff/*``: ``mismatch/kl`` (k3 estimate of KL(rollout engine || trainer) per
    token), ``mismatch/ratio_p05 / p50 / p95`` (the token ratio trainer / engine probability) and
    ``mismatch/masked_frac`` (the tokens the guard's rejection zeroes). None for engines without
    log-probs. The quantiles are exact up to 65536 response tokens in all (at least 256 per rank),
    else over an evenly spaced sample of each rank's sorted ratios."""
    if rollout.sample_logprobs is None or trainer_logp is None:
        return {}
    width = min(rollout.sample_logprobs.shape[1], trainer_logp.shape[1], rollout.loss_mask.shape[1])
    mask = rollout.loss_mask[:, :width].float()
    engine, trainer = rollout.sample_logprobs[:, :width].float(), trainer_logp[:, :width].float()
    kl = kl_penalty(engine, trainer, "low_var_kl") * mask  # exp(t - e) - (t - e) - 1 >= 0
    rejected = torch.zeros_like(mask)
    if correction is not None:
        rejected = correction.apply(trainer, engine, mask)[1].float() * mask
    kl_sum, tokens, masked = dist.all_sum([float(kl.sum()), float(mask.sum()), float(rejected.sum())])
    ratios = torch.exp((trainer - engine).clamp(-20, 20))[mask.bool()].sort().values
    keep = max(QUANTILE_SAMPLE // dist.world, 256)
    if ratios.numel() > keep:
        ratios = ratios[torch.linspace(0, ratios.numel() - 1, keep).round().long()]
    every = torch.tensor([x for part in dist.gather(ratios.cpu().tolist()) for x in part], dtype=torch.float64)
    out = {"mismatch/kl": kl_sum / max(tokens, 1.0), "mismatch/masked_frac": masked / max(tokens, 1.0)}
    if every.numel():
        q = torch.quantile(every, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
        out.update({"mismatch/ratio_p05": q[0], "mismatch/ratio_p50": q[1], "mismatch/ratio_p95": q[2]})
    return out


def reward_fields(p: Prompt) -> dict:
    """What a reward rule sees of a prompt besides the response: its extra keys, label and task."""
    return {**p.extra, "label": p.label, "task": p.task}


@dataclass
class StepData:
    """What a rank's step produced, for the metrics of the global batch."""
    tasks: list[str]  # (N,) each response's task
    sources: list  # (N,) each response's data_source (None: its prompt has none)
    rewards: RewardResult
    scores: torch.Tensor  # (N,) weighted rewards
    advantages: torch.Tensor  # (N,)
    rollout: Rollout
    entropy: Optional[torch.Tensor] = None  # (N,) each response's summed token entropy under the policy

    def plain(self) -> dict:
        r = self.rollout
        return {"entropy": [] if self.entropy is None else self.entropy.tolist(), "tasks": self.tasks, "sources": [None if s is None else str(s) for s in self.sources], "totals": self.rewards.totals, "per_rule": self.rewards.per_rule,
                "errors": self.rewards.errors, "scores": self.scores.tolist(), "advantages": self.advantages.tolist(),
                "response_lengths": r.response_lengths.tolist(), "loss_lengths": r.loss_lengths.tolist(),
                "prompt_lengths": r.prompt_lengths.tolist(),
                "stopped": r.stopped.tolist()}


def step_metrics(step: int, how: StepSettings, dist: Dist, local: StepData, actor_stats: dict[str, float],
                 timer: Timer) -> dict[str, float]:
    """The step's line in metrics.jsonl, over the GLOBAL batch (every rank's responses, in rank order):
    rewards (overall, per rule, per task), advantages, lengths, the update's statistics (already
    global), rank 0's phase times with ``timing/all_max`` over the ranks, and throughput."""
    parts = dist.gather(local.plain())
    cat = lambda key: [x for part in parts for x in part[key]]  # noqa: E731
    rewards = RewardResult(cat("totals"), {rule: [x for part in parts for x in part["per_rule"][rule]]
                                           for rule in parts[0]["per_rule"]}, sum(part["errors"] for part in parts))
    m: dict[str, float] = {"step": step}
    m.update(rewards.metrics(cat("tasks"), cat("sources")))
    m.update(advantage_metrics(torch.tensor(cat("advantages")), torch.tensor(cat("scores")), how.group_size))
    m.update(length_metrics(torch.tensor(cat("response_lengths")), torch.tensor(cat("prompt_lengths")),
                            torch.tensor(cat("stopped"))))
    m.update(entropy_metrics(cat("entropy"), cat("loss_lengths"), cat("tasks"), cat("sources")))
    m.update(actor_stats)
    m.update(timer.metrics(PHASES))
    if dist.active:
        m["timing/all_max"] = dist.all_max([m["timing/all"]])[0]
    for key, phase in (("perf/tps", "all"), ("perf/tps_rollout", "rollout"), ("perf/tps_update", "update")):
        m[key] = throughput(m["prompt_length/mean"], m["response_length/mean"], how.prompts_per_step,
                            how.group_size, dist.world, m[f"timing/{phase}"])
    if how.flops is not None and how.peak_flops > 0:
        flops = step_flops(how.flops, cat("prompt_lengths"), cat("response_lengths"), how.group_size,
                           (how.old_pass is not None) + (how.ref_pass is not None), how.update.epochs,
                           how.update.forward.prompt_once)
        m["perf/mfu"] = mfu(sum(flops.values()), m["timing/all"], dist.world, how.peak_flops)
    m["perf/peak_memory_gb"] = m.get("perf/max_memory_allocated_gb", m.get("perf/max_rss_gb", 0.0))
    return m


def entropy_metrics(entropy: list[float], lengths: list[int], tasks: list[str], sources: list) -> dict[str, float]:
    """``actor/entropy/task/<task>`` and ``actor/entropy/data_source/<source>``: the policy's mean token
    entropy over each split's responses (at the update's first forward, over the loss mask: ``lengths``
    counts those tokens), next to ``actor/entropy``."""
    if not entropy:
        return {}
    out = {}
    for kind, keys in (("task", tasks), ("data_source", sources)):
        for key in sorted({k for k in keys if k}):
            rows = [i for i, k in enumerate(keys) if k == key]
            out[f"actor/entropy/{kind}/{key}"] = sum(entropy[i] for i in rows) / max(sum(lengths[i] for i in rows), 1)
    return out


def rollout_records(step: int, tokenizer, per_response: list[Prompt], texts: list[str], rollout: Rollout,
                    rewards: RewardResult) -> list[dict]:
    """One RUN_DIR/rollouts.jsonl record per response: prompt, response, label, each rule's score, and
    the token ids (``prompt_ids``, ``response_ids``: what `rollout.engine=replay` replays exactly;
    decoded text does not always re-encode to the same ids)."""
    lengths = rollout.response_lengths.tolist()
    return [{"step": step, "prompt": tokenizer.decode(p.ids), "response": text, "label": p.label, "task": p.task,
             "scores": {rule: scores[i] for rule, scores in rewards.per_rule.items()},
             "reward": rewards.totals[i], "response_length": lengths[i], "stopped": bool(rollout.stopped[i]),
             "prompt_ids": list(p.ids), "response_ids": rollout.response_ids[i, :lengths[i]].tolist()}
            for i, (p, text) in enumerate(zip(per_response, texts))]
