"""Aligning one system's run with another's (metric by metric, tokenizer first): `verirl doctor` (tokenizer and
numerics of a model directory), `verirl convert-config` (veRL / MindSpeed-RL configs to verirl's),
`verirl compare-runs` (two runs' curves against a tolerance), `verirl compare-activations`.

Each command is a module here with ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status; a `verirl.core.errors.UserError` it raises is printed by the CLI
as one paragraph, exit 2); `verirl.cli` lists them in its one table of subcommands, and imports every
module when the parser is built, so a module imports nothing heavy (torch, transformers) at its top level."""
