"""Causal attention for short segments, as two matmuls and a softmax.

GRPO batches are full of short segments (a prompt of tens of tokens, responses of tens of
tokens, one new token per decoding step). For those, SDPA's flash kernel with a mask spends
its time in per-call set-up, while two batched matmuls and a softmax do the same work with
none. For long segments the flash kernel wins and holds no (query x key) matrix. So the
rule is: short segments (at most `SMALL_SEGMENT` query x key pairs) go through
`small_attention`, long ones through SDPA; callers decide with `small_enough`.
"""
from __future__ import annotations

import torch

# at most this many (query x key) pairs per segment go through `small_attention`
SMALL_SEGMENT = 128 * 128


def small_enough(q_len: int, k_len: int) -> bool:
    return q_len * k_len <= SMALL_SEGMENT


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """q (S, Q, H, d); k, v (S, KVH, K, d); bias (S, 1, 1, Q, K) additive (0 = may attend, -inf = may
    not) -> (S, Q, H, d). Query head h uses key/value head h // (H / KVH), as in transformers'
    repeat_kv; the heads sharing a key/value head go through one matmul (no copies of k and v).
    Every query row must see at least one key. The softmax runs in at least float32."""
    S, Q, H, d = q.shape
    KVH, K = k.shape[1], k.shape[2]
    G = H // KVH
    qg = q.reshape(S, Q, KVH, G, d).permute(0, 2, 3, 1, 4).reshape(S, KVH, G * Q, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).view(S, KVH, G, Q, K) * scale + bias
    probs = scores.softmax(-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    out = torch.matmul(probs.view(S, KVH, G * Q, K), v).view(S, KVH, G, Q, d)
    return out.permute(0, 3, 1, 2, 4)  # (S, Q, KVH, G, d), i.e. (S, Q, H, d) in the model's head order
