"""Sampling: from a row of logits to the distribution the next token is drawn from.

:func:`softmax` is the one temperature softmax of the book (max subtracted first, so no logit
overflows; temperature 0 is greedy: all mass on the largest logit, ties to the lowest token id).

The knobs and their order. A sampler turns logits ``z`` into a distribution with four knobs, each
a step that maps logits to logits (a removed token gets -inf):

- ``temperature`` T: z -> (z - max z) / T (T = 0: greedy, see below);
- ``top_k`` k: keep every token whose logit is >= the k-th largest (ties at the boundary are all
  kept, as vLLM and transformers do; k = 0 or k >= V disables it);
- ``top_p`` p: keep every token for which the probability mass of the tokens *strictly more
  probable* than it is < p, i.e. the smallest set of top tokens holding >= p, with a tie group at
  the boundary kept whole, so the kept set does not depend on the order of the sort (p = 1 keeps
  everything, whatever a float cumulative sum says);
- ``min_p`` m: keep every token with probability >= m x the largest, i.e. z_i >= max z + ln m
  (m = 0 disables it).

Top-k and min-p look at ranks and ratios only, so where temperature sits does not change them;
top-p and min-p look at probabilities of the logits they receive, so the steps before them do.
The order is explicit: ``order`` lists the steps in the order they run (:data:`DEFAULT_ORDER` is
vLLM V1's: temperature, min-p, top-k, top-p; :data:`ENGINE_ORDERS` has transformers' and
llama.cpp's). Temperature 0 is greedy whatever the order: every filter keeps the largest logit, so
the kept set is the tie group of the maximum and :func:`sampling_probs` puts probability 1 on its
lowest token id (the convention of :func:`softmax`).

Public names other pages use: :func:`softmax`, :func:`filter_logits`, :func:`kept_tokens`,
:func:`sampling_probs`, :func:`sample`, the single steps (:func:`apply_temperature`,
:func:`top_k_filter`, :func:`top_p_filter`, :func:`min_p_filter`), the statistics of a sampler test
(:func:`chi_square_gof`, :func:`chi_square_of_counts`, :func:`chi2_sf`, :func:`chi2_isf`,
:func:`chi_square_draws_to_detect`) and :func:`exp_overflow_logit`. Everything computes
in float64 on one row of logits (a 1-D array) unless it says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = [
    "DEFAULT_ORDER",
    "ENGINE_ORDERS",
    "KNOBS",
    "ChiSquare",
    "apply_temperature",
    "chi2_isf",
    "chi2_sf",
    "chi_square_draws_to_detect",
    "chi_square_gof",
    "chi_square_bins",
    "chi_square_of_counts",
    "exp_overflow_logit",
    "filter_logits",
    "kept_tokens",
    "min_p_filter",
    "sample",
    "sampling_probs",
    "softmax",
    "top_k_filter",
    "top_p_filter",
]

KNOBS = ("temperature", "top_k", "top_p", "min_p")
#: The book's order: vLLM V1's sampler (vllm/v1/sample/sampler.py, Sampler.sample: temperature, then the
#: argmax-invariant processors, min-p by default, then top-k and top-p in apply_top_k_top_p).
DEFAULT_ORDER = ("temperature", "min_p", "top_k", "top_p")
#: What engines run, read from their source: vLLM vllm/v1/sample/sampler.py (Sampler.sample) and
#: vllm/v1/sample/ops/topk_topp_sampler.py (top-k masks, then top-p on the masked row); transformers
#: src/transformers/generation/utils.py (GenerationMixin._get_logits_processor appends Temperature, TopK,
#: TopP, MinP warpers in that order); llama.cpp common/common.h (common_params_sampling.samplers default:
#: penalties, dry, top-n-sigma, top-k, typical-p, top-p, min-p, xtc, temperature).
ENGINE_ORDERS = {
    "vLLM V1": ("temperature", "min_p", "top_k", "top_p"),
    "transformers": ("temperature", "top_k", "top_p", "min_p"),
    "llama.cpp": ("top_k", "top_p", "min_p", "temperature"),
}


def softmax(logits, temperature: float = 1.0) -> np.ndarray:
    """softmax(z / T) over the last axis, float64: exp((z - max z) / T) / sum, which cannot overflow.
    T = 0 is the greedy limit: probability 1 on argmax z (the lowest index among ties).
    ``logits``: array (..., V) of finite values or -inf (masked); each row needs a finite entry."""
    t = real("temperature", temperature, 0.0, unit="")
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 0 or z.shape[-1] == 0:
        raise ValueError("logits must have a last axis of at least one token")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("logits must be finite or -inf (masked); got NaN or +inf")
    top = z.max(axis=-1, keepdims=True)
    if np.isneginf(top).any():
        raise ValueError("every row of logits needs at least one finite (unmasked) entry")
    if t == 0:
        out = np.zeros_like(z)
        np.put_along_axis(out, z.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    e = np.exp((z - top) / t)
    return e / e.sum(axis=-1, keepdims=True)


# ---- one row, one step ---------------------------------------------------------------------------


def _row(logits) -> np.ndarray:
    """A float64 copy of one row of logits, validated as :func:`softmax` does."""
    z = np.array(logits, dtype=np.float64)
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be one row (a 1-D array of at least one token), got shape {z.shape}")
    if np.isnan(z).any() or np.isposinf(z).any():
        raise ValueError("logits must be finite or -inf (masked); got NaN or +inf")
    if np.isneginf(z.max()):
        raise ValueError("logits need at least one finite (unmasked) entry")
    return z


def apply_temperature(logits, temperature: float) -> np.ndarray:
    """(z - max z) / T for T > 0: z / T shifted so the largest is 0 (the same distribution, and a tiny T
    cannot overflow: the other logits go to -inf, their limit). Masked -inf stay -inf. T = 0 keeps only
    the maximum's tie group, unscaled (the support of the T -> 0 limit; :func:`sampling_probs` then
    picks its lowest id)."""
    t = real("temperature", temperature, 0.0)
    z = _row(logits)
    if t == 0:
        return np.where(z == z.max(), z, -np.inf)
    with np.errstate(over="ignore"):
        return (z - z.max()) / t


def top_k_filter(logits, top_k: int) -> np.ndarray:
    """Keep every token with z >= the k-th largest z (a tie at the boundary keeps the whole group);
    ``top_k`` = 0 or >= V keeps everything."""
    k = integer("top_k", top_k, 0)
    z = _row(logits)
    if k == 0 or k >= z.size:
        return z
    kth = np.partition(z, z.size - k)[z.size - k]
    return np.where(z >= kth, z, -np.inf)


def top_p_filter(logits, top_p: float) -> np.ndarray:
    """Keep token i iff the mass of the tokens strictly more probable than i is < p (probabilities
    softmax(z) of the logits given). No tie group is ever split, and every sum is taken over the
    values in sorted order, so the kept set is the same for any order of the vocabulary. p = 1
    keeps everything (a float cumulative sum can reach 1 early or never)."""
    p = fraction("top_p", top_p, allow_zero=False)
    z = _row(logits)
    if p == 1.0:
        return z
    order = np.argsort(-z, kind="stable")
    zs = z[order]
    e = np.exp(zs - zs[0])  # sorted values: the same numbers whatever the vocabulary order
    before = np.concatenate(([0.0], np.cumsum(e)[:-1]))  # unnormalised mass ranked above each position
    first = np.searchsorted(-zs, -zs, side="left")  # first position of each value's tie group
    keep_sorted = before[first] < p * e.sum()
    keep = np.empty(z.size, dtype=bool)
    keep[order] = keep_sorted
    return np.where(keep, z, -np.inf)


def min_p_filter(logits, min_p: float) -> np.ndarray:
    """Keep every token with probability >= min_p x the largest: z_i >= max z + ln(min_p); 0 disables."""
    m = fraction("min_p", min_p)
    z = _row(logits)
    if m == 0:
        return z
    return np.where(z >= z.max() + math.log(m), z, -np.inf)


# ---- the chain ----------------------------------------------------------------------------------


def _order(order: Sequence[str], active: dict[str, bool]) -> tuple[str, ...]:
    order = tuple(order)
    unknown = [s for s in order if s not in KNOBS]
    if unknown or len(set(order)) != len(order):
        raise ValueError(f"order must list distinct steps from {KNOBS}, got {order!r}")
    missing = [k for k, on in active.items() if on and k not in order]
    if missing:
        raise ValueError(f"order {order!r} leaves out {missing}, which are set: list every knob that is not neutral")
    return order


def filter_logits(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                  order: Sequence[str] = DEFAULT_ORDER) -> np.ndarray:
    """The logits after every step of ``order`` (removed tokens -inf; temperature applied if T > 0).

    Neutral values: T = 1, top_k = 0, top_p = 1, min_p = 0; a knob that is set must appear in
    ``order``. T = 0 returns the maximum's tie group whatever the order (module docstring).
    """
    t = real("temperature", temperature, 0.0)
    steps = {"temperature": lambda z: apply_temperature(z, t), "top_k": lambda z: top_k_filter(z, top_k),
             "top_p": lambda z: top_p_filter(z, top_p), "min_p": lambda z: min_p_filter(z, min_p)}
    integer("top_k", top_k, 0)  # validated even when the chain does not reach them (T = 0)
    fraction("top_p", top_p, allow_zero=False)
    fraction("min_p", min_p)
    active = {"temperature": t != 1.0, "top_k": top_k != 0, "top_p": top_p != 1.0, "min_p": min_p != 0.0}
    order = _order(order, active)
    z = _row(logits)
    if t == 0:
        return apply_temperature(z, 0.0)
    for name in order:
        z = steps[name](z)
    return z


def kept_tokens(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                order: Sequence[str] = DEFAULT_ORDER) -> np.ndarray:
    """The token ids that can be sampled (positive probability), ascending."""
    return np.flatnonzero(np.isfinite(filter_logits(logits, temperature, top_k, top_p, min_p, order)))


def sampling_probs(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                   order: Sequence[str] = DEFAULT_ORDER) -> np.ndarray:
    """The distribution the next token is drawn from: softmax of :func:`filter_logits`, float64.
    T = 0: probability 1 on the lowest id among the largest logits."""
    z = filter_logits(logits, temperature, top_k, top_p, min_p, order)
    return softmax(z, 0.0 if temperature == 0 else 1.0)


def sample(logits, rng, size: int | None = None, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
           min_p: float = 0.0, order: Sequence[str] = DEFAULT_ORDER):
    """Token id(s) drawn from :func:`sampling_probs`. ``rng``: a numpy Generator or an int seed;
    ``size``: None for one int, else that many ids (an int64 array)."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(integer("rng (a seed)", rng, 0))
    p = sampling_probs(logits, temperature, top_k, top_p, min_p, order)
    if size is not None:
        size = integer("size", size, 1)
    out = rng.choice(p.size, size=size, p=p)
    return int(out) if size is None else out.astype(np.int64)


