"""The run's checkpoint policy and its resume: when a checkpoint is written and what goes into it
(never non-finite weights), and how a run continues from one. The model's and the optimizer's
states are gathered whole here (every rank takes part) and laid out again as the model's shards on
resume; `verirl.run.checkpoint` writes, verifies and reads the files."""
from __future__ import annotations

from pathlib import Path

from verirl.config import to_dict, upgrade_dict
from verirl.core.errors import CheckpointError, UserError
from verirl.run.checkpoint import (Checkpoint, damaged, load_optimizer_state, load_weights, reason, restore_rng,
                                   save_checkpoint)
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
    pipe = pipeline_of(run.model)
    with whole_model(run.model):  # every rank; the tensors outlive the block (a pipelined model's frees only its own)
        weights = full_state_dict(run.model)
    optimizer_state = stage_optimizer_state(pipe, run.optimizer) if pipe else full_optimizer_state(run.optimizer)
    try:
        path = None
        if run.dist.is_main:
            path = save_checkpoint(run.run_dir / "checkpoints", step, run.model, run.tokenizer, run.stop_ids,
                                   weights, optimizer_state, run.scheduler.state_dict(), extra,
                                   keep=run.checkpoints.keep)
        return run.dist.broadcast(path)  # the other ranks wait until it is written
    except Exception as e:  # OSError, or torch's / safetensors' own error types around the OS error
        raise_write_failure(run.run_dir, f"the checkpoint of step {step}", e)


def restore_training_state(ckpt: Checkpoint, model, optimizer, scheduler) -> None:
    """Weights (safetensors), optimizer and scheduler (weights_only), RNG states: in place, laid out as
    ``model``'s shards when it is sharded. Any file that fails to load is a CheckpointError naming it,
    the library's error chained."""
    weights = load_weights(ckpt)
    try:
        with whole_model(model):  # a pipelined model: every parameter loaded, those of other stages freed after
            missing, unexpected = model.load_state_dict(shard_state_dict(model, weights), strict=False)
    except RuntimeError as e:  # shapes that differ
        raise CheckpointError(f"{ckpt.model_dir}: the weights do not fit the model: {reason(e)}. Was the "
                              f"checkpoint saved from another model.path?") from e
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


def restore(run: Run, log: RunLog) -> int:
    """Restore the checkpoint to continue from (if any) and open the logs where it left them; -> the
    first step to run."""
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
