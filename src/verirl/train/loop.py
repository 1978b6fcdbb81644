"""The life of one rank: build, start (resume, evaluate), the loop of steps, finish (final model,
evaluate, summary).

`train_rank` is that life; `verirl.train.step.train_step` is one step of it; `verirl.launch.run`
starts the ranks and calls it in each. `verirl.run.runlog.RunLog` writes the run's logs and prints;
`verirl.train.checkpoint` saves and restores: the seams where a data-parallel run lets rank 0 alone
write.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from rich.console import Console

from verirl.config import Config, to_yaml
from verirl.models import save_hf
from verirl.models.device import resolve_device
from verirl.run.checkpoint import export_model_dir, load_checkpoint
from verirl.run.display import algorithm_name
from verirl.run.jsonl import mean_of
from verirl.run.rundir import last_good, raise_write_failure, write_text
from verirl.run.runlog import RunLog, mixed_precision_line, val_line
from verirl.run.signals import StopSignals, rank_signals
from verirl.train import distributed
from verirl.train.build import Run, build_run, log_settings
from verirl.train.checkpoint import NonFiniteTraining, checkpoint_due, final_checkpoint, restore, save
from verirl.train.distributed import Dist
from verirl.train.evaluate import evaluate, val_metrics
from verirl.train.step import train_step
from verirl.train.pipelined import parameter_count, whole_model
from verirl.train.strategy import full_state_dict, full_weights


class TrainingInterrupted(Exception):
    """SIGINT / SIGTERM: a checkpoint was saved at a step boundary and the run stopped."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint {checkpoint}. "
                         f"Run the same command again to continue (trainer.resume=auto).")


def join(cfg: Config) -> Dist:
    """This process's rank: the process group its launcher set up, or `Dist.single()` alone."""
    return distributed.init(resolve_device(cfg.model.device), cfg.trainer.dist_timeout_s,
                            cfg.actor.tensor_parallel_size, cfg.actor.sequence_parallel_size,
                            cfg.actor.pipeline_parallel_size, cfg.actor.expert_parallel_size)


def train_rank(cfg: Config, dist: Dist, console: Optional[Console] = None) -> dict:
    """Train this rank to ``trainer.total_steps``; returns the run summary (also written to summary.json).

    Checkpoints every ``trainer.save_freq`` steps and at the end; continues from the newest one
    with ``trainer.resume=auto``. SIGINT / SIGTERM save a checkpoint and raise TrainingInterrupted.
    ``cfg`` has been checked (`verirl.launch.run`)."""
    started = time.time()
    run, log = open_run(cfg, dist, console or Console())
    watch = run.watchdog.start()
    try:
        with watch.phase("start"):
            first, summary = start(run, log)
        with rank_signals(log.console.print) as signals, log.progress(run.total_steps, done=first - 1):
            for step in range(first, run.total_steps + 1):
                watch.step = step
                with watch.phase("step"):  # train_step's phases nest inside; the rest of the step beats here
                    one_step(run, log, signals, summary, step)
        with watch.phase("finish"):
            return finish(run, log, summary, started)
    except OSError as e:  # a full disk or a read-only run directory while writing logs or the final model
        raise_write_failure(run.run_dir, "the run's logs or final model", e)
    finally:
        watch.stop()
        log.close()
        if run.source is not None:
            run.source.close()  # the producers
        run.scorer.close()
        if run.environments is not None:
            run.environments.close()  # the tools' worker processes
        run.lock.release()
        run.engine.close()  # vLLM: before the process group goes (it tears down its groups)
        distributed.close(run.dist)


def one_step(run: Run, log: RunLog, signals: StopSignals, summary: dict, step: int) -> None:
    """Train ``step``, evaluate when due, log it, and checkpoint when due or asked to stop."""
    watch = run.watchdog
    metrics, records = train_step(run, step)
    too_many = count_nonfinite(run, metrics)  # the reason to stop, if too many in a row
    if run.eval.due(step, run.total_steps) and not too_many:
        with watch.phase("evaluation"), log.status(f"held-out evaluation after step {step}..."):
            metrics.update(evaluate_run(run))
        log.print(f"step {step} held-out: {val_line(metrics)}")
    log.write(metrics, records)
    if too_many:
        raise NonFiniteTraining(too_many)
    signum = int(run.dist.all_max([signals.signum], world=True)[0])  # every rank stops after the same step
    if signum or checkpoint_due(run, step):
        with watch.phase("checkpoint"):
            path = save(run, step, log, summary)
        if signum:
            raise TrainingInterrupted(signum, step, path)


