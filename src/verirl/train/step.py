"""One GRPO step, read top to bottom as the picture in docs/design.md:

    prompts -> rollout -> rewards (scored while the passes run) -> old / ref log-probs
            -> group advantages -> policy update -> weight push -> metrics

A step is a producer and a consumer with nothing between them but the batch record (`StepBatch`)
and a weight version. `produce` samples this rank's prompts and their rollouts and submits the
rewards to the scoring workers; `consume` runs the old and reference log-prob passes (the scoring
finishes meanwhile), awaits the rewards, computes the advantages, updates the policy and pushes the
weights to the engine. The reference model is the consumer's alone.

The step reads no config: `verirl.train.build` turned it into the `Run` it is given. With
several ranks each takes whole groups of the step's prompts, the update sums the gradients over
the ranks, and the advantages and metrics are those of the global batch. With
``algo.filter_groups`` the producer repeats its rollout until the step has enough groups whose
rewards differ (`dynamic_sampling`, which awaits the rewards to choose them); otherwise there is
one rollout per step. Rewards are outcome rewards (one scalar per response).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch

from verirl.core.algo import (distill_advantages, informative_groups, kl_penalty, normalize_then_sum, overlong_penalty,
                              reverse_kl)
from verirl.core.errors import ConfigError, DataError
from verirl.train.evaluate import decode_responses, reward_fields
from verirl.train.step_metrics import ResponseStats, Timer, step_metrics
from verirl.models.lora import adapters_off
from verirl.models.moe import moe_blocks, routing
from verirl.models.router_tap import RouterTap
from verirl.rewards import RewardResult
from verirl.rollout import concat_rollouts, generate_chunked
from verirl.train.update import Correction, compute_logprobs, update_policy
from verirl.train.build import Run
from verirl.train.settings import RewardShaping, StepSettings
from verirl.train.distributed import Dist, on_rank0
from verirl.train.packing import PackCache
from verirl.train.pipelined import whole_model
from verirl.train.strategy import full_state_dict, full_weights, memory_metrics
from verirl.core.types import Prompt, Rollout, TrainBatch


def train_step(run: Run, step: int) -> tuple[dict[str, float], list[dict]]:
    """One GRPO step: the producer's batch, consumed at once (the weights that sample step ``step``
    are those after step - 1 updates). Returns (metrics of the global batch, one record per response
    of the global batch when the run dumps rollouts; on every rank)."""
    timer = Timer(run.watchdog)
    with timer("all"):
        if run.step.separate:
            batch = received(run, step, timer)
        else:
            batch = produce(run, step, timer, weight_version=step - 1)
        trained = consume(run, batch, timer)
        if run.step.separate:
            batch.stats["async/weight_sync_s"] = publish_weights(run, step, timer)  # version = updates done
    stats = update_metrics(run, batch, trained)
    metrics = step_metrics(batch.step, batch.settings, run.dist, response_stats(batch, trained), stats, timer)
    return metrics, step_records(run, batch, trained)


@dataclass(frozen=True)
class ShapedRewards:
    """Each response's rewards, in two kinds (`shape_rewards`)."""
    logged: RewardResult  # each rule's score and their weighted total: what the logs and rollouts.jsonl show
    for_advantages: list[float]  # (N,) what the advantages are computed from

    def rows(self, start: int, stop: int) -> "ShapedRewards":
        """Responses ``start`` to ``stop`` (their scoring errors not counted)."""
        return ShapedRewards(self.logged.rows(start, stop), self.for_advantages[start:stop])

    @staticmethod
    def join(parts: list["ShapedRewards"], errors: int, counts: Optional[dict[str, float]] = None) -> "ShapedRewards":
        """``parts`` one after the other, with ``errors`` scoring errors and the services' ``counts`` in all."""
        logged = RewardResult.concat([p.logged for p in parts], errors)
        logged.counts = dict(counts or {})
        return ShapedRewards(logged, [x for p in parts for x in p.for_advantages])


@dataclass
class StepBatch:
    """What the producer hands the consumer: this rank's part of one step's batch."""
    step: int
    settings: StepSettings  # the step's settings (fewer groups when a filtered step ran short)
    prompts: list[Prompt]  # this rank's, one per group
    rollout: Rollout
    texts: list[str]  # (N,) the decoded responses
    rewards: Callable[[], ShapedRewards]  # waits for the scoring workers (at once when they are done)
    weight_version: int  # the policy updates the sampling weights include
    stats: dict[str, float]  # filter/* of a filtered step
    episodes: list[dict] = field(default_factory=list)  # (N,) multi-turn: what each episode did (`episode_info`)
    # (N,) an asynchronous run's: each response's [[weights version, tokens], ...] in token order (empty: every
    # token of ``weight_version``)
    versions: list[list[list[int]]] = field(default_factory=list)

    @property
    def per_response(self) -> list[Prompt]:
        """(N,) each response's prompt."""
        return [p for p in self.prompts for _ in range(self.settings.group_size)]


