"""Attention backward: with the stored N x N probabilities, and tiled with recomputation from the LSE.

Forward: S = Q K^T * scale, P = softmax_row(S), O = P V. Given dO = dL/dO, the gradient is

    dV = P^T dO
    dP = dO V^T
    dS = P o (dP - D),   D_i = sum_j P_ij dP_ij            (softmax backward, row by row)
    dQ = scale * dS K,   dK = scale * dS^T Q

Two facts make the backward tiled and exact without storing P (FlashAttention, arXiv:2205.14135,
section 3.1 and appendix B; FlashAttention-2 Algorithm 2):

* One scalar per row recomputes P exactly: the log-sum-exp L_i = m_i + log l_i saved by the
  forward gives P_ij = exp(S_ij - L_i) from a recomputed tile S_ij; no max or sum is needed.
* D_i = sum_j P_ij dP_ij = sum_j P_ij (dO_i . v_j) = dO_i . (sum_j P_ij v_j) = dO_i . O_i, so
  D = rowsum(dO o O) costs O(N d) from the forward output instead of a pass over an N x N row.

Fully masked rows (L = -inf) have P = 0 and zero gradients, matching the zero-output convention
(and torch's SDPA on the CPU build). Under GQA, dK and dV of a KV head sum over its query heads.

Memory: autograd's naive attention keeps P (B x H x N x N elements per layer) for the backward;
the tiled backward keeps L (B x H x N FP32 values) instead. The price is recomputing S: 5 matmuls
of the N x N x d shape in the backward instead of 4 (:func:`backward_flops`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import integer
from lib.registry.dtypes import bytes_per_element

from ._common import (
    acc_dtype_of,
    build_mask,
    check_qkv,
    expand_kv,
    float_array,
    masked_scores,
    scale_of,
)
from .naive import softmax_rows
from .tiled import SKIP, block_ranges, tile_map
from .traffic import visible_pairs

__all__ = [
    "AttentionGrads",
    "backward_flops",
    "backward_memory_saved_bytes",
    "naive_attention_backward",
    "probabilities_bytes",
    "tiled_attention_backward",
]


@dataclass(frozen=True)
class AttentionGrads:
    """dQ (B, Hq, Nq, d), dK (B, Hkv, Nk, d), dV (B, Hkv, Nk, dv) and D (B, Hq, Nq), in the accumulation dtype."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    delta: np.ndarray


