"""One GRPO step, read top to bottom as the picture in docs/design.md:

    prompts -> rollout -> rewards (scored while the passes run) -> old / ref log-probs
            -> group advantages -> policy update -> metrics

The step reads no config: `verirl.train.build` turned it into the `Run` it is given. It
simplifies on purpose: one rollout per step (no filtering or regeneration of groups), outcome
rewards only (one scalar per response), and one process.
"""
from __future__ import annotations

import torch

from verirl.evaluate import decode_responses
from verirl.metrics import Timer, advantage_metrics, length_metrics, throughput
from verirl.rewards import RewardResult
from verirl.rollout import generate_chunked
from verirl.train.actor import compute_logprobs, update_policy
from verirl.train.build import Run, StepSettings
from verirl.train.packing import PackCache
from verirl.types import Prompt, Rollout, TrainBatch

PHASES = ("rollout", "reward", "old_log_prob", "ref", "update", "all")


def train_step(run: Run, step: int) -> tuple[dict[str, float], list[dict]]:
    """One GRPO step. Returns (metrics, one record per response when the run dumps rollouts)."""
    how = run.step
    timer = Timer()
    prompts = [run.train[i] for i in run.sampler.take(how.prompts_per_step)]
    per_response = [p for p in prompts for _ in range(how.group_size)]
    with timer("all"):
        with timer("rollout"):
            rollout = generate_chunked(run.engine, [p.ids for p in prompts], how.group_size, how.sampling_at(step),
                                       how.generate_batch, run.pad_id)
            texts = decode_responses(run.tokenizer, rollout)
        with timer("reward"):  # scoring runs in the reward workers during the log-prob passes below
            pending = run.scorer.submit(texts, [reward_fields(p) for p in per_response])
        layouts = PackCache(rollout)  # the passes below pack the same rows: lay them out once
        old_logprobs = ref_logprobs = None
        if how.old_pass is not None:
            with timer("old_log_prob"):
                old_logprobs = compute_logprobs(run.model, rollout, how.old_pass, layouts)
        if run.ref is not None:
            with timer("ref"):
                ref_logprobs = compute_logprobs(run.ref, rollout, how.ref_pass, layouts)
        with timer("reward"):  # what is left of the scoring once the passes are done
            rewards = pending.result()
            scores = torch.tensor(rewards.totals, dtype=torch.float32)
            advantages = how.advantages(scores).to(rollout.response_ids.device)
        batch = TrainBatch(rollout, advantages, old_logprobs, ref_logprobs)
        with timer("update"):
            actor_stats = update_policy(run.model, run.optimizer, run.scheduler, batch, how.update, layouts)
    metrics = step_metrics(step, how, per_response, rollout, rewards, scores, advantages, actor_stats, timer)
    records = rollout_records(step, run.tokenizer, per_response, texts, rollout, rewards) if how.dump_rollouts else []
    return metrics, records


def reward_fields(p: Prompt) -> dict:
    """What a reward rule sees of a prompt besides the response: its extra keys, label and task."""
    return {**p.extra, "label": p.label, "task": p.task}


def step_metrics(step: int, how: StepSettings, per_response: list[Prompt], rollout: Rollout, rewards: RewardResult,
                 scores: torch.Tensor, advantages: torch.Tensor, actor_stats: dict[str, float],
                 timer: Timer) -> dict[str, float]:
    """The step's line in metrics.jsonl: rewards (overall, per rule, per task), advantages, lengths,
    the update's statistics, phase times and throughput."""
    m: dict[str, float] = {"step": step}
    m.update(rewards.metrics([p.task for p in per_response]))
    m.update(advantage_metrics(advantages, scores, how.group_size))
    m.update(length_metrics(rollout, how.sampling.max_new_tokens))
    m.update(actor_stats)
    m.update(timer.metrics(PHASES))
    m["perf/tps"] = throughput(m["prompt_length/mean"], m["response_length/mean"], how.prompts_per_step,
                               how.group_size, 1, m["timing/all"])
    return m


def rollout_records(step: int, tokenizer, per_response: list[Prompt], texts: list[str], rollout: Rollout,
                    rewards: RewardResult) -> list[dict]:
    """One RUN_DIR/rollouts.jsonl record per response: prompt, response, label, each rule's score."""
    lengths = rollout.response_lengths.tolist()
    return [{"step": step, "prompt": tokenizer.decode(p.ids), "response": text, "label": p.label, "task": p.task,
             "scores": {rule: scores[i] for rule, scores in rewards.per_rule.items()},
             "reward": rewards.totals[i], "response_length": lengths[i], "stopped": bool(rollout.stopped[i])}
            for i, (p, text) in enumerate(zip(per_response, texts))]
