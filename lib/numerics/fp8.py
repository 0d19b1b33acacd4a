"""FP8 E4M3 emulated in numpy, scaled quantization, and where the quantization error comes from.

The format is OCP FP8 E4M3 ("e4m3fn", torch.float8_e4m3fn): 1 sign bit, 4 exponent bits with
bias 7, 3 mantissa bits, subnormals, no infinities, one NaN pattern per sign (S.1111.111).

    normal    (e = 1..15, not S.1111.111):  (-1)^s * 2^(e - 7) * (1 + m / 8)
    subnormal (e = 0):                      (-1)^s * 2^-6 * (m / 8) = (-1)^s * m * 2^-9

Largest finite value 448 = 2^8 * 1.75, smallest normal 2^-6, smallest subnormal 2^-9.
Rounding is round-to-nearest, ties-to-even, on the exact binary value; values that round past
448 either saturate to +-448 (``overflow="saturate"``, what ``torch.Tensor.to(float8_e4m3fn)``
does on CPU in torch 2.x) or become NaN (``overflow="nan"``, the non-saturating mode of the OCP
spec and of some kernels). Sources: Micikevicius et al., "FP8 Formats for Deep Learning",
arXiv:2209.05433, Table 1; OCP 8-bit Floating Point Specification (OFP8) rev. 1.0.

A scaled FP8 tensor stores codes of ``x / s`` and dequantizes as ``decode(code) * s``. The error
splits into two parts: elements with ``|x| <= 448 s`` only suffer **rounding** (relative size at
most 2^-4 in the normal range, whatever ``s`` is); elements beyond are **clipped** to ``448 s``.
Everything here is float64 numpy on the host; torch is never imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

E4M3_EXPONENT_BITS = 4
E4M3_MANTISSA_BITS = 3
E4M3_BIAS = 7
E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0**-6
E4M3_MIN_SUBNORMAL = 2.0**-9
E4M3_NAN_CODE = 0x7F
E4M3_MAX_RELATIVE_ROUNDING = 2.0**-4  # half an ulp over the value, normal range, worst case
OVERFLOW_MODES = ("saturate", "nan")
INT8_MAX = 127
# |x| > limit * s * (1 + tol) counts as clipped: 448 * (amax / 448) can miss amax by an ulp
CLIP_TOLERANCE = 1e-6
_CHUNK = 1 << 16  # elements per chunk when fake-quantizing a large tensor with one scale


def _array(x, name: str) -> np.ndarray:
    """x as float32 (kept, the fast path for large caches) or float64 (everything else)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise ValueError(f"{name} must be real numbers, got dtype {a.dtype}")
    return a if a.dtype in (np.float32, np.float64) else a.astype(np.float64)


def _overflow(mode: str) -> str:
    if mode not in OVERFLOW_MODES:
        raise ValueError(f"overflow must be one of {OVERFLOW_MODES}, got {mode!r}")
    return mode


def _scale(scale, name: str = "scale") -> np.ndarray:
    s = _array(scale, name)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError(
            f"{name} must be finite and > 0 (a per-tensor, per-head or per-channel "
            f"array that broadcasts against x), got {scale!r}"
        )
    return s


# ---- the format ---------------------------------------------------------------------------


def e4m3_ulp(x) -> np.ndarray:
    """Spacing of the E4M3 grid at ``|x|``: 2^(max(floor(log2|x|), -6) - 3) (subnormals: 2^-9).

    Values above 448 get the spacing of the top binade (32). Zero gets 2^-9.
    """
    a = np.abs(_array(x, "x"))
    _, e = np.frexp(a)  # a = f * 2^e with f in [0.5, 1): floor(log2 a) = e - 1
    binade = np.clip(e - 1, 1 - E4M3_BIAS, 8)
    return np.ldexp(1.0, binade - E4M3_MANTISSA_BITS)


