"""Training on multi-turn episodes, end to end through `verirl train`: an environment written as a user
writes one (a file), one rank against two ranks (the same episodes), a resume after a multi-turn step
(the step it continues with equals the uninterrupted run's), and a replay of the dumped episodes
(trains to the same metrics without running the environment)."""
import json
import re
import textwrap
from pathlib import Path

import pytest

from verirl.cli import main

ENV_FILE = textwrap.dedent('''
    class Hints:
        """Two hints, then the episode ends; 0.1 per hint, 0.5 more for an answer in the last turn."""

        def __init__(self):
            self.seen = 0

        def reset(self, prompt):
            return None

        def step(self, turn):
            from verirl.envs import EnvStep

            self.seen += 1
            if self.seen > 2:
                return EnvStep(None, 0.5 if "<answer>" in turn else 0.0, True)
            return EnvStep([{"role": "user", "content": f"hint {self.seen}: check the sum"}], 0.1, False)

        def close(self):
            pass
''')

BASE = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=96",
        "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
        "reward.workers=0", "algo.kl_coef=0.01", "trainer.dump_rollouts=true", "trainer.threads=1",
        "trainer.dist_timeout_s=60", "model.compute_dtype=null", "rollout.multi_turn.enable=true",
        "rollout.multi_turn.max_tokens_per_turn=32"]


def _rows(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


@pytest.fixture
def env(tmp_path) -> str:
    path = tmp_path / "hints.py"
    path.write_text(ENV_FILE)
    return f"rollout.multi_turn.environment={path}:Hints"


def _close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12) or abs(a - b) < 1e-7


@pytest.mark.parametrize("reward", ["sum", "last"])
def test_a_multi_turn_step_trains_and_dumps_its_episodes(tmp_path, env, reward):
    run = tmp_path / "run"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", env, *BASE,
                 f"rollout.multi_turn.reward={reward}"]) == 0
    (m,) = _rows(run)
    assert m["turns/mean"] == pytest.approx(3.0) and m["turns/max"] == 3.0
    # a multi-turn step's tool counts and tool time are logged even when no tool is called
    assert {"tools/calls_mean", "tools/errors", "tools/parse_errors", "tools/timeouts", "timing/tools"} <= set(m)
    assert m["tools/calls_mean"] == m["tools/errors"] == m["tools/parse_errors"] == m["tools/timeouts"] == 0.0
    assert m["timing/tools"] >= 0.0
    view = _live_view(m)
    for label, key in [("turns", "turns/mean"), ("max", "turns/max"), ("with observations", "response_length/total"),
                       ("tool errors", "tools/errors"), ("tool time s", "timing/tools")]:
        assert re.search(rf"^ *{label} +{re.escape(f'{m[key]:.4g}')} ", view, re.M), (label, view)
    assert f"rollout {m['timing/rollout']:.2f}s (tools {m['timing/tools']:.2f}s)" in view, view
    assert m["response_length/model_tokens"] < m["response_length/total"]  # the hints are not trained on
    records = _rows(run, "rollouts.jsonl")
    assert len(records) == 16
    for r in records:
        roles = [s[0] for s in r["segments"]]
        assert roles == ["assistant", "observation", "assistant", "observation", "assistant"]
        assert sum(s[1] for s in r["segments"]) == len(r["response_ids"]) == r["response_length"]
        assert "hint 1: check the sum" in r["turns"][1]["text"] and r["turns"][1]["role"] == "observation"
        # the last turn reaches the environment only when it ended on its stop token (not cut at its limit)
        answered = r["stopped"] and "<answer>" in r["turns"][-1]["text"]
        if reward == "sum":  # 0.1 + 0.1 for the hints, 0.5 for an answer in the last turn
            assert r["env_reward"] == pytest.approx(0.2 + (0.5 if answered else 0.0))
        else:  # the last reward the environment returned: the third turn's, or the second hint's when cut
            assert r["env_reward"] == pytest.approx((0.5 if answered else 0.0) if r["stopped"] else 0.1)
        assert r["scores"]["env"] == r["env_reward"]
        weights = {"acc": 1.0, "exact": 1.0, "format": 0.1}  # the tiny config's rules, per task
        rules = sum(weights[k] * v for k, v in r["scores"].items() if k != "env" and v is not None)
        assert r["reward"] == pytest.approx(rules + r["env_reward"])  # what the step trains on
    assert m["reward/env/mean"] == pytest.approx(sum(r["env_reward"] for r in records) / len(records))


