"""Rules that run in the trainer's process, in a thread each, and wait on something else: programs in
the sandbox (``code``), a scoring server over HTTP (``remote``), an LLM judge behind an OpenAI-compatible
endpoint (``judge``), a reward model on the trainer's device (``model``).

They are named in ``reward.verifiers`` like the rules, weighted and routed to tasks like them, and
their scores are awaited with the rules' (`verirl.rewards.scoring.Scorer`): a service starts when the
batch is submitted and finishes while the log-prob passes run. A service keeps its own deadlines and
concurrency; a sample it could not score is (None, why), scored 0 and counted in ``reward/errors``,
and a service may count more (``reward/code/compile_errors``, ``reward/remote/errors``).

This module holds the types a service implements; `verirl.rewards.services` names the services and
builds them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

Scores = list[tuple[Optional[float], str]]  # (N,) (score, "") or (None, why it failed)


@dataclass
class ServiceScores:
    scores: Scores
    counts: dict[str, float] = field(default_factory=dict)  # metric name -> count, summed over calls and ranks


class Service(Protocol):
    name: str  # the rule's name in reward.verifiers and in reward/<name>/mean

    def score(self, responses: Sequence[str], samples: Sequence[dict]) -> ServiceScores:
        """Every response's score; never raises for what a response, a program or a server does."""

    def outstanding(self) -> list[str]:
        """What runs now, one line each (the hang watchdog's report)."""

    def close(self) -> None:
        """Let go of threads, processes, connections and models (safe to call twice)."""


@dataclass(frozen=True)
class ServiceContext:
    """What building a service may need besides its config section."""
    hide: tuple[str, ...] = ()  # paths the sandbox covers (the run directory)
    device: str = "cpu"  # the trainer's device (the reward model's)
    dtype: str = "float32"  # the trainer's compute dtype name (a reward model with dtype auto)
    say: bool = True  # print what a service says at start (the first rank only)
