"""What a training forward records: the tap that marks the positions a log-prob pass reads, and the
activation dump (trainer.dump_activations) that reads it.

Which positions of the forward now running are the ones a log-prob pass reads: the positions
that predict a response token, as flat indices into the forward's (rows x columns) tokens. Set
around each log-prob forward, packed or padded, in the same order (sequence by sequence, token by
token), with where each sequence starts; read by the activation dump below,
so that statistics over these positions do not depend on the layout: packing, prompt sharing,
padding and micro-batching change where the positions are, never which tokens they are.

The activation dump: per-module statistics of a training forward (and backward), over the
positions that predict response tokens, so that they do not depend on the layout.

    with ActivationRecorder(model, modules=r"layers\\.0\\.", backward=True) as rec:
        update_policy(...)                      # any log-prob forwards / backwards inside the block
    rec.save(dump_path(dump_dir, step, rank), {"step": step, "run": ...})

What a module records, per direction (forward: its output; backward: the gradient of its output):
``dtype``, ``shape`` (the per-token feature shape), ``tokens`` (positions counted), ``l2`` (the
square root of the sum of squares over every selected element), ``mean``, ``std`` (population),
``min``, ``max``, and a value ``sample``: the first `SAMPLE_FEATURES` features of the
`SAMPLE_POSITIONS` positions with the largest L2 norm (largest first; ``sample_norms`` are those
norms; a sequence's first position is never sampled when the tap marks it, see Backward).
Statistics accumulate (in float64) across every forward in the block (micro-batches, mini-batches,
epochs), so how a step is cut into forwards changes none of them; the sample is chosen by norm
rather than by place for the same reason (and so that ranks merge, below).

Which positions: those in `verirl.train.record.RESPONSE_POSITIONS`, set around every log-prob forward
(packed and padded alike, in the same order): the positions whose hidden state predicts a response
token. A forward with no tap set (generation, a forward outside a log-prob pass) records nothing.
Generation is never recorded: verirl's lean decoder reads the weights outside the module forwards,
and no engine sets the tap.
An output is per token when its two leading dims are the forward's token grid (rows, columns of
``input_ids``, read by a pre-hook on the input embedding), or its leading dim is rows x columns;
anything else (the output layer's kept logits, the root model's output) is listed under ``skipped``
with its shape, never recorded: the packed layout applies the output layer outside its module.

Backward: the gradient of each per-token output (a hook on the output tensor, which keeps the
forward's positions; the backward itself runs after the tap is gone). Each sequence's first
position (its prompt's last token) is left out of the backward statistics when the tap marks it
(`verirl.train.record.SEQUENCE_STARTS`): with a prompt shared by n samples in the packed layout that
position's gradient is the sum of the n samples' gradients, where a padded row holds one sample's.
Layers recomputed under reentrant activation checkpointing are not seen by the backward.

Several ranks: each rank saves its own file (`dump_path`); every statistic merges exactly
(counts, sums, sums of squares, min, max, top norms), so `verirl compare-activations` merges a
step's rank files and a 2-rank dump compares with a 1-rank one. See docs/activations.md.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from verirl.core.errors import ConfigError

RESPONSE_POSITIONS: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar(
    "verirl_response_positions", default=None)
# (M,) bool, True where a sequence's first response token is predicted: a packed layout that shares
# a prompt predicts every sample's first token from one position, whose gradient is the group's sum
SEQUENCE_STARTS: contextvars.ContextVar[Optional[torch.Tensor]] = contextvars.ContextVar(
    "verirl_sequence_starts", default=None)
_SILENT: contextvars.ContextVar[bool] = contextvars.ContextVar("verirl_taps_silent", default=False)


@contextlib.contextmanager
def response_positions(flat: torch.Tensor, first: Optional[torch.Tensor] = None) -> Iterator[None]:
    """``flat`` (M,): the forward's positions that predict response tokens, for the block; ``first``
    (M,) bool: those that predict a sequence's first response token."""
    silent = _SILENT.get()
    tokens = RESPONSE_POSITIONS.set(None if silent else flat), SEQUENCE_STARTS.set(None if silent else first)
    try:
        yield
    finally:
        RESPONSE_POSITIONS.reset(tokens[0])
        SEQUENCE_STARTS.reset(tokens[1])


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Forwards that are not part of the pass (a sharded model's empty micro-batches, run only to join
    the other ranks' collectives): nothing is tapped."""
    token = _SILENT.set(True)
    try:
        yield
    finally:
        _SILENT.reset(token)


FORMAT = "verirl-activations/1"
SAMPLE_POSITIONS = 4  # rows of the value sample: the positions with the largest L2 norm
SAMPLE_FEATURES = 8  # the first features of each sampled position
_CHUNK = 1 << 23  # elements per float32 chunk (32 MB)


def dump_path(root: str | os.PathLike, step: int, rank: int = 0) -> Path:
    """Where rank ``rank`` saves step ``step`` of a dump in ``root``: ROOT/step_000012/rank0.json."""
    return Path(root) / f"step_{int(step):06d}" / f"rank{int(rank)}.json"


class _Stats:
    """Running statistics of one module in one direction; tensors stay on the device until `row`."""

    def __init__(self, order: int, dtype: torch.dtype, shape: tuple[int, ...]):
        self.order, self.dtype, self.shape = order, dtype, shape
        self.tokens = 0
        self.sum = self.sumsq = self.min = self.max = None
        self.norms: Optional[torch.Tensor] = None  # (<= SAMPLE_POSITIONS,) float32 squared norms, largest first
        self.rows: Optional[torch.Tensor] = None  # (<= SAMPLE_POSITIONS, <= SAMPLE_FEATURES) float32

    def add(self, flat: torch.Tensor, pos: torch.Tensor, sampled: Optional[torch.Tensor] = None) -> None:
        """flat (T, F...): per-token values; pos (M,): the rows of ``flat`` to count (a repeat counts
        again); sampled (M,) bool or None: which of them may be chosen for the value sample."""
        if tuple(flat.shape[1:]) != self.shape:
            raise ValueError(f"per-token shape changed from {self.shape} to {tuple(flat.shape[1:])}")
        F = max(math.prod(self.shape), 1)
        flat = flat.reshape(flat.shape[0], F)
        step = max(_CHUNK // F, 1)
        with torch.no_grad():
            for i in range(0, pos.numel(), step):
                x = flat.index_select(0, pos[i:i + step]).float()  # (m, F)
                row_sq = x.square().sum(1)  # (m,); a chunk's sums in float32, their running totals in float64
                lo, hi = torch.aminmax(x)
                parts = (x.sum().double(), row_sq.sum().double(), lo, hi)
                if self.sum is None:
                    self.sum, self.sumsq, self.min, self.max = parts
                else:
                    self.sum, self.sumsq = self.sum + parts[0], self.sumsq + parts[1]
                    self.min, self.max = torch.minimum(self.min, lo), torch.maximum(self.max, hi)
                key = row_sq if sampled is None else row_sq.masked_fill(~sampled[i:i + step], -1.0)  # -1: never
                top, idx = key.topk(min(SAMPLE_POSITIONS, key.numel()))
                rows = x.index_select(0, idx)[:, :SAMPLE_FEATURES]
                if self.norms is not None:
                    top, rows = torch.cat([self.norms, top]), torch.cat([self.rows, rows])
                keep = top.topk(min(SAMPLE_POSITIONS, top.numel())).indices
                self.norms, self.rows = top.index_select(0, keep), rows.index_select(0, keep)
        self.tokens += int(pos.numel())

    def row(self, module: str) -> dict[str, Any]:
        n = self.tokens * math.prod(self.shape)
        base = {"module": module, "order": self.order, "dtype": str(self.dtype).removeprefix("torch."),
                "shape": list(self.shape), "tokens": self.tokens}
        if n == 0 or self.sum is None:
            return {**base, "l2": 0.0, "mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0, "sample": [],
                    "sample_norms": []}
        s, q = float(self.sum), float(self.sumsq)
        mean = s / n
        real = [(math.sqrt(sq), row) for sq, row in zip(self.norms.tolist(), self.rows.tolist()) if sq >= 0]
        return {**base, "l2": math.sqrt(q), "mean": mean, "std": math.sqrt(max(q / n - mean * mean, 0.0)),
                "min": float(self.min), "max": float(self.max), "sample": [r for _, r in real],
                "sample_norms": [nm for nm, _ in real]}


def _sequence_starts(pos: torch.Tensor) -> Optional[torch.Tensor]:
    """(M,) bool: True at each sequence's first tapped position (its prompt's last token), when the tap
    says so (`verirl.train.record.SEQUENCE_STARTS`), else None."""
    first = SEQUENCE_STARTS.get()
    if first is None:
        return None
    if first.shape != pos.shape:
        raise ValueError(f"the tap's sequence starts ({tuple(first.shape)}) do not match its positions "
                         f"({tuple(pos.shape)})")
    return first.to(pos.device, torch.bool)


def _first_tensor(out: Any) -> Optional[torch.Tensor]:
    """A module's output tensor: itself, the first element of a tuple, the first value of a ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out:
        return _first_tensor(out[0])
    if isinstance(out, dict) and out:  # transformers' ModelOutput is an OrderedDict
        return _first_tensor(next(iter(out.values())))
    return None


class ActivationRecorder:
    """Records per-module statistics of the forwards (and, with ``backward``, the backwards) run
    inside its block, over the tapped response positions; see the module docstring.

    ``modules``: a regular expression searched (`re.search`) in each name of ``model.named_modules()``
    (the root is named ""), e.g. ``"layers\\.0\\."`` or ``"norm$"``; ``".*"`` records every module."""

    def __init__(self, model: torch.nn.Module, modules: str = ".*", backward: bool = False):
        try:
            self._pattern = re.compile(modules)
        except re.error as e:
            raise ConfigError(f"trainer.dump_activations.modules={modules!r} is not a regular expression ({e}). "
                              f"Escape the dots of a name, e.g. 'layers\\.0\\.'; '.*' records every module.") from None
        self.model, self.backward = model, backward
        self.modules = [(n, m) for n, m in model.named_modules() if self._pattern.search(n)]
        if not self.modules:
            some = [n for n, _ in model.named_modules() if n][:4]
            raise ConfigError(f"trainer.dump_activations.modules={modules!r} matches no module of "
                              f"{type(model).__name__} (its names look like {', '.join(some)}). Fix the expression.")
        self.forward: dict[str, _Stats] = {}
        self.gradient: dict[str, _Stats] = {}
        self.skipped: dict[str, str] = {}  # module -> why it is not recorded
        self.forwards = 0  # forwards seen with a tap set
        self._grid: Optional[tuple[torch.Tensor, tuple[int, int]]] = None  # (tap, (rows, cols)) of the forward
        self._pos: Optional[tuple] = None  # (tap, positions, sampled, backward positions) of the forward
        self._handles: list = []
        self._active = False

    # --- hooks ------------------------------------------------------------------------------------

    def __enter__(self) -> "ActivationRecorder":
        emb = self.model.get_input_embeddings() if hasattr(self.model, "get_input_embeddings") else None
        if emb is None:
            raise ValueError(f"{type(self.model).__name__} has no input embedding to read the token grid from; "
                             f"the activation dump needs one.")
        self._handles.append(emb.register_forward_pre_hook(self._grid_hook))
        for name, module in self.modules:
            self._handles.append(module.register_forward_hook(self._hook_for(name)))
        self._active = True
        return self

    def __exit__(self, *exc) -> None:
        self._active = False
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _grid_hook(self, module, args) -> None:
        tap = RESPONSE_POSITIONS.get()
        ids = args[0] if args else None
        if tap is not None and isinstance(ids, torch.Tensor) and ids.dim() == 2:
            self._grid = (tap, (int(ids.shape[0]), int(ids.shape[1])))
            self.forwards += 1

    def _tokens(self, out: torch.Tensor, tap: torch.Tensor) -> Optional[torch.Tensor]:
        """``out`` as (rows x cols, features...) when it is per token in the forward of ``tap``, else None."""
        if self._grid is None or self._grid[0] is not tap:
            return None
        rows, cols = self._grid[1]
        if out.dim() >= 3 and tuple(out.shape[:2]) == (rows, cols):
            return out.flatten(0, 1)
        if out.dim() >= 2 and out.shape[0] == rows * cols and rows * cols > 1:
            return out
        return None

    def _hook_for(self, name: str):
        def hook(module, args, out) -> None:
            tap = RESPONSE_POSITIONS.get()
            if tap is None or not self._active:
                return
            t = _first_tensor(out)
            flat = self._tokens(t, tap) if t is not None else None
            if flat is None:
                if name not in self.forward:
                    self.skipped.setdefault(name, "output is not per token: " + (
                        f"{type(out).__name__}" if t is None else f"shape {tuple(t.shape)}"))
                return
            self.skipped.pop(name, None)
            pos, inner, gpos = self._positions(tap, flat.device)
            self._stats(self.forward, name, flat).add(flat.detach(), pos, inner)
            if self.backward and t.requires_grad:
                t.register_hook(self._grad_hook(name, gpos, flat.shape))
        return hook

    def _positions(self, tap: torch.Tensor, device) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(positions, which may be sampled or None for all, the positions the backward counts) of the
        forward of ``tap``; made once per forward."""
        if self._pos is None or self._pos[0] is not tap:
            pos = tap.to(device)
            first = _sequence_starts(pos)
            inner = None if first is None else ~first  # positions inside a response: unique in every layout
            self._pos = (tap, pos, inner, pos if inner is None else pos[inner])
        return self._pos[1:]

    def _grad_hook(self, name: str, pos: torch.Tensor, flat_shape: torch.Size):
        def hook(grad: torch.Tensor) -> None:  # grad: the output's shape; flat_shape: (rows x cols, features...)
            if self._active and grad is not None:
                g = grad.detach().reshape(flat_shape)
                self._stats(self.gradient, name, g).add(g, pos)
        return hook

    def _stats(self, table: dict[str, _Stats], name: str, flat: torch.Tensor) -> _Stats:
        if name not in table:
            table[name] = _Stats(len(table), flat.dtype, tuple(flat.shape[1:]))
        return table[name]

    # --- results ----------------------------------------------------------------------------------

    def records(self, meta: Optional[dict] = None) -> dict[str, Any]:
        """The dump as one JSON-able dict (what `save` writes)."""
        rows = lambda table: [s.row(n) for n, s in sorted(table.items(), key=lambda kv: kv[1].order)]  # noqa: E731
        return {"format": FORMAT, "meta": {**(meta or {}), "forwards": self.forwards, "backward": self.backward,
                                           "modules": self._pattern.pattern},
                "forward": rows(self.forward), "backward": rows(self.gradient),
                "skipped": [{"module": n, "reason": r} for n, r in self.skipped.items()]}

    def save(self, path: str | os.PathLike, meta: Optional[dict] = None) -> Path:
        """Write the dump to ``path`` (JSON; parents made, written whole or not at all)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.records(meta), indent=1), encoding="utf-8")
        os.replace(tmp, path)
        return path
