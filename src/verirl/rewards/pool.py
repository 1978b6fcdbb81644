"""Rule scoring in worker processes, each call under its own deadline.

verirl's own small pool. Not `multiprocessing.Pool`: it cannot stop one task, so a stuck call
meant terminating every worker. Not ``pebble`` either: it can cancel one task, but parent death,
a memory cap and captured output would still be ours to write, on top of a new dependency.

- Workers are spawned processes, one duplex pipe each; with a `SandboxSpec`, each is started by
  `verirl.sandbox`'s launcher instead and runs `sandboxed_worker` inside its namespaces. A worker
  replies in JSON (never a pickle: what a rule's process sends is data), and the trainer takes a
  reply only in the shape its call asked for (`_checked`). A worker runs one call at a time and
  reports when it starts it; the call's deadline is ``timeout`` seconds from that report, so
  time spent queued behind other calls does not count.
- A manager thread, one per pool and alive as long as the pool, hands queued calls to idle
  workers, and kills a worker whose call is past its deadline, starting a new one at once while
  the other calls go on. The late call scores None ("timed out after ..."); it is not run
  again.
- Once a call of a rule times out, that rule's calls from the same batch that have not started
  are not run (None, "not run: ..."): a rule that hangs on every sample costs about one timeout
  per batch, not one per wave of calls. Calls already running keep their own deadlines, and
  other rules are not affected. A rule that is only slow on some responses loses nothing to
  this unless its other calls were still queued when the slow one ran out of time.
- A worker that dies (a crash, the kernel's out-of-memory killer) is reported and replaced.
  Workers that keep dying before they are ready (an environment problem, not a rule's) make
  `RewardPool.collect` raise rather than score every batch 0.
- Workers die with their parent: on Linux by the parent-death signal (``PR_SET_PDEATHSIG``,
  sent when the manager thread that spawned them ends, which at the latest is when the process
  does), and on every OS by a watchdog thread that ends the worker when its pipe from the
  parent reaches end-of-file.
- ``max_memory_mb`` (Linux): an ``RLIMIT_AS`` cap on each worker's address space (virtual
  memory, which counts more than resident memory), set once the worker's imports are done. A
  rule that allocates past it gets MemoryError and scores None ("out of memory ...").
- A rule's processes end with its call: after each call the worker (a child subreaper on Linux, so
  that orphaned grandchildren become its own) kills and reaps every process left below it, and a
  worker killed at its deadline or at `close` has its descendants killed first. Linux only; a
  process that a rule starts after the trainer is killed with ``kill -9`` mid-call may survive it.
- A worker's stdout and stderr (file descriptors 1 and 2, so C extensions' output too) go to a
  pipe the manager drains, keeping the last `TAIL_BYTES`; a failed call's reason ends with the
  last `TAIL_LINES` lines it printed, each cut to `LINE_CHARS` characters. Nothing a rule
  prints reaches the trainer's output.
"""
from __future__ import annotations

import collections
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Optional, Sequence

from verirl.rewards.custom import DEFAULT_MAX_ABS_SCORE, Rule, call_rule, check_score

Scores = list[tuple[Optional[float], str]]

TAIL_BYTES = 16 * 1024  # of a call's output kept for the warning
MAX_REPLY = 4 * 2**20  # bytes of one reply a worker may send (more: it is replaced)
MAX_MESSAGES = 8  # read from one worker per pass of the manager
PIPE_WAIT = 5.0  # seconds one read or write on a worker's pipe may block (`_bound_waits`)
WHY_CHARS = 2000  # of one failure's reason from a worker
TAIL_LINES = 5
LINE_CHARS = 200
START_TIMEOUT = 120.0  # seconds a new worker may take to import verirl and report ready
START_GRACE = 10.0  # seconds a ready worker may take to report that it started a call it was sent
MAX_START_FAILURES = 3  # workers in a row that die before they are ready: then queued calls fail


# ----------------------------------------------------------------------------- worker side


