"""verirl's own batched sampler with a KV cache.

* Each distinct prompt is prefilled once; its cache is then repeated n times.
* One forward per new token for the still-running rows only: finished rows leave the
  batch (their cache rows are dropped once a quarter of the batch has finished, so the
  copy is paid a few times per call, not at every step), except in the CUDA graph below.
* Llama-family models (Llama, Qwen2, Qwen3, Mistral, SmolLM2) and the MoE families Qwen2-MoE, Qwen3-MoE
  and Mixtral run through `LeanDecoder`, a forward with fused projections, grouped expert products and an
  in-place KV cache (``decoder``: the last call's); other models through their own transformers forward
  with a DynamicCache.
* On CUDA the lean decoding step is captured once per call as a CUDA graph and replayed
  (`VERIRL_CUDA_GRAPHS=0` turns it off): one shape for every step, attending over the whole
  cache with the columns not yet written masked, and no compaction of finished rows (models
  on their own forward, and VERIRL_CUDA_GRAPHS=0, still compact). A step
  of small kernels is bound by their launches there, not by the arithmetic.
* A mixture-of-experts model's routes are recorded with ``record_routes`` (routing replay R3 only): the experts each
  sparse layer chose for each token fed (prefill and every step, repeated for the n samples and kept through
  compaction) as ``Rollout.routed_experts``, -1 where none (pads, the last sampled token). The lean decoder
  records them itself (``LeanDecoder.record_routes``), transformers' forward through `RouterTap`; multi-turn
  `Session` episodes are not recorded.
* Sampling inverts the CDF with one uniform number per row (see `sampling.sample_next`). With a
  seed, the uniform of token t of sample j of the prompt at global position g is
  `sampling.keyed_uniforms(seed, g, j, t)`: the rollout of a prompt does not depend on the
  batch it is generated in, its row, the chunk, or the compaction of finished rows.
"""
from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Callable, Optional, Sequence

import torch
from transformers import DynamicCache

from verirl.core.errors import env_choice
from verirl.models.modes import eval_mode
from verirl.models.moe import routing
from verirl.models.router_tap import RouterTap
from verirl.rollout.base import SamplingParams, build_rollout, left_pad
from verirl.rollout.lean import LeanDecoder, lean_supported
from verirl.rollout.sampling import keyed_uniforms, sample_and_score, sample_next
from verirl.core.types import Rollout


# Finished rows are dropped from the cache once no more than this share of the batch is still running
# (each drop copies the cache, so not at every finished row).
COMPACT_AT = 0.75


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the KV cache argument ``cache``; earlier releases ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _HFStepper:
    """The model's own forward with a DynamicCache (any architecture)."""

    compacts = True

    def __init__(self, model):
        self.model, self.kw, self.cache = model, _cache_kwarg(model), DynamicCache()
        self.mask = None  # (B, keys so far) attention mask of the rows the cache holds

    def prefill(self, ids, mask, pos, total: int):
        self.mask = mask
        return self._last_logits(ids, pos)

    def repeat(self, n: int):
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, 0)

    def select(self, rows):
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]

    def step(self, tok, pos, start: int):
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=-1)
        return self._last_logits(tok[:, None], pos[:, None])

    def reload(self, model) -> None:
        """The model's weights changed in place mid-call: its forward reads them as they are."""

    def routes(self, B: int) -> Optional[torch.Tensor]:
        """(B, T, L, k) the experts of the last forward's tokens, with a tap installed (its ``last_ids``)."""
        tap = getattr(self, "tap", None)
        if tap is None or any(x is None for x in tap.last_ids):
            return None
        return torch.stack([x.view(B, -1, x.shape[-1]) for x in tap.last_ids], 2)

    def _last_logits(self, ids, pos) -> torch.Tensor:
        """The logits at each row's last position of ``ids`` (its cache and mask extended by them)."""
        tap = getattr(self, "tap", None)
        if tap is not None:
            tap.begin()
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **{self.kw: self.cache})
        return out.logits[:, -1]


