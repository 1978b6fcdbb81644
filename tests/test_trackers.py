"""log.backends trackers (verirl.run.trackers): real packages, offline, read back through their own readers."""
from __future__ import annotations

import importlib.util
import math

import pytest

from verirl.core.errors import ConfigError
from verirl.run.trackers import BACKENDS, Trackers, _check, check_backends

CONFIG = {"algo": {"name": "grpo", "kl_coef": 0.0}, "actor": {"lr": 1e-5}, "rollout": {"n": 4}}


def _metrics(step: int, run: int) -> dict:
    """A step's metrics as the trainer logs them, values telling the run and the step apart, with what
    must be left out: the step itself, strings, booleans, None, non-finite numbers."""
    return {"step": step, "reward/mean": run * 10 + step / 10, "val/pass@1": run + step / 100, "actor/kl": 0.0,
            "count": step, "note": "text", "ok": True, "missing": None, "nan": math.nan, "inf": math.inf}


def _tb_scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# ------------------------------------------------------------------------------------------ check_backends

def test_check_backends_accepts_the_known_names():
    check_backends(["console", "jsonl"])
    check_backends(["console", "jsonl", "tensorboard", "mlflow"])  # installed with the test extra
    assert BACKENDS == ("console", "jsonl", "tensorboard", "wandb", "mlflow", "swanlab")


def test_unknown_backend_names_log_backends_and_the_choices():
    with pytest.raises(ConfigError) as e:
        check_backends(["console", "tensorbord"])
    msg = str(e.value)
    assert "log.backends" in msg and "'tensorbord'" in msg and "tensorboard" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="log.backends"):
        check_backends("tensorboard")  # a string, not a list


def test_missing_package_names_log_backends_and_the_pip_command():
    """A backend whose package is genuinely absent: with the real table where one is (swanlab and wandb
    are not in the test extra), and always with a table whose module does not exist anywhere."""
    absent = [b for b in ("swanlab", "wandb", "mlflow") if importlib.util.find_spec(b) is None]
    if absent:
        with pytest.raises(ConfigError) as e:
            check_backends(["console", "jsonl", absent[0]])
        msg = str(e.value)
        assert "log.backends" in msg and f"pip install {'mlflow-skinny' if absent[0] == 'mlflow' else absent[0]}" \
            in msg and "pip install 'verirl[trackers]'" in msg and "\n" not in msg
    module = "verirl_no_such_tracker_module"
    assert importlib.util.find_spec(module) is None
    with pytest.raises(ConfigError) as e:
        _check(["console", "tensorboard"], {"tensorboard": (module, "no-such-tracker")})
    msg = str(e.value)
    assert "log.backends=['console', 'tensorboard']" in msg and f"the {module} package" in msg
    assert "`pip install no-such-tracker`" in msg and "pip install 'verirl[trackers]'" in msg


def test_console_and_jsonl_open_nothing(tmp_path):
    with Trackers(["console", "jsonl"], tmp_path, "verirl", "run", CONFIG) as t:
        t.log(_metrics(1, 0), 1)
        assert t.names == []
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ tensorboard

def test_tensorboard_logs_every_finite_number(tmp_path):
    t = Trackers(["console", "jsonl", "tensorboard"], tmp_path, "verirl", tmp_path.name, CONFIG)
    for step in (0, 1, 2, 3):
        t.log(_metrics(step, 0), step)
    t.close()
    t.close()  # twice: nothing
    scalars = _tb_scalars(tmp_path / "tensorboard")
    assert set(scalars) == {"reward/mean", "val/pass@1", "actor/kl", "count"}
    assert scalars["reward/mean"] == [(s, pytest.approx(s / 10)) for s in (0, 1, 2, 3)]
    assert scalars["count"] == [(s, float(s)) for s in (0, 1, 2, 3)]


def test_tensorboard_resume_shows_each_step_once(tmp_path):
    t = Trackers(["tensorboard"], tmp_path, "verirl", "run", CONFIG)
    for step in range(1, 6):
        t.log(_metrics(step, 1), step)
    t.close()
    t = Trackers(["tensorboard"], tmp_path, "verirl", "run", CONFIG, resume_step=3)
    for step in range(4, 7):
        t.log(_metrics(step, 2), step)
    t.close()
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    scalars = _tb_scalars(tmp_path / "tensorboard")
    for tag in ("reward/mean", "val/pass@1", "count"):
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4, 5, 6], tag
    want = [(s, pytest.approx((1 if s <= 3 else 2) * 10 + s / 10)) for s in range(1, 7)]
    assert scalars["reward/mean"] == want