# ---- testing a sampler against its distribution ----------------------------------------------------


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square with ``dof`` degrees of freedom: the regularised upper incomplete
    gamma Q(dof/2, x/2) (series below a + 1, Lentz's continued fraction above; Numerical Recipes 6.2)."""
    x = real("x", x, 0.0)
    a = integer("dof", dof, 1) / 2.0
    h = x / 2.0
    if h == 0:
        return 1.0
    log_front = -h + a * math.log(h) - math.lgamma(a)
    if h < a + 1:  # series for P(a, h)
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= h / n
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300  # continued fraction for Q(a, h)
    b = h + 1 - a
    c, d = 1 / tiny, 1 / b
    f = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        f *= delta
        if abs(delta - 1) < 1e-16:
            break
    return min(1.0, math.exp(log_front) * f)


def chi2_isf(alpha: float, dof: int) -> float:
    """The critical value c with P(X >= c) = ``alpha`` for X ~ chi-square(``dof``) (bisection on :func:`chi2_sf`)."""
    a = fraction("alpha", alpha, allow_zero=False)
    dof = integer("dof", dof, 1)
    lo, hi = 0.0, float(dof) + 10.0
    while chi2_sf(hi, dof) > a:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, dof) > a else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def chi_square_draws_to_detect(probs, biased, alpha: float = 1e-4) -> float:
    """Draws n at which a sampler drawing from ``biased`` is expected to fail Pearson's test against
    ``probs`` at level ``alpha``: E[X^2] = dof + n d^2 with d^2 = sum (q - p)^2 / p (the noncentral
    chi-square mean), set equal to the critical value: n = (c - dof) / d^2. At that n about half the
    runs detect the bias; a few times more draws make detection near certain. One bin per token of
    positive probability (``biased`` must put no mass outside ``probs``' support). A bias that leaves
    the distribution unchanged (d^2 = 0: e.g. a temperature error on tied logits) returns inf: no
    number of draws tells the two samplers apart."""
    p = np.asarray(probs, dtype=np.float64)
    q = np.asarray(biased, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError("probs and biased must be 1-D distributions of the same length")
    live = p > 0
    if (q[~live] > 0).any():
        raise ValueError("biased puts mass on tokens probs never draws: one such draw is already proof (exact test)")
    d2 = float((((q - p)[live]) ** 2 / p[live]).sum())
    if d2 == 0:
        return math.inf
    dof = int(live.sum()) - 1
    if dof < 1:
        raise ValueError("probs needs at least two tokens of positive probability")
    return (chi2_isf(alpha, dof) - dof) / d2


@dataclass(frozen=True)
class ChiSquare:
    """A goodness-of-fit test of draws against a distribution. ``impossible``: draws of tokens whose
    probability is 0 (one is proof of a wrong sampler: p_value is then 0)."""

    statistic: float
    dof: int
    p_value: float
    bins: int
    impossible: int
    draws: int


def chi_square_gof(tokens, probs, min_expected: float = 5.0) -> ChiSquare:
    """Pearson's chi-square of the token ids ``tokens`` against ``probs`` (the exact distribution).

    Tokens with probability 0 are an exact test (any draw of one fails); the others are binned
    one per token while the expected count n p_i >= ``min_expected``, the rest pooled into one bin
    (merged into the smallest bin if it falls short). X^2 = sum (O - E)^2 / E, dof = bins - 1.
    """
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or (p < 0).any() or not math.isclose(p.sum(), 1.0, rel_tol=1e-9):
        raise ValueError("probs must be a 1-D distribution (non-negative, summing to 1)")
    t = np.asarray(tokens)
    if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer) or t.min() < 0 or t.max() >= p.size:
        raise ValueError(f"tokens must be a 1-D array of token ids in [0, {p.size}), got {t!r}")
    return chi_square_of_counts(np.bincount(t, minlength=p.size), p, min_expected)


