"""The rule ``code``: a response's program run against the sample's test cases in `verirl.sandbox`.

Test formats read (the sample's column ``reward.code.tests``, a JSON string or the parsed value):

- APPS / TACO ``input_output``: ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``, or a row holding
  it under ``input_output``. Without ``fn_name`` each input is a program's stdin and each output its
  expected stdout (a list of lines is joined by newlines); with it each input is the list of the
  function's arguments and each output its return value (a one-item list also matches its item).
- veRL's prime code format: the same keys; a function case whose input is a string holds its arguments
  as newline-separated JSON and its output as JSON text (LiveCodeBench's form).
- CodeContests: ``{"public_tests": {"input": [...], "output": [...]}, "private_tests": ..., "generated_tests": ...}``,
  all stdin cases, in that order, or one of those columns alone (``{"input": [...], "output": [...]}``).
- LiveCodeBench: a list of ``{"input": str, "output": str, "testtype": "stdin" | "functional"}``, or a row
  ``{"public_test_cases": ..., "private_test_cases": ..., "metadata": {"func_name": ...}}``; functional
  inputs are newline-separated JSON arguments, outputs JSON text; the function's name comes from
  ``metadata.func_name`` (in the value or the sample's ``metadata`` column). Compressed private cases
  (zlib and pickle) are refused: decode them offline to a JSON list; nothing here unpickles.

A value in none of these forms scores None with the reason. One sandbox runs all of a sample's tests:
the program `HARNESS` (standard library only) reads the solution and the cases' inputs as JSON on its
stdin, compiles the solution (a SyntaxError scores 0 and is counted in ``reward/code/compile_errors``),
runs each case in a forked child of its own (stdin from a file, stdout into a pipe; a function case
calls the function and sends its return value as JSON) under the per-test deadline, kills whatever the
child left after each case, prints one JSON line per case and a last line ``{"done": n}``. Whatever the
harness holds can be read by the program (it runs in the harness's forked child), so nothing derived
from an expected output enters the sandbox: not the outputs, not their lengths (the harness keeps one
output cap for all of a sample's cases, `sample_cap`); each case's output is compared, and its length
checked against that case's own cap (`_cap`), here after the run (`passed`).

A harness that ends without its last line, before the sandbox's deadline, scores None with the reason
(it could not start, fork or read its job). A call (`CodeService.score`) keeps one deadline: a sample not
started ``BATCH_START_FACTOR * sample_timeout_s`` after the call's start scores None, so a call ends by
about ``(BATCH_START_FACTOR + 1) * sample_timeout_s + STARTUP_S`` however many samples wait.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from verirl.config.schema import CodeRewardConfig
from verirl.rewards.service import ServiceScores
from verirl.sandbox import Limits, run_program

STARTUP_S = 3.0  # the sandbox's deadline past sample_timeout_s: its start and the harness's
FLOAT_TOL = 1e-6  # two non-integer numbers match when |got - want| <= FLOAT_TOL * max(1, |want|)
BATCH_START_FACTOR = 2.0  # a sample not started this many sample_timeout_s after its call's start scores None
HARNESS_PROCESSES = 1  # the harness's own process, added to reward.code.processes
MIN_SAMPLE_CAP = 1 << 14  # the least output the harness keeps of one case, bytes
COMPILE_ERRORS = "reward/code/compile_errors"
NO_PROGRAM = "reward/code/no_program"
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")


@dataclass(frozen=True)
class Case:
    """One test: ``fn`` None: ``input`` is stdin (str), ``expected`` the stdout; else ``input`` is the
    list of arguments of the function ``fn`` and ``expected`` its return value."""
    input: object
    expected: object
    fn: Optional[str] = None


class CasesFormatError(ValueError):
    """A sample's tests in no format the rule reads."""


def extract(response: str, how: str) -> Optional[str]:
    """The program in ``response``: ``block`` the last fenced block tagged python (or untagged),
    ``block_or_whole`` that or else the whole response, ``whole`` the response. None: no program."""
    if how == "whole":
        return response
    blocks = [body for tag, body in _FENCE.findall(response) if tag.lower() in _PYTHON_TAGS]
    if blocks:
        return blocks[-1]
    return response if how == "block_or_whole" and response.strip() else None


