"""Tool calls run, each under a wall-clock deadline, by the tool's kind (`verirl.envs.tools.Tool.kind`):

- ``local`` (the calculator): in the calling thread; it bounds itself and never runs code.
- ``program`` (``python``): `verirl.envs.tools.run_python`, a fresh `verirl.sandbox.run_program` per call with
  the deadline as its wall-clock limit; at most ``workers`` programs at once (the others wait their turn,
  which does not count against their deadline).
- ``worker`` (a user's function): in the reward scoring pool, `verirl.rewards.pool.RewardPool`, reused as
  it is. Its workers are what a tool needs: a deadline per call counted from the call's start (a stuck
  worker is killed and replaced while the other calls go on), an address-space cap, output captured
  (nothing a tool prints reaches the trainer; a failed call's last lines are shown), every process a call
  started killed after it, replies in JSON only, and inside `verirl.sandbox` unless it is off. A tool call
  is a pool call of `call_tool_in_worker` (`TOOL_CALL`, a helper whose value comes back unchecked) that
  imports the tool's file in the worker and returns its result as text, already cut; one pool batch per
  call, so one call's timeout never cancels another's.
- ``session`` (veRL tool classes, TRL environments, the gsm8k checker): the episode's `Session`, in this
  process; `in_thread` and `on_loop` keep its deadline (a call past it is abandoned and reported; code
  in this process cannot be killed, which is why code that may hang belongs in a worker or a program).

A result's text is cut to ``max_chars`` characters (0 = no character limit), and never past
`verirl.envs.tools.HARD_MAX_CHARS`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from verirl.envs.parsers import ToolCall
from verirl.envs.tools import HARD_MAX_CHARS, Tool, ToolError, ToolResult, cut, result_text, run_python

TOOL_CALL = "verirl.envs.runner:call_tool_in_worker"  # the pool helper every worker tool call runs
DEFAULT_MEMORY_MB = 4096  # address space of a tool worker or a python program (the sandbox's default)


def call_tool_in_worker(response: str, tool: str = "", arguments: Optional[dict] = None,
                        max_chars: int = HARD_MAX_CHARS, **_: Any) -> str:
    """In a tool worker: the tool ``tool`` (a file.py:function reference, imported once per worker, before
    the sandbox closes where there is one) called with ``arguments``, its result as text, cut."""
    from verirl.rewards.custom import resolve

    if not tool:  # `Runner.warm`'s call: nothing to run
        return ""
    return cut(result_text(resolve(tool)(**(arguments or {}))), max_chars)


class Session(Protocol):
    """The per-episode state behind ``session`` tools (`verirl.envs.peers`): one per episode, used by one
    thread at a time."""

    def call(self, name: str, arguments: dict, timeout: float) -> tuple[Any, Optional[float]]:
        """(result, reward or None) of tool ``name``; raises TimeoutError past ``timeout`` seconds."""
        ...

    def close(self) -> None:
        ...


def in_thread(fn: Callable[[], Any], timeout: float, name: str = "verirl-tool") -> Any:
    """``fn()`` in a daemon thread, its value or its exception; TimeoutError when it has not returned within
    ``timeout`` seconds (the thread is abandoned: code in this process cannot be stopped)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed to the caller)
            box["error"] = e

    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"timed out after {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


