"""The step's line in metrics.jsonl over the global batch (`step_metrics`), its timers, and its metric
functions: rewards, lengths, entropy, throughput, advantages."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from verirl.models.perf import mfu, step_flops
from verirl.rewards import RewardResult
from verirl.train.distributed import Dist
from verirl.train.settings import StepSettings

PHASES = ("rollout", "reward", "old_log_prob", "ref", "update", "sync_weights", "all")


@dataclass
class ResponseStats:
    """One rank's responses as plain lists (what the ranks exchange for the metrics of the global batch)."""
    tasks: list[str]  # (N,) each response's task
    sources: list[Optional[str]]  # (N,) each response's data_source (None: its prompt has none)
    rewards: RewardResult  # the logged rewards
    advantage_rewards: list[float]  # (N,) the rewards the advantages were computed from
    advantages: list[float]  # (N,)
    response_lengths: list[int]  # (N,)
    loss_lengths: list[int]  # (N,) the tokens trained on
    prompt_lengths: list[int]  # (N,)
    stopped: list[bool]  # (N,)
    entropy: list[float]  # (N,) each response's token entropy summed over its loss mask

    @staticmethod
    def join(parts: list["ResponseStats"]) -> "ResponseStats":
        """Every rank's, in rank order."""
        def cat(name: str) -> list:
            return [x for part in parts for x in getattr(part, name)]

        rewards = RewardResult.concat([p.rewards for p in parts])
        return ResponseStats(cat("tasks"), cat("sources"), rewards, cat("advantage_rewards"), cat("advantages"),
                             cat("response_lengths"), cat("loss_lengths"), cat("prompt_lengths"), cat("stopped"),
                             cat("entropy"))


def step_metrics(step: int, settings: StepSettings, dist: Dist, local: ResponseStats, actor_stats: dict[str, float],
                 timer: Timer) -> dict[str, float]:
    """The step's line in metrics.jsonl, over the GLOBAL batch (every rank's responses, in rank order):
    rewards (overall, per rule, per task), advantages, lengths, the update's statistics (already
    global), rank 0's phase times with ``timing/all_max`` over the ranks, and throughput."""
    every = ResponseStats.join(dist.gather(local))
    m: dict[str, float] = {"step": step}
    m.update(every.rewards.metrics(every.tasks, every.sources))
    m.update(advantage_metrics(torch.tensor(every.advantages), torch.tensor(every.advantage_rewards),
                               settings.group_size))
    m.update(length_metrics(torch.tensor(every.response_lengths), torch.tensor(every.prompt_lengths),
                            torch.tensor(every.stopped)))
    m.update(entropy_metrics(every.entropy, every.loss_lengths, every.tasks, every.sources))
    m.update(actor_stats)
    m.update(timer.metrics(PHASES))
    if dist.active:
        m["timing/all_max"] = dist.all_max([m["timing/all"]], world=True)[0]
    for key, phase in (("perf/tps", "all"), ("perf/tps_rollout", "rollout"), ("perf/tps_update", "update")):
        m[key] = throughput(m["prompt_length/mean"], m["response_length/mean"], settings.prompts_per_step,
                            settings.group_size, dist.world, m[f"timing/{phase}"])
    if settings.flops is not None and settings.peak_flops > 0:
        flops = step_flops(settings.flops, every.prompt_lengths, every.response_lengths, settings.group_size,
                           (settings.old_pass is not None) + (settings.ref_pass is not None), settings.update.epochs,
                           settings.update.forward.prompt_once)
        m["perf/mfu"] = mfu(sum(flops.values()), m["timing/all"], dist.world, settings.peak_flops)
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


class Timer:
    """``with timer("rollout"): ...`` accumulates seconds under ``timing/rollout``. With a ``watchdog``
    (`verirl.run.watchdog.Watchdog`), each phase is also its heartbeat."""

    def __init__(self, watchdog=None) -> None:
        self.seconds: dict[str, float] = {}
        self.watchdog = watchdog

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        if self.watchdog is not None:
            self.watchdog.enter(name)
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            if self.watchdog is not None:
                self.watchdog.leave()

    def add(self, name: str, seconds: float) -> None:
        """Seconds measured elsewhere (the tools' time, spent beside the rollout's decoding) under ``timing/name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self, names: tuple[str, ...] = ()) -> dict[str, float]:
        out = {f"timing/{k}": 0.0 for k in names}
        out.update({f"timing/{k}": v for k, v in self.seconds.items()})
        return out


def length_metrics(response_lengths: torch.Tensor, prompt_lengths: torch.Tensor,
                   stopped: torch.Tensor) -> dict[str, float]:
    """response_lengths, prompt_lengths (N,) tokens; stopped (N,) bool: ended on a stop token."""
    resp = response_lengths.float()
    prompt = prompt_lengths.float()
    return {
        "response_length/mean": float(resp.mean()), "response_length/max": float(resp.max()),
        "response_length/min": float(resp.min()),
        # fraction of responses cut at max_new_tokens without a stop token
        "response_length/clip_ratio": float((~stopped.bool()).float().mean()),
        "prompt_length/mean": float(prompt.mean()), "prompt_length/max": float(prompt.max()),
    }


def throughput(prompt_len_mean: float, response_len_mean: float, prompts: int, n: int,
               world_size: int, seconds: float) -> float:
    """perf/tps = (mean prompt len + mean response len) * prompts * n / world size / step seconds."""
    return (prompt_len_mean + response_len_mean) * prompts * n / world_size / max(seconds, 1e-9)


def advantage_metrics(adv: torch.Tensor, rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    groups = rewards.view(-1, group_size)
    solved_none = (groups.max(1).values == groups.min(1).values).float().mean()
    return {"adv/mean": float(adv.mean()), "adv/max": float(adv.max()), "adv/min": float(adv.min()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "reward/zero_std_groups": float(solved_none)}  # groups that teach nothing (all rewards equal)
