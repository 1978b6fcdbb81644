"""Checkpoints that are never half-written, verified before they are trusted, and exact resume.

Layout of ``RUN_DIR/checkpoints``::

    step_000020/
        model/                  a Hugging Face directory (config, model.safetensors, tokenizer,
                                generation_config): what `verirl export` copies out
        optimizer.pt            optimizer + scheduler state (tensors, numbers: loaded weights_only)
        rng_rank0.safetensors   torch CPU (and CUDA) generator states of rank 0
        state.json              step, sampler position, python / numpy RNG states of rank 0,
                                byte offsets of metrics.jsonl and rollouts.jsonl, format version
        manifest.json           every other file's relative path, size in bytes and zlib.crc32
    latest                      the name of the newest complete checkpoint, written last

A checkpoint is written to ``step_N.tmp``; its manifest is written last, every file is flushed,
and only then is it renamed into place; then ``latest`` is replaced atomically; older
checkpoints beyond ``trainer.keep_checkpoints`` are removed after that. A kill at any moment
leaves either the previous checkpoint or the new one, never a partial one.

A checkpoint is verified before it is used (`find_checkpoint`): every file in its manifest must
exist with the size and checksum recorded at save. A checkpoint written before manifests
existed is checked by loading its headers (each safetensors header against the file's size,
``optimizer.pt`` through ``torch.load(weights_only=True)``, the JSON files parsed) and used with
a warning. In a run directory the newest checkpoint that verifies is used and each bad one
skipped is named on stderr; a run directory whose checkpoints all fail is an error (never a
silent fresh start). Nothing is unpickled on load: weights come from safetensors, optimizer
state through ``torch.load(weights_only=True)``; every failure to load a checkpoint's file is a
`CheckpointError` naming the file.

A checkpoint has one of two formats (``trainer.checkpoint_format``, docs/checkpoints.md):

* whole: the files above; the model's and the optimizer's states gathered whole and written by rank 0.
* sharded (``"weights": "sharded"`` in state.json): ``model/`` without weights, ``optimizer.pt`` with the
  optimizer's hyperparameters and the scheduler only, and ``shards/rankR.safetensors`` +
  ``shards/rankR.json`` from every rank R (`verirl.run.shards`): each rank writes the pieces it holds;
  rank 0 writes the rest after all of them are on disk, then the manifest over every rank's files, and
  renames. state.json names the writing layout (world, dp, tp, sp, pp, ep).

Both resume on any layout (`verirl.train.checkpoint`): whole tensors are laid out as the model's shards,
sharded pieces are read by overlap with what each rank holds. `export_checkpoint` writes a Hugging Face
directory from either, a sharded one tensor by tensor.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from verirl.core.errors import CheckpointError
from verirl.run.load_errors import damaged, reason  # noqa: F401 - also the callers' names here

FORMAT = 1
LATEST = "latest"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
CHUNK = 8 << 20  # bytes read per checksum update (bench/checkpoint_checksum.py)
STEP_DIR = re.compile(r"step_(\d+)")
REQUIRED = ("state.json", "optimizer.pt", "rng_rank0.safetensors", "model/config.json")  # and model/*.safetensors,
# or with "weights": "sharded" in state.json, every rank's shards/rankR.safetensors and shards/rankR.json
SHARDED = "sharded"
ADAPTERS = "lora"  # state.json "weights" of a LoRA run's checkpoint: model/ is a peft adapter directory
START_OVER = ("To start this run over use trainer.resume=false trainer.overwrite=true (it deletes these "
              "checkpoints and the run's logs); to keep them, move them away first or choose a new "
              "trainer.run_dir.")


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


def file_checksum(path: Path) -> str:
    """zlib.crc32 of a file's bytes, streamed in CHUNK pieces, as 8 hex digits. crc32 rather than
    a cryptographic hash: it is there to catch damage (a cut or overwritten file), not tampering,
    and it is the fastest of the standard library's (BENCHMARKS.md, "Checkpoint checksums")."""
    crc = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return f"{crc:08x}"


