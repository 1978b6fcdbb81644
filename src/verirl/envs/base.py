"""The environment protocol of multi-turn rollouts: one `Environment` per episode (one sample), stepped
once per assistant turn.

    observation = env.reset(prompt)        # optional messages appended after the prompt
    while the loop allows another turn:
        step = env.step(turn)              # the decoded text of the sampled turn, special tokens kept
        if step.done: break
        append step.observation            # rendered by the chat template, loss mask 0
    env.close()

The loop calls `step` from worker threads (the tools of samples that stopped run while the others
decode): one instance is only ever stepped by one thread at a time, but whatever instances share (a
process pool, an event loop, a tool object) is shared between threads and must be thread-safe.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Protocol

if TYPE_CHECKING:  # verirl.core.types imports torch; a tool worker imports this package without it
    from verirl.core.types import Prompt

# the keys of `EnvStep.counts` (the loop sums them into tools/* metrics); ints are counted as floats
COUNT_KEYS = ("tool_calls", "tool_errors", "parse_errors", "tool_timeouts", "tool_seconds")
OBSERVATION_ROLES = ("tool", "user")


@dataclass
class EnvStep:
    """What the environment answers to one assistant turn."""
    # chat messages to append after the assistant turn: {"role": "tool", "name": ..., "content": str} or
    # {"role": "user", "content": str}; None = nothing to append
    observation: Optional[list[dict]]
    reward: Optional[float] = None  # this turn's environment reward, if any
    done: bool = False  # the episode ends after this turn
    # "tool_calls", "tool_errors", "parse_errors", "tool_timeouts" (counts, as floats) and "tool_seconds"
    # (wall-clock seconds spent in tools this turn)
    counts: dict[str, float] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, prompt: "Prompt") -> Optional[list[dict]]:
        """Start an episode on ``prompt``; optional first observation messages, appended after the prompt
        before the first assistant turn."""
        ...

    def step(self, turn: str) -> EnvStep:
        """Answer the assistant's turn (its decoded text, special tokens such as <tool_call> kept)."""
        ...

    def close(self) -> None:
        """End the episode (release what it holds). Called once, also after an episode the loop cut short."""
        ...


def zero_counts() -> dict[str, float]:
    return {k: 0.0 for k in COUNT_KEYS}