def _json(value, what: str):
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise CasesFormatError(f"{what} is not JSON (it starts {value[:60]!r})") from None


def _text(value) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _json_args(text: str) -> list:
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def _io(value: dict, fn: Optional[str]) -> list[Case]:
    """APPS / TACO input_output and veRL's prime format."""
    inputs, outputs, fn = value["inputs"], value["outputs"], value.get("fn_name") or fn
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise CasesFormatError("'inputs' and 'outputs' must be lists")
    if len(inputs) != len(outputs):
        raise CasesFormatError(f"'inputs' and 'outputs' must be lists of one length (got {len(inputs)} inputs, "
                               f"{len(outputs)} outputs)")
    if not fn:
        return [Case(_text(i), _text(o)) for i, o in zip(inputs, outputs)]
    cases = []
    for i, o in zip(inputs, outputs):
        if isinstance(i, str):  # prime / LiveCodeBench: newline-separated JSON arguments, JSON output
            i, o = _json_args(i), _json(o, "a function case's output")
        cases.append(Case(list(i) if isinstance(i, (list, tuple)) else [i], o, fn))
    return cases


def _contests(value: dict) -> list[Case]:
    """CodeContests: public, private, then generated tests."""
    cases = []
    for part in ("public_tests", "private_tests", "generated_tests"):
        tests = value.get(part) or {}
        ins, outs = tests.get("input") or [], tests.get("output") or []
        if len(ins) != len(outs):
            raise CasesFormatError(f"{part} has {len(ins)} inputs and {len(outs)} outputs")
        cases += [Case(_text(i), _text(o)) for i, o in zip(ins, outs)]
    return cases


def _livecodebench(tests: list, fn: Optional[str]) -> list[Case]:
    cases = []
    for t in tests:
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise CasesFormatError(f"a LiveCodeBench test case must be {{input, output, testtype}}, got "
                                   f"{str(t)[:80]}")
        if t.get("testtype", "stdin") == "functional":
            if not fn:
                raise CasesFormatError("a functional LiveCodeBench case needs metadata.func_name (in the tests' "
                                       "value or the sample's 'metadata' column)")
            cases.append(Case(_json_args(t["input"]), _json(t["output"], "a functional case's output"), fn))
        else:
            cases.append(Case(_text(t["input"]), _text(t["output"])))
    return cases


def _func_name(meta) -> Optional[str]:
    try:
        meta = _json(meta, "metadata") if meta else {}
    except CasesFormatError:
        return None
    return meta.get("func_name") if isinstance(meta, dict) else None


def parse_tests(value, fn: Optional[str] = None) -> list[Case]:
    """The cases of ``value`` (a JSON string or its value) in the formats of the module docstring;
    ``fn``: a function name from elsewhere (the sample's metadata). Raises CasesFormatError."""
    value = _json(value, "the tests")
    if isinstance(value, dict) and "input_output" in value:  # a whole APPS / TACO row
        inner = _json(value["input_output"], "input_output")
        if not isinstance(inner, dict):
            raise CasesFormatError("input_output must be {inputs, outputs, fn_name?}")
        return _io(inner, fn or value.get("fn_name"))
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:
        return _io(value, fn)
    if isinstance(value, dict) and any(k in value for k in ("public_tests", "private_tests", "generated_tests")):
        return _contests(value)
    if isinstance(value, dict) and isinstance(value.get("input"), list) and "output" in value:
        return _contests({"public_tests": value})  # one CodeContests column alone
    if isinstance(value, dict) and any(k in value for k in ("public_test_cases", "private_test_cases")):
        fn = _func_name(value.get("metadata")) or fn
        cases = []
        for part in ("public_test_cases", "private_test_cases"):
            raw = value.get(part) or []
            if isinstance(raw, str) and not raw.lstrip().startswith("["):
                raise CasesFormatError(f"{part} is not a JSON list (LiveCodeBench compresses its private cases with "
                                       f"zlib and pickle: decode them offline to a JSON list; verirl never unpickles)")
            cases += _livecodebench(_json(raw, part), fn)
        return cases
    if isinstance(value, list) and value and all(isinstance(t, dict) and "input" in t for t in value):
        return _livecodebench(value, fn)
    raise CasesFormatError(f"{type(value).__name__} {str(value)[:80]!r} is none of APPS/TACO input_output, "
                           f"CodeContests public/private/generated_tests, LiveCodeBench test cases, veRL's prime "
                           f"{{inputs, outputs, fn_name}} (docs/rewards.md)")


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


