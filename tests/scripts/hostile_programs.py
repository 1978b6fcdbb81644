"""Hostile programs for `verirl.sandbox.run_program` and whether the sandbox held each (standard library
and verirl.sandbox only: tests/test_sandbox.py also runs it as an unprivileged user with the system
Python)."""
from __future__ import annotations

import json
import os
import socket
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
}


def _hostile_programs(directory: Path) -> dict[str, bool]:
    """Each program of HOSTILE_PROGRAMS run through `run_program`; whether the sandbox held."""
    target = directory / "target.txt"
    target.write_text("keep")
    os.chmod(target, 0o666)
    server = socket.create_server(("127.0.0.1", 0))
    ctx = {"file": target}
    marker = f"vsprog{os.getpid() % 10**6}"  # this run's alone
    held = {}
    try:
        for name, (code, ok) in HOSTILE_PROGRAMS.items():
            code = code.format(path=str(target), port=server.getsockname()[1], marker=marker)
            result = run_program(code, stdin="abc" if name == "stdin" else "",
                                 limits=Limits(seconds=2 if name == "loop" else 20))
            held[name] = bool(ok(result, ctx))
    finally:
        server.close()
    time.sleep(0.2)
    held["nothing left"] = not _alive(marker)
    return held


