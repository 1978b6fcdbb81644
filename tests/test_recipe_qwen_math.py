"""Seed 001's GPU recipe (configs/qwen2.5-1.5b-math.yaml) cannot rot: the file loads, says what the
recipe is, and one GRPO step of it runs on CPU with the tiny model swapped in, MATH-style data
preprocessed by the recipe's own preprocess config, and the native engine instead of vLLM."""
import json
from pathlib import Path

from verirl.cli import main
from verirl.config import load_config
from verirl.rewards.rules import math_graded

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "qwen2.5-1.5b-math.yaml"
PREPROCESS = ROOT / "configs" / "qwen2.5-1.5b-math-preprocess.yaml"

# MATH-lighteval's columns (problem, level, solution, type); the answer is the solution's last \boxed{}
ROWS = [
    {"problem": "What is $2+3$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "We add: $2+3=\\boxed{5}$."},
    {"problem": "Simplify $\\frac{6}{8}$.", "level": "Level 1", "type": "Prealgebra",
     "solution": "Divide by 2: $\\frac{6}{8}=\\boxed{\\frac{3}{4}}$."},
    {"problem": "What is $7 \\times 6$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "$7 \\times 6 = \\boxed{42}$."},
    {"problem": "Solve $x+1=4$ for $x$.", "level": "Level 2", "type": "Algebra",
     "solution": "Subtract 1 from both sides: $x=\\boxed{3}$."},
]


def test_recipe_is_seed_001s():
    cfg = load_config(str(RECIPE))
    assert cfg.rollout.engine == "vllm" and cfg.trainer.nproc_per_node == 1  # vLLM runs in one process only
    assert cfg.reward.verifiers == ["math"] and cfg.model.dtype == "float32"
    # on-policy: the old-log-prob pass is skipped
    assert cfg.actor.mini_batch_prompts == cfg.data.prompts_per_step and cfg.actor.epochs == 1
    assert (cfg.data.prompts_per_step, cfg.rollout.n, cfg.actor.lr, cfg.algo.kl_coef) == (256, 8, 1e-6, 0.001)
    assert (cfg.data.max_prompt_length, cfg.rollout.max_new_tokens) == (512, 1024)


def test_math_rule_scores_math_solutions_as_labels():
    """The label is MATH's whole worked solution; the graded rule compares with its last \\boxed{}."""
    right = "<think>\nStep 1: divide both by 2.\nStep 2: so 6/8 = 3/4.\n</think>\n<answer>\\boxed{0.75}</answer>"
    assert math_graded(right, ROWS[1]["solution"]) == 1.0
    assert math_graded("The answer is \\boxed{3/4}.", ROWS[1]["solution"]) == 0.7
    assert math_graded("The answer is \\boxed{5}.", ROWS[1]["solution"]) == 0.0


def test_recipe_runs_one_step_on_cpu(tmp_path):
    raw = tmp_path / "math.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    prefix = tmp_path / "data" / "train"
    assert main(["preprocess", "--config", str(PREPROCESS), f"input={raw}", "tokenizer_name_or_path=tiny",
                 f"output_prefix={prefix}", "workers=1"]) == 0
    run = tmp_path / "run"
    assert main(["train", "--config", str(RECIPE),
                 "model.path=tiny", "model.dtype=float32", "model.device=cpu", "rollout.engine=native",
                 f"data.train_path={prefix}.parquet", f"eval.data={raw}",  # raw: read with data.map_keys
                 "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2",
                 "rollout.max_new_tokens=16", "eval.before_train=false", "eval.n=0",
                 "trainer.total_steps=1", f"trainer.run_dir={run}", "reward.workers=0",
                 "log.progress=false"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    row = rows[0]
    assert row["timing/old_log_prob"] == 0.0  # on-policy, as the recipe: no old-log-prob pass
    assert row["timing/ref"] > 0 and "actor/kl" in row  # kl_coef 0.001: the reference pass ran
    assert "reward/math/mean" in row and "val/greedy_acc" in row  # the graded rule; MATH-style eval data
    manifest = json.loads(Path(f"{prefix}.manifest.json").read_text())
    assert "qwen_r1" in json.dumps(manifest)
