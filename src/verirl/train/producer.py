"""The producer of an asynchronous run (rollout.placement=separate, docs/async.md): a process of its own
that generates and scores steps while the trainers update.

It holds its own copy of the model, the rollout engine, the training prompts and their sampler, the
reward rules and (multi-turn) the tools, built from the same config as the trainer's. It takes jobs from
the trainer's `verirl.train.async_source.RolloutSource` one at a time: "step t, from weights version v
(``fixed``: exactly v; ``bounded``: the newest, at least v), the prompt sampler at position p". It loads
that version out of the `WeightStore`, runs the same `verirl.train.step.produce` a synchronous step runs
(so a run with max_staleness=0 samples exactly what the synchronous one does), waits for the scores, and
sends the result back. With partial rollouts the native engine loads each newer version between decoding
steps and records which version sampled each token.

The producer dies with its trainer (the parent-death signal, and the job queue's end), ignores Ctrl-C
(the trainer saves and stops it), and reports its own error, traceback included, as its last result.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from verirl.config import Config, load_config_dict
from verirl.core.errors import UserError
from verirl.core.types import Prompt, Rollout
from verirl.data import PromptSampler
from verirl.data.dataset import load_data
from verirl.models import load_model
from verirl.rollout import Engine
from verirl.rollout.multiturn import MultiTurn
from verirl.rewards import Scorer
from verirl.run.watchdog import Watchdog
from verirl.train.distributed import Dist
from verirl.train.settings import StepSettings
from verirl.train.weight_store import WeightStore, named_weights


@dataclass(frozen=True)
class Job:
    """One step for a producer to generate."""
    step: int
    version: int  # fixed: the weights version to sample with; bounded: the oldest allowed
    exact: bool  # True: exactly ``version`` (mode fixed)
    position: Optional[int]  # the prompt sampler's position to start from; None: where the last job left it


@dataclass
class Produced:
    """A producer's answer to a `Job`: the step's whole batch, scored, as plain values."""
    step: int
    prompts: list[Prompt]  # one per group, in batch order
    groups: int  # the groups the step trains on (fewer than data.prompts_per_step after a short filtered step)
    rollout: Rollout  # on the host
    texts: list[str]
    logged: object  # `ShapedRewards` of the batch
    stats: dict[str, float]
    episodes: list[dict]
    versions: list[list[list[int]]]  # (N,) each response's [[version, tokens], ...] runs, in token order
    position: int  # the prompt sampler's position after the step
    seconds: dict[str, float]  # the producer's phases: rollout, reward, tools
    idle_s: float  # how long the producer waited for this job and its weights
    producer: int = 0


@dataclass(kw_only=True)
class ProducerParts:
    """What `verirl.train.step.produce` reads, the producer's own: a one-rank view of the run."""
    dist: Dist
    model: torch.nn.Module
    tokenizer: object
    pad_id: int
    stop_ids: list[int]
    engine: Engine
    multi_turn: Optional[MultiTurn]
    environments: Optional[object]
    train: list[Prompt]
    sampler: PromptSampler
    step: StepSettings
    scorer: Scorer
    watchdog: Watchdog
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # the model's tensors the store loads into

    def close(self) -> None:
        self.scorer.close()
        if self.environments is not None:
            self.environments.close()
        self.engine.close()


def build_parts(cfg: Config, index: int, say=None) -> ProducerParts:
    """The producer's model, engine, prompts, sampler, rules and tools, from the run's config (the same
    prompts in the same order as the trainer's: `verirl.train.build` makes both)."""
    from verirl.config.layout import reward_workers_per_rank
    from verirl.models.lora import apply_lora
    from verirl.train.build import (build_scorer, environments, lora_settings, multi_turn, rollout_engine,
                                    seed_everything, step_settings, with_tools)

    seed_everything(cfg.trainer.seed)
    lm = load_model(cfg.model.path, cfg.model.dtype, producer_device(cfg, index), dict(cfg.model.override_config))
    if lora_settings(cfg) is not None:  # the trainer's layout: its weights (adapters included) arrive by name
        apply_lora(lm.model, lora_settings(cfg))
    lm.model.requires_grad_(False)
    envs = environments(cfg, lm.tokenizer, hide=(cfg.trainer.run_dir,))
    train, _, stop_ids = load_data(cfg.data, cfg.eval.size, lm)
    train = with_tools(train, lm.tokenizer, envs, cfg.data, "")
    engine, train, order = rollout_engine(cfg, lm, stop_ids, train, producer=True)
    scorer = build_scorer(cfg.reward, reward_workers_per_rank(cfg), hide=(cfg.trainer.run_dir,), say=False,
                          device=str(next(lm.model.parameters()).device), dtype=cfg.model.dtype)
    dist = Dist.single()
    t = cfg.trainer
    return ProducerParts(
        dist=dist, model=lm.model, tokenizer=lm.tokenizer, pad_id=lm.pad_id, stop_ids=stop_ids, engine=engine,
        multi_turn=multi_turn(cfg, engine, lm.tokenizer, envs, stop_ids, lm.pad_id), environments=envs, train=train,
        sampler=PromptSampler(len(train), cfg.data.seed, order),
        step=step_settings(cfg, lm.model, 1, 1.0),  # perf/mfu is the trainer's
        scorer=scorer, weights=named_weights(lm.model),
        watchdog=Watchdog(Path(t.run_dir), 0, t.stall_timeout_s, t.on_stall, scorer.outstanding,
                          say or _stderr, side=f"producer {index}"))