class _SplitStepper(_HFStepper):
    """The model's own forward on its tensor-parallel plan (`verirl.models.parallel`): each rank of the
    group computes its heads and its share of the MLP and of the vocabulary, its KV cache holds its heads
    only, and the logits' vocabulary shares are gathered, so every rank samples the same tokens from the
    same whole logits. The ranks of the group decode the same prompts in step: one collective per layer and
    token. ``low`` (model.compute_dtype): the decoder's products in it (autocast), the output layer in the
    weights' dtype, as the trainer's passes compute them."""

    def __init__(self, model, low: Optional[torch.dtype] = None):
        from verirl.models.parallel import head_group

        super().__init__(model)
        self.group = head_group(model)
        self.low = low

    def _last_logits(self, ids, pos) -> torch.Tensor:
        """This rank's vocabulary share of the logits at each row's last position, then the whole of them."""
        device = ids.device
        with torch.autocast(device.type, dtype=self.low, enabled=self.low is not None):
            h = self.model.get_decoder()(input_ids=ids, attention_mask=self.mask, position_ids=pos, use_cache=True,
                                         **{self.kw: self.cache}).last_hidden_state[:, -1]
        head = self.model.get_output_embeddings()
        with torch.autocast(device.type, enabled=False):
            logits = head(h.to(head.weight.dtype))
        parts = [torch.empty_like(logits) for _ in range(torch.distributed.get_world_size(self.group))]
        torch.distributed.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


class _LeanStepper:
    """`LeanDecoder` steps. ``fixed``: every decoding step of the call has one shape, so that a CUDA graph
    can capture the step once and replay it (``graph``, CUDA only; elsewhere the same steps run eagerly,
    which is what the tests check). Then the cache starts zeroed, each step attends over all of it with
    the columns not yet written masked, the new token's keys go in at a column held in a tensor, and
    finished rows stay in the batch (no compaction: they step on pads, and their tokens are dropped)."""

    def __init__(self, model, fixed: bool = False, graph: bool = False, low: Optional[torch.dtype] = None):
        self.dec = LeanDecoder(model, low)
        self.bias = None  # (B, total) additive key bias: -inf on left pads (fixed: and on columns not yet written)
        self.fixed, self.graph = fixed, graph
        self.compacts = not fixed
        self.inputs = None  # fixed: (token (B, 1), position (B, 1), column (1,)) buffers the step reads
        self.captured = None  # the CUDA graph of the step, and its output

    def prefill(self, ids, mask, pos, total: int):
        B, P = ids.shape
        self.dec.alloc(B, total, self.dec.embed, zeros=self.fixed)
        causal = torch.ones((P, P), dtype=torch.bool, device=ids.device).tril()
        m = causal[None] & mask.bool()[:, None, :]
        m |= torch.eye(P, dtype=torch.bool, device=ids.device)[None]  # pad rows see themselves: no NaN
        self.bias = self.dec.embed.new_zeros((B, total))
        self.bias[:, :P].masked_fill_(~mask.bool(), float("-inf"))
        if self.fixed:
            self.bias[:, P:] = float("-inf")  # each step reveals its own column
        full = self.dec.embed.new_zeros(m.shape).masked_fill_(~m, float("-inf"))
        return self.dec.forward(ids, pos, 0, full[:, None, None])

    def repeat(self, n: int):
        self.dec.repeat(n)
        self.bias = self.bias.repeat_interleave(n, 0)

    def select(self, rows):
        self.dec.select(rows)
        self.bias = self.bias.index_select(0, rows)

    def step(self, tok, pos, start: int):
        if not self.fixed:
            return self.dec.forward(tok[:, None], pos[:, None], start, self.bias[:, None, None, None, :start + 1])
        if self.inputs is None:
            self.inputs = (tok[:, None].clone(), pos[:, None].clone(), torch.full((1,), start, device=tok.device))
        t, p, col = self.inputs
        t.copy_(tok[:, None])
        p.copy_(pos[:, None])
        col.fill_(start)
        if not self.graph:
            return self._fixed_step()
        if self.captured is None:
            try:
                self.captured = self._capture()
            except Exception as e:  # a step CUDA cannot capture still decodes, eagerly
                warnings.warn(f"the decoding step could not be captured as a CUDA graph ({type(e).__name__}: {e}); "
                              f"decoding without one. VERIRL_CUDA_GRAPHS=0 skips the attempt.", RuntimeWarning)
                self.graph = False
                return self._fixed_step()
        graph, out = self.captured
        graph.replay()
        return out

    def routes(self, B: int) -> Optional[torch.Tensor]:
        """(B, T, L, k) the experts of the last forward's tokens (the decoder's ``last_routes``, copied)."""
        r = self.dec.last_routes
        return torch.stack(r, 2).clone() if self.dec.record_routes and r else None

    def reload(self, model) -> None:
        """The model's weights changed in place mid-call: pack them again (the cache kept)."""
        self.captured = None  # a captured graph reads the old packed weights (freed first: not both at once)
        self.dec.pack(model)

    def _fixed_step(self):
        t, p, col = self.inputs
        self.bias.index_fill_(1, col, 0.0)  # this step's column becomes visible
        return self.dec.forward(t, p, col, self.bias[:, None, None, None])

    def _capture(self):
        """The step as a CUDA graph: warmed up on a side stream (the step can run again: it writes the same
        column), then captured; the caller replays it for this step and every later one."""
        with torch.cuda.device(self.dec.embed.device):  # the model's GPU, whichever is current
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._fixed_step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._fixed_step()
        return graph, out


