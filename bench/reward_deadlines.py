"""What a hanging reward rule costs a step: verirl's scoring pool (a deadline per call from its
start, the late worker replaced at once, the rule's queued calls in that batch given up) against
the pool verirl had before (`multiprocessing.Pool`, deadlines per wave of calls counted from
submission, the whole pool terminated after a stuck call), same rule, same process run.

    .venv/bin/python bench/reward_deadlines.py --calls 8 --workers 2 --timeout 2

Each pool is started and warmed outside the timing; a batch is ``--calls`` calls of a rule that
sleeps for an hour plus ``--calls`` calls of the built-in `format` rule, and the time is from
submitting the batch to having every score. The last lines compare the two on ``--calls`` x 64
quick calls (`format`, one response each), where only the per-call overhead of the pools shows.
Then the sandbox's cost (reward.sandbox=true against false): the start of a worker, a quick call
through a warm sandboxed worker against a plain one, and one `verirl.sandbox.run_program` (a fresh
sandbox per program, what the `code` reward pays per test run).
"""
from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from verirl.rewards import Scorer
from verirl.rewards.custom import call_rule, load_rule

HANG = "import time\n\ndef hang(response, label):\n    time.sleep(3600)\n    return 1.0\n"


class WavePool:
    """The peer: verirl's pool before the per-call deadlines, kept here only to be measured."""

    def __init__(self, workers: int, timeout: float):
        self.workers, self.timeout = workers, timeout
        self.pool = mp.get_context("spawn").Pool(workers)

    def score(self, calls):
        start = time.monotonic()
        pending = [self.pool.apply_async(call_rule, c) for c in calls]
        out, stuck = [], False
        for k, fut in enumerate(pending):
            wave = k // self.workers + 1
            try:
                out.append(fut.get(timeout=max(start + wave * self.timeout - time.monotonic(), 0.0)))
            except mp.TimeoutError:
                stuck = True
                out.append([(None, "timed out")] * len(calls[k][1]))
        if stuck:
            self.close()
            self.pool = mp.get_context("spawn").Pool(self.workers)
        return out

    def close(self):
        self.pool.terminate()
        self.pool.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hang_rule.py"
        path.write_text(HANG)
        spec = f"{path}:hang"
        responses, samples = ["x"] * args.calls, [{"label": "1"}] * args.calls
        ours = Scorer([spec, "format"], [1.0, 1.0], {"warm": ["format"]}, workers=args.workers,
                      timeout=args.timeout, chunk=1)
        ours(["warm"] * args.workers, [{"label": "1", "task": "warm"}] * args.workers)  # start the workers
        t0 = time.perf_counter()
        res = ours(responses, samples)
        t_ours = time.perf_counter() - t0
        assert res.errors == args.calls, res.errors

        peer = WavePool(args.workers, args.timeout)
        peer.pool.map(abs, range(args.workers))
        rule, fmt = load_rule(spec), load_rule("format")
        calls = [(rule, ["x"], [{"label": "1"}])] * args.calls + [(fmt, ["x"], [{"label": "1"}])] * args.calls
        t0 = time.perf_counter()
        peer.score(calls)
        t_peer = time.perf_counter() - t0

        waves = math.ceil(args.calls / args.workers)
        print(f"hanging rule: {args.calls} calls (+{args.calls} quick ones), {args.workers} workers, "
              f"timeout {args.timeout:g} s ({waves} waves)")
        print(f"{'pool':>24} {'seconds':>8}")
        print(f"{'verirl (per call)':>24} {t_ours:>8.2f}")
        print(f"{'before (per wave)':>24} {t_peer:>8.2f}")
        print(f"{'ratio before / verirl':>24} {t_peer / t_ours:>8.2f}")

        quick = ["<think>a</think><answer>b</answer>"] * (args.calls * 64)
        fmt_only = Scorer(["format"], [1.0], workers=args.workers, timeout=args.timeout, chunk=1)
        fmt_only(quick[:4], [{"label": "1"}] * 4)
        t0 = time.perf_counter()
        fmt_only(quick, [{"label": "1"}] * len(quick))
        t_ours_q = time.perf_counter() - t0
        t0 = time.perf_counter()
        peer.score([(fmt, [q], [{"label": "1"}]) for q in quick])
        t_peer_q = time.perf_counter() - t0
        print(f"{len(quick)} quick calls: verirl {t_ours_q * 1e6 / len(quick):.0f} us a call, before "
              f"{t_peer_q * 1e6 / len(quick):.0f} us a call (ratio {t_peer_q / t_ours_q:.2f})")
        ours.close()
        fmt_only.close()
        peer.close()
        sandbox_cost(quick, args.workers, args.timeout)


def sandbox_cost(quick: list[str], workers: int, timeout: float) -> None:
    from verirl.sandbox import run_program

    per_call, start = {}, {}
    for sandbox in (False, True):
        scorer = Scorer(["format"], [1.0], workers=workers, timeout=timeout, chunk=1, sandbox=sandbox)
        t0 = time.perf_counter()
        scorer(quick[:workers], [{"label": "1"}] * workers)  # the workers start
        start[sandbox] = time.perf_counter() - t0
        t0 = time.perf_counter()
        scorer(quick, [{"label": "1"}] * len(quick))
        per_call[sandbox] = (time.perf_counter() - t0) / len(quick)
        scorer.close()
    runs = 20
    run_program("pass")
    t0 = time.perf_counter()
    for _ in range(runs):
        assert run_program("print(1)").stdout == "1\n"
    program = (time.perf_counter() - t0) / runs
    print(f"sandbox: {workers} workers start in {start[True]:.2f} s sandboxed, {start[False]:.2f} s plain")
    print(f"sandbox: {len(quick)} quick calls: sandboxed {per_call[True] * 1e6:.0f} us a call, plain "
          f"{per_call[False] * 1e6:.0f} us a call (ratio {per_call[True] / per_call[False]:.2f})")
    print(f"sandbox: run_program('print(1)'), a fresh sandbox each: {program * 1e3:.1f} ms a program")


if __name__ == "__main__":
    main()
