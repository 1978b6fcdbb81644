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

`verirl doctor --template` (no NAME; the model from MODEL_DIR or --model, default tiny; --template-file
F.jinja for another chat template) checks instead the chat template against token in / token out: it
builds a synthetic tool episode as the multi-turn loop does (the turns as token ids, each observation
rendered after its turn, `verirl.rollout.render`), renders the whole conversation again, and says whether
that gives the same tokens; if not, where and what differs (docs/doctor.md, 'Chat templates and token in,
token out'). Exit 0 when the episode could be built (same or not: verirl trains on the sampled tokens
either way), 1 when the template cannot render it, 2 when the tokenizer or the file cannot be read.

examples:
  verirl doctor tiny
  verirl doctor --sandbox
  verirl doctor ~/models/Qwen2.5-7B-Instruct --template qwen_r1
  verirl doctor ~/models/Qwen2.5-7B --json > doctor.json
  verirl doctor --template --model ~/models/Qwen3-8B
  verirl doctor --template --template-file my_template.jinja --json
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from verirl.models.diagnose import Report

HELP = ("check a model directory: EOS/pad/BOS ids per source, chat-template end of turn, vocabulary, numerics; "
        "--template: the chat template against token in / token out")
ROUND_TRIP = "\0round-trip"  # --template given without NAME


def add_arguments(parser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", nargs="?",
                        help="a Hugging Face model directory (config.json, tokenizer files; weights not needed), "
                             "or tiny")
    parser.add_argument("--sandbox", action="store_true",
                        help="instead: what the sandbox of reward rules and programs sets up here (docs/sandbox.md)")
    parser.add_argument("--model", default="", metavar="PATH",
                        help="the model directory, as MODEL_DIR (for --template without NAME: default tiny)")
    parser.add_argument("--template", nargs="?", const=ROUND_TRIP, default="", metavar="NAME",
                        help="NAME: also check a prompt template of verirl's templates.json (e.g. qwen_r1): its stop "
                             "words' token ids, as data.prompt_type would use them; 'tokenizer' = the chat template. "
                             "Without NAME: instead check the chat template against token in / token out (a "
                             "synthetic tool episode rendered again: the same tokens or not, and where not)")
    parser.add_argument("--templates-file", default="", metavar="FILE",
                        help="your own templates.json (MindSpeed-RL format), for --template NAME")
    parser.add_argument("--template-file", default="", metavar="FILE.jinja",
                        help="a chat template (Jinja) to check instead of the model's; implies --template")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args) -> int:
    if args.sandbox:
        return _sandbox(args.json)
    model = args.model or args.model_dir
    if args.template and args.template != ROUND_TRIP and not model and (args.template == "tiny"
                                                                        or Path(args.template).is_dir()):
        model, args.template = args.template, ROUND_TRIP  # `doctor --template DIR`: DIR is the model
    if args.template == ROUND_TRIP or args.template_file:
        return _round_trip(model or "tiny", args.template_file, args.json)
    if not model:
        from verirl.core.errors import UserError
        raise UserError("give a MODEL_DIR (a Hugging Face model directory, or tiny), or --sandbox.")
    from verirl.models.diagnose import diagnose  # imports torch: not at `verirl --help`'s start

    report = diagnose(model, args.template, args.templates_file)
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


# --- --template: the chat template against token in / token out ---------------------------------------------

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression and return its value.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 2*3"}},
                   "required": ["expression"]}}}
QUESTION = "What is 2*3, times 7?"
# (thought, what the turn says, the observation after it): a calculator call and its result, an answer and
# the environment's follow-up (a user message: a new query for templates that tell queries apart), the answer
EPISODE = (
    ("I need the calculator for 2*3.",
     '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>',
     {"role": "tool", "content": "6"}),
    ("The calculator says 6.", "2*3 = 6.", {"role": "user", "content": "Now multiply it by 7."}),
    ("6*7 = 42.", "The answer is 42.", None),
)
VARIANTS = {"plain": "plain turns", "thinking": "turns with <think> blocks"}
WHAT_VERIRL_DOES = (
    "verirl trains on the sampled tokens: the episode is one token sequence, each turn as the engine sampled it "
    "and each observation rendered by the chat template after its turn, never decoded and encoded again. "
    "Where rendering the whole conversation again gives other tokens, those are what a trainer that "
    "re-renders and re-tokenizes the conversation would train on instead: tokens the policy did not sample "
    "in place of ones it did, with log-probs and ratios of another sequence.")