def _one_shape(device: torch.device) -> tuple[bool, bool]:
    """(decoding steps of one shape, captured as a CUDA graph): both on CUDA unless VERIRL_CUDA_GRAPHS=0."""
    on = device.type == "cuda" and env_choice("VERIRL_CUDA_GRAPHS") == "1"
    return on, on


class _KeyedUniforms:
    """The keyed uniforms of every row of one generate call, computed a block of token positions
    at a time (one Philox evaluation per block, not one per decoding step)."""

    BLOCK = 64  # token positions per evaluation

    def __init__(self, seed: int, prompt_index: Sequence[int], n: int, horizon: int, device,
                 sample_index: Optional[Sequence[int]] = None, offset: Optional[Sequence[int]] = None):
        g = torch.as_tensor(list(prompt_index), dtype=torch.long, device=device)
        self.seed, self.horizon = seed, horizon
        self.prompt = g.repeat_interleave(n)[:, None]  # (N, 1) global prompt position of each row
        self.sample = torch.arange(n, device=device).repeat(len(g))[:, None]  # (N, 1) index in its group
        if sample_index is not None:  # rows given one by one (n = 1): each row's own sample index
            self.sample = torch.as_tensor(list(sample_index), dtype=torch.long, device=device)[:, None]
        # (N, 1) the response position of each row's first new token (a multi-turn episode's later turns)
        self.offset = torch.zeros_like(self.prompt) if offset is None else \
            torch.as_tensor(list(offset), dtype=torch.long, device=device)[:, None]
        self.start, self.table = 0, None  # table: (N, BLOCK) uniforms of positions start..start+BLOCK-1

    def at(self, rows: torch.Tensor, t: int) -> torch.Tensor:
        """rows: (B,) indices into the call's N rows -> (B,) float64 uniforms of token position t."""
        if self.table is None or not self.start <= t < self.start + self.BLOCK:
            self.start = t
            pos = torch.arange(t, min(t + self.BLOCK, self.horizon), device=self.prompt.device)[None]
            self.table = keyed_uniforms(self.seed, self.prompt, self.sample, pos + self.offset)
        return self.table[rows, t - self.start]


def _check_prompt_index(prompt_index, count: int) -> list[int]:
    index = list(range(count)) if prompt_index is None else [int(i) for i in prompt_index]
    if len(index) != count:
        raise ValueError(f"prompt_index has {len(index)} entries for {count} prompts; pass one global "
                         f"batch position per prompt")
    bad = [i for i in index if not 0 <= i < 1 << 32]
    if bad:
        raise ValueError(f"prompt_index entry {bad[0]} is outside [0, 2^32); pass each prompt's position "
                         f"in the step's global batch")
    return index


