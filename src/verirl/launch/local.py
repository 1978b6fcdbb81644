"""`trainer.nproc_per_node` ranks on this machine (x `trainer.nnodes` machines) through torch's
elastic launcher (`torch.distributed.launcher.api.elastic_launch`, what `torchrun` runs): it sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR for each rank, watches them, and ends every rank when
one fails. Started by an existing `torchrun`, verirl joins instead of launching.

Ctrl-C / SIGTERM: the launcher passes the first on to every rank as SIGTERM (the ranks ignore SIGINT,
so a Ctrl-C, which reaches every process of the terminal, counts once); each saves a checkpoint after
the step, as one process alone does, and the launcher raises `TrainingInterrupted`. A second one ends
the ranks at once (torch's launcher sends them SIGTERM) and raises KeyboardInterrupt.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import uuid
from pathlib import Path

from verirl.config import Config, load_config_dict, to_dict
from verirl.config.layout import local_trainers
from verirl.core.errors import UserError
from verirl.run.signals import driver_signals, ignore_sigint
from verirl.train.loop import TrainingInterrupted, join, train_rank


INTERRUPTED = "__verirl_interrupted__"  # a rank's answer when a signal stopped the run (signum, step, checkpoint)
# torch's launcher turns these into its SignalException; SIGINT and SIGTERM are the launcher's own (`driver_signals`)
TORCH_SIGNALS = "SIGHUP,SIGQUIT"


class RankFailed(UserError):
    """A rank raised or died; every rank was ended. The message names the rank and its error."""


def launch(cfg: Config) -> dict:
    """Run `verirl.train.loop.train_rank` on every rank; returns rank 0's summary."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    t = cfg.trainer
    multi_node = t.nnodes > 1
    config = LaunchConfig(
        min_nodes=t.nnodes, max_nodes=t.nnodes, nproc_per_node=local_trainers(cfg),
        run_id=os.environ.get("VERIRL_RUN_ID", "verirl-" + (t.rdzv_endpoint if multi_node else uuid.uuid4().hex)),
        rdzv_backend="c10d", rdzv_endpoint=t.rdzv_endpoint if multi_node else "localhost:0",
        rdzv_configs={"timeout": t.dist_timeout_s, "join_timeout": t.dist_timeout_s}, max_restarts=0, monitor_interval=0.2, start_method="spawn",
        signals_to_handle=TORCH_SIGNALS)
    try:
        with driver_signals(pass_on=_term_children) as signals:
            results = elastic_launch(config, _rank_main)(to_dict(cfg))
    except ChildFailedError as e:
        if signals.signum:  # a rank stopped before its loop could save a checkpoint: "interrupted"
            raise KeyboardInterrupt from None
        rank, failure = next(iter(sorted(e.failures.items())))
        raise RankFailed(f"rank {rank} failed ({_why(failure)}); every rank was stopped (its traceback, if it "
                         f"raised, is above). Run the same command again to resume from the last checkpoint.") from None
    summary = results.get(0) or next(iter(results.values()), {})
    if INTERRUPTED in summary:  # every rank stopped after the same step; rank 0 saved the checkpoint
        signum, step, checkpoint = summary[INTERRUPTED]
        raise TrainingInterrupted(signals.signum or signum, step, Path(checkpoint))
    return summary


def _term_children() -> None:
    """SIGTERM to the ranks torch's launcher started from this process."""
    for rank in multiprocessing.active_children():
        with contextlib.suppress(OSError):
            os.kill(rank.pid, signal.SIGTERM)


def _why(failure) -> str:
    """The failed rank's exit code, and its exception's last line when it raised one."""
    why = f"exit code {failure.exitcode}"
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else ""
    last = message.strip().splitlines()[-1] if message.strip() else ""
    return f"{why}: {last}" if last else why


def _rank_main(cfg_dict: dict) -> dict:
    """One rank of torch's launcher, in this process; SIGINT ignored (the launcher passes a Ctrl-C on)."""
    from torch.distributed.elastic.multiprocessing.errors import record

    ignore_sigint()
    return record(run_rank)(cfg_dict)


def run_rank(cfg_dict: dict) -> dict:
    """One rank a verirl launcher started: `train_rank` on the config the driver checked and sent. A stop
    by a signal is answered as `INTERRUPTED` (the exception does not cross processes as it is; the
    launcher raises it again)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # as `verirl train` does: the rank's own lines only
    cfg = load_config_dict(cfg_dict)
    try:
        return train_rank(cfg, join(cfg))
    except TrainingInterrupted as stop:
        return {INTERRUPTED: (stop.signum, stop.step, str(stop.checkpoint))}
