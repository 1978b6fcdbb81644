"""The GRPO loop. One step reads top to bottom as the picture in docs/design:

    prompts -> rollout -> verifiers -> group advantages -> (old, ref log-probs) -> update -> metrics

Builders turn the config into plain objects here; nothing below this module reads a config.
"""
from __future__ import annotations

import copy
import json
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from verirl.algo import ADVANTAGE_ESTIMATORS
from verirl.config import Config, to_dict, to_yaml
from verirl.data import PromptSampler, TASKS, encode_prompts
from verirl.data.dataset import load_prompts
from verirl.evaluate import accuracy, decode_responses, evaluate_samples
from verirl.metrics import (JsonlSink, Timer, advantage_metrics, length_metrics, mean_of, read_jsonl, throughput,
                            truncate)
from verirl.models import load_model, save_hf
from verirl.models.load import resolve_path
from verirl.rewards import Scorer, default_workers
from verirl.rollout import Engine, SamplingParams, build_engine, generate_chunked
from verirl.train.checkpoint import (Checkpoint, find_checkpoint, load_checkpoint, restore_training_state,
                                     save_checkpoint)
from verirl.train.packing import supports_packing
from verirl.train.actor import LogprobPass, UpdateParams, build_optimizer, compute_logprobs, update_policy
from verirl.types import Prompt, TrainBatch

PHASES = ("rollout", "reward", "old_log_prob", "ref", "update", "all")


@dataclass
class Run:
    """Everything a step needs, built once from the config."""
    cfg: Config
    model: torch.nn.Module
    ref: Optional[torch.nn.Module]
    tokenizer: object
    engine: Engine
    optimizer: torch.optim.Optimizer
    scheduler: object
    stop_ids: list[int]
    pad_id: int
    train: list[Prompt]
    val: list[Prompt]
    sampler: PromptSampler
    update: UpdateParams
    run_dir: Path
    scorer: Scorer
    resume: Optional[Checkpoint] = None  # where training continues from (weights restored by `train`)

    @property
    def on_policy(self) -> bool:
        """One mini-batch, one epoch: the old policy IS the current one, so skip the old log-prob pass."""
        c = self.cfg
        return c.actor.mini_batch_prompts == c.data.prompts_per_step and c.actor.epochs == 1


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_run(cfg: Config) -> Run:
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    seed_everything(cfg.trainer.seed)
    run_dir = Path(cfg.trainer.run_dir)
    resume = resolve_resume(cfg.trainer)
    lm = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device)
    train, val, stop_ids = load_data(cfg.data, lm)
    run_dir.mkdir(parents=True, exist_ok=True)  # only once the inputs are known to be good
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    ref = None
    if cfg.algo.kl_coef > 0:
        ref = copy.deepcopy(lm.model).eval().requires_grad_(False)
    packable, why = supports_packing(lm.model)
    opt, sched = build_optimizer(lm.model, cfg.actor.lr, tuple(cfg.actor.betas), cfg.actor.weight_decay,
                                 cfg.actor.warmup_steps)
    upd = UpdateParams(
        group_size=cfg.rollout.n, mini_batch_prompts=cfg.actor.mini_batch_prompts,
        micro_batch_size=cfg.actor.micro_batch_size, epochs=cfg.actor.epochs,
        clip_low=cfg.algo.clip_ratio_low, clip_high=cfg.algo.clip_ratio_high, kl_coef=cfg.algo.kl_coef,
        kl_type=cfg.algo.kl_type, entropy_coef=cfg.algo.entropy_coef, loss_agg_mode=cfg.algo.loss_agg_mode,
        grad_clip=cfg.actor.grad_clip, temperature=cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0,
        max_tokens=cfg.actor.max_token_len_per_device,
        passes=LogprobPass(cfg.actor.use_remove_padding and packable, cfg.actor.share_prompt, cfg.actor.logprob_chunk))
    if cfg.actor.use_remove_padding and not packable:
        print(f"actor.use_remove_padding: {cfg.model.path} cannot be packed ({why}); "
              f"log-prob passes run on padded rows instead.")
    engine = build_engine(cfg.rollout.engine, lm.model, lm.pad_id, stop_ids)
    rw = cfg.reward
    scorer = Scorer(rw.verifiers, rw.weights, rw.tasks, default_workers() if rw.workers < 0 else rw.workers,
                    rw.timeout)
    return Run(cfg, lm.model, ref, lm.tokenizer, engine, opt, sched, stop_ids, lm.pad_id, train, val,
               PromptSampler(len(train), cfg.data.seed, cfg.data.shuffle), upd, run_dir, scorer,
               load_checkpoint(resume) if resume else None)