def _die_with_parent(parent_pid: int, alive: Connection, pdeathsig: bool) -> None:
    if pdeathsig and sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # no prctl: the watchdog below still ends this worker
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    _exit_when_closed(alive, lambda: _kill_tree(os.getpid(), reap=False))


def _exit_when_closed(alive: Connection, before_exit) -> None:
    """A thread that ends this worker (after ``before_exit()``) once its pipe from the parent reaches
    end-of-file: the parent never writes to it, so that means the parent is gone."""
    def watchdog() -> None:
        try:
            while True:
                alive.recv_bytes()
        except (EOFError, OSError):
            pass
        before_exit()
        os._exit(1)

    threading.Thread(target=watchdog, name="verirl-reward-watchdog", daemon=True).start()


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux; elsewhere none are found)."""
    try:
        found = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        return found
    except (OSError, ValueError):
        pass
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _kill_tree(pid: int, reap: bool) -> None:
    """SIGKILL every descendant of ``pid`` (children first found, then what they leave), reaping them
    when they are this process's own (``reap``). A worker is a child subreaper, so the orphans of a
    killed child become its children and the next round finds them."""
    for _ in range(100):  # a fork bomb outruns any count; the next call's clean-up goes on
        kids = _children(pid)
        if not kids:
            return
        for kid in kids:
            if not reap:
                _kill_tree(kid, reap=False)
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for kid in kids if reap else []:
            try:
                os.waitpid(kid, 0)
            except ChildProcessError:
                pass


def _own_children() -> None:
    """Make this worker the reaper of its descendants' orphans (Linux), so that `_kill_tree` finds
    a grandchild whose parent exited."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # 36 = PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass


def _address_space_mb() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (OSError, ValueError, IndexError):
        return None


def _cap_address_space(max_memory_mb: int) -> None:
    if not sys.platform.startswith("linux"):
        return  # documented as Linux only: elsewhere RLIMIT_AS is missing or not enforced
    import resource
    cap = max_memory_mb * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  (a rule may have closed or replaced them)
            pass


def _worker_main(tasks: Connection, alive: Connection, output: Connection, parent_pid: int,
                 max_memory_mb: int, pdeathsig: bool) -> None:
    """One scoring worker: ``tasks`` brings (rule, responses, samples, max_abs_score) and takes back
    ("ready", pid, address space MB), ("start",) and ("done", scores)."""
    _die_with_parent(parent_pid, alive, pdeathsig)
    _own_children()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the trainer decides
    for fd in (1, 2):
        os.dup2(output.fileno(), fd)
    output.close()
    import verirl.rewards.rules  # noqa: F401  (math-verify, sympy: imported once per worker, not per call)
    base_mb = _address_space_mb()
    if max_memory_mb > 0:
        _cap_address_space(max_memory_mb)
    _reply(tasks, ["ready", os.getpid(), base_mb, None])
    _serve(tasks, lambda: _kill_tree(os.getpid(), reap=True))


def _reply(tasks: Connection, msg: list) -> None:
    """To the trainer as JSON: what a rule's process sends is data, never unpickled."""
    tasks.send_bytes(json.dumps(msg).encode())


def _serve(tasks: Connection, clean_up) -> None:
    """A worker's calls until the trainer closes the pipe; ``clean_up`` ends a call's processes."""
    while True:
        try:
            msg = tasks.recv()
        except (EOFError, OSError):
            os._exit(0)
        if msg is None:
            os._exit(0)
        n = len(msg[1])
        _reply(tasks, ["start"])
        try:
            scores: Scores = call_rule(*msg)
        except BaseException as e:  # noqa: BLE001  (call_rule catches the rule's own; this is what is left)
            scores = [(None, f"failed in the scoring worker: {type(e).__name__}: {e}")] * n
        clean_up()  # a rule's processes end with its call
        _flush()
        try:
            _reply(tasks, ["done", scores])
        except Exception as e:  # noqa: BLE001  (e.g. MemoryError under the cap, a value JSON cannot hold)
            _reply(tasks, ["done", [(None, f"scores could not be sent back: {type(e).__name__}: {e}")] * n])


