"""The report's HTML page: one self-contained file (inline CSS, no server, no network), opened from
file:// next to its PNGs, which it references by relative path.

Every text that comes from a run (config, summary, prompts, responses, labels, names, paths) is
HTML-escaped. The page's only script reports a figure that does not load (the PNGs moved away from
the page) on the page and as a console error, which the browser test watches for."""
from __future__ import annotations

import datetime as _dt
import math
from html import escape
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

from verirl.tools.report.figures import HEIGHT, WIDTH, Chart
from verirl.tools.report.runs import RunData, Sample

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1100px;
       padding: 0 16px 48px; color: #1b1b1b; }
h1 { margin: 20px 0 4px; } h2 { border-bottom: 1px solid #ccc; margin-top: 36px; } h3 { margin-top: 24px; }
code, pre { font: 12px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: #f6f8fa; border: 1px solid #e1e4e8; padding: 8px; overflow-x: auto; white-space: pre-wrap;
      word-break: break-word; max-height: 480px; }
figure { margin: 16px 0 28px; } figure img { max-width: 100%; height: auto; border: 1px solid #e1e4e8; }
figcaption { color: #555; font-size: 13px; max-width: 800px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } th { background: #f6f8fa; }
td.text { min-width: 320px; max-width: 640px; } td.text pre { max-height: 240px; margin: 0; }
.muted { color: #666; } .note { color: #8a5a00; } .missing { color: #b00020; font-weight: bold; }
nav a { margin-right: 12px; } details { margin: 8px 0; } summary { cursor: pointer; }
"""

# A figure that does not load (the PNGs were not copied along with the page) is said on the page and
# logged as a console error; nothing else on the page runs or logs.
SCRIPT = """
for (const img of document.querySelectorAll("figure img")) {
  const fail = () => {
    console.error("verirl report: figure not loaded: " + img.getAttribute("src"));
    const note = document.createElement("p");
    note.className = "missing";
    note.textContent = "figure not found: " + img.getAttribute("src") + " (keep the PNGs next to this page)";
    img.replaceWith(note);
  };
  if (img.complete && img.naturalWidth === 0) fail(); else img.addEventListener("error", fail);
}
"""


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return escape(str(value))
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _cell(value: Any) -> str:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    text = _num(value) if not isinstance(value, (dict, list)) else f"<code>{escape(str(value))}</code>"
    return f'<td class="num">{text}</td>' if numeric else f"<td>{text}</td>"


def summary_html(summary: Any) -> str:
    """summary.json as tables: its plain values as key / value; its objects (eval_start, eval_end, ...)
    side by side, one column each, a row per key they hold."""
    if not isinstance(summary, dict):
        return f"<pre>{escape(str(summary))}</pre>"
    plain = {k: v for k, v in summary.items() if not isinstance(v, dict)}
    nested = {k: v for k, v in summary.items() if isinstance(v, dict)}
    out = []
    if plain:
        out.append("<table>" + "".join(f"<tr><th>{escape(str(k))}</th>{_cell(v)}</tr>" for k, v in plain.items())
                   + "</table>")
    if nested:
        rows = list(dict.fromkeys(k for d in nested.values() for k in d))
        head = "".join(f"<th>{escape(str(k))}</th>" for k in nested)
        body = "".join(f"<tr><th>{escape(str(row))}</th>" + "".join(
            _cell(d[row]) if row in d else "<td></td>" for d in nested.values()) + "</tr>" for row in rows)
        out.append(f"<table><tr><th></th>{head}</tr>{body}</table>")
    return "".join(out)


def _scores(scores: dict[str, Optional[float]]) -> str:
    return "<br>".join(f"{escape(rule)}: {'n/a' if v is None else _num(v)}" for rule, v in scores.items()) or "—"


def _response(s: Sample) -> str:
    """The response, or a multi-turn episode turn by turn with each segment's role."""
    if not s.turns:
        return f"<pre>{escape(s.response)}</pre>"
    return "".join(f"<div class=\"muted\">{escape(role)}</div><pre>{escape(text)}</pre>" for role, text in s.turns)


def _sample_row(which: str, s: Sample) -> str:
    stopped = "" if s.stopped is None else ("yes" if s.stopped else "no (cut at max_new_tokens)")
    return (f"<tr><th>{which}</th><td>{escape(s.task)}</td><td class=\"num\">{_num(s.reward)}</td>"
            f"<td>{_scores(s.scores)}</td><td class=\"num\">{'' if s.response_length is None else s.response_length}"
            f"</td><td>{stopped}</td><td>{escape(s.label)}</td>"
            f"<td class=\"text\">{_response(s)}"
            f"<details><summary class=\"muted\">prompt</summary><pre>{escape(s.prompt)}</pre></details></td></tr>")


def samples_html(run: RunData) -> str:
    if not run.has_rollouts:
        return ("<p class=\"muted\">No rollouts.jsonl: the run did not dump its responses. Train with "
                "<code>trainer.dump_rollouts=true</code> to see sample completions here.</p>")
    if not run.samples:
        return "<p class=\"muted\">rollouts.jsonl holds no response records (or none were asked for: --samples 0).</p>"
    shown = len(run.samples)
    intro = (f"<p class=\"muted\">The best and the worst response (by reward) of {shown} of the "
             f"{run.sample_steps} logged steps{', evenly spaced' if shown < run.sample_steps else ''}. "
             f"Scores per rule: n/a where the rule does not apply to the task.</p>")
    head = ("<tr><th></th><th>task</th><th>reward</th><th>scores</th><th>tokens</th><th>stopped</th>"
            "<th>label</th><th>response</th></tr>")
    parts = [intro]
    for st in run.samples:
        parts.append(f"<h4>step {st.step} <span class=\"muted\">({st.count} responses)</span></h4>"
                     f"<table>{head}{_sample_row('best', st.best)}{_sample_row('worst', st.worst)}</table>")
    return "".join(parts)


def _run_section(i: int, run: RunData) -> str:
    notes = "".join(f"<li class=\"note\">{escape(n)}</li>" for n in run.notes)
    steps = sorted(run.metrics.steps)
    span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
    config = (f"<details><summary>config.yaml (the resolved config)</summary><pre>{escape(run.config_text)}</pre>"
              f"</details>" if run.config_text is not None else "<p class=\"muted\">No config.yaml.</p>")
    summary = summary_html(run.summary) if run.summary is not None else \
        "<p class=\"muted\">No summary.json (it is written when the run ends).</p>"
    return (f"<section id=\"run-{i}\"><h2>{escape(run.name)}</h2>"
            f"<p class=\"muted\"><code>{escape(str(run.path))}</code>: {run.train_steps()} training steps logged "
            f"({span})</p>{f'<ul>{notes}</ul>' if notes else ''}"
            f"<h3>Summary</h3>{summary}<h3>Config</h3>{config}"
            f"<h3>Sample completions</h3>{samples_html(run)}</section>")


def render(runs: list[RunData], charts: list[Chart]) -> str:
    names = ", ".join(r.name for r in runs)
    nav = "".join(['<a href="#figures">figures</a>'] +
                  [f'<a href="#run-{i}">{escape(r.name)}</a>' for i, r in enumerate(runs)])
    figures = "".join(
        f"<figure id=\"fig-{c.name}\"><img src=\"{quote(c.file)}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" "
        f"alt=\"{escape(c.title)}\"><figcaption><b>{escape(c.title)}</b> ({escape(c.file)}). "
        f"{escape(c.caption)}</figcaption></figure>" for c in charts) or \
        "<p class=\"muted\">No metrics to plot yet.</p>"
    legend = (f"<p>Runs overlaid, one colour each in every figure (in this order): {escape(names)}.</p>"
              if len(runs) > 1 else "")
    when = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return (f"<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>verirl report: {escape(names)}</title><style>{CSS}</style></head><body>"
            f"<h1>verirl report</h1><p class=\"muted\">{escape(names)}, written {escape(when)} by "
            f"<code>verirl report</code>.</p><nav>{nav}</nav>"
            f"<section id=\"figures\"><h2>Figures</h2>{legend}{figures}</section>"
            + "".join(_run_section(i, r) for i, r in enumerate(runs)) +
            f"<script>{SCRIPT}</script></body></html>\n")


def write_page(runs: list[RunData], charts: list[Chart], out_dir: Path) -> Path:
    path = out_dir / "index.html"
    path.write_text(render(runs, charts), encoding="utf-8")
    return path