class EventLoop:
    """One asyncio loop in a daemon thread, shared by the episodes of a factory (veRL's tools are async and
    share state across episodes): `run` submits a coroutine from any thread and waits for it."""

    def __init__(self) -> None:
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def run(self, coro, timeout: float) -> Any:
        """The coroutine's value; past ``timeout`` seconds it is cancelled and TimeoutError raised."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="verirl-tool-loop", daemon=True)
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:  # the builtin TimeoutError from Python 3.11 on, not before
            future.cancel()
            raise TimeoutError(f"timed out after {timeout:g}s") from None

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(5)
            if not loop.is_running():
                loop.close()


def _reason(why: str, memory_mb: int) -> str:
    """A tool pool failure as the model reads it (the pool words its reasons for reward rules)."""
    first, _, rest = why.partition("\n")
    if first.startswith("raised "):
        first = first[len("raised "):]
    elif first.startswith("out of memory"):
        first = f"out of memory: the tool asked for more than {memory_mb} MB of address space"
    elif first.startswith("worker died"):
        first = "the tool's process died: " + first.split(": ", 1)[-1].split(" (", 1)[0]
    elif first.startswith("not scored"):
        first = "not run: the tools were closed"
    return f"{first}\n{rest}" if rest else first


class Runner:
    """Runs a turn's tool calls (`run`), each under ``timeout_s`` seconds; ``workers`` processes for user
    function tools (started at their first call) and at most that many python programs at once."""

    def __init__(self, timeout_s: float, workers: int, max_chars: int, sandbox: bool,
                 hide: Sequence[str] = (), memory_mb: int = 0, preload: Sequence[str] = ()):
        self.timeout_s = float(timeout_s)
        self.workers = max(1, int(workers))
        self.max_chars = int(max_chars)
        self.sandbox = bool(sandbox) and sys.platform.startswith("linux")
        self.hide = tuple(hide)
        self.memory_mb = int(memory_mb) or DEFAULT_MEMORY_MB
        self.preload = tuple(preload)
        self._programs = threading.BoundedSemaphore(self.workers)
        self._pool = None
        self._lock = threading.Lock()
        self._closed = False

    # -- the user's functions: the reward pool

    def _get_pool(self):
        with self._lock:
            if self._closed:
                raise RuntimeError("the tool runner was closed")
            if self._pool is None:
                from verirl.rewards.pool import RewardPool, SandboxSpec
                from verirl.sandbox import hidden_paths

                spec = SandboxSpec(tuple(hidden_paths(self.hide)), (TOOL_CALL, *self.preload)) if self.sandbox else None
                self._pool = RewardPool(self.workers, self.timeout_s, self.memory_mb, sandbox=spec)
            return self._pool

    def _submit(self, call: ToolCall, tool: Tool):
        from verirl.rewards.custom import Rule

        rule = Rule(TOOL_CALL, tool.name, batched=False, params=None, scores=False)
        sample = {"tool": tool.spec, "arguments": call.arguments, "max_chars": self._limit()}
        return self._get_pool().start([(rule, [""], [sample])])

    def _collect(self, batch, call: ToolCall, started: float) -> ToolResult:
        (value, why), = self._pool.collect(batch)[0]
        seconds = time.monotonic() - started
        if value is None:
            return ToolResult(call.name, cut(f"Error: {_reason(why, self.memory_mb)}", self.max_chars), error=True,
                              timed_out=why.startswith("timed out"), seconds=seconds)
        return ToolResult(call.name, cut(str(value), self.max_chars), seconds=seconds)

    def warm(self, wait: bool = False) -> None:
        """Start the tool workers now (they take a second or two to import and, in the sandbox, to set it up),
        so that the first tool calls do not wait for them; ``wait``: until one has answered."""
        from verirl.rewards.custom import Rule

        batch = self._get_pool().start([(Rule(TOOL_CALL, "warm", False, None, False), [""], [{"tool": ""}])])
        if wait:
            self._pool.collect(batch)

    def _limit(self) -> int:
        return min(self.max_chars, HARD_MAX_CHARS) if self.max_chars > 0 else HARD_MAX_CHARS

    # -- everything else, in the calling thread

    def _run_here(self, call: ToolCall, tool: Tool, session: Optional[Session]) -> ToolResult:
        started = time.monotonic()
        try:
            if tool.kind == "local":
                value, reward = tool.fn(**call.arguments), None
            elif tool.kind == "program":
                return self._program(call)
            elif tool.kind == "session":
                if session is None:
                    raise RuntimeError(f"no session for the tool {tool.name!r}")
                value, reward = session.call(tool.name, call.arguments, self.timeout_s)
            else:
                raise RuntimeError(f"tool {tool.name!r} has a kind the runner does not know: {tool.kind!r}")
        except ToolError as e:
            return ToolResult(call.name, cut(f"Error: {e}", self.max_chars), error=True,
                              seconds=time.monotonic() - started)
        except TimeoutError:
            return ToolResult(call.name, f"Error: timed out after {self.timeout_s:g}s", error=True, timed_out=True,
                              seconds=time.monotonic() - started)
        except Exception as e:  # noqa: BLE001  (a tool's own failure: the model reads it, the run goes on)
            msg = str(e)
            text = f"Error: {type(e).__name__}: {msg}" if msg else f"Error: {type(e).__name__}"
            return ToolResult(call.name, cut(text, self.max_chars), error=True, seconds=time.monotonic() - started)
        return ToolResult(call.name, cut(result_text(value), self.max_chars), reward=reward,
                          seconds=time.monotonic() - started)

    def _program(self, call: ToolCall) -> ToolResult:
        language = call.arguments.get("language", "python")
        if not isinstance(language, str) or language.lower() not in ("python", "python3", "py"):
            return ToolResult(call.name, f"Error: only Python runs here, not {str(language)[:40]!r}", error=True)
        with self._programs:
            result = run_python(call.arguments.get("code"), self.timeout_s, self.memory_mb, self.hide, self.max_chars)
        result.name = call.name
        return result

    # -- a turn

    def run(self, calls: Sequence[tuple[ToolCall, Tool]],
            sessions: Optional[Mapping[str, Session]] = None) -> list[ToolResult]:
        """The results of a turn's calls, in their order: the user functions' calls start at once in the
        pool, the others run here meanwhile, one after the other. ``sessions``: tool name -> its session."""
        started = time.monotonic()
        pending = {i: self._submit(c, t) for i, (c, t) in enumerate(calls) if t.kind == "worker"}
        results: dict[int, ToolResult] = {}
        for i, (c, t) in enumerate(calls):
            if i not in pending:
                results[i] = self._run_here(c, t, (sessions or {}).get(t.name))
        for i, batch in pending.items():
            results[i] = self._collect(batch, calls[i][0], started)
        return [results[i] for i in range(len(calls))]

    def worker_pids(self) -> list[int]:
        """The tool pool's worker processes (none before the first user function call)."""
        with self._lock:
            return self._pool.worker_pids() if self._pool is not None else []

    def close(self) -> None:
        """Stop the tool pool's workers (and what they run). Safe to call twice."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.close()
