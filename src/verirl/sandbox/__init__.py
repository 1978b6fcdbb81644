"""One sandbox for code that a model or a user wrote: reward rules (the reward pool's workers),
programs under test (`run_program`: the `code` reward, the agents' python tool).

No daemon and no container runtime: the Linux kernel's own namespaces and limits, set up by
`verirl.sandbox._launch` in a fresh process. What is on depends on who runs it (docs/sandbox.md):

- PID namespace: the sandbox's first process is PID 1; when it ends, the kernel kills every process
  inside (``setsid``, double forks and background jobs included). Without one, the launcher is the
  child subreaper of what the sandbox starts and kills it all when the first process ends.
- Network namespace: only a loopback interface, down: no connection leaves the sandbox.
- Mount namespace: the whole file system read-only, fresh tmpfs mounts on /tmp (the working
  directory) and /dev/shm, a /dev of null, zero, full, random and urandom alone, the paths it is
  told to hide (the run directory, the home directory, /run's sockets) covered by empty read-only
  mounts, and a /proc that shows only the sandbox's processes.
- Session: the sandbox leaves the caller's session, so it has no terminal to type into.
- As root: the uid and gid drop to one of the sandbox's own (`sandbox_uid`, above any user's), with
  no supplementary groups, so that files the trainer's user alone may read are closed too and
  ``RLIMIT_NPROC`` counts that sandbox's processes alone. If that fails, nothing runs.
  As a normal user: a user namespace makes the rest possible, and every capability is dropped.
- Limits: open files, file size, processes, address space, CPU seconds; a wall-clock deadline kept
  by the caller; output kept up to a byte limit.
- The environment holds only PATH, HOME, TMPDIR and LANG: none of the trainer's variables.

Each mechanism the kernel refuses is reported (`probe`, `verirl doctor --sandbox`) and the rest
still applies. Linux only; elsewhere `probe` says that nothing is on.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

LAUNCHER = Path(__file__).with_name("_launch.py")
UID_BASE = 0x50000  # the sandboxes' uids, one per sandbox: UID_BASE .. UID_BASE + 65535 (no user has them)
SOCKET_DIRS = ("/run", "/var/run")
_uids = iter(range(1 << 30))
MECHANISMS = ["user namespace", "pid namespace", "network namespace", "mount namespace", "ipc namespace",
              "uts namespace", "read-only file system", "private /tmp", "private /dev", "private /proc",
              "hidden paths", "unprivileged uid", "limits"]


@dataclass(frozen=True)
class Limits:
    """What one sandboxed process (and everything it starts) may use. 0 = no limit."""
    seconds: float = 10.0  # wall clock, from the start of the program (or of a worker's call)
    cpu_s: int = 10  # CPU seconds (RLIMIT_CPU: SIGKILL past it)
    memory_mb: int = 4096  # address space (RLIMIT_AS: an allocation past it fails, MemoryError in Python)
    files: int = 256  # open file descriptors (RLIMIT_NOFILE)
    file_mb: int = 64  # size of one written file (RLIMIT_FSIZE: a write past it fails)
    processes: int = 256  # processes of the sandbox's uid (RLIMIT_NPROC; as root, the sandbox's own uid)
    tmp_mb: int = 256  # the private /tmp and /dev/shm (tmpfs)
    output_bytes: int = 1 << 20  # stdout and stderr each kept up to this; past it the program is stopped


def environment(home: str = "/tmp") -> dict[str, str]:
    """The sandbox's whole environment: no variable of the trainer's reaches it."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


def hidden_paths(run_dirs: tuple[str, ...] = ()) -> list[str]:
    """What the sandbox covers with an empty read-only mount: the run directories, the trainer's home,
    /run (the machine's sockets: D-Bus, Docker's, systemd's, which work across network namespaces),
    and a directory above the Python environment that other users cannot pass (a private home holding
    it); the Python environment inside them (`python_paths`) is bound back at its path, read-only."""
    home = os.path.expanduser("~")
    keep = python_paths()
    closed = [a for k in keep for a in _ancestors(k) if not os.stat(a).st_mode & 0o001]  # others cannot pass
    candidates = [os.path.realpath(p) for p in (*run_dirs, home, *closed, *SOCKET_DIRS) if p]
    fresh = ("/tmp", "/dev/shm")  # new and empty in the sandbox already
    return [c for c in dict.fromkeys(candidates) if c != "/" and c not in keep
            and not any(c == f or c.startswith(f + "/") for f in fresh)]


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts
    return [str(Path(*parts[:i])) for i in range(2, len(parts))]


def python_paths() -> list[str]:
    """What the sandbox keeps readable for Python: the interpreter's and the environment's prefixes,
    the standard library, the package directories on the path (site-packages), and the directory
    verirl itself is imported from. Not the working directory or a script's: they hold the project."""
    verirl_root = str(Path(__file__).resolve().parents[2])  # the directory verirl/ is imported from
    library = [p for p in sys.path if p and (os.path.realpath(p).startswith(os.path.realpath(sys.base_prefix))
                                             or os.path.realpath(p).startswith(os.path.realpath(sys.prefix))
                                             or os.path.basename(p) in ("site-packages", "dist-packages"))]
    found = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), *library, verirl_root]
    return [os.path.realpath(p) for p in dict.fromkeys(found) if os.path.isdir(p)]


def sandbox_uid() -> int:
    """A uid no other sandbox of this machine is likely to hold now, so that one sandbox's processes
    count against its own RLIMIT_NPROC alone (the uid is dropped to as root; files it owns live only
    in the sandbox's tmpfs)."""
    return UID_BASE + (os.getpid() * 7919 + next(_uids)) % 65536


