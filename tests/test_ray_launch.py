"""`trainer.launcher=ray` with a real Ray cluster, no mocks: `verirl train` (a real process) starts a
local Ray cluster, runs two ranks as Ray actors (gloo on CPU, the tiny model), and stops the cluster
at the end. Each run gets its own Ray temp directory (so no other cluster on this machine is joined)
and its own session (every process it starts, Ray's included, inherits the session id and a marker
in its environment): after the run, no live process may be in that session or carry the marker."""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from verirl.cli import main

pytest.importorskip("ray", reason="trainer.launcher=ray needs Ray (pip install -e '.[test]' installs it)")
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes through /proc")

BASE = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=8", "eval.before_train=false",
        "eval.at_end=false", "log.progress=false", "log.console_every=1", "reward.workers=0", "algo.kl_coef=0.01",
        "trainer.dump_rollouts=true", "actor.strategy=ddp", "trainer.threads=1", "trainer.dist_timeout_s=60"]
RAY = ["trainer.launcher=ray", "trainer.nproc_per_node=2"]
MARK = "VERIRL_RAY_TEST_MARK"


@pytest.fixture
def ray_env():
    """The environment of a `verirl train` that must start (and stop) its own local Ray cluster."""
    tmp = tempfile.mkdtemp(prefix="vr-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"RAY_TMPDIR": tmp, MARK: uuid.uuid4().hex, "TOKENIZERS_PARALLELISM": "false"})
    yield env
    shutil.rmtree(tmp, ignore_errors=True)


class Done(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    session: int  # the driver's pid: the session of every process it started


def _start(cmd: list[str], env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, text=True, start_new_session=True, **kwargs)


def _train(args: list[str], env: dict, timeout: int = 240) -> Done:
    driver = _start([sys.executable, "-m", "verirl.cli", "train", *args], env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = driver.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end({driver.pid}, env)
        raise
    return Done(driver.returncode, out, err, driver.pid)


def _left_behind(sessions: set, env: dict) -> list:
    """'pid name' of each live process in one of ``sessions`` or carrying this test's marker (Ray's
    gcs_server, raylet, agents and workers, the ranks...). Both: Ray's processes write their titles
    over their environment, and a process could leave its session."""
    needle = f"{MARK}={env[MARK]}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            stat = (d / "stat").read_text()
            state, _, _, session = stat[stat.rindex(")") + 2:].split()[:4]
            if state == "Z":  # exited; only its parent's wait is missing
                continue
            if int(session) in sessions or needle in (d / "environ").read_bytes().split(b"\0"):
                found.append(f"{d.name} {stat[stat.index('(') + 1:stat.rindex(')')]}")
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            pass
    return found


def _assert_no_ray_process(sessions: set, env: dict) -> None:
    deadline = time.time() + 5  # the processes of a stopped cluster take a moment to go
    while (left := _left_behind(sessions, env)) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, "left behind:\n" + "\n".join(left)


def _end(sessions: set, env: dict) -> None:
    """Stop what this test started (not `ray stop`: that stops every Ray on the machine)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for line in _left_behind(sessions, env):
            with contextlib.suppress(OSError):
                os.kill(int(line.split()[0]), sig)
        deadline = time.time() + 5
        while _left_behind(sessions, env) and time.time() < deadline:
            time.sleep(0.2)


def _rows(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _close(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12) or abs(a - b) < 1e-7


@pytest.mark.slow
def test_two_ray_ranks_train_three_steps_and_stop_their_cluster(tmp_path, ray_env):
    run, one = tmp_path / "ray", tmp_path / "one"
    done = _train([f"trainer.run_dir={run}", "trainer.total_steps=3", *RAY, *BASE], ray_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "started a local Ray cluster for this run" in done.stderr
    assert "(rank0 pid=" in done.stdout and "step     3" in done.stdout  # rank 0's console, through Ray
    _assert_no_ray_process({done.session}, ray_env)
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and "timing/all_max" in rows[0]
    assert (run / "checkpoints" / "step_000003").is_dir() and (run / "final").is_dir()
    assert json.loads((run / "summary.json").read_text())
    assert len(_rows(run / "rollouts.jsonl")) == 3 * 4 * 8  # both ranks' groups, gathered to rank 0
    # the same step 1 as one process alone: rollouts do not depend on the launcher or the world size
    assert main(["train", f"trainer.run_dir={one}", "trainer.total_steps=1", *BASE]) == 0
    alone, first = _rows(one / "metrics.jsonl")[0], rows[0]
    for key in ("reward/mean", "response_length/mean", "adv/max"):
        assert alone[key] == first[key], key
    for key in ("actor/pg_loss", "actor/kl", "actor/grad_norm"):
        assert _close(alone[key], first[key], 1e-5), (key, alone[key], first[key])
    drop = ("prompt",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in _rows(one / "rollouts.jsonl")] == \
        [{k: v for k, v in r.items() if k not in drop} for r in _rows(run / "rollouts.jsonl") if r["step"] == 1]


@pytest.mark.slow
def test_two_ray_ranks_split_by_tensor_parallelism_evaluate_before_during_and_after_training(tmp_path, ray_env):
    """tp2 under Ray (the group one bundle, on one machine; decoding on the tensor-parallel plan):
    held-out evaluation gathers across the ranks, every rank takes the same decisions about it, also
    after the last step, where only rank 0 keeps the log."""
    run = tmp_path / "r"
    done = _train([f"trainer.run_dir={run}", "trainer.total_steps=2", *RAY, *BASE, "eval.before_train=true",
                   "eval.every=1", "eval.at_end=true", "eval.size=8", "eval.n=2", "trainer.dist_timeout_s=30",
                   "actor.tensor_parallel_size=2"], ray_env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "verirl: 2 ranks on 1 machine: " in done.stderr and "ranks 0, 1 (tensor-parallel group 0, each of 2 ranks)" \
        in done.stderr, done.stderr[-3000:]
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2] and all("val/greedy_acc" in r for r in rows)
    assert json.loads((run / "summary.json").read_text())["eval_end"]["val/greedy_acc"] == rows[-1]["val/greedy_acc"]
    _assert_no_ray_process({done.session}, ray_env)


@pytest.mark.slow
def test_a_ray_rank_that_dies_ends_the_run(tmp_path, ray_env, rank1_dies):
    started = time.time()
    done = _train([f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=3", *RAY, *BASE,
                   f"reward.verifiers=[{rank1_dies}]", "reward.weights=[1.0]", "reward.tasks={}"], ray_env)
    assert done.returncode == 2 and time.time() - started < 90, done.stderr[-3000:]  # a bound on a hang
    err = done.stderr
    assert "rank 1 failed (its process died without raising" in err, err[-3000:]
    assert "every rank was stopped" in err and "Run the same command again" in err
    _assert_no_ray_process({done.session}, ray_env)


@pytest.mark.slow
def test_a_ray_rank_that_raises_is_named_with_its_error(tmp_path, ray_env):
    rule = tmp_path / "give_up.py"
    rule.write_text(textwrap.dedent("""
        import os


        class RuleGaveUp(BaseException):
            '''Not an Exception: the reward scorer lets it through, so it ends the rank that scores it.'''


        def give_up(response, label, **_):
            if os.environ.get("RANK") == "1":
                raise RuleGaveUp("rank 1 gave up")
            return 0.0
    """))
    done = _train([f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=3", *RAY, *BASE,
                   f"reward.verifiers=[{rule}:give_up]", "reward.weights=[1.0]", "reward.tasks={}"], ray_env)
    assert done.returncode == 2, done.stderr[-3000:]
    err = done.stderr
    assert "RuleGaveUp: rank 1 gave up); every rank was stopped" in err, err[-3000:]
    assert "rank 1 failed (" in err and 'give_up.py", line' in err  # the rank's traceback, above the message
    _assert_no_ray_process({done.session}, ray_env)


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_on_every_ray_rank(tmp_path, ray_env):
    run, out = tmp_path / "r", tmp_path / "stdout"
    with open(out, "w") as stdout:
        driver = _start([sys.executable, "-m", "verirl.cli", "train", f"trainer.run_dir={run}",
                         "trainer.total_steps=500", "trainer.save_freq=1000", *RAY, *BASE], ray_env,
                        stdout=stdout, stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 180
            while "step     2" not in out.read_text() and driver.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            assert driver.poll() is None, driver.stderr.read()[-3000:]
            driver.send_signal(signal.SIGINT)  # what Ctrl-C sends
            err = driver.communicate(timeout=120)[1]
        finally:
            if driver.poll() is None:
                _end({driver.pid}, ray_env)
    assert driver.returncode == 130, err[-3000:]
    assert "every rank is asked to save a checkpoint" in err and "stopped by SIGINT after step" in err
    step = len(_rows(run / "metrics.jsonl"))
    assert f"after step {step};" in err and (run / "checkpoints" / f"step_{step:06d}").is_dir()
    _assert_no_ray_process({driver.pid}, ray_env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_command_on_the_head_of_a_two_machine_cluster(tmp_path, ray_env):
    """The multi-node recipe with two Ray nodes on this machine: `ray start --head`, `ray start
    --address=...`, one `verirl train` that joins (trainer.ray_address=auto) and places one rank on
    each node (each has one CPU)."""
    import ray

    env = {**ray_env, "RAY_AUTH_MODE": "disabled"}
    cli, head = str(Path(sys.executable).with_name("ray")), f"{ray.util.get_node_ip_address()}:{_free_port()}"
    sessions: set = set()
    try:
        for args in (["--head", f"--port={head.rsplit(':', 1)[1]}", "--include-dashboard=false"],
                     [f"--address={head}"]):
            node = _start([cli, "start", *args, "--num-cpus=1", "--disable-usage-stats"], env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            sessions.add(node.pid)
            out = node.communicate(timeout=120)[0]
            assert node.returncode == 0, out[-3000:]
        run = tmp_path / "r"
        done = _train([f"trainer.run_dir={run}", "trainer.total_steps=2", *RAY, *BASE], env)
        sessions.add(done.session)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"joined the Ray cluster at {head}: 2 machines, {{CPU: 2}}" in done.stderr, done.stderr[-3000:]
        assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2]
    finally:
        _end(sessions, env)
    assert not _left_behind(sessions, env)


@pytest.mark.parametrize("address,needle", [
    ("127.0.0.1:1", "trainer.ray_address=127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1"),
    ("nonsense", "trainer.ray_address=nonsense is not a Ray cluster address"),
])
def test_an_unreachable_ray_address_is_a_config_error(tmp_path, capsys, address, needle):
    run = tmp_path / "r"
    started = time.time()
    assert main(["train", f"trainer.run_dir={run}", *RAY, "actor.strategy=ddp", f"trainer.ray_address={address}"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert time.time() - started < 15 and not run.exists()


def test_ranks_are_numbered_node_by_node_with_the_drivers_first():
    from verirl.launch.ray import rank_envs, rank_order

    def at(node, ip, gpu):
        return {"node": node, "ip": ip, "pid": 1, "accelerators": {"GPU": [gpu], "NPU": []}}

    # bundles as Ray placed them: two on machine b, two on machine a (the driver's)
    where = [at("b", "10.0.0.2", "3"), at("a", "10.0.0.1", "5"), at("b", "10.0.0.2", "1"), at("a", "10.0.0.1", "0")]
    order = rank_order(where, here="a")
    assert order == [1, 3, 0, 2]
    envs = rank_envs(where, order, {"CPU": 4.0, "GPU": 1.0}, 29500, {"VERIRL_X": "1"})
    assert [e["RANK"] for e in envs] == ["2", "0", "3", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["VERIRL_X"]) for e in envs} == {("10.0.0.1", "29500", "1")}
    # each machine's ranks see its two GPUs in local-rank order: cuda:LOCAL_RANK is the rank's own
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3,1", "5,0", "3,1", "5,0"]
    cpu = rank_envs(where, order, {"CPU": 1.0}, 29500, {})
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in cpu)


def test_a_tensor_parallel_group_is_one_bundle_and_its_ranks_are_consecutive_on_one_machine():
    """actor.tensor_parallel_size=2 on 4 ranks: two bundles of two ranks' resources (Ray never splits a
    bundle between machines), actors 0-1 in bundle 0 and 2-3 in bundle 1; wherever Ray puts the bundles,
    each tensor-parallel group (ranks 0-1, 2-3: the mesh's innermost dimension) is on one machine."""
    from verirl.config import load_config
    from verirl.launch.ray import bundles, placement, rank_envs, rank_order, ranks_per_bundle

    cfg = load_config(None, ["trainer.nproc_per_node=4", "actor.tensor_parallel_size=2"])
    group = ranks_per_bundle(cfg)
    assert group == 2 and ranks_per_bundle(load_config(None, ["trainer.nproc_per_node=4"])) == 1
    assert bundles(4, {"CPU": 3.0, "GPU": 1.0}, group) == [{"CPU": 6.0, "GPU": 2.0}] * 2
    assert bundles(4, {"CPU": 3.0}, 1) == [{"CPU": 3.0}] * 4

    def at(node, gpu):
        return {"node": node, "ip": f"10.0.0.{ord(node)}", "pid": 1, "accelerators": {"GPU": [gpu], "NPU": []}}

    # bundle 0 (actors 0, 1) placed on machine b, bundle 1 (actors 2, 3) on machine a, the driver's
    where = [at("b", "0"), at("b", "1"), at("a", "0"), at("a", "1")]
    envs = rank_envs(where, rank_order(where, here="a"), {"CPU": 3.0, "GPU": 1.0}, 29500, {})
    node_of = {int(e["RANK"]): w["node"] for e, w in zip(envs, where)}
    assert node_of == {0: "a", 1: "a", 2: "b", 3: "b"}  # groups (0, 1) and (2, 3) each on one machine
    assert placement(where, envs, group) == (
        "verirl: 4 ranks on 2 machines: 10.0.0.97 ranks 0, 1 (tensor-parallel group 0, each of 2 ranks); "
        "10.0.0.98 ranks 2, 3 (tensor-parallel group 1, each of 2 ranks)")


def test_importing_verirl_does_not_import_ray():
    code = ("import sys, verirl.cli, verirl.train.loop, verirl.launch, verirl.launch.local, verirl.tools.plan; "
            "sys.exit('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
