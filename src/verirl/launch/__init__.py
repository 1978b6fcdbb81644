"""The one entry of a training run, `run(cfg)`: the config is checked once, here, then the run trains
in this process, or its ranks are started on this machine (or several) through torch's elastic
launcher, the API `torchrun` is built on (`verirl.launch.local`), or as Ray actors on a Ray cluster
(`verirl.launch.ray`). Every rank runs `verirl.train.loop.train_rank`; nothing below this package
imports it.

The ranks verirl starts get the checked config and are not checked again. A process started by an
outside `torchrun` (no verirl driver above it) comes here through `verirl train` like any other, so
each such rank checks its config itself before it trains. The process that starts the ranks holds
the run directory's lock for the whole run (with several machines, each starts its own ranks, and
rank 0 takes the lock instead)."""
from __future__ import annotations

import contextlib
from typing import Optional

from rich.console import Console

from verirl.config import Config
from verirl.config.layout import world_size
from verirl.run.checks import check
from verirl.run.rundir import held_by_launcher
from verirl.train.distributed import launched
from verirl.train.loop import join, train_rank


def run(cfg: Config, console: Optional[Console] = None) -> dict:
    """Check ``cfg``, then train: in this process (one rank, or a rank of an outside torchrun), else on
    every rank of its layout; returns rank 0's summary. Raises `verirl.launch.local.RankFailed` (naming
    the rank) when a rank raises or dies, `verirl.train.loop.TrainingInterrupted` when a signal
    stopped the run after a checkpoint."""
    check(cfg)
    if launched() or (world_size(cfg) == 1 and cfg.trainer.launcher != "ray"):
        return train_rank(cfg, join(cfg), console)
    return start_ranks(cfg)


def start_ranks(cfg: Config) -> dict:
    """Run `verirl.train.loop.train_rank` on every rank of ``cfg``'s layout; returns rank 0's summary."""
    several = cfg.trainer.launcher == "local" and cfg.trainer.nnodes > 1  # one launcher per machine: rank 0 locks
    with contextlib.nullcontext() if several else held_by_launcher(cfg.trainer.run_dir):
        if cfg.trainer.launcher == "ray":
            from verirl.launch.ray import launch as start
        else:
            from verirl.launch.local import launch as start
        return start(cfg)