def open_run(cfg: Config, dist: Dist, console: Console) -> tuple[Run, RunLog]:
    """Build the run (a spinner while the model and data load) and its log; the hang watchdog reports
    through the log on rank 0, on stderr elsewhere."""
    log = RunLog(Path(cfg.trainer.run_dir), cfg.trainer.dump_rollouts, console, log_settings(cfg), enabled=dist.is_main)
    loading = log.mode == "rich" and dist.is_main
    say = log.print if dist.is_main else (lambda text: print(text, file=sys.stderr, flush=True))
    with console.status("loading the model and the data...") if loading else contextlib.nullcontext():
        run = build_run(cfg, dist, say)
    return run, log


def start(run: Run, log: RunLog) -> tuple[int, dict]:
    """Restore the run's checkpoint (if any), open its logs where the checkpoint left them, evaluate
    before the first step. -> (the first step to run, the summary so far)."""
    n_params = parameter_count(run.model)
    log.print(f"[bold]verirl[/] {algorithm_name(run.cfg.algo)}: model {run.cfg.model.path} ({n_params / 1e6:.2f}M params), "
              f"{run.step.prompts_per_step} prompts x {run.step.group_size} samples/step, {run.total_steps} "
              f"steps, run dir {run.run_dir}")
    low = run.step.update.forward.compute_dtype
    if low is not None:
        log.print(mixed_precision_line(run.cfg, low))
    first = restore(run, log)
    run.engine.sync_weights(run.model)  # an engine with its own weights (vLLM) starts from the restored ones
    if run.step.separate and first <= run.total_steps:
        start_producers(run, first, log)
    if run.dist.is_main:
        write_text(run.run_dir / "config.yaml", to_yaml(run.cfg))  # only once the checkpoint has restored
    summary: dict = {"run_dir": str(run.run_dir), "params": n_params}
    resume = run.checkpoints.resume
    if resume is not None and resume.state.get("eval_start"):
        summary["eval_start"] = resume.state["eval_start"]
    elif run.eval.before_train and run.eval.prompts and first == 1:
        with log.status("held-out evaluation before training..."):
            summary["eval_start"] = evaluate_run(run)
        log.write({"step": 0, **summary["eval_start"]})
        log.print(f"held-out at start ({len(run.eval.prompts)} problems): {val_line(summary['eval_start'])}")
    return first, summary


def start_producers(run: Run, first: int, log: RunLog) -> None:
    """rollout.placement=separate: trainer rank 0 starts the producers (`verirl.train.async_source`) from
    the weights this run starts with (version first - 1), the prompt sampler where the checkpoint left it,
    and the answered steps the checkpoint kept. Every trainer rank takes part in gathering the weights."""
    from verirl.train.async_source import RolloutSource, queue_from_state
    from verirl.train.distributed import on_rank0

    with whole_model(run.model):
        weights = full_state_dict(run.model)
        if run.dist.is_main:
            resume = run.checkpoints.resume
            queued = queue_from_state(resume.state.get("async_queue")) if resume is not None else []
            run.source = RolloutSource(run.cfg, weights, log.print)
            run.source.start(first, run.sampler.position, first - 1, weights, queued)
    with log.status(f"starting {run.cfg.rollout.nproc} producer process(es)..."):  # closed by the loop if it fails
        on_rank0(run.dist, lambda wait_s: run.source.ready(wait_s))