def write_manifest(ckpt_dir: Path) -> dict:
    """Write ``manifest.json`` for every other file under ``ckpt_dir``; returns it."""
    files = {}
    for p in sorted(ckpt_dir.rglob("*")):
        rel = p.relative_to(ckpt_dir).as_posix()
        if p.is_file() and rel != MANIFEST:
            files[rel] = {"size": p.stat().st_size, "crc32": file_checksum(p)}
    manifest = {"manifest": MANIFEST_FORMAT, "checksum": "crc32", "files": files}
    (ckpt_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


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


def save_checkpoint(ckpt_root: Path, step: int, model, tokenizer, stop_ids, weights: dict, optimizer_state: dict,
                    scheduler_state: dict, extra: dict, keep: int = 0, adapter_base: Optional[str] = None) -> Path:
    """Write checkpoint ``step`` atomically, its manifest last (see the module docstring); returns
    its path. ``weights`` and ``optimizer_state``: whole tensors (a sharded model's gathered first);
    ``model`` gives the Hugging Face directory its config, ``tokenizer`` and ``stop_ids`` the rest.
    ``adapter_base``: a LoRA run's, whose ``model/`` is a peft adapter directory over that base."""
    from verirl.models import save_hf

    tmp = begin_checkpoint(ckpt_root, step)
    save_hf(model, tokenizer, tmp / "model", stop_ids, weights, adapter_base=adapter_base)
    if os.environ.get("VERIRL_TEST_KILL_IN_SAVE") == f"{step}:0":  # tests: the process dies mid-save
        os.kill(os.getpid(), signal.SIGKILL)
    torch.save({"optimizer": optimizer_state, "scheduler": scheduler_state}, tmp / "optimizer.pt")
    _write_state(tmp, {"format": FORMAT, "step": step, "world_size": 1, **extra,
                       **({"weights": ADAPTERS} if adapter_base is not None else {})})
    return finish_checkpoint(ckpt_root, tmp, step, keep)


def begin_checkpoint(ckpt_root: Path, step: int) -> Path:
    """The empty ``step_N.tmp`` directory a checkpoint is written into (a stale one removed)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / (f"step_{step:06d}" + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for left in ckpt_root.glob("*.discarded.tmp"):  # a deletion a kill interrupted
        shutil.rmtree(left, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_sharded_rest(tmp: Path, step: int, model, tokenizer, stop_ids, param_groups: list[dict],
                      scheduler_state: dict, layout: dict, extra: dict) -> None:
    """Rank 0's files of a sharded checkpoint, once every rank's shards are in ``tmp``: ``model/`` without
    weights, the optimizer's hyperparameters and the scheduler, the RNG states, state.json."""
    from verirl.models import save_hf

    save_hf(model, tokenizer, tmp / "model", stop_ids, {})
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": []} for g in param_groups]
    torch.save({"optimizer": {"state": {}, "param_groups": groups}, "scheduler": scheduler_state}, tmp / "optimizer.pt")
    _write_state(tmp, {"format": FORMAT, "step": step, "world_size": layout["world"], "weights": SHARDED,
                       "layout": layout, **extra})


def _write_state(tmp: Path, state: dict) -> None:
    from safetensors.torch import save_file

    meta, tensors = rng_state()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "rng_rank0.safetensors"))
    (tmp / "state.json").write_text(json.dumps({**state, "rng_rank0": meta}))


def finish_checkpoint(ckpt_root: Path, tmp: Path, step: int, keep: int = 0) -> Path:
    """The manifest over every file in ``tmp``, all flushed, ``tmp`` renamed to ``step_N``, then ``latest``;
    then the checkpoints beyond the newest ``keep`` removed. -> the checkpoint's path."""
    name = f"step_{step:06d}"
    final = ckpt_root / name
    write_manifest(tmp)
    _fsync_tree(tmp)
    if final.exists():  # a re-save of the same step (e.g. after a resume): replace it whole
        _discard(final)
    os.rename(tmp, final)
    _fsync_dir(ckpt_root)
    pointer = ckpt_root / (LATEST + ".tmp")
    pointer.write_text(name + "\n")
    with open(pointer, "rb") as f:
        os.fsync(f.fileno())
    os.replace(pointer, ckpt_root / LATEST)
    _fsync_dir(ckpt_root)
    if keep > 0:  # counted up to this step: newer ones (left by a run resumed from an older, good checkpoint
        # past a bad one) are replaced when their step comes, and never crowd out the one just written
        done = sorted((p for p in ckpt_root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name)
                       and int(STEP_DIR.fullmatch(p.name).group(1)) <= step),
                      key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)))
        for old in done[:-keep]:
            _discard(old)
    return final


def _discard(path: Path) -> None:
    """Delete a checkpoint directory so that a kill part-way leaves only a ``*.tmp`` name (never a
    half-deleted ``step_N``): renamed first (atomic), then removed."""
    trash = path.with_name(f"{path.name}.discarded.tmp")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    _fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)


