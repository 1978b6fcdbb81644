"""The run's checkpoint policy and its resume: when a checkpoint is written and what goes into it
(never non-finite weights), in which format, and how a run continues from one.

A whole checkpoint gathers the model's and the optimizer's states here (every rank takes part) and
rank 0 writes them; a sharded one has every rank write the blocks it holds (`verirl.run.shards`) and
rank 0 the rest, after all of them. On resume either is laid out as this run's model: whole tensors
cut to its shards, sharded pieces read by overlap with what each rank holds. `verirl.run.checkpoint`
writes, verifies and reads the files.

Every rank writes into the run directory, so with more than one rank it must be one directory that
every rank sees (`check_shared_run_dir`, at the start of every run of several ranks)."""
from __future__ import annotations

import os
import signal
import socket
import uuid
from pathlib import Path
from typing import Callable, Optional

import torch

from verirl.config import to_dict, upgrade_dict
from verirl.core.errors import CheckpointError, UserError
from verirl.models.lora import base_path, from_peft_names, is_adapter_key, is_lora
from verirl.run.checkpoint import (ADAPTERS, Checkpoint, begin_checkpoint, damaged, finish_checkpoint, load_optimizer_state,
                                   load_weights, reason, restore_rng, save_checkpoint, save_sharded_rest,
                                   shard_world)
from verirl.run.shards import Shards, load_model_blocks, local_blocks, named_tensors, optimizer_state, write_rank, writers
from verirl.run.rundir import last_good, raise_write_failure
from verirl.run.runlog import RunLog, complete_line
from verirl.train.build import Run
from verirl.train.pipelined import load_optimizer_state as load_stage_optimizer_state
from verirl.train.pipelined import optimizer_state as stage_optimizer_state
from verirl.train.pipelined import pipeline_of, whole_model
from verirl.train.strategy import (full_optimizer_state, full_state_dict, is_sharded, nonfinite_parameter,
                                   shard_optimizer_state, shard_state_dict)


class NonFiniteTraining(UserError):
    """The update went non-finite (training diverged): the run stops, its last good checkpoint intact."""
    kind = "training diverged"


def checkpoint_due(run: Run, step: int) -> bool:
    return bool(run.checkpoints.every and step % run.checkpoints.every == 0) or step == run.total_steps


def checkpoint_format(run: Run) -> str:
    """"whole" or "sharded": ``trainer.checkpoint_format``, where auto is sharded when the actor's
    parameters are split across ranks (FSDP2 over more than one rank, tensor, pipeline or expert parallel). A LoRA
    run's checkpoints hold its adapters only: whole (gathered, they are small)."""
    chosen = run.cfg.trainer.checkpoint_format
    if is_lora(run.model):
        return "whole"
    if chosen != "auto":
        return chosen
    d = run.dist
    split = (is_sharded(run.model) and d.world > 1) or d.tp_world > 1 or d.pp_world > 1 or d.ep_world > 1
    return "sharded" if split else "whole"


def save(run: Run, step: int, log: RunLog, summary: dict) -> Path:
    """A checkpoint of ``step``: weights, optimizer, sampler position, RNG states, log offsets,
    non-finite step counts. Never from non-finite weights."""
    bad = nonfinite_parameter(run.model, run.dist)
    if bad is not None:
        raise NonFiniteTraining(f"after step {step} the weights are not finite ({bad} holds inf or NaN), so no "
                                f"checkpoint was written; {last_good(run.run_dir)}. Lower actor.lr (or raise "
                                f"actor.warmup_steps) and resume.")
    extra = {"sampler": run.sampler.state_dict(), **log.offsets(), "eval_start": summary.get("eval_start"),
             "run_dir": str(run.run_dir.resolve()), "config": to_dict(run.cfg),
             "nonfinite_steps": run.nonfinite.total, "nonfinite_in_a_row": run.nonfinite.in_a_row}
    if run.step.separate:  # an asynchronous run's answered steps after this one (`RolloutSource.queued`), rank 0's
        from verirl.train.async_source import queue_state
        from verirl.train.distributed import on_rank0

        queued = on_rank0(run.dist, lambda wait_s: run.source.queued(step, wait_s))
        extra["async_queue"] = queue_state(queued) if run.dist.is_main else []
    if checkpoint_format(run) == "sharded":
        return _save_sharded(run, step, extra)
    pipe = pipeline_of(run.model)
    lora = is_lora(run.model)  # the adapters alone: the base is model.path's, unchanged
    with whole_model(run.model):  # every rank; the tensors outlive the block (a pipelined model's frees only its own)
        weights = full_state_dict(run.model, only=is_adapter_key if lora else None)
    optimizer_state = stage_optimizer_state(pipe, run.optimizer) if pipe else full_optimizer_state(run.optimizer)
    try:
        path = None
        if run.dist.is_main:
            path = save_checkpoint(run.run_dir / "checkpoints", step, run.model, run.tokenizer, run.stop_ids,
                                   weights, optimizer_state, run.scheduler.state_dict(), extra,
                                   keep=run.checkpoints.keep, adapter_base=base_path(run.cfg.model.path) if lora else None)
        return run.dist.broadcast(path)  # the other ranks wait until it is written
    except Exception as e:  # OSError, or torch's / safetensors' own error types around the OS error
        raise_write_failure(run.run_dir, f"the checkpoint of step {step}", e)


