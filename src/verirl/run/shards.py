"""Sharded checkpoints: every rank writes the pieces of the model and optimizer state it holds, and a
resuming rank reads only the pieces that overlap what it holds, whatever the layouts of the two runs.

Inside a checkpoint directory (`verirl.run.checkpoint` writes the rest and the manifest over all)::

    shards/rank00003.safetensors    this rank's blocks: of each parameter it holds and of its optimizer
                                    state (AdamW's exp_avg, exp_avg_sq, and the scalar step)
    shards/rank00003.json           their index: for each stored key the global name (the parameter's
                                    name in ``model.state_dict()``, a tied weight once), what it is
                                    ("weight" or the optimizer state's key), the global shape and dtype,
                                    and the block's offset and size in every dimension

A block is a DTensor's local tensor placed by its global offset
(`torch.distributed.tensor._utils.compute_local_shape_and_global_offset`): FSDP2's rows, a tensor-parallel
column or row split, FSDP2 over tensor parallel (``_StridedShard``: still one box per rank), a plain
tensor whole at offset 0, an expert-parallel rank's expert slice at its experts' rows of the fused (E, ...)
tensor (`place`; inside it FSDP2's rows over the expert-data-parallel ranks). The ranks that hold the same block (a replicated tensor; a data-parallel copy;
the tied embedding on a pipeline's two end stages) leave it to the lowest of them, so every element is
written exactly once; a pipelined rank writes only its stages' parameters.

Loading is by overlap: each tensor this rank holds asks for its box, and the box is assembled from the
saved pieces that intersect it (`safe_open(...).get_slice`: only the intersection is read), so a rank
reads what it holds plus one piece at a time. `write_safetensors` streams the whole tensors out one at a
time in Hugging Face's file layout (what `verirl export` and the run's ``final/`` write), under the names
``save_pretrained`` gives them (a MoE's fused experts written one by one, as the model's hub files hold
them).

The format is verirl's own rather than ``torch.distributed.checkpoint``'s files: DCP's ``.metadata`` is
read with ``pickle.load``, and nothing a verirl checkpoint holds is ever unpickled; here every file is
JSON or safetensors.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from verirl.core.errors import CheckpointError

SHARDS = "shards"
INDEX_FORMAT = 1
WEIGHT = "weight"  # the part of a parameter that is its value (the others: its optimizer state's keys)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
          "bool": torch.bool}
# safetensors' names, and the order its writer lays tensors out in (larger dtypes first, then by name)
ST_DTYPES = {torch.float64: "F64", torch.int64: "I64", torch.float32: "F32", torch.int32: "I32",
             torch.bfloat16: "BF16", torch.float16: "F16", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}
ST_ORDER = ("I64", "F64", "F32", "I32", "BF16", "F16", "I16", "I8", "U8", "BOOL")


def shard_files(rank: int) -> tuple[str, str]:
    """The relative paths of rank ``rank``'s pieces and their index."""
    return f"{SHARDS}/rank{rank:05d}.safetensors", f"{SHARDS}/rank{rank:05d}.json"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Block:
    """One stored piece: part ``part`` of global tensor ``name``, its box ``offset`` + ``size``."""
    key: str  # its key in the rank's safetensors file
    name: str  # the global name (parameter FQN)
    part: str  # WEIGHT, or an optimizer state key (exp_avg, exp_avg_sq, step)
    shape: tuple[int, ...]  # the global tensor's shape
    dtype: str
    offset: tuple[int, ...]
    size: tuple[int, ...]

    def entry(self) -> dict:
        return {"name": self.name, "part": self.part, "shape": list(self.shape), "dtype": self.dtype,
                "offset": list(self.offset), "size": list(self.size)}


def stored_key(name: str, part: str) -> str:
    return name if part == WEIGHT else f"{name}::{part}"


