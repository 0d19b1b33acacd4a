"""Who owns an activation scale: per-tensor dynamic FP8 scales as a cross-user leak, against reduction-order drift.

A dynamically quantized server computes the activation scale of each FP8 GEMM from the values it is
about to quantize. With one **per-tensor** scale over the whole batch, s = amax(X) / 448, every user's
row is rounded on a grid set by the largest activation in the batch, so a user whose row carries an
outlier changes every other user's quantized activations and logits. A **per-row** (per-token) scale,
s_i = amax(X_i) / 448, or a **static** calibrated scale makes each row's rounding depend on that row
only. Reduction order (:func:`lib.numerics.reduction.sum_two_orders`) is the other, much smaller,
cross-request effect: the same products summed in another order when the batch shape picks another
kernel.

:func:`activation_scale` picks the scale of a mode, :func:`quantized_logits` computes the logits of a
batch through E4M3 (:func:`lib.numerics.fp8.fake_quantize`) with float64 products (so any difference
between two calls comes from quantization, not from the order), :func:`with_outlier` plants an outlier
in one user's row, and :func:`logit_change` measures what another set of logits did to the users that
did not change: relative change, the largest change in BF16 ulps, the share of users whose BF16
logits moved and the greedy tokens that flipped. :func:`batch_scale_leak` and :func:`reduction_drift`
put them together. numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

from .formats import bf16_round, bf16_ulp
from .fp8 import amax_scale, fake_quantize
from .reduction import sum_two_orders

__all__ = ["SCALE_MODES", "CrossUserEffect", "activation_scale", "batch_scale_leak", "leak_curve",
           "logit_change", "quantized_logits", "reduction_drift", "relative_logit_error", "scale_owner_share", "with_outlier"]

SCALE_MODES = ("per-tensor", "per-row", "static")


def activation_scale(x, mode: str, static_scale: float | None = None) -> np.ndarray:
    """The E4M3 scale of activations ``x`` (rows = users, columns = channels) under ``mode``:
    "per-tensor": amax over the whole batch / 448 (one scale, :func:`lib.numerics.fp8.amax_scale`);
    "per-row": amax of each row / 448 (shape (rows, 1)); "static": ``static_scale``, calibrated offline."""
    if mode not in SCALE_MODES:
        raise ValueError(f"mode must be one of {SCALE_MODES}, got {mode!r}")
    if mode == "per-tensor":
        return amax_scale(x)
    if mode == "per-row":
        return amax_scale(x, axis=-1)
    if static_scale is None:
        raise ValueError("mode 'static' needs static_scale (a calibrated scale > 0)")
    return np.asarray(real("static_scale", static_scale, 0, low_open=True), dtype=np.float64)


def quantized_logits(x, w_q, mode: str, static_scale: float | None = None) -> np.ndarray:
    """logits = fake_quantize(x, s) @ w_q with s from :func:`activation_scale`, products and sums in float64 and
    the result rounded once to float32 (rows, vocab). ``w_q`` is the already quantized weight (d, vocab)."""
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w_q, dtype=np.float64)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x (rows, d) and w_q (d, vocab) must agree on d, got {x.shape} and {w.shape}")
    xq = fake_quantize(x, activation_scale(x, mode, static_scale).astype(np.float32))
    return (xq.astype(np.float64) @ w).astype(np.float32)


def with_outlier(x, row: int, factor: float, channels: int = 1) -> np.ndarray:
    """A copy of ``x`` whose row ``row`` has its first ``channels`` channels set to ``factor`` x the batch's
    amax (an activation outlier of that user's prompt): the per-tensor scale grows by ``factor`` when > 1."""
    x = np.array(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"x must be (rows, d), got shape {x.shape}")
    r = integer("row", row, 0, x.shape[0] - 1, unit="(a row of x)")
    c = integer("channels", channels, 1, x.shape[1], unit="(at most d)")
    f = real("factor", factor, 0, low_open=True)
    x[r, :c] = np.float32(f * float(np.max(np.abs(x))))
    return x


@dataclass(frozen=True)
class CrossUserEffect:
    """What a change elsewhere did to the logits of ``users`` users whose own inputs did not change.

    rel_change: ||y' - y|| / ||y|| over their float32 logits; max_ulps: the largest change of their BF16
    logits in BF16 ulps at each user's top logit (the grid that decides the greedy token); changed_share: the share of those users with at least one BF16
    logit that differs; flips: users whose greedy token (argmax of the BF16 logits, first index on a tie)
    changed."""

    rel_change: float
    max_ulps: float
    changed_share: float
    flips: int
    users: int

    @property
    def flip_share(self) -> float:
        return self.flips / self.users


def logit_change(before, after) -> CrossUserEffect:
    """Compare two (users, vocab) float32 logit arrays of the same users (see :class:`CrossUserEffect`)."""
    y0, y1 = (np.asarray(a, dtype=np.float32) for a in (before, after))
    if y0.shape != y1.shape or y0.ndim != 2 or y0.shape[0] == 0:
        raise ValueError(f"before and after must be (users, vocab) arrays of one shape, got {y0.shape}, {y1.shape}")
    norm = float(np.linalg.norm(y0.astype(np.float64)))
    if norm == 0:
        raise ValueError("before is all zeros: a relative change is undefined")
    b0, b1 = bf16_round(y0), bf16_round(y1)
    ulps = np.abs(b1.astype(np.float64) - b0) / bf16_ulp(np.abs(b0).max(axis=1, keepdims=True))
    return CrossUserEffect(float(np.linalg.norm((y1 - y0).astype(np.float64)) / norm), float(ulps.max()),
                           float(np.mean((b0 != b1).any(axis=1))), int(np.sum(b0.argmax(1) != b1.argmax(1))),
                           int(y0.shape[0]))


def batch_scale_leak(x, w_q, row: int, factor: float, mode: str, static_scale: float | None = None,
                     channels: int = 1) -> tuple[CrossUserEffect, np.ndarray, np.ndarray]:
    """The other users' logits before and after user ``row`` sends an outlier of ``factor`` x the batch amax
    (:func:`with_outlier`), quantized under ``mode``. Returns (effect on the others, logits before, logits
    after): the logit arrays hold every row, the outlier user's included."""
    before = quantized_logits(x, w_q, mode, static_scale)
    after = quantized_logits(with_outlier(x, row, factor, channels), w_q, mode, static_scale)
    others = np.arange(before.shape[0]) != row
    return logit_change(before[others], after[others]), before, after


def leak_curve(x, w_q, row: int, factors, mode: str = "per-tensor") -> np.ndarray:
    """||y'_f - y|| / ||y|| over the other users for each outlier size f in ``factors``: the ``rel_change`` of
    :func:`batch_scale_leak` along a sweep, with every variant's quantized batch in one float64 GEMM and the norms
    as plain sums (one BLAS call instead of one per point: fast on a loaded machine). Same products as
    :func:`quantized_logits`; the summation inside the GEMM may differ in float64's last bits."""
    f = np.asarray(factors, dtype=np.float64).ravel()
    if f.size == 0:
        raise ValueError("factors must hold at least one outlier size")
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w_q, dtype=np.float64)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x (rows, d) and w_q (d, vocab) must agree on d, got {x.shape} and {w.shape}")
    variants = [x] + [with_outlier(x, row, float(v)) for v in f]
    xq = np.concatenate([fake_quantize(v, activation_scale(v, mode).astype(np.float32)) for v in variants])
    y = (xq.astype(np.float64) @ w).astype(np.float32).reshape(len(variants), *x.shape[:1], w.shape[1])
    others = np.arange(x.shape[0]) != row
    y = y[:, others].astype(np.float64)
    d = y[1:] - y[0]
    return np.sqrt(np.sum(d * d, axis=(1, 2))) / np.sqrt(np.sum(y[0] * y[0]))


