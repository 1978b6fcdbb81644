"""The report's figures: one PNG per topic, each `WIDTH` x `HEIGHT` pixels, runs overlaid.

matplotlib's object API only (`Figure`, rendered by Agg when saved): no pyplot, no global state, no
backend switched for the process. Every run has one colour in every figure (C0, C1, ... in the
order given); a figure holds one panel per metric, or per rule / task / phase group. A per-step
training curve is drawn raw and thin, with its trailing moving average bold on top (when the
window is over one step), so a noisy reward curve reads; validation points are drawn as they are.
Every text is plain (no mathtext): names with `$` in them are drawn as written.
A figure whose metrics no run logged is left out."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from verirl.tools.align.compare_runs import moving_average
from verirl.core.errors import UserError
from verirl.tools.report.runs import RunData

WIDTH_IN, HEIGHT_IN, DPI = 8.0, 4.5, 100
WIDTH, HEIGHT = int(WIDTH_IN * DPI), int(HEIGHT_IN * DPI)  # 800 x 450 pixels
MOST_PANELS = 12  # per figure (rules, tasks, validation metrics); more would be unreadable at 800 x 450
PHASES = ("rollout", "reward", "old_log_prob", "ref", "teacher", "update", "sync_weights")  # timing/<phase>, stacked
STYLES = ("-", "--", ":", "-.")
NAMES = ("reward", "reward_rules", "reward_tasks", "response_length", "agents", "actor", "timing", "throughput",
         "async", "validation", "filter_mismatch", "moe")  # every figure's file name, <name>.png, in page order


@dataclass
class Panel:
    title: str
    keys: list[str]  # metrics drawn in this panel, one line per run and key
    ylabel: str = ""
    smooth: bool = True  # per-step curves; False: validation points, drawn with markers
    key_labels: list[str] = field(default_factory=list)  # legend names of the keys (default: the keys)


@dataclass
class Chart:
    """One figure of the page: its file name (``name``.png), title, caption, the metrics it draws."""
    name: str
    title: str
    caption: str
    metrics: list[str]
    figure: object  # matplotlib.figure.Figure

    @property
    def file(self) -> str:
        return f"{self.name}.png"


def smooth_window(runs: list[RunData], smooth: int) -> int:
    """The moving average's window: ``smooth`` when given (> 0), else about a twentieth of the longest
    run's training steps (1, no smoothing, under 30 steps; at most 50).

    >>> smooth_window([], 7)
    7
    """
    if smooth > 0:
        return smooth
    steps = max((r.train_steps() for r in runs), default=0)
    return max(1, min(50, round(steps / 20)))


def _present(runs: list[RunData], keys) -> list[str]:
    have = set().union(*(r.keys() for r in runs)) if runs else set()
    return [k for k in keys if k in have]


def _labelled(runs: list[RunData], title: str, labels: dict[str, str], ylabel: str) -> Panel:
    """A panel of the keys of ``labels`` some run logged, each named in the legend by its label."""
    keys = _present(runs, labels)
    return Panel(title, keys, ylabel, key_labels=[labels[k] for k in keys])


def _natural(key: str) -> list:
    """Sort key with the numbers in a name compared as numbers: t2 before t10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", key)]


def _matching(runs: list[RunData], pattern: str) -> list[str]:
    """Keys any run logged that match ``pattern``, in natural order."""
    rx = re.compile(pattern)
    return sorted({k for r in runs for k in r.keys() if rx.fullmatch(k)}, key=_natural)


def _capped(keys: list[str], caption: str) -> str:
    return caption + (f" The first {MOST_PANELS} of {len(keys)} are drawn." if len(keys) > MOST_PANELS else "")


def _val_order(key: str) -> tuple:
    """greedy_acc, pass@1, pass@2, ..., maj@n, reward_mean, then the rest alphabetically."""
    name = key[len("val/"):]
    kind, _, k = name.partition("@")
    rank = {"greedy_acc": 0, "pass": 1, "maj": 2, "reward_mean": 3}.get(kind, 4)
    return rank, int(k) if k.isdigit() else 0, name


