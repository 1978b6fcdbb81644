"""`trainer.launcher=ray`: one Ray actor per rank, in a placement group of one bundle per
tensor-parallel group (``actor.tensor_parallel_size`` ranks' resources: a bundle is never split
between machines, so a group's every-layer all-reduces stay inside one machine; one bundle per rank
without tensor parallelism), each running `verirl.train.loop.train_rank`; torch.distributed is wired
among them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR / MASTER_PORT in each actor's
environment). A group's ranks are consecutive, as the device mesh's tensor-parallel dimension is.

`trainer.ray_address`: ``auto`` joins the cluster this machine belongs to (``RAY_ADDRESS``, or the one
``ray start`` made here) and, without one, starts a local cluster for the run and stops it at the
end; ``local`` always starts one; ``HOST:PORT`` joins that cluster (an error if nothing answers).
This process (the driver) holds the run directory's lock; a rank that raises or dies stops every
rank (`RankFailed`). Ray is imported here only, when the launcher is used.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from verirl.config import Config, to_dict
from verirl.core.errors import ConfigError
from verirl.launch.local import INTERRUPTED, RankFailed, run_rank
from verirl.run.signals import driver_signals
from verirl.train.loop import TrainingInterrupted
from verirl.config.layout import threads_per_rank, world_size

# the driver's environment variables every rank gets (a joined cluster's workers do not inherit it)
PASSED_ENV_PREFIXES = ("VERIRL_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")
CONNECT_TIMEOUT_S = 5.0  # an explicit trainer.ray_address that does not answer within this is an error
FAILURE_GRACE_S = 3.0  # after a rank fails, how long the others' failures are collected to name the first cause
POLL_S = 0.5
# what each kind of accelerator is called among Ray's resources, and its visibility variable
ACCELERATORS = {"GPU": "CUDA_VISIBLE_DEVICES", "NPU": "ASCEND_RT_VISIBLE_DEVICES"}


def launch(cfg: Config) -> dict:
    """Run `verirl.train.loop.train_rank` on every rank as Ray actors; returns rank 0's summary."""
    import ray

    plain = None if sys.stdout.isatty() or "RAY_COLOR_PREFIX" in os.environ else os.environ.setdefault(
        "RAY_COLOR_PREFIX", "0")  # the ranks' lines, prefixed (rank0 pid=...), without colour codes in logs
    pg, actors = None, []
    try:
        started = _connect(cfg.trainer.ray_address, cfg)
        world, bundle = world_size(cfg), _bundle(cfg, ray.cluster_resources())
        group = ranks_per_bundle(cfg)
        pg = _placement_group(cfg, world, bundle, can_grow=not started, group=group)
        actors = _start_actors(pg, world, bundle, group)
        envs, where = _assign_ranks(actors, bundle, cfg.trainer.dist_timeout_s)
        print(placement(where, envs, group), file=sys.stderr)
        return _run(actors, envs, where, to_dict(cfg))
    finally:
        _kill(actors)
        if pg is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(pg)
        ray.shutdown()  # a local cluster started by _connect stops here; a joined one is only left (no-op
        # when ray.init was not reached)
        if plain is not None:
            os.environ.pop("RAY_COLOR_PREFIX", None)


# ---------------------------------------------------------------- the cluster

