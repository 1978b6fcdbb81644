"""The scoring pool with real worker processes and real rule files: a deadline per call from its
start, workers replaced while the others go on, workers that die with their parent, a memory
cap, captured output."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verirl.rewards import Scorer

RULES = '''
import os, signal, sys, time

def hang(response, label):
    if "hang" in response:
        print("about to hang", flush=True)
        time.sleep(3600)
    return 1.0

def hang_and_tell(response, label):  # writes its worker's pid where the test can find it, then hangs
    open(os.path.join(os.environ["VERIRL_TEST_PIDS"], str(os.getpid())), "w").close()
    time.sleep(3600)

def fine(response, label):
    return 0.5

def slow(response, label):
    time.sleep(0.6)
    return 1.0

def big(response, label):
    if "big" in response:
        block = bytearray(8 * 2**30)  # 8 GB, far past the cap
    return 1.0

def die(response, label):
    if "die" in response:
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
    return 1.0

def chatty(response, label):
    print("to stderr too", file=sys.stderr)
    for i in range(40_000):  # 40,000 lines of 250 bytes: 10 MB
        print(f"line {i:06d} " + "x" * 238)
    print("the very last line " + "y" * 300)
    raise ValueError("after talking")
'''


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "pool_rules.py"
    path.write_text(RULES)
    return lambda fn: f"{path}:{fn}"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_hanging_calls_cost_one_timeout_and_the_other_calls_go_on(rules):
    s = Scorer([rules("hang"), rules("fine")], [1.0, 1.0], workers=2, timeout=1.5, chunk=1)
    try:
        assert s(["ok"], [{"label": "1"}]).errors == 0  # the workers are up: what follows is scoring only
        t0 = time.monotonic()
        res = s(["hang"] * 6, [{"label": "1"}] * 6)  # 6 hanging calls, then 6 calls of `fine`
        took = time.monotonic() - t0
        assert res.per_rule["hang"] == [0.0] * 6 and res.per_rule["fine"] == [0.5] * 6 and res.errors == 6
        assert took < 1.5 + 3.5, took  # one timeout, not ceil(6 / 2) = 3 of them
        assert s.pool.restarts == 2  # the two workers that ran a hanging call; the other 4 calls never started
        again = s(["ok", "ok", "ok"], [{"label": "1"}] * 3)  # the replacements serve the next batch
        assert again.per_rule == {"hang": [1.0] * 3, "fine": [0.5] * 3} and again.errors == 0
    finally:
        s.close()
        s.close()  # twice is fine


def test_the_deadline_counts_from_a_calls_start_not_from_submission(rules):
    s = Scorer([rules("slow")], [1.0], workers=1, timeout=1.0, chunk=1)
    try:
        s(["warm"], [{"label": "1"}])
        t0 = time.monotonic()
        res = s(["a", "b", "c"], [{"label": "1"}] * 3)  # 3 x 0.6 s in one worker: past 1 s in all
        assert time.monotonic() - t0 > 1.0
        assert res.per_rule["slow"] == [1.0] * 3 and res.errors == 0 and s.pool.restarts == 0
    finally:
        s.close()


def test_a_late_call_is_reported_with_what_it_printed(rules, capsys):
    s = Scorer([rules("hang")], [1.0], workers=1, timeout=1.0)
    try:
        assert s(["hang"], [{"label": "7"}]).errors == 1
    finally:
        s.close()
    err = capsys.readouterr().err
    assert "reward rule 'hang' timed out after 1s on response 'hang' (label '7'" in err
    assert "The last lines it printed:\n    about to hang" in err


PARENT = '''
import sys, time
from verirl.rewards import Scorer
from verirl.rewards.pool import RewardPool
RewardPool._pdeathsig = sys.argv[2] == "1"
s = Scorer([sys.argv[1]], [1.0], workers=2, timeout=600, chunk=1)
s.submit(["a", "b"], [{"label": "1"}] * 2)
time.sleep(600)
'''


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["pdeathsig+watchdog", "watchdog-alone"])
def test_workers_die_with_their_parent(rules, tmp_path, pdeathsig):
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    env = dict(os.environ, VERIRL_TEST_PIDS=str(pids_dir))
    parent = subprocess.Popen([sys.executable, "-c", PARENT, rules("hang_and_tell"), "1" if pdeathsig else "0"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(pids_dir)) < 2:  # both workers are inside the hanging rule
            assert parent.poll() is None and time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        workers = [int(p) for p in os.listdir(pids_dir)]
        assert all(_alive(p) for p in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in workers if _alive(p)]
    for p in left:  # do not leave them spinning after a failure
        os.kill(p, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent by 5 s"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reward.max_memory_mb uses RLIMIT_AS (Linux)")
def test_memory_cap_scores_zero_and_a_killed_worker_is_replaced(rules, capsys):
    s = Scorer([rules("big"), rules("die")], [1.0, 1.0], workers=1, timeout=30, chunk=1, max_memory_mb=1024)
    try:
        res = s(["big", "ok"], [{"label": "1"}] * 2)
        assert res.per_rule["big"] == [0.0, 1.0] and res.per_rule["die"] == [1.0, 1.0] and res.errors == 1
        assert s.pool.restarts == 0  # MemoryError inside the worker: it lives on
        err = capsys.readouterr().err
        assert "out of memory: more than reward.max_memory_mb=1024 MB of address space (virtual memory" in err
        res = s(["die", "ok"], [{"label": "1"}] * 2)
        assert res.per_rule["die"] == [0.0, 1.0] and res.errors == 1 and s.pool.restarts == 1
        assert "worker died: killed by SIGKILL (the kernel's out-of-memory killer" in capsys.readouterr().err
    finally:
        s.close()


def test_what_a_rule_prints_is_captured_and_cut(rules, capfd):
    s = Scorer([rules("chatty")], [1.0], workers=1, timeout=60)
    try:
        assert s(["talk"], [{"label": "1"}]).errors == 1
    finally:
        s.close()
    out, err = capfd.readouterr()
    assert len(out) + len(err) < 4096, len(out) + len(err)  # the rule printed 10 MB
    assert "raised ValueError: after talking" in err
    shown = err.split("The last lines it printed:\n", 1)[1].splitlines()
    last = [f"line {i:06d} " + "x" * 238 for i in range(39_996, 40_000)] + ["the very last line " + "y" * 300]
    assert shown == ["    " + line[:200] + "..." for line in last]


SYS_EXIT_AT_CALL = '''
import sys
def bye(response, label):
    sys.exit(3)
def interrupt(response, label):
    raise KeyboardInterrupt
'''


@pytest.mark.parametrize("workers", [0, 1])
def test_sys_exit_and_keyboard_interrupt_at_call_are_scoring_errors(tmp_path, workers, capsys):
    path = tmp_path / "exits.py"
    path.write_text(SYS_EXIT_AT_CALL)
    s = Scorer([f"{path}:bye", f"{path}:interrupt", "format"], [1.0, 1.0, 1.0], workers=workers)
    try:
        for _ in range(2):  # the worker (or this process) is still there for a second batch
            res = s(["<think>a</think><answer>b</answer>"], [{"label": "1"}])
            assert res.per_rule == {"bye": [0.0], "interrupt": [0.0], "format": [1.0]} and res.errors == 2
        if workers:
            assert s.pool.restarts == 0
    finally:
        s.close()
    err = capsys.readouterr().err
    assert "reward rule 'bye' raised SystemExit: sys.exit(3)" in err
    assert "reward rule 'interrupt' raised KeyboardInterrupt on" in err


def test_a_real_ctrl_c_during_in_process_scoring_still_stops(tmp_path):
    path = tmp_path / "sigint.py"
    path.write_text("import os, signal, time\n"
                    "def slow(response, label):\n"
                    "    os.kill(os.getpid(), signal.SIGINT)\n"
                    "    time.sleep(5)\n"
                    "    return 1.0\n")
    s = Scorer([f"{path}:slow"], [1.0], workers=0)
    with pytest.raises(KeyboardInterrupt):
        s(["x"], [{"label": "1"}])


def test_in_process_scoring_says_once_that_it_has_no_timeout(monkeypatch, capsys):
    import verirl.rewards.scoring as scoring
    monkeypatch.setattr(scoring, "_told_in_process", False)
    Scorer(["format"], [1.0], workers=0)
    Scorer(["format"], [1.0], workers=0)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reward.workers=0" in err and "no timeout" in err
    Scorer(["format"], [1.0], workers=1).close()  # a pool says nothing
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("body,expect", [
    ("import sys\nsys.exit(0)\n", r"importing '.*rule_file\.py' called sys\.exit\(0\) \(.*rule_file\.py, line 2\)"),
    ("raise KeyboardInterrupt\n", r"importing '.*rule_file\.py' raised KeyboardInterrupt \(.*rule_file\.py, line 1\)"),
    ("x = 1\ny = undefined_name\n", r"raised NameError: name 'undefined_name' is not defined \(.*line 2\)"),
], ids=["sys.exit", "KeyboardInterrupt", "NameError"])
def test_a_rule_file_that_fails_on_import_is_a_config_error(tmp_path, body, expect):
    from verirl.core.errors import ConfigError
    from verirl.rewards import load_rule
    path = tmp_path / "rule_file.py"
    path.write_text(body + "def f(response, label):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=expect):
        load_rule(f"{path}:f")


def test_the_cli_reports_a_rule_file_that_exits_in_one_paragraph(tmp_path):
    path = tmp_path / "exits_on_import.py"
    path.write_text("import sys\nsys.exit(0)\ndef f(response, label):\n    return 1.0\n")
    verirl = Path(sys.executable).parent / "verirl"
    run = subprocess.run([str(verirl), "eval", "--verifiers", f"{path}:f"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr
    assert f"importing '{path}' called sys.exit(0)" in run.stderr and "__main__" in run.stderr
