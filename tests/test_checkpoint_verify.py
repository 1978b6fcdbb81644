"""Checkpoints are verified before they are trusted (issue 12, items 2 and 3): real checkpoints of
the tiny model, damaged for real (cut, overwritten, deleted files), then found, resumed, exported."""
import json
import os
import shutil
from pathlib import Path

import pytest

from verirl.cli import main
from verirl.core.errors import CheckpointError
from verirl.run.checkpoint import MANIFEST, check_checkpoint, file_checksum, find_checkpoint, load_checkpoint
from verirl.train.checkpoint import restore_training_state

ARGS = ["train", "eval.before_train=false", "eval.at_end=false", "log.progress=false", "log.console_every=0",
        "data.prompts_per_step=2", "actor.mini_batch_prompts=2", "rollout.n=2", "rollout.max_new_tokens=16",
        "reward.workers=0", "trainer.save_freq=1", "trainer.keep_checkpoints=2"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One real 2-step run of the tiny model with a checkpoint after each step."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=2"]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A private copy of the trained run, free to damage."""
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def _cut(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def _garbage(path: Path, same_size: bool = False) -> None:
    n = path.stat().st_size if same_size else 1000
    path.write_bytes(os.urandom(n))


def _metric_steps(run: Path) -> list[int]:
    return [json.loads(l)["step"] for l in (run / "metrics.jsonl").read_text().splitlines()]


# each: how to damage a checkpoint, and words the report must hold
DAMAGE = {
    "cut safetensors": (lambda c: _cut(c / "model" / "model.safetensors", 1000),
                        ["model/model.safetensors is 1,000 bytes, the manifest says"]),
    "garbage optimizer": (lambda c: _garbage(c / "optimizer.pt"), ["optimizer.pt is 1,000 bytes"]),
    "garbage optimizer, same size": (lambda c: _garbage(c / "optimizer.pt", same_size=True),
                                     ["optimizer.pt does not match its checksum"]),
    "cut rng": (lambda c: _cut(c / "rng_rank0.safetensors", 20), ["rng_rank0.safetensors is 20 bytes"]),
    "no state.json": (lambda c: (c / "state.json").unlink(), ["state.json is missing"]),
    "no tokenizer": (lambda c: (c / "model" / "tokenizer.json").unlink(), ["model/tokenizer.json is missing"]),
    "garbage manifest": (lambda c: (c / MANIFEST).write_text("{not json"), [f"{MANIFEST} cannot be read"]),
}


def test_a_saved_checkpoint_has_a_manifest_of_every_file(trained):
    ckpt = _ckpt(trained, 2)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    files = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()} - {MANIFEST}
    assert set(manifest["files"]) == files
    assert {"state.json", "optimizer.pt", "rng_rank0.safetensors", "model/model.safetensors"} <= files
    for rel, entry in manifest["files"].items():
        assert entry["size"] == (ckpt / rel).stat().st_size and entry["crc32"] == file_checksum(ckpt / rel)
    assert check_checkpoint(ckpt) == (None, True)
    assert find_checkpoint(trained) == ckpt


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_bad_newest_checkpoint_is_reported_and_the_newest_good_one_used(run, case, capsys):
    damage, words = DAMAGE[case]
    damage(_ckpt(run, 2))
    assert find_checkpoint(run) == _ckpt(run, 1)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line
    assert str(_ckpt(run, 2)) in err[0] and "using step_000001" in err[0]
    assert all(w in err[0] for w in words), err[0]
    # given itself, the bad checkpoint is an error naming what is wrong
    with pytest.raises(CheckpointError, match="step_000002") as e:
        find_checkpoint(_ckpt(run, 2))
    assert all(w in str(e.value) for w in words)


def test_resume_continues_from_the_newest_good_checkpoint(run, capsys):
    _cut(_ckpt(run, 2) / "model" / "model.safetensors", 1000)
    capsys.readouterr()
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=3"]) == 0
    out, err = capsys.readouterr()
    assert "model/model.safetensors is 1,000 bytes" in err and "using step_000001" in err
    assert f"resuming from {_ckpt(run, 1)}" in out
    assert _metric_steps(run) == [1, 2, 3]  # step 2 redone from step 1, each step logged once
    assert check_checkpoint(_ckpt(run, 3)) == (None, True)
    assert check_checkpoint(_ckpt(run, 2)) == (None, True)  # re-saved whole over the bad one


def test_no_usable_checkpoint_is_an_error_naming_each_and_the_history_is_kept(run, capsys):
    _cut(_ckpt(run, 2) / "model" / "model.safetensors", 1000)
    (_ckpt(run, 1) / "state.json").unlink()
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(run)
    msg = str(e.value)
    assert "step_000002: model/model.safetensors is 1,000 bytes" in msg
    assert "step_000001: state.json is missing" in msg
    assert "trainer.resume=false trainer.overwrite=true" in msg
    metrics = (run / "metrics.jsonl").read_bytes()
    # the trainer refuses (resume=auto), in one paragraph, and wipes nothing
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "none can be used" in err and "Traceback" not in err
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert (_ckpt(run, 2) / "model" / "model.safetensors").stat().st_size == 1000


def test_a_latest_that_names_a_deleted_checkpoint_falls_back(run, capsys):
    shutil.rmtree(_ckpt(run, 2))
    assert find_checkpoint(run) == _ckpt(run, 1)
    err = capsys.readouterr().err
    assert "step_000002: named by" in err and "does not exist" in err and "using step_000001" in err


def test_an_unfinished_write_is_not_a_checkpoint(tmp_path):
    (tmp_path / "checkpoints" / "step_000001.tmp").mkdir(parents=True)
    assert find_checkpoint(tmp_path) is None  # nothing was ever saved: a fresh start is right


def test_a_checkpoint_without_a_manifest_is_checked_by_its_headers_and_used_with_a_warning(run, capsys):
    (_ckpt(run, 2) / MANIFEST).unlink()
    assert find_checkpoint(run) == _ckpt(run, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no manifest.json" in err[0] and str(_ckpt(run, 2)) in err[0]
    # and a resume from it works
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=3"]) == 0
    assert _metric_steps(run) == [1, 2, 3]


@pytest.mark.parametrize("case", ["cut safetensors", "garbage optimizer, same size", "cut rng", "no state.json",
                                  "bad state.json"])
def test_a_bad_checkpoint_without_a_manifest_is_skipped(run, case, capsys):
    ckpt = _ckpt(run, 2)
    (ckpt / MANIFEST).unlink()
    if case == "bad state.json":
        (ckpt / "state.json").write_text('{"format": 1, "step":')
        words = ["state.json cannot be read"]
    else:
        damage, _ = DAMAGE[case]
        damage(ckpt)
        words = {"cut safetensors": ["model/model.safetensors is 1,000 bytes, but its header"],
                 "garbage optimizer, same size": ["optimizer.pt cannot be loaded"],
                 "cut rng": ["rng_rank0.safetensors is 20 bytes"],
                 "no state.json": ["state.json is missing"]}[case]
    assert find_checkpoint(run) == _ckpt(run, 1)
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert "using step_000001" in err and "weights_only" not in err


def test_every_load_error_names_the_file_and_never_suggests_weights_only_false(run):
    from verirl.models import load_model
    from verirl.train.update import build_optimizer

    lm = load_model("tiny")
    optimizer, scheduler = build_optimizer(lm.model, 1e-5, (0.9, 0.999), 0.0, 1)
    ckpt = load_checkpoint(_ckpt(run, 2))
    for rel, damage in [("optimizer.pt", lambda f: _garbage(f, same_size=True)),
                        ("optimizer.pt", lambda f: _cut(f, 1000)),
                        ("rng_rank0.safetensors", lambda f: _cut(f, 20)),
                        ("model/model.safetensors", lambda f: _cut(f, 1000))]:
        copy = run / "copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(_ckpt(run, 2), copy)
        damage(copy / rel)
        with pytest.raises(CheckpointError) as e:  # bypassing find_checkpoint: what a race could meet
            restore_training_state(load_checkpoint(copy), lm.model, optimizer, scheduler)
        assert str(copy / rel) in str(e.value) and "weights_only" not in str(e.value), str(e.value)
        assert e.value.__cause__ is not None  # the library's error, chained
    (copy / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="state.json cannot be read") as e:
        load_checkpoint(copy)
    assert isinstance(e.value.__cause__, ValueError)
    restore_training_state(ckpt, lm.model, optimizer, scheduler)  # the undamaged one still loads


def test_export_refuses_a_bad_checkpoint_and_exports_the_newest_good_one(run, tmp_path, capsys):
    _garbage(_ckpt(run, 2) / "optimizer.pt", same_size=True)
    out = tmp_path / "out"
    assert main(["export", str(_ckpt(run, 2)), str(out)]) == 2
    err = capsys.readouterr().err
    assert "optimizer.pt does not match its checksum" in err and str(_ckpt(run, 2)) in err
    assert not out.exists() and not (tmp_path / "out.tmp").exists()
    assert main(["export", str(run), str(out)]) == 0  # the run: its newest good checkpoint, saying so
    err = capsys.readouterr().err
    assert "step_000002" in err and "using step_000001" in err
    assert file_checksum(out / "model.safetensors") == file_checksum(_ckpt(run, 1) / "model" / "model.safetensors")
    out2 = tmp_path / "out2"
    assert main(["export", str(_ckpt(run, 1)), str(out2)]) == 0


def test_export_of_a_run_with_no_good_checkpoint_is_refused(run, tmp_path, capsys):
    for step in (1, 2):
        _cut(_ckpt(run, step) / "model" / "model.safetensors", 1000)
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "none can be used" in err and "step_000001" in err and "step_000002" in err
    assert not (tmp_path / "out").exists()


def test_resume_from_a_named_bad_checkpoint_is_refused(run, capsys):
    _cut(_ckpt(run, 1) / "rng_rank0.safetensors", 20)
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=3",
                 f"trainer.resume={_ckpt(run, 1)}"]) == 2
    err = capsys.readouterr().err
    assert "rng_rank0.safetensors is 20 bytes" in err and "Traceback" not in err


def test_a_bad_newer_checkpoint_never_crowds_out_the_one_just_written(run):
    """keep_checkpoints counts up to the step saved: a damaged step_000005 left behind must not
    make the rotation delete the fresh step_000003 (and leave nothing usable)."""
    shutil.copytree(_ckpt(run, 2), _ckpt(run, 5))
    _cut(_ckpt(run, 5) / "optimizer.pt", 1000)
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=3", "trainer.keep_checkpoints=1"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000003", "step_000005"]
    assert find_checkpoint(run) == _ckpt(run, 3)


def test_export_into_a_file_or_below_one_is_one_paragraph(trained, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    for out in (a_file, a_file / "model"):
        assert main(["export", str(trained), str(out)]) == 2
        err = capsys.readouterr().err
        assert str(out) in err and "Traceback" not in err and err.count("\n") == 1, err
    assert a_file.read_text() == "not a directory"


def test_a_finished_run_started_again_with_a_change_says_it_is_complete(run, capsys):
    lines = (run / "metrics.jsonl").read_text()
    assert main([*ARGS, f"trainer.run_dir={run}", "trainer.total_steps=2", "actor.lr=1e-3"]) == 0
    out = capsys.readouterr().out
    assert f"the run in {run} is complete" in out and "actor.lr 7e-05 -> 0.001" in out, out
    assert "trainer.total_steps=4" in out and "trainer.resume=false trainer.overwrite=true" in out, out
    assert "apply from here on" not in out and "resuming from" not in out
    assert (run / "metrics.jsonl").read_text() == lines  # no step trained