def _check_rows(sample_index, offset, n: int, count: int) -> None:
    for name, v in (("sample_index", sample_index), ("offset", offset)):
        if v is None:
            continue
        if n != 1:
            raise ValueError(f"{name} gives each row's key: call generate with n=1 (got n={n})")
        if len(v) != count:
            raise ValueError(f"{name} has {len(v)} entries for {count} prompts; pass one per prompt")


class NativeEngine:
    reads_live_model = True  # generate decodes with the trainer's parameters

    def __init__(self, model, pad_id: int, stop_ids: Sequence[int], compute_dtype: Optional[torch.dtype] = None,
                 split: bool = False, record_routes: bool = False):
        self.model, self.pad_id, self.stop_ids = model, pad_id, list(stop_ids)
        # split: a tensor-parallel model decodes on its plan (`_SplitStepper`), every rank of its group the same
        # prompts; otherwise the caller gathers the whole weights first (`verirl.train.strategy.full_weights`)
        self.split = split
        self.compute_dtype = compute_dtype  # model.compute_dtype: the lean decoder's products in it
        self.batch_sizes: list[int] = []  # rows in each forward of the last call (prefill first)
        self.decoder: Optional[LeanDecoder] = None  # the last call's lean decoder; None: transformers' forward
        # an asynchronous run's partial rollouts: a call that loads newer weights into the model, if any, and
        # returns the version it holds, asked before the prefill and before each decoding step
        self.refresh: Optional[Callable[[], int]] = None
        self.last_versions: list[int] = []  # of the last call with ``refresh``: token t's version, per t
        # a mixture-of-experts model's routes recorded into Rollout.routed_experts (off: None there)
        self.record_routes = record_routes and not split and routing(model.config) is not None

    def open_session(self, prompt_ids: Sequence[Sequence[int]], horizon: int) -> Optional["Session"]:
        """Episodes that keep their KV cache across turns (`Session`), ``horizon`` response tokens each at
        most; None where this engine cannot keep one (a model outside the lean decoder's families, a
        tensor-parallel group decoding on its plan): the caller prefills each turn again."""
        if self.split or not lean_supported(self.model):
            return None
        return Session(self, prompt_ids, horizon)

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Nothing to do: this engine reads the live model."""

    def close(self) -> None:
        """Nothing to release: the model is the trainer's."""

    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams,
                 prompt_index: Optional[Sequence[int]] = None, sample_index: Optional[Sequence[int]] = None,
                 offset: Optional[Sequence[int]] = None,
                 on_stop: Optional[Callable[[int, list[int]], None]] = None) -> Rollout:
        """``sample_index`` and ``offset`` (with n = 1, one entry per prompt): each row's sample index in its
        group and the response position its first new token has (a later turn of a multi-turn episode),
        so the sampling key of each token is (seed, global prompt position, sample, response position).
        ``on_stop(row, tokens)``: called as each row samples a stop token, with its tokens (the stop
        included), while the other rows go on decoding (a multi-turn rollout starts its tools there)."""
        model = self.model
        device = next(model.parameters()).device
        index = _check_prompt_index(prompt_index, len(prompt_ids))
        _check_rows(sample_index, offset, n, len(prompt_ids))
        R = params.max_new_tokens
        keyed = None  # None: unseeded, the uniforms come from torch's global generator
        if params.seed is not None and params.temperature > 0:
            keyed = _KeyedUniforms(params.seed, index, n, R, device, sample_index, offset)
        ids, mask = left_pad(prompt_ids, self.pad_id, device)  # (B, P)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        # inference mode, not only no_grad: no version counters or view records on the ~150 small
        # operations of each decoding step (BENCHMARKS.md, "Kernel choices"); what leaves
        # the block is copied out of it below, since the trainer uses it with autograd
        refresh = self.refresh
        version = refresh() if refresh is not None else 0
        versions = [version]  # token t was sampled from logits of the weights versions[t]
        with eval_mode(model), torch.inference_mode():
            if self.split:
                run = _SplitStepper(model, self.compute_dtype)
            elif lean_supported(model):
                run = _LeanStepper(model, *_one_shape(device), low=self.compute_dtype)
            else:
                run = _HFStepper(model)
            self.decoder = run.dec if isinstance(run, _LeanStepper) else None
            tap = contextlib.nullcontext()
            if self.record_routes:
                if isinstance(run, _LeanStepper):
                    run.dec.record_routes = True
                elif not self.split:
                    tap = run.tap = RouterTap(model)
            with tap:
                logits = run.prefill(ids, mask, pos, ids.shape[1] + R)  # (B, V)
                first = run.routes(ids.shape[0]) if self.record_routes else None  # (B, P, L, k)
            self.batch_sizes = [ids.shape[0]]
            if n > 1:  # expand each prompt's cache to its n samples
                run.repeat(n)
                logits = logits.repeat_interleave(n, dim=0)
                pos = pos.repeat_interleave(n, dim=0)
            N = logits.shape[0]
            routed = None  # (N, P + R, L, k) int16
            if first is not None:
                routed = torch.full((N, ids.shape[1] + R) + first.shape[2:], -1, dtype=torch.int16, device=device)
                routed[:, :ids.shape[1]] = first.to(torch.int16).repeat_interleave(n, 0)
            tokens = torch.full((N, R), self.pad_id, dtype=torch.long, device=device)
            sampled = params.temperature > 0  # greedy decoding has no distribution to report
            logps = torch.zeros((N, R), dtype=torch.float32, device=device) if sampled else None
            active = torch.arange(N, device=device)  # rows of the full batch the cache still holds
            running = torch.ones(N, dtype=torch.bool, device=device)  # of those, the ones not yet stopped
            next_pos = pos[:, -1] + 1
            stops = torch.as_tensor(self.stop_ids, device=device)
            P = ids.shape[1]
            for t in range(R):
                u = None if keyed is None else keyed.at(active, t)
                if logps is None:
                    tok = sample_next(logits, params.temperature, params.top_k, params.top_p, uniforms=u)
                else:  # the sampled tokens' log-probs come with the sampling, at next to no cost
                    tok, lp = sample_and_score(logits, params.temperature, params.top_k, params.top_p, uniforms=u)
                    logps[active, t] = torch.where(running, lp, 0.0)
                tok = torch.where(running, tok, torch.full_like(tok, self.pad_id))  # finished rows: pad
                tokens[active, t] = tok
                if on_stop is None:
                    running &= ~torch.isin(tok, stops)
                else:
                    was = running.clone()
                    running &= ~torch.isin(tok, stops)
                    for row in active[was & ~running].tolist():
                        on_stop(row, tokens[row, :t + 1].tolist())
                if t == R - 1:
                    break
                n_run = int(running.sum())
                if n_run == 0:
                    break
                if run.compacts and n_run <= COMPACT_AT * running.numel():  # drop the finished rows from the cache
                    idx = running.nonzero().squeeze(-1)
                    run.select(idx)
                    active, tok, next_pos, running = active[idx], tok[idx], next_pos[idx], running[idx]
                self.batch_sizes.append(tok.shape[0])
                if refresh is not None:
                    newer = refresh()
                    if newer != version:
                        version = newer
                        run.reload(model)
                    versions.append(version)
                with tap:
                    logits = run.step(tok, next_pos, P + t)
                    if routed is not None:
                        routed[active, P + t] = run.routes(tok.shape[0])[:, 0].to(torch.int16)
                next_pos = next_pos + 1
        self.last_versions = versions if refresh is not None else []
        tokens, logps = tokens.clone(), None if logps is None else logps.clone()  # ordinary tensors again
        rollout = build_rollout(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0), tokens,
                                self.stop_ids, self.pad_id)
        if logps is not None:
            rollout.sample_logprobs = logps[:, :rollout.response_ids.shape[1]] * rollout.response_mask
        if routed is not None:
            rollout.routed_experts = _routes_of(routed.clone(), rollout)
        return rollout