_INT = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _number(token: str) -> Optional[float]:
    """A decimal literal's value (no ``_``, ``inf`` or ``nan``); None for anything else."""
    if not _DECIMAL.fullmatch(token):
        return None
    x = float(token)
    return x if math.isfinite(x) else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= FLOAT_TOL * max(1.0, abs(b))


def same_output(got: str, want: str) -> bool:
    """Stdout equal to the expected one: the same lines once each line's trailing whitespace and the
    trailing blank lines are dropped; else the same whitespace-separated tokens, two decimal numbers of
    which one at least has a ``.`` or an exponent within FLOAT_TOL (two integers only when equal)."""
    if _lines(got) == _lines(want):
        return True
    a, b = got.split(), want.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x != y:
            if _INT.fullmatch(x) and _INT.fullmatch(y):
                return False
            fx, fy = _number(x), _number(y)
            if fx is None or fy is None or not _close(fx, fy):
                return False
    return True


def same_value(got, want) -> bool:
    """A return value (after a JSON round trip: tuples are lists, dict keys strings) equal to the
    expected one; numbers within FLOAT_TOL when either is a float; bool is not a number here."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return got == want if isinstance(got, int) and isinstance(want, int) else _close(float(got), float(want))
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in got)
    return got == want


def passed(case: Case, result: Optional[dict]) -> bool:
    """Whether the harness's line ``result`` for ``case`` is a pass: status ok, at most ``_cap(case)``
    bytes of output, and that output equal to the expected one. Never raises for what the program wrote."""
    if not isinstance(result, dict) or result.get("status") != "ok" or not isinstance(result.get("out"), str):
        return False
    size = result.get("bytes")
    if not isinstance(size, int) or size > _cap(case):
        return False
    try:
        if case.fn is None:
            return same_output(result["out"], str(case.expected))
        got, want = json.loads(result["out"]), case.expected
        return same_value(got, want) or (isinstance(want, list) and len(want) == 1 and same_value(got, want[0]))
    except (ValueError, RecursionError):  # not JSON, nested past the recursion limit, a too long integer
        return False


def _cap(case: Case) -> int:
    """Bytes of output a case may write: twice the expected, and 4 KiB; past it the case fails."""
    want = case.expected if case.fn is None else json.dumps(case.expected)
    return 2 * len(str(want).encode()) + 4096


def sample_cap(cases: Sequence[Case]) -> int:
    """Bytes of each case's output the harness keeps (past it the case stops, too long): the power of two
    at or above every case's `_cap`, at least MIN_SAMPLE_CAP. One value for the whole sample, so a program
    reading it learns at most the longest expected output's size rounded up to a power of two."""
    need = max(map(_cap, cases), default=0)
    return max(MIN_SAMPLE_CAP, 1 << max(need - 1, 0).bit_length())


