"""The GRPO loop: start (resume, evaluate), the loop of steps, finish (final model, evaluate, summary).

`train` is the whole life of a run; `verirl.train.step.train_step` is one step of it. `RunLog`
writes the run's logs and summary and prints to the console; `save` and `finish` write
checkpoints and the final model: the seams where a data-parallel run lets rank 0 alone write.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

from rich.console import Console

from verirl.run.checks import check_train
from verirl.config import Config, to_dict, to_yaml, upgrade_dict
from verirl.core.errors import CheckpointError
from verirl.train.evaluate import evaluate, val_metrics
from verirl.run.jsonl import JsonlSink, mean_of, read_jsonl, truncate
from verirl.models import save_hf
from verirl.launch import launch
from verirl.models.device import resolve_device
from verirl.config.layout import world_size
from verirl.train import distributed
from verirl.train.build import Run, build_run
from verirl.train.settings import LogSettings
from verirl.run.display import Dashboard, algorithm_name, plain_console, progress_mode
from verirl.train.distributed import launched
from verirl.train.checkpoint import restore_training_state, save_checkpoint
from verirl.train.step import train_step
from verirl.train.strategy import full_optimizer_state, full_state_dict, full_weights, nonfinite_parameter
from verirl.run.watchdog import Watchdog


def train(cfg: Config, console: Optional[Console] = None) -> dict:
    """Run GRPO to ``trainer.total_steps``; returns the run summary (also written to summary.json).

    Checkpoints every ``trainer.save_freq`` steps and at the end; continues from the newest one
    with ``trainer.resume=auto``. SIGINT / SIGTERM save a checkpoint and raise TrainingInterrupted."""
    started = time.time()
    check_train(cfg)
    if (world_size(cfg) > 1 or cfg.trainer.launcher == "ray") and not launched():  # start the ranks; each runs this
        return launch(cfg)
    run, log, watch = open_run(cfg, console or Console())
    try:
        with watch.phase("start"):
            first, summary = start(run, log)
        with _Signals(log.console) as signals, log.progress(run.total_steps, done=first - 1):
            for step in range(first, run.total_steps + 1):
                watch.step = step
                with watch.phase("step"):  # train_step's phases nest inside; the rest of the step beats here
                    one_step(run, log, signals, summary, step)
        with watch.phase("finish"):
            return finish(run, log, summary, started)
    except OSError as e:  # a full disk or a read-only run directory while writing logs or the final model
        _raise_write_failure(run, e)
    finally:
        watch.stop()
        log.close()
        run.scorer.close()
        run.lock.release()
        run.engine.close()  # vLLM: before the process group goes (it tears down its groups)
        distributed.close(run.dist)


def one_step(run: Run, log: "RunLog", signals: "_Signals", summary: dict, step: int) -> None:
    """Train ``step``, evaluate when due, log it, and checkpoint when due or asked to stop."""
    watch = run.watchdog
    metrics, records = train_step(run, step)
    too_many = count_nonfinite(run, metrics)  # the reason to stop, if too many in a row
    if run.eval.due(step, run.total_steps) and not too_many:
        with watch.phase("evaluation"), log.status(f"held-out evaluation after step {step}..."):
            metrics.update(evaluate_run(run))
        log.print(f"step {step} held-out: {_val_line(metrics)}")
    log.write(metrics, records)
    if too_many:
        raise NonFiniteTraining(too_many)
    signum = _signalled(run, signals)  # every rank stops after the same step
    if signum or _checkpoint_due(run, step):
        with watch.phase("checkpoint"):
            path = save(run, step, log, summary)
        if signum:
            raise TrainingInterrupted(signum, step, path)


def open_run(cfg: Config, console: Console) -> tuple[Run, "RunLog", Watchdog]:
    """Build the run (a spinner while the model and data load), its log and its hang watchdog."""
    loading = progress_mode(cfg.log.progress, console) == "rich" and os.environ.get("RANK", "0") == "0"
    with console.status("loading the model and the data...") if loading else contextlib.nullcontext():
        run = build_run(cfg, distributed.init(resolve_device(cfg.model.device), cfg.trainer.dist_timeout_s))
    log = RunLog(run.run_dir, run.step.dump_rollouts, console, run.log, enabled=run.dist.is_main)
    say = log.print if run.dist.is_main else (lambda text: print(text, file=sys.stderr, flush=True))
    run.watchdog = Watchdog(run.run_dir, run.dist.rank, cfg.trainer.stall_timeout_s, cfg.trainer.on_stall,
                            run.scorer.outstanding, say).start()
    return run, log, run.watchdog


def start(run: Run, log: "RunLog") -> tuple[int, dict]:
    """Restore the run's checkpoint (if any), open its logs where the checkpoint left them, evaluate
    before the first step. -> (the first step to run, the summary so far)."""
    n_params = sum(p.numel() for p in run.model.parameters())
    log.print(f"[bold]verirl[/] {algorithm_name(run.cfg.algo)}: model {run.cfg.model.path} ({n_params / 1e6:.2f}M params), "
              f"{run.step.prompts_per_step} prompts x {run.step.group_size} samples/step, {run.total_steps} "
              f"steps, run dir {run.run_dir}")
    low = run.step.update.forward.compute_dtype
    if low is not None:
        log.print(mixed_precision_line(run.cfg, low))
    first = restore(run, log)
    run.engine.sync_weights(run.model)  # an engine with its own weights (vLLM) starts from the restored ones
    if run.dist.is_main:
        _write(run.run_dir / "config.yaml", to_yaml(run.cfg))  # only once the checkpoint has restored
    summary: dict = {"run_dir": str(run.run_dir), "params": n_params}
    if run.resume is not None and run.resume.state.get("eval_start"):
        summary["eval_start"] = run.resume.state["eval_start"]
    elif run.eval.before_train and run.eval.prompts and first == 1:
        with log.status("held-out evaluation before training..."):
            summary["eval_start"] = evaluate_run(run)
        log.write({"step": 0, **summary["eval_start"]})
        log.print(f"held-out at start ({len(run.eval.prompts)} problems): {_val_line(summary['eval_start'])}")
    return first, summary


def mixed_precision_line(cfg, low) -> str:
    """What model.compute_dtype turned on, said at start; and what it costs the rollout log-prob check when
    the engine decodes in the weights' dtype."""
    low, engine = str(low).removeprefix("torch."), cfg.rollout.engine
    what = "the log-prob passes, the update and the native engine's products" if engine == "native" else \
        "the log-prob passes and the update"
    line = (f"mixed precision (model.compute_dtype={cfg.model.compute_dtype}): {what} multiply in {low} over "
            f"{cfg.model.dtype} weights")
    if engine == "hf":
        line += f"; the hf engine decodes in {cfg.model.dtype}, so rollout/logprob_diff shows {low}'s rounding (up to ~0.1)"
    elif engine == "vllm" and cfg.rollout.dtype in (None, cfg.model.dtype):
        line += (f"; vLLM decodes in {cfg.model.dtype}, so rollout/logprob_diff shows {low}'s rounding (up to ~0.1) "
                 f"while rollout/push_max_abs_diff checks each weight push itself; rollout.dtype=compute makes vLLM "
                 f"decode in {low} too")
    return line