def round_trip(tokenizer, template: Optional[str] = None) -> dict[str, Any]:
    """The synthetic episode (`EPISODE`, plain and with <think> blocks) built token in / token out with
    ``tokenizer`` (its chat template, or ``template``), and the whole conversation rendered again: per
    variant whether the tokens are the same, and where not, each difference."""
    from verirl.rollout.render import render

    if template is not None:
        tokenizer.chat_template = template
    out: dict[str, Any] = {"turn_end": None, "notes": [], "variants": {}, "error": None}
    if not getattr(tokenizer, "chat_template", None):
        out["error"] = ("the tokenizer has no chat template (tokenizer_config.json chat_template or "
                        "chat_template.jinja); give one with --template-file F.jinja.")
        return out
    try:
        stop = _turn_end(tokenizer)
        out["turn_end"] = {"token": tokenizer.decode([stop]), "id": stop}
        if "calculator" not in render(tokenizer, [{"role": "user", "content": QUESTION}], [CALCULATOR]):
            out["notes"].append("the template does not write the tools' schemas into the prompt (it ignores "
                                "tools=): the model is not told about the calculator; give the tools in the "
                                "prompt's text, or use a template with a tool section.")
        for variant in VARIANTS:
            ids, segments, messages = _episode(tokenizer, variant == "thinking", stop)
            out["variants"][variant] = _compare(tokenizer, ids, segments, messages, tokenizer.decode([stop]))
    except Exception as e:  # a template's raise_exception(), a Jinja error, the turn's content dropped
        out["error"] = f"the chat template cannot render the episode: {type(e).__name__}: {e}"
    return out


def _turn_end(tokenizer) -> int:
    """The token the template ends an assistant turn with (the first special or added token after the
    turn's content), else the tokenizer's EOS: the token a turn stops on."""
    from verirl.rollout.render import MARKER, encode, render

    text = render(tokenizer, [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": MARKER}],
                  None, False)
    at = text.rfind(MARKER)
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    ids = encode(tokenizer, text[at + len(MARKER):]) if at >= 0 else []
    end = next((i for i in ids if i in special), tokenizer.eos_token_id)
    if end is None:
        raise ValueError("no token ends an assistant turn (the template writes no special token after it, and "
                         "the tokenizer has no eos_token)")
    return end


def _episode(tokenizer, thinking: bool, stop: int) -> tuple[list[int], list[tuple[str, int, int]], list[dict]]:
    """`EPISODE` as the multi-turn loop builds it: the prompt's tokens, each turn's text encoded once and its
    stop token (as sampled), each observation's tokens rendered after its turn; the history holds each turn
    as the loop decodes it. Returns the ids, the segments (name, start, length) and the messages."""
    from verirl.rollout.render import TurnRenderer, encode

    renderer = TurnRenderer(tokenizer, [CALCULATOR])
    messages = [{"role": "user", "content": QUESTION}]
    ids = renderer.prompt_ids(messages)
    segments, tail = [("prompt", 0, len(ids))], tokenizer.decode([stop])
    for k, (thought, says, observation) in enumerate(EPISODE, 1):
        turn = encode(tokenizer, f"<think>\n{thought}\n</think>\n\n{says}" if thinking else says) + [stop]
        segments.append((f"turn {k} (sampled)", len(ids), len(turn)))
        ids = ids + turn
        content = {"role": "assistant", "content": tokenizer.decode(turn, skip_special_tokens=True)}
        if observation is None:
            messages.append(content)
            continue
        obs = renderer.observation_ids(messages, [observation], tail)
        segments.append((f"observation {k} ({observation['role']})", len(ids), len(obs)))
        ids = ids + obs
        messages += [content, observation]
    return ids, segments, messages


def _compare(tokenizer, ids: list[int], segments: list[tuple[str, int, int]], messages: list[dict],
             tail: str) -> dict[str, Any]:
    """The whole conversation rendered again and tokenized, against the episode's ``ids``."""
    import difflib

    from verirl.rollout.render import MARKER, encode, render

    # what the template writes after the last turn's stop token ("\n" for ChatML): no model samples it
    final = render(tokenizer, [*messages[:-1], {"role": "assistant", "content": MARKER}], [CALCULATOR], False)
    closing = final[final.rfind(MARKER) + len(MARKER):]
    closing = closing[len(tail):] if closing.startswith(tail) else closing
    again = tokenizer.apply_chat_template(messages, tools=[CALCULATOR], tokenize=True)
    again = list(again["input_ids"] if hasattr(again, "keys") else again)
    ours = ids + encode(tokenizer, closing)
    sampled = sum(n for name, _, n in segments if name.endswith("(sampled)"))
    result: dict[str, Any] = {"same": again == ours, "tokens": len(ids), "sampled_tokens": sampled,
                              "closing": closing, "rendered_again_tokens": len(again), "first_difference": None,
                              "differences": []}
    if result["same"]:
        return result
    dec = tokenizer.decode
    k = next((i for i, (a, b) in enumerate(zip(ours, again)) if a != b), min(len(ours), len(again)))
    result["first_difference"] = {"position": k, "segment": _segment(segments, k),
                                  "before": dec(ours[max(0, k - 8):k]), "verirl": dec(ours[k:k + 12]),
                                  "rendered_again": dec(again[k:k + 12])}
    lost = added = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ours, again, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lost += sum(_segment(segments, i).endswith("(sampled)") for i in range(i1, i2))
        added += j2 - j1
        result["differences"].append({"kind": {"delete": "dropped", "insert": "added", "replace": "rewritten"}[tag],
                                      "position": i1, "segment": _segment(segments, i1),
                                      "verirl": dec(ours[i1:i2]), "rendered_again": dec(again[j1:j2]),
                                      "verirl_tokens": i2 - i1, "rendered_again_tokens": j2 - j1})
    result["sampled_tokens_lost"], result["tokens_added"] = lost, added
    return result


def _segment(segments: list[tuple[str, int, int]], position: int) -> str:
    for name, start, length in segments:
        if start <= position < start + length:
            return name
    return "after the last turn"


def _round_trip(model: str, template_file: str, as_json: bool) -> int:
    from verirl.core.errors import ModelError, UserError
    from verirl.models.load import resolve_path

    template = None
    if template_file:
        try:
            template = Path(template_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--template-file {template_file}: cannot read it ({type(e).__name__}: {e}). Give a "
                            f"chat template file (Jinja text, e.g. chat_template.jinja).") from None
    path = resolve_path(model)
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"--model {model}: the tokenizer cannot be loaded ({type(e).__name__}: {e}). Give a model "
                         f"directory with tokenizer.json and tokenizer_config.json, or tiny.") from None
    out = {"model": model, "path": path, "template": template_file or "the tokenizer's chat template",
           **round_trip(tokenizer, template), "what_verirl_does": WHAT_VERIRL_DOES}
    out["exit_code"] = 1 if out["error"] else 0
    if as_json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        _print_round_trip(out)
    return out["exit_code"]


