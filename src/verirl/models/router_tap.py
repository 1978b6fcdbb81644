"""A tap on the routers of a transformers mixture-of-experts model: what each sparse layer chose, and
routing replay (the experts given per token, the weights from the live router).

transformers' sparse blocks all call ``ids``/``weights`` from ``self.gate(h)`` (h the block's tokens
flattened, (T, H)), which returns ``(router_logits (T, E), top_k_weights (T, k), top_k_index (T, k))``,
and pass no argument a caller could set, so the tap is a forward hook on each ``block.gate`` whose return
value replaces the gate's output (no patched code):

* replay (`begin` with ``routes`` and ``replay=True``): token t of the next forward goes to the experts
  ``routes[t, j]`` in sparse layer j, where recorded (>= 0; -1 keeps the router's own choice), with the
  weights the family gives those experts from the live logits (`verirl.models.moe.reweight`): the router
  keeps its gradient, and only the choice is replayed;
* record: each forward's ids used per layer (``last_ids``), with ``keep_logits`` the live logits
  (``last_logits``, with their graph: the aux loss), and statistics over the tokens marked real,
  accumulated over forwards (`metrics`): each expert's load, the router's entropy, and against ``routes``
  the (token, layer) pairs whose used experts differ from the recorded ones (``replay``) and those whose
  router's own choice differs from them (``router``).

A forward recomputed in the backward (activation checkpointing) overwrites ``last_ids`` with the same
ids; statistics are taken in `end`, called once per forward before its backward.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

from verirl.models.moe import moe_blocks, reweight, routing

_TAP: contextvars.ContextVar = contextvars.ContextVar("verirl_router_tap", default=None)


def current() -> Optional["RouterTap"]:
    """The tap installed by the innermost `RouterTap` block, or None."""
    return _TAP.get()


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(T,) whether the expert sets of a and b (T, k) are equal."""
    return (a.sort(-1).values == b.sort(-1).values).all(-1)


