"""Turning next-token logits into tokens (temperature, top-k, top-p, greedy), and the keyed
uniform numbers behind each sampled token.

Sampled tokens do not depend on how a step's batch is laid out. The uniform number that picks
token ``t`` of sample ``j`` of the prompt at position ``g`` of a step's global batch is a pure
function of ``(seed, g, j, t)``: the same with one rank or eight, with any
``rollout.micro_batch_size``, wherever the row sits in the batch and whichever rows have
finished. Two things remain that can make layouts disagree: the logits themselves, which can
differ in their last bits between batch shapes (a token flips only when its uniform lies within
that difference of a CDF boundary), and the ``hf`` engine, which samples from torch's global
generator.

The generator is Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy
as 1, 2, 3", SC 2011), the counter-based generator of cuRAND, torch's CUDA sampling, JAX and
TensorFlow. It was chosen because its interface is exactly the problem: a 4 x 32-bit counter
(here ``(t, j, g, 0)``) and a 2 x 32-bit key (the seed's two halves) in, four independent 32-bit
words out, with no state; it passes TestU01's BigCrush, and its published known-answer vectors
(Random123's ``kat_vectors``) let a test check this implementation bit for bit. A chain of 32-bit
mixing hashes (lowbias32, the murmur3 finaliser) would be cheaper but has no such pedigree as a
keyed generator. Two of the four words make one 53-bit uniform (as ``genrand_res53`` does), and
`inverse_cdf` resolves the CDF to 2^-53 of its total: with a 24-bit uniform, or a float32 CDF,
every token of a 151k vocabulary whose probability is under 2^-24 (6e-8) would be drawn with
probability 0 or 6e-8 rather than its own. Sample j's numbers do not depend on the group size
either: a run with n = 16 samples, as its first 8, what a run with n = 8 samples (same model).

It runs as vectorised int64 tensor ops on the logits' device, so every device computes the same
numbers. torch's int64 arithmetic is signed, and a 32 x 32-bit product does not fit in it, so
each multiply is split into two 32 x 16-bit products: no intermediate value reaches 2^49, and
nothing relies on overflow wrapping.
"""
from __future__ import annotations

from typing import Optional

import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Philox4x32 key increments (Weyl sequence)


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product a * m; a: int64 in [0, 2^32), m: a 32-bit constant.

    a * m = (a * m_hi) * 2^16 + a * m_lo with both products under 2^48; carry the low product's
    upper part into the high one, t = floor(a * m / 2^16) < 2^48, and read the halves off t and
    the low product's bottom 16 bits."""
    p_lo = a * (m & 0xFFFF)  # < 2^48
    t = a * (m >> 16) + (p_lo >> 16)  # < 2^48; a * m = t * 2^16 + (p_lo mod 2^16)
    return t >> 16, ((t & 0xFFFF) << 16) | (p_lo & 0xFFFF)


def philox4x32(counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], key: tuple[int, int],
               rounds: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-``rounds``: four int64 tensors of 32-bit counter words (broadcastable to one shape)
    and a key of two 32-bit ints -> four int64 tensors of 32-bit output words, that shape."""
    c0, c1, c2, c3 = torch.broadcast_tensors(*counter)
    k0, k1 = key[0] & _MASK32, key[1] & _MASK32
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def keyed_uniforms(seed: int, prompt_index: torch.Tensor, sample_index: torch.Tensor,
                   position: torch.Tensor) -> torch.Tensor:
    """The uniform behind token ``position`` of sample ``sample_index`` of the prompt at ``prompt_index``
    of a step's global batch, sampled with ``seed``: float64 in [0, 1) with 53 random bits.

    The three index tensors (integers in [0, 2^32)) broadcast to the result's shape; they are the
    Philox counter ``(position, sample_index, prompt_index, 0)``, the seed (any int, taken modulo
    2^64) its key. Nothing else enters: not the batch size, the row, the chunk or the device."""
    if not -(1 << 63) <= seed < (1 << 64):
        raise ValueError(f"sampling seed {seed} does not fit in 64 bits; pass a seed in [-2^63, 2^64)")
    seed &= (1 << 64) - 1
    words = [torch.as_tensor(x, dtype=torch.long) for x in (position, sample_index, prompt_index)]
    words.append(torch.zeros((), dtype=torch.long, device=words[0].device))
    x0, x1, _, _ = philox4x32(tuple(words), (seed & _MASK32, seed >> 32))
    bits53 = ((x0 >> 5) << 26) | (x1 >> 6)  # 27 + 26 bits, < 2^53: exact in float64
    return bits53.double() * (1.0 / (1 << 53))


def stream_seed(seed: int, stream: int) -> int:
    """A 64-bit seed for a stateful generator, keyed by (seed, stream), for an engine that cannot
    use `keyed_uniforms` (``hf``): distinct streams get unrelated seeds, where ``seed + stream``
    would collide with the next step's ``seed + 1``."""
    if not 0 <= stream < 1 << 32:
        raise ValueError(f"stream {stream} is outside [0, 2^32)")
    seed &= (1 << 64) - 1
    z = torch.zeros((), dtype=torch.long)
    x0, x1, _, _ = philox4x32((z, z, z + stream, z + 1), (seed & _MASK32, seed >> 32))
    return (int(x0) << 32) | int(x1)