def launch_config(mode: str, limits: Limits, **more) -> dict:
    uid = sandbox_uid()
    return {"mode": mode, "parent_pid": os.getpid(), "uid": uid, "gid": uid,
            "limits": dataclasses.asdict(limits), "env": environment(), **more}


def launcher_argv(cfg: dict) -> list[str]:
    """The command that starts a sandbox: this interpreter, isolated (-I: no PYTHON* variables, no user
    site, no current directory on the path) and without site (-S), on the launcher script."""
    return [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)]


@dataclass
class ProgramResult:
    returncode: Optional[int]  # the program's exit status; 128+N for signal N; None if it never finished
    stdout: str
    stderr: str
    timed_out: bool  # stopped at limits.seconds
    truncated: bool  # its output passed limits.output_bytes: cut there and the program stopped
    seconds: float
    setup: dict  # what the sandbox set up (`probe`'s table), from the sandbox itself

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.truncated


def run_program(code: str, stdin: str = "", limits: Optional[Limits] = None, *,
                hide: tuple[str, ...] = (),
                on_start: Optional[Callable[[subprocess.Popen], None]] = None) -> ProgramResult:
    """Run the Python program ``code`` in a fresh sandbox, ``stdin`` on its standard input; its
    processes end with it; ``hide``: more paths to cover (besides the trainer's home). Never raises
    for what the program does (a crash, a hang, a flood of output, a fork bomb): that is in the result.
    ``on_start`` is given the launcher's process as soon as it runs: its ``terminate()``, from another
    thread, stops the sandbox and everything in it (and this call returns)."""
    limits = limits or Limits()
    report_r, report_w = os.pipe()
    cfg = launch_config("program", limits, code=code, argv=[sys.executable, "-I"], report_fd=report_w,
                        hide=[*hidden_paths(), *hide], keep=python_paths())
    start = time.monotonic()
    proc = subprocess.Popen(launcher_argv(cfg), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(report_w,), env=environment(),
                            start_new_session=True)
    os.close(report_w)
    if on_start is not None:
        on_start(proc)
    out, err, timed_out, truncated = _communicate(proc, stdin.encode(), limits, start)
    setup = _report(report_r)
    return ProgramResult(None if timed_out else proc.returncode, out.decode("utf-8", "replace"),
                         err.decode("utf-8", "replace"), timed_out, truncated, time.monotonic() - start, setup)


def _communicate(proc: subprocess.Popen, data: bytes, limits: Limits, start: float):
    """Feed stdin, keep each output up to the limit, stop the sandbox at the deadline or past the
    output limit (the launcher's death takes the rest with it)."""
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdout.fileno(), False)
    os.set_blocking(proc.stderr.fileno(), False)
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    if data:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
    else:
        proc.stdin.close()
    got = {"out": bytearray(), "err": bytearray()}
    received = {"out": 0, "err": 0}  # bytes read from each, kept or not
    deadline = start + limits.seconds if limits.seconds > 0 else float("inf")
    timed_out = truncated = False
    sent = 0
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 1.0)):
            if key.data == "in":
                try:
                    sent += os.write(proc.stdin.fileno(), data[sent:sent + 65536])
                except (BrokenPipeError, OSError):
                    sent = len(data)
                if sent >= len(data):
                    sel.unregister(proc.stdin)
                    proc.stdin.close()
                continue
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf, received[key.data] = got[key.data], received[key.data] + len(chunk)
            buf += chunk[:max(limits.output_bytes - len(buf), 0)] if limits.output_bytes else chunk
            truncated = truncated or 0 < limits.output_bytes < received[key.data]
        if truncated:
            break
    if timed_out or truncated:
        proc.terminate()  # the launcher SIGKILLs the sandbox's first process, and with it the namespace
    sel.close()
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 5.0) if not (timed_out or truncated) else 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            f.close()
        except OSError:
            pass
    return bytes(got["out"]), bytes(got["err"]), timed_out, truncated


def _report(fd: int) -> dict:
    try:
        with os.fdopen(fd, "rb") as f:
            line = f.read(1 << 16).decode("utf-8", "replace").strip()
        return json.loads(line) if line else {}
    except (OSError, ValueError):
        return {}


@functools.lru_cache(maxsize=1)
def probe() -> dict[str, str]:
    """What the sandbox sets up on this machine for this user: mechanism -> on / off (why)."""
    if not sys.platform.startswith("linux"):
        return {m: f"off (the sandbox needs Linux; this is {sys.platform})" for m in MECHANISMS}
    result = run_program("print('ok')", limits=Limits(seconds=30))
    if not result.setup:
        why = (result.stderr.strip().splitlines() or ["no report"])[-1][:200]
        return {m: f"off (the sandbox could not start: {why})" for m in MECHANISMS}
    table = {m: result.setup.get(m, "off") for m in MECHANISMS}
    if os.geteuid() == 0:
        table["user namespace"] = "not needed (root)"
    return table


def missing(table: dict[str, str]) -> list[str]:
    """The mechanisms of ``table`` that are off, each with its reason."""
    return [f"{m}: {v}" for m, v in table.items() if v.startswith(("off", "partly"))]


def render(table: dict[str, str]) -> str:
    width = max(map(len, table))
    return "\n".join(f"{m:<{width}}  {v}" for m, v in table.items())


__all__ = ["Limits", "ProgramResult", "run_program", "probe", "missing", "render", "environment",
           "hidden_paths", "python_paths", "launch_config", "launcher_argv", "sandbox_uid"]