def _held(model) -> Callable[[torch.Tensor], bool]:
    """Whether this rank holds a tensor of ``model``: all of them, but for a pipelined model's parameters
    of other ranks' stages (freed here)."""
    pipe = pipeline_of(model)
    return (lambda t: True) if pipe is None else pipe.holds


def _save_sharded(run: Run, step: int, extra: dict) -> Path:
    """Every rank writes its blocks into ``step_N.tmp/shards``; once all have, rank 0 writes the rest and
    renames the checkpoint into place. A failure on any rank stops every rank with it, the previous
    checkpoint left as it was."""
    d, what = run.dist, f"the checkpoint of step {step}"
    root = run.run_dir / "checkpoints"
    blocks = local_blocks(run.model, run.optimizer, _held(run.model))
    mine = writers(d.gather([(b.key, b.offset, b.size) for b, _ in blocks], world=True))[d.rank]
    blocks = [(b, t) for b, t in blocks if (b.key, b.offset, b.size) in mine]
    tied = {alias: names[0] for names, _ in named_tensors(run.model) for alias in names[1:]}
    own: Optional[BaseException] = None

    tmp = None
    if d.is_main:
        try:
            tmp = begin_checkpoint(root, step)
        except Exception as e:  # noqa: BLE001 - told to every rank below, raised on this one
            own = e
    tmp = d.broadcast(tmp)
    if tmp is not None:
        try:
            write_rank(tmp, d.rank, d.world, blocks, tied)
            if os.environ.get("VERIRL_TEST_KILL_IN_SAVE") == f"{step}:{d.rank}":  # tests: a rank dies mid-save
                os.kill(os.getpid(), signal.SIGKILL)
        except Exception as e:  # noqa: BLE001
            own = e
    failed = [(r, why) for r, why in enumerate(d.gather(None if own is None else reason(own), world=True)) if why]
    path = None
    if not failed and d.is_main:
        try:
            layout = {"world": d.world, "dp": d.dp_world, "tp": d.tp_world, "sp": d.sp_world, "pp": d.pp_world,
                      "ep": d.ep_world}
            save_sharded_rest(tmp, step, run.model, run.tokenizer, run.stop_ids,
                              run.optimizer.state_dict()["param_groups"], run.scheduler.state_dict(), layout, extra)
            path = finish_checkpoint(root, tmp, step, run.checkpoints.keep)
        except Exception as e:  # noqa: BLE001
            own = e
    if not failed:
        path = d.broadcast(path if own is None else None)
        failed = [] if path is not None else [(0, reason(own) if own is not None else "")]
    if own is not None:
        raise_write_failure(run.run_dir, what, own)
    if failed:
        rank, why = failed[0]
        raise CheckpointError(f"rank {rank} could not write its part of {what} ({why}); {last_good(run.run_dir)}.")
    return path