def e4m3_round(x, overflow: str = "saturate") -> np.ndarray:
    """Round to the nearest E4M3 value, ties to even: the value ``torch.float8_e4m3fn`` stores.

    Mathematically r = rint(|x| / q) * q with q = e4m3_ulp(x), a power of two. Implemented on
    the IEEE bit pattern (exact): in the normal range keep the top 3 mantissa bits, adding half
    an E4M3 ulp minus one plus the kept lowest bit before truncating (round half to even; a
    carry moves to the next binade); below 2^-6 the grid is uniform, r = rint(|x| * 512) / 512.
    Then |r| > 448 -> 448 (saturate) or NaN (nan); NaN in -> NaN out; +-inf saturates to +-448
    or becomes NaN. Sign (including -0) is kept. float32 in -> float32 out (the fast path used
    on large caches), anything else -> float64.
    """
    mode = _overflow(overflow)
    x0 = _array(x, "x")
    xs = np.atleast_1d(x0)
    a = np.abs(xs)
    amax = a.max() if a.size else a.dtype.type(0)
    all_finite = bool(np.isfinite(amax))  # NaN or inf anywhere makes the max non-finite
    if a.dtype == np.float32:
        itype, drop = np.int32, 23 - E4M3_MANTISSA_BITS
    else:
        itype, drop = np.int64, 52 - E4M3_MANTISSA_BITS
    bits = (a if all_finite else np.where(np.isfinite(a), a, a.dtype.type(0))).view(itype)
    rbits = bits + ((1 << (drop - 1)) - 1)
    rbits += (bits >> drop) & 1
    rbits &= ~((1 << drop) - 1)
    r = rbits.view(a.dtype)
    sub = a < E4M3_MIN_NORMAL
    if sub.any():
        r[sub] = np.rint(a[sub] * 512) / 512
    if not (all_finite and amax <= E4M3_MAX):  # nothing can round past 448 otherwise
        over = r > E4M3_MAX
        if not all_finite:
            over |= np.isinf(a)
        if over.any():
            r[over] = E4M3_MAX if mode == "saturate" else np.nan
    if not all_finite:
        r[np.isnan(a)] = np.nan
    return np.copysign(r, xs, out=r).reshape(x0.shape)


def e4m3_encode(x, overflow: str = "saturate") -> np.ndarray:
    """The uint8 code of each element after :func:`e4m3_round` (sign | exponent | mantissa).

    Normal r: exponent field E + 7 with E = floor(log2 r), mantissa (r / 2^E - 1) * 8 (the top
    3 mantissa bits of r's float64 pattern); subnormal r (< 2^-6): exponent field 0, mantissa
    r / 2^-9; NaN -> 0x7F.
    """
    r = e4m3_round(x, overflow).astype(np.float64)
    sign = np.signbit(r).astype(np.int64) << 7
    a = np.abs(r)
    nan = np.isnan(a)
    bits = np.where(nan, 1.0, a).view(np.int64)
    binade = ((bits >> 52) & 0x7FF) - 1023
    normal = a >= E4M3_MIN_NORMAL
    code = np.where(
        normal,
        ((binade + E4M3_BIAS) << 3) | ((bits >> 49) & 0x7),
        np.rint(np.where(nan, 0.0, a) * 512.0).astype(np.int64),
    )
    return np.where(nan, E4M3_NAN_CODE, code | sign).astype(np.uint8)


def e4m3_decode(codes) -> np.ndarray:
    """Value of each uint8 code (0..255): the normal / subnormal formulas above; 0x7F, 0xFF NaN."""
    c = np.asarray(codes)
    if c.dtype.kind not in "iu" or np.any(c < 0) or np.any(c > 255):
        raise ValueError("codes must be integers in 0..255 (one E4M3 byte each)")
    c = c.astype(np.int64)
    sign = c >> 7
    exp_field = (c >> 3) & 0xF
    mant = c & 0x7
    value = np.where(
        exp_field == 0,
        mant * E4M3_MIN_SUBNORMAL,
        np.ldexp(1.0 + mant / 8.0, exp_field - E4M3_BIAS),
    )
    value = np.where((exp_field == 15) & (mant == 7), np.nan, value)
    return np.where(sign == 1, -value, value)


