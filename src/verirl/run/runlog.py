"""What a run writes while it trains, and what it says on the console: `RunLog` (metrics.jsonl,
rollouts.jsonl, summary.json, the trackers, the console and the live view of `verirl.run.display`),
and the lines it prints (a step, the held-out evaluation, mixed precision, a finished run, the
final table)."""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from rich.console import Console

from verirl.run.display import Dashboard, plain_console, progress_mode
from verirl.run.jsonl import JsonlSink, read_jsonl, truncate
from verirl.run.rundir import metrics_file


@dataclass(frozen=True)
class LogSettings:
    """What the run shows on the console, and where else its metrics go."""
    progress: str  # log.progress: auto / rich / plain / off (`verirl.run.display`)
    console_every: int  # a metrics line every N steps (0 = never)
    backends: tuple[str, ...] = ("console", "jsonl")  # log.backends (`verirl.run.trackers`)
    project: str = "verirl"
    run_name: str = ""  # "" = the run directory's name


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
        self.metrics_path, self.dump_path = metrics_file(run_dir), run_dir / "rollouts.jsonl"
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
            self.print(f"{step_line(metrics)}  [{step}/{self._total}]")
        elif every and (step % every == 0 or step == self._total):  # rich and off: every log.console_every steps
            self.print(step_line(metrics))

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
        print_summary(self.console, summary, n_val, n_samples)

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


def complete_line(run_dir: Path, step: int, total_steps: int, changed: str) -> str:
    """What a run started on a finished one says: nothing trains, and how to train further or anew."""
    unused = f" The changed settings ({changed}) are not used." if changed else ""
    return (f"[bold yellow]the run in {run_dir} is complete[/]: its checkpoint is step {step} and "
            f"trainer.total_steps={total_steps}, so no step is trained.{unused} To train it further, raise "
            f"trainer.total_steps (e.g. trainer.total_steps={step + total_steps}); to train anew, give another "
            f"trainer.run_dir, or trainer.resume=false trainer.overwrite=true (deletes this run).")


def val_line(m: dict) -> str:
    return "  ".join(f"{k[4:]} {v:.3f}" for k, v in m.items() if k.startswith("val/") and k.count("/") == 1)


def step_line(m: dict) -> str:
    rules = "  ".join(f"{k.split('/')[1]} {v:+.3f}" for k, v in m.items()
                      if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2)
    kl = f"  kl {m['actor/kl']:.4f}" if "actor/kl" in m else ""
    kept = f"  groups {m['filter/kept_groups']:.0f}/{m['filter/gen_batches']:.0f}b" if "filter/kept_groups" in m else ""
    masked = f"  masked {m['mismatch/masked_frac']:.1%}" if m.get("mismatch/masked_frac") else ""
    turns = f"  turns {m['turns/mean']:.2f}  tools {m['tools/calls_mean']:.2f}" if "turns/mean" in m else ""
    stale = f"  stale {m['async/staleness_max']:.0f}" if "async/staleness_max" in m else ""
    idle = f"  idle {m['async/trainer_idle_s']:.2f}s" if "async/trainer_idle_s" in m else ""
    return (f"step {m['step']:>5}  reward {m['reward/mean']:+.3f}  {rules}  len {m['response_length/mean']:.1f}"
            f"{turns}{kl}  ent {m['actor/entropy']:.3f}{kept}{masked}  {m['timing/all']:.2f}s{idle}{stale}"
            f"  tps {m['perf/tps']:.0f}")


def print_summary(console, s: dict, n_val: int, n_samples: int) -> None:
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