def _reduce_groups(x: np.ndarray, group: int) -> np.ndarray:
    """Sum the ``group`` query heads that share each KV head: (B, Hkv*g, N, d) -> (B, Hkv, N, d)."""
    if group == 1:
        return x
    b, h, n, d = x.shape
    return x.reshape(b, h // group, group, n, d).sum(axis=2, dtype=x.dtype)


def _check_d_out(d_out: object, shape: tuple[int, ...]) -> np.ndarray:
    g = float_array("d_out", d_out)
    if g.shape != shape:
        raise ValueError(f"d_out must have the output's shape {shape}, got {g.shape}")
    return g


def naive_attention_backward(q: object, k: object, v: object, d_out: object, mask: object = None, *,
                             causal: bool = False, query_offset: int = 0, scale: float | None = None,
                             acc_dtype: object = np.float32) -> AttentionGrads:
    """Gradients of O = softmax(Q K^T * scale + mask) V from the full P (the N x N matrix autograd keeps).

    dV = P^T dO, dP = dO V^T, D = rowsum(P o dP), dS = P o (dP - D), dQ = scale dS K,
    dK = scale dS^T Q (summed over each KV head's query heads). Arguments as in
    :func:`lib.attention.naive.naive_attention`; ``d_out`` has the output's shape.
    """
    q, k, v, group = check_qkv(q, k, v)
    acc = acc_dtype_of(acc_dtype)
    b, hq, nq, d = q.shape
    nk, dv = k.shape[2], v.shape[3]
    g = _check_d_out(d_out, (b, hq, nq, dv)).astype(acc)
    allowed, additive = build_mask(mask, causal, query_offset, (b, hq, nq, nk))
    sc = scale_of(scale, d)
    ke, ve, qa = expand_kv(k, group).astype(acc), expand_kv(v, group).astype(acc), q.astype(acc)
    p, _ = softmax_rows(masked_scores(qa, ke, sc, acc, allowed, additive))
    dv_full = np.matmul(np.swapaxes(p, -1, -2), g)
    dp = np.matmul(g, np.swapaxes(ve, -1, -2))
    delta = (p * dp).sum(axis=-1, dtype=acc)  # the N x N pass that D = rowsum(dO o O) avoids
    ds = p * (dp - delta[..., None])
    dq = acc.type(sc) * np.matmul(ds, ke)
    dk_full = acc.type(sc) * np.matmul(np.swapaxes(ds, -1, -2), qa)
    return AttentionGrads(dq.astype(acc), _reduce_groups(dk_full.astype(acc), group),
                          _reduce_groups(dv_full.astype(acc), group), delta.astype(acc))


def tiled_attention_backward(q: object, k: object, v: object, out: object, lse: object, d_out: object,
                             mask: object = None, *, causal: bool = False, query_offset: int = 0,
                             scale: float | None = None, block_q: int = 16, block_k: int = 16,
                             acc_dtype: object = np.float32, skip_masked_tiles: bool = True) -> AttentionGrads:
    """Tiled backward (FlashAttention-2 Algorithm 2): key blocks outside, query blocks inside, P recomputed.

    D = rowsum(dO o O) once; then for each tile (i, j): S_ij = Q_i K_j^T * scale (+ mask),
    P_ij = exp(S_ij - L_i) (0 where masked or L_i = -inf), dV_j += P_ij^T dO_i,
    dP_ij = dO_i V_j^T, dS_ij = P_ij o (dP_ij - D_i), dQ_i += scale dS_ij K_j,
    dK_j += scale dS_ij^T Q_i. ``out`` and ``lse`` are the forward's O and L (from
    :func:`lib.attention.tiled.tiled_attention`); other arguments as in the forward. Tiles the
    mask skips entirely are skipped here too (their P is 0).
    """
    q, k, v, group = check_qkv(q, k, v)
    acc = acc_dtype_of(acc_dtype)
    block_q, block_k = integer("block_q", block_q, 1), integer("block_k", block_k, 1)
    b, hq, nq, d = q.shape
    nk, dv = k.shape[2], v.shape[3]
    o = _check_d_out(out, (b, hq, nq, dv)).astype(acc)  # same shape rule as d_out
    g = _check_d_out(d_out, (b, hq, nq, dv)).astype(acc)
    big_l = np.asarray(lse)
    if big_l.shape != (b, hq, nq) or not np.issubdtype(big_l.dtype, np.floating):
        raise ValueError(f"lse must be a float array of shape {(b, hq, nq)}, got {big_l.dtype} {big_l.shape}")
    if np.isnan(big_l).any() or np.isposinf(big_l).any():
        raise ValueError("lse must not contain NaN or +inf (a fully masked row has lse = -inf)")
    big_l = big_l.astype(acc)
    allowed, additive = build_mask(mask, causal, query_offset, (b, hq, nq, nk))
    sc = acc.type(scale_of(scale, d))
    ke, ve, qa = expand_kv(k, group).astype(acc), expand_kv(v, group).astype(acc), q.astype(acc)
    rows, cols = block_ranges(nq, block_q), block_ranges(nk, block_k)
    tiles = tile_map(allowed, block_q, block_k) if (allowed is not None and skip_masked_tiles) else None
    delta = (g * o).sum(axis=-1, dtype=acc)  # D = rowsum(dO o O): O(N d), no N x N pass
    l_use = np.where(np.isneginf(big_l), acc.type(np.inf), big_l)  # exp(S - inf) = 0 for empty rows
    dq = np.zeros_like(qa)
    dk, dvv = np.zeros_like(ke), np.zeros_like(ve)
    with np.errstate(invalid="ignore", over="ignore"):
        for j, (c0, c1) in enumerate(cols):
            kj, vj = ke[:, :, c0:c1], ve[:, :, c0:c1]
            for i, (r0, r1) in enumerate(rows):
                if tiles is not None and tiles[i, j] == SKIP:
                    continue
                t_allowed = None if allowed is None else allowed[:, :, r0:r1, c0:c1]
                t_add = None if additive is None else additive[:, :, r0:r1, c0:c1]
                s = masked_scores(qa[:, :, r0:r1], kj, float(sc), acc, t_allowed, t_add)
                p = np.exp(s - l_use[:, :, r0:r1, None]).astype(acc)
                gi = g[:, :, r0:r1]
                dvv[:, :, c0:c1] += np.matmul(np.swapaxes(p, -1, -2), gi)
                dp = np.matmul(gi, np.swapaxes(vj, -1, -2))
                ds = (p * (dp - delta[:, :, r0:r1, None])).astype(acc)
                dq[:, :, r0:r1] += sc * np.matmul(ds, kj)
                dk[:, :, c0:c1] += sc * np.matmul(np.swapaxes(ds, -1, -2), qa[:, :, r0:r1])
    return AttentionGrads(dq, _reduce_groups(dk, group), _reduce_groups(dvv, group), delta)


def probabilities_bytes(batch: int, heads: int, seq_q: int, seq_k: int | None = None,
                        dtype: str = "bf16") -> float:
    """Bytes of the attention probabilities P one layer keeps for backward: B x H x Nq x Nk x b."""
    batch, heads = integer("batch", batch, 1), integer("heads", heads, 1)
    seq_q = integer("seq_q", seq_q, 1, unit="tokens")
    seq_k = seq_q if seq_k is None else integer("seq_k", seq_k, 1, unit="tokens")
    return float(batch) * heads * seq_q * seq_k * bytes_per_element(dtype)


def backward_memory_saved_bytes(batch: int, heads: int, seq: int, dtype: str = "bf16",
                                lse_dtype: str = "fp32", stored_matrices: int = 1) -> float:
    """Activation bytes per layer saved by recomputation: B H (k N^2 b - N b_lse).

    k = ``stored_matrices`` N x N matrices naive attention keeps per head (1: P; 2: also S, or a
    dropout mask); the tiled backward keeps one LSE per row (FP32) instead. Both keep Q, K, V, O.
    Example: batch 1, 64 heads, N = 8192, BF16: 64 x 8192^2 x 2 B = 8.6 GB per layer saved.
    """
    stored = integer("stored_matrices", stored_matrices, 1)
    keep = stored * probabilities_bytes(batch, heads, seq, seq, dtype)
    return keep - float(batch) * heads * seq * bytes_per_element(lse_dtype)


def backward_flops(n_q: int, head_dim: int, n_k: int | None = None, causal: bool = False,
                   recompute: bool = True) -> float:
    """Matmul FLOPs of one head's attention backward: 2 x pairs x (3 d + 2 dv) with recomputation
    (S again, dQ, dK from d; dV, dP from dv), 2 x pairs x (2 d + 2 dv) with P stored (dv = d here).
    The forward is 2 x pairs x (d + dv), so with recomputation backward = 2.5 x forward."""
    d = integer("head_dim", head_dim, 1)
    pairs = visible_pairs(n_q, n_k, causal)
    return 2.0 * pairs * ((3 * d if recompute else 2 * d) + 2 * d)