def restore_training_state(ckpt: Checkpoint, model, optimizer, scheduler) -> None:
    """Weights (safetensors), optimizer and scheduler (weights_only), RNG states: in place, laid out as
    ``model``'s shards when it is sharded. Any file that fails to load is a CheckpointError naming it,
    the library's error chained."""
    world = shard_world(ckpt.path)
    if world:
        _restore_sharded(ckpt, world, model, optimizer, scheduler)
        return
    weights = load_weights(ckpt)
    adapters = ckpt.state.get("weights") == ADAPTERS  # model/ is a peft adapter directory
    if adapters != is_lora(model):
        rank = ((ckpt.state.get("config") or {}).get("actor") or {}).get("lora", {}).get("rank")
        saved = f"LoRA adapters (rank {rank})" if adapters else "a whole model"
        raise CheckpointError(f"{ckpt.path} holds {saved}, and this run trains "
                              f"{'LoRA adapters' if is_lora(model) else 'the whole model'}: resume with the "
                              f"checkpoint's actor.lora.rank, or start a new run directory.")
    if adapters:
        weights = from_peft_names(weights)
    held = _held(model)
    own = model.state_dict(keep_vars=True)
    weights = {k: v for k, v in weights.items() if k not in own or held(own[k])}  # pipelined: this rank's stages
    try:
        missing, unexpected = model.load_state_dict(shard_state_dict(model, weights), strict=False)
    except RuntimeError as e:  # shapes that differ
        raise CheckpointError(f"{ckpt.model_dir}: the weights do not fit the model: {reason(e)}. Was the "
                              f"checkpoint saved from another model.path?") from e
    missing = [k for k in missing if held(own[k]) and (not adapters or is_adapter_key(k))]  # LoRA: base from model.path
    tied = {k for k in missing if k.endswith("lm_head.weight")} if model.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"{ckpt.model_dir}: weights do not fit the model (missing {sorted(set(missing) - tied)[:3]}, "
                              f"unexpected {sorted(unexpected)[:3]}).")
    if tied and not is_sharded(model):  # a sharded model keeps its tie: one parameter under both names
        model.tie_weights()
    try:
        opt = load_optimizer_state(ckpt)
        if pipeline_of(model) is not None:
            load_stage_optimizer_state(pipeline_of(model), optimizer, opt["optimizer"])
        else:
            optimizer.load_state_dict(shard_optimizer_state(optimizer, opt["optimizer"]))
        scheduler.load_state_dict(opt["scheduler"])
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; none may pass as a traceback
        raise damaged(ckpt.path / "optimizer.pt", "the optimizer and scheduler state", e) from e
    restore_rng(ckpt)


def _restore_sharded(ckpt: Checkpoint, world: int, model, optimizer, scheduler) -> None:
    """A sharded checkpoint into this rank: each tensor it holds (and its optimizer state) assembled from
    the saved pieces that overlap it, whatever layout wrote them."""
    shards = Shards(ckpt.path, world)
    held = _held(model)
    found = load_model_blocks(shards, model, held)
    try:
        opt = load_optimizer_state(ckpt)
        groups = opt["optimizer"]["param_groups"]
    except Exception as e:  # noqa: BLE001 - torch raises many kinds; none may pass as a traceback
        raise damaged(ckpt.path / "optimizer.pt", "the optimizer and scheduler state", e) from e
    state = optimizer_state(shards, optimizer, found, held, groups)
    try:
        optimizer.load_state_dict(state)
        scheduler.load_state_dict(opt["scheduler"])
    except Exception as e:  # noqa: BLE001
        raise damaged(ckpt.path / "optimizer.pt", "the optimizer and scheduler state", e) from e
    restore_rng(ckpt)


def check_shared_run_dir(run_dir: Path, dist) -> None:
    """With more than one rank: the run directory is one that every rank sees (each writes its pieces of a
    sharded checkpoint there, and rank 0 renames them into place). Rank 0 writes a token file into it and
    every rank reads it back; one paragraph naming the ranks that cannot."""
    if not dist.active:
        return
    token = dist.broadcast(uuid.uuid4().hex)
    probe = Path(run_dir) / f".shared-check-{token}"
    wrote = None
    if dist.is_main:
        try:
            probe.write_text(token)
            with open(probe, "rb") as f:
                os.fsync(f.fileno())
        except OSError as e:
            wrote = f"{type(e).__name__}: {e.strerror or e}"
    wrote = dist.broadcast(wrote)
    try:
        seen = probe.read_text() == token
    except (OSError, UnicodeDecodeError):
        seen = False
    every = dist.gather((seen, socket.gethostname()), world=True)
    if dist.is_main:
        probe.unlink(missing_ok=True)
    blind = [f"rank {r} ({host})" for r, (ok, host) in enumerate(every) if not ok]
    if wrote or blind:
        raise CheckpointError(
            f"trainer.run_dir {run_dir} is not one directory that every rank sees: "
            + (f"rank 0 could not write {probe.name} into it ({wrote})" if wrote else
               f"rank 0 ({every[0][1]}) wrote {probe.name} into it, and {', '.join(blind)} cannot read it there")
            + ". Every rank writes its own pieces of each checkpoint into the run directory and rank 0 renames "
              "them into place, so it must be on a file system every node mounts at the same path (NFS, Lustre, "
              "a cloud file store): set trainer.run_dir to such a path on every node.")