def finish(run: Run, log: "RunLog", summary: dict, started: float) -> dict:
    """Write the final model, evaluate after the last step (unless the loop just did), write and
    print the summary."""
    history = log.history
    weights = full_state_dict(run.model)  # gathered on every rank when sharded; rank 0 writes
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


def end_evaluation(run: Run, log: "RunLog") -> dict[str, float]:
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
    (each evaluates its share; the rows are gathered), the same on every rank."""
    e, dist = run.eval, run.dist
    share = -(-len(e.prompts) // dist.world)
    first = dist.rank * share
    engine = run.eval_engine or run.engine
    with full_weights(run.model):  # decoding reads whole weights: no weight collective inside
        return val_metrics(evaluate(engine, run.tokenizer, e.prompts[first:first + share], run.scorer, n=e.n,
                                    max_new_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p,
                                    top_k=e.top_k, greedy=e.greedy,
                                    seed=e.seed, first_index=first,
                                    gather=lambda rows: [r for part in dist.gather(rows) for r in part]))


def _signalled(run: Run, signals: "_Signals") -> int:
    """The signal that asked the run to stop (0: none), agreed by every rank."""
    return int(run.dist.all_max([signals.signum or 0])[0])


class RunLog:
    """What a run writes while it trains, and nothing else writes: RUN_DIR/metrics.jsonl (one line per
    step, step 0 = the evaluation before training), the optional RUN_DIR/rollouts.jsonl,
    RUN_DIR/summary.json, the history of step metrics, and the console (messages, progress bar, a
    metrics line every ``console_every`` steps, the final table)."""

    def __init__(self, run_dir: Path, dump_rollouts: bool, console: Console, settings: LogSettings,
                 enabled: bool = True):
        """``enabled=False`` (every rank but 0): writes and prints nothing."""
        self.run_dir, self.settings, self.enabled = run_dir, settings, enabled
        self.mode = progress_mode(settings.progress, console)  # rich / plain / off
        self.console = plain_console(console) if self.mode == "plain" else console
        self.metrics_path, self.dump_path = run_dir / "metrics.jsonl", run_dir / "rollouts.jsonl"
        self.dump_rollouts = dump_rollouts
        self.sink: Optional[JsonlSink] = None
        self.dump: Optional[JsonlSink] = None
        self.history: list[dict] = []
        self._board: Optional[Dashboard] = None
        self._total = 0
        self.trackers = None  # log.backends beyond console and jsonl (`verirl.run.trackers`), rank 0 only

    def open(self, metrics_bytes: int, rollouts_bytes: int, config: Optional[dict] = None) -> None:
        """Cut the logs back to these sizes (where a checkpoint left them; 0 = start over) and open them.
        A log shorter than that has lost lines: said, and continued after what is there."""
        if not self.enabled:
            return
        logs = [(self.metrics_path, metrics_bytes)]
        if self.dump_rollouts or self.dump_path.exists():  # no empty rollouts.jsonl without trainer.dump_rollouts
            logs.append((self.dump_path, rollouts_bytes))
        for path, size in logs:
            held = truncate(path, size)
            if held < size:
                self.print(f"[yellow]{path} holds {held} bytes, fewer than the {size} the checkpoint recorded[/]: "
                           f"lines logged before the checkpoint were lost (deleted or cut); new steps are "
                           f"appended after what is there.")
        self.sink = JsonlSink(self.metrics_path)
        self.dump = JsonlSink(self.dump_path) if self.dump_rollouts else None
        self.history = [r for r in read_jsonl(self.metrics_path) if r.get("step", 0) > 0]
        s = self.settings
        if set(s.backends) - {"console", "jsonl"}:
            from verirl.run.trackers import Trackers

            self.trackers = Trackers(s.backends, self.run_dir, s.project, s.run_name or self.run_dir.name, config,
                                     resume_step=self.history[-1]["step"] if self.history else 0)

    @contextlib.contextmanager
    def progress(self, total: int, done: int) -> Iterator[None]:
        """The live view (``rich``), shown while the loop runs."""
        self._total = total
        if not (self.enabled and self.mode == "rich"):
            yield
            return
        self._board = Dashboard(self.console, total, done)
        self._board.start()
        try:
            yield
        finally:
            self._board.stop()
            self._board = None

    def status(self, text: str):
        """A spinner while a long phase runs (evaluation); a plain line without a terminal."""
        if not self.enabled or self.mode == "off":
            return contextlib.nullcontext()
        if self.mode == "plain" or self._board is not None:
            self.print(text)
            return contextlib.nullcontext()
        return self.console.status(text)

    def print(self, text: str) -> None:
        if self.enabled:
            self.console.print(text, soft_wrap=True)

    def write(self, metrics: dict, records: list[dict] = ()) -> None:
        """Log one step (or the step-0 evaluation): its metrics line, its rollout records, the console."""
        if not self.enabled:
            return
        self.sink.write(metrics)
        for record in records if self.dump else ():
            self.dump.write(record)
        if self.trackers is not None:
            self.trackers.log(metrics, metrics["step"])
        if metrics["step"] == 0:
            return
        self.history.append(metrics)
        if self._board is not None:
            self._board.update(metrics, self.history)
        step, every = metrics["step"], self.settings.console_every
        if self.mode == "plain":  # one line per step
            self.print(f"{_step_line(metrics)}  [{step}/{self._total}]")
        elif every and (step % every == 0 or step == self._total):  # rich and off: every log.console_every steps
            self.print(_step_line(metrics))

    def offsets(self) -> dict[str, int]:
        """Bytes written to each log so far: where a run resumed from a checkpoint taken now continues."""
        if not self.enabled:
            return {"metrics_bytes": 0, "rollouts_bytes": 0}
        return {"metrics_bytes": self.sink.tell(), "rollouts_bytes": self.dump.tell() if self.dump else 0}

    def summary(self, summary: dict, n_val: int, n_samples: int) -> None:
        """Write RUN_DIR/summary.json and print the final table."""
        if not self.enabled:
            return
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        _print_summary(self.console, summary, n_val, n_samples)

    def close(self) -> None:
        for sink in (self.sink, self.dump):
            if sink is not None:
                sink.close()
        if self.trackers is not None:
            trackers, self.trackers = self.trackers, None
            try:
                trackers.close()
            except Exception as e:  # noqa: BLE001  (a tracker's server or files: the run itself is done)
                self.print(f"[yellow]log.backends: closing the trackers failed ({type(e).__name__}: {e}); "
                           f"metrics.jsonl holds every step.[/]")


def _checkpoint_due(run: Run, step: int) -> bool:
    return bool(run.save_freq and step % run.save_freq == 0) or step == run.total_steps


def save(run: Run, step: int, log: RunLog, summary: dict) -> Path:
    """A checkpoint of ``step``: weights, optimizer, sampler position, RNG states, log offsets,
    non-finite step counts. Never from non-finite weights."""
    bad = nonfinite_parameter(run.model, run.dist)
    if bad is not None:
        raise NonFiniteTraining(f"after step {step} the weights are not finite ({bad} holds inf or NaN), so no "
                                f"checkpoint was written; {_last_good(run)}. Lower actor.lr (or raise "
                                f"actor.warmup_steps) and resume.")
    extra = {"sampler": run.sampler.state_dict(), **log.offsets(), "eval_start": summary.get("eval_start"),
             "run_dir": str(run.run_dir.resolve()), "config": to_dict(run.cfg),
             "nonfinite_steps": run.nonfinite_steps, "nonfinite_in_a_row": run.nonfinite_in_a_row}
    weights, optimizer_state = full_state_dict(run.model), full_optimizer_state(run.optimizer)  # every rank
    try:
        path = None
        if run.dist.is_main:
            path = save_checkpoint(run.run_dir / "checkpoints", step, run.model, run.tokenizer, run.stop_ids,
                                   run.optimizer, run.scheduler, extra, keep=run.keep_checkpoints,
                                   weights=weights, optimizer_state=optimizer_state)
        return run.dist.broadcast(path)  # the other ranks wait until it is written
    except Exception as e:  # OSError, or torch's / safetensors' own error types around the OS error
        failure = _write_failure(run.run_dir, f"the checkpoint of step {step}", e, _last_good(run))
        if failure is e:
            raise
        raise failure from e


class NonFiniteTraining(CheckpointError):
    """The update went non-finite: the run stops, its last good checkpoint intact."""


def count_nonfinite(run: Run, metrics: dict) -> str:
    """Count a step whose update was skipped for a non-finite loss or grad norm (`update_policy` took
    no optimizer or scheduler step); ``actor/nonfinite_steps`` is the run's total so far. After
    ``trainer.max_nonfinite_steps`` such steps in a row, returns why the run must stop (else "")."""
    if metrics.get("actor/nonfinite_updates", 0) > 0:
        run.nonfinite_steps += 1
        run.nonfinite_in_a_row += 1
    else:
        run.nonfinite_in_a_row = 0
    metrics["actor/nonfinite_steps"] = float(run.nonfinite_steps)
    if not run.max_nonfinite_steps or run.nonfinite_in_a_row < run.max_nonfinite_steps:
        return ""
    return (f"{run.nonfinite_in_a_row} steps in a row (up to step {metrics['step']}) had a non-finite loss or "
            f"grad norm, so their updates were skipped (trainer.max_nonfinite_steps={run.max_nonfinite_steps}); "
            f"{_last_good(run)}. Lower actor.lr, check the model's weights and the rewards (reward/errors), or "
            f"raise trainer.max_nonfinite_steps.")


def _last_good(run: Run) -> str:
    latest = run.run_dir / "checkpoints" / "latest"
    if latest.exists():
        return f"the last checkpoint, {latest.read_text().strip()}, is intact"
    return "no checkpoint had been written yet"


def _raise_write_failure(run: Run, e: OSError) -> None:
    failure = _write_failure(run.run_dir, "the run's logs or final model", e, _last_good(run))
    if failure is e:
        raise e
    raise failure from e


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise _write_failure(path.parent, str(path), e, "") from e


def _write_failure(run_dir: Path, what: str, e: Exception, after: str) -> Exception:
    """A failed write as the user's problem (no space, no permission) or, if it is neither, the bug it is."""
    import errno
    import shutil as _shutil

    code, text = getattr(e, "errno", None), str(e)
    full = code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or any(
        s in text for s in ("No space left", "File too large", "Disk quota", "file write failed"))
    denied = code in (errno.EACCES, errno.EPERM, errno.EROFS) or any(
        s in text for s in ("Permission denied", "Read-only file system"))
    if not (full or denied):
        return e
    try:
        free = f"{_shutil.disk_usage(run_dir).free / 2**30:.1f} GB free there"
    except OSError:
        free = "free space unknown"
    why = "the disk is full (or a file size limit was hit)" if full else "it is not writable"
    return CheckpointError(f"could not write {what} into trainer.run_dir='{run_dir}': {why} ({free}; "
                           f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}){'; ' + after if after else ''}. "
                           f"Free space or fix the permissions and run the same command again, or choose "
                           f"another trainer.run_dir.")


