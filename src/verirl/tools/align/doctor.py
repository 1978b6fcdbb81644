"""`verirl doctor`: check a model directory before training on it or aligning two systems with it.

The diagnosis is `verirl.models.diagnose` (training's checks stop on its errors); this module prints it.
It reads config.json, generation_config.json and the tokenizer files (no weights) and reports:

  * the EOS / pad / BOS ids of each source (config.json, generation_config.json, the tokenizer)
    and the stop ids and pad id verirl would use, and where they disagree;
  * the token the chat template ends an assistant turn with, and whether generation stops on it
    (the Qwen2.5 base-vs-instruct trap: <|endoftext|> 151643 vs <|im_end|> 151645);
  * eos == pad (safe in verirl, which masks a response by position; not in tools that mask by id);
  * the tokenizer's length against the embedding rows (config.json vocab_size);
  * the numerics two systems must share: rms_norm_eps, rope_theta, rope scaling,
    tie_word_embeddings, dtype, sliding window, ...;
  * with --template NAME: the token ids of the template's stop words.

Exit status: 0 when no finding is an error, 1 when one is, 2 when MODEL_DIR cannot be read.
See docs/doctor.md for every finding and how to read the report.

`verirl doctor --sandbox` (no MODEL_DIR) prints instead what `verirl.sandbox` sets up on this machine
for this user, each mechanism on or off and why (docs/sandbox.md); exit 0 when all is on, 1 if not.

examples:
  verirl doctor tiny
  verirl doctor --sandbox
  verirl doctor ~/models/Qwen2.5-7B-Instruct --template qwen_r1
  verirl doctor ~/models/Qwen2.5-7B --json > doctor.json
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verirl.models.diagnose import Report

HELP = "check a model directory: EOS/pad/BOS ids per source, chat-template end of turn, vocabulary, numerics"


def add_arguments(parser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", nargs="?",
                        help="a Hugging Face model directory (config.json, tokenizer files; weights not needed), "
                             "or tiny")
    parser.add_argument("--sandbox", action="store_true",
                        help="instead: what the sandbox of reward rules and programs sets up here (docs/sandbox.md)")
    parser.add_argument("--template", default="", metavar="NAME",
                        help="also check a prompt template of verirl's templates.json (e.g. qwen_r1): its stop "
                             "words' token ids, as data.prompt_type would use them; 'tokenizer' = the chat template")
    parser.add_argument("--templates-file", default="", metavar="FILE",
                        help="your own templates.json (MindSpeed-RL format), for --template")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args) -> int:
    if args.sandbox:
        return _sandbox(args.json)
    if not args.model_dir:
        from verirl.core.errors import UserError
        raise UserError("give a MODEL_DIR (a Hugging Face model directory, or tiny), or --sandbox.")
    from verirl.models.diagnose import diagnose  # imports torch: not at `verirl --help`'s start

    report = diagnose(args.model_dir, args.template, args.templates_file)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        render(report)
    return report.exit_code


def _sandbox(as_json: bool) -> int:
    from verirl.sandbox import missing, probe, render

    table = probe()
    if as_json:
        print(json.dumps(table, indent=2))
    else:
        print(render(table))
        off = missing(table)
        print(f"\n{len(off)} mechanism(s) off: docs/sandbox.md says what each one stops." if off else
              "\nevery mechanism is on (docs/sandbox.md: what each stops, and what none of them does).")
    return 1 if missing(table) else 0


# --- output -----------------------------------------------------------------------------------------------

def _ids_cell(entry: dict, kind: str) -> str:
    vals = entry.get(kind)
    if vals is None:
        return "-"
    vals = vals if isinstance(vals, list) else [vals]
    token = entry.get(f"{kind}_token")
    text = ", ".join(str(v) for v in vals)
    return f"{token} {text}" if token else text


def _short(value: Any) -> str:
    """JSON, with a long list of one repeated value as 'N x value' (layer_types of 28 layers)."""
    if isinstance(value, list) and len(value) > 2 and len({json.dumps(v) for v in value}) == 1:
        return f"{len(value)} x {json.dumps(value[0])}"
    return json.dumps(value)


def render(report: Report) -> None:
    """The ids per source and the numerics as tables, then the findings, errors first."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from verirl.models.diagnose import LEVELS

    console = Console(highlight=False)
    arch = ", ".join(report.architectures) or "?"
    console.print(Text(f"verirl doctor: {report.model_dir} ({report.model_type or '?'}, {arch})"))
    t = Table(title="special token ids", title_justify="left")
    for col in ("source", "eos", "pad", "bos"):
        t.add_column(col)
    for src, entry in report.ids.items():
        if src == "generation_config.json" and not entry.get("present"):
            t.add_row(src, "(no file)", "", "")
            continue
        label = "verirl (stop ids, pad)" if src == "verirl" else src
        t.add_row(label, _ids_cell(entry, "eos"), _ids_cell(entry, "pad"), _ids_cell(entry, "bos"))
    end = report.chat_template.get("turn_end")
    if end:
        t.add_row("chat template end of turn", f"{end['token']} {end['id']}", "", "")
    if report.template:
        words = ", ".join(f"{w} {ids}" for w, ids in report.template["stop_words"].items()) or "(none)"
        t.add_row(f"template {report.template['name']} stop words", words, "", "")
    console.print(t)
    if report.vocab:
        console.print(Text(f"vocabulary: {report.vocab['tokenizer']} tokens in the tokenizer, "
                           f"{report.vocab['embedding_rows']} embedding rows (config.json vocab_size)"))
    n = Table(title="numerics two systems must share", title_justify="left")
    for col in ("key", "value", "from"):
        n.add_column(col)
    for key, v in report.numerics.items():
        n.add_row(key, _short(v["value"]), v["source"])
    console.print(n)
    style = {"error": "bold red", "warning": "yellow", "info": "dim"}
    for f in sorted(report.findings, key=lambda f: LEVELS.index(f.level)):
        line = Text(f"{f.level.upper():7} ", style=style[f.level])
        line.append(f"{f.code}: ", style="bold")
        line.append(f.message)
        console.print(line, soft_wrap=True)
    counts = {lv: sum(f.level == lv for f in report.findings) for lv in LEVELS}
    console.print(Text(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info; "
                       f"exit {report.exit_code}"))
