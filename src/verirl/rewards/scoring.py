"""Apply configured rules to a batch: weights, task routing, errors that never stop a run."""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from verirl.rewards.custom import DEFAULT_MAX_ABS_SCORE, Rule, call_rule, check_score, load_rule
from verirl.rewards.pool import RewardPool, SandboxSpec
from verirl.rewards.service import Service, ServiceScores
from verirl.sandbox import hidden_paths

_told_in_process = False  # the "no timeout" line is printed once per process
_told_no_sandbox = False


def _say_no_sandbox_here() -> None:
    global _told_no_sandbox
    if not _told_no_sandbox:
        _told_no_sandbox = True
        print(f"reward.sandbox: the sandbox needs Linux (this is {sys.platform}); rules run in plain workers, "
              f"with this user's files, network and environment (docs/sandbox.md).", file=sys.stderr)


@dataclass
class RewardResult:
    totals: list[float]  # (N,) weighted sum of the rules that apply to each sample
    per_rule: dict[str, list[Optional[float]]]  # rule name -> (N,) score, None where the rule does not apply
    errors: int = 0  # scores that failed (raised, timed out, NaN, wrong length) and counted 0
    counts: dict[str, float] = field(default_factory=dict)  # the services' counters (reward/code/compile_errors)

    @staticmethod
    def concat(parts: Sequence["RewardResult"], errors: Optional[int] = None) -> "RewardResult":
        """``parts`` one after the other; their errors and counts summed (``errors``: that many instead)."""
        counts: dict[str, float] = {}
        for p in parts:
            for k, v in p.counts.items():
                counts[k] = counts.get(k, 0.0) + v
        return RewardResult([t for p in parts for t in p.totals],
                            {k: [v for p in parts for v in p.per_rule[k]] for k in parts[0].per_rule},
                            sum(p.errors for p in parts) if errors is None else errors, counts)

    def rows(self, start: int, stop: int) -> "RewardResult":
        """Responses ``start`` to ``stop``, without the errors and counts (they are the whole batch's)."""
        return RewardResult(self.totals[start:stop], {k: v[start:stop] for k, v in self.per_rule.items()})

    def metrics(self, tasks: Sequence[str], sources: Sequence[Optional[str]] = ()) -> dict[str, float]:
        """reward/mean, reward/<rule>/mean over applicable samples only, reward/task/<task>/mean, and
        reward/data_source/<source>/mean for the samples whose prompt has a data source (veRL's rows)."""
        out = {"reward/mean": sum(self.totals) / max(len(self.totals), 1), "reward/errors": float(self.errors),
               **self.counts}
        for rule, scores in self.per_rule.items():
            vals = [s for s in scores if s is not None]
            if vals:  # a batch without this rule's task logs nothing rather than a zero
                out[f"reward/{rule}/mean"] = sum(vals) / len(vals)
        for task in sorted(set(tasks)):
            vals = [t for t, k in zip(self.totals, tasks) if k == task]
            out[f"reward/task/{task}/mean"] = sum(vals) / len(vals)
        for source in sorted({s for s in sources if s}):
            vals = [t for t, s in zip(self.totals, sources) if s == source]
            out[f"reward/data_source/{source}/mean"] = sum(vals) / len(vals)
        return out


