"""The hang watchdog: a heartbeat per phase, and a report when one runs too long.

Every named phase of a step (`verirl.train.step_metrics.Timer`: rollout, reward, old_log_prob, ref, update,
sync_weights) and of the loop (evaluation, checkpoint) beats when it starts. A thread checks the
current phase's age. Past ``trainer.stall_timeout_s``, it writes ``RUN_DIR/stall_<step>.txt``
(``stall_<step>_rank<r>.txt`` on other ranks, ``stall_<step>_producer<i>.txt`` on an asynchronous run's
producers): the phase, the rank, the reward calls outstanding
(rule, sample, how long) when scoring is what waits, and every thread's stack (faulthandler). It
prints the same in one paragraph. With ``on_stall=warn`` the run keeps waiting. A phase that ends
later is reported again only if it stalls again. With ``abort`` the main thread gets `StallAbort`
and the run ends. The last checkpoint stays whole, and the stall file says where the run was stuck.
"""
from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from verirl.core.errors import UserError
from verirl.run.signals import handle


class StallAbort(UserError):
    """trainer.on_stall=abort: a phase ran past trainer.stall_timeout_s."""


class Watchdog:
    def __init__(self, run_dir: Path, rank: int, timeout_s: float, on_stall: str,
                 outstanding: Callable[[], list[str]] = lambda: [], console_print: Callable[[str], None] = print,
                 side: str = ""):
        self.side = side  # "": a trainer rank; "producer 0": an asynchronous run's producer (its own stall file)
        self.run_dir, self.rank, self.timeout, self.on_stall = Path(run_dir), rank, float(timeout_s), on_stall
        self.outstanding, self.say = outstanding, console_print
        self.phases: list[tuple[str, float]] = []  # the nested phases running, with when each (re)started
        self.step = 0
        self.reported: Optional[tuple[str, float]] = None  # the phase already reported
        self.stall_files: list[Path] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._abort_reason: Optional[str] = None
        self._main = threading.main_thread().ident
        self._restore: Optional[Callable[[], None]] = None  # of the SIGUSR1 handler that raises StallAbort

    # -- the trainer's side

    def start(self) -> "Watchdog":
        if self.on_stall == "abort":  # in the main thread only (None elsewhere)
            self._restore = handle((signal.SIGUSR1,), self._raise)
        self._thread = threading.Thread(target=self._watch, name="verirl-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._restore is not None:
            self._restore()
            self._restore = None

    def enter(self, name: str) -> None:
        with self._lock:
            self.phases.append((name, time.monotonic()))

    def leave(self) -> None:
        """The innermost phase ended; the one around it beats again (its clock restarts)."""
        with self._lock:
            if self.phases:
                self.phases.pop()
            if self.phases:
                self.phases[-1] = (self.phases[-1][0], time.monotonic())

    def phase(self, name: str):
        """``with watchdog.phase("evaluation"): ...``"""
        import contextlib

        @contextlib.contextmanager
        def _cm():
            self.enter(name)
            try:
                yield
            finally:
                self.leave()
        return _cm()

    # -- the watching thread

    def _watch(self) -> None:
        every = max(min(self.timeout / 4, 5.0), 0.05)
        while not self._stop.wait(every):
            with self._lock:
                current = self.phases[-1] if self.phases else None
                step = self.step
            if current is None or current == self.reported or time.monotonic() - current[1] < self.timeout:
                continue
            self.reported = current
            self._report(current[0], time.monotonic() - current[1], step)

    def _report(self, phase: str, seconds: float, step: int) -> None:
        if self.side:
            name = f"stall_{step}_{self.side.replace(' ', '')}.txt"
        else:
            name = f"stall_{step}.txt" if self.rank == 0 else f"stall_{step}_rank{self.rank}.txt"
        path = self.run_dir / name
        calls = self.outstanding() if phase == "reward" else []
        where = self.side or f"rank {self.rank}"
        head = (f"verirl watchdog: phase '{phase}' of step {step} on {where} has run {seconds:.0f}s, past "
                f"trainer.stall_timeout_s={self.timeout:g}.")
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:  # a second stall in the same step (another phase) adds to the file
                f.write(head + "\n")
                if calls:
                    f.write("reward calls outstanding:\n" + "".join(f"  {c}\n" for c in calls))
                f.write("\nevery thread's stack (the main thread's is where the run waits):\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            self.stall_files.append(path)
            where = f" Stacks in {path}."
        except OSError as e:
            where = f" (could not write {path}: {e})"
        what = ("" if not calls else " Outstanding: " + "; ".join(calls) + ".")
        then = (" Ending the run (trainer.on_stall=abort)." if self.on_stall == "abort" else
                " Still waiting (trainer.on_stall=warn); raise trainer.stall_timeout_s if this phase is just slow.")
        self.say(head + what + where + then)
        if self.on_stall == "abort" and not self._stop.is_set():
            self._abort_reason = head + what + where
            if self._restore is not None:  # StallAbort in the main thread, once it runs Python again
                signal.pthread_kill(self._main, signal.SIGUSR1)
                if not self._stop.wait(60):  # stuck inside C (a collective, a device sync): end the process
                    self._exit()
            else:  # not started from the main thread (a Ray actor's worker thread): no way to raise there
                self._exit()

    def _exit(self) -> None:
        print("verirl watchdog: ending the process (exit status 2); the last checkpoint is whole.",
              file=sys.stderr, flush=True)
        import os
        os._exit(2)

    def _raise(self, signum, frame) -> None:
        raise StallAbort(f"{self._abort_reason} The run was ended by trainer.on_stall=abort; its last checkpoint "
                         f"is whole, and the same command continues from it.")