def _connect(address: str, cfg: Config) -> bool:
    """ray.init: join the cluster ``address`` names, or start a local one sized for ``cfg`` (-> True)."""
    import logging

    import ray

    address = address.strip()
    join = None
    if address == "auto":
        join = _running_cluster()
    elif address != "local":
        join = address
    if join is not None:
        _check_reachable(join, from_env=address == "auto")
        try:
            ray.init(address=join, logging_level=logging.WARNING)
        except Exception as e:  # ConnectionError, with Ray's reason (e.g. the auth token) in its cause
            reason = _last_line(_text(e.__cause__ or e))
            if "InvalidAuthToken" in reason or "AuthenticationError" in reason:
                raise ConfigError(
                    f"trainer.ray_address: the Ray cluster at {join} refused this process: it uses token "
                    f"authentication (what `ray start` turns on in recent Ray) and this process has no token. Run "
                    f"verirl with RAY_AUTH_MODE=token and the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN "
                    f"(`ray get-auth-token` on the head prints it), or start the cluster with "
                    f"RAY_AUTH_MODE=disabled.") from None
            raise ConfigError(
                f"trainer.ray_address: could not join the Ray cluster at {join} ({reason[:300]}). Check that it is "
                f"the head's address (`ray status` there shows the cluster) and that this machine runs the "
                f"cluster's Ray version.") from None
        machines = sum(1 for n in ray.nodes() if n.get("Alive"))
        print(f"verirl: joined the Ray cluster at {join}: {machines} machine{'s' * (machines != 1)}, "
              f"{_fmt(_plain(ray.cluster_resources()))}", file=sys.stderr)
        return False
    need = world_size(cfg) * threads_per_rank(cfg)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, need), include_dashboard=False,
             logging_level=logging.WARNING)
    print(f"verirl: started a local Ray cluster for this run ({_fmt(_plain(ray.cluster_resources()))}); it stops "
          f"when the run ends", file=sys.stderr)
    return True


def _running_cluster() -> Optional[str]:
    """The address of the cluster ``ray.init()`` would join: RAY_ADDRESS, else the one ``ray start``
    made on this machine; None when there is none (a local cluster another driver started for itself
    is not joined: it ends with that driver)."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env not in ("auto", "local"):
        return env
    if env == "local":
        return None
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # Ray moved it: only RAY_ADDRESS is looked at
        return None
    saved = os.environ.pop("RAY_ADDRESS", None)  # "auto" there would mean any cluster found by ps
    try:
        found = canonicalize_bootstrap_address(None)
    except Exception:
        found = None
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
    if found is not None:
        try:
            _check_reachable(found, from_env=True)
        except ConfigError:  # a cluster `ray start` made here and that has since been killed
            return None
    return found


def _check_reachable(address: str, from_env: bool) -> None:
    """A TCP connection to ``address``'s host:port, or `ConfigError` (ray.init alone retries for minutes)."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    key = (f"RAY_ADDRESS={address} (which trainer.ray_address=auto follows)" if from_env and
           os.environ.get("RAY_ADDRESS") else f"trainer.ray_address={address}")
    fix = ("unset RAY_ADDRESS to start a local cluster for the run" if key.startswith("RAY_ADDRESS") else
           "use trainer.ray_address=auto to start a local cluster for the run")
    if not host or not port.isdigit():
        raise ConfigError(f"{key} is not a Ray cluster address: give HOST:PORT of the head node (the address "
                          f"`ray start --head` printed, e.g. 10.0.0.1:6379), or {fix}.")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(
            f"{key}: no Ray cluster answers at {host}:{port} ({e.strerror or e}). Start one with `ray start --head "
            f"--port={port}` on {host} (and `ray start --address={host}:{port}` on the other machines), fix the "
            f"address, or {fix}.") from None


def _bundle(cfg: Config, cluster: dict) -> dict:
    """One rank's resources: trainer.threads CPUs, and one GPU or NPU unless the model runs on the CPU
    (model.device=auto: the cluster's GPUs, else its NPUs, else none)."""
    bundle: dict[str, float] = {"CPU": float(threads_per_rank(cfg))}
    device = cfg.model.device
    kind = {"cuda": "GPU", "npu": "NPU"}.get(device)
    if device == "auto":
        kind = next((k for k in ACCELERATORS if cluster.get(k, 0) > 0), None)
    if kind:
        bundle[kind] = 1.0
    return bundle


def ranks_per_bundle(cfg: Config) -> int:
    """The ranks of one placement-group bundle: a tensor-parallel group (``actor.tensor_parallel_size``),
    which Ray then places on one machine."""
    return cfg.actor.tensor_parallel_size


