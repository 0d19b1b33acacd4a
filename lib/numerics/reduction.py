"""Reduction order as a source of different bits: the same dot products summed in two orders
(a kernel that walks K in one accumulator against a split-K kernel chosen for another batch shape),
the greedy tokens that flip when the logits differ in the last bits, and seeded near-tie inputs
that make the flips visible. numpy only, float32 accumulation one rounding per term."""

from __future__ import annotations

import math

import numpy as np

from lib.inputs import integer, real

from .formats import bf16_round

__all__ = ["argmax_flips", "near_tie_problem", "sum_two_orders"]


def sum_two_orders(h: np.ndarray, w: np.ndarray, split: int) -> tuple[np.ndarray, np.ndarray]:
    """h @ w in float32 twice: one accumulator over the inner index in order (a kernel that walks K),
    and ``split`` contiguous partial sums added at the end (a split-K kernel for another shape)."""
    seq = np.zeros((h.shape[0], w.shape[1]), np.float32)
    parts = np.zeros((split, *seq.shape), np.float32)
    owner = np.repeat(np.arange(split), [len(c) for c in np.array_split(np.arange(h.shape[1]), split)])
    for i in range(h.shape[1]):  # float32 += float32: one rounding per term, in this order
        term = h[:, i : i + 1] * w[i]
        seq += term
        parts[owner[i]] += term
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return seq, total


def argmax_flips(hidden, weight, split: int, output_bf16: bool = True, upstream=None) -> dict:
    """Greedy tokens from the same logits computed in two reduction orders (:func:`sum_two_orders`):
    the plain decode step's kernel and the verification pass's (another batch shape, another split).

    logits = hidden @ weight, float32 accumulation, rounded to bfloat16 when ``output_bf16`` (a BF16
    lm_head writes BF16 logits). With ``upstream`` (a (d_in, d) matrix) the hidden state is itself
    computed as bf16(hidden @ upstream) in the same two orders first, so a rounding difference
    upstream reaches the logits amplified (one BF16 ulp is 2^-8 of the value). Returns the rows whose
    argmax differs ('flips'), the share of rows whose logits differ at all, the top-two gap of each
    row (first order) and the number of rows whose top two are exactly tied (first order).
    """
    h = np.asarray(hidden, dtype=np.float32)
    w = np.asarray(weight, dtype=np.float32)
    if upstream is not None:
        u = np.asarray(upstream, dtype=np.float32)
        if u.ndim != 2 or h.ndim != 2 or h.shape[1] != u.shape[0]:
            raise ValueError(f"hidden (rows, d_in) and upstream (d_in, d) must agree on d_in, got {h.shape}, {u.shape}")
        s = integer("split", split, 2, h.shape[1])
        a, b = (bf16_round(x) for x in sum_two_orders(h, u, s))
    else:
        a = b = h
    if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[0]:
        raise ValueError(f"hidden (rows, d) and weight (d, vocab) must agree on d, got {a.shape} and {w.shape}")
    s = integer("split", split, 2, a.shape[1])
    first, _ = sum_two_orders(a, w, s)
    _, second = sum_two_orders(b, w, s)
    if output_bf16:
        first, second = bf16_round(first), bf16_round(second)
    top2 = np.sort(first, axis=1)[:, -2:]
    return {
        "flips": np.flatnonzero(first.argmax(1) != second.argmax(1)),
        "differ_share": float(np.mean((first != second).any(axis=1))),
        "gap": (top2[:, 1] - top2[:, 0]).astype(np.float64),
        "ties": int(np.sum(top2[:, 1] == top2[:, 0])),
    }


def near_tie_problem(rows: int, d: int, vocab: int, tie_gap: float, logit_std: float = 4.0, seed: int = 0):
    """Seeded inputs whose logits have near-ties: x (rows, d) ~ N(0, 1), an upstream layer
    w1 (d, d) ~ N(0, 1/d) (so h = x @ w1 has unit variance), and an lm_head w2 (d, vocab) whose
    logits have std ``logit_std``, with the columns in pairs: column 2j+1 = column 2j + tie_gap * n_j,
    n_j ~ N(0, 1/d), so each token has a twin whose logit differs by N(0, tie_gap^2): the top token's
    twin is usually the runner-up (a near-synonym). float32 arrays (x, w1, w2)."""
    r = integer("rows", rows, 1)
    dd = integer("d", d, 2)
    v = integer("vocab", vocab, 2)
    real("tie_gap", tie_gap, 0)
    real("logit_std", logit_std, 0, low_open=True)
    rng = np.random.default_rng(integer("seed", seed, 0))
    x = rng.standard_normal((r, dd))
    w1 = rng.standard_normal((dd, dd)) / math.sqrt(dd)
    w2 = rng.standard_normal((dd, v)) * logit_std / math.sqrt(dd)
    twins = w2[:, 0 : v - 1 : 2] + tie_gap * rng.standard_normal((dd, v // 2)) / math.sqrt(dd)
    w2[:, 1::2] = twins[:, : w2[:, 1::2].shape[1]]
    return x.astype(np.float32), w1.astype(np.float32), w2.astype(np.float32)