# ---- verification -------------------------------------------------------------------------------

def _safetensors_problem(path: Path, rel: str) -> Optional[str]:
    """What is wrong with a safetensors file, judged by its header against its size (None: fine)."""
    size = path.stat().st_size
    if size < 8:
        return f"{rel} is {size:,} bytes, too short for a safetensors file"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            return f"{rel} is {size:,} bytes, but its header alone claims {n + 8:,}: the file is cut"
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            return f"{rel}: its safetensors header cannot be read, the file is damaged ({reason(e)})"
    if size != 8 + n + end:
        return f"{rel} is {size:,} bytes, its safetensors header says {8 + n + end:,}"
    return None


def _json_problem(path: Path, rel: str) -> Optional[str]:
    try:
        json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        return f"{rel} is not valid JSON: {reason(e)}"
    return None


def _state_problem(path: Path) -> Optional[str]:
    try:
        state = _read_state(path)
    except CheckpointError as e:
        return str(e).removeprefix(f"{path}: ")
    missing = [k for k in ("step", "rng_rank0") if k not in state]
    return f"state.json lacks {', '.join(missing)}" if missing else None


def holds_adapters(path: Path) -> bool:
    """Whether a checkpoint holds LoRA adapters (its model/ a peft adapter directory), by its state.json."""
    try:
        return json.loads((Path(path) / "state.json").read_bytes()).get("weights") == ADAPTERS
    except (OSError, ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return False


def shard_world(path: Path) -> Optional[int]:
    """The number of ranks whose shards a sharded checkpoint holds (state.json's layout); None for a
    checkpoint of whole tensors, or when state.json cannot tell."""
    try:
        state = json.loads((Path(path) / "state.json").read_bytes())
        return int(state["layout"]["world"]) if state.get("weights") == SHARDED else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        return None


def _missing_required(path: Path) -> list[str]:
    from verirl.run.shards import shard_files

    world = shard_world(path)
    required = list(REQUIRED) + ([rel for r in range(world) for rel in shard_files(r)] if world else [])
    if holds_adapters(path):
        required = [rel if rel != "model/config.json" else "model/adapter_config.json" for rel in required]
    out = [f"{rel} is missing" for rel in required if not (path / rel).is_file()]
    if (path / "model").is_dir() and not world and not any((path / "model").glob("*.safetensors")):
        out.append("model/ holds no .safetensors weights")
    elif not (path / "model").is_dir():
        out = [p for p in out if not p.startswith("model/")] + ["model/ is missing"]
    return out


def _shard_problems(path: Path) -> list[str]:
    """A sharded checkpoint's indexes: every element of every tensor stored once (JSON only)."""
    from verirl.run.shards import coverage_problems

    world = shard_world(path)
    return coverage_problems(path, world) if world else []


def _manifest_problems(path: Path) -> list[str]:
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
        files = manifest["files"]
        entries = [(str(rel), int(e["size"]), str(e["crc32"])) for rel, e in files.items()]
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
        return [f"{MANIFEST} cannot be read: {reason(e)}"]
    problems, to_sum = [], []
    for rel, size, crc in entries:
        f = path / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{MANIFEST} names {rel!r}, outside the checkpoint")
        elif not f.is_file():
            problems.append(f"{rel} is missing")
        elif f.stat().st_size != size:
            problems.append(f"{rel} is {f.stat().st_size:,} bytes, the manifest says {size:,}")
        else:
            to_sum.append((rel, f, crc))
    problems = problems or _missing_required(path)  # a manifest that does not list them all
    if problems:  # sizes and presence first: cheap, and enough to condemn the checkpoint
        return problems
    for rel, f, crc in to_sum:
        got = file_checksum(f)
        if got != crc:
            problems.append(f"{rel} does not match its checksum (crc32 {got}, the manifest says {crc}): "
                            f"its bytes changed after the save")
    return problems


def _header_problems(path: Path) -> list[str]:
    """A checkpoint without a manifest (written by an older verirl): load what can be loaded cheaply."""
    problems = _missing_required(path)
    if problems:
        return problems
    for f in sorted([*path.glob("rng_rank*.safetensors"), *(path / "model").glob("*.safetensors"),
                     *path.glob("shards/*.safetensors")]):
        problems.append(_safetensors_problem(f, f.relative_to(path).as_posix()))
    config = "model/adapter_config.json" if holds_adapters(path) else "model/config.json"
    problems.append(_json_problem(path / config, config))
    try:
        opt = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
        if not (isinstance(opt, dict) and {"optimizer", "scheduler"} <= set(opt)):
            problems.append("optimizer.pt holds no optimizer and scheduler state")
    except Exception as e:  # noqa: BLE001 - whatever torch raises, the file is unusable
        problems.append(f"optimizer.pt cannot be loaded: {reason(e)}")
    return [p for p in problems if p]


def check_checkpoint(path: Path) -> tuple[Optional[str], bool]:
    """(what is wrong with the checkpoint at ``path``, or None; whether a manifest verified it)."""
    path = Path(path)
    if not path.is_dir():
        return ("does not exist" if not path.exists() else "is not a directory"), False
    manifest = (path / MANIFEST).is_file()
    problems = _manifest_problems(path) if manifest else _header_problems(path)
    if not problems:
        state = _state_problem(path)
        problems = [state] if state else _shard_problems(path)
    return (", and ".join(problems) or None), manifest


def verify_checkpoint(path: Path) -> bool:
    """Raise CheckpointError naming what is wrong with the checkpoint at ``path``; -> True when its
    manifest verified it, False when it has none (written before manifests; its headers load)."""
    problem, manifest = check_checkpoint(path)
    if problem:
        raise CheckpointError(f"checkpoint {path}: {problem}. It cannot be used: resume from or export "
                              f"another checkpoint (RUN_DIR/checkpoints/step_N), or give the run directory "
                              f"to use its newest good one.")
    return manifest


def _warn_unverified(path: Path) -> None:
    print(f"verirl: {path} has no {MANIFEST} (written before verirl verified checkpoints); its files' "
          f"headers load, so it is used without a checksum check.", file=sys.stderr)


def _looks_like_checkpoint(path: Path) -> bool:
    return any((path / f).exists() for f in ("state.json", MANIFEST, "optimizer.pt", "rng_rank0.safetensors"))


def _candidates(root: Path) -> list[Path]:
    """The checkpoints under ``root``: the one ``latest`` names first (even if it is gone: that is
    worth saying), then the others, newest step first. ``step_N.tmp`` are unfinished writes, not
    checkpoints."""
    found = sorted((p for p in root.glob("step_*") if STEP_DIR.fullmatch(p.name) and p.is_dir()),
                   key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)), reverse=True)
    try:
        named = (root / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        named = ""
    if STEP_DIR.fullmatch(named):
        first = root / named
        return [first] + [p for p in found if p.name != named]
    return found


def find_checkpoint(path: Path) -> Optional[Path]:
    """A checkpoint directory from a checkpoint, a checkpoints/ folder or a run directory (the
    newest that verifies), or None when there is no checkpoint at all.

    A checkpoint given itself must verify, else CheckpointError. In a folder of checkpoints, each
    bad one passed over is named on stderr with what is wrong; when none verifies, CheckpointError
    names every one (starting over is the user's explicit choice, never a fallback)."""
    path = Path(path)
    if _looks_like_checkpoint(path):
        if not verify_checkpoint(path):
            _warn_unverified(path)
        return path
    for root in (path / "checkpoints", path):
        cands = _candidates(root)
        if not cands:
            continue
        bad = []
        for cand in cands:
            problem, manifest = check_checkpoint(cand)
            if problem is None:
                for b, why in bad:
                    print(f"verirl: {b}: {why}; skipped, using {cand.name}", file=sys.stderr)
                if not manifest:
                    _warn_unverified(cand)
                return cand
            if not cand.exists():
                problem = f"named by {root / LATEST} but {problem}"
            bad.append((cand, problem))
        listing = "; ".join(f"{b.name}: {why}" for b, why in bad)
        raise CheckpointError(f"{root} holds {len(bad)} checkpoint{'s' if len(bad) > 1 else ''} and none can "
                              f"be used: {listing}. {START_OVER}")
    return None


# ---- loading ------------------------------------------------------------------------------------

def _read_state(path: Path) -> dict:
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_bytes())
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: state.json is missing") from e
    except (ValueError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{path}: state.json cannot be read: {reason(e)}") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: state.json holds no checkpoint state")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')} is not {FORMAT}, the one this "
                              f"verirl reads")
    return state