def chi_square_bins(probs, draws: int, min_expected: float = 5.0) -> np.ndarray:
    """The bin of each outcome in Pearson's test of ``draws`` draws against ``probs``: one bin per
    outcome whose expected count n p_i >= ``min_expected``, the others pooled into one more bin
    (folded into the smallest bin when the pool's expected count falls short); -1 for outcomes of
    probability 0 (an exact test: drawing one is proof). Bins are numbered 0, 1, ... in outcome order."""
    p = np.asarray(probs, dtype=np.float64)
    n = integer("draws", draws, 1)
    real("min_expected", min_expected, 0.0, low_open=True)
    e = n * p
    live = p > 0
    big = live & (e >= min_expected)
    bins = np.full(p.size, -1)
    bins[big] = np.arange(int(big.sum()))
    rest = live & ~big
    if rest.any():
        if e[rest].sum() >= min_expected or not big.any():
            bins[rest] = int(big.sum())
        else:
            smallest = np.flatnonzero(big)[np.argmin(e[big])]
            bins[rest] = bins[smallest]
    return bins


def chi_square_of_counts(counts, probs, min_expected: float = 5.0) -> ChiSquare:
    """:func:`chi_square_gof` from the counts per token (``counts[i]``: draws of token i) instead of
    the draws; bins from :func:`chi_square_bins`."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or (p < 0).any() or not math.isclose(p.sum(), 1.0, rel_tol=1e-9):
        raise ValueError("probs must be a 1-D distribution (non-negative, summing to 1)")
    counts = np.asarray(counts)
    if counts.shape != p.shape or (counts < 0).any() or counts.sum() == 0:
        raise ValueError(f"counts must be {p.size} non-negative counts, not all zero")
    n = int(counts.sum())
    bins = chi_square_bins(p, n, min_expected)
    impossible = int(counts[bins < 0].sum())
    live = bins >= 0
    size = int(bins.max()) + 1 if live.any() else 0
    obs = np.bincount(bins[live], weights=counts[live].astype(float), minlength=size)
    exp = np.bincount(bins[live], weights=n * p[live], minlength=size)
    stat = float(((obs - exp) ** 2 / exp).sum())
    if impossible:
        pv = 0.0
    elif size < 2:
        pv = 1.0
    else:
        pv = chi2_sf(stat, size - 1)
    return ChiSquare(stat, max(size - 1, 0), pv, size, impossible, n)


# ---- the overflow -------------------------------------------------------------------------------------


def exp_overflow_logit(dtype="float32") -> float:
    """The largest value x of ``dtype`` whose exp(x), computed in ``dtype``, is finite: a naive softmax
    (no max subtracted) returns inf / inf = NaN for any logit / T above it. float32: 88.72 (ln of
    3.4e38); float16: 11.09 (ln of 65,504); float64: 709.78."""
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float16, float32 or float64, got {dtype!r}")
    x = dt.type(math.log(float(np.finfo(dt).max)))
    with np.errstate(over="ignore"):
        while not np.isfinite(np.exp(x)):
            x = np.nextafter(x, dt.type(0))
        while np.isfinite(np.exp(np.nextafter(x, dt.type(np.inf)))):
            x = np.nextafter(x, dt.type(np.inf))
    return float(x)
