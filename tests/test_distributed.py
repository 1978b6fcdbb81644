"""Data parallelism with real processes: torch's elastic launcher, gloo on CPU, the tiny model.
Two ranks take the one-rank update (ddp and fsdp2); a two-rank checkpoint resumes on one rank and
a one-rank checkpoint on two; ranks with very different response lengths (so different numbers of
micro-batches) neither hang nor change the update; a rank that dies ends the run; two machines'
rendezvous exercised with two processes on this one."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from verirl.cli import main
from verirl.run.checkpoint import shard_world
from verirl.run.shards import Shards

BASE = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=8",
        "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
        "reward.workers=0", "algo.kl_coef=0.01", "trainer.dump_rollouts=true",
        "trainer.threads=1", "trainer.dist_timeout_s=60",
        "model.compute_dtype=null"]  # float32 throughout: the comparisons below are at float32 rounding
STRATEGIES = ["ddp", "fsdp2"]
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


def _rows(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def _weights(run: Path, step: int) -> dict:
    """A checkpoint's weights, whole: read from its model file, or assembled from a sharded checkpoint's
    pieces (FSDP2 on more than one rank writes sharded checkpoints by default)."""
    path = run / "checkpoints" / f"step_{step:06d}"
    world = shard_world(path)
    if world is None:
        return load_file(str(path / "model" / "model.safetensors"))
    shards = Shards(path, world)
    return {name: shards.whole(name) for name in shards.names()}


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def _same_weights(wa: dict, wb: dict, rel: float = 1e-5) -> None:
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert (wa[name] - wb[name]).abs().max() <= rel * max(wa[name].abs().max(), 1e-3), name


ONE_UPDATE = ["train", "trainer.total_steps=1", "trainer.save_freq=1", *BASE,
              "eval.before_train=true", "eval.size=5", "eval.n=2"]  # 5 problems: 3 on rank 0, 2 on rank 1


@pytest.fixture(scope="module")
def one_rank_update(tmp_path_factory) -> Path:
    """The one-rank run both strategies' two ranks are held to (one rank shards nothing: no strategy)."""
    one = tmp_path_factory.mktemp("update") / "one"
    assert main(ONE_UPDATE + [f"trainer.run_dir={one}"]) == 0
    return one


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_take_the_one_rank_update(tmp_path, one_rank_update, strategy):
    one, two = one_rank_update, tmp_path / "two"
    assert main(ONE_UPDATE + [f"trainer.run_dir={two}", "trainer.nproc_per_node=2", f"actor.strategy={strategy}"]) == 0
    # the same rollouts and rewards, in the same order (rank 0's groups, then rank 1's)
    drop = ("prompt",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in _rows(one, "rollouts.jsonl")] == \
        [{k: v for k, v in r.items() if k not in drop} for r in _rows(two, "rollouts.jsonl")]
    (e1, a), (e2, b) = _rows(one), _rows(two)
    assert e1["step"] == 0 and e1 == e2  # the held-out evaluation, split across the ranks, is the same
    assert a["actor/grad_norm"] > 0 and "timing/all_max" in b
    for key in ("reward/mean", "adv/max", "response_length/mean"):
        assert a[key] == b[key], key
    for key in ("actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/entropy"):  # pg_loss is ~0 on-policy
        assert _close(a[key], b[key], 1e-5) or abs(a[key] - b[key]) < 1e-7, (key, a[key], b[key])
    _same_weights(_weights(one, 1), _weights(two, 1))
    _same_weights(load_file(str(one / "final" / "model.safetensors")), load_file(str(two / "final" / "model.safetensors")))


