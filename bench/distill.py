"""On-policy distillation on the embedded task (docs/algorithms.md): how much of the held-out gap between
a student and its teacher a distilled student closes.

* student: the shipped SFT start (``model.path=tiny``), measured by the run's own evaluation before
  training;
* teacher: a `make run` result (``--teacher RUN_DIR/final``), or one trained here with the embedded
  default's 700 GRPO steps when none is given; measured by the same evaluation, before the first step of
  a one-step run from it;
* distilled: the student trained ``--steps`` steps with ``algo.distill.teacher`` and ``algo.distill.rewards``
  (``--rewards``: the rules' GRPO advantage added to the teacher's per-token one; default off: the
  teacher's signal alone);
* grpo: the student trained the same steps by the embedded default's GRPO alone, for comparison
  (``--no-baseline`` skips it).

Held-out: eval.size=200 problems never trained on, 4 samples each (val/pass@1) and greedy (val/greedy_acc).
The gap closed is (distilled - student) / (teacher - student), on pass@1 and on greedy accuracy.

    .venv/bin/python bench/distill.py --save-teacher /tmp/teacher  # trains a teacher first (~5-12 min more)
    .venv/bin/python bench/distill.py --teacher runs/tiny_grpo/<date-time>/final --steps 200
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train(run: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={run}", "log.progress=off",
           "log.console_every=0", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((run / "summary.json").read_text())
    summary["wall_s"] = time.monotonic() - start
    return summary


def held_out(evaluation: dict) -> tuple[float, float]:
    return evaluation["val/pass@1"], evaluation["val/greedy_acc"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", help="a trained model directory (RUN_DIR/final); default: train one here")
    ap.add_argument("--steps", type=int, default=200, help="distillation steps")
    ap.add_argument("--coef", type=float, default=1.0, help="algo.distill.coef")
    ap.add_argument("--rewards", action="store_true", help="add the rules' GRPO advantage (algo.distill.rewards)")
    ap.add_argument("--lr", type=float, default=None, help="actor.lr of the distillation (default: the recipe's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-teacher", help="copy the teacher trained here to this directory")
    ap.add_argument("--no-baseline", action="store_true", help="skip the GRPO-alone run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.teacher:
            teacher_dir = Path(args.teacher).resolve()
        else:
            t = train(tmp / "teacher", "eval.before_train=false", f"trainer.seed={args.seed}")
            teacher_dir = Path(t["final_model"])
            print(f"teacher: {t['steps']} GRPO steps in {t['wall_s']:.0f} s", flush=True)
            if args.save_teacher:
                shutil.copytree(teacher_dir, args.save_teacher, dirs_exist_ok=True)
        judged = train(tmp / "teacher_eval", f"model.path={teacher_dir}", "trainer.total_steps=1",
                       "eval.before_train=true", "eval.at_end=false", f"trainer.seed={args.seed}")
        teacher = held_out(judged["eval_start"])
        extra = [f"actor.lr={args.lr}"] if args.lr is not None else []
        d = train(tmp / "distilled", f"algo.distill.teacher={teacher_dir}", f"algo.distill.coef={args.coef}",
                  f"algo.distill.rewards={str(args.rewards).lower()}", f"trainer.total_steps={args.steps}",
                  f"trainer.seed={args.seed}", *extra)
        student, distilled = held_out(d["eval_start"]), held_out(d["eval_end"])
        rows = [json.loads(line) for line in (tmp / "distilled" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "distill/reverse_kl" in r]
        kl_first, kl_last = steps[0]["distill/reverse_kl"], steps[-1]["distill/reverse_kl"]
        teacher_s = sum(r.get("timing/teacher", 0.0) for r in steps) / len(steps)
        step_s = d["train_seconds"] / d["steps"]
        grpo = None if args.no_baseline else held_out(train(tmp / "grpo", f"trainer.total_steps={args.steps}",
                                                             f"trainer.seed={args.seed}", "eval.before_train=false",
                                                             *extra)["eval_end"])
    print(f"\n{'':<10} {'pass@1':>7} {'greedy':>7}")
    rows_out = [("student", student), ("teacher", teacher), ("distilled", distilled)]
    rows_out += [("grpo", grpo)] if grpo else []
    for name, (p, g) in rows_out:
        print(f"{name:<10} {p:>7.3f} {g:>7.3f}")
    for name, x in rows_out[2:]:
        closed = [(v - s) / (t - s) if t != s else float("nan") for s, t, v in zip(student, teacher, x)]
        print(f"{name}: gap closed in {d['steps']} steps: pass@1 {closed[0]:.2f}, greedy {closed[1]:.2f}")
    print(f"reverse KL per token {kl_first:.3f} (step 1) -> {kl_last:.3f} (step {len(steps)}); "
          f"{step_s:.2f} s/step, of which the teacher's pass {teacher_s:.3f} s")


if __name__ == "__main__":
    main()