RUN_FILES = ("metrics.jsonl", "rollouts.jsonl", "summary.json")


def resolve_resume(t) -> Optional[Path]:
    """The checkpoint to continue from (None: start fresh), per trainer.resume; clears the run
    directory for a fresh start when trainer.overwrite allows it."""
    run_dir = Path(t.run_dir)
    mode = str(t.resume).lower()
    if mode in ("false", "none", ""):
        has_run = (run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists()
        if has_run and not t.overwrite:
            raise FileExistsError(
                f"trainer.run_dir='{run_dir}' already holds a run (checkpoints or metrics.jsonl) and "
                f"trainer.resume=false. Continue it with trainer.resume=auto, start over with "
                f"trainer.overwrite=true (deletes it), or choose a new trainer.run_dir.")
        if has_run:
            for name in ("checkpoints", "final"):
                shutil.rmtree(run_dir / name, ignore_errors=True)
            for name in RUN_FILES:
                (run_dir / name).unlink(missing_ok=True)
        return None
    if mode == "auto":
        return find_checkpoint(run_dir) if (run_dir / "checkpoints").exists() else None
    found = find_checkpoint(Path(t.resume))
    if found is None:
        raise FileNotFoundError(f"trainer.resume='{t.resume}': no complete checkpoint there. Give "
                                f"RUN_DIR/checkpoints/step_N, or a run directory that has checkpoints.")
    return found


def file_options(d, too_long: str) -> dict:
    """load_prompts' keyword arguments from the data config (template, handler, keys, length limit)."""
    return dict(prompt_type=d.prompt_type, templates_file=d.templates_file, handler_name=d.handler_name,
                map_keys=d.map_keys, additional_keys=list(d.additional_keys),
                max_prompt_length=d.max_prompt_length, too_long=too_long)


def load_data(d, lm) -> tuple[list[Prompt], list[Prompt], list[int]]:
    """(train prompts, held-out prompts, stop ids) from the built-in task or the user's files."""
    stop_ids = lm.stop_ids
    if not d.train_path:
        if d.task not in TASKS:
            raise ValueError(f"data.task='{d.task}' is not a built-in task; known: {sorted(TASKS)}.")
        generated, val = TASKS[d.task](d.seed, d.train_size, d.val_size)
        train = encode_prompts(generated, lm.tokenizer, d.max_prompt_length, f"{d.task} train", d.too_long)
        val = encode_prompts(val, lm.tokenizer, d.max_prompt_length, f"{d.task} val", d.too_long)
        dropped, source = len(generated) - len(train), f"the built-in {d.task} task"
    else:
        opts = file_options(d, d.too_long)
        tr = load_prompts(d.train_path, lm.path, **opts)
        val = load_prompts(d.val_path, lm.path, **opts).prompts if d.val_path else []
        train, dropped, source = tr.prompts, tr.too_long, tr.source
        if tr.stop_words:  # the template's stop words end a response (replace_eos: instead of the EOS)
            ids = []
            for w in tr.stop_words:
                tok = lm.tokenizer(w, add_special_tokens=False)["input_ids"]
                if len(tok) != 1:
                    raise ValueError(f"template stop word {w!r} is {len(tok)} tokens in {lm.path}'s tokenizer; "
                                     f"stop words must be single tokens.")
                ids.append(tok[0])
            stop_ids = sorted(set(ids) if tr.replace_eos else set(ids) | set(lm.stop_ids))
    if not train:
        raise ValueError(f"data: every prompt of {source} is over data.max_prompt_length={d.max_prompt_length}.")
    if dropped:
        print(f"data: dropped {dropped} prompts over data.max_prompt_length={d.max_prompt_length} from {source}")
    return train, val, stop_ids


def train_step(run: Run, step: int) -> tuple[dict[str, float], list[dict]]:
    """One GRPO step. Returns (metrics, rollout records for the optional dump)."""
    c = run.cfg
    timer = Timer()
    prompts = [run.train[i] for i in run.sampler.take(c.data.prompts_per_step)]
    params = SamplingParams(c.rollout.max_new_tokens, c.rollout.temperature, c.rollout.top_p, c.rollout.top_k,
                            seed=c.trainer.seed * 1_000_003 + step)
    with timer("all"):
        with timer("rollout"):
            rollout = generate_chunked(run.engine, [p.ids for p in prompts], c.rollout.n, params,
                                       c.rollout.micro_batch_size, run.pad_id)
            texts = decode_responses(run.tokenizer, rollout)

        with timer("reward"):  # scoring runs in the reward workers during the log-prob passes below
            per_seq = [p for p in prompts for _ in range(c.rollout.n)]
            pending = run.scorer.submit(texts, [{**p.extra, "label": p.label, "task": p.task} for p in per_seq])

        batch = TrainBatch(rollout, torch.zeros(0))
        if not run.on_policy:  # on-policy: the update uses its own log-probs, detached
            with timer("old_log_prob"):
                batch.old_logprobs = compute_logprobs(run.model, rollout, c.actor.micro_batch_size,
                                                      run.update.temperature, run.update.passes,
                                                      c.actor.max_token_len_per_device)
        if run.ref is not None:
            with timer("ref"):
                batch.ref_logprobs = compute_logprobs(run.ref, rollout, c.actor.micro_batch_size,
                                                      run.update.temperature, run.update.passes,
                                                      c.ref.log_prob_max_token_len_per_device
                                                      or c.actor.max_token_len_per_device)
        with timer("reward"):  # what is left of the scoring once the passes are done
            rewards = pending.result()
            scores = torch.tensor(rewards.totals, dtype=torch.float32)
            adv = ADVANTAGE_ESTIMATORS[c.algo.adv_estimator](scores, c.rollout.n, c.algo.norm_adv_by_std,
                                                              c.algo.adv_epsilon)
            batch.advantages = adv.to(rollout.response_ids.device)
        with timer("update"):
            actor_stats = update_policy(run.model, run.optimizer, run.scheduler, batch, run.update)

    m: dict[str, float] = {"step": step}
    m.update(rewards.metrics([p.task for p in per_seq]))
    m.update(advantage_metrics(adv, scores, c.rollout.n))
    m.update(length_metrics(rollout, c.rollout.max_new_tokens))
    m.update(actor_stats)
    m.update(timer.metrics(PHASES))
    m["perf/tps"] = throughput(m["prompt_length/mean"], m["response_length/mean"], c.data.prompts_per_step,
                               c.rollout.n, 1, m["timing/all"])
    records = []
    if c.trainer.dump_rollouts:
        lengths = rollout.response_lengths.tolist()
        for i, (p, text) in enumerate(zip(per_seq, texts)):
            records.append({"step": step, "prompt": run.tokenizer.decode(p.ids), "response": text,
                            "label": p.label, "task": p.task, "scores": {k: v[i] for k, v in rewards.per_rule.items()},
                            "reward": rewards.totals[i], "response_length": lengths[i],
                            "stopped": bool(rollout.stopped[i])})
    return m, records


def validate_run(run: Run, prompts: list[Prompt]) -> dict[str, float]:
    """val/... metrics: avg@n, pass@k, maj@n with the training engine and rules (trainer.val_n samples)."""
    c = run.cfg
    res = evaluate_samples(run.engine, run.tokenizer, prompts, c.trainer.val_n, run.scorer, c.rollout.max_new_tokens,
                           temperature=c.rollout.temperature, seed=c.trainer.seed + 999)
    out = {f"val/{k}": v for k, v in res["overall"].items() if k != "prompts"}
    for g, m in res["groups"].items():
        out.update({f"val/{g}/{k}": v for k, v in m.items() if k != "prompts"})
    return out


def _val_prompts(run: Run) -> list[Prompt]:
    t = run.cfg.trainer
    if not t.val_data:
        return run.val
    return load_prompts(t.val_data, resolve_path(run.cfg.model.path), **file_options(run.cfg.data, "filter")).prompts


def evaluate_run(run: Run) -> dict[str, float]:
    c = run.cfg
    return accuracy(run.engine, run.tokenizer, run.val, c.rollout.max_new_tokens, c.trainer.eval_samples,
                    temperature=1.0, seed=c.trainer.seed + 777)


class TrainingInterrupted(Exception):
    """SIGINT / SIGTERM: a checkpoint was saved at a step boundary and the run stopped."""

    def __init__(self, signum: int, step: int, checkpoint: Path):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint {checkpoint}. "
                         f"Run the same command again to continue (trainer.resume=auto).")


