"""The step's timers and its metric functions: lengths, throughput, advantages."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


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