def _live_view(m: dict) -> str:
    """The rich live view's table and phase bar of one step's metrics, as plain text."""
    import io

    from rich.console import Console

    from verirl.run.display import metrics_table, phase_bar

    out = io.StringIO()
    console = Console(file=out, width=160, color_system=None)
    console.print(metrics_table(m, [m]))
    console.print(phase_bar(m))
    return out.getvalue()


def test_a_resumed_multi_turn_run_continues_as_the_uninterrupted_one(tmp_path, env):
    whole, split = tmp_path / "whole", tmp_path / "split"
    args = ["train", "trainer.save_freq=1", env, *BASE]
    assert main(args + [f"trainer.run_dir={whole}", "trainer.total_steps=2"]) == 0
    assert main(args + [f"trainer.run_dir={split}", "trainer.total_steps=1"]) == 0
    assert main(args + [f"trainer.run_dir={split}", "trainer.total_steps=2"]) == 0
    a, b = _rows(whole), _rows(split)
    assert [r["step"] for r in b] == [1, 2]
    ra = [r for r in _rows(whole, "rollouts.jsonl") if r["step"] == 2]
    rb = [r for r in _rows(split, "rollouts.jsonl") if r["step"] == 2]
    assert [(r["response_ids"], r["segments"]) for r in ra] == [(r["response_ids"], r["segments"]) for r in rb]
    for key in ("reward/mean", "turns/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/entropy"):
        assert _close(a[1][key], b[1][key]), (key, a[1][key], b[1][key])


def test_a_replayed_multi_turn_dump_trains_to_the_same_metrics(tmp_path, env):
    first, again = tmp_path / "first", tmp_path / "again"
    args = ["train", "trainer.total_steps=2", *BASE]
    assert main(args + [f"trainer.run_dir={first}", env]) == 0
    assert main(args + [f"trainer.run_dir={again}", "rollout.engine=replay",
                        f"rollout.replay_path={first / 'rollouts.jsonl'}"]) == 0
    a, b = _rows(first), _rows(again)
    for step in range(2):
        for key in ("reward/mean", "turns/mean", "response_length/model_tokens", "actor/pg_loss", "actor/kl",
                    "actor/grad_norm", "actor/entropy"):
            assert _close(a[step][key], b[step][key]), (step, key, a[step][key], b[step][key])


TOOLS = ["model.path=tiny-tools", "data.task=arith_tools", "data.max_prompt_length=96", "rollout.temperature=0.7",
         "rollout.multi_turn.tools=[calculator]", "rollout.multi_turn.max_turns=2", "rollout.multi_turn.max_tokens_per_turn=40",
         "reward.verifiers=[acc]",
         "reward.weights=[1.0]", "reward.tasks={}"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["environment", "calculator"])
def test_two_ranks_take_the_one_rank_multi_turn_step(tmp_path, env, kind):
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["train", "trainer.total_steps=1", *BASE, *([env] if kind == "environment" else TOOLS)]
    assert main(args + [f"trainer.run_dir={one}"]) == 0
    assert main(args + [f"trainer.run_dir={two}", "trainer.nproc_per_node=2", "actor.strategy=ddp"]) == 0
    drop = ("prompt",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in _rows(one, "rollouts.jsonl")] == \
        [{k: v for k, v in r.items() if k not in drop} for r in _rows(two, "rollouts.jsonl")]
    (a,), (b,) = _rows(one), _rows(two)
    if kind == "calculator":
        assert a["tools/calls_mean"] > 0.5 and a["turns/mean"] > 1.5  # the model called the calculator
        assert {"tools/errors", "tools/parse_errors", "tools/timeouts"} <= set(a) and a["timing/tools"] > 0
    for key in ("reward/mean", "turns/mean", "tools/calls_mean", "response_length/model_tokens",
                "response_length/total"):
        assert a[key] == b[key], key
    for key in ("actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/entropy"):
        assert _close(a[key], b[key]), (key, a[key], b[key])


def test_the_embedded_tools_demo_passes_the_checks_and_plans(capsys):
    """configs/tiny_tools.yaml (docs/agents.md's demo) is a config `verirl train` accepts as it is."""
    config = Path(__file__).resolve().parent.parent / "configs" / "tiny_tools.yaml"
    assert main(["plan", "--config", str(config)]) == 0
    assert "tiny-tools" in capsys.readouterr().out
