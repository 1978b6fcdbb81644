"""Real gloo ranks for the multi-process tests: a script run as ``world`` processes with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT (a free loopback port) and one thread each, as torchrun would start them."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def launch(tmp_path: Path, script: str, world: int = 2, *args: str, timeout: float = 300) -> list[str]:
    """Run ``script`` (Python source, written to tmp_path/rank.py) as ranks 0..world-1 with ``args``;
    each rank's output (stdout and stderr). Asserts every rank exits 0, showing all outputs when one does not."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "rank.py"
    path.write_text(script)
    procs = [subprocess.Popen([sys.executable, str(path), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                              "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                                              "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
                                              "MASTER_PORT": str(port)})
             for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:  # a rank stuck in a collective after another died
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), outs
    return outs


def result(out: str):
    """The JSON after ``RESULT `` on a rank's output."""
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT")).split(" ", 1)[1])


def results(tmp_path: Path, script: str, world: int = 2, *args: str, timeout: float = 300) -> list:
    """Each rank's RESULT (see `launch`)."""
    return [result(out) for out in launch(tmp_path, script, world, *args, timeout=timeout)]