def plan(runs: list[RunData]) -> list[tuple[str, str, str, list[Panel]]]:
    """(name, title, caption, panels) of each figure some run has metrics for, in page order."""
    out = []

    def add(name: str, title: str, caption: str, panels: list[Panel]) -> None:
        panels = [p for p in panels if p.keys]
        if panels:
            out.append((name, title, caption, panels))

    add("reward", "Reward", "reward/mean: the mean reward of the step's responses (the weighted sum of the rules).",
        [Panel("reward/mean", _present(runs, ["reward/mean"]), "reward")])
    rules = [k for k in _matching(runs, r"reward/([^/]+)/mean") if k != "reward/task/mean"]
    add("reward_rules", "Reward per rule", _capped(rules, "reward/<rule>/mean: each rule's mean score, before "
                                                          "weighting."),
        [Panel(k.split("/")[1], [k]) for k in rules[:MOST_PANELS]])
    tasks = _matching(runs, r"reward/task/(.+)/mean")
    add("reward_tasks", "Reward per task", _capped(tasks, "reward/task/<task>/mean: the mean reward of each "
                                                          "task's responses."),
        [Panel(k[len("reward/task/"):-len("/mean")], [k]) for k in tasks[:MOST_PANELS]])
    add("response_length", "Response length",
        "response_length/mean and /max (tokens), and clip_ratio: the fraction of responses cut at "
        "rollout.max_new_tokens (no end-of-sequence).",
        [_labelled(runs, "response length", {"response_length/mean": "mean", "response_length/max": "max"}, "tokens"),
         Panel("clip ratio", _present(runs, ["response_length/clip_ratio"]), "fraction")])
    add("agents", "Multi-turn episodes",
        "turns/mean and /max: assistant turns per episode; tools/calls_mean: tool calls per episode; tools/errors, "
        "tools/parse_errors and tools/timeouts: calls that failed, could not be read, or ran out of time (counts); "
        "response_length/model_tokens against /total: the tokens the model sampled (trained on) against every "
        "response token, tool results included; timing/tools: the tool calls' seconds per step, summed over "
        "episodes, against timing/rollout (the calls run beside the decoding, within the rollout's time, so "
        "the time-per-step figure does not stack them).",
        [_labelled(runs, "turns", {"turns/mean": "mean", "turns/max": "max"}, "turns"),
         Panel("tool calls", _present(runs, ["tools/calls_mean"]), "per episode"),
         _labelled(runs, "tool failures", {"tools/errors": "errors", "tools/parse_errors": "unparsed",
                                           "tools/timeouts": "timeouts"}, "calls"),
         _labelled(runs, "tokens", {"response_length/model_tokens": "sampled", "response_length/total": "all"},
                   "tokens"),
         _labelled(runs, "tool time", {"timing/tools": "tools", "timing/rollout": "rollout"}, "seconds")
         if _present(runs, ["timing/tools"]) else Panel("tool time", [])])
    add("actor", "Policy update", "actor/kl (to the reference model, when there is one), actor/entropy (mean token "
                                  "entropy) and actor/pg_clipfrac (the fraction of tokens whose ratio was clipped).",
        [Panel(k.split("/")[1], [k]) for k in _present(runs, ["actor/kl", "actor/entropy", "actor/pg_clipfrac"])])
    if _present(runs, ["timing/all"]):  # drawn apart, one panel per run: `_timing`
        out.append(("timing", "Time per step",
                    "timing/<phase>: seconds per step in each phase (rank 0), stacked; 'other' is the rest of "
                    "timing/all, the step's total.", []))
    tps = _present(runs, ["perf/tps", "perf/tps_rollout", "perf/tps_update"])
    add("throughput", "Throughput and MFU",
        "perf/tps: tokens (prompt + response) per second over the whole step; perf/tps_rollout and "
        "perf/tps_update: over those phases alone; perf/mfu: model FLOPs utilisation.",
        [Panel("tokens per second", tps, "tokens/s", key_labels=[k.split("/")[1] for k in tps]),
         Panel("MFU", _present(runs, ["perf/mfu"]), "fraction of peak")])
    add("async", "Asynchronous training",
        "async/staleness_mean and /max: how many policy versions older than the trainer's the step's samples "
        "are; async/queue_depth: the steps the producers had ready, this one included; async/trainer_idle_s: "
        "seconds the trainer waited for the batch; async/rollout_idle_s: seconds the producer waited for its "
        "job and weights; async/weight_sync_s: seconds to copy the weights to the producers.",
        [_labelled(runs, "staleness", {"async/staleness_mean": "mean", "async/staleness_max": "max"}, "versions"),
         Panel("queue depth", _present(runs, ["async/queue_depth"]), "steps"),
         _labelled(runs, "idle and weight sync", {"async/trainer_idle_s": "trainer idle",
                                                  "async/rollout_idle_s": "rollout idle",
                                                  "async/weight_sync_s": "weight sync"}, "seconds")])
    val = sorted(_matching(runs, r"val/([^/]+)"), key=_val_order)
    add("validation", "Held-out evaluation", _capped(
        val, "val/*: the held-out split, scored at step 0 (before training), every eval.every steps and at the end."),
        [Panel(k[len("val/"):], [k], smooth=False) for k in val[:MOST_PANELS]])
    add("filter_mismatch", "DAPO filter and train/inference mismatch",
        "filter/kept_groups: groups with signal kept per step (algorithm.filter_groups); mismatch/kl: KL of the "
        "rollout engine to the trainer per token; mismatch/masked_frac: tokens the mismatch guard zeroed.",
        [Panel(k, [k]) for k in _present(runs, ["filter/kept_groups", "mismatch/kl", "mismatch/masked_frac"])])
    add("moe", "Mixture of experts",
        "moe/load_max_over_mean: per sparse layer, the busiest expert's tokens over the mean, the largest over the "
        "layers (and their mean); moe/replay_disagreement: the (token, layer) pairs routed to other experts than "
        "the recorded ones (0 under routing replay), moe/router_disagreement: those whose router would choose "
        "otherwise (algo.router_replay, docs/moe.md).",
        [_labelled(runs, "expert load", {"moe/load_max_over_mean": "max over layers",
                                         "moe/load_max_over_mean/mean": "mean over layers"}, "max / mean"),
         _labelled(runs, "routing disagreement", {"moe/replay_disagreement": "replayed",
                                                  "moe/router_disagreement": "router"}, "fraction")])
    return out


