"""Hostile programs for `verirl.sandbox.run_program` and whether the sandbox held each (standard library
and verirl.sandbox only: tests/test_sandbox.py also runs it as an unprivileged user with the system
Python)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from verirl.sandbox import Limits, run_program

ALLOWED_ENV = {"PATH", "HOME", "TMPDIR", "LANG"}


def _alive(marker: str) -> list[int]:
    """Processes on this machine named ``marker`` (by comm or by argv[0])."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if marker[:15] in (comm, argv0[:15]) or argv0 == marker:
            found.append(int(pid))
    return found


HOSTILE_PROGRAMS = {
    "write": ("open({path!r}, 'a').write('x')", lambda r, ctx: r.returncode != 0 and ctx["file"].read_text() == "keep"),
    "setsid": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
               "        import ctypes; ctypes.CDLL(None).prctl(15, b'{marker}', 0, 0, 0); time.sleep(600)\n"
               "    os._exit(0)\ntime.sleep(0.3)\n"
               "print(sum(open(f'/proc/{{p}}/comm').read().strip() == '{marker}' for p in os.listdir('/proc') "
               "if p.isdigit()))",
               lambda r, ctx: r.ok and r.stdout == "1\n"),  # alive while the program ran
    "connect": ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('in')\n"
                "except OSError:\n    print('out')", lambda r, ctx: r.stdout == "out\n"),
    "environ": ("print(sorted({{kv.split('=')[0] for kv in open('/proc/self/environ').read().split(chr(0)) if kv}}))",
                lambda r, ctx: set(json.loads(r.stdout.replace("'", '"'))) <= ALLOWED_ENV),
    "memory": ("bytearray(8 * 2**30)", lambda r, ctx: "MemoryError" in r.stderr),
    "loop": ("while True: pass", lambda r, ctx: r.timed_out and r.seconds < 5),
    "print": ("print('y' * 100_000_000)", lambda r, ctx: r.truncated and len(r.stdout) == Limits().output_bytes),
    "stdin": ("import sys; print(sys.stdin.read()[::-1])", lambda r, ctx: r.ok and r.stdout == "cba\n"),
    # clears its parent-death signal and never ends: the launcher ends it at the deadline all the same
    "undying": ("import ctypes, time\nlibc = ctypes.CDLL(None)\nlibc.prctl(1, 0, 0, 0, 0)\n"
                "libc.prctl(15, b'{marker}', 0, 0, 0)\nwhile True: time.sleep(1)",
                lambda r, ctx: r.timed_out),
    "terminal": ("import os; print(os.path.exists('/dev/tty'), os.getsid(0) == os.getpid(), sorted(os.listdir('/dev')))",
                 lambda r, ctx: r.stdout.startswith("False True ['fd', 'full', 'null', 'random', 'shm', 'stderr'")),
    "sockets": ("import os; print(os.listdir('/run'))", lambda r, ctx: r.stdout == "[]\n"),
    "hidden": ("import os; print(os.path.exists({secret!r}), os.listdir({secret_dir!r}))",
               lambda r, ctx: r.stdout == "False []\n"),
}


def _hostile_programs(directory: Path) -> dict[str, bool]:
    """Each program of HOSTILE_PROGRAMS run through `run_program`; whether the sandbox held."""
    secret_dir = Path(tempfile.mkdtemp(prefix="verirl-hidden-", dir="/var/tmp"))  # outside /tmp: really hidden
    (secret_dir / "secret.txt").write_text("token")
    os.chmod(secret_dir, 0o755)
    target = directory / "target.txt"
    target.write_text("keep")
    os.chmod(target, 0o666)
    server = socket.create_server(("127.0.0.1", 0))
    ctx = {"file": target}
    marker = f"vsprog{os.getpid() % 10**6}"  # this run's alone
    held = {}
    try:
        for name, (code, ok) in HOSTILE_PROGRAMS.items():
            code = code.format(path=str(target), port=server.getsockname()[1], marker=marker,
                               secret=str(secret_dir / "secret.txt"), secret_dir=str(secret_dir))
            result = run_program(code, stdin="abc" if name == "stdin" else "", hide=(str(secret_dir),),
                                 limits=Limits(seconds=2 if name in ("loop", "undying") else 20))
            held[name] = bool(ok(result, ctx))
    finally:
        server.close()
        shutil.rmtree(secret_dir, ignore_errors=True)
    time.sleep(0.5)
    held["nothing left"] = not _alive(marker)
    return held