def e4m3_values() -> np.ndarray:
    """Every finite non-negative E4M3 value, sorted (0, 2^-9, ..., 448): 127 values."""
    v = e4m3_decode(np.arange(128))
    return np.sort(v[np.isfinite(v)])


def e4m3_round_reference(x, overflow: str = "saturate") -> np.ndarray:
    """Slow, independent E4M3 rounding by search: a second method for :func:`e4m3_round`.

    For |x| <= 448: the nearest of the 127 non-negative values (codes 0..126, which decode in
    increasing order), an exact tie going to the even code. 448 < |x| <= 464 rounds to 448 (the
    midpoint to the next, unrepresentable, step 480 is a tie with an even code below); beyond,
    or +-inf: 448 (saturate) or NaN. Sign kept; NaN stays NaN. float64 out.
    """
    mode = _overflow(overflow)
    xs = np.atleast_1d(_array(x, "x").astype(np.float64))
    a = np.abs(xs)
    v = e4m3_values()
    idx = np.clip(np.searchsorted(v, np.where(np.isfinite(a), a, 0.0)), 1, len(v) - 1)
    lo, hi = v[idx - 1], v[idx]
    up = (a - lo > hi - a) | ((a - lo == hi - a) & (idx % 2 == 0))
    r = np.where(up, hi, lo)
    r = np.where(a > E4M3_MAX, E4M3_MAX, r)
    if mode == "nan":
        r = np.where(a > E4M3_MAX + 16, np.nan, r)  # 464 = 448 + half of the 32-wide top step
    r = np.where(np.isnan(a), np.nan, r)
    return np.copysign(r, xs).reshape(np.shape(x))


# ---- scaled quantization --------------------------------------------------------------------


def amax_scale(x, axis=None, margin: float = 1.0) -> np.ndarray:
    """The scale that maps the largest |x| (over ``axis``) to 448 / ``margin``.

    s = max|x| * margin / 448 (keepdims, so it broadcasts back against x); an all-zero slice
    gets s = 1. ``axis=None`` is one per-tensor scale; reducing every axis but the head axis
    gives per-head scales. ``margin`` > 1 leaves headroom for values larger than those seen.
    """
    real("margin", margin, 0, low_open=True)
    a = np.abs(_array(x, "x"))
    if a.size == 0:
        raise ValueError("x must have at least one element to compute a scale")
    if not np.all(np.isfinite(a)):
        raise ValueError("x must be finite to compute an amax scale")
    amax = np.max(a, axis=axis, keepdims=True)
    return np.where(amax > 0, amax * margin / E4M3_MAX, 1.0)


def quantize(x, scale, overflow: str = "saturate") -> np.ndarray:
    """E4M3 codes of ``x / scale`` (uint8, same shape as x)."""
    return e4m3_encode(_array(x, "x") / _scale(scale), overflow)


def dequantize(codes, scale) -> np.ndarray:
    """decode(codes) * scale, float64."""
    return e4m3_decode(codes) * _scale(scale)


def fake_quantize(x, scale, overflow: str = "saturate") -> np.ndarray:
    """x_hat = e4m3_round(x / s) * s: what attention sees after an FP8 round trip.

    float32 x is divided by the scale in float32, as a GPU kernel does (x / s is then not
    exact: at most a float32 rounding before the E4M3 one); float64 x stays float64.
    """
    xs = _array(x, "x")
    s = _scale(scale).astype(xs.dtype)
    if s.size == 1 and xs.size > _CHUNK:  # large cache, one scale: work in cache-sized chunks
        flat, out, s0 = xs.ravel(), np.empty(xs.size, dtype=xs.dtype), s.ravel()[0]
        for i in range(0, flat.size, _CHUNK):
            out[i : i + _CHUNK] = e4m3_round(flat[i : i + _CHUNK] / s0, overflow) * s0
        return out.reshape(xs.shape)
    return e4m3_round(xs / s, overflow) * s


