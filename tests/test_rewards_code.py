"""The rule 'code': programs run against test cases in the real sandbox (verirl.rewards.code)."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from verirl.config.schema import CodeRewardConfig
from verirl.rewards.service import ServiceScores
from verirl.rewards.code import (BATCH_START_FACTOR, COMPILE_ERRORS, MIN_SAMPLE_CAP, NO_PROGRAM, STARTUP_S, Case,
                                 CodeService, CasesFormatError, extract, job_for, limits_for, parse_tests, passed,
                                 run_sample, same_output, same_value)
from verirl import sandbox
from verirl.sandbox import UID_BASE, probe

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")
FIXTURES = Path(__file__).parent / "fixtures" / "code"
MARGIN = 1.5  # seconds a deadline may be overrun by: the harness's own bookkeeping on a loaded machine
ADD = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD_TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def service(**kw) -> CodeService:
    return CodeService(CodeRewardConfig(**{"test_timeout_s": 2.0, "sample_timeout_s": 6.0, **kw}))


def score(program: str, tests, hide: tuple[str, ...] = (), **kw):
    """(score, why, counts, seconds) of one response holding ``program`` in a fenced block."""
    svc = CodeService(CodeRewardConfig(**{"test_timeout_s": 2.0, "sample_timeout_s": 6.0, **kw}), hide=hide)
    try:
        start = time.monotonic()
        out = svc.score([f"Here it is:\n```python\n{program}```\n"], [{"label": tests, "task": "code"}])
        (value, why), = out.scores
        return value, why, out.counts, time.monotonic() - start
    finally:
        svc.close()


_EARLIER: set[int] = set()  # processes alive before the running test (other tests' helpers, in a whole suite)


@pytest.fixture(autouse=True)
def _processes_before():
    _EARLIER.clear()
    _EARLIER.update(p.pid for p in _sandbox_processes())
    yield


def _sandbox_processes() -> list[psutil.Process]:
    found = psutil.Process().children(recursive=True)
    if os.geteuid() == 0:
        mine = {UID_BASE + (os.getpid() * 7919 + k) % 65536 for k in range(next(sandbox._uids))}
        found += [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real in mine]
    return found


def sandbox_processes() -> list[psutil.Process]:
    """This test's descendants, and (as root) every process of a uid this process's sandboxes ran as
    (`verirl.sandbox.sandbox_uid`'s sequence so far), that were not alive when the test started."""
    return [p for p in _sandbox_processes() if p.pid not in _EARLIER]


# --- formats, from fixtures written in each set's own layout ----------------------------------------------------

SOLUTIONS = {
    "apps.json": ("input_output", ADD),
    "taco.json": ("input_output", "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
                                  "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
                                  "                return (seen[target - x], i)\n            seen[x] = i\n"),
    "codecontests.json": ("tests", "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) / n)\n"),
    "livecodebench.json": ("public_test_cases", "class Solution:\n    def rotate(self, nums, k):\n"
                                                "        k %= len(nums)\n        return nums[-k:] + nums[:-k]\n"),
    "livecodebench_atcoder.json": ("public_test_cases", "print(2 * int(input()))\n"),
    "prime.json": ("ground_truth", "def max_pair(a, b):\n    return (a, 0) if a >= b else (b, 1)\n"),
}


def sample_of(name: str) -> dict:
    """The fixture's row as a sample: its columns, and for CodeContests (three columns) and veRL (the
    ground truth inside reward_model) the tests under one column."""
    row = fixture(name)
    if name == "codecontests.json":
        row["tests"] = {k: row[k] for k in ("public_tests", "private_tests", "generated_tests")}
    if name == "prime.json":
        row["ground_truth"] = row["reward_model"]["ground_truth"]
    return {**row, "task": "code"}


def test_each_format_parses_into_cases():
    apps = parse_tests(fixture("apps.json")["input_output"])
    assert apps == [Case("1 2\n", "3\n"), Case("10 -3\n", "7\n"), Case("0 0\n", "0\n")]
    assert parse_tests(fixture("apps.json")) == apps  # the whole row: input_output inside it
    taco = parse_tests(fixture("taco.json")["input_output"])
    assert taco[0] == Case([[2, 7, 11, 15], 9], [[0, 1]], "twoSum") and len(taco) == 3
    cc = parse_tests(sample_of("codecontests.json")["tests"])
    assert [c.input for c in cc] == ["3\n1 2 3\n", "2\n1 2\n", "1\n-5\n", "4\n1 1 1 2\n"]  # public, private, generated
    assert all(c.fn is None for c in cc)
    assert parse_tests(fixture("codecontests.json")["private_tests"]) == cc[1:3]  # one column alone
    lcb_row = fixture("livecodebench.json")
    lcb = parse_tests(lcb_row["public_test_cases"], "rotate")
    assert lcb == [Case([[1, 2, 3, 4], 1], [4, 1, 2, 3], "rotate"), Case([[1, 2], 4], [1, 2], "rotate")]
    assert parse_tests(lcb_row) == [*lcb, Case([[7], 0], [7], "rotate")]  # the row: public + private, metadata
    atcoder = parse_tests(fixture("livecodebench_atcoder.json")["public_test_cases"])
    assert atcoder == [Case("4\n", "8\n"), Case("-1\n", "-2\n")]
    prime = parse_tests(fixture("prime.json")["reward_model"]["ground_truth"])
    assert prime[2] == Case([3.5, 3.25], [3.5, 0], "max_pair") and len(prime) == 3


@pytest.mark.parametrize("bad, says", [
    ("42", "none of APPS/TACO"),
    ('{"question": "no tests here"}', "none of APPS/TACO"),
    ("not json at all", "is not JSON"),
    ('{"inputs": ["1"], "outputs": []}', "one length"),
    (fixture("livecodebench_atcoder.json"), "never unpickles"),
    ('[{"input": "[1]", "output": "1", "testtype": "functional"}]', "func_name"),
])
def test_a_value_in_no_format_is_refused(bad, says):
    with pytest.raises(CasesFormatError, match=says):
        parse_tests(bad)


def test_a_value_in_no_format_scores_none_with_the_reason():
    svc = service()
    try:
        out = svc.score([ADD] * 3, [{"label": "42", "task": "code"}, {"label": "[]", "task": "code"}, {"task": "code"}])
    finally:
        svc.close()
    (s0, why0), (s1, why1), (s2, why2) = out.scores
    assert s2 is None and "reward.code.tests='label': the sample has no such column (it has task)" in why2
    assert s0 is None and "column 'label'" in why0 and "none of APPS/TACO" in why0
    assert s1 is None and why1


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_a_correct_solution_of_each_fixture_scores_one(name):
    column, program = SOLUTIONS[name]
    svc = CodeService(CodeRewardConfig(tests=column, test_timeout_s=2.0, sample_timeout_s=6.0))
    try:
        wrong = program.replace("2 *", "3 *").replace("+ b", "+ b + 1").replace("/ n", "/ n + 1") \
            .replace("return (a, 0)", "return (b, 0)").replace("nums[-k:] + nums[:-k]", "nums") \
            .replace("return (seen", "return (0, seen")
        assert wrong != program
        out = svc.score([f"```python\n{program}```", f"```python\n{wrong}```"], [sample_of(name)] * 2)
    finally:
        svc.close()
    (good, why), (bad, _) = out.scores
    assert good == 1.0, why
    assert bad is not None and bad < 1.0


# --- comparison ---------------------------------------------------------------------------------------------------

def test_output_comparison_is_whitespace_and_float_tolerant():
    assert same_output("3  \n\n\n", "3\n")  # trailing spaces and blank lines
    assert same_output("1 2\r\n3\n", "1 2\n3")
    assert same_output("2.0\n", "2.000000000\n") and same_output("0.3333333", "0.33333333333")
    assert not same_output("2.01", "2.0") and not same_output("3 4", "3") and not same_output("", "0")
    assert same_value([3, 1], [3, 1]) and same_value({"1": 2}, {"1": 2}) and same_value(0.1 + 0.2, 0.3)
    assert not same_value(True, 1) and not same_value([1, 2], [2, 1]) and not same_value("1", 1)


def test_integers_compare_exactly_and_floats_within_the_tolerance():
    assert not same_output("1000000000\n", "1000000007\n") and not same_output("999999", "1000000")
    assert not same_output("3 1000000000", "3 1000000001") and not same_value(1000000000, 1000000001)
    assert same_output("1000000000.0", "1000000001") and same_output("1e9", "1000000001")  # one is a float
    assert not same_output("1_000", "1000") and not same_output("inf", "1e999")


def test_a_function_case_with_unreadable_output_fails_that_case_only():
    case = Case([1], 5, "f")
    assert not passed(case, {"status": "ok", "out": "[" * 3000, "bytes": 3000})  # past the recursion limit
    assert not passed(case, {"status": "ok", "out": "9" * 5000, "bytes": 5000})  # an integer too long to read
    deep = "[" * 200000 + "]" * 200000
    assert not passed(Case([1], [[1]], "f"), {"status": "ok", "out": deep, "bytes": len(deep)})
    writer = ("import os, sys\ndef f(x):\n    if x == 0:\n        os.write(sys._getframe(1).f_locals['w'], b'[' * 3000)\n"
              "        os._exit(0)\n    return x\n")  # writes to the harness's result pipe itself
    tests = json.dumps({"fn_name": "f", "inputs": [[0], [1], [2]], "outputs": [0, 1, 2]})
    value, why, _, _ = score(writer, tests)
    assert value == pytest.approx(2 / 3), why


def test_a_function_returning_a_tuple_matches_a_list_and_apps_wrapped_outputs():
    tests = json.dumps({"fn_name": "pair", "inputs": [[1, 2], [3, 4], [5, 6]],
                        "outputs": [[[2, 1]], [4, 3], [0, 0]]})  # wrapped, bare, wrong
    value, why, _, _ = score("def pair(a, b):\n    return (b, a)\n", tests)
    assert value == pytest.approx(2 / 3), why
    value, _, _, _ = score("def other(a, b):\n    return (b, a)\n", tests)  # no function of that name
    assert value == 0.0


def test_nothing_of_the_expected_outputs_enters_the_sandbox():
    yes_no = json.dumps({"inputs": ["1\n", "2\n", "3\n", "4\n"], "outputs": ["YES\n", "NO\n", "NO\n", "YES\n"]})
    flipped = json.dumps({"inputs": ["1\n", "2\n", "3\n", "4\n"], "outputs": ["NO\n", "YES\n", "YES\n", "NO\n"]})
    cfg = CodeRewardConfig()
    assert job_for(ADD, parse_tests(yes_no), cfg) == job_for(ADD, parse_tests(flipped), cfg)
    assert job_for(ADD, parse_tests(yes_no), cfg)["cap"] == MIN_SAMPLE_CAP
    cheat = ("import gc, sys\nseen = [sys._getframe(1).f_locals.get('case')] + [o for o in gc.get_objects()\n"
             "    if isinstance(o, dict) and 'fn' in o]\nn = [c['cap'] for c in seen if c and 'cap' in c]\n"
             "print({4: 'YES', 3: 'NO'}.get((n[0] - 4096) // 2 if n else 0, '?'))\n")  # YES/NO from the length
    value, why, _, _ = score(cheat, yes_no)
    assert value == 0.0, why


def test_too_long_is_decided_per_case_after_the_run():
    padded = "n = int(input())\nprint('3' + ' ' * n)\n"  # trailing spaces: equal to '3' once stripped
    tests = json.dumps({"inputs": ["4000\n", "4200\n", "9000\n"], "outputs": ["3\n"] * 3})
    res = run_sample(padded, parse_tests(tests), CodeRewardConfig(test_timeout_s=2.0))
    assert [r["status"] for r in res.results] == ["ok", "ok", "ok"]  # all under the sample's cap (16 KiB)
    assert res.score == pytest.approx(1 / 3)  # 4000 + 2 bytes is under 2 * 2 + 4096; 4202 and 9002 are not


# --- scores, modes, extraction ------------------------------------------------------------------------------------

def test_correct_and_off_by_one_in_both_modes():
    assert score(ADD, ADD_TESTS)[0] == 1.0
    off = "a, b = map(int, input().split())\nprint(a + b + (a > 5))\n"  # wrong on one case of three
    assert score(off, ADD_TESTS)[0] == pytest.approx(2 / 3)
    assert score(off, ADD_TESTS, mode="all")[0] == 0.0
    assert score(ADD, ADD_TESTS, mode="all")[0] == 1.0
    assert score(off, ADD_TESTS, max_tests=1)[0] == 1.0  # the first case only
    assert score(off, ADD_TESTS, max_tests=2)[0] == 0.5


def test_a_syntax_error_scores_zero_and_is_counted():
    value, _, counts, seconds = score("def f(:\n    pass\n", ADD_TESTS)
    assert value == 0.0 and counts[COMPILE_ERRORS] == 1.0
    assert score(ADD, ADD_TESTS)[2][COMPILE_ERRORS] == 0.0


def test_extraction_modes():
    text = "try this:\n```\nprint(1)\n```\nbetter:\n```python\nprint(2)\n```\n```text\nnot code\n```\n"
    assert extract(text, "block") == "print(2)\n"
    assert extract("no block", "block") is None and extract("no block", "block_or_whole") == "no block"
    assert extract(text, "whole") == text
    svc = CodeService(CodeRewardConfig(extract="block"))
    try:
        out = svc.score(["print(3)"], [{"label": ADD_TESTS, "task": "code"}])
    finally:
        svc.close()
    assert out.scores == [(0.0, "")] and out.counts[NO_PROGRAM] == 1.0


# --- hostile programs ----------------------------------------------------------------------------------------------

def test_a_program_that_loops_forever_keeps_every_deadline():
    loop = "while True:\n    pass\n"
    value, _, _, seconds = score(loop, ADD_TESTS, test_timeout_s=0.4, sample_timeout_s=6.0)
    assert value == 0.0 and seconds < 3 * 0.4 + MARGIN
    cfg = CodeRewardConfig(test_timeout_s=0.6, sample_timeout_s=1.5)
    tests = json.dumps({"inputs": ["1 2\n"] * 5, "outputs": ["3\n"] * 5})
    start = time.monotonic()  # five cases of 0.6 s under a 1.5 s sample deadline: the ones not run by then fail
    res = run_sample(loop, parse_tests(tests), cfg)
    seconds = time.monotonic() - start
    assert res.score == 0.0 and seconds < 1.5 + MARGIN, seconds
    ran = [r for r in res.results if r is not None]
    assert 2 <= len(ran) <= 3 and all(r["status"] == "timeout" and r["seconds"] < 0.6 + MARGIN for r in ran)
    assert res.results[-1] is None
    assert sandbox_processes() == []


def test_a_program_that_reads_a_hidden_file_fails():
    # outside /tmp (the sandbox has its own): readable unless hidden, so the control below always runs
    run_dir = Path(tempfile.mkdtemp(dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else Path(__file__).parent))
    try:
        os.chmod(run_dir, 0o755)
        secret = run_dir / "secret.txt"
        secret.write_text("hunter2\n")
        os.chmod(secret, 0o644)
        tests = json.dumps({"inputs": [""], "outputs": ["hunter2\n"]})
        reader = f"print(open({str(secret)!r}).read(), end='')\n"
        assert score(reader, tests)[0] == 1.0
        value, _, _, seconds = score(reader, tests, hide=(str(run_dir),))
        assert value == 0.0 and seconds < 2.0 + MARGIN
        assert sandbox_processes() == []
        home = os.path.expanduser("~")  # the trainer's home is hidden always: it looks empty
        assert not os.listdir(home) or score(f"import os\nprint(len(os.listdir({home!r})))\n", json.dumps(
            {"inputs": [""], "outputs": [str(len(os.listdir(home)))]}))[0] == 0.0
    finally:
        for p in run_dir.iterdir():
            p.unlink()
        run_dir.rmdir()


def test_a_fork_bomb_fails_and_leaves_nothing_running():
    bomb = ("import os, time\nn = int(input())\nkids = 0\nfor _ in range(n):\n    if os.fork() == 0:\n"
            "        time.sleep(60)\n        os._exit(0)\n    kids += 1\nprint(kids)\n")
    tests = json.dumps({"inputs": ["1000\n", "3\n"], "outputs": ["1000\n", "3\n"]})  # the second needs the first's gone
    value, _, _, seconds = score(bomb, tests, processes=32)
    assert value == 0.5 and seconds < 6.0 + STARTUP_S
    assert sandbox_processes() == []


def test_a_program_that_floods_its_output_is_cut_off():
    cases = parse_tests(ADD_TESTS)
    start = time.monotonic()
    res = run_sample("while True:\n    print('3' * 4096)\n", cases, CodeRewardConfig(test_timeout_s=2.0))
    assert res.score == 0.0 and [r["status"] for r in res.results] == ["too_long"] * 3
    assert all(r["seconds"] < 1.0 and len(r["out"]) <= MIN_SAMPLE_CAP for r in res.results)
    assert time.monotonic() - start < 3 * 1.0 + MARGIN and sandbox_processes() == []


def test_a_program_that_allocates_8_gb_fails_quickly():
    cfg = CodeRewardConfig(test_timeout_s=2.0, sample_timeout_s=6.0, memory_mb=1024)
    start = time.monotonic()
    res = run_sample("x = bytearray(8 << 30)\nprint(len(x))\n", parse_tests(
        json.dumps({"inputs": [""], "outputs": [str(8 << 30)]})), cfg)
    assert res.score == 0.0 and res.results[0]["status"] == "exit 1"  # a MemoryError, not a timeout
    assert time.monotonic() - start < 5.0 and sandbox_processes() == []
    small = run_sample("x = bytearray(64 << 20)\nprint(len(x))\n", parse_tests(
        json.dumps({"inputs": [""], "outputs": [str(64 << 20)]})), cfg)
    assert small.score == 1.0, small.results  # under the same limit, 64 MB is allocated


def test_a_program_with_a_few_children_keeps_its_processes_budget():
    kids = ("import os, time\nn = int(input())\npids = []\nfor _ in range(n):\n    pid = os.fork()\n"
            "    if pid == 0:\n        time.sleep(0.3)\n        os._exit(0)\n    pids.append(pid)\n"
            "for p in pids:\n    os.waitpid(p, 0)\nprint(len(pids))\n")
    tests = json.dumps({"inputs": ["3\n"], "outputs": ["3\n"]})  # 4 processes at once, itself included
    assert score(kids, tests, processes=4)[0] == 1.0
    assert score(kids, tests, processes=3)[0] == 0.0  # one past the budget: the fork fails
    assert score(ADD, ADD_TESTS, processes=1)[0] == 1.0  # the harness is not counted in the program's budget


def test_a_harness_that_cannot_run_scores_none_with_the_reason():
    value, why, _, _ = score(ADD, ADD_TESTS, memory_mb=4)  # too little for the interpreter to start
    assert value is None and "the harness ended after 0 of 3 case(s) without its last line" in why, why
    assert "memory_mb" in why


def test_a_program_cannot_reach_a_server_on_the_loopback():
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    port, accepted, stop = server.getsockname()[1], [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except socket.timeout:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                  f"s.sendall(b'hi')\nprint('connected')\n")
        value, _, _, seconds = score(client, json.dumps({"inputs": [""], "outputs": ["connected\n"]}))
        if probe()["network namespace"] == "on":
            assert value == 0.0 and accepted == []
        assert seconds < 2.0 + MARGIN and sandbox_processes() == []
    finally:
        stop.set()
        thread.join()
        server.close()


# --- the service: concurrency, what runs now, the scorer -------------------------------------------------------

def score_watched(svc: CodeService, n: int) -> tuple[ServiceScores, float, list[list[str]]]:
    """``n`` sleeping programs scored by ``svc`` (closed after), the seconds it took, and what
    ``outstanding()`` said every 50 ms meanwhile."""
    sleeper = "import time\ntime.sleep(30)\n"
    seen: list[list[str]] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.append(svc.outstanding())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        start = time.monotonic()
        out = svc.score([sleeper] * n, [{"label": ADD_TESTS, "task": "code"}] * n)
        seconds = time.monotonic() - start
    finally:
        done.set()
        watcher.join()
        svc.close()
    return out, seconds, seen


def test_samples_run_at_once_and_outstanding_lists_them():
    svc = CodeService(CodeRewardConfig(test_timeout_s=0.6, sample_timeout_s=1.2, concurrency=4))
    out, seconds, seen = score_watched(svc, 4)
    svc.close()  # twice is safe
    assert [s for s, _ in out.scores] == [0.0] * 4
    assert seconds < 1.2 + MARGIN  # one sample's deadline, not four
    assert max(len(lines) for lines in seen) == 4
    line = next(lines for lines in seen if lines)[0]
    assert line.startswith("rule 'code': a sandbox running") and "3 test(s)" in line and "time.sleep" in line
    assert svc.outstanding() == []
    assert svc.score([ADD], [{"label": ADD_TESTS}]).scores == [(None, "code: the service is closed")]


def test_a_batch_larger_than_concurrency_keeps_one_deadline():
    timeout = 1.0
    svc = CodeService(CodeRewardConfig(test_timeout_s=timeout, sample_timeout_s=timeout, concurrency=2))
    out, seconds, seen = score_watched(svc, 8)
    scores = [s for s, _ in out.scores]
    assert scores[:2] == [0.0, 0.0] and all(s is None for s in scores[4:]), out.scores  # 4 rounds of 1 s otherwise
    assert "not started by the batch deadline" in out.scores[-1][1] and "reward.code.concurrency" in out.scores[-1][1]
    assert seconds < (BATCH_START_FACTOR + 1) * timeout + MARGIN, seconds
    queued = [line for lines in seen for line in lines if "queued" in line]
    assert queued and queued[0].startswith("rule 'code': 6 sample(s) queued behind 2 running"), queued[:1]
    assert svc.outstanding() == [] and sandbox_processes() == []


def test_close_stops_the_running_sandboxes():
    svc = CodeService(CodeRewardConfig(test_timeout_s=20.0, sample_timeout_s=20.0, concurrency=2))
    got: list = []
    thread = threading.Thread(target=lambda: got.append(svc.score(["import time\ntime.sleep(60)\n"] * 3,
                                                                  [{"label": ADD_TESTS, "task": "code"}] * 3)))
    thread.start()
    try:
        for _ in range(200):  # until both sandboxes run
            if sum("a sandbox running" in line for line in svc.outstanding()) == 2:
                break
            time.sleep(0.02)
        time.sleep(0.3)
        start = time.monotonic()
        svc.close()
        thread.join(timeout=5.0)
        assert not thread.is_alive() and time.monotonic() - start < 2.0
    finally:
        svc.close()
        thread.join()
    assert [s for s, _ in got[0].scores] == [None] * 3
    assert all("closed" in why for _, why in got[0].scores), got[0].scores
    assert sandbox_processes() == [] and svc.outstanding() == []


def test_the_scorer_runs_the_rule_from_the_config():
    from verirl.config import load_config
    from verirl.train.build import build_scorer

    reward = load_config("tiny", ["reward.verifiers=[code]", "reward.weights=[2.0]", "reward.tasks={}",
                                  "reward.code.test_timeout_s=2", "reward.code.sample_timeout_s=5"]).reward
    scorer = build_scorer(reward, 0, say=False)
    try:
        samples = [{"label": ADD_TESTS, "task": "code", "prompt": "add"}] * 3
        result = scorer([f"```python\n{ADD}```", "```python\nprint(0)\n```", "```python\nprint(\n```"], samples)
    finally:
        scorer.close()
    assert result.per_rule["code"] == [1.0, pytest.approx(1 / 3), 0.0]
    assert result.totals == [2.0, pytest.approx(2 / 3), 0.0] and result.errors == 0
    metrics = result.metrics(["code"] * 3)
    assert metrics[COMPILE_ERRORS] == 1.0 and metrics["reward/code/mean"] == pytest.approx(4 / 9)


def test_limits_follow_the_config():
    cfg = CodeRewardConfig(sample_timeout_s=7.5, memory_mb=512, processes=8)
    lim = limits_for(cfg, [Case("", "x" * 100)])
    assert (lim.seconds, lim.cpu_s, lim.memory_mb, lim.processes) == (7.5 + STARTUP_S, 9, 512, 8 + 1)
    assert dataclasses.asdict(lim)["output_bytes"] > 6 * 200
