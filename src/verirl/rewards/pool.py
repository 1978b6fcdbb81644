"""Rule scoring in a process pool, every call under a timeout.

A call that outlives its deadline scores its samples 0 (counted as errors) and the pool is
replaced, since a stuck process cannot be interrupted; the run goes on.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Optional, Sequence

from verirl.rewards.custom import Rule, call_rule


def _ignore_sigint() -> None:
    """Ctrl-C reaches the whole process group: the trainer decides what happens, not its workers."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _warm(_: int = 0) -> int:
    import verirl.rewards.rules  # noqa: F401  (math-verify, sympy: import once per worker, not per call)
    return os.getpid()


class RewardPool:
    """``workers`` processes (spawned); ``timeout`` seconds per call."""

    def __init__(self, workers: int, timeout: float):
        self.workers, self.timeout = max(1, workers), timeout
        self._pool: Optional[mp.pool.Pool] = None
        self.restarts = 0

    def _get(self):
        if self._pool is None:
            self._pool = mp.get_context("spawn").Pool(self.workers, initializer=_ignore_sigint)
            self._pool.map(_warm, range(self.workers))
        return self._pool

    def start(self, calls: Sequence[tuple[Rule, list[str], list[dict]]]):
        """Send the calls to the workers and return at once; `collect` waits for them."""
        pool = self._get()
        return [pool.apply_async(call_rule, c) for c in calls], list(calls), time.monotonic()

    def collect(self, started) -> list[list[tuple[Optional[float], str]]]:
        pending, calls, start = started
        results: list[list[tuple[Optional[float], str]]] = []
        stuck = False
        for k, (fut, (rule, responses, _)) in enumerate(zip(pending, calls)):
            wave = k // self.workers + 1  # calls queue behind each other: the k-th may start late
            remaining = start + wave * self.timeout - time.monotonic()
            try:
                results.append(fut.get(timeout=max(remaining, 0.0)))
            except mp.TimeoutError:
                stuck = True
                results.append([(None, f"timed out after {self.timeout:g}s")] * len(responses))
        if stuck:
            self.close()  # the stuck worker is killed with the pool; a fresh one starts on the next call
            self.restarts += 1
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