def load_checkpoint(path: Path) -> Checkpoint:
    path = Path(path)
    if not (path / "state.json").exists():
        raise CheckpointError(f"{path} is not a verirl checkpoint (no state.json). Give a directory like "
                              f"RUN_DIR/checkpoints/step_000020, or the run directory itself.")
    try:
        return Checkpoint(path, _read_state(path))
    except CheckpointError as e:
        raise CheckpointError(f"{e}. Resume from another checkpoint (trainer.resume=RUN_DIR/checkpoints/step_N) "
                              f"or give the run directory to use its newest good one.") from e.__cause__


def load_weights(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """The model's whole tensors (safetensors) of a checkpoint of whole tensors; a file that fails to load
    is a CheckpointError naming it."""
    from safetensors.torch import load_file

    weights = {}
    files = sorted(ckpt.model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{ckpt.model_dir}: no .safetensors weights. The checkpoint is damaged: resume "
                              f"from another one (trainer.resume=RUN_DIR/checkpoints/step_N).")
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError and OSError
            raise damaged(f, "the model weights", e) from e
    return weights


def load_optimizer_state(ckpt: Checkpoint) -> dict:
    """{"optimizer": ..., "scheduler": ...} as saved, read with ``weights_only`` (nothing unpickled)."""
    return torch.load(ckpt.path / "optimizer.pt", weights_only=True, map_location="cpu")


def restore_rng(ckpt: Checkpoint) -> None:
    """The python / numpy / torch generator states of rank 0 at the save, set in this process."""
    from safetensors.torch import load_file

    rng_file = ckpt.path / "rng_rank0.safetensors"
    try:
        tensors = load_file(str(rng_file))
    except Exception as e:  # noqa: BLE001
        raise damaged(rng_file, "the random generator states", e) from e
    try:
        set_rng_state(ckpt.state["rng_rank0"], tensors)
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
        raise damaged(ckpt.path / "state.json", "the random generator states", e) from e


def export_checkpoint(checkpoint: Path, out_dir: Path, adapter: bool = False) -> Path:
    """Copy a verified checkpoint's Hugging Face model directory to ``out_dir`` (atomically). From a
    run directory: its newest checkpoint that verifies (bad ones skipped are named on stderr). A LoRA
    run's checkpoint: the merged model, or with ``adapter`` its peft adapter directory."""
    found = find_checkpoint(Path(checkpoint))
    if found is None:
        raise CheckpointError(f"no verirl checkpoint in {checkpoint}: give RUN_DIR, RUN_DIR/checkpoints or "
                              f"RUN_DIR/checkpoints/step_N.")
    ckpt = load_checkpoint(found)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"{out_dir} is a file; give a new directory to export into.")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise CheckpointError(f"{out_dir} exists and is not empty; choose a new output directory.")
    if adapter and not holds_adapters(ckpt.path):
        raise CheckpointError(f"--adapter: {ckpt.path} holds a whole model, not LoRA adapters (its run had "
                              f"actor.lora.rank=0); export it without --adapter.")
    try:
        export_model_dir(ckpt, out_dir, merged=not adapter)
    except OSError as e:  # a parent that is a file, a read-only disk, no permission, a full disk
        raise CheckpointError(f"could not write {out_dir} ({type(e).__name__}: {e.strerror or e}); give a new "
                              f"directory on a writable disk.") from None
    return out_dir


