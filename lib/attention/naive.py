"""Naive scaled dot-product attention, written out: the reference every other module is tested against.

    S = Q K^T * scale  (+ additive mask; -inf where the boolean mask says no)
    P = softmax_row(S) = exp(S - m) / l,   m = rowmax(S),  l = rowsum(exp(S - m))
    O = P V,           LSE = m + log(l)   (the log-sum-exp of each row, in natural-log units)

Shapes are (batch, heads, seq, head_dim): q (B, Hq, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv)
with Hq = group x Hkv (grouped-query attention): query head h reads KV head h // group, the same
contiguous grouping as ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``.

Numerics, each one a parameter so a notebook can switch it off and watch what breaks:

* ``scale`` defaults to 1/sqrt(d): the dot product of two random unit-variance d-vectors has
  variance d, so unscaled scores saturate the softmax (one key takes all the weight).
* ``subtract_max``: exp(s - m) never overflows (every exponent <= 0, the largest term is 1).
  Without it exp(s) overflows once s > 88.7 in FP32 and s > 11.09 in FP16.
* ``acc_dtype``: the dtype every intermediate (scores, exponentials, sums, the output) is rounded
  to; FP32 by default for FP16/BF16 inputs, as kernels do. numpy rounds each operation's result to
  it (a float16 matmul or sum still accumulates internally in float32: the emulation is per
  operation, not per addition).
* ``guard_masked_rows``: a row whose keys are all masked has m = -inf and S - m = -inf - (-inf) =
  NaN. The book's convention: such a row attends nothing and returns zeros (its LSE is -inf). This
  is what ``torch.nn.functional.scaled_dot_product_attention`` returns on the CPU build (torch
  2.5+, measured on 2.13 for the math and CPU-flash backends, outputs and gradients), while
  ``torch.softmax`` of an all -inf row returns NaN. ``guard_masked_rows=False`` reproduces NaN.
  An additive mask with a large finite negative value (e.g. ``finfo.min`` as some libraries use)
  does not mask a row fully: such a row averages V uniformly over its "masked" keys instead.

Every function accepts numpy arrays in any float dtype; :func:`round_to_dtype` rounds FP32 values
to FP16 or BF16 (round to nearest even) to emulate low-precision inputs without ml_dtypes.
"""

from __future__ import annotations

import numpy as np

from lib.inputs import integer, integer_array

from ._common import acc_dtype_of, build_mask, check_qkv, expand_kv, masked_scores, scale_of

__all__ = [
    "attention_probabilities",
    "causal_mask",
    "kv_head_of",
    "naive_attention",
    "padding_mask",
    "round_to_dtype",
    "sliding_window_mask",
    "softmax_rows",
]

INPUT_DTYPES = ("fp32", "fp16", "bf16", "fp64")


def round_to_dtype(x: object, dtype: str) -> np.ndarray:
    """Round each value to the nearest ``dtype`` value (ties to even), returned as float32 (float64 for fp64).

    fp16: IEEE binary16 via numpy (overflow to +-inf past 65504). bf16: the top 16 bits of the
    FP32 pattern after adding 0x7FFF + lsb (round to nearest even); NaN stays NaN, values past
    the BF16 maximum (about 3.39e38) become +-inf, as ``torch.Tensor.to(torch.bfloat16)`` does.
    fp32: a plain cast; fp64: float64, unrounded.
    """
    if dtype not in INPUT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(INPUT_DTYPES)}, got {dtype!r}")
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"x must be a floating-point array, got dtype {arr.dtype}")
    if dtype == "fp64":
        return arr.astype(np.float64)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return arr.astype(np.float16).astype(np.float32)
    x32 = arr.astype(np.float32)
    if dtype == "fp32":
        return x32
    bits = x32.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(x32), x32, out)


def causal_mask(n_q: int, n_k: int, query_offset: int = 0) -> np.ndarray:
    """(n_q, n_k) booleans, True = may attend: query i sits at absolute position p_i = offset + i and
    sees key j iff j <= p_i.

    ``query_offset=0`` is the top-left alignment of torch's ``is_causal=True``. For a chunk of new
    queries at the end of a longer cache use ``query_offset = n_k - n_q`` (bottom-right alignment,
    flash-attn's convention when n_q != n_k). A negative offset (down to -n_q) leaves the first
    rows with no key at all: fully masked rows.
    """
    n_q, n_k = integer("n_q", n_q, 0), integer("n_k", n_k, 0)
    offset = integer("query_offset", query_offset, -n_q)
    return np.arange(n_k)[None, :] <= (offset + np.arange(n_q))[:, None]


def sliding_window_mask(n_q: int, n_k: int, window: int, query_offset: int = 0) -> np.ndarray:
    """(n_q, n_k) booleans: causal with a window: query at p_i = offset + i sees keys p_i - window < j <= p_i.

    A row then has at most ``window`` keys, and its first key tiles are often empty while later
    ones are not: the shape of mask that exposes the tiled recurrence's -inf - (-inf) NaN.
    """
    window = integer("window", window, 1, unit="tokens")
    n_q, n_k = integer("n_q", n_q, 0), integer("n_k", n_k, 0)
    offset = integer("query_offset", query_offset, 0)
    pos = (offset + np.arange(n_q))[:, None]
    j = np.arange(n_k)[None, :]
    return (j <= pos) & (j > pos - window)