@pytest.mark.slow
def test_filtered_steps_with_batch_scaling_on_two_ranks_take_the_one_rank_update(tmp_path):
    """Dynamic sampling exchanges the chosen groups between the ranks, and batch-scaled advantages
    see every rank's rewards: two ranks still take one rank's steps."""
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["train", "trainer.total_steps=3", *BASE, "actor.mini_batch_prompts=2", "algo.filter_groups.enable=true",
            "algo.filter_groups.max_num_gen_batches=2", "algo.scale_rewards=batch", "rollout.max_new_tokens=24"]
    assert main(args + [f"trainer.run_dir={one}"]) == 0
    assert main(args + [f"trainer.run_dir={two}", "trainer.nproc_per_node=2", "actor.strategy=ddp"]) == 0
    rows_one, rows_two = _rows(one), _rows(two)
    assert any(r["filter/gen_batches"] > 1 for r in rows_one)  # groups were regenerated
    # the case this test is about: no step short of one group per rank (there the layouts differ by design)
    assert all(r["filter/informative_groups"] >= 2 for r in rows_one), rows_one
    assert _rows(one, "rollouts.jsonl") == _rows(two, "rollouts.jsonl")
    for a, b in zip(rows_one, rows_two):
        for key in ("filter/gen_batches", "filter/kept_groups", "filter/shortfall", "reward/mean", "adv/max",
                    "adv/min"):
            assert _close(a[key], b[key], 1e-6), (key, a[key], b[key])
        assert _close(a["actor/grad_norm"], b["actor/grad_norm"], 1e-4)
    # six AdamW steps (lr 7e-5) after: float32 products through oneDNN round in the last bits by batch
    # shape (verirl.core.ops.linear), and Adam's m / sqrt(v) enlarges that where a gradient is near 0:
    # measured 4.3e-6 at most (6% of one step), hence 1e-4 of the largest weight here
    _same_weights(load_file(str(one / "final" / "model.safetensors")), load_file(str(two / "final" / "model.safetensors")),
                  rel=1e-4)


RESUMED = ["train", "trainer.save_freq=1", *BASE]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    """Three steps on one rank without a stop: the rows every layout's resumed run is held to (one rank
    shards nothing, so one run serves every actor.strategy)."""
    whole = tmp_path_factory.mktemp("resume") / "whole"
    assert main(RESUMED + [f"trainer.run_dir={whole}", "trainer.total_steps=3"]) == 0
    return _rows(whole)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,first,then", [("ddp", 2, 1), ("fsdp2", 2, 1), ("fsdp2", 1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(tmp_path, uninterrupted, strategy, first, then):
    split = tmp_path / "split"
    args = RESUMED + [f"actor.strategy={strategy}"]
    assert main(args + [f"trainer.run_dir={split}", "trainer.total_steps=2", f"trainer.nproc_per_node={first}"]) == 0
    assert main(args + [f"trainer.run_dir={split}", "trainer.total_steps=3", f"trainer.nproc_per_node={then}"]) == 0
    a, b = uninterrupted, _rows(split)
    assert [r["step"] for r in b] == [1, 2, 3]
    for key in ("reward/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "response_length/mean"):
        assert _close(a[2][key], b[2][key], 1e-4) or abs(a[2][key] - b[2][key]) < 1e-6, (key, a[2][key], b[2][key])


EVAL = ["eval.before_train=true", "eval.every=1", "eval.at_end=true", "eval.size=8", "eval.n=2"]  # every kind


@pytest.mark.slow
@pytest.mark.parametrize("strategy,again", [("fsdp2", True), ("ddp", False)])
def test_two_ranks_evaluate_before_during_and_after_training_and_end(tmp_path, strategy, again):
    """Held-out evaluation is a collective (the rows are gathered): each rank must take the same
    decisions about it, also where only rank 0 keeps the log (after the last step, and on a re-run
    of a finished run, which evaluates nothing new)."""
    run = tmp_path / "r"
    args = ["train", f"trainer.run_dir={run}", "trainer.total_steps=2", "trainer.nproc_per_node=2",
            f"actor.strategy={strategy}", *BASE, *EVAL, "trainer.dist_timeout_s=30"]
    started = time.time()
    assert main(args) == 0
    if again:  # the finished run again: its last step's evaluation is read, not redone
        assert main(args) == 0
    assert time.time() - started < 150  # a bound on a hang (the timeout is 30 s), not a speed figure
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2] and all("val/greedy_acc" in r for r in rows)
    end = json.loads((run / "summary.json").read_text())["eval_end"]
    assert end == {k: v for k, v in rows[-1].items() if k.startswith("val/")}


