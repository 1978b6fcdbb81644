"""`trainer.nproc_per_node` ranks on this machine (x `trainer.nnodes` machines) through torch's
elastic launcher (`torch.distributed.launcher.api.elastic_launch`, what `torchrun` runs): it sets
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR for each rank, watches them, and ends every rank when
one fails. Started by an existing `torchrun`, verirl joins instead of launching.
"""
from __future__ import annotations

import os
import uuid

from verirl.config import Config, to_dict
from verirl.errors import UserError


class RankFailed(UserError):
    """A rank raised or died; every rank was ended. The message names the rank and its error."""


def launch(cfg: Config) -> dict:
    """Run `verirl.train.trainer.train` on every rank; returns rank 0's summary."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    t = cfg.trainer
    multi_node = t.nnodes > 1
    config = LaunchConfig(
        min_nodes=t.nnodes, max_nodes=t.nnodes, nproc_per_node=t.nproc_per_node,
        run_id=os.environ.get("VERIRL_RUN_ID", "verirl-" + (t.rdzv_endpoint if multi_node else uuid.uuid4().hex)),
        rdzv_backend="c10d", rdzv_endpoint=t.rdzv_endpoint if multi_node else "localhost:0",
        rdzv_configs={"timeout": t.dist_timeout_s, "join_timeout": t.dist_timeout_s}, max_restarts=0, monitor_interval=0.2, start_method="spawn")
    try:
        results = elastic_launch(config, _rank_main)(to_dict(cfg))
    except ChildFailedError as e:
        rank, failure = next(iter(sorted(e.failures.items())))
        raise RankFailed(f"rank {rank} failed ({_why(failure)}); every rank was stopped (its traceback, if it "
                         f"raised, is above). Run the same command again to resume from the last checkpoint.") from None
    return results.get(0) or next(iter(results.values()), {})


def _why(failure) -> str:
    """The failed rank's exit code, and its exception's last line when it raised one."""
    why = f"exit code {failure.exitcode}"
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else ""
    last = message.strip().splitlines()[-1] if message.strip() else ""
    return f"{why}: {last}" if last else why


def _rank_main(cfg_dict: dict) -> dict:
    """One rank: the same trainer, in this process."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from verirl.config import load_config_dict
    from verirl.train.trainer import train

    return record(train)(load_config_dict(cfg_dict))
