"""Hostile tools through real tool workers, the real sandbox and real programs: user functions and python
programs that hang, raise, print 10 MB, fork a child and exit, allocate 4 GB or open a socket. Each call is
an error observation (or cut output) within its deadline, no process is left behind, and the calls
running beside them in the same pool get their right answers meanwhile."""
from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from verirl.envs import build_environments
from verirl.envs.tools import HARD_MAX_CHARS, TRUNCATED

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")

DEADLINE = 2.0
SLACK = 1.5  # a 2-core machine shared with other work: killing, reaping and replacing a worker

HOSTILE_TOOLS = '''
import ctypes, os, socket, time

def _name(marker):
    ctypes.CDLL(None).prctl(15, marker.encode(), 0, 0, 0)  # PR_SET_NAME: /proc/PID/comm


def hang(seconds: float) -> str:
    """Never come back.

    Args:
        seconds: Ignored.
    """
    while True:
        time.sleep(0.05)


def boom(x: int) -> int:
    """Raise.

    Args:
        x: Put in the message.
    """
    raise RuntimeError(f"boom {x}")


def flood(megabytes: int) -> str:
    """Print a lot, then answer.

    Args:
        megabytes: How much to print.
    """
    for _ in range(megabytes):
        print("y" * 2**20)
    return "printed"


def huge(megabytes: int) -> str:
    """Return a lot.

    Args:
        megabytes: How much.
    """
    return "z" * (megabytes * 2**20)


def fork(marker: str) -> str:
    """Leave a child behind and return.

    Args:
        marker: The child's process name.
    """
    if os.fork() == 0:
        _name(marker)
        time.sleep(600)
        os._exit(0)
    return "forked"


def fork_and_die(marker: str) -> str:
    """Leave a child behind and end this process.

    Args:
        marker: The child's process name.
    """
    if os.fork() == 0:
        _name(marker)
        time.sleep(600)
    os._exit(3)


def alloc(gigabytes: int) -> str:
    """Allocate memory.

    Args:
        gigabytes: How much.
    """
    return str(len(bytearray(gigabytes * 2**30)))


def connect(port: int) -> str:
    """Connect to this machine.

    Args:
        port: The port.
    """
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    return "connected"


def add(a: int, b: int) -> int:
    """Add.

    Args:
        a: One.
        b: Two.
    """
    return a + b
'''