class RouterTap:
    """Hooks on the routers of ``model``'s sparse blocks (`verirl.models.moe.moe_blocks`), installed inside a
    ``with`` block (removed on exit), where `current` returns it. ``routed``, ``replay`` and ``store`` are
    for the log-prob passes run inside the block (`verirl.train.update`, `verirl.train.packing`): they slice
    ``routed`` (N, P + R, L, k) like the token ids for each forward (`begin`), and write the routes they used
    into ``store`` (R2: the first log-prob pass's, replayed by the later ones)."""

    def __init__(self, model, routed: Optional[torch.Tensor] = None, replay: bool = False,
                 store: Optional[torch.Tensor] = None, keep_logits: bool = False):
        self.blocks = moe_blocks(model)
        self.rule = routing(model.config)
        self.keep_logits = keep_logits
        # what the passes inside the block read: a rollout's (N, P + R, L, k) routes to compare with and, with
        # ``replaying``, to route by; ``store``: the same shape, where they write the routes they used
        self.routed, self.replaying, self.store = routed, replay and routed is not None, store
        self.last_real: Optional[torch.Tensor] = None
        self.counting = True  # off: `end` adds nothing and the passes store nothing (`uncounted`)
        self.layers = len(self.blocks)
        self._routes: Optional[torch.Tensor] = None
        self._replay = False
        self.last_ids: list[Optional[torch.Tensor]] = [None] * self.layers
        self.last_own: list[Optional[torch.Tensor]] = [None] * self.layers
        self.last_logits: list[Optional[torch.Tensor]] = [None] * self.layers
        E = self.rule.num_experts if self.rule is not None else 0
        self.load = torch.zeros((self.layers, E), dtype=torch.float64)  # tokens routed to each expert
        self.sums = {"tokens": 0.0, "entropy": 0.0, "compared": 0.0, "replay": 0.0, "router": 0.0}
        self._handles: list = []
        self._token = None

    def __enter__(self) -> "RouterTap":
        self._handles = [block.gate.register_forward_hook(self._hook(j)) for j, (_, block) in enumerate(self.blocks)]
        self._token = _TAP.set(self)
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        _TAP.reset(self._token)

    def begin(self, routes: Optional[torch.Tensor] = None, replay: bool = False) -> None:
        """The next forward's recorded routes (T, L, k) in the order its blocks see the tokens (rows after
        rows), -1 where none; ``replay``: route by them. Clears the last forward's ids and logits."""
        if routes is not None and (routes.dim() != 3 or routes.shape[1] != self.layers):
            raise ValueError(f"routes of shape {tuple(routes.shape)} for a model of {self.layers} sparse layers; "
                             f"expected (tokens, {self.layers}, top_k)")
        self._routes, self._replay = routes, replay and routes is not None
        self.last_ids = [None] * self.layers
        self.last_own = [None] * self.layers
        self.last_logits = [None] * self.layers

    def _hook(self, j: int):
        def hook(module, args, out):
            logits, weights, ids = out
            own = ids
            if self._routes is not None:
                rec = self._routes[:, j].to(ids.device)
                if rec.shape[0] != ids.shape[0]:
                    raise ValueError(f"routes for {rec.shape[0]} tokens, but sparse layer {j}'s router sees "
                                     f"{ids.shape[0]}; the routes must follow the forward's tokens")
                if self._replay:
                    ids = torch.where(rec[:, :1] >= 0, rec.long(), ids)
                    weights = reweight(logits, ids, self.rule).to(weights.dtype)
            self.last_ids[j], self.last_own[j] = ids.detach(), own.detach()
            self.last_logits[j] = logits if self.keep_logits else logits.detach()
            return (logits, weights, ids) if ids is not own else out
        return hook

    @torch.no_grad()
    def end(self, real: Optional[torch.Tensor] = None) -> None:
        """Add the last forward's statistics over its tokens where ``real`` (T,) bool (default: all)."""
        self.last_real = real
        if not self.counting:
            return
        for j in range(self.layers):
            ids, own, logits = self.last_ids[j], self.last_own[j], self.last_logits[j]
            if ids is None:
                continue
            keep = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device) if real is None else \
                real.to(ids.device).bool()
            used = ids[keep]
            self.load[j] += torch.bincount(used.reshape(-1).cpu(), minlength=self.load.shape[1]).double()
            probs = torch.softmax(logits[keep].float(), -1)
            self.sums["entropy"] += float(-(probs * torch.log(probs.clamp_min(1e-30))).sum())
            self.sums["tokens"] += float(keep.sum())
            if self._routes is not None:
                rec = self._routes[:, j].to(ids.device)[keep].long()
                have = rec[:, 0] >= 0
                self.sums["compared"] += float(have.sum())
                self.sums["replay"] += float((~_same(rec, used) & have).sum())
                self.sums["router"] += float((~_same(rec, own[keep]) & have).sum())

    def metrics(self, all_sum=None) -> dict[str, float]:
        """``moe/load_max_over_mean`` (the largest over the sparse layers of max expert load / mean load) and
        its ``/mean`` over the layers, ``moe/router_entropy`` (nats, mean over tokens and layers), and where
        routes were given ``moe/replay_disagreement`` and ``moe/router_disagreement`` (fractions of the
        (token, layer) pairs with a recorded route). ``all_sum`` (a list of floats -> their sums over the
        ranks) makes them the global batch's."""
        if not self.layers:
            return {}
        flat = self.load.reshape(-1).tolist() + list(self.sums.values())
        if all_sum is not None:
            flat = list(all_sum(flat))
        n = self.load.numel()
        load = torch.tensor(flat[:n], dtype=torch.float64).view_as(self.load)
        sums = dict(zip(self.sums, flat[n:]))
        if sums["tokens"] <= 0:
            return {}
        ratio = load.max(-1).values / load.mean(-1).clamp_min(1e-12)
        out = {"moe/load_max_over_mean": float(ratio.max()), "moe/load_max_over_mean/mean": float(ratio.mean()),
               "moe/router_entropy": sums["entropy"] / sums["tokens"]}
        if sums["compared"] > 0:
            out["moe/replay_disagreement"] = sums["replay"] / sums["compared"]
            out["moe/router_disagreement"] = sums["router"] / sums["compared"]
        return out

    def aux_loss(self, real: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
        """transformers' load-balancing loss (`load_balancing_loss_func`, the Switch loss: E x sum over experts
        of the token share times the mean router probability, over the layers) on the last forward's live
        logits of every sparse layer (``keep_logits``) at the tokens where ``real`` (T,) bool (default: all),
        with its graph; None without them."""
        from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

        logits = [x for x in self.last_logits if x is not None]
        if not self.keep_logits or not logits:
            return None
        if real is not None:
            keep = real.to(logits[0].device).bool()
            logits = [x[keep] for x in logits]
        return load_balancing_loss_func(tuple(logits), self.rule.num_experts, self.rule.top_k)


@contextlib.contextmanager
def uncounted(on: bool = True) -> Iterator[None]:
    """Inside the block (when ``on``) the current tap's forwards add no statistics and store no routes: a
    forward that only joins the other ranks' collectives."""
    tap = current()
    if tap is None or not on:
        yield
        return
    was, tap.counting = tap.counting, False
    try:
        yield
    finally:
        tap.counting = was


def replay_mode(value) -> str:
    """algo.router_replay as one of off / r2 / r3 (YAML reads a bare off as false)."""
    v = str(value).lower()
    return "off" if v in ("off", "false", "none", "0", "") else v