def restore(run: Run, log: RunLog) -> int:
    """Restore the checkpoint to continue from (if any) and open the logs where it left them; -> the
    first step to run."""
    ckpt = run.resume
    if ckpt is None:
        log.open(0, 0, to_dict(run.cfg))  # no checkpoint yet: the run starts over
        return 1
    restore_training_state(ckpt, run.model, run.optimizer, run.scheduler)
    _apply_optimizer_settings(run)
    run.sampler.load_state_dict(ckpt.state["sampler"])
    run.nonfinite_steps = ckpt.state.get("nonfinite_steps", 0)
    run.nonfinite_in_a_row = ckpt.state.get("nonfinite_in_a_row", 0)
    own = ckpt.path.resolve().parent.parent == run.run_dir.resolve()  # its logs are the ones in run_dir
    log.open(ckpt.state["metrics_bytes"] if own else 0, ckpt.state.get("rollouts_bytes", 0) if own else 0,
             to_dict(run.cfg))
    changed = config_changes(upgrade_dict(ckpt.state.get("config") or {}), to_dict(run.cfg))
    listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed)
    if ckpt.step >= run.total_steps:
        log.print(complete_line(run, ckpt.step, listed))
        return ckpt.step + 1
    log.print(f"resuming from {ckpt.path} (step {ckpt.step}); next step {ckpt.step + 1}")
    if changed:
        log.print(f"[yellow]settings differ from the checkpoint's run[/] (the new values apply from here on): {listed}")
    return ckpt.step + 1


