"""`verirl train | plan | sft | preprocess | export | eval | doctor | convert-config | compare-runs |
compare-activations | report`.

Errors a user can fix (`verirl.core.errors.UserError`: config, files, data, checkpoints, batch
shapes) print one paragraph and exit 2; set VERIRL_DEBUG=1 to see the traceback too. Any
other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import os
import signal
import sys
from dataclasses import dataclass
from typing import Callable, Optional

EPILOG = """examples:
  verirl train                      # the embedded default (the tiny recipe), what `make run` runs
  verirl train trainer.total_steps=50 actor.lr=2e-4 trainer.run_dir=runs/try   # the tiny recipe, changed
  verirl train --config my.yaml     # your own file, on top of the defaults for a real model
  verirl train --help-config        # every key with its default (the defaults for a real model)
  verirl train --config tiny --help-config   # the same, resolved for the tiny recipe (what `verirl train` runs)
  verirl plan trainer.nproc_per_node=2                      # the layout per rank, memory; nothing loaded
  verirl train trainer.nproc_per_node=2                     # 2 ranks on this machine, FSDP2 (docs/distributed.md)
  verirl train trainer.launcher=ray trainer.nproc_per_node=2 # 2 Ray actors (docs/ray.md)
  verirl sft --config configs/tiny_sft.yaml   # rebuild the shipped tiny model
  verirl preprocess --config configs/preprocess_example.yaml input=data/raw.jsonl output_prefix=data/train
  verirl export runs/tiny_grpo/20261129-120000 exported/   # newest checkpoint -> a Hugging Face directory
  verirl eval --model exported/ --data arith --n 8          # greedy_acc, pass@1..8, maj@8 on the held-out split
  verirl doctor path/to/model                               # EOS / pad / BOS ids, chat template, numerics
  verirl doctor --template --model path/to/model            # its chat template against token in / token out
  verirl convert-config --from verl examples/verl_ppo_trainer_grpo.yaml -o grpo.yaml   # veRL / MindSpeed-RL -> verirl
  verirl compare-runs runs/a runs/b --png cmp.png           # two runs' curves against a tolerance (docs/alignment.md)
  verirl report runs/tiny_grpo/20261129-120000               # figures + an HTML page, RUN_DIR/report/index.html (docs/report.md)

A run checkpoints every trainer.save_freq steps into RUN_DIR/checkpoints and continues from
the newest one when started again with the same trainer.run_dir (trainer.resume=auto).
Ctrl-C / SIGTERM saves a checkpoint after the current step and stops; a second one stops at once.

