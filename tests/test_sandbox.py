"""`verirl.sandbox` with real processes: hostile reward rules in the real scoring pool and hostile
programs through `run_program`, as root (how CI runs) and as an unprivileged user (a uid dropped to
with `setpriv`, the sandbox then built on a user namespace)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from verirl.rewards import Scorer
from verirl.sandbox import probe

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from hostile_programs import _alive, _hostile_programs  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")

RULES = textwrap.dedent('''
    import ctypes, os, socket, subprocess, sys, time

    def _name(marker):
        ctypes.CDLL(None).prctl(15, marker.encode(), 0, 0, 0)  # PR_SET_NAME: /proc/PID/comm

    def _seen(marker):
        """Processes named marker that this process can see (the sandbox's own /proc)."""
        time.sleep(0.3)
        n = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                n += open(f"/proc/{pid}/comm").read().strip() == marker
            except OSError:
                pass
        return float(n)

    def _background(marker):
        return subprocess.Popen([sys.executable, "-c", "import ctypes, time; ctypes.CDLL(None).prctl(15, "
                                 f"{marker.encode()!r}, 0, 0, 0); time.sleep(600)"])

    def hostile(response, path="", marker="", port=0):
        if response == "write":
            with open(path, "a") as f:
                f.write('{"step": 999}\\n')
        elif response == "fork":
            for _ in range(1000):
                try:
                    if os.fork() == 0:
                        _name(marker)
                        time.sleep(600)
                        os._exit(0)
                except OSError:  # past the process limit
                    break
            return _seen(marker)
        elif response == "setsid":
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    _name(marker)
                    time.sleep(600)
                os._exit(0)
            return _seen(marker)
        elif response == "background":
            _background(marker)
            return _seen(marker)
        elif response == "connect":
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return 1.0
            except OSError:
                return 0.0
        elif response == "environ":
            with open("/proc/self/environ") as f:
                names = {kv.split("=", 1)[0] for kv in f.read().split("\\0") if kv}
            return float(len(names - {"PATH", "HOME", "TMPDIR", "LANG"}))
        elif response == "memory":
            block = bytearray(8 * 2**30)
            return float(len(block))
        elif response == "loop":
            while True:
                pass
        elif response == "print":
            print("y" * 100_000_000)
        elif response in ("half message", "deep json"):  # write to the worker's own pipe to the trainer
            import json as _json, struct
            fd = _json.loads(open("/proc/self/cmdline").read().split("\\0")[4])["args"]["tasks_fd"]
            body = b"[" * 100_000
            os.write(fd, struct.pack("!i", 64) if response == "half message" else struct.pack("!i", len(body)) + body)
            time.sleep(30)
        elif response == "hang":
            _background(marker)
            time.sleep(600)
        return 1.0
''')


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rules") / "hostile.py"
    path.write_text(RULES)
    return f"{path}:hostile"


@pytest.fixture(scope="module")
def scorer(rule_file):
    os.environ["VERIRL_TEST_SECRET"] = "trainer-only"  # the trainer's variable no rule may see
    try:
        s = Scorer([rule_file], [1.0], workers=1, timeout=4, sandbox=True)
        yield s
        s.close()
    finally:
        os.environ.pop("VERIRL_TEST_SECRET")


def _score(scorer, response, **sample):
    result = scorer([response], [{"label": "1", **sample}])
    return result.per_rule["hostile"][0], result.errors


def test_everything_is_on_as_root():
    if os.geteuid() != 0:
        pytest.skip("as root only")
    unshare = shutil.which("unshare")
    if not unshare or subprocess.run([unshare, "--pid", "--fork", "--mount", "--net", "true"]).returncode:
        pytest.skip("this machine refuses new namespaces even to root (a container without privileges)")
    table = probe()
    off = {m: v for m, v in table.items() if not (v.startswith("on") or v.startswith("not needed"))}
    assert not off, off


@pytest.fixture
def run_dir():
    """A run directory outside /tmp (which the sandbox replaces with its own, hiding anything there)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="verirl-run-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_rule_cannot_write_to_the_run_directory(scorer, run_dir):
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n')
    os.chmod(run_dir, 0o777)  # even where the sandbox's uid may write
    os.chmod(metrics, 0o666)
    hidden = Scorer([scorer.rules[0].spec], [1.0], workers=1, timeout=4, sandbox=True, hide=[str(run_dir)])
    try:
        assert _score(hidden, "write", path=str(metrics)) == (0.0, 1)  # hidden: scored 0, counted in reward/errors
        assert _score(hidden, "ok") == (1.0, 0)
    finally:
        hidden.close()
    assert metrics.read_text() == '{"step": 1}\n'
    assert _score(scorer, "write", path=str(metrics)) == (0.0, 1)  # visible: the file system is read-only
    assert metrics.read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("how", ["fork", "setsid", "background"])
def test_nothing_a_rule_starts_outlives_its_call(scorer, how):
    marker = f"vs{how[:3]}{os.getpid() % 10**6}"  # this run's alone (a process name holds 15 characters)
    started, errors = _score(scorer, how, marker=marker)
    assert errors == 0 and started >= (100 if how == "fork" else 1)  # alive in the sandbox before the call ended
    deadline = time.monotonic() + 5
    while _alive(marker) and time.monotonic() < deadline:  # SIGKILL is asynchronous
        time.sleep(0.05)
    assert not _alive(marker)
    assert _score(scorer, "ok") == (1.0, 0)


def test_a_rule_reaches_no_server_on_loopback(scorer):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
    try:
        assert _score(scorer, "connect", port=server.getsockname()[1]) == (0.0, 0)
    finally:
        server.close()
    assert accepted in ([], [None])


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


def test_a_rule_sees_none_of_the_trainers_variables(scorer):
    assert "VERIRL_TEST_SECRET" in os.environ
    assert _score(scorer, "environ") == (0.0, 0)


@pytest.mark.parametrize("what,within", [("memory", 3.0), ("loop", 8.0), ("print", 8.0)])
def test_memory_loops_and_floods_end_within_their_limits(scorer, what, within):
    start = time.monotonic()
    score, errors = _score(scorer, what)
    assert time.monotonic() - start < within
    assert (score, errors) == ((1.0, 0) if what == "print" else (0.0, 1))
    assert _score(scorer, "ok") == (1.0, 0)  # the run goes on


@pytest.mark.slow  # in .ci/run (make test-slow)
@pytest.mark.parametrize("what", ["half message", "deep json"])
def test_a_rule_writing_to_the_trainers_pipe_costs_its_call_only(scorer, what):
    """Half a message (the trainer's read waits `PIPE_WAIT` at most) or JSON nested 100,000 deep (no
    RecursionError reaches the trainer): the worker is replaced, the call scores 0, the next is scored."""
    start = time.monotonic()
    assert _score(scorer, what) == (0.0, 1)
    assert time.monotonic() - start < 15
    assert _score(scorer, "ok") == (1.0, 0)


@pytest.mark.slow  # in .ci/run (make test-slow)
def test_killing_the_trainer_mid_call_leaves_nothing(rule_file, tmp_path):
    marker = f"vskill{os.getpid() % 10**6}"
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f'''
        from verirl.rewards import Scorer
        if __name__ == "__main__":
            s = Scorer([{rule_file!r}], [1.0], workers=1, timeout=600, sandbox=True)
            print("scoring", flush=True)
            s(["hang"], [{{"label": "1", "marker": {marker!r}}}])
    '''))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "scoring"
        deadline = time.monotonic() + 30
        while not _alive(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(marker)  # the rule's background job
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(marker)


def test_the_sandbox_changes_no_score(rule_file):
    from verirl.data import arith_split

    _, val = arith_split(0, 0, 16)
    responses = [f"<think>x</think><answer>\\boxed{{{p.label}}}</answer>" if i % 3 else "no answer"
                 for i, p in enumerate(val)]
    samples = [{"label": p.label, "task": p.task} for p in val]
    scores = {}
    for sandbox in (True, False):
        s = Scorer(["acc", "format", "math"], [1.0, 0.5, 1.0], workers=1, sandbox=sandbox)
        try:
            scores[sandbox] = s(responses, samples)
        finally:
            s.close()
    assert scores[True].per_rule == scores[False].per_rule and scores[True].totals == scores[False].totals
    assert scores[True].errors == 0


def test_hostile_programs_are_held_as_root(tmp_path):
    held = _hostile_programs(tmp_path)
    assert all(held.values()), held


UNPRIVILEGED = 65533


@pytest.mark.slow  # in .ci/run (make test-slow)
def test_hostile_programs_are_held_as_an_unprivileged_user(tmp_path_factory):
    """The same programs from a process of uid 65533 (setpriv, no capabilities): the sandbox is built on
    a user namespace. The system Python runs them, with a copy of verirl's sandbox readable by that uid."""
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if os.geteuid() != 0 or not setpriv or not os.access(python, os.X_OK):
        pytest.skip("needs root (to become another user), setpriv and /usr/bin/python3")
    top = Path(tmp_path_factory.getbasetemp().parent.parent) / f"verirl-sandbox-user-{os.getpid()}"
    shutil.rmtree(top, ignore_errors=True)
    src = Path(__file__).resolve().parents[1] / "src" / "verirl"
    (top / "verirl").mkdir(parents=True)
    shutil.copy(src / "__init__.py", top / "verirl")
    shutil.copytree(src / "sandbox", top / "verirl" / "sandbox")
    shutil.copy(Path(__file__).parent / "scripts" / "hostile_programs.py", top / "hostile_programs.py")
    work = top / "work"
    work.mkdir()
    for path in [top, *top.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    os.chown(work, UNPRIVILEGED, UNPRIVILEGED)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import hostile_programs as h; "
            "from verirl.sandbox import probe; print(json.dumps([probe(), h._hostile_programs(Path(sys.argv[2]))]))")
    try:
        out = subprocess.run([setpriv, f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups",
                              "env", "-i", f"PYTHONPATH={top}", "HOME=/nonexistent", python, "-c", code, str(top),
                              str(work)], capture_output=True, text=True, timeout=300, cwd=top)
        assert out.returncode == 0, out.stderr[-3000:]
        table, held = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert table["user namespace"] == "on" and table["unprivileged uid"].startswith("on"), table
    assert all(held.values()), held


def test_doctor_prints_what_is_on(capsys):
    from verirl.cli import main
    from verirl.sandbox import MECHANISMS

    rc = main(["doctor", "--sandbox", "--json"])
    table = json.loads(capsys.readouterr().out)
    assert list(table) == MECHANISMS
    assert rc == (1 if any(v.startswith("off") for v in table.values()) else 0)


def test_plain_workers_are_said_once_at_start(capsys):
    from verirl.config import load_config
    from verirl.train.build import build_scorer

    reward = load_config("tiny", ["reward.sandbox=false"]).reward
    build_scorer(reward, 1).close()
    assert "reward.sandbox=false: rules run in plain workers" in capsys.readouterr().err
    build_scorer(load_config("tiny").reward, 1).close()
    assert "reward.sandbox=false" not in capsys.readouterr().err