def sandboxed_worker(args: dict, report: Optional[dict], prepare: bool, prepared=None) -> None:
    """The scoring worker inside `verirl.sandbox` (its launcher calls it twice): ``prepare``, before the
    namespaces, imports the rule library and the rules it is told of; then, inside, it serves calls
    over the file descriptors the trainer passed. As the PID namespace's first process it ends a
    call's processes with one ``kill(-1)``."""
    if prepare:
        import verirl.rewards.rules  # noqa: F401
        from verirl.rewards.custom import resolve
        for spec in args["preload"]:
            try:
                resolve(spec)
            except Exception:  # noqa: BLE001  (the call says why: "could not be loaded")
                pass
        return None
    from multiprocessing.connection import Connection as _Connection

    tasks, alive = _Connection(args["tasks_fd"]), _Connection(args["alive_fd"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getpid() != 1:  # no PID namespace here: the orphans of a call's processes become this worker's
        _own_children()
    _exit_when_closed(alive, lambda: None)  # as PID 1 its exit ends the namespace; else the launcher reaps
    _reply(tasks, ["ready", os.getpid(), _address_space_mb(), report])
    _serve(tasks, _end_namespace if os.getpid() == 1 else (lambda: _kill_tree(os.getpid(), reap=True)))


def _end_namespace() -> None:
    """Kill and reap every other process of this PID namespace (this one is its first process)."""
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


# ----------------------------------------------------------------------------- parent side


@dataclass(frozen=True)
class SandboxSpec:
    """How the pool's workers are sandboxed (`verirl.sandbox`): the paths they must not see (the run
    directory, the home) and the rules they import before the sandbox closes."""
    hide: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()


def _bound_waits(conn: Connection) -> None:
    """A read or a write on the trainer's end of a worker's pipe waits at most `PIPE_WAIT` seconds: a
    worker that sends half a message, or stops reading, is replaced rather than wait for."""
    import socket
    import struct

    sock = socket.socket(fileno=os.dup(conn.fileno()))
    wait_for = struct.pack("ll", int(PIPE_WAIT), 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, wait_for)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, wait_for)
    sock.close()


class _Launched:
    """A sandbox launcher's process, with the part of `multiprocessing.Process` the pool uses. The
    launcher exits 128+N when the sandbox's first process died of signal N: that reads as -N."""

    def __init__(self, popen: "subprocess.Popen"):
        self.popen, self.pid = popen, popen.pid
        self._never: Optional[int] = None  # the write end of the stand-in sentinel, where there is no pidfd
        try:
            self.sentinel = os.pidfd_open(popen.pid)  # readable once the process has ended (Linux >= 5.3)
        except (AttributeError, OSError):  # older: the worker's output pipe closing and the pool's 5 s poll see it
            self.sentinel, self._never = os.pipe()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGTERM: the launcher SIGKILLs the sandbox's first process, and so its whole PID namespace."""
        try:
            self.popen.terminate()
        except ProcessLookupError:
            pass

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()  # a launcher that did not end (it always does): its first process dies with it
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1
            if self._never is not None:
                os.close(self._never)
                self._never = None

    @property
    def exitcode(self) -> Optional[int]:
        code = self.popen.poll()
        return -(code - 128) if code is not None and code > 128 else code


class _Batch:
    """The calls of one `RewardPool.start`; ``left`` counts the calls without a result yet."""

    def __init__(self, n: int):
        self.results: list[Optional[Scores]] = [None] * n
        self.left = n
        self.given_up: set[str] = set()  # rule specs with a timed-out call: their queued calls are not run
        self.unstartable: Optional[str] = None  # why no worker could start to run its calls


class _Task:
    __slots__ = ("batch", "index", "rule", "responses", "samples")

    def __init__(self, batch: _Batch, index: int, rule: Rule, responses: list[str], samples: list[dict]):
        self.batch, self.index, self.rule, self.responses, self.samples = batch, index, rule, responses, samples


class _Worker:
    def __init__(self, proc, conn: Connection, alive: Connection, out: Connection):
        self.proc, self.conn, self.alive, self.out = proc, conn, alive, out
        os.set_blocking(out.fileno(), False)
        self.spawned = time.monotonic()
        self.ready = False
        self.base_mb: Optional[int] = None
        self.task: Optional[_Task] = None
        self.started: Optional[float] = None  # when the worker reported starting its task
        self.sent = 0.0  # when its task was sent
        self.unusable: Optional[str] = None  # why it must be replaced (set by the manager)
        self.printed = b""  # the tail of what it printed since its last call ended

    def drain(self) -> None:
        """Read what is waiting in its output pipe, at most 1 MiB: a rule that prints without end
        must not keep the manager from its deadlines."""
        try:
            for _ in range(16):
                chunk = os.read(self.out.fileno(), 65536)
                if not chunk:
                    return
                self.printed = (self.printed + chunk)[-TAIL_BYTES:]
        except (BlockingIOError, OSError):
            return

    def tail(self) -> str:
        """The last lines it printed, each cut, one per line; '' if nothing."""
        lines = [ln for ln in self.printed.decode("utf-8", "replace").splitlines() if ln.strip()][-TAIL_LINES:]
        self.printed = b""
        return "\n".join(ln if len(ln) <= LINE_CHARS else ln[:LINE_CHARS] + "..." for ln in lines)

    def close(self) -> None:
        """Kill it and the processes its call started (if still running), reap it, keep what it printed
        last, close its pipes."""
        if self.proc.is_alive():
            _kill_tree(self.proc.pid, reap=False)
            self.proc.kill()
        self.proc.join(5)
        self.drain()
        for c in (self.conn, self.alive, self.out):
            c.close()


def _checked(task: _Task, scores, max_abs_score: float) -> Scores:
    """A worker's reply as the trainer takes it: one (score, why) per response, scores re-checked
    (`check_score`), reasons cut; anything else (a rule that wrote to the pipe itself) fails the call."""
    n = len(task.responses)
    if not isinstance(scores, list) or len(scores) != n or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[1], str) for p in scores):
        return [(None, "the worker's reply was not one (score, reason) per response")] * n
    out: Scores = []
    for value, why in scores:
        if value is None:
            out.append((None, why[:WHY_CHARS]))
        elif not task.rule.scores:
            out.append((value, ""))
        else:
            out.append(check_score(value, max_abs_score))
    return out


