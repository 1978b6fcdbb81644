"""Which positions of the forward now running are the ones a log-prob pass reads: the positions
that predict a response token, as flat indices into the forward's (rows x columns) tokens. Set
around each log-prob forward, packed or padded, in the same order (sequence by sequence, token by
token), with where each sequence starts; read by whatever taps the forward (`verirl.align.dump`),
so that statistics over these positions do not depend on the layout: packing, prompt sharing,
padding and micro-batching change where the positions are, never which tokens they are."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

RESPONSE_POSITIONS: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar(
    "verirl_response_positions", default=None)
# (M,) bool, True where a sequence's first response token is predicted: a packed layout that shares
# a prompt predicts every sample's first token from one position, whose gradient is the group's sum
SEQUENCE_STARTS: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar(
    "verirl_sequence_starts", default=None)
_SILENT: contextvars.ContextVar[bool] = contextvars.ContextVar("verirl_taps_silent", default=False)


@contextlib.contextmanager
def response_positions(flat: torch.Tensor, first: Optional[torch.Tensor] = None) -> Iterator[None]:
    """``flat`` (M,): the forward's positions that predict response tokens, for the block; ``first``
    (M,) bool: those that predict a sequence's first response token."""
    silent = _SILENT.get()
    tokens = RESPONSE_POSITIONS.set(None if silent else flat), SEQUENCE_STARTS.set(None if silent else first)
    try:
        yield
    finally:
        RESPONSE_POSITIONS.reset(tokens[0])
        SEQUENCE_STARTS.reset(tokens[1])


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Forwards that are not part of the pass (a sharded model's empty micro-batches, run only to join
    the other ranks' collectives): nothing is tapped."""
    token = _SILENT.set(True)
    try:
        yield
    finally:
        _SILENT.reset(token)