@dataclass
class Trained:
    """What the consumer made of a batch."""
    rewards: ShapedRewards
    advantage_rewards: torch.Tensor  # (N,) float32: ``rewards.for_advantages``, as the advantages saw them
    advantages: torch.Tensor  # (N,)
    trainer_logp: Optional[torch.Tensor]  # (N, R) the trainer's log-probs of the rollout (old pass or on-policy)
    entropy: torch.Tensor  # (N,) each response's token entropy summed over its loss mask
    update: dict[str, float]  # the update's actor/* statistics (of the global batch)
    pushed: dict[str, float]  # the weight push's check (`Engine.sync_weights`), this rank's
    weight_version: int  # the policy updates the trainer's weights now include (the step's number)


def produce(run: Run, step: int, timer: Timer, weight_version: int) -> StepBatch:
    """The producer's half of ``step``: this rank's prompts, their rollouts, and their rewards submitted
    to the scoring workers. ``weight_version``: the policy updates the engine's weights include."""
    settings, dist = run.step, run.dist
    if settings.filter is not None:
        return dynamic_sampling(run, step, timer, weight_version)
    batch_prompts = [run.train[i] for i in run.sampler.take(settings.prompts_per_step)]  # the same on every rank
    mine = settings.positions(dist.dp_rank, dist.dp_world)  # this rank's whole groups
    prompts = [batch_prompts[i] for i in mine]
    rollout, texts, episodes = generate(run, prompts, mine, settings.sampling_at(step), timer)
    with timer("reward"):  # scoring runs in the reward workers during the log-prob passes
        scores = score(run, texts, [reward_fields(p) for p in prompts for _ in range(settings.group_size)])
    return StepBatch(step, settings, prompts, rollout, texts,
                     lambda: shape_rewards(settings.shaping, with_env_rewards(scores(), episodes), rollout,
                                           settings.group_size, run.scorer.weights), weight_version, {}, episodes)


def received(run: Run, step: int, timer: Timer) -> StepBatch:
    """An asynchronous run's batch of ``step`` (`verirl.train.async_source`): waited for on rank 0, sent to
    every trainer rank, each keeping its positions' groups; the producer's phase times count as this
    step's rollout and reward times, and async/* says how it waited and how old its samples are."""
    dist, settings = run.dist, run.step
    with timer("wait_rollout"):  # rank 0 waits on its producers, the other ranks on rank 0 (in short waits)
        produced, waits = on_rank0(dist, lambda wait_s: run.source.batch(step, wait_s))
    run.sampler.load_state_dict({**run.sampler.state_dict(), "position": produced.position})  # checkpoints say it
    for phase in ("rollout", "reward", "tools"):
        if phase in produced.seconds:
            timer.add(phase, produced.seconds[phase])
    groups = produced.groups
    step_settings = settings if groups == settings.prompts_per_step else settings.fewer_groups(groups, dist.dp_world)
    n = settings.group_size
    mine = step_settings.positions(dist.dp_rank, dist.dp_world) if dist.dp_world > 1 else list(range(groups))
    rows = [j * n + i for j in mine for i in range(n)]
    device = next(run.model.parameters()).device
    rollout = produced.rollout
    if dist.dp_world > 1:
        rollout = as_training_rollout(take_rows(rollout, rows), rollout)
    rewards = produced.logged
    if dist.dp_world > 1:
        errors = rewards.logged.errors if dist.dp_rank == 0 else 0  # counted once over the ranks
        rewards = ShapedRewards.join([rewards.rows(j * n, (j + 1) * n) for j in mine], errors,
                                     rewards.logged.counts if dist.dp_rank == 0 else {})
    versions = [produced.versions[i] for i in rows]
    oldest = [min(v for v, _ in runs) if runs else step - 1 for runs in versions]
    stale = [float(step - 1 - v) for v in oldest]
    total, count = dist.all_sum([sum(stale), float(len(stale))])
    stats = {**produced.stats, **waits, "async/staleness_mean": total / max(count, 1.0),
             "async/staleness_max": dist.all_max([max(stale, default=0.0)])[0]}
    return StepBatch(step, step_settings, [produced.prompts[j] for j in mine], _on(rollout, device),
                     [produced.texts[i] for i in rows], lambda: rewards, min(oldest, default=step - 1), stats,
                     [produced.episodes[i] for i in rows] if produced.episodes else [], versions)


