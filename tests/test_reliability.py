"""Nothing lost: one run per directory, logs never padded, non-finite steps refused, failed writes
and bad inputs as one paragraph. Real trainer processes, real files, real signals."""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from verirl.cli import main

SMALL = ["data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "rollout.max_new_tokens=16",
         "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
         "reward.workers=0"]
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


def _train_args(run: Path, *extra: str) -> list[str]:
    # one torch thread: a trainer process beside pytest's (and whatever else shares the cores) that spins
    # two threads on two cores takes seconds a step of the tiny model instead of a fraction of one
    return ["train", f"trainer.run_dir={run}", *SMALL, "trainer.threads=1", *extra]


def _train_cmd(run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "verirl.cli", *_train_args(run, *extra)]


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not (path.exists() and path.read_text().count("\n") >= n):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.05)


@pytest.mark.slow  # about 20-50 s here (twice that on the slower CI machines): `make test-slow`
def test_a_second_run_in_the_same_directory_is_refused_and_a_killed_one_leaves_no_lock(tmp_path, capsys):
    """The first run is a process of its own (killed with SIGKILL); the second and the continuation run in
    this process, another process than the first's all the same (one start-up less each)."""
    run = tmp_path / "r"
    first = subprocess.Popen(_train_cmd(run, "trainer.total_steps=500", "trainer.save_freq=1"), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for_lines(run / "metrics.jsonl", 2, first)
        capsys.readouterr()
        assert main(_train_args(run, "trainer.total_steps=6", "trainer.seed=1")) == 2
        err = capsys.readouterr().err
        assert f"is in use by another verirl run (pid {first.pid} on host" in err, err
        assert "Traceback" not in err and err.count("\n") == 1, err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    done = _steps(run)
    # the kernel dropped the killed run's lock: the same command continues it
    assert main(_train_args(run, f"trainer.total_steps={len(done) + 1}", "trainer.save_freq=1")) == 0
    steps = _steps(run)
    assert steps == list(range(1, len(steps) + 1))  # every step once, none from the refused run


def test_a_log_shorter_than_the_checkpoint_says_is_never_padded(tmp_path, capsys):
    run = tmp_path / "r"
    args = ["train", f"trainer.run_dir={run}", "trainer.save_freq=2", *SMALL]
    assert main(args + ["trainer.total_steps=2"]) == 0
    (run / "metrics.jsonl").unlink()  # lost: deleted by hand
    assert main(args + ["trainer.total_steps=3"]) == 0
    raw = (run / "metrics.jsonl").read_bytes()
    assert b"\0" not in raw and _steps(run) == [3]
    assert "lines logged before the checkpoint were lost" in capsys.readouterr().out


def test_a_nonfinite_update_takes_no_step(tiny, arith):
    """NaN advantages: the loss is NaN, so neither the optimizer nor the schedule moves and the
    weights stay as they were; the update says so."""
    import copy

    from verirl.rollout import NativeEngine, SamplingParams
    from verirl.train.update import LogprobPass, UpdateParams, build_optimizer, update_policy
    from verirl.core.types import TrainBatch

    train, _ = arith
    roll = NativeEngine(tiny.model, tiny.pad_id, tiny.stop_ids).generate(
        [p.ids for p in train[:2]], 2, SamplingParams(max_new_tokens=8, seed=0))
    model = copy.deepcopy(tiny.model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt, sched = build_optimizer(model, 1e-3, (0.9, 0.99), 0.0, warmup_steps=4)
    params = UpdateParams(group_size=2, mini_batch_prompts=2, forward=LogprobPass(micro_batch_size=4))
    stats = update_policy(model, opt, sched, TrainBatch(roll, torch.full((4,), float("nan"))), params)
    assert stats["actor/nonfinite_updates"] == 1.0
    assert sched.last_epoch == 0 and not opt.state  # no scheduler step, no optimizer step
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    stats = update_policy(model, opt, sched, TrainBatch(roll, torch.linspace(-1, 1, 4)), params)
    assert stats["actor/nonfinite_updates"] == 0.0 and sched.last_epoch == 1


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    """The tiny model with one NaN weight: every forward is NaN from the first step on."""
    from verirl.models import load_model

    lm = load_model("tiny")
    with torch.no_grad():
        lm.model.model.layers[3].mlp.down_proj.weight[0, 0] = float("nan")
    out = tmp_path_factory.mktemp("nan-model")
    lm.model.save_pretrained(out)
    lm.tokenizer.save_pretrained(out)
    return out


def test_nonfinite_steps_in_a_row_stop_the_run(tmp_path, nan_model, capsys):
    run = tmp_path / "r"
    assert main(["train", f"model.path={nan_model}", f"trainer.run_dir={run}", "trainer.total_steps=5",
                 "trainer.save_freq=100", "trainer.max_nonfinite_steps=2", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "2 steps in a row (up to step 2) had a non-finite loss" in err and "Traceback" not in err
    assert err.count("verirl train: training diverged: ") == 1  # its own kind, not a checkpoint error
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["actor/nonfinite_updates"], r["actor/nonfinite_steps"]) for r in rows] == \
        [(1, 1.0, 1.0), (2, 1.0, 2.0)]  # logged, counted, then stopped
    assert not (run / "checkpoints").exists()


def test_nonfinite_weights_are_never_checkpointed(tmp_path, nan_model, capsys):
    run = tmp_path / "r"
    assert main(["train", f"model.path={nan_model}", f"trainer.run_dir={run}", "trainer.total_steps=3",
                 "trainer.save_freq=1", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "after step 1 the weights are not finite" in err and "no checkpoint was written" in err
    assert "verirl train: training diverged: after step 1" in err
    assert not list((run / "checkpoints").glob("step_*")) if (run / "checkpoints").exists() else True


def test_overwrite_keeps_the_old_run_until_the_new_inputs_are_good_and_a_failed_resume_keeps_config(tmp_path):
    run = tmp_path / "r"
    args = ["train", f"trainer.run_dir={run}", "trainer.total_steps=1", *SMALL]
    assert main(args) == 0
    config = (run / "config.yaml").read_text()
    # the new run cannot start (its prompts are too long): the old one is still there
    assert main(args + ["trainer.resume=false", "trainer.overwrite=true", "data.max_prompt_length=12"]) == 2
    assert (run / "checkpoints" / "latest").exists() and _steps(run) == [1]
    # a resume refused by the checkpoint (another prompt order) leaves config.yaml as it was
    assert main(args + ["trainer.total_steps=2", "data.shuffle=megatron"]) == 2
    assert (run / "config.yaml").read_text() == config


def test_a_full_disk_is_one_paragraph_and_the_last_checkpoint_stays_whole(tmp_path):
    """A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes every large write fail as on a full disk."""
    run = tmp_path / "r"
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=1", "trainer.save_freq=1", *SMALL]) == 0

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))

    p = subprocess.run(_train_cmd(run, "trainer.total_steps=3", "trainer.save_freq=1"), env=ENV,
                       capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "could not write the checkpoint of step 2" in p.stderr and "step_000001, is intact" in p.stderr
    assert "Traceback" not in p.stderr
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert not list((run / "checkpoints").glob("step_000002*")) or \
        all(d.name.endswith(".tmp") for d in (run / "checkpoints").glob("step_000002*"))
    # with room again, the same command continues from step 1
    assert main(["train", f"trainer.run_dir={run}", "trainer.total_steps=3", "trainer.save_freq=1", *SMALL]) == 0
    assert _steps(run)[-1] == 3


def test_sft_writes_under_runs_by_default(tmp_path, monkeypatch):
    from verirl.config import SFTConfig
    from verirl.models.load import TINY_DIR

    assert SFTConfig().out_dir == "runs/sft"
    shipped = (Path(TINY_DIR) / "model.safetensors").read_bytes()
    monkeypatch.chdir(tmp_path)
    assert main(["sft", "max_steps=1", "eval_every=1", "val_size=4", "train_size=64", "batch_size=4"]) == 0
    assert (tmp_path / "runs" / "sft" / "model.safetensors").exists()
    assert (Path(TINY_DIR) / "model.safetensors").read_bytes() == shipped


def test_bad_inputs_are_one_paragraph(tmp_path, capsys):
    top_list = tmp_path / "list.yaml"
    top_list.write_text("- data\n- model\n")
    cases = [
        (["train", "--config", str(top_list)], "must hold a mapping of sections"),
        (["train", "rollout.top_k=-5"], "rollout.top_k=-5 must be >= 0"),
        (["train", "actor.lr=inf"], "actor.lr=inf is not a finite number"),
        (["eval", "--json", str(tmp_path / "no" / "such" / "dir" / "out.json")], "--json"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err and err.count("\n") == 1, (argv, err)


def test_an_empty_mapping_on_the_command_line_replaces_the_files(tmp_path):
    from verirl.config import load_config

    assert load_config("tiny").reward.tasks  # the recipe routes add and mul
    assert load_config("tiny", ["reward.tasks={}"]).reward.tasks == {}


def test_fewer_prompts_than_a_step_needs_is_said(tmp_path, capsys):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"problem": "1 + 1 = ?", "answer": "2"}) + "\n")
    run = tmp_path / "r"
    assert main(["train", f"data.train_path={data}", f"trainer.run_dir={run}", "trainer.total_steps=1",
                 "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "rollout.max_new_tokens=4",
                 "eval.before_train=false", "eval.at_end=false", "log.progress=false", "reward.workers=0"]) == 0
    assert "1 training prompts, fewer than data.prompts_per_step=2" in capsys.readouterr().err


def test_ctrl_c_during_start_up_is_not_a_traceback(tmp_path):
    p = subprocess.Popen(_train_cmd(tmp_path / "r", "trainer.total_steps=5"), env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.5)  # importing torch / transformers, loading the model
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=120)
    err = p.stderr.read().decode()
    assert rc == 130 and "Traceback" not in err, err[-2000:]


@pytest.mark.slow
def test_kill_soak_14_steps_6_kills(tmp_path):
    """The trainer process itself killed with SIGKILL 6 times in a 14-step run that checkpoints every
    step, twice at each moment a kill can find it: start-up (the model loading or the checkpoint being
    restored, once the lock names the new process), a step (at a random moment after 1-2 more logged steps),
    a checkpoint write (while its step_N.tmp is on disk), and resumed each time: after every exit each
    finished checkpoint and the one `latest` names verify; at the end every step logged once, no NUL byte
    in any log, no unfinished checkpoint left, every checkpoint on disk verifies."""
    import random

    from verirl.run.checkpoint import verify_checkpoint

    run, total = tmp_path / "soak", 14
    cmd = _train_cmd(run, f"trainer.total_steps={total}", "trainer.save_freq=1", "trainer.keep_checkpoints=0",
                     "trainer.dump_rollouts=true")
    moments = ["start-up", "step", "save", "step", "save", "start-up"]  # 4 of them after 1-2 more logged steps
    metrics, lock, ckpts = run / "metrics.jsonl", run / ".lock", run / "checkpoints"
    rng, kills, started = random.Random(12), 0, time.time()

    def logged() -> int:
        return metrics.read_text().count("\n") if metrics.exists() else 0

    def lock_pid() -> int:
        try:
            return json.loads(lock.read_text())["pid"]
        except (OSError, ValueError, KeyError):
            return -1

    while True:
        p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kills < len(moments):
            moment = moments[kills]
            if moment == "start-up":
                while p.poll() is None and lock_pid() != p.pid:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 1.0))
            else:
                want = logged() + rng.randint(1, 2)
                while p.poll() is None and logged() < want:
                    time.sleep(0.01)
                if moment == "step":
                    time.sleep(rng.uniform(0.0, 0.4))
                else:  # the checkpoint of the step just logged is written after its line
                    tmp = ckpts / f"step_{want:06d}.tmp"
                    while p.poll() is None and not tmp.exists() and not (ckpts / f"step_{want:06d}").exists():
                        time.sleep(0.001)
                    time.sleep(rng.uniform(0.0, 0.02))
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                kills += 1
        rc = p.wait(timeout=600)
        assert rc in (0, -signal.SIGKILL), p.stderr.read().decode()[-2000:]
        for d in ckpts.glob("step_*") if ckpts.exists() else []:
            if not d.name.endswith(".tmp"):
                verify_checkpoint(d)
        if (ckpts / "latest").exists():
            verify_checkpoint(ckpts / (ckpts / "latest").read_text().strip())
        if rc == 0:
            assert kills == len(moments), f"the run ended after {kills} kills: raise total"
            break
        assert time.time() - started < 1200
    for name in ("metrics.jsonl", "rollouts.jsonl"):
        assert b"\0" not in (run / name).read_bytes()
    assert _steps(run) == list(range(1, total + 1))
    records = [json.loads(line)["step"] for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert records == [s for s in range(1, total + 1) for _ in range(4)]
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{total:06d}"
    checkpoints = sorted((run / "checkpoints").glob("step_*"))
    assert len(checkpoints) == total
    for d in checkpoints:
        verify_checkpoint(d)  # raises CheckpointError naming the file if anything is wrong


@pytest.mark.parametrize("damage", ["bad config.json", "truncated weights", "no weights file"])
def test_a_damaged_model_directory_is_one_paragraph(tmp_path, capsys, damage):
    import shutil

    from verirl.models.load import TINY_DIR

    model = tmp_path / "model"
    shutil.copytree(TINY_DIR, model)
    if damage == "bad config.json":
        (model / "config.json").write_text('{"model_type": "qwen2", "hidden_size": ')
    elif damage == "truncated weights":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[:1000])
    else:
        (model / "model.safetensors").unlink()
    run = tmp_path / "r"
    assert main(["train", f"model.path={model}", f"trainer.run_dir={run}", "trainer.total_steps=1", *SMALL]) == 2
    err = capsys.readouterr().err
    assert f"model.path='{model}'" in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not (run / "checkpoints").exists()


