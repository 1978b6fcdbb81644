"""Asynchronous training (docs/async.md): rollout.placement=separate with real producer processes, the
weights store in real shared memory, real kill -9 of a producer and of the whole run."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from verirl.cli import main

BASE = ["data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=24",
        "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
        "reward.workers=0", "trainer.threads=1", "trainer.dump_rollouts=true",
        "model.compute_dtype=null"]  # float32: model.compute_dtype=auto is bfloat16 on a CPU with AMX / avx512_bf16
SEPARATE = ["rollout.placement=separate", "trainer.nproc_per_node=2"]
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
NOT_COMPARED = ("timing/", "perf/", "async/")


def _train(run: Path, *extra: str, steps: int = 4) -> list[dict]:
    assert main(["train", f"trainer.total_steps={steps}", f"trainer.run_dir={run}", *BASE, *extra]) == 0
    return _rows(run)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]


def _compared(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(NOT_COMPARED)} for r in rows]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


def test_max_staleness_0_on_a_producer_gives_the_synchronous_rows(tmp_path):
    """1 trainer + 1 producer with k=0 (mode bounded, partial rollouts on, truncated importance weights):
    every metrics.jsonl key but timing/perf/async equal to the synchronous run's, the same final weights,
    and every importance weight exp(trainer - engine) 1 within 1e-5 (the producer samples each step from
    the trainer's current weights)."""
    correction = "algo.rollout_correction.rollout_is=token"
    sync = _train(tmp_path / "sync", correction)
    separate = _train(tmp_path / "sep", *SEPARATE, correction, "trainer.async_training.mode=bounded",
                      "trainer.async_training.partial_rollout=true")
    assert _compared(separate) == _compared(sync)
    for r in separate:
        assert r["async/staleness_max"] == 0.0 and r["async/queue_depth"] >= 1 and r["async/weight_sync_s"] >= 0
        assert r["rollout/logprob_diff/max"] < 1e-5, r
        assert abs(r["mismatch/ratio_p05"] - 1) < 1e-5 and abs(r["mismatch/ratio_p95"] - 1) < 1e-5
    a, b = _weights(tmp_path / "sync"), _weights(tmp_path / "sep")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # every record names the weights that sampled it: version step - 1, as the synchronous step
    assert {(r["step"], r["weight_version"]) for r in _records(tmp_path / "sep")} == {(s, s - 1) for s in range(1, 5)}
    assert {(r["step"], r["weight_version"]) for r in _records(tmp_path / "sync")} == {(s, s - 1) for s in range(1, 5)}


def test_fixed_mode_samples_from_version_s_minus_1_minus_k_with_filtered_steps(tmp_path):
    """mode=fixed, k=1, DAPO's filter_groups on the producer: step s trains on samples of version
    max(0, s - 2) (staleness 1 from step 2 on), which really are one update old: the engine's log-probs
    differ from the trainer's proximal ones, as they do not at step 1."""
    rows = _train(tmp_path / "a", *SEPARATE, "trainer.async_training.max_staleness=1", "algo.filter_groups.enable=true",
                  "algo.filter_groups.max_num_gen_batches=2")
    assert {(r["step"], r["weight_version"]) for r in _records(tmp_path / "a")} == \
        {(s, max(0, s - 2)) for s in range(1, 5)}
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["filter/gen_batches"] >= 1 for r in rows)
    assert rows[0]["rollout/logprob_diff/max"] < 1e-5
    assert all(r["rollout/logprob_diff/max"] > 1e-4 for r in rows[1:]), [r["rollout/logprob_diff/max"] for r in rows]


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _producer_of(pid: int) -> int:
    """The producer process of the trainer ``pid`` (a spawned child, not the resource tracker)."""
    found = [c for c in _children(pid) if "spawn_main" in _cmdline(c) and "resource_tracker" not in _cmdline(c)]
    assert len(found) == 1, [(c, _cmdline(c)) for c in _children(pid)]
    return found[0]


def _args(run: Path, *extra: str) -> list[str]:
    return ["train", f"trainer.run_dir={run}", *BASE, *extra]


def _cmd(run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "verirl.cli", *_args(run, *extra)]


def _wait_rows(run: Path, n: int, proc: subprocess.Popen, seconds: float = 240) -> None:
    path, deadline = run / "metrics.jsonl", time.time() + seconds
    while not (path.exists() and path.read_text().count("\n") >= n):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.05)