def _routes_of(routed: torch.Tensor, rollout: Rollout) -> torch.Tensor:
    """(N, P + R, L, k) routes cut to the rollout's response width, -1 on pads."""
    P, R = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    routed = routed[:, :P + R]
    real = torch.cat([rollout.prompt_mask, rollout.response_mask], 1).bool().to(routed.device)
    return routed.masked_fill(~real[:, :, None, None], -1)


class Session:
    """Episodes that keep their KV cache across turns (`NativeEngine.open_session`): the prompts are
    prefilled once, each `turn` decodes the live rows until each stops, and `extend` prefills only the
    tokens appended after a turn (an observation and the next header). One rectangular cache holds every
    row: a turn writes one column per decoding step for all rows (a row that stopped steps on a pad, its
    column masked), an extension writes a block as wide as the longest row's tokens, each row's tokens at
    the block's right end and its left part masked, so that the block's last position is every row's last
    token. Positions count each row's real tokens, so the model sees what a fresh prefill of the same
    sequence shows it; the cache grows when a turn or a block needs more columns."""

    GROW = 256  # columns added at a time

    def __init__(self, engine: "NativeEngine", prompt_ids: Sequence[Sequence[int]], horizon: int):
        self.engine, self.model = engine, engine.model
        self.device = next(self.model.parameters()).device
        ids, mask = left_pad(prompt_ids, engine.pad_id, self.device)
        B, P = ids.shape
        self.dec = LeanDecoder(self.model, engine.compute_dtype)
        self.pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -1] + 1  # (B,) each row's next position
        self.horizon = P + horizon  # positions the rotary table covers (prompt + response budget)
        with eval_mode(self.model), torch.inference_mode():
            self.dec.alloc(B, max(self.horizon, P + self.GROW), self.dec.embed)
            self.bias = self.dec.embed.new_full((B, self.dec.k[0].shape[2]), float("-inf"))
            self.bias[:, :P].masked_fill_(mask.bool(), 0.0)
            causal = torch.ones((P, P), dtype=torch.bool, device=self.device).tril()
            m = causal[None] & mask.bool()[:, None, :]
            m |= torch.eye(P, dtype=torch.bool, device=self.device)[None]
            full = self.dec.embed.new_zeros(m.shape).masked_fill_(~m, float("-inf"))
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            self.logits = self.dec.forward(ids, pos, 0, full[:, None, None])  # (B, V) after each row's last token
        self.col = P  # the next column to write
        self.prefilled = [B * P]  # tokens through the model at each prefill or extension (the benchmark's count)

    def _room(self, columns: int) -> None:
        have = self.dec.k[0].shape[2]
        if self.col + columns <= have:
            return
        extra = max(self.GROW, self.col + columns - have)
        self.dec.k = [torch.cat([t, t.new_zeros(t.shape[:2] + (extra, t.shape[3]))], 2) for t in self.dec.k]
        self.dec.v = [torch.cat([t, t.new_zeros(t.shape[:2] + (extra, t.shape[3]))], 2) for t in self.dec.v]
        self.bias = torch.cat([self.bias, self.bias.new_full((self.bias.shape[0], extra), float("-inf"))], 1)

    def keep(self, rows: Sequence[int]) -> None:
        """Only these rows (in this order) go on."""
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=self.device)
        self.dec.select(idx)
        self.bias, self.pos, self.logits = self.bias[idx], self.pos[idx], self.logits[idx]

    def turn(self, params: SamplingParams, prompt_index: Sequence[int], sample_index: Sequence[int],
             offset: Sequence[int], on_stop: Optional[Callable[[int, list[int]], None]] = None,
             budgets: Optional[Sequence[int]] = None) -> Rollout:
        """Each row's next turn, up to ``params.max_new_tokens`` (``budgets``: each row's own limit, at most that:
        a row stops decoding there); keyed like `NativeEngine.generate`."""
        R, B = params.max_new_tokens, self.logits.shape[0]
        limit = torch.as_tensor([min(int(b), R) for b in budgets] if budgets is not None else [R] * B,
                                dtype=torch.long, device=self.device)
        keyed = None
        if params.seed is not None and params.temperature > 0:
            keyed = _KeyedUniforms(params.seed, prompt_index, 1, R, self.device, sample_index, offset)
        stops = torch.as_tensor(self.engine.stop_ids, device=self.device)
        pad = self.engine.pad_id
        with eval_mode(self.model), torch.inference_mode():
            self._room(R)
            rows = torch.arange(B, device=self.device)
            tokens = torch.full((B, R), pad, dtype=torch.long, device=self.device)
            sampled = params.temperature > 0
            logps = torch.zeros((B, R), dtype=torch.float32, device=self.device) if sampled else None
            running = torch.ones(B, dtype=torch.bool, device=self.device)
            logits = self.logits
            for t in range(R):
                u = None if keyed is None else keyed.at(rows, t)
                if logps is None:
                    tok = sample_next(logits, params.temperature, params.top_k, params.top_p, uniforms=u)
                else:
                    tok, lp = sample_and_score(logits, params.temperature, params.top_k, params.top_p, uniforms=u)
                    logps[:, t] = torch.where(running, lp, 0.0)
                tok = torch.where(running, tok, torch.full_like(tok, pad))
                tokens[:, t] = tok
                self.bias[:, self.col] = torch.where(running, 0.0, float("-inf"))  # a stopped row's column: masked
                was = running.clone()
                running &= ~torch.isin(tok, stops)
                if on_stop is not None:
                    for row in (was & ~running).nonzero().squeeze(-1).tolist():
                        on_stop(row, tokens[row, :t + 1].tolist())
                running &= t + 1 < limit  # a row at its own limit decodes no further (its episode ends)
                # every sampled token goes into the cache, the stop included: the next turn follows it
                logits = self.dec.forward(tok[:, None], torch.where(was, self.pos, 0)[:, None], self.col,
                                          self.bias[:, None, None, None, :self.col + 1])
                self.logits = torch.where(was[:, None], logits, self.logits)
                self.pos = self.pos + was.long()
                self.col += 1
                if not bool(running.any()):
                    break
            tokens, logps = tokens.clone(), None if logps is None else logps.clone()
        rollout = build_rollout(torch.zeros((B, 0), dtype=torch.long), torch.zeros((B, 0), dtype=torch.long),
                                tokens.cpu(), self.engine.stop_ids, pad)
        if logps is not None:
            rollout.sample_logprobs = logps[:, :rollout.response_ids.shape[1]].cpu() * rollout.response_mask
        return rollout

    def extend(self, appended: Sequence[Sequence[int]]) -> None:
        """Prefill each row's ``appended`` tokens (every row has some: a row without is removed first)."""
        B = len(appended)
        T = max(len(a) for a in appended)
        with eval_mode(self.model), torch.inference_mode():
            self._room(T)
            ids = torch.full((B, T), self.engine.pad_id, dtype=torch.long, device=self.device)
            real = torch.zeros((B, T), dtype=torch.bool, device=self.device)
            for i, a in enumerate(appended):
                if a:
                    ids[i, T - len(a):] = torch.as_tensor(list(a), dtype=torch.long, device=self.device)
                    real[i, T - len(a):] = True
            pos = self.pos[:, None] + (real.long().cumsum(-1) - 1).clamp(min=0)
            c = self.col
            self.bias[:, c:c + T] = torch.where(real, 0.0, float("-inf"))
            causal = torch.ones((T, T), dtype=torch.bool, device=self.device).tril()
            block = (causal[None] & real[:, None, :]) | torch.eye(T, dtype=torch.bool, device=self.device)[None]
            mask = torch.cat([self.bias[:, None, :c].expand(B, T, c),
                              self.dec.embed.new_zeros((B, T, T)).masked_fill_(~block, float("-inf"))], -1)
            self.logits = self.dec.forward(ids, pos, c, mask[:, None, None])
            self.pos = self.pos + real.long().sum(-1)
            self.col += T
        self.prefilled.append(B * T)