def make_figures(runs: list[RunData], smooth: int = 0) -> list[Chart]:
    """Every figure of the report (not yet written); ``smooth``: the moving average's window, 0 = auto."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure  # object API: no pyplot, no global backend switched
    except ImportError:
        raise UserError("verirl report needs matplotlib, which is not installed here: pip install matplotlib.") \
            from None
    k = smooth_window(runs, smooth)
    charts = []
    for name, title, caption, panels in plan(runs):
        fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)  # rendered by Agg, whatever backend the process has
        if name == "timing":
            metrics = _timing(fig, runs)
        else:
            metrics = _panels(fig, runs, panels, k)
        fig.suptitle(title, fontsize=11)
        _plain_text(fig)
        if k > 1 and name != "validation" and name != "timing":
            caption += f" Thin: each step; bold: the trailing mean of {k} steps."
        charts.append(Chart(name, title, caption, metrics, fig))
    return charts


def _plain_text(fig) -> None:
    """Every text of the figure (titles, legends, axis labels) drawn as written: run, task and rule names
    are the user's, and a `$` pair in them is not mathtext."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_parse_math(False)


def _grid(fig, n: int, sharey: bool = False):
    cols = n if n <= 3 else 4 if n in (4, 7, 8) or n > 9 else 3
    rows = math.ceil(n / cols)
    axes = fig.subplots(rows, cols, squeeze=False, sharey=sharey).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return list(axes[:n]), cols


def _style(ax, ylabel: str, bottom: bool, cols: int) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=8 if cols == 1 else 5 if cols == 2 else 4, integer=True))
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    if bottom:
        ax.set_xlabel("step", fontsize=9)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=9)


