"""One model name, two GPU pools, two FP8 formats: the numerics a user gets depends on the pool.

A Hopper pool runs block-scaled FP8 with FP32 scales (DeepSeek-V3's recipe: 1 x 128 activation tiles per
token, 128 x 128 weight blocks); a Blackwell pool's native block-scaled GEMM is MXFP8 (OCP Microscaling
v1.0: 32-element blocks along the reduction axis, E8M0 power-of-two scales), or the same 128-blocks with their
scales rounded to powers of two. :data:`FORMATS` names each recipe, :func:`format_logits` runs a linear layer
through one (activations and weights round-tripped by :func:`lib.numerics.fp8.block_fake_quantize`, products in
float64), :func:`synthetic_layer` makes a seeded layer with outlier activation channels and near-tied logits
(:func:`lib.numerics.reduction.near_tie_problem`), and :func:`compare_formats` gives each format's error against
the exact logits and each pair's disagreement (relative distance and greedy flips). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

from .formats import bf16_round
from .fp8 import amax_scale, block_fake_quantize, fake_quantize
from .reduction import near_tie_problem

__all__ = ["FORMATS", "FormatComparison", "PoolFormat", "compare_formats", "format_logits", "synthetic_layer"]


@dataclass(frozen=True)
class PoolFormat:
    """How a pool's kernels quantize one linear layer. ``act_block`` tiles the activations (rows, d_in),
    ``weight_block`` the weights (d_out, d_in); ``scale_format`` "fp32" or "e8m0" (:func:`lib.numerics.fp8.block_scale`).
    ``kind`` "block": block scales; "per-tensor": one dynamic activation scale and one weight scale; "bf16": no FP8."""

    name: str
    kind: str
    act_block: tuple[int, int] = (1, 1)
    weight_block: tuple[int, int] = (1, 1)
    scale_format: str = "fp32"


FORMATS = {
    "block-fp32": PoolFormat("block-fp32", "block", (1, 128), (128, 128), "fp32"),
    "block-e8m0": PoolFormat("block-e8m0", "block", (1, 128), (128, 128), "e8m0"),
    "mxfp8": PoolFormat("mxfp8", "block", (1, 32), (1, 32), "e8m0"),
    "per-tensor": PoolFormat("per-tensor", "per-tensor"),
    "bf16": PoolFormat("bf16", "bf16"),
}


def _format(fmt) -> PoolFormat:
    if isinstance(fmt, PoolFormat):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)} (or a PoolFormat), got {fmt!r}")
    return FORMATS[fmt]


def quantize_weights(w, fmt) -> np.ndarray:
    """The weights (d_out, d_in) as the pool stores them, dequantized to float64."""
    f = _format(fmt)
    w = np.asarray(w, dtype=np.float64)
    if f.kind == "block":
        return block_fake_quantize(w, f.weight_block, f.scale_format)
    if f.kind == "per-tensor":
        return fake_quantize(w, amax_scale(w))
    return bf16_round(w).astype(np.float64)


def format_logits(x, w, fmt, w_hat=None) -> np.ndarray:
    """y = q(x) q(w)^T in float64 for activations ``x`` (rows, d_in) and weights ``w`` (d_out, d_in) under ``fmt``
    (a :data:`FORMATS` key or a :class:`PoolFormat`); ``w_hat`` reuses already quantized weights (e.g. a converted
    checkpoint). Block formats need d_in (and d_out for 2-D weight blocks) to be multiples of the blocks."""
    f = _format(fmt)
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x (rows, d_in) and w (d_out, d_in) must agree on d_in, got {x.shape} and {w.shape}")
    if f.kind == "block":
        xq = block_fake_quantize(x, f.act_block, f.scale_format)
    elif f.kind == "per-tensor":
        xq = fake_quantize(x, amax_scale(x))
    else:
        xq = bf16_round(x).astype(np.float64)
    wq = quantize_weights(w, f) if w_hat is None else np.asarray(w_hat, dtype=np.float64)
    return xq @ wq.T


def synthetic_layer(rows: int = 256, d_in: int = 512, d_out: int = 1024, outlier_channels: int = 4,
                    outlier_scale: float = 30.0, tie_gap: float = 0.05, seed: int = 0):
    """Seeded activations x (rows, d_in) and weights w (d_out, d_in) of a projection whose outputs have
    near-tied pairs (:func:`lib.numerics.reduction.near_tie_problem`), with ``outlier_channels`` activation
    channels (chosen at random) multiplied by ``outlier_scale``: the outlier features LLM activations carry."""
    r, di, do = integer("rows", rows, 1), integer("d_in", d_in, 2), integer("d_out", d_out, 2)
    k = integer("outlier_channels", outlier_channels, 0, di, unit="(at most d_in)")
    big = real("outlier_scale", outlier_scale, 1.0, 1e4)
    x, _, w2 = near_tie_problem(r, di, do, tie_gap, seed=seed)
    x = x.astype(np.float64)
    ch = np.random.default_rng(integer("seed", seed, 0) + 1).choice(di, k, replace=False)
    x[:, ch] *= big
    return x, w2.T.astype(np.float64).copy()


@dataclass(frozen=True)
class FormatComparison:
    """Each format's logits against the exact x w^T and against each other.

    error[f]: ||y_f - y|| / ||y||; flips[f]: share of rows whose greedy token (argmax) differs from the exact
    one; between[(f, g)]: ||y_f - y_g|| / ||y||; flips_between[(f, g)]: share of rows whose greedy tokens
    differ between f and g."""

    error: dict
    flips: dict
    between: dict
    flips_between: dict
    rows: int


def compare_formats(x, w, formats, extra: dict | None = None) -> FormatComparison:
    """:class:`FormatComparison` of ``formats`` (keys of :data:`FORMATS`) on the layer (x, w); ``extra`` maps a
    label to already computed logits (a converted checkpoint, a fallback) to compare alongside."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    exact = x @ w.T
    ys = {f: format_logits(x, w, f) for f in formats}
    ys.update(extra or {})
    if not ys:
        raise ValueError("formats must name at least one format")
    def fro(a):  # Frobenius norm as a plain sum: no multi-threaded BLAS call per pair (fast on a loaded machine)
        return float(np.sqrt(np.sum(a * a)))

    norm = fro(exact)
    top = exact.argmax(axis=1)
    tops = {k: y.argmax(axis=1) for k, y in ys.items()}
    keys = list(ys)
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]]
    return FormatComparison(
        {k: fro(y - exact) / norm for k, y in ys.items()},
        {k: float(np.mean(t != top)) for k, t in tops.items()},
        {(a, b): fro(ys[a] - ys[b]) / norm for a, b in pairs},
        {(a, b): float(np.mean(tops[a] != tops[b])) for a, b in pairs},
        int(x.shape[0]),
    )