def publish_weights(run: Run, version: int, timer: Timer) -> float:
    """Hand the trainer's weights after ``version`` updates to the producers (every trainer rank takes
    part: a sharded model is gathered); -> the seconds the copy into shared memory took (rank 0's)."""
    if version % run.step.sync_every and version != run.total_steps:
        return 0.0  # not due: nothing gathered
    with timer("weight_sync"), whole_model(run.model):
        weights = full_state_dict(run.model)
        seconds = run.source.publish(version, weights) if run.source is not None else 0.0
    return run.dist.all_max([seconds])[0] if run.dist.active else seconds


def with_env_rewards(raw: RewardResult, episodes: list[dict]) -> RewardResult:
    """A multi-turn step's rewards: the rules' score of each final answer plus what its environment
    returned (rollout.multi_turn.reward: their sum or the last), logged as the rule ``env``."""
    if not episodes:
        return raw
    env = [e["env_reward"] for e in episodes]
    return RewardResult([t + r for t, r in zip(raw.totals, env)], {**raw.per_rule, "env": env}, raw.errors, raw.counts)


def score(run: Run, texts: list[str], fields: list[dict]) -> Callable[[], RewardResult]:
    """Start scoring this rank's responses; -> a call that waits for the scores. The ranks of one
    data-parallel coordinate (its pp x sp x tp ranks) hold the same responses: each scores a contiguous
    share of their groups, and the shares are exchanged when the scores are awaited, so every response
    is scored once and all of them see the same score (a rule's deadline is a wall-clock one: two ranks
    scoring the same response could disagree)."""
    me, shares = run.dist.decoders(False)
    if shares == 1:
        return run.scorer.submit(texts, fields).result
    n = run.step.group_size
    groups = len(texts) // n
    part = slice(groups * me // shares * n, groups * (me + 1) // shares * n)
    pending = run.scorer.submit(texts[part], fields[part])

    def result() -> RewardResult:
        return RewardResult.concat(run.dist.decoders_gather(pending.result(), False))
    return result


@contextlib.contextmanager
def reference_model(run: Run) -> Iterator[torch.nn.Module]:
    """The reference policy: its own copy, or (LoRA) the actor itself with its adapters off."""
    if run.ref is not None:
        yield run.ref
        return
    with adapters_off(run.model):
        yield run.model


def consume(run: Run, batch: StepBatch, timer: Timer) -> Trained:
    """The consumer's half of a step: the old and reference log-prob passes (the scoring finishes
    meanwhile), the rewards awaited and the advantages of the global batch computed, the policy update
    and the weight push.

    A mixture-of-experts model's passes run inside a `RouterTap` (algo.router_replay): R3 routes the old pass
    and the update by the engine's recorded experts (``Rollout.routed_experts``); R2 records the old pass's own
    routes and routes the update by them (no old pass, on-policy: nothing to reuse, the update routes by its
    router); off routes by the router. The reference pass always routes by its own router: the reference
    policy is the model it is, its routing included, and its KL term does not depend on the rollout engine.
    The update's tap gives the moe/* metrics, compared with the routes it was given (R2: the old pass's;
    otherwise the engine's)."""
    settings, dist, rollout = batch.settings, run.dist, batch.rollout
    layouts = PackCache(rollout)  # the passes below pack the same rows: lay them out once
    old_logprobs = ref_logprobs = teacher_logprobs = None
    replay, aux_coef = settings.router_replay, settings.moe_aux_loss_coef
    engine_routes, store = rollout.routed_experts, None
    if replay == "r3" and engine_routes is None:
        raise ConfigError("algo.router_replay=R3: the rollout engine recorded no routed experts for this batch "
                          "(rollout.engine=native records them, multi-turn episodes do not); set "
                          "algo.router_replay=R2 (the trainer's own routing of the old-log-prob pass) or off.")
    if settings.old_pass is not None:
        with timer("old_log_prob"):
            tap = contextlib.nullcontext()
            if replay == "r3":
                tap = RouterTap(run.model, engine_routes, replay=True)
            elif replay == "r2":
                N, cols = rollout.response_ids.shape[0], rollout.prompt_ids.shape[1] + rollout.response_ids.shape[1]
                layers, k = len(moe_blocks(run.model)), routing(run.model.config).top_k
                store = torch.full((N, cols, layers, k), -1, dtype=torch.int16, device=rollout.response_ids.device)
                tap = RouterTap(run.model, store=store)
            with tap:
                old_logprobs = compute_logprobs(run.model, rollout, settings.old_pass, layouts, dist)
    if settings.ref_pass is not None:
        with timer("ref"), reference_model(run) as ref:
            ref_logprobs = compute_logprobs(ref, rollout, settings.ref_pass, layouts, dist)
    if settings.distill is not None:
        with timer("teacher"):
            teacher_logprobs = compute_logprobs(run.teacher, rollout, settings.distill.teacher_pass, layouts, dist)
    with timer("reward"):  # what is left of the scoring once the passes are done
        rewards = batch.rewards()
        advantage_rewards = torch.tensor(rewards.for_advantages, dtype=torch.float32)
        advantages = global_advantages(settings, dist, advantage_rewards, rollout.response_lengths.cpu())
        advantages = advantages.to(rollout.response_ids.device)
    trained_advantages, distilled = advantages, {}  # (N,), or (N, R) per token with a teacher
    if teacher_logprobs is not None:
        trained_advantages, advantages, distilled = distillation(settings.distill, advantages, old_logprobs,
                                                                 teacher_logprobs, rollout, dist)
    trainer_logp = old_logprobs if old_logprobs is not None or rollout.sample_logprobs is None else \
        torch.zeros_like(rollout.sample_logprobs)  # on-policy: filled by the update with its own
    entropy = torch.zeros(rollout.response_ids.shape[0], dtype=torch.float32, device=rollout.response_ids.device)
    update_params, tap = settings.update, contextlib.nullcontext()
    if replay:
        routes = store if store is not None else engine_routes
        tap = RouterTap(run.model, routes, replay=replay != "off" and routes is not None, keep_logits=aux_coef > 0)
        update_params = dataclasses.replace(update_params, moe_aux_loss_coef=aux_coef)
    with timer("update"), recording(run, batch.step), tap:
        update = update_policy(run.model, run.optimizer, run.scheduler,
                               TrainBatch(rollout, trained_advantages, old_logprobs, ref_logprobs), update_params,
                               layouts, dist, on_policy_out=trainer_logp, entropy_out=entropy)
        update.update(distilled)
    if replay:
        update.update(tap.metrics(dist.all_sum))
    with timer("sync_weights"):  # an engine with its own copy of the weights (vLLM) gets the new ones
        pushed = run.engine.sync_weights(run.model) or {}
    return Trained(rewards, advantage_rewards, advantages, trainer_logp, entropy, update, pushed,
                   batch.step)


def distillation(d, advantages: torch.Tensor, student: torch.Tensor, teacher: torch.Tensor, rollout: Rollout,
                 dist: Dist) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """On-policy distillation's advantages (`verirl.core.algo.distill`): (N, R) per token, the teacher's
    log-prob less the student's on each trained token (times algo.distill.coef), plus the rules' group
    advantage when algo.distill.rewards; also (N,) each response's mean token advantage (what adv/* logs) and
    ``distill/*``: the reverse KL and the teacher's log-prob, token means over the global batch."""
    mask = rollout.loss_mask
    per_token = distill_advantages(student, teacher, mask, d.coef, advantages if d.rewards else None)
    m = mask.float()
    kl, teacher_sum, tokens = dist.all_sum([float((reverse_kl(student, teacher) * m).sum()),
                                            float((teacher.float() * m).sum()), float(m.sum())])
    per_response = per_token.sum(-1) / m.sum(-1).clamp(min=1.0)
    return per_token, per_response, {"distill/reverse_kl": kl / max(tokens, 1.0),
                                     "distill/teacher_logp": teacher_sum / max(tokens, 1.0)}


def update_metrics(run: Run, batch: StepBatch, trained: Trained) -> dict[str, float]:
    """The step's statistics besides the rewards, advantages and lengths, over the global batch: the
    update's, the weight push's, memory, the engine-vs-trainer log-prob checks, and filter/*."""
    dist, rollout = run.dist, batch.rollout
    stats = dict(trained.update)
    stats.update({k: dist.all_max([v])[0] for k, v in trained.pushed.items()})
    stats.update(memory_metrics(run.model, run.optimizer, run.ref, dist))
    stats.update(logprob_check(rollout, trained.trainer_logp, dist))
    stats.update(mismatch_metrics(rollout, trained.trainer_logp, batch.settings.update.correction, dist))
    stats.update(batch.stats)
    stats.update(episode_metrics(batch.episodes, rollout, dist))
    return stats


def episode_metrics(episodes: list[dict], rollout: Rollout, dist: Dist) -> dict[str, float]:
    """A multi-turn step's turns and tool counts over the global batch: ``turns/mean`` and ``/max``,
    ``tools/calls_mean`` (per episode), ``tools/errors``, ``tools/parse_errors``, ``tools/timeouts``
    (counts), and the tokens the model sampled against all response tokens (observations included)."""
    if not episodes:
        return {}
    c = lambda key: float(sum(e["counts"].get(key, 0.0) for e in episodes))  # noqa: E731
    turns, n, calls, errors, parse, timeouts, model, total = dist.all_sum([
        float(sum(e["turns"] for e in episodes)), float(len(episodes)), c("tool_calls"), c("tool_errors"),
        c("parse_errors"), c("tool_timeouts"), float(rollout.loss_lengths.sum()), float(rollout.response_lengths.sum())])
    return {"turns/mean": turns / max(n, 1.0), "turns/max": dist.all_max([float(max(e["turns"] for e in episodes))])[0],
            "tools/calls_mean": calls / max(n, 1.0), "tools/errors": errors, "tools/parse_errors": parse,
            "tools/timeouts": timeouts, "response_length/model_tokens": model / max(n, 1.0),
            "response_length/total": total / max(n, 1.0)}


def response_stats(batch: StepBatch, trained: Trained) -> ResponseStats:
    """This rank's responses as plain lists, for the metrics of the global batch."""
    r, per_response, logged = batch.rollout, batch.per_response, trained.rewards.logged
    return ResponseStats([p.task for p in per_response],
                         [None if s is None else str(s) for s in (p.extra.get("data_source") for p in per_response)],
                         logged, trained.advantage_rewards.tolist(), trained.advantages.cpu().tolist(),
                         r.response_lengths.tolist(), r.loss_lengths.tolist(), r.prompt_lengths.tolist(),
                         r.stopped.tolist(), trained.entropy.cpu().tolist())


def step_records(run: Run, batch: StepBatch, trained: Trained) -> list[dict]:
    """The global batch's rollouts.jsonl records, in batch order, when the run dumps rollouts (else none)."""
    if not batch.settings.dump_rollouts:
        return []
    records = rollout_records(batch.step, run.tokenizer, batch.per_response, batch.texts, batch.rollout,
                              trained.rewards.logged, batch.episodes, batch.versions, batch.weight_version)
    return in_batch_order(run.dist.gather(records), batch.settings, run.dist.dp_world) if records else []


def generate(run: Run, prompts: list[Prompt], positions: list[int], sampling,
             timer: Timer) -> tuple[Rollout, list[str], list[dict]]:
    """``rollout.n`` responses to each prompt (at ``positions`` of the global batch), the text the rules
    score (a multi-turn episode's last turn) and, for multi-turn rollouts, what each episode did.
    The ranks of a tensor-parallel group hold the same prompts: each decodes a contiguous share of their
    groups with the whole weights, and the shares are exchanged, so every rank of the group holds all
    of them in order (sampling is keyed by global position: the same tokens as one rank decoding all)."""
    settings, dist = run.step, run.dist
    split = getattr(run.engine, "split", False)  # a tensor-parallel group decodes its share together
    me, shares = dist.decoders(split)
    share = slice(len(prompts) * me // shares, len(prompts) * (me + 1) // shares) if shares > 1 else slice(None)
    episodes: list[dict] = []
    with timer("rollout"), decoding_weights(run):  # whole weights, no collective inside
        if run.multi_turn is not None:
            mine, texts, episodes = multi_turn(run, prompts[share], positions[share], sampling, timer)
        else:
            mine = generate_chunked(run.engine, [p.ids for p in prompts[share]], settings.group_size, sampling,
                                    settings.generate_batch, run.pad_id, positions[share]) if prompts[share] else None
            texts = decode_responses(run.tokenizer, mine) if mine is not None else []
    if shares == 1:
        return mine, texts, episodes
    device = next(run.model.parameters()).device
    parts = [p for p in dist.decoders_gather((_on(mine, "cpu"), texts, episodes) if mine is not None else None, split)
             if p is not None]
    return (_on(concat_rollouts([r for r, _, _ in parts], run.pad_id), device), [t for _, part, _ in parts for t in part],
            [e for _, _, part in parts for e in part])


def multi_turn(run: Run, prompts: list[Prompt], positions: list[int], sampling,
               timer: Timer) -> tuple[Optional[Rollout], list[str], list[dict]]:
    """Multi-turn episodes of ``prompts`` (`verirl.rollout.multiturn`): the rollout, each episode's last
    turn (what the rules score) and what each episode did (`episode_info`)."""
    if not prompts:
        return None, [], []
    out = run.multi_turn.generate(prompts, run.step.group_size, sampling, positions)
    timer.add("tools", run.multi_turn.last_tool_seconds)
    device = next(run.model.parameters()).device
    env = out.env_rewards(run.step.env_reward)
    return _on(out.rollout, device), out.answers, [episode_info(e, r) for e, r in zip(out.episodes, env)]


def episode_info(e, env_reward: float) -> dict:
    """What one episode did, as plain values: its turns, tool counts, environment reward, and its token
    segments with their roles (rollouts.jsonl keeps them)."""
    return {"turns": e.turns, "env_turns": e.env_turns, "env_reward": float(env_reward),
            "counts": {k: float(v) for k, v in e.counts.items() if k != "tool_seconds"},  # counts only: no clock
            "segments": [list(s) for s in e.segments]}


def _on(r: Rollout, device) -> Rollout:
    """The rollout's tensors on ``device``."""
    return Rollout(*(None if t is None else t.to(device) for t in (
        r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, r.loss_mask, r.stopped, r.sample_logprobs,
        r.routed_experts)))


@dataclass
class Group:
    """One prompt's group of a filtered step's generation batch, as the ranks exchange it."""
    prompt: Prompt
    rollout: Rollout  # its rollout.n rows, compact (`take_rows`)
    texts: list[str]
    rewards: ShapedRewards
    episodes: list[dict]  # multi-turn: what each episode did (empty otherwise)


def dynamic_sampling(run: Run, step: int, timer: Timer, weight_version: int) -> StepBatch:
    """DAPO's dynamic sampling (algo.filter_groups): generation batches of ``prompts_per_step`` prompts,
    each scored at once, until the step has that many groups whose metric differs between samples (the
    others have zero advantage: no signal), or ``max_gen_batches`` ran out. The step then trains on the
    first informative groups in (generation batch, position) order: all it needs, or as many as the
    mini-batch and rank layout allow (`StepSettings.trainable`; at least one group per rank, filled
    with uninformative ones if need be) with the shortfall logged. Every rank generates its usual
    positions of each generation batch; the chosen groups are then exchanged so that each rank holds
    its positions of the step's batch. Sampling is keyed by (seed, step, generation batch, position),
    and the prompt sampler advances by every batch taken, so a resumed run repeats the step exactly."""
    settings, dist = run.step, run.dist
    n, f = settings.group_size, settings.filter
    mine = settings.positions(dist.dp_rank, dist.dp_world)
    held: dict[tuple[int, int], Group] = {}  # (generation batch, position) -> this rank's group
    informative: list[tuple[int, int]] = []  # every rank's informative groups, in order
    generated: list[tuple[int, int]] = []
    errors, b, counts = 0, 0, {}
    epoch = -(-len(run.train) // settings.prompts_per_step)  # generation batches that take every prompt once
    while True:
        batch_prompts = [run.train[i] for i in run.sampler.take(settings.prompts_per_step)]
        prompts = [batch_prompts[i] for i in mine]
        rollout, texts, episodes = generate(run, prompts, mine, settings.sampling_at(step, b), timer)
        with timer("reward"):
            fields = [reward_fields(p) for p in prompts for _ in range(n)]
            rewards = shape_rewards(settings.shaping, with_env_rewards(score(run, texts, fields)(), episodes), rollout,
                                    n, run.scorer.weights)
        errors += rewards.logged.errors
        for k, v in rewards.logged.counts.items():
            counts[k] = counts.get(k, 0.0) + v
        metric = rewards.for_advantages if f.metric == "reward" else \
            [0.0 if v is None else v for v in rewards.logged.per_rule[f.metric]]
        good = informative_groups(torch.tensor(metric, dtype=torch.float64), n).tolist()
        for part in dist.gather([(pos, bool(g)) for pos, g in zip(mine, good)]):
            generated += [(b, pos) for pos, _ in part]
            informative += [(b, pos) for pos, g in part if g]
        for j, pos in enumerate(mine):
            held[(b, pos)] = Group(prompts[j], take_rows(rollout, list(range(j * n, (j + 1) * n))),
                                   texts[j * n:(j + 1) * n], rewards.rows(j * n, (j + 1) * n),
                                   episodes[j * n:(j + 1) * n])
        b += 1
        if len(informative) >= settings.prompts_per_step or (f.max_gen_batches and b >= f.max_gen_batches):
            break
        if not informative and b >= epoch:  # no limit, and a whole pass over the data found no signal
            raise DataError(f"algo.filter_groups: {b} generation batches ({b * settings.prompts_per_step} prompts, "
                            f"every training prompt at least once) found no group whose {f.metric} differs between "
                            f"its rollout.n={n} samples, so every group would have zero advantage. Check the metric "
                            f"(algo.filter_groups.metric) and the rules, or set algo.filter_groups.max_num_gen_batches "
                            f"to train on what there is.")
    informative.sort()
    groups = settings.trainable(len(informative), dist.dp_world)
    chosen = (informative + sorted(set(generated) - set(informative)))[:groups]
    step_settings = settings if groups == settings.prompts_per_step else settings.fewer_groups(groups, dist.dp_world)
    wanted = [chosen[k] for k in step_settings.positions(dist.dp_rank, dist.dp_world)]
    pool: dict[tuple[int, int], Group] = {}
    for part in dist.gather({key: held[key] for key in chosen if key in held}):
        pool.update(part)
    parts = [pool[key] for key in wanted]
    joined = as_training_rollout(concat_rollouts([g.rollout for g in parts], run.pad_id), rollout)
    kept = ShapedRewards.join([g.rewards for g in parts], errors, counts)  # reward/errors: every generation batch's
    stats = {"filter/gen_batches": float(b), "filter/informative_groups": float(len(informative)),
             "filter/kept_groups": float(groups), "filter/shortfall": float(settings.prompts_per_step - groups)}
    return StepBatch(step, step_settings, [g.prompt for g in parts], joined, [t for g in parts for t in g.texts],
                     lambda: kept, weight_version, stats, [e for g in parts for e in g.episodes])


def take_rows(r: Rollout, rows: list[int]) -> Rollout:
    """Rows ``rows`` of a rollout, on the host and compact (int32 ids, bool masks: to be exchanged
    between ranks), trimmed of all-pad columns; `as_training_rollout` makes it a training rollout again."""
    idx = torch.as_tensor(rows, dtype=torch.long, device=r.response_ids.device)
    pm, rm = r.prompt_mask[idx], r.response_mask[idx]
    p, w = int(pm.sum(-1).max()), max(int(rm.sum(-1).max()), 1)
    P = r.prompt_ids.shape[1]
    return Rollout(r.prompt_ids[idx][:, -p:].int().cpu(), pm[:, -p:].bool().cpu(), r.response_ids[idx][:, :w].int().cpu(),
                   rm[:, :w].bool().cpu(), r.loss_mask[idx][:, :w].bool().cpu(), r.stopped[idx].cpu(),
                   None if r.sample_logprobs is None else r.sample_logprobs[idx][:, :w].cpu(),
                   None if r.routed_experts is None else r.routed_experts[idx][:, P - p:P + w].cpu())


def as_training_rollout(r: Rollout, like: Rollout) -> Rollout:
    """A rollout made of `take_rows` pieces, with ``like``'s dtypes on ``like``'s device."""
    device = like.response_ids.device
    return Rollout(r.prompt_ids.to(device, like.prompt_ids.dtype), r.prompt_mask.to(device, like.prompt_mask.dtype),
                   r.response_ids.to(device, like.response_ids.dtype),
                   r.response_mask.to(device, like.response_mask.dtype), r.loss_mask.to(device, like.loss_mask.dtype),
                   r.stopped.to(device),
                   None if r.sample_logprobs is None else r.sample_logprobs.to(device, torch.float32),
                   None if r.routed_experts is None else r.routed_experts.to(device))


def shape_rewards(shaping: RewardShaping, raw: RewardResult, rollout: Rollout, group_size: int,
                  weights: dict[str, float]) -> ShapedRewards:
    """The rewards to log and dump, and the rewards the advantages are computed from. Both add DAPO's
    overlong penalty, logged as the rule ``overlong``, to the weighted sum of the rules. With
    ``normalize_then_sum`` (GDPO) the second is instead the weighted sum of each rule's scores
    normalised within the group (plus the penalty): that sum is 0 on average in every group, so the
    logs keep the plain weighted sum, which says how well the policy does."""
    totals, per_rule = list(raw.totals), dict(raw.per_rule)
    for_advantages = None  # None: the same as totals
    if shaping.aggregate == "normalize_then_sum":
        scores = {k: torch.tensor([float("nan") if x is None else x for x in v], dtype=torch.float64)
                  for k, v in per_rule.items()}
        for_advantages = normalize_then_sum(scores, weights, group_size).tolist()
    if shaping.overlong is not None:
        max_len, buffer, factor = shaping.overlong
        penalty = overlong_penalty(rollout.response_lengths.cpu(), max_len, buffer, factor).tolist()
        per_rule["overlong"] = penalty
        totals = [t + p for t, p in zip(totals, penalty)]
        for_advantages = None if for_advantages is None else [t + p for t, p in zip(for_advantages, penalty)]
    return ShapedRewards(RewardResult(totals, per_rule, raw.errors, raw.counts),
                         list(totals if for_advantages is None else for_advantages))


def global_advantages(settings: StepSettings, dist: Dist, rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """This rank's advantages, computed over the GLOBAL batch (batch scaling and whitening see every
    rank's rewards): the ranks' rewards (those for the advantages) and response lengths are gathered
    into batch order (a few numbers per response), the estimator runs on them, and this rank takes its rows."""
    n = settings.group_size
    total = settings.prompts_per_step * n
    g_rewards, g_lengths = torch.zeros(total), torch.zeros(total)
    for rank, (r, l) in enumerate(dist.gather((rewards.tolist(), lengths.tolist()))):
        for j, pos in enumerate(settings.positions(rank, dist.dp_world)):
            g_rewards[pos * n:(pos + 1) * n] = torch.tensor(r[j * n:(j + 1) * n])
            g_lengths[pos * n:(pos + 1) * n] = torch.tensor(l[j * n:(j + 1) * n], dtype=torch.float32)
    adv = settings.advantages(g_rewards, lengths=g_lengths)
    return torch.cat([adv[pos * n:(pos + 1) * n] for pos in settings.positions(dist.dp_rank, dist.dp_world)])


def in_batch_order(parts: list[list[dict]], settings: StepSettings, world: int) -> list[dict]:
    """Every rank's records (``rollout.n`` per prompt, in its own order) in the global batch's order."""
    at: dict[int, list[dict]] = {}
    for rank, part in enumerate(parts):
        for j, position in enumerate(settings.positions(rank, world)):
            at[position] = part[j * settings.group_size:(j + 1) * settings.group_size]
    return [r for position in sorted(at) for r in at[position]]


def decoding_weights(run: Run):
    """Whole weights while an engine that reads the live model decodes (a sharded model is gathered
    once, resharded after); an engine with its own copy (vLLM, fed by `sync_weights`) or a dump
    (replay) needs nothing."""
    if not run.engine.reads_live_model:
        return contextlib.nullcontext()
    return _whole_for_decoding(run.model, getattr(run.engine, "split", False))


@contextlib.contextmanager
def _whole_for_decoding(model, split: bool) -> Iterator[None]:
    """A pipelined model's stages brought together on every rank, then FSDP2's and tensor parallelism's
    gathers (`full_weights`)."""
    with whole_model(model), full_weights(model, split=split):
        yield


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
    keep = max(QUANTILE_SAMPLE // dist.dp_world, 256)
    if ratios.numel() > keep:
        ratios = ratios[torch.linspace(0, ratios.numel() - 1, keep).round().long()]
    every = torch.tensor([x for part in dist.gather(ratios.cpu().tolist()) for x in part], dtype=torch.float64)
    out = {"mismatch/kl": kl_sum / max(tokens, 1.0), "mismatch/masked_frac": masked / max(tokens, 1.0)}
    if every.numel():
        q = torch.quantile(every, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
        out.update({"mismatch/ratio_p05": q[0], "mismatch/ratio_p50": q[1], "mismatch/ratio_p95": q[2]})
    return out


def rollout_records(step: int, tokenizer, per_response: list[Prompt], texts: list[str], rollout: Rollout,
                    rewards: RewardResult, episodes: Optional[list[dict]] = None,
                    versions: Optional[list] = None, weight_version: Optional[int] = None) -> list[dict]:
    """One RUN_DIR/rollouts.jsonl record per response: prompt, response, label, each rule's score, and
    the token ids (``prompt_ids``, ``response_ids``: what `rollout.engine=replay` replays exactly;
    decoded text does not always re-encode to the same ids). A multi-turn episode's record also has
    ``segments`` (``[role, tokens]`` runs of ``response_ids``: ``assistant`` sampled and trained on,
    ``observation`` rendered from a tool or the environment), ``turns`` (each segment's text with its
    role), ``tool_counts`` and the episode's own ``prompt_ids`` (an environment's first observation
    included); ``response`` is then the last turn, the text the rules scored."""
    lengths = rollout.response_lengths.tolist()
    out = []
    for i, (p, text) in enumerate(zip(per_response, texts)):
        record = {"step": step, "prompt": tokenizer.decode(p.ids), "response": text, "label": p.label, "task": p.task,
                  "scores": {rule: scores[i] for rule, scores in rewards.per_rule.items()},
                  "reward": rewards.totals[i], "response_length": lengths[i], "stopped": bool(rollout.stopped[i]),
                  "prompt_ids": list(p.ids), "response_ids": rollout.response_ids[i, :lengths[i]].tolist()}
        if versions:
            record["weight_version"] = min((v for v, _ in versions[i]), default=weight_version)
            record["versions"] = versions[i]
        elif weight_version is not None:
            record["weight_version"] = weight_version
        if episodes:
            e, ids = episodes[i], record["response_ids"]
            prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
            turns, at = [], 0
            for role, k in e["segments"]:
                turns.append({"role": role, "text": tokenizer.decode(ids[at:at + k])})
                at += k
            record.update({"prompt_ids": prompt, "prompt": tokenizer.decode(prompt), "segments": e["segments"],
                           "turns": turns, "tool_counts": e["counts"], "env_reward": e["env_reward"]})
        out.append(record)
    return out
