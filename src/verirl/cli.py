"""`verirl train | sft` (more commands arrive with their issues).

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
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
            from verirl.train.trainer import train
            train(cfg)
        elif args.command == "preprocess":
            from verirl.data.preprocess import preprocess
            preprocess(cfg)
        else:
            from verirl.train.sft import sft
            sft(cfg)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError, RuntimeError) as e:
        if os.environ.get("VERIRL_DEBUG"):
            raise
        kind = "config error" if isinstance(e, ConfigError) else "error"
        print(f"verirl {args.command}: {kind}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"verirl {args.command}: interrupted.", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
