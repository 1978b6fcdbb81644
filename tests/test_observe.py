"""Seeing a run: the FLOP formula behind perf/mfu, throughput per phase, the progress modes, an
asynchronous step's async/* fields on the console line and in the live view's table, and the hang
watchdog (a real reward rule that sleeps past a short stall timeout)."""
import json
import re

import pytest
import torch

from verirl.cli import main
from verirl.models.perf import FlopModel, device_name, mfu, step_flops
from verirl.train.step_metrics import throughput

SMALL = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=16",
         "eval.before_train=false", "eval.at_end=false", "log.console_every=1", "data.train_size=256",
         "eval.size=8"]


def test_step_flops_by_hand():
    fm = FlopModel(matmul_params=100, layers=2, hidden=4)
    # one prompt of 3 tokens, two responses of 2 and 1 tokens; forward = 2 N tokens + 4 L d keys = 200 t + 32 k
    # prompt: 3 tokens, keys 1 + 2 + 3 = 6 -> 600 + 192 = 792
    # decoding 2 tokens: one one-token forward at position 3, 4 keys -> 200 + 128 = 328; 1 token: none
    # teacher-forced responses: 2 tokens with keys 4 + 5 = 9 -> 400 + 288 = 688; 1 token, 4 keys -> 328
    flops = step_flops(fm, [3, 3], [2, 1], group_size=2, logprob_passes=1, update_passes=1, share_prompt=True)
    assert flops == {"rollout": 792 + 328, "logprob": 792 + 688 + 328, "update": 3 * (792 + 688 + 328)}
    unshared = step_flops(fm, [3, 3], [2, 1], group_size=2, logprob_passes=0, update_passes=2, share_prompt=False)
    assert unshared["logprob"] == 0 and unshared["update"] == 2 * 3 * (2 * 792 + 688 + 328)
    assert mfu(1e9, 2.0, 2, 1e9) == 0.25  # 1 GFLOP in 2 s on 2 devices of 1 GFLOP/s
    assert throughput(10, 6, 4, 2, 2, 0.5) == 128.0  # (10 + 6) tokens x 8 sequences / 2 ranks / 0.5 s


def test_a_step_reports_mfu_tps_per_phase_and_peak_memory(tmp_path, capsys):
    from verirl.models import load_model

    run = tmp_path / "r"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", "trainer.peak_flops=1e9",
                 "trainer.dump_rollouts=true", "reward.workers=0", "log.progress=plain", *SMALL]) == 0
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    records = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    model = load_model("tiny").model
    flops = step_flops(FlopModel.of(model), [len(r["prompt_ids"]) for r in records],
                       [r["response_length"] for r in records], 4, logprob_passes=1, update_passes=1,
                       share_prompt=True)  # the tiny recipe: a reference pass (kl_coef > 0), on-policy
    assert m["perf/mfu"] == pytest.approx(sum(flops.values()) / m["timing/all"] / 1e9, rel=1e-9)
    tokens = sum(len(r["prompt_ids"]) + r["response_length"] for r in records)
    assert m["perf/tps"] == pytest.approx(tokens / m["timing/all"], rel=1e-9)
    assert m["perf/tps_rollout"] == pytest.approx(tokens / m["timing/rollout"], rel=1e-9)
    assert m["perf/tps_update"] == pytest.approx(tokens / m["timing/update"], rel=1e-9)
    assert m["perf/peak_memory_gb"] == m["perf/max_rss_gb"] > 0
    out = capsys.readouterr().out
    assert "\x1b" not in out  # plain: no escape codes
    assert re.search(r"step +1 +reward .* \[1/1\]", out)
    summary = json.loads((run / "summary.json").read_text())
    here = device_name(torch.device("cpu"))
    assert summary["peak_gflops"] == 1.0 and summary["device"] == here
    assert f"(matmul peak 1 GFLOP/s on {here})" in out  # the last line: which machine the time was taken on


def test_a_cpu_is_named_by_model_family_and_instruction_set():
    # two CPUs a virtual machine names alike ("AMD EPYC") are told apart by family and model numbers
    zen3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
    zen4 = zen3.replace("model\t\t: 1", "model\t\t: 17")
    isa = torch.backends.cpu.get_cpu_capability()
    cpu = torch.device("cpu")
    assert device_name(cpu, zen3 + "\nprocessor\t: 1\nmodel name\t: another\n") == f"AMD EPYC (cpu family 25, model 1, {isa})"
    assert device_name(cpu, zen4) == f"AMD EPYC (cpu family 25, model 17, {isa})"
    assert device_name(cpu, "").endswith(f"({isa})")  # no /proc/cpuinfo: the platform's name and the ISA
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\n"
    assert device_name(cpu, arm).endswith(f"(CPU implementer 0x41, CPU part 0xd0c, {isa})")  # no model name on Arm