@pytest.mark.slow  # ~60 s here
def test_a_producer_killed_mid_run_is_started_again_and_nothing_is_left(tmp_path):
    """kill -9 of the producer (multi-turn episodes with an environment: its tool workers are its children)
    after step 3: the trainer starts it again and regenerates the step it was making; the run ends with
    every step once, the episodes had turns, and no process of its group is left."""
    from test_multiturn_train import ENV_FILE

    env = tmp_path / "hints.py"
    env.write_text(ENV_FILE)
    run = tmp_path / "r"
    p = subprocess.Popen(_cmd(run, *SEPARATE, "trainer.total_steps=6", "trainer.async_training.max_staleness=1",
                              "rollout.max_new_tokens=96", "rollout.multi_turn.enable=true",
                              f"rollout.multi_turn.environment={env}:Hints", "rollout.multi_turn.max_tokens_per_turn=32"),
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_rows(run, 3, p)
        os.kill(_producer_of(p.pid), signal.SIGKILL)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, err.decode()[-3000:]
    assert "starting it again (restart 1 of at most 3)" in out.decode() + err.decode()
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert all(r["turns/mean"] > 1 for r in rows)
    _assert_group_ends(p.pid)


def _assert_group_ends(pgid: int, seconds: float = 15) -> None:
    """No process of the group is left once its exited ones are reaped (by init, for the orphans)."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    left = [d.name for d in Path("/proc").iterdir() if d.name.isdigit() and _pgid(d) == pgid]
    raise AssertionError(f"processes of the run left: {[(pid, _cmdline(int(pid))) for pid in left]}")


def _pgid(d: Path) -> int:
    try:
        return int((d / "stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return -1


@pytest.mark.slow  # ~100 s here
def test_fixed_mode_is_reproducible_and_resumes_after_kill_9_to_the_same_weights(tmp_path, capsys):
    """mode=fixed, k=1, a checkpoint every 2 steps: a second run with the same seed, killed with SIGKILL
    at a random step and continued by the same command, logs the first run's rows (every step once) and
    ends with its weights. The first run and the continuation run in this process (one start-up less
    each); the killed run is a process of its own."""
    extra = [*SEPARATE, "trainer.async_training.max_staleness=1", "trainer.save_freq=2", "trainer.total_steps=6"]
    first = tmp_path / "first"
    assert main(_args(first, *extra)) == 0
    a = _weights(first)
    run = tmp_path / "killed"  # a second run with the same seed, killed, then continued
    p = subprocess.Popen(_cmd(run, *extra), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        _wait_rows(run, random.Random().randint(3, 4), p)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    capsys.readouterr()
    assert main(_args(run, *extra)) == 0
    assert "resuming from" in capsys.readouterr().out
    assert all(torch.equal(a[k], v) for k, v in _weights(run).items())
    assert _compared(_rows(run)) == _compared(_rows(first))  # every step once: the log was cut back to the checkpoint


@pytest.mark.slow  # ~50 s here
def test_ctrl_c_saves_the_queue_and_bounded_partial_rollouts_resume_never_older_than_k(tmp_path):
    """mode=bounded with partial rollouts, k=2, responses long enough that updates land mid-decoding.
    Ctrl-C (SIGINT to the terminal's whole process group) after step 3 saves a checkpoint holding the
    steps the producer had answered, and stops both sides; the same command trains the rest, every step
    once. Every token's version (rollouts.jsonl) is at most k behind the weights that train on it, the
    runs of versions cover the response, and versions only grow along a response."""
    extra = [*SEPARATE, "trainer.async_training.max_staleness=2", "trainer.async_training.mode=bounded",
             "trainer.async_training.partial_rollout=true", "rollout.max_new_tokens=96", "trainer.total_steps=6",
             "trainer.save_freq=100"]
    run = tmp_path / "r"
    p = subprocess.Popen(_cmd(run, *extra), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        _wait_rows(run, 3, p)
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 128 + signal.SIGINT, err.decode()[-3000:]
    assert "stopped by SIGINT after step" in err.decode() and "Traceback" not in err.decode()
    _assert_group_ends(p.pid)
    saved = max((run / "checkpoints").glob("step_*"))
    state = json.loads((saved / "state.json").read_text())
    stopped = state["step"]
    assert [q["step"] for q in state["async_queue"]] == list(range(stopped + 1, stopped + 1 + len(state["async_queue"])))
    assert main(_args(run, *extra)) == 0  # the same command, in this process (one start-up less)
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert max(r["async/staleness_max"] for r in rows) <= 2
    for r in _records(run):
        versions = [v for v, _ in r["versions"]]
        assert sum(k for _, k in r["versions"]) == r["response_length"], r["versions"]
        assert versions == sorted(versions)
        assert r["step"] - 1 - min(versions) <= 2, (r["step"], r["versions"])
        assert r["weight_version"] == min(versions)


def test_the_weights_store_never_hands_out_a_half_written_version():
    """A writer process publishing versions v (every value v) while this process loads: every load that
    succeeds holds one version whole, and fixed mode's ring keeps the k + 1 newest."""
    import multiprocessing as mp

    from verirl.train.weight_store import WeightStore

    weights = {"a": torch.zeros(1 << 18), "b": torch.zeros(64, 64, dtype=torch.float64)}
    store = WeightStore.create(weights, 2)
    ctx = mp.get_context("spawn")
    writer = ctx.Process(target=_publish_many, args=(store, 200))
    writer.start()
    into = {k: torch.empty_like(v) for k, v in weights.items()}
    loaded = set()
    try:
        while writer.is_alive() or not loaded:
            v = store.latest()
            if v >= 0 and store.load(v, into):
                assert torch.all(into["a"] == v) and torch.all(into["b"] == v), v
                loaded.add(v)
    finally:
        writer.join(30)
    assert writer.exitcode == 0 and len(loaded) > 1
    assert store.latest() == 199 and store.has(198) and not store.has(197)  # two slots: the two newest


def _publish_many(store, n: int) -> None:
    for v in range(n):
        store.publish(v, {"a": torch.full((1 << 18,), float(v)), "b": torch.full((64, 64), float(v),
                                                                                  dtype=torch.float64)})


def test_native_engine_reloads_weights_mid_decoding_on_both_of_its_forwards(tiny):
    """Partial rollouts: weights changed in place after decoding step 5. The lean decoder packs them
    again and the transformers forward reads them live: both sample the same tokens, the versions say
    which weights sampled each token, and the tokens before the switch are the unswitched run's."""
    import copy

    from verirl.rollout import NativeEngine, SamplingParams
    from verirl.rollout import native

    lm = tiny
    model = copy.deepcopy(lm.model)
    new = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
           for k, v in copy.deepcopy(model.state_dict()).items()}
    old = copy.deepcopy(model.state_dict())
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    prompts = [[1, 5, 9, 12], [1, 7, 3]]

    def run(lean: bool, switch_at) -> tuple:
        model.load_state_dict(old)
        engine = NativeEngine(model, lm.pad_id, [2])
        calls = {"n": 0}

        def refresh() -> int:
            calls["n"] += 1
            if switch_at is not None and calls["n"] == switch_at:
                with torch.no_grad():
                    for k, v in model.state_dict().items():
                        v.copy_(new[k])
            return int(switch_at is not None and calls["n"] >= switch_at)
        engine.refresh = refresh
        saved = native.lean_supported
        if not lean:
            native.lean_supported = lambda m: False
        try:
            r = engine.generate(prompts, 2, params)
        finally:
            native.lean_supported = saved
        return r, list(engine.last_versions)

    lean, versions = run(True, 6)  # the 6th call: before decoding step 5 (the first is before the prefill)
    hf, hf_versions = run(False, 6)
    plain, plain_versions = run(True, None)
    assert versions == hf_versions == [0] * 5 + [1] * (len(versions) - 5)
    assert plain_versions == [0] * len(plain_versions)
    assert torch.equal(lean.response_ids, hf.response_ids)
    assert torch.allclose(lean.sample_logprobs, hf.sample_logprobs, atol=1e-4)
    assert torch.equal(lean.response_ids[:, :5], plain.response_ids[:, :5])
    assert not torch.allclose(lean.sample_logprobs[:, 5:], plain.sample_logprobs[:, 5:], atol=1e-3)


@pytest.mark.parametrize("extra, needle", [
    (["trainer.async_training.max_staleness=1"], "needs rollout.placement=separate"),
    ([*SEPARATE, "rollout.nproc=2"], "leaves 0 to train"),
    ([*SEPARATE, "trainer.nnodes=2", "trainer.rdzv_endpoint=h:1"], "on one machine today"),
    ([*SEPARATE, "trainer.async_training.partial_rollout=true"], "mode=fixed samples each step from one"),
    ([*SEPARATE, "trainer.async_training.max_staleness=1", "trainer.async_training.mode=bounded",
      "trainer.async_training.sync_every=3"], "is over max_staleness + 1 = 2"),
    ([*SEPARATE, "trainer.async_training.max_staleness=1", "algo.rollout_correction.rollout_rs=null"],
     "with algo.rollout_correction off"),
    ([*SEPARATE, "trainer.async_training.max_staleness=1", "rollout.temperature=0"], "greedy decoding has none"),
    (["rollout.placement=separate", "trainer.nproc_per_node=3", "algo.filter_groups.enable=true"],
     "2 data-parallel trainers"),
    ([*SEPARATE, "trainer.launcher=ray", "model.device=cuda"], "Ray gives that actor only its own devices"),
])
def test_layouts_async_cannot_run_are_one_paragraph_before_anything_loads(tmp_path, capsys, extra, needle):
    assert main(["train", f"trainer.run_dir={tmp_path / 'r'}", *BASE, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_plan_counts_the_trainers_and_names_the_producers(capsys):
    """`verirl plan`: the world size is the trainers' (3 processes - 1 producer = 2 data-parallel ranks)."""
    assert main(["plan", *BASE, "rollout.placement=separate", "trainer.nproc_per_node=3",
                 "trainer.async_training.max_staleness=1"]) == 0
    out = capsys.readouterr().out
    assert "trainer.nproc_per_node 3 x trainer.nnodes 1 - rollout.nproc 1 producers" in out
    assert "samples at most 1 version old (mode fixed" in out
    assert "4 / world size 2" in out


def test_a_store_larger_than_the_shared_memory_is_one_paragraph():
    from verirl.core.errors import ConfigError
    from verirl.train.weight_store import check_room

    with pytest.raises(ConfigError, match=r"needs 1048576 MB of shared memory \(3 copies of the weights.*--shm-size"):
        check_room(1 << 40, 3)
    check_room(1 << 20, 3)  # 1 MB fits