def padding_mask(kv_lengths: object, n_k: int, left: bool = False) -> np.ndarray:
    """(B, 1, 1, n_k) booleans from each sequence's real length: right padding keeps keys j < len;
    ``left=True`` (left padding, as batched generation often pads) keeps keys j >= n_k - len."""
    n_k = integer("n_k", n_k, 0)
    lengths = integer_array("kv_lengths", kv_lengths).reshape(-1)
    if lengths.size and lengths.max() > n_k:
        raise ValueError(f"kv_lengths must be <= n_k = {n_k}, got {lengths.max()}")
    j = np.arange(n_k)[None, :]
    keep = j >= (n_k - lengths)[:, None] if left else j < lengths[:, None]
    return keep[:, None, None, :]


def kv_head_of(query_head: int, n_q_heads: int, n_kv_heads: int) -> int:
    """The KV head that query head ``query_head`` reads under GQA: h // (n_q_heads / n_kv_heads).

    Contiguous groups (query heads 0..g-1 share KV head 0), as torch ``enable_gqa`` and the
    HF/vLLM ``repeat_kv`` do; ``h % n_kv_heads`` (interleaved) is the classic wrong answer.
    """
    n_kv_heads = integer("n_kv_heads", n_kv_heads, 1)
    n_q_heads = integer("n_q_heads", n_q_heads, 1)
    if n_q_heads % n_kv_heads:
        raise ValueError(f"n_q_heads ({n_q_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    query_head = integer("query_head", query_head, 0, n_q_heads - 1)
    return query_head // (n_q_heads // n_kv_heads)


def softmax_rows(s: np.ndarray, *, guard_masked_rows: bool = True, subtract_max: bool = True
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Row softmax of scores ``s`` (-inf = masked) in s's dtype; returns (P, LSE).

    P = exp(s - m) / l with m = rowmax(s) (0 instead when ``subtract_max`` is False), l = rowsum;
    LSE = m + log(l). A row of only -inf: guarded, P = 0 and LSE = -inf; unguarded, NaN.
    """
    s = np.asarray(s)
    if not np.issubdtype(s.dtype, np.floating):
        raise ValueError(f"s must be a floating-point array, got dtype {s.dtype}")
    dt = s.dtype.type
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if subtract_max:
            m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf, s.dtype)
        else:
            m = np.zeros(s.shape[:-1] + (1,), s.dtype)
        m_use = np.where(np.isneginf(m), dt(0), m) if guard_masked_rows else m
        p = np.exp(s - m_use)
        l_sum = p.sum(axis=-1, keepdims=True, dtype=s.dtype)
        if guard_masked_rows:
            p = np.where(l_sum > 0, p / np.where(l_sum > 0, l_sum, dt(1)), dt(0))
        else:
            p = p / l_sum
        lse = (m_use + np.log(l_sum))[..., 0]
    return p.astype(s.dtype, copy=False), lse.astype(s.dtype, copy=False)


def attention_probabilities(q: object, k: object, mask: object = None, *, causal: bool = False,
                            query_offset: int = 0, scale: float | None = None,
                            acc_dtype: object = np.float32, guard_masked_rows: bool = True,
                            subtract_max: bool = True) -> np.ndarray:
    """P = softmax(Q K^T * scale + mask), shape (B, Hq, Nq, Nk), in ``acc_dtype``: the N x N matrix
    naive attention stores (and keeps for backward). Arguments as in :func:`naive_attention`."""
    q, k, _, group = check_qkv(q, k, None)
    acc = acc_dtype_of(acc_dtype)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    allowed, additive = build_mask(mask, causal, query_offset, shape)
    s = masked_scores(q, expand_kv(k, group), scale_of(scale, q.shape[3]), acc, allowed, additive)
    return softmax_rows(s, guard_masked_rows=guard_masked_rows, subtract_max=subtract_max)[0]


def naive_attention(q: object, k: object, v: object, mask: object = None, *, causal: bool = False,
                    query_offset: int = 0, scale: float | None = None, acc_dtype: object = np.float32,
                    guard_masked_rows: bool = True, subtract_max: bool = True,
                    return_lse: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """O = softmax(Q K^T * scale + mask) V, materializing the (B, Hq, Nq, Nk) score matrix.

    q (B, Hq, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv), Hq a multiple of Hkv (GQA: query
    head h reads KV head h // (Hq / Hkv)). ``mask`` broadcasts to (B, Hq, Nq, Nk): boolean (True =
    may attend) or float (added to the scaled scores; -inf = masked). ``causal`` additionally
    allows key j for query i iff j <= query_offset + i (``query_offset=0`` is torch's
    ``is_causal``; use ``query_offset = Nk - Nq`` for new queries at the end of a cache).
    ``scale`` defaults to 1/sqrt(d). Everything is computed in ``acc_dtype`` (float32 default).
    Returns O (B, Hq, Nq, dv) in ``acc_dtype``, and with ``return_lse`` also the per-row
    log-sum-exp LSE = m + log(sum_j exp(s_j - m)) (B, Hq, Nq), -inf for a fully masked row.
    A fully masked row returns zeros (``guard_masked_rows=False``: NaN); see the module docstring.
    """
    q, k, v, group = check_qkv(q, k, v)
    acc = acc_dtype_of(acc_dtype)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    allowed, additive = build_mask(mask, causal, query_offset, shape)
    s = masked_scores(q, expand_kv(k, group), scale_of(scale, q.shape[3]), acc, allowed, additive)
    p, lse = softmax_rows(s, guard_masked_rows=guard_masked_rows, subtract_max=subtract_max)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.matmul(p, expand_kv(v, group).astype(acc, copy=False)).astype(acc, copy=False)
    return (out, lse) if return_lse else out
