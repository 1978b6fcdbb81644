"""Aligning one system's run with another's (metric by metric, tokenizer first): `verirl doctor` (tokenizer and
numerics of a model directory), `verirl convert-config` (veRL / MindSpeed-RL configs to verirl's),
`verirl compare-runs` (two runs' curves against a tolerance), `verirl compare-activations`.

Each command is a module here with ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status; a `verirl.core.errors.UserError` it raises is printed by the CLI
as one paragraph, exit 2). `COMMANDS` is the table the CLI reads; every module is imported when
the parser is built, so a module imports nothing heavy (torch, transformers) at its top level."""
from __future__ import annotations

COMMANDS = {
    "doctor": "verirl.tools.align.doctor",
    "convert-config": "verirl.tools.align.convert",
    "compare-runs": "verirl.tools.align.compare_runs",
    "compare-activations": "verirl.tools.align.activations",
    "report": "verirl.tools.report",  # a run's figures and HTML page (not an alignment command; the same shape)
}