@pytest.mark.parametrize("damage,needle", [
    ("no tokenizer files", "[tokenizer-not-loadable]"),
    ("vocab_size below the tokenizer's", "[embedding-too-small]"),
    ("pickle weights", "[pickle-weights]"),
])
def test_a_model_directory_doctor_refuses_stops_plan_and_train_before_loading(tmp_path, capsys, damage, needle):
    import shutil

    from safetensors.torch import load_file

    from verirl.models.load import TINY_DIR

    model = tmp_path / "model"
    shutil.copytree(TINY_DIR, model)
    if damage == "no tokenizer files":
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (model / name).unlink()
    elif damage == "vocab_size below the tokenizer's":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    else:
        torch.save(load_file(str(model / "model.safetensors")), model / "pytorch_model.bin")
        (model / "model.safetensors").unlink()
    run = tmp_path / "r"
    for command, key in ((["plan", f"model.path={model}"], "model.path"), (["eval", "--model", str(model)], "--model"),
                         (["train", f"model.path={model}", f"trainer.run_dir={run}", *SMALL], "model.path")):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert needle in err and f"{key}='{model}'" in err, err
        assert "Traceback" not in err and err.count("\n") == 1, err
    assert not run.exists()


def test_a_run_directory_that_cannot_be_one_stops_plan_and_train(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    for run_dir, needle in ((a_file, "is a file, not a directory"), (a_file / "run", f"inside {a_file}, which is a file")):
        for command in (["plan"], ["train", *SMALL]):
            assert main([*command, f"trainer.run_dir={run_dir}"]) == 2, command
            err = capsys.readouterr().err
            assert f"trainer.run_dir='{run_dir}'" in err and needle in err, err
            assert "Traceback" not in err and err.count("\n") == 1, err
    assert a_file.read_text() == "not a directory"


def test_a_read_only_run_directory_is_one_paragraph(tmp_path):
    """A real read-only mount: a bind mount remounted read-only in a mount namespace of its own."""
    ro = tmp_path / "ro"
    ro.mkdir()
    probe = f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && ! touch {ro}/x 2>/dev/null"
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "sh", "-c", probe],
                                                         capture_output=True).returncode != 0:
        pytest.skip("no read-only mount can be made here (unshare --mount needs the privilege)")
    cmd = f"{probe} && exec {sys.executable} -m verirl.cli train trainer.run_dir={ro}/run {' '.join(SMALL)}"
    done = subprocess.run(["unshare", "--mount", "sh", "-c", cmd], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"trainer.run_dir='{ro}/run' cannot be written" in done.stderr and "read-only" in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr



def test_a_data_file_without_eval_data_says_there_is_no_held_out_evaluation(tmp_path, capsys):
    from verirl.config import load_config
    from verirl.train.build import build_run

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(4)))
    for extra, said in (([], True), ([f"eval.data={data}"], False)):
        overrides = [f"data.train_path={data}", f"trainer.run_dir={tmp_path / 'r'}", *SMALL, "eval.at_end=true", *extra]
        run = build_run(load_config("tiny", overrides))
        run.scorer.close()
        run.lock.release()
        err = capsys.readouterr().err
        assert ("no held-out evaluation in this run" in err and "eval.data=FILE" in err) == said, (extra, err)


def test_stop_signals_record_the_first_escalate_on_the_second_and_keep_an_ignored_one(capsys):
    """The one signals class, with real signals to this process: a rank's records the first SIGTERM
    and says it, keeps the SIGINT it was started ignoring (the local launcher's ranks), and puts the
    previous handlers back; a launcher's announces the first and raises KeyboardInterrupt on the second."""
    from verirl.run.signals import driver_signals, rank_signals

    said, before = [], signal.getsignal(signal.SIGTERM)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with rank_signals(said.append) as rank:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)
            assert rank.signum == signal.SIGTERM and len(said) == 1 and "saving a checkpoint" in said[0]
            assert rank.fresh() and not rank.fresh()
    finally:
        signal.signal(signal.SIGINT, old_int)
    assert signal.getsignal(signal.SIGTERM) is before
    with driver_signals() as driver:
        os.kill(os.getpid(), signal.SIGINT)
        assert driver.signum == signal.SIGINT and "every rank is asked to save a checkpoint" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs in this thread at the next bytecode
    assert signal.getsignal(signal.SIGINT) is old_int