class _Signals:
    """First SIGINT / SIGTERM: finish the step, checkpoint, stop. Second: exit at once."""

    def __init__(self, console):
        self.console, self.signum, self._old = console, None, {}

    def __enter__(self):
        import threading
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            os._exit(128 + signum)
        self.signum = signum
        self.console.print(f"[bold yellow]{signal.Signals(signum).name}[/]: saving a checkpoint after this step, "
                           f"then stopping (send it again to stop at once, without saving).")

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _save(run: Run, step: int, sink: JsonlSink, dump: Optional[JsonlSink], summary: dict) -> Path:
    t = run.cfg.trainer
    extra = {"sampler": run.sampler.state_dict(), "metrics_bytes": sink.tell(),
             "rollouts_bytes": dump.tell() if dump else 0, "eval_start": summary.get("eval_start"),
             "run_dir": str(run.run_dir.resolve()), "config": to_dict(run.cfg)}
    return save_checkpoint(run.run_dir / "checkpoints", step, run.model, run.tokenizer, run.stop_ids, run.optimizer,
                           run.scheduler, extra, keep=t.keep_checkpoints)


def _continue(run: Run, console) -> int:
    """Restore the checkpoint to continue from (if any) and line the logs up with it; -> first step."""
    ckpt = run.resume
    metrics, rollouts = run.run_dir / "metrics.jsonl", run.run_dir / "rollouts.jsonl"
    if ckpt is None:
        truncate(metrics, 0)  # resume=auto with no checkpoint yet: the run starts over
        truncate(rollouts, 0)
        return 1
    restore_training_state(ckpt, run.model, run.optimizer, run.scheduler)
    _apply_optimizer_settings(run)
    run.sampler.load_state_dict(ckpt.state["sampler"])
    own = ckpt.path.resolve().parent.parent == run.run_dir.resolve()  # its logs are the ones in run_dir
    truncate(metrics, ckpt.state["metrics_bytes"] if own else 0)  # drop steps logged after the checkpoint
    truncate(rollouts, ckpt.state.get("rollouts_bytes", 0) if own else 0)
    console.print(f"resuming from {ckpt.path} (step {ckpt.step}); next step {ckpt.step + 1}")
    changed = config_changes(ckpt.state.get("config") or {}, to_dict(run.cfg))
    if changed:
        console.print("[yellow]settings differ from the checkpoint's run[/] (the new values apply from here on): "
                      + ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changed))
    return ckpt.step + 1


