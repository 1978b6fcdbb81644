"""What a run shows while it trains (`log.progress`).

* ``rich``: a live view under the run's messages: a progress bar with the ETA, and a table of the
  latest and smoothed (last 10 steps) reward overall, per rule and per task, response lengths, KL,
  entropy, clip fraction, grad norm (a multi-turn run's turns, tool calls and tool time, an asynchronous
  run's staleness, queue depth and idle times, a mixture-of-experts run's expert load and routing
  disagreements too), and the step's time split by phase as a bar.
* ``plain``: one line per step, no escape codes (CI, Ray workers, ``nohup``, a file).
* ``off``: no live view; only the ``log.console_every`` lines (``verirl train --quiet`` sets both off);
  messages and the final table remain.
* ``auto`` (the default): ``rich`` on a terminal, ``plain`` otherwise.
"""
from __future__ import annotations

from typing import Optional

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from verirl.config.schema import progress_name
from verirl.run.jsonl import mean_of

MODES = ("auto", "rich", "plain", "off")
PHASE_COLOURS = {"rollout": "cyan", "reward": "magenta", "old_log_prob": "yellow", "ref": "blue", "teacher": "red",
                 "update": "green", "sync_weights": "white"}
# seconds spent inside a phase, shown in the legend beside it but not as a bar of their own: a multi-turn
# step's tool calls run beside the rollout's decoding (timing/tools, summed over episodes, may exceed it)
WITHIN_PHASE = {"tools": "rollout"}
SMOOTH = 10  # steps in the smoothed column


ESTIMATOR_NAMES = {"grpo": "GRPO", "rloo": "RLOO", "reinforce_plus_plus_baseline": "REINFORCE++ (baseline)"}


def algorithm_name(algo) -> str:
    """The run's algorithm for its first line, from the ``algo`` section: DAPO when groups are filtered
    (dynamic sampling, DAPO's own step), else the advantage estimator's name; a policy loss other than
    vanilla is named after it.

    >>> from verirl.config import AlgoConfig
    >>> algorithm_name(AlgoConfig()), algorithm_name(AlgoConfig(policy_loss="gspo"))
    ('GRPO', 'GRPO (gspo loss)')
    """
    name = "DAPO" if algo.filter_groups.enable else ESTIMATOR_NAMES.get(algo.adv_estimator, algo.adv_estimator)
    return name if algo.policy_loss == "vanilla" else f"{name} ({algo.policy_loss} loss)"


def progress_mode(setting: str, console: Console) -> str:
    """``log.progress`` resolved for this console: auto is rich on a terminal, plain elsewhere."""
    setting = progress_name(setting)
    if setting == "auto":
        return "rich" if console.is_terminal else "plain"
    return setting


def plain_console(console: Console) -> Console:
    """A console on the same stream that never writes escape codes (colour, cursor moves)."""
    return Console(file=console.file, force_terminal=False, color_system=None, highlight=False,
                   width=max(console.width, 160), soft_wrap=True)


class Dashboard:
    """The ``rich`` live view: `start`, `update` after each step, `stop`."""

    def __init__(self, console: Console, total: int, done: int):
        self.console, self.total = console, total
        self.bar = Progress(TextColumn("[bold blue]training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn(), console=console)
        self.task = self.bar.add_task("", total=total, completed=done)
        self.table: Optional[Table] = None
        self.live = Live(Group(self.bar), console=console, refresh_per_second=4, transient=False)

    def start(self) -> None:
        self.live.start()

    def stop(self) -> None:
        self.live.stop()

    def update(self, metrics: dict, history: list[dict]) -> None:
        self.bar.update(self.task, advance=1)
        self.live.update(Group(self.bar, metrics_table(metrics, history[-SMOOTH:]), phase_bar(metrics)))


def metrics_table(m: dict, recent: list[dict]) -> Table:
    """The latest step's figures next to their mean over ``recent`` steps."""
    t = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("latest", justify="right")
    t.add_column(f"mean of last {len(recent)}", justify="right")
    rows = [("reward", "reward/mean")]
    rows += [(key[len("reward/"):-len("/mean")], key) for key in m
             if key.startswith("reward/") and key.endswith("/mean") and key != "reward/mean"]
    rows += [("response length", "response_length/mean"), ("  max", "response_length/max"),
             ("  clipped at max", "response_length/clip_ratio"), ("kl", "actor/kl"), ("entropy", "actor/entropy"),
             ("  sampled by the model", "response_length/model_tokens"),
             ("  with observations", "response_length/total"), ("turns", "turns/mean"), ("  max", "turns/max"),
             ("tool calls", "tools/calls_mean"), ("tool errors", "tools/errors"),
             ("tool calls unparsed", "tools/parse_errors"), ("tool timeouts", "tools/timeouts"),
             ("tool time s", "timing/tools"),
             ("clip fraction", "actor/pg_clipfrac"), ("grad norm", "actor/grad_norm"),
             ("groups kept", "filter/kept_groups"), ("mismatch kl", "mismatch/kl"),
             ("expert load max/mean", "moe/load_max_over_mean"), ("  mean over layers", "moe/load_max_over_mean/mean"),
             ("replay disagreement", "moe/replay_disagreement"), ("router disagreement", "moe/router_disagreement"),
             ("staleness", "async/staleness_mean"), ("  max", "async/staleness_max"),
             ("queue depth", "async/queue_depth"), ("trainer idle s", "async/trainer_idle_s"),
             ("rollout idle s", "async/rollout_idle_s"), ("weight sync s", "async/weight_sync_s"),
             ("tokens/s", "perf/tps"), ("mfu", "perf/mfu")]
    for label, key in rows:
        if key in m:
            t.add_row(label, f"{m[key]:.4g}", f"{mean_of(recent, key):.4g}")
    return t


def phase_bar(m: dict, width: int = 60) -> Text:
    """The step's seconds split by phase, as one coloured bar with a legend; the seconds spent within a
    phase (`WITHIN_PHASE`: the tools', within the rollout) follow that phase in the legend."""
    total = m.get("timing/all", 0.0) or 1e-9
    bar, legend = Text(), Text()
    for phase, colour in PHASE_COLOURS.items():
        seconds = m.get(f"timing/{phase}", 0.0)
        if seconds <= 0:
            continue
        bar.append("█" * max(1, round(width * seconds / total)), style=colour)
        legend.append(f" {phase} {seconds:.2f}s", style=colour)
        for part, within in WITHIN_PHASE.items():
            if within == phase and f"timing/{part}" in m:
                legend.append(f" ({part} {m[f'timing/{part}']:.2f}s)", style=colour)
    return Text.assemble(Text("time ", style="bold"), bar, f"  {total:.2f}s/step\n", legend)