Batch sizes: data.prompts_per_step and actor.mini_batch_prompts count PROMPTS (each sampled
rollout.n times); actor.micro_batch_size counts SEQUENCES.
"""


@contextlib.contextmanager
def _sigint_after_imports():
    """Hold Ctrl-C while torch and transformers import their C++ extensions, then raise it as usual:
    a KeyboardInterrupt raised inside a pybind11 call there aborts the process (exit -6, "terminate
    called after throwing an instance of 'pybind11::error_already_set'") instead of exiting 130."""
    got: list[int] = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    except ValueError:  # not the main thread: nothing to hold
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got:
        raise KeyboardInterrupt


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, what it adds to its parser, and what it runs (args -> exit status; a
    `verirl.core.errors.UserError` it raises is printed as one paragraph, exit 2). ``description``: the text
    above its options (a tool's module docstring); without one its --help ends with the examples."""
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: Optional[str] = None


def _tool(path: str) -> Command:
    """The command of a tool module (`verirl.tools`): its ``HELP``, ``add_arguments(parser)`` and ``run(args)``;
    a tool module imports nothing heavy (torch, transformers) at its top level."""
    module = importlib.import_module(path)
    return Command(module.HELP, module.add_arguments, module.run, module.__doc__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verirl", description="GRPO with verifiable rewards.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in commands().items():
        s = sub.add_parser(name, help=command.help, description=command.description,
                           epilog=None if command.description else EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(s)
    return p


def _config_arguments(p: argparse.ArgumentParser, recipe: bool = False) -> None:
    p.add_argument("--config", "-c", help="a YAML config file" + (
        ", or a recipe shipped with verirl (tiny); default: tiny" if recipe else ""))
    p.add_argument("--help-config", action="store_true",
                   help="print every config key with its default; with --config, with the file's values")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after the file")


def _train_arguments(p: argparse.ArgumentParser) -> None:
    _config_arguments(p, recipe=True)
    p.add_argument("--dry-run", action="store_true",
                   help="check the config and print the layout per rank and a memory estimate, as "
                        "`verirl plan`; loads no weights, starts nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as one JSON object")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no per-step output (log.progress=off, log.console_every=0); messages and the "
                        "final table remain")


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help="a YAML config file, or a recipe shipped with verirl (tiny); default: tiny")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after the file")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="RUN_DIR (its newest checkpoint), RUN_DIR/checkpoints or .../step_N; whole "
                                      "or sharded (whose model.safetensors is written tensor by tensor)")
    p.add_argument("out_dir", help="new directory for config.json, model.safetensors, tokenizer, generation_config")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA run's checkpoint (actor.lora.rank > 0) as its peft adapter directory "
                        "(adapter_config.json, adapter_model.safetensors: PeftModel.from_pretrained(base, OUT)) "
                        "instead of the merged model (docs/lora.md)")


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="a Hugging Face model directory (a run's RUN_DIR/final, or "
                                                   "`verirl export`'s output), a LoRA adapter directory (`verirl "
                                                   "export --adapter`'s: its base with the adapter merged), or tiny "
                                                   "(default)")
    p.add_argument("--data", default="arith",
                   help="a json/jsonl/parquet/arrow file or folder (raw or preprocessed), or arith: the built-in "
                        "held-out split (default)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (default 8; 0 = greedy only)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy decode (val greedy_acc)")
    p.add_argument("--template", default="tokenizer", help="prompt template for raw files (default: the model's own)")
    p.add_argument("--templates-file", default="", help="your own templates.json (MindSpeed-RL format)")
    p.add_argument("--handler", default="R1AlpacaStyleInstructionHandler", help="or VerlParquetHandler")
    p.add_argument("--verifiers", default="acc", help="comma-separated rules for the score (default acc)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-prompt-length", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling of the n samples (default 1.0: off)")
    p.add_argument("--top-k", type=int, default=0,
                   help="sample from the k most likely tokens (default 0: off)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per scoring call")
    p.add_argument("--no-sandbox", dest="sandbox", action="store_false",
                   help="score in plain workers, with this user's files, network and environment (docs/sandbox.md)")
    p.add_argument("--engine", default="native", choices=["native", "hf", "vllm"],
                   help="native (default), hf (transformers generate) or vllm (pip install 'verirl[vllm]'; docs/vllm.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts (0 = all)")
    p.add_argument("--size", "--val-size", dest="size", type=int, default=200,
                   help="with --data arith: held-out problems (default 200)")
    p.add_argument("--json", default="", help="write the results here as JSON ('-' = standard output)")
    p.add_argument("--tools", default="", help="comma-separated tools the model may call: multi-turn episodes, the "
                                               "last turn scored (calculator, python, file.py:function, a veRL tool "
                                               "config; docs/agents.md); default none: single-turn")
    p.add_argument("--environment", default="", help="an environment (file.py:Class) to talk to, multi-turn")
    p.add_argument("--max-turns", type=int, default=4, help="assistant turns per episode with --tools/--environment")
    for action in p._actions:  # the config key each flag sets, as `verirl train` would name it
        if action.dest in EVAL_KEYS:
            action.help = f"{action.help} [{EVAL_KEYS[action.dest]}]"
        elif action.dest in EVAL_MULTI_TURN:
            action.help = f"{action.help} [{EVAL_MULTI_TURN[action.dest]}]"


@functools.lru_cache(maxsize=1)
def commands() -> dict[str, Command]:
    """Every subcommand, in the order of `verirl --help`."""
    return {
        "train": Command("GRPO training (writes RUN_DIR/metrics.jsonl, RUN_DIR/final/)", _train_arguments, _train),
        "sft": Command("supervised warm start on a built-in task (builds the tiny model)", _config_arguments,
                       _configured),
        "preprocess": Command("raw json/jsonl/parquet/arrow -> tokenized prompts (MindSpeed-RL keys)",
                              _config_arguments, _configured),
        "plan": Command("check a training config and print its layout per rank and a memory estimate (no weights "
                        "loaded)", _plan_arguments, _plan),
        "export": Command("a checkpoint -> a Hugging Face model directory (transformers, vLLM)", _export_arguments,
                          _export),
        "eval": Command("greedy accuracy and n samples per prompt: pass@k, maj@n, mean reward", _eval_arguments,
                        _eval),
        "doctor": _tool("verirl.tools.align.doctor"),
        "convert-config": _tool("verirl.tools.align.convert"),
        "compare-runs": _tool("verirl.tools.align.compare_runs"),
        "compare-activations": _tool("verirl.tools.align.activations"),
        "report": _tool("verirl.tools.report"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # KEY=VALUE overrides after an option (e.g. FILE -o OUT KEY=VALUE) join the others, in order
        if not hasattr(args, "overrides") or any(a.startswith("-") for a in extra):
            parser.parse_args(argv)  # argparse's own message for what is not an override, exit 2
        args.overrides = [*args.overrides, *extra]
    try:
        code = _run(args)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's flush at exit
        return code
    except KeyboardInterrupt:  # Ctrl-C at any point, start-up included: no traceback
        print(f"verirl {args.command}: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`verirl plan --json | head`): stop quietly, as cat does
        _drop_stdout()
        return 128 + signal.SIGPIPE


def _drop_stdout() -> None:
    """Standard output to /dev/null, so that the interpreter's flush at exit does not fail on the closed pipe
    again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _run(args) -> int:
    from verirl.core.errors import UserError, check_env

    try:
        check_env()  # VERIRL_* switches, for every command: a misspelled value stops here, not mid-run
        return commands()[args.command].run(args)
    except UserError as e:
        return _user_error(args.command, e)


def _train(args) -> int:
    return _plan(args) if args.dry_run else _configured(args)


def _configured(args) -> int:
    """`verirl train | sft | preprocess`: the config (file, then overrides) and the run it describes."""
    from verirl.config import Config, PreprocessConfig, SFTConfig, describe, load_config, to_yaml
    from verirl.core.errors import UserError

    schema = {"train": Config, "sft": SFTConfig, "preprocess": PreprocessConfig}[args.command]
    if args.help_config:
        if not args.config and not args.overrides:
            print(describe(schema))
            return 0
        try:
            print(to_yaml(load_config(args.config, args.overrides, schema)))
        except UserError as e:
            return _user_error(args.command, e)
        return 0
    with _sigint_after_imports():
        from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # our own progress is enough; theirs floods logs with load bars
    try:
        quiet = ["log.progress=off", "log.console_every=0"] if getattr(args, "quiet", False) else []
        overrides = list(args.overrides) + quiet
        cfg = load_config(args.config or ("tiny" if args.command == "train" else None), overrides, schema)
        if args.command == "train":
            with _sigint_after_imports():
                from verirl.launch import run
                from verirl.train.loop import TrainingInterrupted
            try:
                run(cfg)
            except TrainingInterrupted as stop:
                print(f"verirl train: {stop}", file=sys.stderr)
                return 128 + stop.signum
        elif args.command == "preprocess":
            from verirl.data.preprocess import preprocess
            preprocess(cfg)
        else:
            from verirl.train.sft import sft
            sft(cfg)
    except UserError as e:
        return _user_error(args.command, e)
    except Exception as e:
        if type(e).__name__ != "OutOfMemoryError":  # torch.OutOfMemoryError, on any device
            raise
        return _user_error(args.command, UserError(
            f"out of memory: {e} Lower actor.micro_batch_size or actor.max_token_len_per_device, "
            f"ref.log_prob_max_token_len_per_device, rollout.micro_batch_size or data.prompts_per_step."))
    except KeyboardInterrupt:
        print(f"verirl {args.command}: interrupted.", file=sys.stderr)
        return 130
    return 0


def _user_error(command: str, e: Exception) -> int:
    """One paragraph on stderr and exit status 2; with VERIRL_DEBUG=1 the exception is re-raised
    (traceback)."""
    from verirl.core.errors import ConfigError

    if os.environ.get("VERIRL_DEBUG"):
        raise e
    kind = getattr(e, "kind", "config error" if isinstance(e, ConfigError) else "error")
    print(f"verirl {command}: {kind}: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


def _plan(args) -> int:
    """`verirl plan` and `verirl train --dry-run`: the config as `verirl train` resolves it, every check,
    the layout per rank and a memory estimate; exit 2 with one paragraph when a check fails."""
    import json

    from verirl.config import load_config
    from verirl.core.errors import UserError
    from verirl.tools.plan import make_plan, render

    try:
        plan = make_plan(load_config(args.config or "tiny", args.overrides), source=args.config or "tiny")
    except UserError as e:
        return _user_error(args.command, e)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else render(plan), end="" if not args.json else "\n")
    return 0


def _eval(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from verirl.core.errors import ConfigError, UserError
    from verirl.run.checks import check
    from verirl.train.build import build_eval
    from verirl.train.evaluate import evaluate

    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    console = Console(stderr=args.json == "-")
    try:
        if args.n == 0 and args.no_greedy:
            raise ConfigError("--n 0 --no-greedy: nothing to evaluate. Give at least one sample per prompt (--n), "
                              "or leave the greedy decode on.")
        if args.json and args.json != "-":  # before the work, not after it
            where = os.path.dirname(os.path.abspath(args.json))
            if not os.path.isdir(where) or not os.access(where, os.W_OK) or (
                    os.path.exists(args.json) and not os.access(args.json, os.W_OK)):
                raise ConfigError(f"--json {args.json}: cannot write there (no such folder, or not writable). "
                                  f"Give a writable path.")
        _not_a_run_dir(args.model)
        try:
            cfg = eval_config(args)
            check(cfg, run_dir=False)  # the checks of `verirl train`, but for the run directory eval writes none
            parts = build_eval(cfg, limit=args.limit)
        except UserError as e:
            raise _in_flags(e, {**EVAL_KEYS, **EVAL_MULTI_TURN}) from None
        lm, prompts, scorer, engine = parts.lm, parts.prompts, parts.scorer, parts.engine
        try:
            what = f"{len(prompts)} prompts ({'' if args.no_greedy else 'greedy + '}{args.n} samples each)"
            with console.status(f"evaluating {what}...") as status:
                e = cfg.eval
                res = evaluate(engine, lm.tokenizer, prompts, scorer, n=e.n, max_new_tokens=cfg.rollout.max_new_tokens,
                               temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, greedy=e.greedy,
                               seed=cfg.trainer.seed, multi_turn=parts.multi_turn,
                               progress=_eval_progress(console, status, len(prompts)))
        finally:
            scorer.close()
            if parts.environments is not None:
                parts.environments.close()
    except UserError as e:
        return _user_error("eval", e)
    res.update({"model": args.model, "data": args.data, "temperature": args.temperature, "top_p": args.top_p,
                "top_k": args.top_k,
                "max_new_tokens": args.max_new_tokens, "verifiers": cfg.reward.verifiers,
                "tools": [t for t in args.tools.split(",") if t], "environment": args.environment})
    keys = [k for k in res["overall"] if k != "prompts"]
    t = Table(title=f"verirl eval: {args.model} on {args.data}, n={args.n}, T={args.temperature}")
    t.add_column("subset")
    t.add_column("prompts", justify="right")
    for k in keys:
        t.add_column(k, justify="right")
    for name, m in [("overall", res["overall"]), *res["groups"].items()]:
        t.add_row(name, f"{int(m['prompts'])}", *[f"{m[k]:.3f}" for k in keys])
    console.print(t)
    if args.json == "-":
        print(json.dumps(res, indent=2))
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
        console.print(f"results: {args.json}")
    return 0


# `verirl eval`'s flags (argparse's names) and the config key each sets; its errors name the flag
EVAL_KEYS = {"model": "model.path", "data": "eval.data", "size": "eval.size", "n": "eval.n",
             "temperature": "eval.temperature", "top_p": "eval.top_p", "top_k": "eval.top_k",
             "template": "data.prompt_type", "templates_file": "data.templates_file", "handler": "data.handler_name",
             "max_prompt_length": "data.max_prompt_length", "max_new_tokens": "rollout.max_new_tokens",
             "engine": "rollout.engine", "verifiers": "reward.verifiers", "timeout": "reward.timeout",
             "sandbox": "reward.sandbox",
             "seed": "trainer.seed"}


EVAL_MULTI_TURN = {"tools": "rollout.multi_turn.tools", "environment": "rollout.multi_turn.environment",
                   "max_turns": "rollout.multi_turn.max_turns"}


def eval_config(args):
    """The config `verirl eval`'s flags describe: the model in float32 on the default device, the built-in
    task's held-out split for --data arith (or another built-in task's name), the rules at equal weights;
    with --tools or --environment, multi-turn episodes."""
    from verirl.config import load_config_dict
    from verirl.data.tasks import TASKS

    values: dict = {}
    for dest, key in EVAL_KEYS.items():
        section, name = key.split(".")
        values.setdefault(section, {})[name] = getattr(args, dest)
    builtin = args.data in TASKS  # a built-in task by name: its held-out split
    values["eval"]["data"] = "" if builtin else args.data
    if builtin:
        values["data"]["task"] = args.data
    tools = [t for t in args.tools.split(",") if t]
    if tools or args.environment:
        values["rollout"]["multi_turn"] = {"enable": True, "tools": tools, "environment": args.environment,
                                           "max_turns": args.max_turns}
    values["eval"]["greedy"] = not args.no_greedy
    values["reward"]["verifiers"] = [r for r in args.verifiers.split(",") if r]
    values["reward"].update(weights=[1.0] * len(values["reward"]["verifiers"]), tasks={})
    return load_config_dict(values)


def _in_flags(e: Exception, keys: dict[str, str]) -> Exception:
    """``e`` with each config key of ``keys`` named by its flag (model.path -> --model)."""
    import copy
    import re

    text = str(e)
    for dest, key in sorted(keys.items(), key=lambda kv: -len(kv[1])):
        text = re.sub(rf"(?<![\w.-]){re.escape(key)}(?![\w.])", "--" + dest.replace("_", "-"), text)
    named = copy.copy(e)
    named.args = (text,)
    return named


def _eval_progress(console, status, total: int):
    """`verirl eval`'s progress after each batch of prompts: the spinner's text on a terminal, else one plain
    line (a log, CI), where the spinner shows nothing."""
    import time

    t0 = time.monotonic()

    def show(done: int) -> None:
        line = f"evaluated {done}/{total} prompts in {time.monotonic() - t0:.0f}s"
        if console.is_terminal:
            status.update(line)
        else:
            console.print(f"eval: {line}")
    return show


def _not_a_run_dir(path: str) -> None:
    """A training run's directory given as --model: say which model in it to evaluate."""
    from pathlib import Path

    from verirl.core.errors import ConfigError

    run = Path(path)
    if (run / "config.json").exists() or not ((run / "metrics.jsonl").exists() or (run / "checkpoints").is_dir()):
        return
    final = run / "final"
    if (final / "config.json").exists():
        raise ConfigError(f"--model {path}: a training run's directory, not a model. Evaluate the model it ended "
                          f"with, --model {final}, or a checkpoint of it: `verirl export {path} OUT`, then --model OUT.")
    raise ConfigError(f"--model {path}: a training run's directory, not a model, and it has no final model yet "
                      f"({final}: the run has not finished). Export its newest checkpoint first: "
                      f"`verirl export {path} OUT`, then --model OUT.")


def _export(args) -> int:
    from verirl.core.errors import UserError
    from verirl.run.checkpoint import export_checkpoint
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, adapter=args.adapter)
    except UserError as e:
        return _user_error("export", e)
    how = f"PeftModel.from_pretrained(base, '{out}'), or verirl eval --model {out}" if args.adapter else \
        f"AutoModelForCausalLM.from_pretrained('{out}')"
    print(f"exported {args.checkpoint} -> {out} (load with {how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