# The program that runs in the sandbox. Its stdin: {"solution", "cases": [{"input" | "args", "fn"}], "cap",
# "test_timeout", "sample_timeout"}. Its stdout: {"compile_error": str}, or {"error": str} (it could not
# start the first case), or one line per case run, {"i", "status": ok | exit N | signal N | timeout |
# too_long | no_function | not_json | no_fork, "out" (at most cap bytes), "bytes" (written, up to cap and a
# read more), "seconds"}, then {"done": cases run}.
HARNESS = r'''
import json, os, select, signal, sys, time

def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

def child(code, case, w):
    null = os.open(os.devnull, os.O_RDWR)
    if case["fn"] is None:
        os.dup2(os.open("input.txt", os.O_RDONLY), 0)
        os.dup2(w, 1)
    else:
        os.dup2(null, 0)
        os.dup2(null, 1)
    os.dup2(null, 2)
    sys.stdin, sys.stdout, sys.stderr = (open(0, "r", closefd=False), open(1, "w", closefd=False),
                                         open(2, "w", closefd=False))
    rc = 0
    scope = {"__name__": "__main__" if case["fn"] is None else "solution", "__builtins__": __builtins__}
    try:
        exec(code, scope)
        if case["fn"] is not None:
            fn = case["fn"]
            holder = scope.get("Solution")
            target = getattr(holder(), fn) if isinstance(holder, type) and hasattr(holder, fn) else scope.get(fn)
            if not callable(target):
                rc = 3
            else:
                value = target(*case["args"])
                try:
                    data = json.dumps(value).encode()
                except (TypeError, ValueError):
                    rc = 4
                else:
                    while data:
                        data = data[os.write(w, data):]
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if case["fn"] is not None:
            rc = rc or 5
    except BaseException:
        rc = 1
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os._exit(rc & 255)

def clean(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    own_proc = os.getpid() == 1 and os.readlink("/proc/self") == "1"
    for _ in range(200):
        if own_proc:  # this sandbox's /proc: every other process is what a case left
            for p in os.listdir("/proc"):
                if p.isdigit() and p != "1":
                    try:
                        os.kill(int(p), signal.SIGKILL)
                    except OSError:
                        pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        if not own_proc:
            return
        time.sleep(0.002)

def run(code, case, cap, seconds):
    if case["fn"] is None:
        with open("input.txt", "w") as f:
            f.write(case["input"])
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.close(r)
            child(code, case, w)
        finally:
            os._exit(1)
    os.close(w)
    try:
        waiter = os.pidfd_open(pid)
    except (AttributeError, OSError):
        waiter = None
    os.set_blocking(r, False)
    deadline = time.monotonic() + seconds
    out, status, reaped = bytearray(), "timeout", False

    def drain():
        nonlocal r, out
        while r >= 0 and len(out) <= cap:
            try:
                chunk = os.read(r, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                os.close(r)
                r = -1
            out += chunk

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        fds = ([r] if r >= 0 else []) + ([waiter] if waiter is not None else [])
        wait = left if waiter is not None else min(left, 0.005)
        if fds:
            select.select(fds, [], [], wait)
        else:
            time.sleep(wait)
        drain()
        if len(out) > cap:
            status = "too_long"
            break
        got, st = os.waitpid(pid, os.WNOHANG)
        if got:
            reaped = True
            drain()
            if len(out) > cap:
                status = "too_long"
            elif os.WIFEXITED(st):
                status = {0: "ok", 3: "no_function", 4: "not_json"}.get(os.WEXITSTATUS(st),
                                                                        "exit %d" % os.WEXITSTATUS(st))
            else:
                status = "signal %d" % os.WTERMSIG(st)
            break
    if not reaped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
    for fd in (r, waiter):
        if fd is not None and fd >= 0:
            os.close(fd)
    clean(pid)
    return status, out[:cap].decode("utf-8", "replace"), len(out)

def main():
    job = json.loads(sys.stdin.read())
    end = time.monotonic() + job["sample_timeout"]
    try:
        code = compile(job["solution"], "<solution>", "exec")
    except BaseException as e:
        emit({"compile_error": "%s: %s" % (type(e).__name__, e)})
        return
    del job["solution"]
    ran = 0
    for i, case in enumerate(job["cases"]):
        start = time.monotonic()
        left = end - start
        if left <= 0:
            break
        try:
            status, out, size = run(code, case, job["cap"], min(job["test_timeout"], left))
        except OSError as e:  # a pipe or a fork refused: before the first case it is the harness's failure
            if i == 0:
                emit({"error": "the harness could not start a case: %s: %s" % (type(e).__name__, e)})
                return
            status, out, size = "no_fork", "", 0
        emit({"i": i, "status": status, "out": out, "bytes": size, "seconds": round(time.monotonic() - start, 4)})
        ran += 1
    emit({"done": ran})

main()
'''


def limits_for(cfg: CodeRewardConfig, cases: Sequence[Case]) -> Limits:
    """The sandbox of one sample: its deadline (sample_timeout_s and the start-up margin), address space,
    processes (the program's ``processes``, itself included, and the harness's), CPU seconds (per process:
    the per-test deadline stops a case first) and the output its result lines may need (JSON escapes a
    byte into at most 6)."""
    return Limits(seconds=cfg.sample_timeout_s + STARTUP_S, cpu_s=math.ceil(cfg.sample_timeout_s) + 1,
                  memory_mb=cfg.memory_mb, processes=cfg.processes + HARNESS_PROCESSES,
                  output_bytes=len(cases) * (6 * sample_cap(cases) + 256) + (1 << 16))


