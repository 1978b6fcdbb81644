"""The run directory: one run per directory (an exclusive OS file lock on RUN_DIR/.lock), the
checkpoint a run continues from, clearing a previous run, its metrics file, and a failed write
told as the user's problem (a full disk, no permission) when it is one.

The lock is `flock` on an open file: the kernel releases it when the process exits, however it
exits (kill -9 included), so a dead run never leaves a stale lock behind. The file holds the
holder's pid, host and start time, for the message a second process prints.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
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


RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "summary.json")
TRACKER_DIRS = ("tensorboard", "mlruns", "wandb", "swanlog")  # log.backends' files (`verirl.run.trackers`)


def metrics_file(path: Path) -> Path:
    """The metrics file of ``path``: RUN_DIR/metrics.jsonl of a run directory (one line per step; step 0
    is the evaluation before training), or ``path`` itself when it names a file."""
    path = Path(path)
    return path if path.is_file() else path / "metrics.jsonl"


def checkpoint_to_resume(run_dir: str, resume: str, overwrite: bool) -> Optional[Path]:
    """The checkpoint to continue from (None: start fresh), per trainer.resume. With resume=false, a
    previous run in ``run_dir`` is refused unless ``overwrite`` (then `clear_previous_run` clears it once
    the new run's inputs have loaded)."""
    from verirl.run.checkpoint import find_checkpoint  # torch: not for the lock and the tools' readers

    run_dir_path = Path(run_dir)
    mode = str(resume).lower()
    if mode in ("false", "none", ""):
        has_run = (run_dir_path / "checkpoints").exists() or metrics_file(run_dir_path).exists()
        if has_run and not overwrite:
            raise CheckpointError(
                f"trainer.run_dir='{run_dir}' already holds a run (checkpoints or metrics.jsonl) and "
                f"trainer.resume=false. Continue it with trainer.resume=auto, start over with "
                f"trainer.overwrite=true (deletes it), or choose a new trainer.run_dir.")
        return None
    if mode == "auto":
        return find_checkpoint(run_dir_path) if (run_dir_path / "checkpoints").exists() else None
    found = find_checkpoint(Path(resume))
    if found is None:
        raise CheckpointError(f"trainer.resume='{resume}': no complete checkpoint there. Give "
                              f"RUN_DIR/checkpoints/step_N, or a run directory that has checkpoints.")
    return found


def clear_previous_run(run_dir: Path) -> None:
    """Delete a previous run's checkpoints, final model, logs, tracker files, report and stall reports
    from ``run_dir`` (trainer.overwrite)."""
    for name in ("checkpoints", "final", *TRACKER_DIRS, "report"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for stall in run_dir.glob("stall_*.txt"):
        stall.unlink(missing_ok=True)


def last_good(run_dir: Path) -> str:
    """Where a run that stops now can continue from, said in a clause."""
    latest = run_dir / "checkpoints" / "latest"
    if latest.exists():
        return f"the last checkpoint, {latest.read_text().strip()}, is intact"
    return "no checkpoint had been written yet"


def write_failure(run_dir: Path, what: str, e: Exception, after: str) -> Exception:
    """A failed write as the user's problem (no space, no permission) or, if it is neither, the bug it is."""
    code, text = getattr(e, "errno", None), str(e)
    full = code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or any(
        s in text for s in ("No space left", "File too large", "Disk quota", "file write failed"))
    denied = code in (errno.EACCES, errno.EPERM, errno.EROFS) or any(
        s in text for s in ("Permission denied", "Read-only file system"))
    if not (full or denied):
        return e
    try:
        free = f"{shutil.disk_usage(run_dir).free / 2**30:.1f} GB free there"
    except OSError:
        free = "free space unknown"
    why = "the disk is full (or a file size limit was hit)" if full else "it is not writable"
    return CheckpointError(f"could not write {what} into trainer.run_dir='{run_dir}': {why} ({free}; "
                           f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}){'; ' + after if after else ''}. "
                           f"Free space or fix the permissions and run the same command again, or choose "
                           f"another trainer.run_dir.")


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, a failure told by `write_failure`."""
    try:
        path.write_text(text)
    except OSError as e:
        raise write_failure(path.parent, str(path), e, "") from e


def raise_write_failure(run_dir: Path, what: str, e: Exception) -> None:
    """Raise a failed write of ``what``: as `write_failure` tells it (with where the run can continue
    from), or as it is when it is not the user's problem."""
    failure = write_failure(run_dir, what, e, last_good(run_dir))
    if failure is e:
        raise e
    raise failure from e