def complete_line(run: Run, step: int, changed: str) -> str:
    """What a run started on a finished one says: nothing trains, and how to train further or anew."""
    unused = f" The changed settings ({changed}) are not used." if changed else ""
    return (f"[bold yellow]the run in {run.run_dir} is complete[/]: its checkpoint is step {step} and "
            f"trainer.total_steps={run.total_steps}, so no step is trained.{unused} To train it further, raise "
            f"trainer.total_steps (e.g. trainer.total_steps={step + run.total_steps}); to train anew, give another "
            f"trainer.run_dir, or trainer.resume=false trainer.overwrite=true (deletes this run).")


def _apply_optimizer_settings(run: Run) -> None:
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


class TrainingInterrupted(Exception):
    """SIGINT / SIGTERM: a checkpoint was saved at a step boundary and the run stopped."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint {checkpoint}. "
                         f"Run the same command again to continue (trainer.resume=auto).")


class _Signals:
    """First SIGINT / SIGTERM: finish the step, checkpoint, stop. Second: exit at once. A signal this
    process was started ignoring stays ignored (the local launcher's ranks ignore SIGINT: a Ctrl-C, which
    reaches every process of the terminal, comes to them once, as the launcher's SIGTERM)."""

    def __init__(self, console):
        self.console, self.signum, self._old = console, None, {}

    def __enter__(self):
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum
        self.console.print(f"[bold yellow]{signal.Signals(signum).name}[/]: saving a checkpoint after this step, "
                           f"then stopping (send it again to stop at once, without saving).")

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _val_line(m: dict) -> str:
    return "  ".join(f"{k[4:]} {v:.3f}" for k, v in m.items() if k.startswith("val/") and k.count("/") == 1)


def _step_line(m: dict) -> str:
    rules = "  ".join(f"{k.split('/')[1]} {v:+.3f}" for k, v in m.items()
                      if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2)
    kl = f"  kl {m['actor/kl']:.4f}" if "actor/kl" in m else ""
    kept = f"  groups {m['filter/kept_groups']:.0f}/{m['filter/gen_batches']:.0f}b" if "filter/kept_groups" in m else ""
    masked = f"  masked {m['mismatch/masked_frac']:.1%}" if m.get("mismatch/masked_frac") else ""
    return (f"step {m['step']:>5}  reward {m['reward/mean']:+.3f}  {rules}  len {m['response_length/mean']:.1f}"
            f"{kl}  ent {m['actor/entropy']:.3f}{kept}{masked}  {m['timing/all']:.2f}s  tps {m['perf/tps']:.0f}")


def _print_summary(console, s: dict, n_val: int, n_samples: int) -> None:
    from rich.table import Table

    t = Table(title="verirl run summary", show_header=True)
    t.add_column("measure")
    t.add_column("start", justify="right")
    t.add_column("end", justify="right")
    t.add_column("change", justify="right")
    # with 5 steps or fewer the first 5 and the last 5 are the same steps: no change to show
    change = f"{s['reward_last5'] - s['reward_first5']:+.3f}" if s["steps"] > 5 else "too few steps"
    t.add_row("reward/mean (first 5 vs last 5 steps)", f"{s['reward_first5']:+.3f}", f"{s['reward_last5']:+.3f}", change)
    start, end = s.get("eval_start") or {}, s.get("eval_end") or {}
    for key, what in [("val/greedy_acc", f"held-out greedy_acc ({n_val} problems)"),
                      ("val/pass@1", f"held-out pass@1 ({n_val} problems x {n_samples})")]:
        if key in start and key in end:
            a, b = start[key], end[key]
            t.add_row(what, f"{a:.1%}", f"{b:.1%}", f"{(b - a) * 100:+.1f} pts")
    console.print(t)
    on = f" on {s['device']}" if s.get("device") else ""
    peak = f" (matmul peak {s['peak_gflops']:.0f} GFLOP/s{on})" if s.get("peak_gflops") else ""
    console.print(f"trained {s['steps']} steps in {s['train_seconds']:.0f}s{peak}; metrics: {s['run_dir']}/metrics.jsonl; "
                  f"model: {s['final_model']}")