def job_for(program: str, cases: Sequence[Case], cfg: CodeRewardConfig) -> dict:
    """What the harness reads on its stdin: the solution, the cases' inputs, one output cap, the deadlines;
    nothing else of the expected outputs."""
    return {"solution": program, "test_timeout": cfg.test_timeout_s, "sample_timeout": cfg.sample_timeout_s,
            "cap": sample_cap(cases),
            "cases": [{"fn": c.fn, **({"input": c.input} if c.fn is None else {"args": c.input})} for c in cases]}


@dataclass
class SampleResult:
    score: Optional[float]  # None: the sample could not be scored (why)
    why: str = ""
    compile_error: bool = False
    no_program: bool = False
    results: Optional[list] = None  # the harness's line for each case (None: not run by the deadline)


def run_sample(program: str, cases: Sequence[Case], cfg: CodeRewardConfig, hide: tuple[str, ...] = (),
               on_start: Optional[Callable[[subprocess.Popen], None]] = None) -> SampleResult:
    """Run ``program`` against ``cases`` in one sandbox and score it (``cfg.mode``); None with the reason
    when the sandbox or the harness failed on its own (no last line, and not stopped at the deadline).
    ``on_start``: see `verirl.sandbox.run_program`."""
    res = run_program(HARNESS, json.dumps(job_for(program, cases, cfg)), limits_for(cfg, cases), hide=hide,
                      on_start=on_start)
    lines: dict[int, dict] = {}
    done = False
    for line in res.stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if "compile_error" in obj:
            return SampleResult(0.0, compile_error=True, results=[])
        if "error" in obj:
            return SampleResult(None, f"code: {str(obj['error'])[:200]} (reward.code.processes, memory_mb)")
        if isinstance(obj.get("i"), int):
            lines.setdefault(obj["i"], obj)
        done = done or "done" in obj
    last = (res.stderr.strip().splitlines() or ["nothing on stderr"])[-1][:200]
    if not lines and not res.setup:
        return SampleResult(None, f"code: the sandbox did not start ({last})")
    if not done and not res.timed_out and not res.truncated:
        return SampleResult(None, f"code: the harness ended after {len(lines)} of {len(cases)} case(s) without its "
                                  f"last line, exit status {res.returncode} ({last}); raise reward.code.memory_mb "
                                  f"if it ran out of memory")
    results = [lines.get(i) for i in range(len(cases))]
    ok = sum(passed(c, r) for c, r in zip(cases, results))
    score = ok / len(cases) if cfg.mode == "fraction" else float(ok == len(cases))
    return SampleResult(score, results=results)