def int8_fake_quantize(x, scale) -> np.ndarray:
    """Symmetric INT8 for comparison: clip(rint(x / s), -127, 127) * s (a uniform grid)."""
    s = _scale(scale)
    return np.clip(np.rint(_array(x, "x") / s), -INT8_MAX, INT8_MAX) * s


# ---- where the error comes from -------------------------------------------------------------


@dataclass(frozen=True)
class QuantError:
    """Squared error of one quantization, split by cause.

    rounding_sse: sum of (x_hat - x)^2 over elements with |x| <= limit * s (never clipped);
    clipping_sse: the same over elements beyond (clipped to +-limit * s); signal_ss: sum x^2.
    The relative errors divide by signal_ss (a noise-to-signal power ratio).
    """

    rounding_sse: float
    clipping_sse: float
    signal_ss: float
    clipped: int
    size: int

    @property
    def total_sse(self) -> float:
        return self.rounding_sse + self.clipping_sse

    @property
    def rounding_rel(self) -> float:
        return self.rounding_sse / self.signal_ss

    @property
    def clipping_rel(self) -> float:
        return self.clipping_sse / self.signal_ss

    @property
    def total_rel(self) -> float:
        return self.total_sse / self.signal_ss

    @property
    def clipped_fraction(self) -> float:
        return self.clipped / self.size


def error_decomposition(x, scale, fmt: str = "e4m3") -> QuantError:
    """Split the error of quantizing ``x`` with ``scale`` into rounding and clipping parts.

    fmt "e4m3" (saturating, limit 448) or "int8" (symmetric, limit 127). An element is clipped
    when |x| > limit * s (to a relative 1e-6: an amax scale clips nothing). ``x`` must be finite and not all zero.
    """
    xs = _array(x, "x").astype(np.float64)  # exact division by the scale, float64 sums
    if xs.size == 0 or not np.all(np.isfinite(xs)):
        raise ValueError("x must be a non-empty array of finite numbers")
    signal = float(np.sum(xs * xs))
    if signal == 0:
        raise ValueError("x is all zeros: a relative error is undefined")
    s = _scale(scale)
    if fmt == "e4m3":
        limit, xh = E4M3_MAX, fake_quantize(xs, s)
    elif fmt == "int8":
        limit, xh = float(INT8_MAX), int8_fake_quantize(xs, s)
    else:
        raise ValueError(f"fmt must be 'e4m3' or 'int8', got {fmt!r}")
    err2 = (xh - xs) ** 2
    clipped = np.abs(xs) > limit * (1 + CLIP_TOLERANCE) * np.broadcast_to(s, xs.shape)
    return QuantError(
        float(np.sum(err2[~clipped])),
        float(np.sum(err2[clipped])),
        signal,
        int(np.count_nonzero(clipped)),
        int(xs.size),
    )


