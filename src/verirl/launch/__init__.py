"""Starting the ranks of a data-parallel run: on this machine (or several) through torch's elastic
launcher, the API `torchrun` is built on (`verirl.launch.local`), or as Ray actors on a Ray cluster
(`verirl.launch.ray`). The process that starts the ranks holds the run directory's lock for the
whole run (with several machines, each starts its own ranks, and rank 0 takes the lock instead),
and every rank runs the same `verirl.train.trainer.train`."""
from __future__ import annotations

import contextlib

from verirl.config import Config
from verirl.run.rundir import held_by_launcher


def launch(cfg: Config) -> dict:
    """Run `verirl.train.trainer.train` on every rank of ``cfg``'s layout; returns rank 0's summary.
    Raises `verirl.launch.local.RankFailed` (naming the rank) when a rank raises or dies."""
    several = cfg.trainer.launcher == "local" and cfg.trainer.nnodes > 1  # one launcher per machine: rank 0 locks
    with contextlib.nullcontext() if several else held_by_launcher(cfg.trainer.run_dir):
        if cfg.trainer.launcher == "ray":
            from verirl.launch.ray import launch as start
        else:
            from verirl.launch.local import launch as start
        return start(cfg)