def export_model_dir(ckpt: Checkpoint, out_dir: Path, merged: bool = True) -> None:
    """``ckpt``'s Hugging Face directory at ``out_dir`` (written beside it, then renamed into place; an
    existing ``out_dir`` replaced): copied, and for a sharded checkpoint its ``model.safetensors`` written
    from the shards one tensor at a time (`verirl.run.shards.write_safetensors`). A LoRA checkpoint's
    adapter directory is copied as it is, or with ``merged`` its base model loaded with the adapter merged
    in and written as a plain Hugging Face directory."""
    from verirl.run.shards import Shards, write_safetensors

    out_dir = Path(out_dir)
    if merged and holds_adapters(ckpt.path):
        from verirl.models import load_model, save_hf

        model = (ckpt.state.get("config") or {}).get("model") or {}
        lm = load_model(str(ckpt.model_dir), model.get("dtype", "float32"), "cpu", dict(model.get("override_config") or {}))
        save_hf(lm.model, lm.tokenizer, out_dir, lm.stop_ids)  # written beside, then renamed into place
        _fsync_dir(out_dir.parent)
        return
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt.model_dir, tmp)
    world = shard_world(ckpt.path)
    if world:
        from verirl.models import saved_format

        write_safetensors(Shards(ckpt.path, world), tmp / "model.safetensors", saved_format(tmp))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    _fsync_dir(out_dir.parent)