def error_vs_scale(x, scale_factors, fmt: str = "e4m3") -> dict[str, np.ndarray]:
    """Sweep a per-tensor scale s = f * amax(x) / limit over ``scale_factors`` f.

    f = 1 is the amax scale (nothing clipped); f < 1 clips the largest values; f > 1 leaves
    the top of the grid unused. Returns arrays: factor, scale, rounding_rel, clipping_rel,
    total_rel, clipped_fraction.
    """
    f = _array(scale_factors, "scale_factors").ravel()
    if f.size == 0 or not np.all(np.isfinite(f)) or np.any(f <= 0):
        raise ValueError("scale_factors must be a non-empty list of finite numbers > 0")
    xs = _array(x, "x")
    limit = E4M3_MAX if fmt == "e4m3" else float(INT8_MAX)
    amax = float(np.max(np.abs(xs))) if xs.size else 0.0
    if amax == 0 or not math.isfinite(amax):
        raise ValueError("x must contain a finite non-zero value")
    if fmt not in ("e4m3", "int8"):
        raise ValueError(f"fmt must be 'e4m3' or 'int8', got {fmt!r}")
    flat = xs.ravel()  # float32 stays float32 (fast path); sums are taken in float64
    signal = float(np.sum(flat.astype(np.float64) ** 2))
    all_scales = f * amax / limit
    total, clip_sse, clip_frac = (np.empty(f.size) for _ in range(3))
    step = max(1, 4_000_000 // flat.size)  # rows of scales per vectorized chunk
    for i in range(0, f.size, step):
        scales = all_scales[i : i + step, None]
        if fmt == "e4m3":
            xh = fake_quantize(flat[None, :], scales)
        else:
            xh = int8_fake_quantize(flat[None, :], scales)
        err2 = ((xh - flat[None, :]) ** 2).astype(np.float64)
        clipped = np.abs(flat)[None, :] > limit * (1 + CLIP_TOLERANCE) * scales
        total[i : i + step] = err2.sum(axis=1)
        clip_sse[i : i + step] = np.where(clipped, err2, 0.0).sum(axis=1)
        clip_frac[i : i + step] = clipped.mean(axis=1)
    return {
        "factor": f,
        "scale": all_scales,
        "rounding_rel": (total - clip_sse) / signal,
        "clipping_rel": clip_sse / signal,
        "total_rel": total / signal,
        "clipped_fraction": clip_frac,
    }


def relative_rounding_floor(x, scale=1.0) -> float:
    """Expected noise-to-signal power of E4M3 rounding of ``x`` at ``scale``, nothing clipped.

    An element whose scaled value x / s lies in binade [2^E, 2^(E+1)) (E >= -6) gets an error
    uniform on +-s 2^(E-4), so its expected squared error is s^2 2^(2E-8) / 3; summed and divided
    by sum x^2. Changing s by a power of two leaves it unchanged (same relative grid in every
    binade) as long as x / s stays in the normal range: the flat floor of the error-vs-scale
    curve. Elements that would clip (|x / s| > 448) are ignored.
    """
    xs = _array(x, "x").astype(np.float64)
    s = float(_scale(scale))
    a = np.abs(xs[np.isfinite(xs) & (xs != 0)]) / s
    a = a[a <= E4M3_MAX * (1 + CLIP_TOLERANCE)]
    if a.size == 0:
        raise ValueError("x must contain a finite non-zero value that does not clip at this scale")
    _, e = np.frexp(a)
    binade = np.maximum(e - 1, 1 - E4M3_BIAS)
    return float(np.sum(np.ldexp(1.0, 2 * binade - 8) / 3) / np.sum(a * a))


# ---- a synthetic attention head with outlier channels -----------------------------------------


def synthetic_head(
    num_tokens: int,
    head_dim: int = 128,
    num_outlier_channels: int = 4,
    outlier_scale: float = 8.0,
    tail_dof: float = 3.0,
    num_queries: int = 8,
    query_outlier_weight: float = 1.0,
    seed: int = 0,
):
    """Seeded (q, K, V) for one attention head: Gaussian channels plus a few heavy-tailed ones.

    K[:, c] ~ N(0, 1) except ``num_outlier_channels`` channels ~ outlier_scale * Student-t(dof)
    (heavy tails: the largest of N draws grows like N^(1/dof), so a long context contains keys
    far larger than any short calibration prompt did). V ~ N(0, 1) with the same channels
    outlier-scaled. Queries ~ N(0, 1) with the outlier channels weighted by
    ``query_outlier_weight`` (aligned Q/K outlier channels make extreme keys attract attention).
    Returns float32 arrays q (num_queries, d), K (N, d), V (N, d).
    """
    num_tokens = integer("num_tokens", num_tokens, 1)
    head_dim = integer("head_dim", head_dim, 1)
    num_queries = integer("num_queries", num_queries, 1)
    num_outlier_channels = integer(
        "num_outlier_channels", num_outlier_channels, 0, head_dim, unit="(at most head_dim)"
    )
    for name, v in (("outlier_scale", outlier_scale), ("tail_dof", tail_dof)):
        real(name, v, 0, low_open=True)
    real("query_outlier_weight", query_outlier_weight)
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((num_tokens, head_dim), dtype=np.float32)
    v = rng.standard_normal((num_tokens, head_dim), dtype=np.float32)
    q = rng.standard_normal((num_queries, head_dim), dtype=np.float32)
    ch = np.arange(num_outlier_channels)
    if ch.size:
        k[:, ch] = outlier_scale * rng.standard_t(tail_dof, (num_tokens, ch.size)).astype(
            np.float32
        )
        v[:, ch] *= outlier_scale
        q[:, ch] = query_outlier_weight * np.abs(q[:, ch])
    return q, k, v


def context_ladder(calib_tokens: int, contexts) -> list[int]:
    """The context lengths of the calibration experiment: the calibration length, then every
    longer one of ``contexts`` (sorted, without repeats).

    A static scale is calibrated on the first ``calib_tokens`` keys; the experiment needs at least
    one served length of two calibration windows or more (a 128K cache against a 2K prompt holds
    64 windows). Raises ValueError otherwise.
    """
    calib_tokens = integer("calib_tokens", calib_tokens, 1)
    lengths = [integer("context", c, 1) for c in contexts]
    longer = sorted({c for c in lengths if c > calib_tokens})
    if not longer or longer[-1] < 2 * calib_tokens:
        raise ValueError(
            f"contexts {list(contexts)} need a length of at least 2 x calib_tokens = {2 * calib_tokens:,} "
            f"(the served context must be longer than the calibration prompt)"
        )
    return [calib_tokens, *longer]


def attention(q, k, v) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q K^T / sqrt(d)) V; returns (output (m, d_v), probabilities (m, n)).

    The two matmuls run in the inputs' precision (float32 for the synthetic caches: its
    relative error, ~1e-6, is four orders below the FP8 effects measured); the softmax is
    float64 with the row maximum subtracted.
    """
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if (
        q.ndim != 2
        or k.ndim != 2
        or v.ndim != 2
        or q.shape[1] != k.shape[1]
        or k.shape[0] != v.shape[0]
    ):
        raise ValueError("shapes must be q (m, d), k (n, d), v (n, d_v)")
    logits = (q @ k.T).astype(np.float64) / math.sqrt(q.shape[1])
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return (p.astype(v.dtype) @ v).astype(np.float64), p


@dataclass(frozen=True)
class AttentionError:
    """Exact attention against attention over the FP8 round-tripped K and V, one context length."""

    context: int
    output_rel_error: float  # mean over queries of ||o_hat - o|| / ||o||
    softmax_tv: float  # mean over queries of total variation 0.5 * sum |p_hat - p|
    clipped_tokens: int  # keys with at least one clipped element
    clipped_mass: float  # exact softmax mass (mean over queries) on those keys
    k_scale: float
    v_scale: float


def fp8_attention_error(q, k, v, context: int, k_scale=None, v_scale=None) -> AttentionError:
    """Attend over the first ``context`` keys exactly and through E4M3 (saturating).

    ``k_scale`` / ``v_scale`` None means dynamic: the amax scale of this prefix (nothing
    clipped). A number is a static scale (e.g. calibrated on a short prompt): keys beyond
    448 * scale are clipped.
    """
    n = np.asarray(k).shape[0]
    context = integer("context", context, 1, n, unit="(the keys available)")
    kc, vc = np.asarray(k)[:context], np.asarray(v)[:context]
    ks = float(amax_scale(kc).ravel()[0]) if k_scale is None else float(_scale(k_scale))
    vs = float(amax_scale(vc).ravel()[0]) if v_scale is None else float(_scale(v_scale))
    o, p = attention(q, kc, vc)
    oh, ph = attention(q, fake_quantize(kc, ks), fake_quantize(vc, vs))
    rel = np.linalg.norm(oh - o, axis=1) / np.linalg.norm(o, axis=1)
    lim = E4M3_MAX * (1 + CLIP_TOLERANCE)
    clipped_tok = np.any(np.abs(kc) > lim * ks, axis=1) | np.any(np.abs(vc) > lim * vs, axis=1)
    return AttentionError(
        context=context,
        output_rel_error=float(rel.mean()),
        softmax_tv=float(0.5 * np.abs(ph - p).sum(axis=1).mean()),
        clipped_tokens=int(clipped_tok.sum()),
        clipped_mass=float(p[:, clipped_tok].sum(axis=1).mean()),
        k_scale=ks,
        v_scale=vs,
    )


def fp8_attention_sweep(q, k, v, contexts, scales: dict) -> dict[str, list[AttentionError]]:
    """:func:`fp8_attention_error` at each context length for several fixed (static) scales.

    ``scales`` maps a label to (k_scale, v_scale). K and V are round-tripped through E4M3 once
    per label at full length (a fixed scale makes the quantized prefix the prefix of the
    quantized cache); exact attention is computed once per context. Returns {label: rows}.
    """
    ctx = [int(c) for c in contexts]
    k_arr, v_arr = np.asarray(k), np.asarray(v)
    n = k_arr.shape[0]
    if not ctx or any(not 1 <= c <= n for c in ctx):
        raise ValueError(
            f"contexts must be a non-empty list of lengths in 1..{n}, got {contexts!r}"
        )
    if not scales:
        raise ValueError("scales must map at least one label to (k_scale, v_scale)")
    quantized = {}
    k_tok_max, v_tok_max = np.abs(k_arr).max(axis=1), np.abs(v_arr).max(axis=1)
    lim = E4M3_MAX * (1 + CLIP_TOLERANCE)
    for label, (ks, vs) in scales.items():
        ks, vs = float(_scale(ks, "k_scale")), float(_scale(vs, "v_scale"))
        clip = (k_tok_max > lim * ks) | (v_tok_max > lim * vs)
        quantized[label] = (fake_quantize(k_arr, ks), fake_quantize(v_arr, vs), clip, ks, vs)
    out: dict[str, list[AttentionError]] = {label: [] for label in scales}
    for c in ctx:
        o, p = attention(q, k_arr[:c], v_arr[:c])
        norm = np.linalg.norm(o, axis=1)
        for label, (kq, vq, clip, ks, vs) in quantized.items():
            oh, ph = attention(q, kq[:c], vq[:c])
            rel = np.linalg.norm(oh - o, axis=1) / norm
            cl = clip[:c]
            out[label].append(
                AttentionError(
                    c,
                    float(rel.mean()),
                    float(0.5 * np.abs(ph - p).sum(axis=1).mean()),
                    int(cl.sum()),
                    float(p[:, cl].sum(axis=1).mean()),
                    ks,
                    vs,
                )
            )
    return out


MX_ROUNDING = ("floor", "ceil")


def mx_block_scale(x, block: int = 32, rounding: str = "ceil"):
    """MX shared scales along the last axis of ``x`` (length a multiple of ``block``): one power of two per block,
    shape (..., n_blocks, 1) for ``x.reshape(..., n_blocks, block)``. ``rounding`` "floor": the OCP Microscaling
    spec v1.0's 2^(floor(log2 amax) - 8) for E4M3 (emax 8), which puts the block's largest element in
    [256, 512) and saturates it at 448 above that; "ceil": 2^ceil(log2(amax / 448)), the smallest power of two
    that clips nothing (what production MXFP8 quantizers do to avoid the saturation). An all-zero block gets 1."""
    b = integer("block", block, 1)
    if rounding not in MX_ROUNDING:
        raise ValueError(f"rounding must be one of {MX_ROUNDING}, got {rounding!r}")
    x = np.asarray(x, dtype=float)
    if x.shape[-1] % b:
        raise ValueError(f"the last axis ({x.shape[-1]}) must be a multiple of block = {b}")
    amax = np.abs(x.reshape(*x.shape[:-1], x.shape[-1] // b, b)).max(axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    e = np.floor(np.log2(safe)) - 8 if rounding == "floor" else np.ceil(np.log2(safe / 448.0))
    return np.where(amax > 0, 2.0 ** e, 1.0)


# ---- general block scales (FP32 or power-of-two), e.g. DeepSeek-V3's 1x128 / 128x128 and MX's 1x32 ----------

BLOCK_SCALE_FORMATS = ("fp32", "e8m0")


def block_scale(x, block=(1, 128), scale_format: str = "fp32", rounding: str = "ceil") -> np.ndarray:
    """One E4M3 scale per ``block`` = (rows, cols) tile of the 2-D ``x`` (both dimensions multiples of the block),
    shape (R / br, 1, C / bc, 1) so it broadcasts against ``x.reshape(R / br, br, C / bc, bc)``.

    "fp32": s = amax(tile) / 448 (any positive float: the tile's largest element maps exactly to 448), the format
    of DeepSeek-V3's FP8 checkpoint (1 x 128 activation tiles per token, 128 x 128 weight blocks, float32 scales,
    deepseek-ai/DeepSeek-V3 README_WEIGHTS.md) and of Hopper's block-scaled FP8 GEMMs. "e8m0": s =
    2^ceil(log2(amax / 448)), the smallest power of two that clips nothing (an E8M0 byte holds only the exponent),
    or with ``rounding="floor"`` the OCP spec's 2^(floor(log2 amax) - 8): the tile amax goes through
    :func:`mx_block_scale` (the one home of the power-of-two scale), so block (1, 32) is exactly MX. ``rounding``
    applies to "e8m0" only. An all-zero tile gets 1."""
    if scale_format not in BLOCK_SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {BLOCK_SCALE_FORMATS}, got {scale_format!r}")
    a = np.asarray(_array(x, "x"), dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"x must be 2-D (rows, cols), got shape {a.shape}")
    if len(tuple(block)) != 2:
        raise ValueError(f"block must be (rows, cols), got {block!r}")
    br, bc = (integer("block", b, 1) for b in block)
    r, c = a.shape
    if r % br or c % bc:
        raise ValueError(f"x's shape {a.shape} must be a multiple of block = ({br}, {bc}) in both dimensions")
    if not np.all(np.isfinite(a)):
        raise ValueError("x must be finite to compute block scales")
    if rounding not in MX_ROUNDING:
        raise ValueError(f"rounding must be one of {MX_ROUNDING}, got {rounding!r}")
    amax = np.abs(a.reshape(r // br, br, c // bc, bc)).max(axis=(1, 3), keepdims=True)
    if scale_format == "e8m0":
        return mx_block_scale(amax, 1, rounding).reshape(amax.shape)
    return np.where(amax > 0, amax / E4M3_MAX, 1.0)


def block_fake_quantize(x, block=(1, 128), scale_format: str = "fp32", rounding: str = "ceil") -> np.ndarray:
    """x_hat: each ``block`` tile of the 2-D ``x`` round-tripped through E4M3 with its own scale
    (:func:`block_scale`, :func:`fake_quantize`; a "floor" power-of-two scale saturates at 448), float64, same
    shape as x. With block (1, 32) and "e8m0" this is MXFP8."""
    a = np.asarray(_array(x, "x"), dtype=np.float64)
    s = block_scale(a, block, scale_format, rounding)
    br, bc = int(block[0]), int(block[1])
    r, c = a.shape
    return fake_quantize(a.reshape(r // br, br, c // bc, bc), s).reshape(r, c)
