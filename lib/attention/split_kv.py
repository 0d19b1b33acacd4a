"""Split-KV decode attention (flash-decoding): partial outputs with their log-sum-exp, merged exactly.

At decode each sequence has one query token (per query head) and a long cache. A kernel that
gives each (sequence, KV head) pair one thread block launches B x Hkv blocks: at batch 1 with 8
KV heads that is 8 blocks on a 132-SM H100, 6% of the SMs, however long the context. Splitting
the keys into S chunks gives B x Hkv x S blocks; each computes, over its chunk c of keys,

    o_c = sum_{j in c} exp(s_j - m_c) v_j / l_c,   lse_c = m_c + log l_c,   l_c = sum_{j in c} exp(s_j - m_c)

and a second step merges them exactly (it is the log-sum-exp identity, not an approximation):

    L = log sum_c exp(lse_c) = M + log sum_c exp(lse_c - M),   M = max_c lse_c
    O = sum_c exp(lse_c - L) o_c

A split with no keys (the context shorter than S chunks, a sequence of the batch shorter than
the others, or every key masked) has l_c = 0: its o_c must be 0 (not 0/0 = NaN) and its
lse_c = -inf, so its weight exp(-inf - L) is exactly 0. If every split is empty, M = -inf and
lse_c - M = -inf - (-inf) = NaN unless guarded (then O = 0, L = -inf: the zero-row convention of
:mod:`lib.attention.naive`). ``guard_empty_splits=False`` reproduces both NaNs.

The occupancy arithmetic (:func:`decode_occupancy`, :func:`wave_efficiency` of :mod:`lib.kernels.sm`, and the split count
FlashAttention-2 picks, :func:`flash_num_splits` / :func:`decode_num_splits`) takes the SM count
from ``data/hardware.yaml`` (``gpu(name).compute_units``) or as a parameter. More splits are not
free: each writes a partial output and LSE that the merge reads back, and a split count that
overshoots a whole wave by a few blocks (136 blocks on 132 SMs) runs a second, nearly empty wave.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, integer_array
from lib.kernels.sm import wave_efficiency, waves

from ._common import acc_dtype_of, check_qkv, expand_kv, scale_of

__all__ = [
    "DecodeOccupancy",
    "SplitKVResult",
    "decode_occupancy",
    "merge_partials",
    "partial_attention",
    "split_kv_attention",
    "decode_num_splits",
    "flash_num_splits",
    "split_ranges",
    "wave_efficiency",
]


def split_ranges(n_keys: int, num_splits: int) -> list[tuple[int, int]]:
    """The S key ranges of flash-decoding: chunk = ceil(N / S), split s = [s chunk, min((s+1) chunk, N)).

    Always S ranges; the last ones are EMPTY when (S - 1) x chunk >= N (e.g. N = 5, S = 4: chunks of
    2 give [0,2) [2,4) [4,5) [5,5)), and all are empty when N = 0.
    """
    n_keys = integer("n_keys", n_keys, 0, unit="keys")
    num_splits = integer("num_splits", num_splits, 1)
    chunk = max(1, math.ceil(n_keys / num_splits))
    return [(min(s * chunk, n_keys), min((s + 1) * chunk, n_keys)) for s in range(num_splits)]


def partial_attention(q: object, k: object, v: object, key_mask: object = None, *, scale: float | None = None,
                      acc_dtype: object = np.float32, guard_empty_splits: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Attention of q (B, Hq, nq, d) over ONE chunk of keys k (B, Hkv, n, d), v (B, Hkv, n, dv), n >= 0.

    Returns (o_c, lse_c): o_c = softmax over the chunk's keys times V (B, Hq, nq, dv), lse_c =
    m_c + log sum exp(s - m_c) (B, Hq, nq). ``key_mask`` (B, n) booleans marks the keys that exist
    (True) per sequence. A chunk with no key: o_c = 0, lse_c = -inf (unguarded: o_c = 0/0 = NaN).
    Every query sees every key of the chunk (decode: no causal mask).
    """
    q, k, v, group = check_qkv(q, k, v)
    acc = acc_dtype_of(acc_dtype)
    sc = acc.type(scale_of(scale, q.shape[3]))
    s = np.matmul(q.astype(acc), np.swapaxes(expand_kv(k, group).astype(acc), -1, -2)) * sc
    if key_mask is not None:
        km = np.asarray(key_mask)
        if km.dtype != bool or km.shape != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_mask must be booleans of shape (batch, n_keys) = {(k.shape[0], k.shape[2])}, "
                             f"got {km.dtype} {km.shape}")
        s = np.where(km[:, None, None, :], s, acc.type(-np.inf))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = s.max(axis=-1) if s.shape[-1] else np.full(s.shape[:-1], -np.inf, acc)
        m_use = np.where(np.isneginf(m), acc.type(0), m) if guard_empty_splits else m
        p = np.exp(s - m_use[..., None])
        l_sum = p.sum(axis=-1, dtype=acc)
        o = np.matmul(p, expand_kv(v, group).astype(acc))
        if guard_empty_splits:
            o = np.where((l_sum > 0)[..., None], o / np.where(l_sum > 0, l_sum, 1)[..., None], acc.type(0))
        else:
            o = o / l_sum[..., None]
        lse = m_use + np.log(l_sum)
    return o.astype(acc), lse.astype(acc)


