"""One GRPO step, read top to bottom as the picture in docs/design.md:

    prompts -> rollout -> rewards (scored while the passes run) -> old / ref log-probs
            -> group advantages -> policy update -> metrics

The step reads no config: `verirl.train.build` turned it into the `Run` it is given. With
several ranks each takes whole groups of the step's prompts (so advantages need no
communication), the update sums the gradients over the ranks, and the metrics are those of the
global batch. It simplifies on purpose: one rollout per step (no filtering or regeneration of
groups) and outcome rewards only (one scalar per response).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from verirl.evaluate import decode_responses
from verirl.metrics import Timer, advantage_metrics, length_metrics, throughput
from verirl.rewards import RewardResult
from verirl.rollout import generate_chunked
from verirl.train.actor import compute_logprobs, update_policy
from verirl.train.build import Run, StepSettings
from verirl.train.distributed import Dist
from verirl.train.packing import PackCache
from verirl.train.strategy import full_weights, memory_metrics
from verirl.types import Prompt, Rollout, TrainBatch

PHASES = ("rollout", "reward", "old_log_prob", "ref", "update", "sync_weights", "all")


def train_step(run: Run, step: int) -> tuple[dict[str, float], list[dict]]:
    """One GRPO step. Returns (metrics of the global batch, one record per response of the global
    batch when the run dumps rollouts; on every rank)."""
    how, dist = run.step, run.dist
    timer = Timer()
    batch_prompts = [run.train[i] for i in run.sampler.take(how.prompts_per_step)]  # the same on every rank
    mine = how.positions(dist.rank, dist.world)  # this rank's whole groups
    prompts = [batch_prompts[i] for i in mine]
    per_response = [p for p in prompts for _ in range(how.group_size)]
    with timer("all"):
        with timer("rollout"), decoding_weights(run):  # whole weights, no collective inside
            rollout = generate_chunked(run.engine, [p.ids for p in prompts], how.group_size, how.sampling_at(step),
                                       how.generate_batch, run.pad_id, mine)
            texts = decode_responses(run.tokenizer, rollout)
        with timer("reward"):  # scoring runs in the reward workers during the log-prob passes below
            pending = run.scorer.submit(texts, [reward_fields(p) for p in per_response])
        layouts = PackCache(rollout)  # the passes below pack the same rows: lay them out once
        old_logprobs = ref_logprobs = None
        if how.old_pass is not None:
            with timer("old_log_prob"):
                old_logprobs = compute_logprobs(run.model, rollout, how.old_pass, layouts, dist)
        if run.ref is not None:
            with timer("ref"):
                ref_logprobs = compute_logprobs(run.ref, rollout, how.ref_pass, layouts, dist)
        with timer("reward"):  # what is left of the scoring once the passes are done
            rewards = pending.result()
            scores = torch.tensor(rewards.totals, dtype=torch.float32)
            advantages = how.advantages(scores).to(rollout.response_ids.device)
        batch = TrainBatch(rollout, advantages, old_logprobs, ref_logprobs)
        trainer_logp = old_logprobs if old_logprobs is not None or rollout.sample_logprobs is None else \
            torch.zeros_like(rollout.sample_logprobs)  # on-policy: filled by the update with its own
        with timer("update"), recording(run, step):
            actor_stats = update_policy(run.model, run.optimizer, run.scheduler, batch, how.update, layouts, dist,
                                        on_policy_out=trainer_logp)
        with timer("sync_weights"):  # an engine with its own copy of the weights (vLLM) gets the new ones
            run.engine.sync_weights(run.model)
    actor_stats.update(memory_metrics(run.model, run.optimizer, run.ref, dist))
    actor_stats.update(logprob_check(rollout, trainer_logp, dist))
    local = StepData([p.task for p in per_response], [p.extra.get("data_source") for p in per_response], rewards,
                     scores, advantages.cpu(), rollout)
    metrics = step_metrics(step, how, dist, local, actor_stats, timer)
    records = rollout_records(step, run.tokenizer, per_response, texts, rollout, rewards) if how.dump_rollouts else []
    return metrics, in_batch_order(dist.gather(records), how, dist.world) if records else []


def in_batch_order(parts: list[list[dict]], how: StepSettings, world: int) -> list[dict]:
    """Every rank's records (``rollout.n`` per prompt, in its own order) in the global batch's order."""
    at: dict[int, list[dict]] = {}
    for rank, part in enumerate(parts):
        for j, position in enumerate(how.positions(rank, world)):
            at[position] = part[j * how.group_size:(j + 1) * how.group_size]
    return [r for position in sorted(at) for r in at[position]]


def decoding_weights(run: Run):
    """Whole weights while an engine that reads the live model decodes (a sharded model is gathered
    once, resharded after); an engine with its own copy (vLLM, fed by `sync_weights`) needs nothing."""
    return full_weights(run.model) if getattr(run.engine, "reads_live_model", True) else contextlib.nullcontext()


@contextlib.contextmanager
def recording(run: Run, step: int) -> Iterator[None]:
    """trainer.dump_activations: the block's forwards and backwards recorded at the listed steps, saved
    per rank (`verirl.align.dump`)."""
    a = run.step.activations
    if a is None or step not in a.steps:
        yield
        return
    from verirl.align.dump import ActivationRecorder, dump_path

    with ActivationRecorder(run.model, a.modules, a.backward) as recorder:
        yield
    recorder.save(dump_path(a.dir, step, run.dist.rank),
                  {**a.meta, "step": step, "rank": run.dist.rank, "world_size": run.dist.world})


def logprob_check(rollout: Rollout, trainer_logp, dist: Dist) -> dict[str, float]:
    """``rollout/logprob_diff/mean`` and ``/max``: |log p under the engine - log p under the trainer|
    over the global batch's response tokens, both of the distribution each token was sampled from
    (after temperature), for engines that return their log-probs (vLLM). A weight push that did not
    happen shows at once (seed 001's check: an importance ratio of about 1)."""
    if rollout.sample_logprobs is None or trainer_logp is None:
        return {}
    mask = rollout.response_mask.float()
    width = min(rollout.sample_logprobs.shape[1], trainer_logp.shape[1], mask.shape[1])
    diff = (rollout.sample_logprobs[:, :width].float() - trainer_logp[:, :width].float()).abs() * mask[:, :width]
    total, count = dist.all_sum([float(diff.sum()), float(mask[:, :width].sum())])
    return {"rollout/logprob_diff/mean": total / max(count, 1.0),
            "rollout/logprob_diff/max": dist.all_max([float(diff.max()) if diff.numel() else 0.0])[0]}


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

    def plain(self) -> dict:
        r = self.rollout
        return {"tasks": self.tasks, "sources": [None if s is None else str(s) for s in self.sources], "totals": self.rewards.totals, "per_rule": self.rewards.per_rule,
                "errors": self.rewards.errors, "scores": self.scores.tolist(), "advantages": self.advantages.tolist(),
                "response_lengths": r.response_lengths.tolist(), "prompt_lengths": r.prompt_lengths.tolist(),
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
    m.update(actor_stats)
    m.update(timer.metrics(PHASES))
    if dist.active:
        m["timing/all_max"] = dist.all_max([m["timing/all"]])[0]
    m["perf/tps"] = throughput(m["prompt_length/mean"], m["response_length/mean"], how.prompts_per_step,
                               how.group_size, dist.world, m["timing/all"])
    return m


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