_sandbox_said = False


def _say_sandbox_once(report: dict) -> None:
    global _sandbox_said
    from verirl.sandbox import missing

    if not _sandbox_said:
        _sandbox_said = True
        off = missing(report)
        if off:
            print(f"reward.sandbox: not everything is on here ({'; '.join(off)}); `verirl doctor --sandbox` "
                  f"shows the table, docs/sandbox.md what each mechanism stops.", file=sys.stderr)


def _death(exitcode: Optional[int]) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == getattr(signal, "SIGKILL", 9):
            return (f"worker died: killed by {name} (the kernel's out-of-memory killer sends it; "
                    f"reward.max_memory_mb caps a worker's memory)")
        return f"worker died: killed by {name}"
    return f"worker died: exited with status {exitcode}"


class RewardPool:
    """``workers`` spawned processes, each call limited to ``timeout`` seconds from its start.

    ``start(calls)`` queues a batch and returns at once; ``collect(batch)`` waits for its scores.
    ``restarts`` counts the workers replaced after a timeout or a death."""

    _pdeathsig = True  # tests set it False on the class to check the watchdog alone

    def __init__(self, workers: int, timeout: Optional[float], max_memory_mb: int = 0,
                 max_abs_score: float = DEFAULT_MAX_ABS_SCORE, sandbox: Optional[SandboxSpec] = None):
        self.sandbox = sandbox
        self.workers = max(1, workers)
        self.timeout = float(timeout) if timeout and timeout > 0 else math.inf
        self.max_memory_mb, self.max_abs_score = int(max_memory_mb), float(max_abs_score)
        self.restarts = 0
        self._cond = threading.Condition()
        self._queue: collections.deque[_Task] = collections.deque()
        self._live: list[_Worker] = []
        self._manager: Optional[threading.Thread] = None
        self._wake_r: Optional[Connection] = None
        self._wake_w: Optional[Connection] = None
        self._closing = False
        self._start_failures = 0
        self._broken: Optional[str] = None  # why workers cannot start; queued calls fail with it
        self._failure: Optional[BaseException] = None  # a bug in the manager thread

    # -- the trainer's side

    def start(self, calls: Sequence[tuple[Rule, list[str], list[dict]]]) -> _Batch:
        """Queue the calls and return at once; `collect` waits for them."""
        batch = _Batch(len(calls))
        with self._cond:
            if self._manager is None:
                self._wake_r, self._wake_w = mp.Pipe(duplex=False)
                self._closing, self._failure = False, None
                self._manager = threading.Thread(target=self._run, name="verirl-reward-pool", daemon=True)
                self._manager.start()
            self._broken, self._start_failures = None, 0  # a new batch gives worker start-up a new chance
            self._queue.extend(_Task(batch, i, *c) for i, c in enumerate(calls))
        self._wake()
        return batch

    def collect(self, batch: _Batch) -> list[Scores]:
        with self._cond:
            while batch.left and self._failure is None:
                self._cond.wait(1.0)
            if self._failure is not None:
                raise RuntimeError("the reward scoring pool's manager thread failed") from self._failure
        if batch.unstartable:  # not the rule's fault, and every later batch would score 0 too
            raise RuntimeError(batch.unstartable)
        return batch.results  # type: ignore[return-value]

    def outstanding(self) -> list[str]:
        """The calls running now, one line each: the rule, how long it has run, the first sample's label
        and task, and the start of its response (what a stall report names)."""
        now = time.monotonic()
        with self._cond:
            running = [(w.task, w.started) for w in self._live if w.task is not None]
            queued = len(self._queue)
        out = [f"rule '{t.rule.name}' running {now - started:.0f}s" if started else f"rule '{t.rule.name}' sent"
               for t, started in running]
        out = [f"{line} on {len(t.responses)} response(s), the first with label {t.samples[0].get('label')!r} task "
               f"{t.samples[0].get('task')!r}: {t.responses[0][:120]!r}" for line, (t, _) in zip(out, running)]
        return out + ([f"{queued} call(s) queued behind them"] if queued else [])

    def worker_pids(self) -> list[int]:
        with self._cond:
            return [w.proc.pid for w in self._live]

    def close(self) -> None:
        """Kill the workers; calls still pending score None. Safe to call twice."""
        with self._cond:
            manager, self._closing = self._manager, True
        if manager is None:
            return
        self._wake()
        manager.join()
        with self._cond:
            self._manager = None
            for c in (self._wake_r, self._wake_w):
                if c is not None:
                    c.close()
            self._wake_r = self._wake_w = None

    def _wake(self) -> None:
        try:
            if self._wake_w is not None:
                self._wake_w.send_bytes(b".")
        except OSError:
            pass

    # -- the manager thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._closing:
                        return
                    self._spawn_missing()
                    self._dispatch()
                    waitables: list[Any] = [self._wake_r]
                    for w in self._live:
                        waitables += [w.conn, w.out, w.proc.sentinel]
                    pause = self._next_deadline() - time.monotonic()
                wait(waitables, timeout=min(max(pause, 0.0), 5.0))
                with self._cond:
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
                    for w in list(self._live):
                        self._service(w)
        except BaseException as e:  # noqa: BLE001  (a bug here must reach the trainer, not hang it)
            self._failure = e
        finally:
            with self._cond:
                closed = "not scored: the scoring pool was closed"
                for w in self._live:
                    w.close()
                    if w.task is not None:
                        self._finish(w.task, [(None, closed)] * len(w.task.responses))
                self._live = []
                while self._queue:
                    t = self._queue.popleft()
                    self._finish(t, [(None, closed)] * len(t.responses))
                self._cond.notify_all()

    def _spawn_missing(self) -> None:
        while len(self._live) < self.workers and self._broken is None:
            if self.sandbox is not None:
                self._live.append(self._spawn_sandboxed())
                continue
            ctx = mp.get_context("spawn")
            conn, child_conn = ctx.Pipe(duplex=True)
            _bound_waits(conn)
            alive_r, alive_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, name="verirl-reward-worker", daemon=True,
                               args=(child_conn, alive_r, out_w, os.getpid(), self.max_memory_mb, self._pdeathsig))
            proc.start()
            for c in (child_conn, alive_r, out_w):  # the worker holds these now; ours would hide its EOFs
                c.close()
            self._live.append(_Worker(proc, conn, alive_w, out_r))

    def _spawn_sandboxed(self) -> "_Worker":
        """A worker in `verirl.sandbox`: its launcher, started with the sandbox's environment alone, gets
        the pipes' file descriptors and runs `sandboxed_worker` inside."""
        from verirl.sandbox import Limits, environment, launch_config, launcher_argv, python_paths

        spec = self.sandbox
        conn, child_conn = mp.Pipe(duplex=True)
        _bound_waits(conn)
        alive_r, alive_w = mp.Pipe(duplex=False)
        out_r, out_w = mp.Pipe(duplex=False)
        limits = Limits(memory_mb=self.max_memory_mb or Limits().memory_mb, cpu_s=0)
        cfg = launch_config("worker", limits, entry="verirl.rewards.pool:sandboxed_worker", sys_path=list(sys.path),
                            hide=list(spec.hide), keep=python_paths(),
                            args={"tasks_fd": child_conn.fileno(), "alive_fd": alive_r.fileno(),
                                  "preload": list(spec.preload)})
        proc = _Launched(subprocess.Popen(launcher_argv(cfg), stdin=subprocess.DEVNULL, stdout=out_w.fileno(),
                                          stderr=out_w.fileno(), pass_fds=(child_conn.fileno(), alive_r.fileno()),
                                          env=environment()))
        for c in (child_conn, alive_r, out_w):
            c.close()
        return _Worker(proc, conn, alive_w, out_r)

    def _dispatch(self) -> None:
        for w in self._live:
            while w.ready and w.task is None and self._queue:
                t = self._queue.popleft()
                if t.rule.spec in t.batch.given_up:
                    self._finish(t, self._not_run(t))
                    continue
                try:
                    w.conn.send((t.rule, t.responses, t.samples, self.max_abs_score))
                except (OSError, ValueError):  # dead, or not reading: `_service` replaces it; the call never started
                    self._queue.appendleft(t)
                    w.unusable = "it could not be sent a call"
                    break
                except Exception as e:  # noqa: BLE001  (a sample that cannot be pickled)
                    self._finish(t, [(None, f"could not be sent to a worker: {type(e).__name__}: {e}")]
                                 * len(t.responses))
                    continue
                w.task, w.started, w.sent = t, None, time.monotonic()

    def _next_deadline(self) -> float:
        soonest = math.inf
        for w in self._live:
            if w.task is not None and w.started is not None:
                soonest = min(soonest, w.started + self.timeout)
            elif w.task is not None:
                soonest = min(soonest, w.sent + self.timeout + START_GRACE)
            elif not w.ready:
                soonest = min(soonest, w.spawned + START_TIMEOUT)
        return soonest

    def _service(self, w: _Worker) -> None:
        """Read what ``w`` printed and sent; then handle its death or its missed deadline."""
        w.drain()
        bad = None
        try:
            for _ in range(MAX_MESSAGES):
                if not w.conn.poll():
                    break
                msg = json.loads(w.conn.recv_bytes(MAX_REPLY))
                if msg[0] == "ready" and not w.ready:
                    w.ready, w.base_mb, self._start_failures = True, msg[2], 0
                    if msg[3] is not None:
                        _say_sandbox_once(msg[3])
                elif msg[0] == "start" and w.task is not None and w.started is None:
                    w.started = time.monotonic()
                elif msg[0] == "done" and w.task is not None and w.started is not None:
                    w.drain()  # all it printed before "done" is in the pipe
                    task, w.task, w.started = w.task, None, None
                    self._finish(task, self._explain(w, _checked(task, msg[1], self.max_abs_score)))
        except (EOFError, ConnectionError):
            pass  # it died: seen below
        except Exception as e:  # noqa: BLE001  (a reply no worker sends: what a rule wrote to the pipe itself)
            bad = f"the worker sent what no worker sends ({type(e).__name__}); replaced"
        now = time.monotonic()
        bad = bad or w.unusable
        if bad is not None:
            self._retire(w, bad)
        elif not w.proc.is_alive():
            self._retire(w, _death(w.proc.exitcode))
        elif w.task is not None and w.started is not None and now - w.started > self.timeout:
            self._retire(w, f"timed out after {self.timeout:g}s")
        elif w.task is not None and w.started is None and now - w.sent > self.timeout + START_GRACE:
            self._retire(w, f"timed out after {self.timeout:g}s (the worker never started the call)")
        elif not w.ready and now - w.spawned > START_TIMEOUT:
            self._retire(w, f"worker did not start within {START_TIMEOUT:g}s")

    def _retire(self, w: _Worker, why: str) -> None:
        """Kill and drop ``w``; its call (if any) scores None with ``why``; `_spawn_missing` replaces it."""
        w.close()
        self._live.remove(w)
        task = w.task
        if task is not None:
            self.restarts += 1
            self._finish(task, self._explain(w, [(None, why)] * len(task.responses)))
            if why.startswith("timed out"):
                self._give_up(task)
        elif not w.ready:
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                self._broken = (f"{MAX_START_FAILURES} reward scoring workers in a row died before they were "
                                f"ready ({why}); their output above says why. A common cause: a script that "
                                f"creates the Scorer outside `if __name__ == \"__main__\":` (see 'Safe importing "
                                f"of main module' in Python's multiprocessing docs).")
                while self._queue:
                    t = self._queue.popleft()
                    t.batch.unstartable = self._broken
                    self._finish(t, [(None, self._broken)] * len(t.responses))
        else:
            self.restarts += 1

    def _give_up(self, late: _Task) -> None:
        late.batch.given_up.add(late.rule.spec)
        keep: collections.deque[_Task] = collections.deque()
        for t in self._queue:
            if t.batch is late.batch and t.rule.spec == late.rule.spec:
                self._finish(t, self._not_run(t))
            else:
                keep.append(t)
        self._queue = keep

    def _not_run(self, t: _Task) -> Scores:
        return [(None, f"not run: an earlier call of this rule in the same batch timed out after "
                       f"{self.timeout:g}s")] * len(t.responses)

    def _explain(self, w: _Worker, scores: Scores) -> Scores:
        """Failed scores get the memory cap spelled out and the worker's last printed lines."""
        printed = w.tail()
        out = []
        for score, why in scores:
            if score is None:
                if why.startswith("out of memory") and self.max_memory_mb > 0:
                    why = (f"out of memory: more than reward.max_memory_mb={self.max_memory_mb} MB of address "
                           f"space (virtual memory; the worker held {w.base_mb} MB before the rule ran)")
                if printed:
                    why = f"{why}\n{printed}"
            out.append((score, why))
        return out

    def _finish(self, task: _Task, scores: Scores) -> None:
        task.batch.results[task.index] = scores
        task.batch.left -= 1
        self._cond.notify_all()