def test_the_plain_mode_on_a_pipe_has_no_escape_codes(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={tmp_path / 'r'}",
                           "trainer.total_steps=2", "reward.workers=0", *SMALL],
                          capture_output=True, text=True, timeout=300)  # log.progress=auto, not a terminal
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr
    assert "[1/2]" in proc.stdout and "[2/2]" in proc.stdout


@pytest.fixture
def sleepy(tmp_path):
    rule = tmp_path / "sleepy.py"
    rule.write_text("import time\n\nslept = False\n\n\ndef sleepy(response, label, **_):\n"
                    "    global slept\n    if not slept:  # once per worker: the first call hangs for a while\n"
                    "        slept = True\n        time.sleep(6)\n    return 0.0\n")
    return f"{rule}:sleepy"


@pytest.mark.parametrize("on_stall", ["warn", "abort"])
def test_a_reward_rule_past_the_stall_timeout_is_named(tmp_path, capsys, sleepy, on_stall):
    run = tmp_path / "r"
    code = main(["train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=1", f"trainer.on_stall={on_stall}",
                 "trainer.stall_timeout_s=2.5", "reward.workers=1", "reward.timeout=60", f"reward.verifiers=[{sleepy}]",
                 "reward.weights=[1.0]", "reward.tasks={}", "log.progress=off"])
    stall = run / "stall_1.txt"
    assert stall.exists()
    text = stall.read_text()
    assert "phase 'reward'" in text and "rule 'sleepy'" in text
    assert "Thread" in text and "train_step" in text  # every thread's stack, the trainer's among them
    err = capsys.readouterr()
    if on_stall == "warn":
        assert code == 0 and (run / "summary.json").exists()
        assert "Still waiting" in err.out + err.err
    else:
        assert code == 2 and not (run / "summary.json").exists()
        assert "trainer.on_stall=abort" in err.err and "Traceback" not in err.err


def test_the_rich_view_shows_the_table_and_the_phase_bar(tmp_path):
    import io

    from rich.console import Console

    from verirl.config import load_config
    from verirl.launch import run

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140)
    cfg = load_config("tiny", [f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=2", "reward.workers=0",
                               "log.progress=rich", *SMALL])
    run(cfg, console)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # the live view's cursor moves and colours
    assert "GRPO" in text and "2/2" in text
    for label in ("reward", "response length", "entropy", "grad norm", "mean of last"):
        assert label in text, label
    assert "rollout" in text and "update" in text and "s/step" in text  # the phase bar and its legend


def test_an_asynchronous_step_shows_its_staleness_and_waits_and_a_synchronous_one_does_not():
    import io

    from rich.console import Console

    from verirl.run.display import metrics_table
    from verirl.run.runlog import step_line

    sync = {"step": 3, "reward/mean": 0.5, "reward/acc/mean": 0.5, "response_length/mean": 12.0,
            "actor/entropy": 1.2, "actor/grad_norm": 0.3, "timing/all": 0.85, "perf/tps": 120.0}
    waits = {"async/staleness_mean": 0.5, "async/staleness_max": 1.0, "async/queue_depth": 2.0,
             "async/trainer_idle_s": 0.125, "async/rollout_idle_s": 0.031, "async/weight_sync_s": 0.0042}
    async_ = {**sync, **waits}

    def table(m: dict) -> str:
        out = io.StringIO()
        Console(file=out, width=120, color_system=None).print(metrics_table(m, [m]))
        return out.getvalue()

    line = step_line(async_)
    assert "  0.85s  idle 0.12s  stale 1  tps 120" in line, line
    text = table(async_)
    for label, value in [("staleness", "0.5"), ("max", "1"), ("queue depth", "2"), ("trainer idle s", "0.125"),
                         ("rollout idle s", "0.031"), ("weight sync s", "0.0042")]:
        assert re.search(rf"^ *{label} +{re.escape(value)} +{re.escape(value)} *$", text, re.M), (label, text)
    line, text = step_line(sync), table(sync)
    assert "idle" not in line and "stale" not in line, line
    assert line.endswith("  0.85s  tps 120"), line
    assert "staleness" not in text and "queue" not in text and "idle" not in text and "sync" not in text, text