def merge_partials(outs: Sequence[np.ndarray], lses: Sequence[np.ndarray], *,
                   guard_empty_splits: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Exact merge of S partial results: L = M + log sum_c exp(lse_c - M), O = sum_c exp(lse_c - L) o_c.

    ``outs``: S arrays (..., dv); ``lses``: S arrays (...). A split with lse_c = -inf gets weight 0
    (guarded: its o_c is not even read, so a NaN there cannot leak). All splits empty: O = 0 and
    L = -inf when guarded, NaN otherwise. Returns (O, L) in the partials' dtype.
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"outs and lses must be non-empty and of the same length, got {len(outs)} and {len(lses)}")
    o = np.stack([np.asarray(x) for x in outs])
    lse = np.stack([np.asarray(x) for x in lses])
    if o.shape[:-1] != lse.shape:
        raise ValueError(f"each out must be its lse's shape plus a value axis, got {o.shape[1:]} and {lse.shape[1:]}")
    if np.isnan(lse).any() or np.isposinf(lse).any():
        raise ValueError("lses must not contain NaN or +inf (an empty split has lse = -inf)")
    dt = np.result_type(o.dtype, lse.dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        big_m = lse.max(axis=0)
        m_use = np.where(np.isneginf(big_m), dt.type(0), big_m) if guard_empty_splits else big_m
        w = np.exp(lse - m_use)  # (S, ...)
        total = w.sum(axis=0)
        big_l = m_use + np.log(total)
        if guard_empty_splits:
            contrib = np.where((w > 0)[..., None], w[..., None] * o, dt.type(0))
            out = np.where((total > 0)[..., None], contrib.sum(axis=0) / np.where(total > 0, total, 1)[..., None],
                           dt.type(0))
        else:
            out = (w[..., None] * o).sum(axis=0) / total[..., None]
    return out.astype(dt), big_l.astype(dt)


@dataclass(frozen=True)
class SplitKVResult:
    """The merged output (B, Hq, nq, dv) and LSE (B, Hq, nq), every split's partial output and LSE
    (leading axis S), and the key ranges used."""

    out: np.ndarray
    lse: np.ndarray
    partial_out: np.ndarray
    partial_lse: np.ndarray
    ranges: tuple[tuple[int, int], ...]

    @property
    def empty_splits(self) -> np.ndarray:
        """(S, B) booleans: split s has no key for sequence b."""
        return np.isneginf(self.partial_lse).all(axis=(2, 3))


def split_kv_attention(q: object, k: object, v: object, num_splits: int = 1, *,
                       ranges: Sequence[tuple[int, int]] | None = None, kv_lengths: object = None,
                       scale: float | None = None, acc_dtype: object = np.float32,
                       guard_empty_splits: bool = True) -> SplitKVResult:
    """Decode attention of q (B, Hq, nq, d) over k, v (B, Hkv, N, d) in ``num_splits`` key chunks.

    Chunks from :func:`split_ranges` unless ``ranges`` (consecutive, covering 0..N, empty ones
    allowed) is given; ``kv_lengths`` (B,) marks keys j >= length of sequence b as absent (a
    shorter sequence then has empty splits at the end). Each chunk: :func:`partial_attention`;
    then :func:`merge_partials`. Equals unsplit attention (every query sees every present key).
    """
    q, k, v, _ = check_qkv(q, k, v)
    n = k.shape[2]
    if ranges is None:
        ranges = split_ranges(n, num_splits)
    else:
        ranges = [(integer("range start", a, 0), integer("range stop", b, 0)) for a, b in ranges]
        if not ranges or ranges[0][0] != 0 or ranges[-1][1] != n or any(
                b < a for a, b in ranges) or any(ranges[i][1] != ranges[i + 1][0] for i in range(len(ranges) - 1)):
            raise ValueError(f"ranges must be consecutive (start, stop) pairs covering 0..{n}, got {ranges}")
    key_mask = None
    if kv_lengths is not None:
        lengths = integer_array("kv_lengths", kv_lengths).reshape(-1)
        if lengths.shape != (k.shape[0],) or (lengths.size and lengths.max() > n):
            raise ValueError(f"kv_lengths must give one length <= {n} per sequence ({k.shape[0]}), got {lengths.tolist()}")
        key_mask = np.arange(n)[None, :] < lengths[:, None]
    outs, lses = [], []
    for a, b in ranges:
        km = None if key_mask is None else key_mask[:, a:b]
        o, lse = partial_attention(q, k[:, :, a:b], v[:, :, a:b], km, scale=scale, acc_dtype=acc_dtype,
                                   guard_empty_splits=guard_empty_splits)
        outs.append(o), lses.append(lse)
    out, lse = merge_partials(outs, lses, guard_empty_splits=guard_empty_splits)
    return SplitKVResult(out, lse, np.stack(outs), np.stack(lses), tuple(ranges))


@dataclass(frozen=True)
class DecodeOccupancy:
    """Thread blocks of a decode attention launch against the GPU's SMs.

    ``thread_blocks`` = batch x kv_heads x splits; ``slots`` = SMs x blocks_per_sm resident at once;
    ``waves`` = ceil(blocks / slots); ``sm_busy_fraction`` = blocks / (waves x slots), the mean
    fraction of block slots doing work (0.06 = 94% of the GPU idle).
    """

    thread_blocks: int
    sm_count: int
    blocks_per_sm: int
    waves: int
    sm_busy_fraction: float

    @property
    def slots(self) -> int:
        return self.sm_count * self.blocks_per_sm


def _sms(gpu: object, sm_count: object) -> int:
    if sm_count is not None:
        return integer("sm_count", sm_count, 1)
    if gpu is None:
        raise ValueError("give gpu (a name from data/hardware.yaml) or sm_count")
    from lib.registry.hardware import gpu as get_gpu

    return get_gpu(gpu).compute_units


def decode_occupancy(batch: int, kv_heads: int, num_splits: int = 1, *, gpu: str | None = None,
                     sm_count: int | None = None, blocks_per_sm: int = 1) -> DecodeOccupancy:
    """Blocks = batch x kv_heads x num_splits (one block per KV head: its query heads ride along
    under GQA), against SMs x ``blocks_per_sm`` slots; see :class:`DecodeOccupancy`.
    Batch 1, 8 KV heads, no split, H100 (132 SMs): 8 blocks, 6.1% busy."""
    batch, kv_heads = integer("batch", batch, 1), integer("kv_heads", kv_heads, 1)
    num_splits = integer("num_splits", num_splits, 1)
    per_sm = integer("blocks_per_sm", blocks_per_sm, 1)
    sms = _sms(gpu, sm_count)
    blocks = batch * kv_heads * num_splits
    slots = sms * per_sm
    return DecodeOccupancy(blocks, sms, per_sm, waves(blocks, slots), wave_efficiency(blocks, slots))


def flash_num_splits(blocks_without_split: int, slots: int, key_blocks: int, max_splits: int = 128) -> int:
    """The split count FlashAttention-2 picks (``num_splits_heuristic`` in flash-attn's
    csrc/flash_attn/flash_api.cpp), re-derived here:

    1 if the unsplit launch already fills 80% of the slots; else, over the S <= min(max_splits,
    slots, key_blocks) that change ceil(key_blocks / S) (other S give the same chunks), the
    SMALLEST S whose :func:`wave_efficiency` of S x blocks is at least 85% of the best one (more
    splits cost more partial-output traffic and merge work). flash-attn passes slots = 2 x SMs
    (two 128-thread blocks per SM) and key_blocks = ceil(context / block_n), block_n = 256, 128,
    64 for head_dim <= 64, <= 128, above.
    """
    base = integer("blocks_without_split", blocks_without_split, 1)
    slots = integer("slots", slots, 1)
    key_blocks = integer("key_blocks", key_blocks, 1)
    max_splits = integer("max_splits", max_splits, 1)
    if base >= 0.8 * slots:
        return 1
    top = min(max_splits, slots, key_blocks)
    eligible = [s for s in range(1, top + 1) if s == 1 or math.ceil(key_blocks / s) != math.ceil(key_blocks / (s - 1))]
    eff = {s: wave_efficiency(base * s, slots) for s in eligible}
    best = max(eff.values())
    return next(s for s in eligible if eff[s] >= 0.85 * best)


def decode_num_splits(batch: int, kv_heads: int, context: int, head_dim: int = 128, *, gpu: str | None = None,
                      sm_count: int | None = None, blocks_per_sm: int = 2) -> int:
    """FlashAttention-2's split count for a decode step (one query token, GQA heads packed per KV
    head): :func:`flash_num_splits` with blocks = batch x kv_heads, slots = SMs x blocks_per_sm,
    key_blocks = ceil(context / block_n). Batch 1, 8 KV heads, 8K context, d = 128, H100."""
    batch, kv_heads = integer("batch", batch, 1), integer("kv_heads", kv_heads, 1)
    context = integer("context", context, 1, unit="tokens")
    d = integer("head_dim", head_dim, 1)
    block_n = 256 if d <= 64 else 128 if d <= 128 else 64
    slots = _sms(gpu, sm_count) * integer("blocks_per_sm", blocks_per_sm, 1)
    return flash_num_splits(batch * kv_heads, slots, math.ceil(context / block_n))
