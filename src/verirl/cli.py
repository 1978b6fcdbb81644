"""`verirl train | sft | preprocess | export | eval`.

Errors a user can fix (config, files, batch shapes) print one paragraph and exit 2;
set VERIRL_DEBUG=1 to see the traceback too.
"""
from __future__ import annotations

import argparse
import os
import sys

EPILOG = """examples:
  verirl train --config configs/tiny_grpo.yaml
  verirl train --config configs/tiny_grpo.yaml trainer.total_steps=50 actor.lr=2e-4 trainer.run_dir=runs/try
  verirl train --help-config        # every key with its default
  verirl sft --config configs/tiny_sft.yaml   # rebuild the shipped tiny model
  verirl preprocess --config configs/preprocess_example.yaml input=data/raw.jsonl output_prefix=data/train
  verirl export runs/tiny_grpo/20261129-120000 exported/   # newest checkpoint -> a Hugging Face directory
  verirl eval --model exported/ --data arith --n 8          # avg@8, pass@1..8, maj@8 on the held-out split

A run checkpoints every trainer.save_freq steps into RUN_DIR/checkpoints and continues from
the newest one when started again with the same trainer.run_dir (trainer.resume=auto).
Ctrl-C / SIGTERM saves a checkpoint after the current step and stops; a second one stops at once.

Batch sizes: data.prompts_per_step and actor.mini_batch_prompts count PROMPTS (each sampled
rollout.n times); actor.micro_batch_size counts SEQUENCES.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verirl", description="GRPO with verifiable rewards.", epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in [("train", "GRPO training (writes RUN_DIR/metrics.jsonl, RUN_DIR/final/)"),
                        ("sft", "supervised warm start on a built-in task (builds the tiny model)"),
                        ("preprocess", "raw json/jsonl/parquet/arrow -> tokenized prompts (MindSpeed-RL keys)")]:
        s = sub.add_parser(name, help=help_, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        s.add_argument("--config", "-c", help="YAML config file")
        s.add_argument("--help-config", action="store_true", help="print every config key with its default")
        s.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after the file")
    e = sub.add_parser("export", help="a checkpoint -> a Hugging Face model directory (transformers, vLLM)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("checkpoint", help="RUN_DIR (its newest checkpoint), RUN_DIR/checkpoints or .../step_N")
    e.add_argument("out_dir", help="new directory for config.json, model.safetensors, tokenizer, generation_config")
    v = sub.add_parser("eval", help="sample n responses per prompt: avg@n, pass@k, maj@n (table + JSON)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("--model", default="tiny", help="a Hugging Face model directory, or tiny (default)")
    v.add_argument("--data", default="arith",
                   help="a json/jsonl/parquet/arrow file or folder (raw or preprocessed), or arith: the built-in "
                        "held-out split (default)")
    v.add_argument("--n", type=int, default=8, help="samples per prompt (default 8)")
    v.add_argument("--template", default="tokenizer", help="prompt template for raw files (default: the model's own)")
    v.add_argument("--templates-file", default="", help="your own templates.json (MindSpeed-RL format)")
    v.add_argument("--handler", default="R1AlpacaStyleInstructionHandler", help="or VerlParquetHandler")
    v.add_argument("--verifiers", default="acc", help="comma-separated rules for the score (default acc)")
    v.add_argument("--max-new-tokens", type=int, default=32)
    v.add_argument("--max-prompt-length", type=int, default=1024)
    v.add_argument("--temperature", type=float, default=1.0)
    v.add_argument("--engine", default="native", choices=["native", "hf"])
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--limit", type=int, default=0, help="evaluate only the first N prompts (0 = all)")
    v.add_argument("--val-size", type=int, default=200, help="with --data arith: held-out problems (default 200)")
    v.add_argument("--json", default="", help="write the results here as JSON ('-' = standard output)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "export":
        return _export(args)
    if args.command == "eval":
        return _eval(args)
    from verirl.config import Config, ConfigError, SFTConfig, describe, load_config
    from verirl.data.preprocess import PreprocessConfig

    schema = {"train": Config, "sft": SFTConfig, "preprocess": PreprocessConfig}[args.command]
    if args.help_config:
        print(describe(schema))
        return 0
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # our own progress is enough; theirs floods logs with load bars
    try:
        cfg = load_config(args.config, args.overrides, schema)
        if args.command == "train":
            from verirl.train.trainer import TrainingInterrupted, train
            try:
                train(cfg)
            except TrainingInterrupted as stop:
                print(f"verirl train: {stop}", file=sys.stderr)
                return 128 + stop.signum
        elif args.command == "preprocess":
            from verirl.data.preprocess import preprocess
            preprocess(cfg)
        else:
            from verirl.train.sft import sft
            sft(cfg)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        return _user_error(args.command, e, "config error" if isinstance(e, ConfigError) else "error")
    except KeyboardInterrupt:
        print(f"verirl {args.command}: interrupted.", file=sys.stderr)
        return 130
    return 0


def _user_error(command: str, e: Exception, kind: str = "error") -> int:
    """One paragraph on stderr and exit status 2; with VERIRL_DEBUG=1 the exception is re-raised
    (traceback)."""
    if os.environ.get("VERIRL_DEBUG"):
        raise e
    print(f"verirl {command}: {kind}: {e}", file=sys.stderr)
    return 2


def _eval(args) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from verirl.data import arith_split, encode_prompts
    from verirl.data.dataset import load_prompts
    from verirl.evaluate import evaluate_samples
    from verirl.models import load_model
    from verirl.rewards import Scorer
    from verirl.rollout import build_engine

    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    console = Console(stderr=args.json == "-")
    try:
        if args.n < 1:
            raise ValueError(f"--n {args.n}: give at least one sample per prompt.")
        if args.model != "tiny" and not os.path.isdir(args.model):
            raise FileNotFoundError(f"--model {args.model}: not a directory. Give a Hugging Face model directory "
                                    f"(e.g. from `verirl export`) or tiny.")
        lm = load_model(args.model, "float32", "auto")
        if args.data == "arith":
            _, prompts = arith_split(0, 0, args.val_size)
            prompts = encode_prompts(prompts, lm.tokenizer, args.max_prompt_length, "arith val", "filter")
        else:
            if not os.path.exists(args.data):
                raise FileNotFoundError(f"--data {args.data}: no such file or folder (or use --data arith).")
            prompts = load_prompts(args.data, lm.path, prompt_type=args.template, templates_file=args.templates_file,
                                   handler_name=args.handler, map_keys={}, additional_keys=["labels"],
                                   max_prompt_length=args.max_prompt_length, too_long="filter").prompts
        if args.limit:
            prompts = prompts[:args.limit]
        if not prompts:
            raise ValueError(f"--data {args.data}: no prompts to evaluate.")
        rules = [r for r in args.verifiers.split(",") if r]
        scorer = Scorer(rules, [1.0] * len(rules), workers=0)
        engine = build_engine(args.engine, lm.model, lm.pad_id, lm.stop_ids)
        with console.status(f"sampling {args.n} x {len(prompts)} prompts...") as status:
            res = evaluate_samples(engine, lm.tokenizer, prompts, args.n, scorer, args.max_new_tokens,
                                   args.temperature, args.seed,
                                   progress=lambda k: status.update(f"sampled {k}/{len(prompts)} prompts"))
    except (FileNotFoundError, ValueError) as e:
        return _user_error("eval", e)
    res.update({"model": args.model, "data": args.data, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "verifiers": rules})
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


def _export(args) -> int:
    from verirl.train.checkpoint import export_checkpoint
    try:
        out = export_checkpoint(args.checkpoint, args.out_dir)
    except (FileNotFoundError, FileExistsError, ValueError, NotImplementedError) as e:
        return _user_error("export", e)
    print(f"exported {args.checkpoint} -> {out} (load with AutoModelForCausalLM.from_pretrained('{out}'))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
