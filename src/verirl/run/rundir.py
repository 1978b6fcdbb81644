"""One run per directory: an exclusive OS file lock on RUN_DIR/.lock.

The lock is `flock` on an open file: the kernel releases it when the process exits, however it
exits (kill -9 included), so a dead run never leaves a stale lock behind. The file holds the
holder's pid, host and start time, for the message a second process prints.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator, Optional

from verirl.core.errors import CheckpointError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (verirl's supported platforms are POSIX)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
# Set by the process that started the ranks (verirl's launcher or the Ray driver) once it holds the
# lock: the ranks then leave it to it. A rank started by a bare `torchrun` does not see it, and its
# rank 0 takes the lock itself.
LOCK_HELD_ENV = "VERIRL_RUN_DIR_LOCKED_BY"


class RunDirLock:
    """``acquire()`` takes the run directory for this process or raises `CheckpointError` naming the
    process that holds it; ``release()`` (or the process's exit) gives it back."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None or fcntl is None:
            return
        path = self.run_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # read-only, no permission, or run_dir is no directory
            raise CheckpointError(f"trainer.run_dir='{self.run_dir}': cannot create its lock file {path} "
                                  f"({e.strerror}). Choose a trainer.run_dir on a writable disk.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            raise CheckpointError(
                f"trainer.run_dir='{self.run_dir}' is in use by another verirl run ({holder}); two runs in one "
                f"directory would mix their checkpoints and logs. Wait for it to finish, stop it, or choose "
                f"another trainer.run_dir.") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _describe(raw: bytes) -> str:
    try:
        info = json.loads(raw.decode())
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}"
    except (ValueError, KeyError, UnicodeDecodeError):
        return "a process that has not written its pid yet"


def lock_held_by_launcher(run_dir: Path) -> bool:
    """Whether the process that started this rank holds ``run_dir``'s lock."""
    return os.environ.get(LOCK_HELD_ENV) == str(Path(run_dir).resolve())


@contextlib.contextmanager
def held_by_launcher(run_dir: str) -> Iterator[None]:
    """The launcher's side: take ``run_dir``'s lock before any rank starts and hold it until every rank
    has ended (however they end); the ranks, which inherit the environment, see it held. A directory
    made only to hold the lock is removed again if the run wrote nothing into it."""
    path = Path(run_dir)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock = RunDirLock(path)
    try:
        lock.acquire()
    except BaseException:
        if made:
            _remove_if_empty(path)
        raise
    old = os.environ.get(LOCK_HELD_ENV)
    os.environ[LOCK_HELD_ENV] = str(path.resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(LOCK_HELD_ENV, None)
        else:
            os.environ[LOCK_HELD_ENV] = old
        lock.release()
        if made:
            _remove_if_empty(path)


def _remove_if_empty(path: Path) -> None:
    """Remove a run directory that holds nothing but the lock file."""
    try:
        if {p.name for p in path.iterdir()} <= {LOCK_NAME}:
            (path / LOCK_NAME).unlink(missing_ok=True)
            path.rmdir()
    except OSError:
        pass