def _legend(axes) -> None:
    """A legend in the first panel with more than one line, and in any later panel whose lines are not
    all named by an earlier legend already (panels of one figure usually draw the same runs)."""
    named: set[str] = set()
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        if len(labels) > 1 and not set(labels) <= named:
            ax.legend(handles, labels, fontsize=7, loc="best")
            named |= set(labels)


def _panels(fig, runs: list[RunData], panels: list[Panel], k: int) -> list[str]:
    axes, cols = _grid(fig, len(panels))
    several = len(runs) > 1
    for i, (ax, panel) in enumerate(zip(axes, panels)):
        labels = panel.key_labels or panel.keys
        for r, run in enumerate(runs):
            for j, (key, key_label) in enumerate(zip(panel.keys, labels)):
                curve = run.curve(key)
                if not curve:
                    continue
                steps, values = sorted(curve), [curve[s] for s in sorted(curve)]
                color = f"C{r % 10}" if several else f"C{j % 10}"
                style = STYLES[j % len(STYLES)] if several else "-"
                label = (f"{run.name}: {key_label}" if len(panel.keys) > 1 else run.name) if several else \
                    (key_label if len(panel.keys) > 1 else run.name)
                if not panel.smooth:
                    ax.plot(steps, values, color=color, linestyle=style, marker="o", markersize=4, linewidth=1.4,
                            label=label)
                elif k > 1:
                    ax.plot(steps, values, color=color, linestyle=style, alpha=0.3, linewidth=0.8)
                    ax.plot(steps, moving_average(values, k), color=color, linestyle=style, linewidth=2.0,
                            label=label)
                else:
                    ax.plot(steps, values, color=color, linestyle=style, linewidth=1.6, label=label,
                            marker="o" if len(steps) <= 30 else None, markersize=3)
        ax.set_title(panel.title, fontsize=9)
        _style(ax, panel.ylabel, bottom=i >= len(panels) - cols, cols=cols)
    _legend(axes)
    return [k for p in panels for k in p.keys]


def _timing(fig, runs: list[RunData]) -> list[str]:
    """One panel per run (the same y scale): each phase's seconds stacked per step, plus 'other'."""
    with_timing = [r for r in runs if r.curve("timing/all")]
    axes, cols = _grid(fig, len(with_timing), sharey=True)
    phases = [p for p in PHASES if any(r.curve(f"timing/{p}") for r in with_timing)]
    colors = {p: f"C{i}" for i, p in enumerate(phases)}
    for i, (ax, run) in enumerate(zip(axes, with_timing)):
        total = run.curve("timing/all")
        steps = sorted(total)
        parts = [[run.curve(f"timing/{p}").get(s, 0.0) for s in steps] for p in phases]
        other = [max(0.0, total[s] - sum(col)) for s, col in zip(steps, zip(*parts))] if parts else \
            [total[s] for s in steps]
        ax.stackplot(steps, *parts, other, labels=[*phases, "other"],
                     colors=[colors[p] for p in phases] + ["lightgrey"], alpha=0.85)
        ax.set_title(run.name if len(runs) > 1 else "seconds per step, by phase", fontsize=9)
        _style(ax, "seconds" if i % cols == 0 else "", bottom=i >= len(with_timing) - cols, cols=cols)
    if axes:  # the phases, once; the runs are the panels' titles
        handles, labels = axes[0].get_legend_handles_labels()
        axes[0].legend(handles[::-1], labels[::-1], fontsize=7, loc="best")
    return ["timing/all", *[f"timing/{p}" for p in phases]]


def write_figures(charts: list[Chart], runs: list[RunData], out_dir: Path) -> list[Path]:
    """Each chart as ``out_dir``/<name>.png; its PNG text chunks name the runs and the metrics drawn."""
    paths = []
    for chart in charts:
        path = out_dir / chart.file
        try:
            chart.figure.savefig(path, format="png", dpi=DPI, metadata={
                "Title": f"verirl report: {chart.title}",
                "Description": f"runs: {', '.join(r.name for r in runs)}; metrics: {', '.join(chart.metrics)}"})
        except OSError as e:
            raise UserError(f"{path}: cannot write the figure there ({e.strerror or e}). Give a writable "
                            f"directory with -o.") from None
        paths.append(path)
    return paths