# ------------------------------------------------------------------------------------------ mlflow

@pytest.fixture
def mlflow_env(monkeypatch):
    """Offline MLflow: the run directory's file store, no usage reports (set here so they are undone)."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


def _mlflow_client(run_dir):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())


def test_mlflow_logs_into_the_run_directory(tmp_path, mlflow_env):
    t = Trackers(["jsonl", "mlflow"], tmp_path, "verirl-test", "my-run", CONFIG)
    for step in (0, 1, 2, 3):
        t.log(_metrics(step, 0), step)
    t.close()
    run_id = (tmp_path / "mlruns" / "run_id").read_text().strip()
    client = _mlflow_client(tmp_path)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "my-run"
    assert client.get_experiment(run.info.experiment_id).name == "verirl-test"
    assert run.data.params["algo.name"] == "grpo" and run.data.params["rollout.n"] == "4"
    assert set(run.data.metrics) == {"reward/mean", "val/pass_1", "actor/kl", "count"}
    history = client.get_metric_history(run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(s, pytest.approx(s / 10)) for s in (0, 1, 2, 3)]
    assert [m.value for m in client.get_metric_history(run_id, "val/pass_1")] == pytest.approx([0, .01, .02, .03])


def test_mlflow_resume_logs_into_the_same_run(tmp_path, mlflow_env):
    t = Trackers(["mlflow"], tmp_path, "verirl", "run", CONFIG)
    for step in range(1, 6):
        t.log(_metrics(step, 1), step)
    t.close()
    run_id = (tmp_path / "mlruns" / "run_id").read_text().strip()
    config = {**CONFIG, "trainer": {"total_steps": 6}}  # a resume may add keys: added as params
    t = Trackers(["mlflow"], tmp_path, "verirl", "run", config, resume_step=3)
    assert (tmp_path / "mlruns" / "run_id").read_text().strip() == run_id
    for step in range(4, 7):
        t.log(_metrics(step, 2), step)
    t.close()
    client = _mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("verirl").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].info.status == "FINISHED" and runs[0].data.params["trainer.total_steps"] == "6"
    # MLflow appends: steps 4 and 5 hold both runs' values, the resumed run's logged last (docs/trackers.md)
    history = client.get_metric_history(run_id, "reward/mean")
    assert [m.step for m in history] == [1, 2, 3, 4, 5, 4, 5, 6]
    last = {m.step: m.value for m in sorted(history, key=lambda m: m.timestamp)}
    assert last == {s: pytest.approx((1 if s <= 3 else 2) * 10 + s / 10) for s in range(1, 7)}


def test_mlflow_fresh_run_in_the_same_directory_is_a_new_run(tmp_path, mlflow_env):
    for _ in range(2):
        with Trackers(["mlflow"], tmp_path, "verirl", "run", CONFIG) as t:  # resume_step=0: fresh
            t.log(_metrics(1, 0), 1)
    client = _mlflow_client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("verirl").experiment_id])
    assert len(runs) == 2
    assert (tmp_path / "mlruns" / "run_id").read_text().strip() in {r.info.run_id for r in runs}


def test_a_failing_backend_closes_the_opened_ones(tmp_path, mlflow_env):
    """mlflow cannot open (its folder is a file): the tensorboard writer opened before it is closed."""
    (tmp_path / "mlruns").write_text("not a folder")
    with pytest.raises(FileExistsError):
        Trackers(["tensorboard", "mlflow"], tmp_path, "verirl", "run", CONFIG)
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 1


# ------------------------------------------------------------------------------------------ training

def test_training_writes_tensorboard_steps(tmp_path):
    from verirl.cli import main

    run = tmp_path / "run"
    rc = main(["train", "--config", "tiny", f"trainer.run_dir={run}", "trainer.total_steps=3",
               "data.prompts_per_step=4", "actor.mini_batch_prompts=4", "rollout.n=4", "rollout.max_new_tokens=16",
               "eval.before_train=false", "eval.at_end=false", "log.progress=off", "reward.workers=0",
               "log.backends=[console,jsonl,tensorboard]"])
    assert rc in (0, None)
    scalars = _tb_scalars(run / "tensorboard")
    assert scalars and "reward/mean" in scalars
    assert [s for s, _ in scalars["reward/mean"]] == [1, 2, 3]