# the first two prompts (rank 0's) are the arithmetic the tiny model was taught, answered in ~20
# tokens; the last two (rank 1's) are noise, on which it rambles
UNEVEN = [{"problem": f"Tom has {a} apples and gets {b} more. How many now? Reply <think> </think> <answer> "
                      f"\\boxed{{}} </answer>.", "answer": str(a + b)} for a, b in ((48, 86), (12, 33))] + \
         [{"problem": "zq " * 15, "answer": "1"}, {"problem": "qqqq " * 8, "answer": "2"}]


@pytest.mark.slow
def test_ranks_with_very_different_response_lengths_neither_hang_nor_change_the_update(tmp_path):
    data = tmp_path / "uneven.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in UNEVEN))
    args = ["train", "trainer.total_steps=1", *BASE, f"data.train_path={data}", "data.shuffle=sequential",
            "rollout.n=4", "rollout.max_new_tokens=64", "rollout.temperature=1.5", "data.max_prompt_length=96",
            "actor.mini_batch_prompts=2",  # two mini-batches: the old-log-prob pass runs too
            "actor.max_token_len_per_device=160"]  # token budgets: rank 1 needs more micro-batches
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(args + [f"trainer.run_dir={one}"]) == 0
    started = time.time()
    assert main(args + [f"trainer.run_dir={two}", "trainer.nproc_per_node=2", "actor.strategy=fsdp2"]) == 0
    assert time.time() - started < 120  # a bound on a hang, not a speed figure
    lengths = [r["response_length"] for r in _rows(two, "rollouts.jsonl")]
    assert sum(lengths[8:]) > 1.5 * sum(lengths[:8]), lengths  # rank 1 decodes much longer
    assert lengths == [r["response_length"] for r in _rows(one, "rollouts.jsonl")]
    _same_weights(load_file(str(one / "final" / "model.safetensors")), load_file(str(two / "final" / "model.safetensors")))


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_run(tmp_path, capsys, rank1_dies):
    started = time.time()
    rc = main(["train", f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=3", "trainer.nproc_per_node=2",
               f"reward.verifiers=[{rank1_dies}]", "reward.weights=[1.0]", "reward.tasks={}", *BASE])
    assert rc == 2 and time.time() - started < 60  # a bound on a hang, not a speed figure
    err = capsys.readouterr().err
    assert "rank 1 failed" in err and "exit code 3" in err and "Run the same command again" in err


