"""Experiment trackers for `log.backends`: tensorboard, wandb, mlflow and swanlab (docs/trackers.md).

``console`` and ``jsonl`` are the trainer's own (RUN_DIR/metrics.jsonl is always written); this module
opens the others. Every one is an optional package, imported only when a run selects it, and every one
works offline, its files under the run directory:

  tensorboard  RUN_DIR/tensorboard (event files; torch.utils.tensorboard.SummaryWriter)
  wandb        RUN_DIR/wandb (offline runs, unless WANDB_MODE says otherwise)
  mlflow       RUN_DIR/mlruns (a file store, unless MLFLOW_TRACKING_URI says otherwise)
  swanlab      RUN_DIR/swanlog (offline mode, unless SWANLAB_MODE says otherwise)

A run resumed from a checkpoint at step N logs into the same tracker run: tensorboard purges what the
interrupted run logged after step N; wandb, mlflow and swanlab keep the run's id in their folder
(RUN_DIR/wandb/run_id, RUN_DIR/mlruns/run_id, RUN_DIR/swanlog/run_id) and log into it again; steps
after N that the interrupted run had logged stay there (mlflow keeps both values; wandb's server
keeps the first), as docs/trackers.md says.
"""
from __future__ import annotations

import importlib.util
import json
import math
import numbers
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from verirl.config import flatten  # nested config -> dotted keys, as convert-config writes them
from verirl.core.errors import ConfigError

BACKENDS = ("console", "jsonl", "tensorboard", "wandb", "mlflow", "swanlab")
_OWN = ("console", "jsonl")  # written by the trainer itself