class Scorer:
    """The configured rules, with weights and task routing, scored in a pool (``workers > 0``:
    each call under ``timeout`` seconds from its start and, on Linux, ``max_memory_mb`` of address
    space; see `verirl.rewards.pool`; with ``sandbox``, each worker in `verirl.sandbox`, which also
    covers the paths ``hide``, the run directory) or in this process (``workers == 0``, for debugging: no
    timeout, no memory cap, output not captured; said once on stderr). A score that is not a
    number, not finite or beyond +-``max_abs_score`` is an error, like a rule that raises.
    ``services``: the verifiers that are services (`verirl.rewards.service`), each scoring in a thread
    of this process while the pool scores the rest."""

    def __init__(self, verifiers: Sequence[str], weights: Sequence[float],
                 task_rules: Optional[Mapping[str, Sequence[str]]] = None, workers: int = 0,
                 timeout: float = 10.0, chunk: int = 16, max_memory_mb: int = 0,
                 max_abs_score: float = DEFAULT_MAX_ABS_SCORE, sandbox: bool = False,
                 hide: Sequence[str] = (), say: bool = True, services: Optional[Mapping[str, Service]] = None):
        global _told_in_process
        self.services = dict(services or {})
        self.rules = [Rule(v, v, True, None) if v in self.services else load_rule(v) for v in verifiers]
        if sandbox and not sys.platform.startswith("linux") and workers > 0:
            _say_no_sandbox_here()
            sandbox = False
        pooled = tuple(r.spec for r in self.rules if r.name not in self.services)
        spec = SandboxSpec(tuple(hidden_paths(tuple(hide))), pooled) if sandbox else None
        self._threads: Optional[ThreadPoolExecutor] = None
        by_ref = {r.spec: r for r in self.rules} | {r.name: r for r in self.rules}
        self.weights = {r.name: float(w) for r, w in zip(self.rules, weights)}
        self.task_rules = {t: [by_ref[n] for n in names] for t, names in (task_rules or {}).items()}
        self.max_abs_score = float(max_abs_score)
        self.pool = RewardPool(workers, timeout, max_memory_mb, self.max_abs_score, spec) if workers > 0 else None
        self.chunk = chunk
        self._warned: set[tuple[str, str]] = set()
        if self.pool is None and say and not _told_in_process:  # say: False on all ranks but the first
            _told_in_process = True
            print("reward.workers=0: rules are scored in this process, with no timeout, no memory cap and no "
                  "sandbox (reward.timeout, reward.max_memory_mb and reward.sandbox apply only with workers > 0).",
                  file=sys.stderr)

    def __call__(self, responses: Sequence[str], samples: Sequence[dict]) -> RewardResult:
        return self.submit(responses, samples).result()

    def submit(self, responses: Sequence[str], samples: Sequence[dict]) -> "PendingRewards":
        """Start scoring and return at once (with a pool): the trainer runs its log-prob passes
        while the workers score, then calls ``.result()``."""
        calls, where, served = [], [], []
        for rule in self.rules:
            idx = [i for i, s in enumerate(samples) if rule in self.task_rules.get(s.get("task"), self.rules)]
            if rule.name in self.services:
                if idx:
                    served.append((rule, idx, self._serve(rule.name, [responses[i] for i in idx],
                                                          [samples[i] for i in idx])))
                continue
            size = len(idx) if rule.batched else self.chunk  # a list rule sees all its samples at once
            for c in range(0, len(idx), max(size, 1)):
                part = idx[c:c + size]
                calls.append((rule, [responses[i] for i in part], [samples[i] for i in part]))
                where.append(part)
        if self.pool:
            started = self.pool.start(calls)
        else:
            started = []
            try:
                for c in calls:
                    self.current = c  # what a stall report names while a rule runs in this process
                    started.append(call_rule(*c, self.max_abs_score))
            finally:
                self.current = None
        return PendingRewards(self, responses, samples, calls, where, started, served)

    def _serve(self, name: str, responses: list[str], samples: list[dict]) -> "Future[ServiceScores]":
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max(len(self.services), 1), thread_name_prefix="verirl-reward-service")
        return self._threads.submit(self.services[name].score, responses, samples)

    def applies(self, rule_names: Sequence[str], sample: dict) -> bool:
        """Whether one of ``rule_names`` scores ``sample`` (is configured and routed to its task)."""
        return any(r.name in rule_names for r in self.task_rules.get(sample.get("task"), self.rules))

    def apply(self, calls: Sequence[tuple[str, Sequence[int]]], responses: Sequence[str],
              samples: Sequence[dict]) -> list[list[object]]:
        """For each (``module:function``, indices): the function's value on those responses (None where
        it failed or ran out of time), computed as rules are scored: in the pool, each call under
        ``timeout`` (evaluation's answer extraction and answer check run this way)."""
        jobs, where = [], []
        step = max(self.chunk, 1)
        for k, (spec, idx) in enumerate(calls):
            helper = dataclasses.replace(load_rule(spec), scores=False)
            for c in range(0, len(idx), step):
                part = list(idx[c:c + step])
                jobs.append((helper, [responses[i] for i in part], [samples[i] for i in part]))
                where.append((k, c))
        if self.pool:
            results = self.pool.collect(self.pool.start(jobs))
        else:
            results = [call_rule(*job, self.max_abs_score) for job in jobs]
        out: list[list[object]] = [[None] * len(idx) for _, idx in calls]
        for (k, c), res in zip(where, results):
            out[k][c:c + len(res)] = [value for value, _ in res]
        return out

    def outstanding(self) -> list[str]:
        """The scoring calls running now, one line each (the hang watchdog's report)."""
        served = [line for s in self.services.values() for line in s.outstanding()]
        if self.pool is not None:
            return self.pool.outstanding() + served
        c = getattr(self, "current", None)
        if c is None:
            return served
        rule, responses, samples = c
        return [f"rule '{rule.name}' (in this process) on {len(responses)} response(s), the first with label "
                f"{samples[0].get('label')!r} task {samples[0].get('task')!r}: {responses[0][:120]!r}"]

    def _finish(self, responses, samples, calls, where, results, served) -> RewardResult:
        per_rule: dict[str, list[Optional[float]]] = {r.name: [None] * len(responses) for r in self.rules}
        totals, errors, counts = [0.0] * len(responses), 0, {}
        for rule, idx, done in served:
            calls, where, results = [*calls, (rule, None, None)], [*where, idx], [*results, self._checked(done, idx)]
            for k, v in done.counts.items():
                counts[k] = counts.get(k, 0.0) + v
        for (rule, _, _), part, res in zip(calls, where, results):
            for i, (score, why) in zip(part, res):
                if score is None:
                    errors += 1
                    self._warn_once(rule, why, responses[i], samples[i])
                    score = 0.0
                per_rule[rule.name][i] = score
                totals[i] += self.weights[rule.name] * score
        return RewardResult(totals, per_rule, errors, counts)

    def _checked(self, done: ServiceScores, idx: Sequence[int]) -> list[tuple[Optional[float], str]]:
        """A service's scores under the rules' own checks: finite, within reward.max_abs_score, one per
        response."""
        if len(done.scores) != len(idx):
            return [(None, f"returned {len(done.scores)} scores for {len(idx)} responses")] * len(idx)
        return [check_score(score, self.max_abs_score) if score is not None else (None, why)
                for score, why in done.scores]

    def _warn_once(self, rule: Rule, why: str, response: str, sample: dict) -> None:
        head, _, printed = why.partition("\n")  # a pool's reason may end with the lines the rule printed
        kind = re.sub(r"'[^']*'|-?\d[\w.+-]*", "#", head.split(":")[0])  # "returned str '1e9'" ~ "returned str '7'"
        if (rule.name, kind) in self._warned:
            return
        self._warned.add((rule.name, kind))
        said = "".join(f"\n    {line}" for line in printed.splitlines())
        print(f"reward rule '{rule.name}' {head} on response {response[:120]!r} (label {sample.get('label')!r}, "
              f"task {sample.get('task')!r}); scored 0. Further such errors are only counted in reward/errors."
              + (f" The last lines it printed:{said}" if said else ""), file=sys.stderr)

    def close(self) -> None:
        """Stop the pool's workers and the services (safe to call twice; a later call starts new ones)."""
        if self.pool:
            self.pool.close()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        for s in self.services.values():
            s.close()


class PendingRewards:
    """Scores on their way; ``result()`` waits (each call still under the pool's timeout)."""

    def __init__(self, scorer: Scorer, responses, samples, calls, where, started, served=()):
        self._args = (scorer, responses, samples, calls, where, started, served)

    def result(self) -> RewardResult:
        scorer, responses, samples, calls, where, started, served = self._args
        results = scorer.pool.collect(started) if scorer.pool else started
        done = [(rule, idx, future.result()) for rule, idx, future in served]  # a service raising is a bug: it says
        return scorer._finish(responses, samples, calls, where, results, done)


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def score_batch(responses: Sequence[str], labels: Sequence[str], tasks: Sequence[str],
                verifiers: Sequence[str], weights: Sequence[float],
                task_rules: Optional[Mapping[str, Sequence[str]]] = None) -> RewardResult:
    """One-off, in-process scoring (no pool): for tests and small scripts."""
    samples = [{"label": l, "task": t} for l, t in zip(labels, tasks)]
    return Scorer(verifiers, weights, task_rules, workers=0)(responses, samples)