@pytest.mark.slow
def test_ctrl_c_on_two_ranks_saves_a_checkpoint_and_ends_like_one_rank(tmp_path):
    """A real Ctrl-C: SIGINT to the terminal's whole process group (the launcher and both ranks)."""
    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={run}", "trainer.total_steps=500",
           "trainer.save_freq=1000", "trainer.nproc_per_node=2", *BASE]
    launcher = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # its own process group, as a terminal's job
    try:
        deadline = time.time() + 180
        while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text()) and \
                launcher.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert launcher.poll() is None, launcher.stderr.read()[-3000:]
        os.killpg(launcher.pid, signal.SIGINT)
        err = launcher.communicate(timeout=120)[1]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    step = len(_rows(run))
    assert f"stopped by SIGINT after step {step};" in err and (run / "checkpoints" / f"step_{step:06d}").is_dir()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_rendezvous_on_this_machine(tmp_path):
    run = tmp_path / "r"
    cmd = [sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={run}", "trainer.total_steps=2",
           "trainer.nnodes=2", "trainer.nproc_per_node=1", f"trainer.rdzv_endpoint=localhost:{_free_port()}", *BASE]
    nodes = [subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    errors = [p.communicate(timeout=300)[1].decode() for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    assert [r["step"] for r in _rows(run)] == [1, 2]
    assert len(_rows(run, "rollouts.jsonl")) == 2 * 4 * 8  # both nodes' groups, gathered to rank 0


@pytest.mark.parametrize("overrides,needle", [
    (["trainer.nproc_per_node=4", "data.prompts_per_step=6", "actor.mini_batch_prompts=6"],
     "data.prompts_per_step=6 is not divisible by"),
    (["trainer.nproc_per_node=4", "data.prompts_per_step=8", "actor.mini_batch_prompts=2"],
     "actor.mini_batch_prompts=2 is not divisible by"),
    (["trainer.nnodes=2"], "needs trainer.rdzv_endpoint"),
    (["trainer.nproc_per_node=2", "actor.strategy=ddp", "actor.offload=params"],
     "actor.offload=params keeps the parameter shards on the host, which needs FSDP2"),
    (["actor.offload=params"], "not available with one rank"),
])
def test_layout_checks_are_one_paragraph(tmp_path, capsys, overrides, needle):
    run = tmp_path / "r"
    assert main(["train", f"trainer.run_dir={run}", *overrides]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not run.exists()


def test_one_process_is_its_own_world():
    from verirl.train.distributed import Dist

    d = Dist.single()
    assert not d.active and d.is_main and d.all_sum([1.0, 2.0]) == [1.0, 2.0] and d.gather("x") == ["x"]
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    d.sum_gradients([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))


def test_the_launcher_holds_the_run_directory_for_its_ranks(tmp_path):
    """The process that starts the ranks takes the lock before any rank starts: another process is
    refused (naming the launcher's pid), a rank (which inherits the environment) knows not to take
    it, and a directory made only for the lock is gone again when nothing was written into it."""
    from verirl.run.rundir import held_by_launcher, lock_held_by_launcher

    run = tmp_path / "new" / "run"
    probe = ("import sys; from pathlib import Path; from verirl.run.rundir import RunDirLock, lock_held_by_launcher\n"
             "print(lock_held_by_launcher(Path(sys.argv[1])))\n"
             "RunDirLock(Path(sys.argv[1])).acquire()")
    with held_by_launcher(str(run)):
        assert run.is_dir() and lock_held_by_launcher(run)
        other = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True,
                               env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})  # as a rank inherits it
        assert other.returncode != 0 and other.stdout.strip() == "True"  # a child sees it held for it...
        assert f"in use by another verirl run (pid {os.getpid()}" in other.stderr  # ...and cannot take it
    assert not run.exists() and not lock_held_by_launcher(run)


def test_the_driver_checks_the_config_once_and_its_ranks_do_not(tmp_path, monkeypatch):
    """`verirl.launch.run` checks the config before it trains; a rank a verirl launcher starts
    (`run_rank`, what the local launcher's and the Ray actors' ranks run) trains on the config it was
    sent without checking it again; a rank of an outside torchrun (RANK / WORLD_SIZE set, no verirl
    driver above it) comes through `run` and checks its own. The checks themselves run (counted on
    their way through)."""
    import verirl.launch as launch
    from verirl.config import load_config, to_dict
    from verirl.launch.local import run_rank

    checked = []
    real = launch.check

    def counted(cfg):
        checked.append(cfg.trainer.run_dir)
        return real(cfg)

    monkeypatch.setattr(launch, "check", counted)
    cfg = load_config("tiny", [f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=1", "rollout.n=2",
                               "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.max_new_tokens=4",
                               *BASE[3:]])
    assert launch.run(cfg)["steps"] == 1 and len(checked) == 1
    assert run_rank(to_dict(cfg))["steps"] == 1 and len(checked) == 1  # the finished run, not checked again
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    assert launch.run(cfg)["steps"] == 1 and len(checked) == 2