# backend -> (the module it imports, what `pip install` takes)
_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),  # or the full `mlflow` (its UI and server)
    "swanlab": ("swanlab", "swanlab"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; a module without __spec__
        return False


def _check(backends: Sequence[str], packages: dict[str, tuple[str, str]]) -> None:
    """`check_backends` with the table of packages given (the tests name a module that is not there)."""
    if isinstance(backends, (str, bytes)):
        raise ConfigError(f"log.backends={backends!r} is a string; it takes a list of names: "
                          f"log.backends=[console,jsonl,{backends}] (the backends: {', '.join(BACKENDS)}).")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        which = "which is not a backend" if len(unknown) == 1 else "which are not backends"
        raise ConfigError(f"log.backends={list(backends)} names {', '.join(map(repr, unknown))}, {which}: use "
                          f"{', '.join(BACKENDS)} (for example log.backends=[console,jsonl,tensorboard]).")
    missing = [b for b in dict.fromkeys(backends) if b in packages and not _installed(packages[b][0])]
    if missing:
        pips = " ".join(packages[b][1] for b in missing)
        what = "; ".join(f"{b} needs the {packages[b][0]} package, which is not installed" for b in missing)
        raise ConfigError(f"log.backends={list(backends)}: {what}. Fix: `pip install {pips}` "
                          f"(or every tracker: `pip install 'verirl[trackers]'`), or take "
                          f"{', '.join(missing)} out of log.backends.")


def check_backends(backends: Sequence[str]) -> None:
    """Unknown names, and selected backends whose package is not installed, raise `ConfigError` (naming
    log.backends, the value and the fix: the `pip install` command). Imports nothing (find_spec only)."""
    _check(backends, _PACKAGES)


def _scalars(metrics: dict) -> dict[str, float]:
    """Every real, finite number of ``metrics`` but its 'step' (booleans and anything else left out)."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if math.isfinite(value):
            out[str(key)] = value
    return out


def _failing() -> bool:
    """Whether close() runs while an exception propagates (from a `finally` or an `except` block)."""
    return sys.exc_info()[1] is not None


def _read_id(path: Path, resume_step: int) -> Optional[str]:
    """The tracker run id a resumed run logs into again (None: a fresh run, or none was kept)."""
    if resume_step <= 0 or not path.is_file():
        return None
    return path.read_text().strip() or None


def _run_folder(run_dir: Path, name: str, resume_step: int) -> tuple[Path, Path, Optional[str]]:
    """(RUN_DIR/name, made; the file that keeps the tracker's run id; the id to resume, or None)."""
    folder = run_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    id_path = folder / "run_id"
    return folder, id_path, _read_id(id_path, resume_step)


class _TensorBoard:
    def __init__(self, run_dir: Path, config: Optional[dict], resume_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard drops what earlier event files hold at steps >= it (the interrupted
        # run's steps after the checkpoint), so each step is shown once, with the resumed run's values.
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                    purge_step=resume_step + 1 if resume_step > 0 else None)
        if resume_step <= 0 and config:
            text = json.dumps(config, indent=2, default=str)
            self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)
            self.writer.flush()

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a step takes seconds: the files stay current for a live TensorBoard

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, project: str, run_name: str, config: Optional[dict], resume_step: int):
        import wandb

        folder, id_path, run_id = _run_folder(run_dir, "wandb", resume_step)
        kwargs: dict[str, Any] = {}
        if "WANDB_MODE" not in os.environ:
            kwargs["mode"] = "offline"
        # dir=RUN_DIR: wandb writes into RUN_DIR/wandb/. resume="allow" resumes an online run with that
        # id (an offline one starts a new folder with the same id, synced with `wandb sync --append`).
        self.run = wandb.init(project=project, name=run_name, dir=str(run_dir), config=dict(config or {}),
                              id=run_id, resume="allow", **kwargs)
        id_path.write_text(self.run.id + "\n")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish(exit_code=1 if _failing() else 0)


_MLFLOW_BAD = re.compile(r"[^\w./\- ]")


def _mlflow_key(key: str) -> str:
    """A name MLflow takes: letters, digits, _ - . / and space ('val/pass@1' -> 'val/pass_1')."""
    key = _MLFLOW_BAD.sub("_", key)
    parts = [p for p in key.split("/") if p not in ("", ".", "..")]
    return "/".join(parts)[:250] or "_"


class _MLflow:
    def __init__(self, run_dir: Path, project: str, run_name: str, config: Optional[dict], resume_step: int):
        folder, id_path, run_id = _run_folder(run_dir, "mlruns", resume_step)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        if uri is None:
            uri = folder.resolve().as_uri()
            # MLflow 3 keeps its file store (maintenance mode) behind this switch; older versions ignore it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # offline: no usage reports (read at import)
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        existing: dict[str, str] = {}
        if run_id is not None:
            try:
                existing = dict(self.client.get_run(run_id).data.params)
                self.client.update_run(run_id, status="RUNNING")
            except MlflowException:  # not in this store (another MLFLOW_TRACKING_URI, deleted): a new run
                run_id = None
        if run_id is None:
            run_id = self.client.create_run(self._experiment(project), run_name=run_name,
                                             tags={"verirl.run_dir": str(run_dir.resolve())}).info.run_id
            id_path.write_text(run_id + "\n")
        self.run_id = run_id
        # params are immutable in MLflow: a resumed run adds the keys it did not have, and keeps the rest
        params = [Param(_mlflow_key(k), str(v)[:6000]) for k, v in flatten(config or {}).items()
                  if _mlflow_key(k) not in existing]
        for i in range(0, len(params), 100):
            self.client.log_batch(run_id, params=params[i:i + 100])

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # created by another run meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    def log(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if _failing() else "FINISHED")


class _SwanLab:
    def __init__(self, run_dir: Path, project: str, run_name: str, config: Optional[dict], resume_step: int):
        import swanlab

        folder, id_path, run_id = _run_folder(run_dir, "swanlog", resume_step)
        kwargs: dict[str, Any] = {}
        if "SWANLAB_MODE" not in os.environ:
            kwargs["mode"] = "offline"
        if run_id is not None:  # the same id: resumed online; offline, a new folder that syncs into it
            kwargs.update(id=run_id, resume="allow")
        self.run = swanlab.init(project=project, name=run_name, log_dir=str(folder), config=dict(config or {}),
                                **kwargs)
        id_path.write_text(str(self.run.id) + "\n")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        if _failing():
            self.run.finish(state="crashed", error=repr(sys.exc_info()[1]))
        else:
            self.run.finish()


class Trackers:
    """The trackers of `log.backends` beyond console and jsonl, open for one run (rank 0 only)."""

    def __init__(self, backends: Sequence[str], run_dir: Path, project: str, run_name: str, config: dict,
                 resume_step: int = 0):
        """Open the selected trackers (console and jsonl are ignored here). ``resume_step``: the last step
        the resumed checkpoint holds (0 = a fresh run); what an interrupted run logged after it is
        purged (tensorboard) or logged into the same tracker run again (wandb, mlflow, swanlab)."""
        check_backends(backends)
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.names: list[str] = []
        self._open: list[Any] = []
        openers = {
            "tensorboard": lambda: _TensorBoard(run_dir, config, resume_step),
            "wandb": lambda: _WandB(run_dir, project, run_name, config, resume_step),
            "mlflow": lambda: _MLflow(run_dir, project, run_name, config, resume_step),
            "swanlab": lambda: _SwanLab(run_dir, project, run_name, config, resume_step),
        }
        try:
            for name in dict.fromkeys(backends):
                if name not in _OWN:
                    self._open.append(openers[name]())
                    self.names.append(name)
        except BaseException:
            self.close()
            raise

    def log(self, metrics: dict, step: int) -> None:
        """Every real, finite value of ``metrics`` (not its 'step', not a non-number) at ``step``."""
        scalars = _scalars(metrics)
        if not scalars:
            return
        for tracker in self._open:
            tracker.log(scalars, int(step))

    def close(self) -> None:
        """Flush and close every tracker (each is closed even if another one fails); again: nothing."""
        trackers, self._open = self._open, []
        error: Optional[BaseException] = None
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as e:  # the others are still closed; then the first error is raised
                error = error or e
        if error is not None:
            raise error

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
