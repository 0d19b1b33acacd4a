"""Attention with a KV cache: a chunk of new queries at the end of a longer cache.

The cache holds, per sequence and KV head, a preallocated ``capacity`` x d block for K and one for
V, and a ``length``: slots 0..length-1 hold the keys/values of tokens 0..length-1. A forward step
with a chunk of n new tokens (n = prompt length at prefill, a chunk of it under chunked prefill,
1 at decode, k + 1 when verifying speculative tokens):

1. writes the chunk's K and V at slots past_len .. past_len + n - 1 (past_len = length before the
   step), then sets length = past_len + n (refusing a chunk that does not fit the capacity);
2. lets query head h read KV head h // (Hq / Hkv) (GQA, contiguous groups);
3. masks causally with an offset: query i of the chunk sits at absolute position past_len + i and
   attends keys j <= past_len + i: all of the cache, plus the chunk's keys up to itself.
   (torch's ``is_causal`` aligns top-left, query i <- keys j <= i, which is wrong here unless
   past_len = 0; this is the bottom-right alignment.)

The result must equal attention over the whole sequence recomputed from scratch, row for row:
:func:`full_recompute` is that oracle. Practice mode lives in :mod:`.kv_cache_practice`.
"""

from __future__ import annotations

import numpy as np

from lib.inputs import integer

from ._common import acc_dtype_of, check_qkv, float_array
from .naive import naive_attention

__all__ = ["CachedAttention", "KVCache", "attend_with_cache", "full_recompute"]


class KVCache:
    """Preallocated K/V storage for ``batch`` sequences: k (B, Hkv, capacity, d), v (B, Hkv, capacity, dv).

    ``length`` counts the filled slots (shared by the batch: the sequences advance together).
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, capacity: int,
                 v_dim: int | None = None, dtype: object = np.float32) -> None:
        self.batch = integer("batch", batch, 1)
        self.n_kv_heads = integer("n_kv_heads", n_kv_heads, 1)
        self.head_dim = integer("head_dim", head_dim, 1)
        self.capacity = integer("capacity", capacity, 1, unit="tokens")
        self.v_dim = self.head_dim if v_dim is None else integer("v_dim", v_dim, 1)
        dt = acc_dtype_of(dtype)
        self.k = np.zeros((self.batch, self.n_kv_heads, self.capacity, self.head_dim), dt)
        self.v = np.zeros((self.batch, self.n_kv_heads, self.capacity, self.v_dim), dt)
        self.length = 0

    def append(self, k_new: object, v_new: object) -> range:
        """Write k_new (B, Hkv, n, d) and v_new (B, Hkv, n, dv) at slots length .. length + n - 1;
        return those slots. ValueError if the chunk does not fit the remaining capacity."""
        k_new, v_new = float_array("k_new", k_new), float_array("v_new", v_new)
        want_k = (self.batch, self.n_kv_heads, k_new.shape[2], self.head_dim)
        want_v = (self.batch, self.n_kv_heads, k_new.shape[2], self.v_dim)
        if k_new.shape != want_k or v_new.shape != want_v:
            raise ValueError(f"k_new and v_new must have shapes {want_k} and {want_v}, got {k_new.shape} and {v_new.shape}")
        n = k_new.shape[2]
        if self.length + n > self.capacity:
            raise ValueError(f"a chunk of {n} tokens does not fit: {self.length} of {self.capacity} slots are used")
        slots = range(self.length, self.length + n)
        self.k[:, :, slots.start:slots.stop] = k_new
        self.v[:, :, slots.start:slots.stop] = v_new
        self.length += n
        return slots

    def keys(self) -> np.ndarray:
        """The filled keys (B, Hkv, length, d): a view, not a copy."""
        return self.k[:, :, : self.length]

    def values(self) -> np.ndarray:
        """The filled values (B, Hkv, length, dv): a view, not a copy."""
        return self.v[:, :, : self.length]


def attend_with_cache(cache: KVCache, q: object, k_new: object, v_new: object, *,
                      scale: float | None = None, acc_dtype: object = np.float32) -> np.ndarray:
    """Append the chunk's K/V to ``cache``, then attend its queries q (B, Hq, n, d) over the cache.

    O_i = softmax_j(q_i . k_j * scale, j <= past_len + i) V over slots 0 .. past_len + n - 1 with
    past_len = cache.length before the call; query head h reads KV head h // (Hq / Hkv).
    Returns O (B, Hq, n, dv) in ``acc_dtype``.
    """
    if not isinstance(cache, KVCache):
        raise ValueError(f"cache must be a KVCache, got {type(cache).__name__}")
    q = float_array("q", q)
    if q.shape[0] != cache.batch or q.shape[3] != cache.head_dim or q.shape[1] % cache.n_kv_heads:
        raise ValueError(f"q must be (batch={cache.batch}, a multiple of {cache.n_kv_heads} heads, n, "
                         f"head_dim={cache.head_dim}), got {q.shape}")
    if np.shape(k_new)[2:3] != (q.shape[2],):
        raise ValueError(f"the chunk has {q.shape[2]} queries but k_new has shape {np.shape(k_new)}")
    past = cache.length
    cache.append(k_new, v_new)
    return naive_attention(q, cache.keys(), cache.values(), causal=True, query_offset=past,
                           scale=scale, acc_dtype=acc_dtype)


def full_recompute(q_all: object, k_all: object, v_all: object, n_last: int, *,
                   scale: float | None = None, acc_dtype: object = np.float32) -> np.ndarray:
    """The oracle: causal attention over the whole sequence (B, H, N, d), then its last ``n_last`` rows.

    Any cached implementation must give these rows for a chunk of ``n_last`` queries appended
    after N - n_last cached tokens.
    """
    q_all, k_all, v_all, _ = check_qkv(q_all, k_all, v_all)
    if q_all.shape[2] != k_all.shape[2]:
        raise ValueError(f"q_all and k_all must cover the same tokens, got {q_all.shape[2]} and {k_all.shape[2]}")
    n_last = integer("n_last", n_last, 0, q_all.shape[2])
    out = naive_attention(q_all, k_all, v_all, causal=True, scale=scale, acc_dtype=acc_dtype)
    return out[:, :, q_all.shape[2] - n_last:]


class CachedAttention:
    """The reference implementation of the practice interface (:mod:`.kv_cache_practice`).

    ``CachedAttention(batch, n_q_heads, n_kv_heads, head_dim, capacity)``; ``forward(q, k, v)``
    takes one chunk (q (B, Hq, n, d), k and v (B, Hkv, n, d)) and returns O (B, Hq, n, d);
    ``length`` is the number of cached tokens. A chunk past the capacity raises ValueError.
    """

    def __init__(self, batch: int, n_q_heads: int, n_kv_heads: int, head_dim: int, capacity: int) -> None:
        self.n_q_heads = integer("n_q_heads", n_q_heads, 1)
        self.cache = KVCache(batch, n_kv_heads, head_dim, capacity)
        if self.n_q_heads % self.cache.n_kv_heads:
            raise ValueError(f"n_q_heads ({n_q_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")

    @property
    def length(self) -> int:
        return self.cache.length

    def forward(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return attend_with_cache(self.cache, q, k, v)