def _call(name, **arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def _prompt():
    return SimpleNamespace(messages=[{"role": "user", "content": "go"}], label="0", task="t", ids=[], extra={})


def _alive(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == marker[:15]:
                found.append(int(pid))
        except OSError:
            continue
    return found


def _step(factory, turn):
    """One episode's turn, timed: (seconds, the step)."""
    env = factory.new()
    env.reset(_prompt())
    start = time.monotonic()
    step = env.step(turn)
    took = time.monotonic() - start
    env.close()
    return took, step


def _descendants() -> set[int]:
    """This process's descendants, but multiprocessing's resource tracker (started with the first spawned
    process, alive as long as this one)."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                found.add(p.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def server():
    s = socket.create_server(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


def test_hostile_user_tools(tmp_path, server):
    path = tmp_path / "hostile_tools.py"
    path.write_text(textwrap.dedent(HOSTILE_TOOLS))
    names = ["hang", "boom", "flood", "huge", "fork", "fork_and_die", "alloc", "connect", "add"]
    before = _descendants()
    factory = build_environments([f"{path}:{n}" for n in names], "", "hermes", None, DEADLINE, 3, 0, True)
    factory.runner.warm(wait=True)  # worker start-up is not a call's time
    marker = f"vtool{os.getpid() % 10**6}"
    hostile = {
        "hang": _call("hang", seconds=600),
        "boom": _call("boom", x=7),
        "flood": _call("flood", megabytes=10),
        "huge": _call("huge", megabytes=10),
        "fork": _call("fork", marker=marker),
        "fork_and_die": _call("fork_and_die", marker=marker + "d"),
        "alloc": _call("alloc", gigabytes=4),
        "connect": _call("connect", port=server),
    }
    with ThreadPoolExecutor(len(hostile) + 4) as ex:  # the loop's shape: episodes stepped from worker threads
        futures = {k: ex.submit(_step, factory, turn) for k, turn in hostile.items()}
        time.sleep(0.3)  # the hang has started: these share the pool with it
        beside = [ex.submit(_step, factory, _call("add", a=i, b=1000)) for i in range(6)]
        got = {k: f.result() for k, f in futures.items()}
        side = [f.result() for f in beside]
    text = {k: step.observation[0]["content"] for k, (_, step) in got.items()}
    took = {k: t for k, (t, _) in got.items()}

    assert text["hang"] == f"Error: timed out after {DEADLINE:g}s"
    assert got["hang"][1].counts["tool_timeouts"] == 1.0 and got["hang"][1].counts["tool_errors"] == 1.0
    assert DEADLINE - 0.2 < took["hang"] < DEADLINE + SLACK
    assert text["boom"] == "Error: RuntimeError: boom 7"
    assert text["flood"] == "printed"  # what a tool prints is not its result, nor the trainer's output
    assert text["huge"] == "z" * HARD_MAX_CHARS + TRUNCATED
    assert text["fork"] == "forked"
    assert text["fork_and_die"].startswith("Error: the tool's process died")
    assert text["alloc"].startswith("Error: out of memory: the tool asked for more than 4096 MB")
    assert text["connect"].startswith("Error: OSError: [Errno 101] Network is unreachable")  # the sandbox's network
    for k, t in took.items():
        assert t < DEADLINE + SLACK, (k, t)
    for i, (t, step) in enumerate(side):  # the calls beside the hostile ones: right, and not held up by the hang
        assert step.observation == [{"role": "tool", "name": "add", "content": str(i + 1000)}]
        assert step.counts["tool_errors"] == 0.0
    assert max(t for t, _ in side) < DEADLINE
    assert _alive(marker) == [] and _alive(marker + "d") == []  # each call's processes ended with it

    _, again = _step(factory, _call("fork", marker=marker))  # alone, with every worker alive after it
    assert again.observation[0]["content"] == "forked" and _alive(marker) == []
    _, again = _step(factory, _call("add", a=2, b=3))  # replaced workers serve the next calls
    assert again.observation[0]["content"] == "5"
    factory.close()
    time.sleep(0.2)
    assert _descendants() <= before, "tool processes outlived the factory"


HOSTILE_PROGRAMS = {
    "loop": "while True: pass",
    "raise": "raise RuntimeError('boom')",
    "flood": "import sys\nfor _ in range(10): sys.stdout.write('y' * 2**20)",
    "fork": ("import ctypes, os, time\nif os.fork() == 0:\n    ctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0)\n"
             "    time.sleep(600)\nprint('parent done')"),
    "alloc": "b = bytearray(4 * 2**30)\nprint(len(b))",
    "connect": "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('in')",
    "fine": "print(sum(range(10)))",
}


def test_hostile_python_programs(server):
    before = _descendants()
    factory = build_environments(["python"], "", "hermes", None, DEADLINE, 4, 0, True)
    marker = f"vprog{os.getpid() % 10**6}"
    turns = {k: _call("python", code=code.replace("{marker}", marker).replace("{port}", str(server)))
             for k, code in HOSTILE_PROGRAMS.items()}
    with ThreadPoolExecutor(len(turns)) as ex:
        futures = {k: ex.submit(_step, factory, turn) for k, turn in turns.items()}
        got = {k: f.result() for k, f in futures.items()}
    text = {k: step.observation[0]["content"] for k, (_, step) in got.items()}
    took = {k: t for k, (t, _) in got.items()}

    assert text["loop"] == f"(timed out after {DEADLINE:g}s: the program was stopped)"
    assert got["loop"][1].counts["tool_timeouts"] == 1.0
    assert DEADLINE - 0.2 < took["loop"] < DEADLINE + SLACK
    assert text["raise"].startswith("Traceback") and text["raise"].endswith("RuntimeError: boom\n(exit status 1)")
    assert got["raise"][1].counts["tool_errors"] == 1.0
    assert text["flood"] == "y" * HARD_MAX_CHARS + TRUNCATED  # stopped at the output limit, then cut
    assert got["flood"][1].counts["tool_errors"] == 1.0
    assert text["fork"] == "parent done"
    assert "MemoryError" in text["alloc"] and "(exit status 1)" in text["alloc"]
    assert "Network is unreachable" in text["connect"] and "in\n" not in text["connect"]
    assert text["fine"] == "45" and got["fine"][1].counts["tool_errors"] == 0.0
    for k, t in took.items():
        assert t < DEADLINE + SLACK, (k, t)
    assert _alive(marker) == []
    factory.close()
    assert _descendants() <= before


HANGING_ENV = '''
import time

class Stuck:
    def reset(self, **kwargs):
        return None

    def wait(self, seconds: float) -> str:
        """Wait.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "waited"
'''


def test_hanging_environment_method_times_out(tmp_path):
    """A TRL environment runs in this process (as under TRL): a method past its deadline is abandoned and
    reported, and the episode's later calls are refused rather than run beside it."""
    path = tmp_path / "stuck_env.py"
    path.write_text(textwrap.dedent(HANGING_ENV))
    factory = build_environments([], f"{path}:Stuck", "hermes", None, 0.5, 1, 0, True)
    env = factory.new()
    env.reset(_prompt())
    start = time.monotonic()
    step = env.step(_call("wait", seconds=5))
    assert time.monotonic() - start < 0.5 + 0.5
    assert step.observation[0]["content"] == "Error: timed out after 0.5s" and step.counts["tool_timeouts"] == 1.0
    assert env.step(_call("wait", seconds=0)).observation[0]["content"].startswith("Error: not run: an earlier call")
    other = factory.new()  # another episode: its own instance, unaffected
    other.reset(_prompt())
    assert other.step(_call("wait", seconds=0)).observation[0]["content"] == "waited"
    factory.close()


def test_plain_workers_keep_deadlines_and_clean_up(tmp_path):
    """With the sandbox off (reward.sandbox=false) the workers still kill a stuck call, end what a call
    started and keep the other calls going."""
    path = tmp_path / "hostile_tools.py"
    path.write_text(textwrap.dedent(HOSTILE_TOOLS))
    before = _descendants()
    factory = build_environments([f"{path}:{n}" for n in ("hang", "fork", "add")], "", "hermes", None, 1.0, 2, 0,
                                 False)
    factory.runner.warm(wait=True)
    marker = f"vplain{os.getpid() % 10**6}"
    with ThreadPoolExecutor(3) as ex:
        hang = ex.submit(_step, factory, _call("hang", seconds=600))
        time.sleep(0.2)
        fork = ex.submit(_step, factory, _call("fork", marker=marker))
        took, step = hang.result()
        assert step.observation[0]["content"] == "Error: timed out after 1s" and took < 1.0 + SLACK
        assert fork.result()[1].observation[0]["content"] == "forked" and fork.result()[0] < 1.0
    assert _alive(marker) == []
    assert _step(factory, _call("add", a=1, b=2))[1].observation[0]["content"] == "3"
    factory.close()
    time.sleep(0.2)
    assert _descendants() <= before


HANGING_PEERS = '''
import asyncio, time
from verirl.envs import EnvStep

class SlowStep:
    def reset(self, prompt):
        return None

    def step(self, turn):
        time.sleep(5)
        return EnvStep(None, done=True)

class HangingVerlTool:
    cancelled = []

    def __init__(self, config, tool_schema):
        pass

    async def execute(self, instance_id, parameters, **kwargs):
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            self.cancelled.append(instance_id)
            raise
'''


def test_hanging_user_environment_and_verl_tool(tmp_path, monkeypatch):
    (tmp_path / "verirl_hanging_peers.py").write_text(textwrap.dedent(HANGING_PEERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = build_environments([], f"{tmp_path}/verirl_hanging_peers.py:SlowStep", "hermes", None, 0.3, 1, 0, False)
    env = factory.new()
    env.reset(_prompt())
    start = time.monotonic()
    step = env.step("hello")
    assert time.monotonic() - start < 0.3 + 0.5
    assert step.done and step.counts["tool_timeouts"] == 1.0
    factory.close()

    config = tmp_path / "hang.yaml"
    config.write_text("tools:\n  - class_name: verirl_hanging_peers.HangingVerlTool\n    config: {type: native}\n"
                      "    tool_schema: {type: function, function: {name: wait, description: Wait., parameters: "
                      "{type: object, properties: {}}}}\n")
    factory = build_environments([str(config)], "", "hermes", None, 0.3, 1, 0, False)
    env = factory.new()
    env.reset(_prompt())
    start = time.monotonic()
    step = env.step(_call("wait"))
    assert time.monotonic() - start < 0.3 + 0.5
    assert step.observation[0]["content"] == "Error: timed out after 0.3s" and step.counts["tool_timeouts"] == 1.0
    time.sleep(0.1)
    assert len(sys.modules["verirl_hanging_peers"].HangingVerlTool.cancelled) == 1  # cancelled on its loop
    factory.close()
