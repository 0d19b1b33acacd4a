"""Shared validation and layout helpers for :mod:`lib.attention` (private)."""

from __future__ import annotations

import numpy as np

ACC_DTYPES = (np.float16, np.float32, np.float64)


def acc_dtype_of(acc_dtype: object) -> np.dtype:
    """The accumulation dtype as a numpy dtype: float16, float32 or float64 (names or types)."""
    try:
        dt = np.dtype(acc_dtype)
    except TypeError:
        dt = None
    if dt is None or dt.type not in ACC_DTYPES:
        raise ValueError(f"acc_dtype must be one of float16, float32, float64, got {acc_dtype!r}")
    return dt


def float_array(name: str, x: object, ndim: int | None = 4) -> np.ndarray:
    """``x`` as a floating-point numpy array with ``ndim`` dimensions (no NaN allowed)."""
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        layout = " (batch, heads, seq, head_dim)" if ndim == 4 else ""
        raise ValueError(f"{name} must have {ndim} dimensions{layout}, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not contain NaN")
    return arr


def check_qkv(q: object, k: object, v: object) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """Validate q (B, Hq, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv) (v may be None); return
    them and the GQA group size Hq / Hkv (query head h reads KV head h // group)."""
    q, k = float_array("q", q), float_array("k", k)
    v = None if v is None else float_array("v", v)
    if v is not None and k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree on (batch, kv_heads, seq), got {k.shape} and {v.shape}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[3]} and {k.shape[3]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"the query heads ({q.shape[1]}) must be a multiple of the kv heads ({k.shape[1]})")
    if q.shape[3] == 0:
        raise ValueError("head_dim must be at least 1")
    return q, k, v, q.shape[1] // k.shape[1]


def scale_of(scale: object, head_dim: int) -> float:
    """The score scale: 1 / sqrt(head_dim) when ``scale`` is None, else a finite positive number."""
    if scale is None:
        return 1.0 / float(np.sqrt(head_dim))
    from lib.inputs import real

    return real("scale", scale, 0, low_open=True)


def expand_kv(x: np.ndarray, group: int) -> np.ndarray:
    """Repeat each KV head ``group`` times along axis 1: query head h then reads KV head h // group."""
    return x if group == 1 else np.repeat(x, group, axis=1)


def mask_parts(mask: object, shape: tuple[int, int, int, int]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Split ``mask`` into (allowed, additive) broadcast to ``shape`` = (B, Hq, Nq, Nk).

    A boolean mask is ``allowed`` (True = may attend). A float mask is ``additive`` (added to the
    scaled scores; -inf entries disallow a key, so they also set ``allowed`` to False); NaN and
    +inf are refused.
    """
    if mask is None:
        return None, None
    m = np.asarray(mask)
    try:
        np.broadcast_shapes(m.shape, shape)
        if np.broadcast_shapes(m.shape, shape) != tuple(shape):
            raise ValueError
    except ValueError:
        raise ValueError(f"mask of shape {m.shape} must broadcast to (batch, q_heads, n_q, n_k) = {tuple(shape)}") from None
    if m.dtype == bool:
        return np.broadcast_to(m, shape), None
    if not np.issubdtype(m.dtype, np.floating):
        raise ValueError(f"mask must be boolean (True = attend) or floating (additive), got dtype {m.dtype}")
    if np.isnan(m).any() or np.isposinf(m).any():
        raise ValueError("an additive mask must not contain NaN or +inf")
    return np.broadcast_to(~np.isneginf(m), shape), np.broadcast_to(m, shape)


def causal_allowed(n_q: int, n_k: int, query_offset: int) -> np.ndarray:
    """(n_q, n_k) booleans: query i (absolute position query_offset + i) may see key j <= query_offset + i."""
    return np.arange(n_k)[None, :] <= (query_offset + np.arange(n_q))[:, None]


def build_mask(mask: object, causal: bool, query_offset: object,
               shape: tuple[int, int, int, int]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(allowed, additive) for ``shape`` = (B, Hq, Nq, Nk): the user's mask and the causal rule together.

    ``allowed`` is None when every key is allowed; ``additive`` is None without a float mask.
    """
    from lib.inputs import integer

    if not isinstance(causal, bool | np.bool_):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    query_offset = integer("query_offset", query_offset, 0)
    if query_offset and not causal:
        raise ValueError("query_offset only applies with causal=True (it places query i at position query_offset + i)")
    allowed, additive = mask_parts(mask, shape)
    if causal:
        c = causal_allowed(shape[2], shape[3], query_offset)
        allowed = c if allowed is None else allowed & c
        allowed = np.broadcast_to(allowed, shape)
    return allowed, additive


def masked_scores(q: np.ndarray, k: np.ndarray, scale: float, acc: np.dtype,
                  allowed: np.ndarray | None, additive: np.ndarray | None) -> np.ndarray:
    """S = q k^T * scale (+ additive), with -inf where a key is not allowed; all in ``acc``.

    q (..., Nq, d) and k (..., Nk, d) already share their head axis (GQA expanded).
    """
    s = np.matmul(q.astype(acc, copy=False), np.swapaxes(k.astype(acc, copy=False), -1, -2)) * acc.type(scale)
    if additive is not None:
        s = s + additive.astype(acc)
    if allowed is not None:
        s = np.where(allowed, s, acc.type(-np.inf))
    return s.astype(acc, copy=False)