class CodeService:
    """The rule ``code`` (`verirl.rewards.service.Service`): each sample's program in its own sandbox,
    ``cfg.concurrency`` samples at once (0: one per core) in threads of this process. One call keeps one
    deadline: a sample still queued ``BATCH_START_FACTOR * sample_timeout_s`` after the call's start scores
    None ("not started by the batch deadline"), and the ones running then keep their own deadline
    (``sample_timeout_s + STARTUP_S``), so ``score`` returns by about ``(BATCH_START_FACTOR + 1) *
    sample_timeout_s + STARTUP_S`` after its start. ``close()`` stops the sandboxes running."""
    name = "code"

    def __init__(self, cfg: CodeRewardConfig, hide: Sequence[str] = ()):
        self.cfg, self.hide = cfg, tuple(hide)
        self.concurrency = cfg.concurrency or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="verirl-code")
        self._running: dict[int, tuple[float, str]] = {}
        self._procs: dict[int, subprocess.Popen] = {}
        self._queued: dict[int, int] = {}  # call -> its samples not started yet
        self._lock = threading.Lock()
        self._ids = iter(range(1 << 62))
        self._closed = False

    def _started(self, key: int, proc: subprocess.Popen) -> None:
        with self._lock:
            self._procs[key] = proc
            closed = self._closed
        if closed:
            proc.terminate()

    def _one(self, response: str, sample: dict, call: int, start_by: float) -> SampleResult:
        with self._lock:
            self._queued[call] -= 1
        if time.monotonic() > start_by:
            return SampleResult(None, f"code: not started by the batch deadline ({BATCH_START_FACTOR:g} x "
                                      f"reward.code.sample_timeout_s={self.cfg.sample_timeout_s:g} after the call's "
                                      f"start, {self.concurrency} sample(s) at once): raise reward.code.concurrency "
                                      f"or lower sample_timeout_s")
        cfg = self.cfg
        if cfg.tests not in sample:
            return SampleResult(None, f"code: reward.code.tests={cfg.tests!r}: the sample has no such column (it has "
                                      f"{', '.join(sorted(map(str, sample)))}): name the one holding the test cases")
        try:
            fn = _func_name(sample.get("metadata")) or sample.get("fn_name")
            cases = parse_tests(sample.get(cfg.tests), fn)
        except (CasesFormatError, ValueError, TypeError, AttributeError, KeyError) as e:
            return SampleResult(None, f"code: reward.code.tests: the sample's column {cfg.tests!r}: {e}")
        if cfg.max_tests:
            cases = cases[:cfg.max_tests]
        if not cases:
            return SampleResult(None, f"code: the sample's column {cfg.tests!r} holds no test cases")
        program = extract(response, cfg.extract)
        if program is None:
            return SampleResult(0.0, no_program=True)
        key = next(self._ids)
        with self._lock:
            if self._closed:
                return SampleResult(None, "code: the service is closed")
            self._running[key] = (time.monotonic(), f"{len(cases)} test(s), task {sample.get('task')!r}, "
                                                    f"program {program[:80]!r}")
        try:
            res = run_sample(program, cases, cfg, self.hide, on_start=lambda proc: self._started(key, proc))
        except Exception as e:  # noqa: BLE001  (a failure of this side, not of the program: say it, score None)
            res = SampleResult(None, f"code: {type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._running.pop(key, None)
                self._procs.pop(key, None)
                closed = self._closed
        return SampleResult(None, "code: stopped: the service was closed") if closed else res

    def score(self, responses: Sequence[str], samples: Sequence[dict]) -> ServiceScores:
        call, pairs = next(self._ids), list(zip(responses, samples))
        start_by = time.monotonic() + BATCH_START_FACTOR * self.cfg.sample_timeout_s
        with self._lock:
            self._queued[call] = len(pairs)
        futures: list[Optional[Future]] = []
        try:
            for r, s in pairs:
                try:
                    futures.append(self._pool.submit(self._one, r, s, call, start_by))
                except RuntimeError:  # closed
                    futures.append(None)
                    with self._lock:
                        self._queued[call] -= 1
            done = []
            for f in futures:
                try:
                    done.append(f.result() if f is not None else SampleResult(None, "code: the service is closed"))
                except Exception as e:  # noqa: BLE001  (cancelled by close, or a bug: the sample scores None)
                    done.append(SampleResult(None, "code: the service is closed" if f.cancelled()
                                             else f"code: {type(e).__name__}: {e}"))
        finally:
            with self._lock:
                self._queued.pop(call, None)
        return ServiceScores([(d.score, d.why) for d in done],
                             {COMPILE_ERRORS: float(sum(d.compile_error for d in done)),
                              NO_PROGRAM: float(sum(d.no_program for d in done))})

    def outstanding(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            lines = [f"rule 'code': a sandbox running {now - t:.1f}s: {what}" for t, what in self._running.values()]
            queued = sum(self._queued.values())
        if queued:
            lines.append(f"rule 'code': {queued} sample(s) queued behind {len(lines)} running ({self.concurrency} at "
                         f"once); one not started {BATCH_START_FACTOR * self.cfg.sample_timeout_s:g}s after its "
                         f"call's start scores None")
        return lines

    def close(self) -> None:
        """Cancel the queued samples and stop the running sandboxes (their samples score None); safe twice."""
        with self._lock:
            self._closed = True
            procs = list(self._procs.values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            try:
                proc.terminate()
            except OSError:
                pass
