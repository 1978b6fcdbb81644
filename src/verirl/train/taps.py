"""Which positions of the forward now running are the ones a log-prob pass reads: the positions
that predict a response token, as flat indices into the forward's (rows x columns) tokens. Set
around each log-prob forward, packed or padded, in the same order (sequence by sequence, token by
token); read by whatever taps the forward (`verirl.align.activations`), so that statistics over
these positions do not depend on the layout: packing, prompt sharing, padding and micro-batching
change where the positions are, never which tokens they are."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

RESPONSE_POSITIONS: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar(
    "verirl_response_positions", default=None)


@contextlib.contextmanager
def response_positions(flat: torch.Tensor) -> Iterator[None]:
    """``flat`` (M,): the forward's positions that predict response tokens, for the block."""
    token = RESPONSE_POSITIONS.set(flat)
    try:
        yield
    finally:
        RESPONSE_POSITIONS.reset(token)