def box(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(this rank's local tensor of ``t``, its global offset, its size): a DTensor's local shard and where
    it sits; a plain tensor whole at offset 0."""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return t, (0,) * t.dim(), tuple(t.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    size, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    local = t.to_local()
    if tuple(local.shape) != tuple(size):
        raise RuntimeError(f"a DTensor of shape {tuple(t.shape)} placed {t.placements} holds a local tensor of "
                           f"{tuple(local.shape)}, but its block is computed as {tuple(size)}")
    return local, tuple(int(o) for o in offset), tuple(int(s) for s in size)


def place(t: torch.Tensor, owner: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(this rank's local tensor of ``t``, the global tensor's shape, the block's offset in it, its size):
    `box`, and for an expert slice (``owner``, the parameter ``t`` is or whose optimizer state it is, split
    by expert parallelism: `verirl.models.expert_parallel.expert_rows`) its rows placed among all the
    experts, so that the pieces of every layout are boxes of the one fused (E, ...) tensor."""
    from verirl.models.expert_parallel import expert_rows

    local, offset, size = box(t)
    shape = tuple(int(s) for s in t.shape)
    rows = expert_rows(owner) if shape else None
    if rows is not None:
        first, experts = rows
        shape, offset = (experts,) + shape[1:], (offset[0] + first,) + offset[1:]
    return local, shape, offset, size


def named_tensors(model) -> list[tuple[list[str], torch.Tensor]]:
    """Each distinct tensor of ``model.state_dict()`` once, with all its names (a tied weight has two)."""
    seen: dict[int, int] = {}
    out: list[tuple[list[str], torch.Tensor]] = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            out[seen[id(t)]][0].append(name)
        else:
            seen[id(t)] = len(out)
            out.append(([name], t))
    return out


def local_blocks(model, optimizer, held: Callable[[torch.Tensor], bool]) -> list[tuple[Block, torch.Tensor]]:
    """Every block this rank holds: of each tensor of ``model`` that ``held`` accepts (a pipelined rank's
    stages' ones) and of its optimizer state; empty blocks (an uneven FSDP2 split) left out."""
    out = []
    names: dict[int, str] = {}
    for tensor_names, t in named_tensors(model):
        if not held(t):
            continue
        names[id(t)] = tensor_names[0]
        out.append(_block(tensor_names[0], WEIGHT, t, t))
    if optimizer is not None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in names:
                    continue
                for part, v in optimizer.state.get(p, {}).items():
                    if not torch.is_tensor(v):
                        raise TypeError(f"the optimizer state {part!r} of {names[id(p)]} is a {type(v).__name__}; "
                                        f"a sharded checkpoint stores tensors only")
                    out.append(_block(names[id(p)], part, v, p))
    return [(b, t) for b, t in out if math.prod(b.size) > 0 or not b.shape]


def _block(name: str, part: str, t: torch.Tensor, owner: torch.Tensor) -> tuple[Block, torch.Tensor]:
    local, shape, offset, size = place(t.detach(), owner)
    return Block(stored_key(name, part), name, part, shape, _dtype_name(t.dtype), offset, size), local


def writers(blocks_per_rank: list[list[tuple]]) -> list[set]:
    """For each rank, the (key, offset, size) of the blocks it writes: each block by the lowest rank that
    holds it."""
    taken: set = set()
    out = []
    for blocks in blocks_per_rank:
        mine = {b for b in blocks if b not in taken}
        taken |= mine
        out.append(mine)
    return out


def write_rank(ckpt_dir: Path, rank: int, world: int, blocks: list[tuple[Block, torch.Tensor]],
               tied: dict[str, str]) -> list[Path]:
    """Write this rank's blocks and their index under ``ckpt_dir/shards`` (flushed to disk); -> the files."""
    from safetensors.torch import save_file

    tensors_rel, index_rel = shard_files(rank)
    (ckpt_dir / SHARDS).mkdir(parents=True, exist_ok=True)
    tensors = {b.key: t.detach().to("cpu").contiguous() for b, t in blocks}
    save_file(tensors, str(ckpt_dir / tensors_rel))
    head = json.dumps({"format": INDEX_FORMAT, "rank": rank, "world": world, "tied": tied})
    pieces = ",\n".join(f" {json.dumps(b.key)}: {json.dumps(b.entry())}" for b, _ in blocks)
    (ckpt_dir / index_rel).write_text(head[:-1] + ', "pieces": {\n' + pieces + "\n}}\n")  # a line per piece
    files = [ckpt_dir / tensors_rel, ckpt_dir / index_rel]
    for f in files:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    return files


# ---- reading ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Piece:
    file: Path
    key: str
    offset: tuple[int, ...]
    size: tuple[int, ...]


class Shards:
    """The pieces of a sharded checkpoint, read from every rank's index (JSON only until a tensor is read)."""

    def __init__(self, ckpt_dir: Path, world: int):
        self.dir = Path(ckpt_dir)
        self.pieces: dict[tuple[str, str], list[Piece]] = {}  # (name, part) -> its pieces
        self.meta: dict[tuple[str, str], tuple[tuple[int, ...], str]] = {}  # (name, part) -> (shape, dtype)
        self.tied: dict[str, str] = {}
        self._open: dict[Path, object] = {}
        for rank in range(world):
            tensors_rel, index_rel = shard_files(rank)
            index = read_index(self.dir, rank)
            self.tied.update(index.get("tied", {}))
            for key, e in index["pieces"].items():
                at = (e["name"], e["part"])
                self.meta.setdefault(at, (tuple(e["shape"]), e["dtype"]))
                self.pieces.setdefault(at, []).append(Piece(self.dir / tensors_rel, key, tuple(e["offset"]),
                                                            tuple(e["size"])))

    def names(self) -> list[str]:
        """The global names of the weights, in the order they were saved (each once)."""
        return list(dict.fromkeys(n for n, part in self.meta if part == WEIGHT))

    def parts(self, name: str) -> list[str]:
        """The optimizer state keys saved for weight ``name``."""
        return [part for n, part in self.meta if n == name and part != WEIGHT]

    def shape(self, name: str, part: str = WEIGHT) -> tuple[int, ...]:
        return self.meta[(name, part)][0]

    def dtype(self, name: str, part: str = WEIGHT) -> torch.dtype:
        return DTYPES[self.meta[(name, part)][1]]

    def _file(self, path: Path):
        from safetensors import safe_open

        if path not in self._open:
            try:
                self._open[path] = safe_open(str(path), framework="pt")
            except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError and OSError
                raise _damaged(path, e) from e
        return self._open[path]

    def read(self, name: str, part: str, offset: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
        """The box ``offset`` + ``size`` of part ``part`` of ``name``, assembled from the pieces that overlap
        it (only their intersections are read)."""
        dtype = self.dtype(name, part)
        out = torch.empty(size, dtype=dtype)
        covered = 0
        for piece in self.pieces.get((name, part), []):
            lo = [max(a, b) for a, b in zip(offset, piece.offset)]
            hi = [min(a + n, b + m) for a, n, b, m in zip(offset, size, piece.offset, piece.size)]
            if any(h <= lo_ for lo_, h in zip(lo, hi)):
                continue
            f = self._file(piece.file)
            try:
                if not size:
                    part_t = f.get_tensor(piece.key)
                else:
                    part_t = f.get_slice(piece.key)[tuple(slice(a - p, b - p) for a, b, p in zip(lo, hi, piece.offset))]
            except Exception as e:  # noqa: BLE001 - a key or range the file does not hold: the file is damaged
                raise _damaged(piece.file, e) from e
            out[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offset))] = part_t
            covered += math.prod(b - a for a, b in zip(lo, hi))
        if covered != math.prod(size):
            raise CheckpointError(f"{self.dir / SHARDS}: the pieces of {name} ({part}) cover {covered:,} of the "
                                  f"{math.prod(size):,} elements at offset {list(offset)}, size {list(size)}. The "
                                  f"checkpoint is incomplete: resume from another one (trainer.resume="
                                  f"RUN_DIR/checkpoints/step_N).")
        return out

    def whole(self, name: str, part: str = WEIGHT) -> torch.Tensor:
        shape = self.shape(name, part)
        return self.read(name, part, (0,) * len(shape), shape)


def _damaged(path: Path, e: BaseException) -> CheckpointError:
    from verirl.run.load_errors import damaged

    return damaged(path, "its pieces of the model", e)


def read_index(ckpt_dir: Path, rank: int) -> dict:
    """Rank ``rank``'s index, parsed; a CheckpointError naming the file if it is missing or not one."""
    rel = shard_files(rank)[1]
    path = Path(ckpt_dir) / rel
    try:
        index = json.loads(path.read_bytes())
        pieces = index["pieces"]
        for key, e in pieces.items():
            if not (len(e["shape"]) == len(e["offset"]) == len(e["size"]) and e["dtype"] in DTYPES
                    and isinstance(e["name"], str) and isinstance(e["part"], str)):
                raise ValueError(f"its entry {key!r} is malformed")
    except FileNotFoundError as e:
        raise CheckpointError(f"{path} is missing") from e
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not a shard index: {type(e).__name__}: {e}") from e
    return index


def coverage_problems(ckpt_dir: Path, world: int) -> list[str]:
    """What the ranks' indexes leave uncovered or claim outside a tensor (an empty list: every element of
    every tensor is stored exactly once); the index files' own problems named with them."""
    volume: dict[tuple[str, str], int] = {}
    shapes: dict[tuple[str, str], tuple] = {}
    problems = []
    for rank in range(world):
        rel = shard_files(rank)[1]
        try:
            index = read_index(ckpt_dir, rank)
        except CheckpointError as e:
            problems.append(str(e).replace(str(Path(ckpt_dir)) + "/", ""))
            continue
        for key, e in index["pieces"].items():
            at, shape = (e["name"], e["part"]), tuple(e["shape"])
            if shapes.setdefault(at, shape) != shape:
                problems.append(f"{rel} gives {e['name']} ({e['part']}) the shape {list(shape)}, another rank "
                                f"{list(shapes[at])}")
            if any(o < 0 or o + n > s for o, n, s in zip(e["offset"], e["size"], shape)):
                problems.append(f"{rel}: its piece {key!r} lies outside {e['name']}'s shape {list(shape)}")
            volume[at] = volume.get(at, 0) + math.prod(e["size"])
    if problems:
        return problems
    for at, n in volume.items():
        if n != math.prod(shapes[at]):
            problems.append(f"the pieces of {at[0]} ({at[1]}) hold {n:,} of its {math.prod(shapes[at]):,} elements")
    return problems[:3]


# ---- loading into a model ------------------------------------------------------------------------

def load_model_blocks(shards: Shards, model, held: Callable[[torch.Tensor], bool]) -> dict[int, str]:
    """Copy into each tensor of ``model`` that ``held`` accepts its block from ``shards`` (in place, on
    this rank's local shard); -> {id(tensor): the saved name it was read from}."""
    found: dict[int, str] = {}
    missing, wrong = [], []
    saved = set(shards.names())
    aliases = {**{v: k for k, v in shards.tied.items()}, **shards.tied}
    for tensor_names, t in named_tensors(model):
        name = next((n for n in tensor_names if n in saved), None) or \
            next((aliases[n] for n in tensor_names if aliases.get(n) in saved), None)
        if name is None:
            missing.append(tensor_names[0])
            continue
        found[id(t)] = name
        if not held(t):  # another pipeline stage's parameter, freed here
            continue
        local, shape, offset, size = place(t.detach(), t)
        if tuple(shards.shape(name)) != shape:
            wrong.append(f"{name} {list(shards.shape(name))} vs the model's {list(shape)}")
            continue
        if math.prod(size) == 0:
            continue
        with torch.no_grad():
            local.copy_(shards.read(name, WEIGHT, offset, size))
    unexpected = sorted(saved - set(found.values()))
    if missing or unexpected or wrong:
        raise CheckpointError(f"{shards.dir / SHARDS}: the weights do not fit the model (missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}, other shapes {wrong[:3]}). Was the checkpoint saved "
                              f"from another model.path?")
    return found


def optimizer_state(shards: Shards, optimizer, found: dict[int, str], held: Callable[[torch.Tensor], bool],
                    param_groups: list[dict]) -> dict:
    """An ``optimizer.load_state_dict`` argument: this rank's parameters' optimizer state assembled from
    ``shards`` (laid out as the parameters), with the saved ``param_groups``' hyperparameters."""
    from torch.distributed.tensor import DTensor

    own = optimizer.state_dict()["param_groups"]
    if len(own) != len(param_groups):
        raise CheckpointError(f"{shards.dir}: the checkpoint's optimizer has {len(param_groups)} parameter groups, "
                              f"this run's {len(own)}")
    state = {}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        name = found.get(id(p))
        if name is None or not held(p):
            continue
        parts = {}
        local, _, offset, size = place(p.detach(), p)
        for part in shards.parts(name):
            if not shards.shape(name, part):  # a scalar (AdamW's step)
                parts[part] = shards.whole(name, part)
                continue
            block = shards.read(name, part, offset, size) if math.prod(size) else \
                torch.empty(size, dtype=shards.dtype(name, part))
            block = block.to(local.device)
            parts[part] = DTensor.from_local(block, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                             stride=p.stride()) if isinstance(p, DTensor) else block
        if parts:
            state[i] = parts
    groups = [{**{k: v for k, v in saved.items() if k != "params"}, "params": mine["params"]}
              for saved, mine in zip(param_groups, own)]
    return {"state": state, "param_groups": groups}


# ---- Hugging Face safetensors, one tensor at a time ----------------------------------------------

def write_safetensors(shards: Shards, path: Path,
                      convert: Optional[Callable[[str, torch.Tensor], dict[str, torch.Tensor]]] = None) -> None:
    """``path``: a safetensors file of every weight (tied ones once, as Hugging Face saves them), laid out as
    safetensors' own writer lays them out (header first, larger dtypes first, then by name; the header
    padded with spaces to 8 bytes), each tensor assembled and written in turn. ``convert`` (name, tensor)
    -> {saved name: tensor}: what ``save_pretrained`` writes for a weight (`verirl.models.saved_format`;
    a fused experts tensor -> each expert's), applied to meta tensors for the header first; a weight's
    outputs are kept until written, so at most the weights whose outputs interleave in name order are
    held at once (one layer's experts)."""
    convert = convert or (lambda n, t: {n: t})
    outputs: dict[str, tuple[str, torch.dtype, tuple[int, ...]]] = {}  # saved name -> (weight, dtype, shape)
    for n in shards.names():
        for o, t in convert(n, torch.empty(shards.shape(n), dtype=shards.dtype(n), device="meta")).items():
            if o in outputs:
                raise ValueError(f"{n} and {outputs[o][0]} are both saved as {o}")
            outputs[o] = (n, t.dtype, tuple(t.shape))
    names = sorted(outputs, key=lambda o: (ST_ORDER.index(ST_DTYPES[outputs[o][1]]), o))
    header: dict = {"__metadata__": {"format": "pt"}}
    start = 0
    for o in names:
        _, dtype, shape = outputs[o]
        nbytes = math.prod(shape) * dtype.itemsize
        header[o] = {"dtype": ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [start, start + nbytes]}
        start += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    held: dict[str, torch.Tensor] = {}
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for o in names:
            if o not in held:
                held.update(convert(outputs[o][0], shards.whole(outputs[o][0])))
            t = held.pop(o)
            if tuple(t.shape) != outputs[o][2] or t.dtype != outputs[o][1]:
                raise RuntimeError(f"{o}: converted as {tuple(t.shape)} {t.dtype}, its header says "
                                   f"{outputs[o][2]} {outputs[o][1]}")
            for chunk in _bytes(t):
                f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def _bytes(t: torch.Tensor) -> Iterator[memoryview]:
    flat = t.contiguous().reshape(-1).view(torch.uint8)
    yield memoryview(flat.numpy())