def final_checkpoint(run: Run) -> Optional[Path]:
    """The sharded checkpoint that holds the weights the run ends with (the one of its last step, or the
    checkpoint it resumed from when that was past the last step), or None: then the final model is
    gathered. Decided on rank 0, the same on every rank."""
    resume = run.checkpoints.resume
    if resume is not None and resume.step >= run.total_steps:
        path = resume.path
    elif checkpoint_format(run) == "sharded":
        path = run.run_dir / "checkpoints" / f"step_{run.total_steps:06d}"
    else:
        return None
    sharded = run.dist.broadcast(shard_world(path) is not None if run.dist.is_main else None)
    return path if sharded else None


def restore(run: Run, log: RunLog) -> int:
    """Restore the checkpoint to continue from (if any) and open the logs where it left them; -> the
    first step to run."""
    check_shared_run_dir(run.run_dir, run.dist)
    ckpt = run.checkpoints.resume
    if ckpt is None:
        log.open(0, 0, to_dict(run.cfg))  # no checkpoint yet: the run starts over
        return 1
    restore_training_state(ckpt, run.model, run.optimizer, run.scheduler)
    apply_optimizer_settings(run)
    run.sampler.load_state_dict(ckpt.state["sampler"])
    run.nonfinite.total = ckpt.state.get("nonfinite_steps", 0)
    run.nonfinite.in_a_row = ckpt.state.get("nonfinite_in_a_row", 0)
    own = ckpt.path.resolve().parent.parent == run.run_dir.resolve()  # its logs are the ones in run_dir
    log.open(ckpt.state["metrics_bytes"] if own else 0, ckpt.state.get("rollouts_bytes", 0) if own else 0,
             to_dict(run.cfg))
    changed = config_changes(upgrade_dict(ckpt.state.get("config") or {}), to_dict(run.cfg))
    listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed)
    if ckpt.step >= run.total_steps:
        log.print(complete_line(run.run_dir, ckpt.step, run.total_steps, listed))
        return ckpt.step + 1
    log.print(f"resuming from {ckpt.path} (step {ckpt.step}); next step {ckpt.step + 1}")
    if changed:
        log.print(f"[yellow]settings differ from the checkpoint's run[/] (the new values apply from here on): {listed}")
    return ckpt.step + 1


def apply_optimizer_settings(run: Run) -> None:
    """The loaded optimizer state carries the old run's lr / betas / weight decay (and its fused /
    for-each choice, which depends on the device it ran on): put this run's in (the same values when
    nothing changed, so an unchanged resume stays exact)."""
    adamw = run.optimizer_settings
    impl = {k: run.optimizer.defaults.get(k) for k in ("fused", "foreach")}  # this machine's, not the saver's
    run.scheduler.base_lrs = [adamw.lr] * len(run.optimizer.param_groups)
    for g, fn in zip(run.optimizer.param_groups, run.scheduler.lr_lambdas):
        g.update(initial_lr=adamw.lr, lr=adamw.lr * fn(run.scheduler.last_epoch), betas=tuple(adamw.betas),
                 weight_decay=adamw.weight_decay, **impl)


IGNORED_ON_RESUME = {"trainer.total_steps", "trainer.resume", "trainer.overwrite", "trainer.run_dir",
                     "log.progress", "log.console_every", "log.backends", "log.project", "log.run_name",
                     "trainer.stall_timeout_s", "trainer.on_stall", "trainer.peak_flops"}


def config_changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(key, old, new) for every setting that differs, but the ones that may change on a resume."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b, key = old.get(k), new.get(k), prefix + k
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, key + ".")
        elif a != b and key not in IGNORED_ON_RESUME:
            out.append((key, a, b))
    return out