def finish(run: Run, log: RunLog, summary: dict, started: float) -> dict:
    """Write the final model, evaluate after the last step (unless the loop just did), write and
    print the summary."""
    history = log.history
    source = final_checkpoint(run)
    if source is not None:  # a sharded checkpoint of these weights: rank 0 exports it, nothing is gathered
        if run.dist.is_main:
            export_model_dir(load_checkpoint(source), run.run_dir / "final")
    else:
        with whole_model(run.model):  # gathered on every rank when sharded or pipelined; rank 0 writes
            weights = full_state_dict(run.model)
        if run.dist.is_main:
            save_hf(run.model, run.tokenizer, run.run_dir / "final", run.stop_ids, weights)
    k = min(5, len(history))
    summary.update({
        "steps": len(history), "train_seconds": sum(m["timing/all"] for m in history),
        "reward_first5": mean_of(history, "reward/mean", first=k),
        "reward_last5": mean_of(history, "reward/mean", last=k),
        "final_model": str(run.run_dir / "final"),
        # this device's matmul peak behind perf/mfu: what a training time is scaled by between machines
        "peak_gflops": run.step.peak_flops / 1e9,
        "device": run.device,  # and which device that is
    })
    if run.eval.at_end and run.eval.prompts:
        summary["eval_end"] = end_evaluation(run, log)
    summary["wall_seconds"] = time.time() - started
    log.summary(summary, len(run.eval.prompts), run.eval.n)
    return summary


def end_evaluation(run: Run, log: RunLog) -> dict[str, float]:
    """val/... after the last step: the loop's own when the log's last step is the last step and holds
    them, else evaluated now (e.g. a run resumed after its last step). Only rank 0 keeps the log, so its
    answer is sent to every rank: the evaluation is a collective that every rank enters, or none."""
    history = log.history
    last = history[-1] if history and history[-1].get("step") == run.total_steps else {}
    end = run.dist.broadcast({key: v for key, v in last.items() if key.startswith("val/")})
    if not end:
        with log.status("held-out evaluation after training..."):
            end = evaluate_run(run)
    return end


def evaluate_run(run: Run) -> dict[str, float]:
    """val/... metrics of the current model on the run's held-out prompts, split across the ranks
    (each evaluates its share; the rows are gathered), the same on every rank. With model parallelism
    the shares are the decoders' (`Dist.decoders`: every rank of a data-parallel coordinate, or each of
    its tensor-parallel groups decoding on the plan), so no two decode the same prompts."""
    e, dist = run.eval, run.dist
    engine = run.eval_engine or run.engine
    split = getattr(engine, "split", False)  # a tensor-parallel group decodes together on its plan
    me, shares = dist.decoders(split)
    place, places = dist.dp_rank * shares + me, dist.dp_world * shares
    share = -(-len(e.prompts) // places)
    first = place * share

    def gather(rows: list) -> list:
        every = dict(dist.gather((place, rows), world=True)) if places > 1 else {place: rows}
        return [r for p in sorted(every) for r in every[p]]  # a group's ranks sent the same rows: kept once

    # decoding reads whole weights (or, an engine on the tensor-parallel plan, this rank's): no weight collective inside
    with whole_model(run.model), full_weights(run.model, split=split):
        return val_metrics(evaluate(engine, run.tokenizer, e.prompts[first:first + share], run.scorer, n=e.n,
                                    max_new_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p,
                                    top_k=e.top_k, greedy=e.greedy,
                                    seed=e.seed, first_index=first, gather=gather,
                                    multi_turn=run.multi_turn if run.eval_engine is None else None))


def count_nonfinite(run: Run, metrics: dict) -> str:
    """Count a step whose update was skipped for a non-finite loss or grad norm (`update_policy` took
    no optimizer or scheduler step); ``actor/nonfinite_steps`` is the run's total so far. After
    ``trainer.max_nonfinite_steps`` such steps in a row, returns why the run must stop (else "")."""
    count = run.nonfinite
    if metrics.get("actor/nonfinite_updates", 0) > 0:
        count.total += 1
        count.in_a_row += 1
    else:
        count.in_a_row = 0
    metrics["actor/nonfinite_steps"] = float(count.total)
    if not count.limit or count.in_a_row < count.limit:
        return ""
    return (f"{count.in_a_row} steps in a row (up to step {metrics['step']}) had a non-finite loss or "
            f"grad norm, so their updates were skipped (trainer.max_nonfinite_steps={count.limit}); "
            f"{last_good(run.run_dir)}. Lower actor.lr, check the model's weights and the rewards (reward/errors), or "
            f"raise trainer.max_nonfinite_steps.")
