"""Checkpoints that are never half-written, and exact resume.

Layout of ``RUN_DIR/checkpoints``::

    step_000020/
        model/                  a Hugging Face directory (config, model.safetensors, tokenizer,
                                generation_config): what `verirl export` copies out
        optimizer.pt            optimizer + scheduler state (tensors, numbers: loaded weights_only)
        rng_rank0.safetensors   torch CPU (and CUDA) generator states of rank 0
        state.json              step, sampler position, python / numpy RNG states of rank 0,
                                byte offsets of metrics.jsonl and rollouts.jsonl, format version
    latest                      the name of the newest complete checkpoint, written last

A checkpoint is written to ``step_N.tmp`` and renamed into place only once every file is
written and flushed, then ``latest`` is replaced atomically; older checkpoints beyond
``trainer.keep_checkpoints`` are removed after that. A kill at any moment leaves either the
previous checkpoint or the new one, never a partial one. Nothing is unpickled on load:
weights come from safetensors, optimizer state through ``torch.load(weights_only=True)``.

Sharded (data-parallel) runs will add ``model/`` shards and ``rng_rank{r}`` files per rank;
``state.json`` carries ``world_size`` so that loaders can tell.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from verirl.errors import CheckpointError
FORMAT = 1
LATEST = "latest"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(root)


def rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON-able python/numpy states, tensors for safetensors)."""
    py = random.getstate()
    np_state = np.random.get_state()
    meta = {"python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]}
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return meta, tensors


def set_rng_state(meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    v, state, gauss = meta["python"]
    random.setstate((v, tuple(state), gauss))
    n = meta["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)


@dataclass
class Checkpoint:
    path: Path
    state: dict

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def save_checkpoint(ckpt_root: Path, step: int, model, tokenizer, stop_ids, optimizer, scheduler, extra: dict,
                    keep: int = 0) -> Path:
    """Write checkpoint ``step`` atomically (see the module docstring); returns its path."""
    from safetensors.torch import save_file

    from verirl.models import save_hf

    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final, tmp = ckpt_root / name, ckpt_root / (name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_hf(model, tokenizer, tmp / "model", stop_ids)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
    meta, tensors = rng_state()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "rng_rank0.safetensors"))
    state = {"format": FORMAT, "step": step, "world_size": 1, "rng_rank0": meta, **extra}
    (tmp / "state.json").write_text(json.dumps(state))
    _fsync_tree(tmp)
    if final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_root)
    pointer = ckpt_root / (LATEST + ".tmp")
    pointer.write_text(name + "\n")
    with open(pointer, "rb") as f:
        os.fsync(f.fileno())
    os.replace(pointer, ckpt_root / LATEST)
    _fsync_dir(ckpt_root)
    if keep > 0:
        done = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def find_checkpoint(path: Path) -> Optional[Path]:
    """A checkpoint directory from a checkpoint, a checkpoints/ folder or a run directory
    (the newest complete one), or None when there is none."""
    path = Path(path)
    if (path / "state.json").exists():
        return path
    for root in (path / "checkpoints", path):
        pointer = root / LATEST
        if pointer.exists():
            cand = root / pointer.read_text().strip()
            if (cand / "state.json").exists():
                return cand
        done = sorted(p for p in root.glob("step_*") if (p / "state.json").exists() and not p.name.endswith(".tmp"))
        if done:
            return done[-1]
    return None


def load_checkpoint(path: Path) -> Checkpoint:
    path = Path(path)
    state_file = path / "state.json"
    if not state_file.exists():
        raise CheckpointError(f"{path} is not a verirl checkpoint (no state.json). Give a directory like "
                                f"RUN_DIR/checkpoints/step_000020, or the run directory itself.")
    state = json.loads(state_file.read_text())
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')} is not {FORMAT}, the one this verirl reads.")
    return Checkpoint(path, state)


def restore_training_state(ckpt: Checkpoint, model, optimizer, scheduler) -> None:
    """Weights (safetensors), optimizer and scheduler (weights_only), RNG states: in place."""
    from safetensors.torch import load_file

    weights = {}
    for f in sorted(ckpt.model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")} if model.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"{ckpt.model_dir}: weights do not fit the model (missing {sorted(set(missing) - tied)[:3]}, "
                         f"unexpected {sorted(unexpected)[:3]}).")
    if tied:
        model.tie_weights()
    opt = torch.load(ckpt.path / "optimizer.pt", weights_only=True, map_location="cpu")
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    set_rng_state(ckpt.state["rng_rank0"], load_file(str(ckpt.path / "rng_rank0.safetensors")))


def export_checkpoint(checkpoint: Path, out_dir: Path) -> Path:
    """Copy a checkpoint's Hugging Face model directory to ``out_dir`` (atomically)."""
    found = find_checkpoint(Path(checkpoint))
    if found is None:
        raise CheckpointError(f"no verirl checkpoint in {checkpoint}: give RUN_DIR, RUN_DIR/checkpoints or "
                                f"RUN_DIR/checkpoints/step_N.")
    ckpt = load_checkpoint(found)
    if ckpt.state.get("world_size", 1) != 1:
        raise CheckpointError(f"{found} is sharded over {ckpt.state['world_size']} ranks; merging shards "
                                  f"is not implemented yet.")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise CheckpointError(f"{out_dir} exists and is not empty; choose a new output directory.")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt.model_dir, tmp)
    if out_dir.exists():
        out_dir.rmdir()
    os.rename(tmp, out_dir)
    return out_dir
