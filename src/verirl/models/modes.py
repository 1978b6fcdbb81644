"""Switching a model's mode for the length of a block."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Put ``model`` in eval mode for the block, then restore its previous training flag,
    also when the block raises. Yields the model."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