def _print_round_trip(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False)
    p = lambda *parts: console.print(Text.assemble(*parts), soft_wrap=True)  # noqa: E731
    short = lambda s, n=60: repr(s if len(s) <= n else s[:n] + "…")  # noqa: E731
    p(f"verirl doctor --template: {out['template']}, tokenizer of {out['model']}")
    if out["error"]:
        p(("ERROR   ", "bold red"), out["error"])
        p("verirl cannot build multi-turn episodes with this template (docs/doctor.md, 'Chat templates and "
          "token in, token out').")
        return
    end = out["turn_end"]
    p(f"episode: a question | turn 1: a calculator call | its result (tool) | turn 2: an answer | a follow-up "
      f"(user) | turn 3: the answer; each turn as token ids ending on {end['token']} {end['id']}, each observation "
      f"rendered after its turn (verirl.rollout.render), then the whole conversation rendered again")
    for note in out["notes"]:
        p(("NOTE    ", "yellow"), note)
    for variant, r in out["variants"].items():
        label = VARIANTS[variant]
        if r["same"]:
            p((f"{label}: ", "bold"), ("SAME", "green"),
              f": rendered again, the conversation is verirl's sequence, all {r['tokens']} tokens (prompt "
              f"included), then {r['closing']!r} (what the template writes after the last turn's end; no model "
              f"samples it)")
            continue
        d = r["first_difference"]
        p((f"{label}: ", "bold"), ("DIFFERS", "bold red"),
          f" from token {d['position']} of the sequence (prompt included) on, in {d['segment']}: "
          f"{r['rendered_again_tokens']} tokens rendered again against verirl's {r['tokens']} (+ {r['closing']!r} "
          f"after the last turn)")
        p(f"  before:          {short(d['before'])}")
        p(f"  verirl:          {short(d['verirl'])}")
        p(f"  rendered again:  {short(d['rendered_again'])}")
        for x in r["differences"]:
            what = {"dropped": f"dropped {short(x['verirl'])}", "added": f"added {short(x['rendered_again'])}",
                    "rewritten": f"{short(x['verirl'])} rewritten as {short(x['rendered_again'])}"}[x["kind"]]
            p(f"  token {x['position']}, {x['segment']}: {what} ({x['verirl_tokens']} -> "
              f"{x['rendered_again_tokens']} tokens)")
        p(f"  rendered again: {r['sampled_tokens_lost']} of the {r['sampled_tokens']} sampled tokens dropped or "
          f"changed, {r['tokens_added']} tokens that no turn sampled")
    p(out["what_verirl_does"])
    same = all(r["same"] for r in out["variants"].values())
    p("the same tokens for every variant: exit 0" if same else
      "exit 0: verirl handles this template (it trains on the sampled tokens); the differences above are what "
      "a system that re-tokenizes would train on")


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