def _apply_optimizer_settings(run: Run) -> None:
    """The loaded optimizer state carries the old run's lr / betas / weight decay (and its fused /
    for-each choice, which depends on the device it ran on): put this run's in (the same values when
    nothing changed, so an unchanged resume stays exact)."""
    a = run.cfg.actor
    impl = {k: run.optimizer.defaults.get(k) for k in ("fused", "foreach")}  # this machine's, not the saver's
    run.scheduler.base_lrs = [a.lr] * len(run.optimizer.param_groups)
    for g, fn in zip(run.optimizer.param_groups, run.scheduler.lr_lambdas):
        g.update(initial_lr=a.lr, lr=a.lr * fn(run.scheduler.last_epoch), betas=tuple(a.betas),
                 weight_decay=a.weight_decay, **impl)


IGNORED_ON_RESUME = {"trainer.total_steps", "trainer.resume", "trainer.overwrite", "trainer.run_dir",
                     "log.progress", "log.console_every"}


def config_changes(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(key, old, new) for every setting that differs, but the ones that may change on a resume."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b, key = old.get(k), new.get(k), prefix + k
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, key + ".")
        elif a != b and key not in IGNORED_ON_RESUME:
            out.append((key, a, b))
    return out


def train(cfg: Config, console=None) -> dict:
    """Run GRPO to ``trainer.total_steps``; returns the run summary (also written to summary.json).

    Checkpoints every ``trainer.save_freq`` steps and at the end; continues from the newest one
    with ``trainer.resume=auto``. SIGINT / SIGTERM save a checkpoint and raise TrainingInterrupted."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    console = console or Console()
    t_start = time.time()
    run = build_run(cfg)
    n_params = sum(p.numel() for p in run.model.parameters())
    console.print(f"[bold]verirl[/] GRPO: model {cfg.model.path} ({n_params / 1e6:.2f}M params), "
                  f"{cfg.data.prompts_per_step} prompts x {cfg.rollout.n} samples/step, {cfg.trainer.total_steps} "
                  f"steps, run dir {run.run_dir}")
    first = _continue(run, console)
    summary: dict = {"run_dir": str(run.run_dir), "params": n_params}
    if run.resume is not None and run.resume.state.get("eval_start"):
        summary["eval_start"] = run.resume.state["eval_start"]
    elif cfg.trainer.eval_at_start and run.val and first == 1:
        with console.status("held-out accuracy before training..."):
            summary["eval_start"] = evaluate_run(run)
        console.print(f"held-out accuracy at start ({len(run.val)} problems): "
                      f"greedy {summary['eval_start']['greedy']:.3f}, sampled {summary['eval_start']['sampled']:.3f}")

    sink = JsonlSink(run.run_dir / "metrics.jsonl")
    dump = JsonlSink(run.run_dir / "rollouts.jsonl") if cfg.trainer.dump_rollouts else None
    history: list[dict] = [r for r in read_jsonl(sink.path) if r.get("step", 0) > 0]
    t_cfg = cfg.trainer
    val_prompts = _val_prompts(run) if (t_cfg.test_freq or t_cfg.val_before_train) else []
    if t_cfg.val_before_train and val_prompts and first == 1:
        with console.status("validation before training..."):
            v = validate_run(run, val_prompts)
        sink.write({"step": 0, **v})
        summary["val_before_train"] = v
        console.print("validation before training: " + _val_line(v))
    columns = [TextColumn("[bold blue]GRPO"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn(), TextColumn("<"), TimeRemainingColumn()]
    total, every, save_freq = cfg.trainer.total_steps, cfg.log.console_every, cfg.trainer.save_freq
    try:
        with _Signals(console) as signals, Progress(*columns, console=console, disable=not cfg.log.progress,
                                                    transient=False) as bar:
            task = bar.add_task("", total=total, completed=first - 1)
            for step in range(first, total + 1):
                m, records = train_step(run, step)
                if t_cfg.test_freq and val_prompts and (step % t_cfg.test_freq == 0 or step == total):
                    m.update(validate_run(run, val_prompts))
                    bar.console.print(f"step {step} validation: " + _val_line(m))
                sink.write(m)
                if dump:
                    for rec in records:
                        dump.write(rec)
                history.append(m)
                recent = history[-10:]
                bar.update(task, advance=1, description=(
                    f"reward {mean_of(recent, 'reward/mean'):+.3f} len {m['response_length/mean']:.1f} "
                    f"{m['timing/all']:.2f}s/step"))
                if every and (step % every == 0 or step == total):
                    bar.console.print(_step_line(m), soft_wrap=True)
                if (save_freq and step % save_freq == 0) or step == total or signals.signum is not None:
                    path = _save(run, step, sink, dump, summary)
                    if signals.signum is not None:
                        raise TrainingInterrupted(signals.signum, step, path)
    finally:
        sink.close()
        run.scorer.close()
        if dump:
            dump.close()
    train_seconds = sum(m["timing/all"] for m in history)
    save_hf(run.model, run.tokenizer, run.run_dir / "final", run.stop_ids)
    k = min(5, len(history))
    summary.update({
        "steps": len(history), "train_seconds": train_seconds,
        "reward_first5": mean_of(history, "reward/mean", first=k),
        "reward_last5": mean_of(history, "reward/mean", last=k),
        "final_model": str(run.run_dir / "final"),
    })
    if cfg.trainer.eval_at_end and run.val:
        with console.status("held-out accuracy after training..."):
            summary["eval_end"] = evaluate_run(run)
    summary["wall_seconds"] = time.time() - t_start
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(console, summary, len(run.val))
    return summary


def _val_line(m: dict) -> str:
    return "  ".join(f"{k[4:]} {v:.3f}" for k, v in m.items() if k.startswith("val/") and k.count("/") == 1)


def _step_line(m: dict) -> str:
    rules = "  ".join(f"{k.split('/')[1]} {v:+.3f}" for k, v in m.items()
                      if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2)
    kl = f"  kl {m['actor/kl']:.4f}" if "actor/kl" in m else ""
    return (f"step {m['step']:>5}  reward {m['reward/mean']:+.3f}  {rules}  len {m['response_length/mean']:.1f}"
            f"{kl}  ent {m['actor/entropy']:.3f}  {m['timing/all']:.2f}s  tps {m['perf/tps']:.0f}")


def _print_summary(console, s: dict, n_val: int) -> None:
    from rich.table import Table

    t = Table(title="verirl run summary", show_header=True)
    t.add_column("measure")
    t.add_column("start", justify="right")
    t.add_column("end", justify="right")
    t.add_column("change", justify="right")
    t.add_row("reward/mean (first 5 vs last 5 steps)", f"{s['reward_first5']:+.3f}", f"{s['reward_last5']:+.3f}",
              f"{s['reward_last5'] - s['reward_first5']:+.3f}")
    if "eval_start" in s and "eval_end" in s:
        for key in ("greedy", "sampled"):
            a, b = s["eval_start"][key], s["eval_end"][key]
            t.add_row(f"held-out accuracy, {key} ({n_val} problems)", f"{a:.1%}", f"{b:.1%}",
                      f"{(b - a) * 100:+.1f} pts")
    console.print(t)
    console.print(f"trained {s['steps']} steps in {s['train_seconds']:.0f}s; metrics: {s['run_dir']}/metrics.jsonl; "
                  f"model: {s['final_model']}")