def reduction_drift(x, w_q, mode: str, split: int, static_scale: float | None = None,
                    rows=None) -> CrossUserEffect:
    """The same quantized batch's logits summed in two orders (:func:`lib.numerics.reduction.sum_two_orders`: one
    float32 accumulator over d against ``split`` partial sums), compared on ``rows`` (default all): the drift a
    batch-shape-dependent kernel choice causes with the scales held fixed."""
    x = np.asarray(x, dtype=np.float32)
    xq = fake_quantize(x, activation_scale(x, mode, static_scale).astype(np.float32))
    s = integer("split", split, 2, x.shape[1], unit="(partial sums along d)")
    seq, spl = sum_two_orders(xq, np.asarray(w_q, dtype=np.float32), s)
    sel = slice(None) if rows is None else rows
    return logit_change(seq[sel], spl[sel])


def relative_logit_error(x, w, w_q, mode: str, static_scale: float | None = None, rows=None) -> float:
    """||y_hat - y|| / ||y|| over ``rows`` (default all): the quantized logits (:func:`quantized_logits` with
    ``w_q``) against the unquantized x @ w in float64."""
    exact = np.asarray(x, dtype=np.float64) @ np.asarray(w, dtype=np.float64)
    approx = quantized_logits(x, w_q, mode, static_scale).astype(np.float64)
    sel = slice(None) if rows is None else rows
    return float(np.linalg.norm(approx[sel] - exact[sel]) / np.linalg.norm(exact[sel]))


def scale_owner_share(amax_rows, user: int = 0) -> float:
    """Share of batches (rows of ``amax_rows``: batches x users, each entry a user's row amax) whose per-tensor
    scale is set by a user other than ``user``: for exchangeable users, 1 - 1 / users."""
    a = np.asarray(amax_rows, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"amax_rows must be (batches, users), got shape {a.shape}")
    u = integer("user", user, 0, a.shape[1] - 1)
    return float(np.mean(a.argmax(axis=1) != u))