def sample_next(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                generator: Optional[torch.Generator] = None, uniforms: Optional[torch.Tensor] = None) -> torch.Tensor:
    """logits: (B, V) -> tokens (B,).

    Inverse-CDF sampling (`inverse_cdf`): row b takes the token at fraction ``uniforms[b]`` (B,) of
    its cumulative weight. Without ``uniforms`` they are drawn from ``generator`` (torch's global
    generator when None); the native engine passes `keyed_uniforms`. One uniform number per row,
    where torch.multinomial and the Gumbel or exponential tricks draw one per vocabulary entry
    (151k per row and step for Qwen's vocabulary)."""
    if temperature <= 0:
        return logits.argmax(-1)
    weights = sampling_weights(logits, temperature, top_k, top_p)
    if uniforms is None:
        uniforms = torch.rand(logits.shape[0], generator=generator, device=logits.device)
    return inverse_cdf(weights, uniforms.to(weights.device, torch.float64))


def sample_and_score(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                     uniforms: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_next` with ``temperature > 0``, and each sampled token's log-prob under
    softmax(logits / temperature) (before top-k / top-p: the distribution the trainer's log-prob pass
    computes), (B,) float32. Without top-k / top-p it costs next to nothing: log w[token] - log(sum w)
    from the weights and the total the sampling computed anyway (a separate log-softmax over a 151k
    vocabulary costs about as much as the sampling itself). With them, the full log-softmax."""
    weights = sampling_weights(logits, temperature, top_k, top_p)  # exp(z - max z), z = logits / T
    if uniforms is None:
        uniforms = torch.rand(logits.shape[0], device=logits.device)
    tokens, total = inverse_cdf_total(weights, uniforms.to(weights.device, torch.float64))
    if top_k or top_p < 1.0:
        z = logits.float() / temperature if temperature != 1.0 else logits.float()
        return tokens, z.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
    picked = weights.gather(-1, tokens[:, None]).double()  # exp(z_token - max z) >= 2^-53 of the total
    return tokens, (picked.log() - total.log()).squeeze(-1).float()


def sampling_weights(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (B, V) -> (B, V) float32 unnormalised probabilities after temperature, top-k and top-p
    (0 outside the kept set; the row's largest is 1)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return (logits - logits.max(-1, keepdim=True).values).exp_()


_BLOCK = 1024  # vocabulary entries per block of `inverse_cdf`


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights (B, V) >= 0, each row with a positive entry; u (B,) float64 in [0, 1) -> (B,) the
    token at fraction u of the row's cumulative weight (`inverse_cdf_total` without the total).
    """
    return inverse_cdf_total(weights, u)[0]


def _target(u: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """u (B,) of each row's total (B, 1), strictly below the total: the first entry of a running sum
    that ends above it has a positive weight."""
    return torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))


def inverse_cdf_total(weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B,), total (B, 1) float64: each row's summed weight): `inverse_cdf`, and the normaliser
    it computed on the way, which `sample_and_score` turns into the sampled tokens' log-probs.

    Two levels, so that a 53-bit uniform means something: the float32 sums of blocks of `_BLOCK`
    weights, accumulated in float64, pick the block; a float64 running sum of that one block picks
    the token. Every token is drawn with its own probability to a relative 1e-7 (the float32 block
    sums) plus an absolute 2^-53 of the total. A float32 running sum over the whole vocabulary
    (the way before) is off by up to 2^-24 (6e-8) of the total for every token: a 151k vocabulary
    holds many tokens below that, and they were drawn with probability 0 or twice their own. It
    also costs less: a float32 reduction instead of a (B, V) running sum. A token of weight 0
    spans an empty interval and is never picked. A vocabulary of at most one block takes one level,
    the float64 running sum of the row (a third of the operations)."""
    B, V = weights.shape
    if V <= _BLOCK:  # one block (the embedded model's 366 tokens): the float64 running sum of the row itself
        local = weights.double().cumsum(-1)
        total = local[:, -1:]
        # local[off] > target >= local[off - 1]: token off has a positive weight; clamp: NaN rows
        return torch.searchsorted(local, _target(u, total), right=True).squeeze(-1).clamp_(0, V - 1), total
    full = V // _BLOCK * _BLOCK
    sums = weights[:, :full].reshape(B, -1, _BLOCK).sum(-1)  # (B, V // BLOCK)
    if full < V:
        sums = torch.cat([sums, weights[:, full:].sum(-1, keepdim=True)], 1)
    sums = sums.double()  # (B, blocks)
    ends = sums.cumsum(-1)  # where each block's weight ends
    total = ends[:, -1:]
    target = _target(u, total)  # (B, 1)
    blk = torch.searchsorted(ends, target, right=True).clamp_(max=ends.shape[1] - 1)  # (B, 1); clamp: NaN rows
    frac = (target - (ends.gather(1, blk) - sums.gather(1, blk))) / sums.gather(1, blk)  # (B, 1) in [0, 1]
    idx = blk * _BLOCK + torch.arange(_BLOCK, device=weights.device)  # (B, BLOCK)
    w = torch.where(idx < V, weights.gather(1, idx.clamp(max=V - 1)), 0).double()
    local = w.cumsum(-1)  # (B, BLOCK) running weight within the block
    off = torch.searchsorted(local, frac.clamp(min=0) * local[:, -1:], right=True)  # (B, 1)
    # a fraction rounded up to the block's end: its last token of positive weight
    last = torch.where(w > 0, torch.arange(_BLOCK, device=w.device), -1).amax(-1, keepdim=True)
    # a row with no finite positive weight (NaN logits) still gets a valid token id: its step is then
    # caught as non-finite by the update, not by an index error in the next forward
    return (blk * _BLOCK + torch.minimum(off, last)).squeeze(-1).clamp_(0, V - 1), total
