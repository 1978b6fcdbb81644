"""The signals a run handles, in one place: SIGINT / SIGTERM stop a run at a step boundary, SIGUSR1
carries the hang watchdog's abort into the main thread.

`StopSignals` is the one object both sides of a run use. A rank (`rank_signals`): the first SIGINT /
SIGTERM finishes the step, checkpoints and stops; the second exits at once. A signal the process was
started ignoring stays ignored (the local launcher's ranks ignore SIGINT, `ignore_sigint`: a Ctrl-C,
which reaches every process of the terminal, comes to them once, as the launcher's SIGTERM). A
launcher (`driver_signals`): the first is announced and passed on to the ranks; the second raises
KeyboardInterrupt (the ranks are then ended at once).

Python runs signal handlers in the main thread only, so away from it (a Ray actor's worker thread)
nothing is installed and `handle` returns None.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable, Iterable, Optional

STOP = (signal.SIGINT, signal.SIGTERM)


def handle(signums: Iterable[int], handler, keep_ignored: bool = False) -> Optional[Callable[[], None]]:
    """Install ``handler`` for each of ``signums`` (``keep_ignored``: not for one this process ignores);
    returns what puts the previous handlers back, or None away from the main thread (nothing installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    old = {sig: signal.signal(sig, handler) for sig in signums
           if not (keep_ignored and signal.getsignal(sig) is signal.SIG_IGN)}

    def restore() -> None:
        for sig, previous in old.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
    return restore


def ignore_sigint() -> None:
    """A rank of the local launcher: a Ctrl-C reaches it through the launcher alone (as SIGTERM)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class StopSignals:
    """SIGINT / SIGTERM while a run trains (a context manager). The first is recorded in `signum` and
    ``on_first(signum)`` is called from the handler; the next calls ``on_second(signum)``. `fresh` is
    true once after the first, for a loop that passes it on."""

    def __init__(self, on_first: Callable[[int], None], on_second: Callable[[int], None], keep_ignored: bool):
        self.on_first, self.on_second, self.keep_ignored = on_first, on_second, keep_ignored
        self.signum, self._passed_on, self._restore = 0, False, None

    def __enter__(self) -> "StopSignals":
        self._restore = handle(STOP, self._handle, self.keep_ignored)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum:
            self.on_second(signum)
            return
        self.signum = signum
        self.on_first(signum)

    def fresh(self) -> bool:
        """Whether a first signal came that has not been passed on yet (true once)."""
        if not self.signum or self._passed_on:
            return False
        self._passed_on = True
        return True

    def __exit__(self, *exc) -> None:
        if self._restore is not None:
            self._restore()


def rank_signals(say: Callable[[str], None]) -> StopSignals:
    """A rank's: the first signal is said (``say``, the run's console) and the run stops after the step
    with a checkpoint; the second ends the process at once, without saving."""
    def first(signum: int) -> None:
        say(f"[bold yellow]{signal.Signals(signum).name}[/]: saving a checkpoint after this step, then stopping "
            f"(send it again to stop at once, without saving).")
    return StopSignals(first, lambda signum: os._exit(128 + signum), keep_ignored=True)


def driver_signals(pass_on: Optional[Callable[[], None]] = None) -> StopSignals:
    """A launcher's, while its ranks run: the first signal is announced and, with ``pass_on``, passed on
    to the ranks from the handler itself (for a launcher whose main thread is blocked while the ranks
    run; else the launcher's loop polls `StopSignals.fresh`); the second raises KeyboardInterrupt."""
    def first(signum: int) -> None:
        print(f"verirl: {signal.Signals(signum).name}: every rank is asked to save a checkpoint after this "
              f"step and stop (send it again to stop them at once, without saving).", file=sys.stderr, flush=True)
        if pass_on is not None:
            pass_on()

    def second(signum: int) -> None:
        raise KeyboardInterrupt
    return StopSignals(first, second, keep_ignored=False)