def producer_device(cfg: Config, index: int) -> str:
    """Producer ``index``'s device: the one after the trainers' on an accelerator, the CPU on a CPU."""
    from verirl.config.layout import world_size
    from verirl.models.device import resolve_device

    device = resolve_device(cfg.model.device)
    if device in ("cuda", "npu"):
        return f"{device}:{world_size(cfg) + index}"
    return cfg.model.device


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the trainer that started this process dies (Linux); Ctrl-C and SIGTERM (which reach the
    whole process group) are left to the trainer, which saves a checkpoint and then stops this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # the job queue's polling below still notices
    if os.getppid() != parent:
        os._exit(1)


def producer_main(cfg_dict: dict, index: int, store: WeightStore, jobs, results, parent: int,
                  partial: bool) -> None:
    """The producer process: jobs in, `Produced` out, until a None job (or the trainer is gone)."""
    _die_with_parent(parent)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    parts = None
    try:
        cfg = load_config_dict(cfg_dict)
        from verirl.config.layout import threads_per_rank

        torch.set_num_threads(threads_per_rank(cfg))
        parts = build_parts(cfg, index)
        parts.watchdog.start()
        _answer(results, ("ready", index))
        serve(parts, store, jobs, results, parent, partial, index)
    except BaseException as e:  # noqa: BLE001 - sent to the trainer, which raises it there
        kind = "user" if isinstance(e, UserError) else "oom" if isinstance(e, torch.OutOfMemoryError) else "bug"
        with contextlib.suppress(BaseException):
            _answer(results, ("error", index, kind, f"{type(e).__name__}: {e}", traceback.format_exc()))
        _close(parts)
        os._exit(1)
    _close(parts)


def _close(parts: Optional["ProducerParts"]) -> None:
    if parts is not None:
        with contextlib.suppress(BaseException):
            parts.watchdog.stop()
            parts.close()


def _answer(results, msg) -> None:
    results.send_bytes(pickle.dumps(msg))


def serve(parts: ProducerParts, store: WeightStore, jobs, results, parent: int, partial: bool, index: int) -> None:
    from verirl.train.step import _on, produce
    from verirl.train.step_metrics import Timer

    alive = lambda: os.getppid() == parent  # noqa: E731
    current = -1  # the version the model holds
    engine = parts.engine
    waited = time.perf_counter()
    while True:
        try:
            if not jobs.poll(0.5):
                if not alive():
                    return
                continue
            job = pickle.loads(jobs.recv_bytes())  # the trainer's own bytes
        except (EOFError, OSError):  # the trainer is gone
            return
        if job is None:
            return
        if job.exact:
            if current != job.version:
                current = store.wait_load(parts.weights, version=job.version, alive=alive)
        elif current < job.version or store.latest() > current:
            current = store.wait_load(parts.weights, at_least=job.version, alive=alive)
        engine.sync_weights(parts.model)  # vLLM: the loaded weights into the engine; native: nothing
        idle = time.perf_counter() - waited
        if job.position is not None:
            parts.sampler.load_state_dict({**parts.sampler.state_dict(), "position": job.position})
        recording = None
        if partial:
            def refresh() -> int:
                nonlocal current
                if store.latest() > current:  # a load a write tore is retried: the model holds one version whole
                    current = store.wait_load(parts.weights, at_least=current + 1, alive=alive)
                return current
            engine.refresh = refresh
            parts.engine = recording = Recording(engine)
        timer = Timer(parts.watchdog)
        parts.watchdog.step = job.step
        loaded = current
        try:
            with timer("all"):
                batch = produce(parts, job.step, timer, weight_version=current)
                with timer("reward"):
                    logged = batch.rewards()
        finally:
            parts.engine = engine
            if partial:
                engine.refresh = None
        lengths = batch.rollout.response_lengths.tolist()
        rows = recording.runs(lengths) if recording is not None else [[[loaded, int(n)]] for n in lengths]
        _answer(results, ("batch", Produced(
            job.step, batch.prompts, batch.settings.prompts_per_step, _on(batch.rollout, "cpu"), batch.texts, logged,
            batch.stats, batch.episodes, rows, parts.sampler.position,
            {k: v for k, v in timer.seconds.items() if k != "all"}, idle, index)))
        waited = time.perf_counter()


class Recording:
    """The native engine of a producer with partial rollouts: each generate call's rows and the weights
    version of each of their tokens (`NativeEngine.last_versions`, one per decoding step)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.per_row: list[list[int]] = []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, prompt_ids, n: int, params, **kw) -> Rollout:
        r = self.engine.generate(prompt_ids, n, params, **kw)
        self.per_row += [list(self.engine.last_versions)] * r.response_ids.shape[0]
        return r

    def runs(self, lengths: list[int]) -> list[list[list[int]]]:
        """(N,) each response's [[version, tokens], ...] in token order."""
        out = []
        for per_step, length in zip(self.per_row, lengths):
            runs: list[list[int]] = []
            for v in per_step[:int(length)]:
                if runs and runs[-1][0] == v:
                    runs[-1][1] += 1
                else:
                    runs.append([v, 1])
            out.append(runs)
        return out