def bundles(world: int, rank: dict, group: int) -> list[dict]:
    """The placement group's bundles: one per ``group`` consecutive ranks, each holding their resources
    (``rank``: one rank's)."""
    return [{k: group * v for k, v in rank.items()} for _ in range(world // group)]


def _placement_group(cfg: Config, world: int, bundle: dict, can_grow: bool, group: int = 1):
    """One bundle per tensor-parallel group (`bundles`), packed onto as few machines as possible; waits up
    to trainer.dist_timeout_s for the cluster to offer them (a joined cluster may free them or gain
    machines; a local one started for the run cannot, so more than it has fails at once), else
    `ConfigError`."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    total = ray.cluster_resources()
    short = {k: world * v for k, v in bundle.items() if world * v > total.get(k, 0)}
    one = bundles(world, bundle, group)[0]
    machines = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if group > 1 and machines and not any(all(m.get(k, 0) >= v for k, v in one.items()) for m in machines):
        short = short or dict(one)  # no machine holds a whole tensor-parallel group
    timeout = cfg.trainer.dist_timeout_s
    pg = placement_group(bundles(world, bundle, group), strategy="PACK", name=f"verirl-{uuid.uuid4().hex[:8]}")
    hopeless = bool(short) and not can_grow
    deadline, told, placed = time.monotonic() + timeout, False, pg.ready()
    while True:
        left = deadline - time.monotonic()
        ready, _ = ray.wait([placed], timeout=0.0 if hopeless else max(0.0, min(10.0, left)))
        if ready:
            return pg
        if hopeless or time.monotonic() >= deadline:
            remove_placement_group(pg)
            has = ("has" if short else f"did not free them within trainer.dist_timeout_s={timeout}s; it has")
            per = f" (one per tensor-parallel group of {group} ranks, each on one machine)" if group > 1 else ""
            raise ConfigError(
                f"trainer.launcher=ray: {world} ranks need {world // group} bundles of {_fmt(one)}{per} "
                f"({_fmt({k: world * v for k, v in bundle.items()})} in all), but the "
                f"{'Ray cluster' if can_grow else 'local Ray cluster started for this run (this machine)'} {has} "
                f"{_fmt(_plain(total))} in all ({_fmt(_plain(ray.available_resources()))} free). Lower "
                f"trainer.nproc_per_node x trainer.nnodes or trainer.threads, "
                f"{'use model.device=cpu, ' if len(bundle) > 1 else ''}or "
                + ("add machines to the cluster (`ray start --address=...` on each)." if can_grow else
                   "start a Ray cluster that has them and set trainer.ray_address to its head (docs/ray.md)."))
        if not told:
            print(f"verirl: waiting for the Ray cluster to offer {world // group} bundles of {_fmt(one)} "
                  f"(up to trainer.dist_timeout_s={timeout}s)", file=sys.stderr)
            told = True


def _plain(resources: dict) -> dict:
    """Ray's resources without its per-node bookkeeping entries (node:IP, memory, object store)."""
    return {k: v for k, v in resources.items()
            if not (k.startswith(("node:", "accelerator_type:")) or k in ("memory", "object_store_memory"))}


def _fmt(resources: dict) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


# ---------------------------------------------------------------- the ranks

class _Rank:
    """One rank: a Ray actor that runs `train_rank` in its own process."""

    def __init__(self, index: int):
        self.rank = index  # the bundle's index until `run` is given the rank

    def __repr__(self) -> str:  # Ray prefixes the actor's output lines with this
        return f"rank{self.rank}"

    def where(self) -> dict:
        """This actor's node and accelerators (without initialising any device)."""
        import ray

        ctx = ray.get_runtime_context()
        ids = ctx.get_accelerator_ids()
        return {"node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "accelerators": {k: [str(i) for i in ids.get(k, [])] for k in ACCELERATORS}}

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def run(self, cfg_dict: dict, env: dict, cwd: str) -> Any:
        os.environ.update(env)  # before anything initialises torch.distributed or a device
        self.rank = int(env["RANK"])
        if os.path.isdir(cwd):  # relative paths in the config mean what they meant to the driver
            os.chdir(cwd)
        return run_rank(cfg_dict)


def _start_actors(pg, world: int, bundle: dict, group: int = 1) -> list:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    kind = next((k for k in ACCELERATORS if k in bundle), None)
    options: dict[str, Any] = {"num_cpus": bundle["CPU"], "max_restarts": 0, "max_task_retries": 0}
    if kind == "GPU":
        options["num_gpus"] = 1
    elif kind:
        options["resources"] = {kind: 1}
    cls = ray.remote(_Rank)
    return [cls.options(**options, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i // group)).remote(i) for i in range(world)]


def _assign_ranks(actors: list, bundle: dict, timeout_s: int) -> tuple[list[dict], list[dict]]:
    """The environment of each actor (in bundle order), and where each runs."""
    import ray

    try:
        where = ray.get([a.where.remote() for a in actors], timeout=timeout_s)
    except Exception as e:
        raise RankFailed(f"the Ray actors of the ranks did not start ({_last_line(_text(e))}); every rank was "
                         f"stopped. Each machine of the cluster needs verirl installed in the Python Ray runs with "
                         f"(the same virtual environment and paths on every machine).") from None
    order = rank_order(where, ray.get_runtime_context().get_node_id())
    port = ray.get(actors[order[0]].free_port.remote(), timeout=timeout_s)
    passed = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV_PREFIXES)}
    return rank_envs(where, order, bundle, port, passed), where


def rank_order(where: list[dict], here: str) -> list[int]:
    """The bundles (indices into ``where``, each {"node": id, ...}) in rank order: node by node, the
    node ``here`` (the driver's) first, as rank 0 writes the logs and checkpoints; then the others in
    the order their first bundle comes; bundle order within a node."""
    nodes: list[str] = []
    for w in sorted(where, key=lambda w: w["node"] != here):  # stable: bundle order within each group
        if w["node"] not in nodes:
            nodes.append(w["node"])
    return sorted(range(len(where)), key=lambda i: (nodes.index(where[i]["node"]), i))


def placement(where: list[dict], envs: list[dict], group: int) -> str:
    """One line: the ranks on each machine (by its address, rank 0's first) and, with tensor parallelism
    (``group`` ranks per group), the tensor-parallel groups each machine holds whole."""
    on: dict[str, list[int]] = {}
    for w, env in sorted(zip(where, envs), key=lambda we: int(we[1]["RANK"])):
        on.setdefault(w["ip"], []).append(int(env["RANK"]))
    parts = []
    for ip, ranks in on.items():
        groups = sorted({r // group for r in ranks})
        parts.append(f"{ip} ranks {', '.join(map(str, ranks))}" + (
            f" (tensor-parallel group{'s' * (len(groups) > 1)} {', '.join(map(str, groups))}, each of {group} ranks)"
            if group > 1 else ""))
    machines = len(on)
    return f"verirl: {len(envs)} ranks on {machines} machine{'s' * (machines != 1)}: {'; '.join(parts)}"


def rank_envs(where: list[dict], order: list[int], bundle: dict, port: int, passed: dict) -> list[dict]:
    """Each bundle's environment for torch.distributed (env://): RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR (rank 0's node) / MASTER_PORT, plus ``passed``. With accelerators,
    each node's ranks see that node's assigned devices in local-rank order (CUDA_VISIBLE_DEVICES /
    ASCEND_RT_VISIBLE_DEVICES), so that device LOCAL_RANK is the rank's own, as under torchrun."""
    local: dict[str, list[int]] = {}
    for i in order:
        local.setdefault(where[i]["node"], []).append(i)
    envs = []
    for i, w in enumerate(where):
        peers = local[w["node"]]
        env = {**passed, "RANK": str(order.index(i)), "WORLD_SIZE": str(len(where)),
               "LOCAL_RANK": str(peers.index(i)), "LOCAL_WORLD_SIZE": str(len(peers)),
               "MASTER_ADDR": where[order[0]]["ip"], "MASTER_PORT": str(port)}
        for kind, var in ACCELERATORS.items():
            if kind in bundle:
                env[var] = ",".join(where[j]["accelerators"][kind][0] for j in peers)
        envs.append(env)
    return envs


def _run(actors: list, envs: list[dict], where: list[dict], cfg_dict: dict) -> dict:
    """Start every rank's trainer and wait; the first failure stops them all. A first SIGINT / SIGTERM
    is passed on to the ranks (each saves a checkpoint after the step, as one process alone does); a
    second stops them at once."""
    import ray

    cwd = os.getcwd()
    pending = {actors[i].run.remote(cfg_dict, envs[i], cwd): i for i in range(len(actors))}
    results: dict[int, Any] = {}
    failures: list[tuple[int, BaseException]] = []  # (bundle index, error), in the order they were seen
    deadline = None
    with driver_signals() as signals:
        while pending and (deadline is None or time.monotonic() < deadline):
            if signals.fresh():
                _signal_ranks(where)
            done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            for ref in done:
                i = pending.pop(ref)
                try:
                    results[int(envs[i]["RANK"])] = ray.get(ref)
                except Exception as e:
                    failures.append((i, e))
            if failures and deadline is None:
                deadline = time.monotonic() + FAILURE_GRACE_S  # the others' errors tell which one came first
    summary = results.get(0) or {}
    if failures and signals.signum and INTERRUPTED not in summary:
        raise KeyboardInterrupt  # stopped before their loop could save a checkpoint: the driver's "interrupted"
    if failures:
        _kill(actors)  # at once: the ranks still running must not wait on a collective
        i, error = min(failures, key=lambda f: (_is_peer_loss(f[1]), failures.index(f)))
        rank, died = envs[i]["RANK"], isinstance(error, ray.exceptions.RayActorError)
        if died:
            why = (f"its process died without raising (pid {where[i]['pid']} on {where[i]['ip']}; Ray: "
                   f"{_exit_type(str(error))}): killed, out of memory, or it exited")
        else:
            print(f"verirl: rank {rank} raised:\n{_text(error)}", file=sys.stderr)
            why = _last_line(_text(error))
        raise RankFailed(f"rank {rank} failed ({why}); every rank was stopped (its traceback, if it raised, is "
                         f"above). Run the same command again to resume from the last checkpoint.")
    if INTERRUPTED in summary:  # every rank stopped after the same step; rank 0 saved the checkpoint
        _, step, checkpoint = summary[INTERRUPTED]
        raise TrainingInterrupted(signals.signum, step, Path(checkpoint))
    return summary


def _signal_ranks(where: list[dict]) -> None:
    """SIGTERM to each rank's process: the trainer saves a checkpoint after the step and stops (a Ray
    worker blocks SIGINT; before the trainer's loop has started, SIGTERM ends the worker). Sent
    directly on this machine, through a task pinned to the node on the others."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    for w in where:
        if w["node"] == here:
            with contextlib.suppress(OSError):
                os.kill(w["pid"], signal.SIGTERM)
        else:
            ray.remote(_send_signal).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                w["node"], soft=False)).remote(w["pid"], int(signal.SIGTERM))


def _send_signal(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def _kill(actors: list) -> None:
    import ray

    for actor in actors:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(actor, no_restart=True)


def _text(error: BaseException) -> str:
    """A rank's error as Ray carries it: the remote traceback, without colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _exit_type(text: str) -> str:
    m = re.search(r"Worker exit type: (\w+)", text)
    return f"worker exit type {m.group(1)}" if m else "the actor died"


def _is_peer_loss(error: BaseException) -> bool:
    """Whether a rank's error is its collective breaking because a peer had gone (rather than the cause)."""
    import ray

    if isinstance(error, ray.exceptions.RayActorError):
        return False  # the actor itself died
    text = _last_line(_text(error)).lower()
    return any(s in text for s in ("distbackenderror", "distnetworkerror", "diststoreerror", "disterror",
                                   "connection closed by peer", "connection reset by peer", "gloo", "nccl",
                                   "hccl", "broken pipe"))
