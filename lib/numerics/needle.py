"""Needle-in-a-haystack retrieval as one attention logit against many: why it fails at length
when perplexity does not.

A query retrieves the needle when the needle's logit beats the largest of the N distractor logits.
With distractor logits i.i.d. N(0, sigma^2) and the needle at margin mu above their mean:

* the largest of N standard normals has median Phi^-1(2^(-1/N)) (:func:`gaussian_max_median`),
  growing like sqrt(2 ln N) (:func:`sqrt_2_ln`): the margin a needle needs grows with the context;
* with quantization noise of sd tau (in units of sigma) on every logit, needle and distractors alike,
  P(retrieve) = E_z[Phi((mu + tau z) / sqrt(1 + tau^2))^N], z ~ N(0, 1)
  (:func:`retrieval_probability`, Gauss-Hermite quadrature); with tau = 0 it is Phi(mu)^N exactly;
* :func:`critical_context` is the N at which that probability falls to one half: a scheme that
  shrinks the margin (clips the needle's key) or widens the noise moves it from beyond the served
  length to inside it, and nothing changes at short context.

The measured case runs on keys from :func:`lib.numerics.fp8.synthetic_head`: :func:`needle_keys`
builds one needle per query (a key that stands out on a few channels the query leans on), and
:func:`retrieval_rates` measures, per context length, the share of queries whose needle logit beats
every distractor, optionally through a truncation window (the engine keeps only the last
``window`` tokens). Logits are q k / sqrt(d). Units: logits; lengths in tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from lib.inputs import integer, real

__all__ = ["NeedleRates", "channels_to_lose_half", "clipped_margins", "critical_context", "gaussian_max_median", "needle_keys",
           "retrieval_curve",
           "retrieval_probability", "retrieval_rates", "retrieved", "sqrt_2_ln"]

_N = NormalDist()
_HERMITE = np.polynomial.hermite_e.hermegauss(64)  # nodes and weights for E over a standard normal


def sqrt_2_ln(n: float) -> float:
    """sqrt(2 ln N): the leading growth of the maximum of N standard normals."""
    return math.sqrt(2 * math.log(real("n", n, 1, low_open=True, unit="distractors")))


def gaussian_max_median(n: float) -> float:
    """Median of the maximum of N i.i.d. standard normals: Phi^-1(2^(-1/N))."""
    n = real("n", n, 1, unit="distractors")
    return _N.inv_cdf(2.0 ** (-1.0 / n))


def _nodes(margin: float, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """(weights, log Phi((margin + noise z) / sqrt(1 + noise^2))) at the quadrature nodes z."""
    mu = real("margin", margin)
    tau = real("noise", noise, 0, unit="(sd, in units of the distractor sd)")
    if tau == 0:
        return np.array([1.0]), np.array([math.log(max(_N.cdf(mu), 1e-300))])
    x, w = _HERMITE
    s = math.sqrt(1 + tau * tau)
    cdf = np.array([_N.cdf((mu + tau * xi) / s) for xi in x])
    return w / math.sqrt(2 * math.pi), np.log(np.maximum(cdf, 1e-300))


def retrieval_curve(margin: float, ns, noise: float = 0.0) -> np.ndarray:
    """:func:`retrieval_probability` at each N of ``ns`` (one quadrature, many N)."""
    n = np.asarray(ns, dtype=float)
    if n.ndim != 1 or np.any(~np.isfinite(n)) or np.any(n < 0):
        raise ValueError("ns must be a 1-D list of non-negative distractor counts")
    w, lc = _nodes(margin, noise)
    return np.exp(n[:, None] * lc[None, :]) @ w


def retrieval_probability(margin: float, n: float, noise: float = 0.0) -> float:
    """P(needle logit > every one of N distractor logits), all in units of the distractors' sd:
    distractors N(0, 1 + noise^2), needle margin + noise * z (Gauss-Hermite over z). noise = 0:
    Phi(margin)^N exactly."""
    return float(retrieval_curve(margin, [real("n", n, 0, unit="distractors")], noise)[0])


def critical_context(margin: float, noise: float = 0.0, prob: float = 0.5) -> float:
    """The number of distractors N at which :func:`retrieval_probability` falls to ``prob``
    (bisection on log N; inf beyond 1e15)."""
    p = real("prob", prob, 0, 1, low_open=True, high_open=True)
    w, lc = _nodes(margin, noise)

    def prob_at(n: float) -> float:
        return float(np.exp(n * lc) @ w)

    if prob_at(1.0) <= p:
        return 1.0
    if prob_at(1e15) > p:
        return math.inf
    lo, hi = 0.0, 15 * math.log(10)
    for _ in range(80):
        mid = (lo + hi) / 2
        if prob_at(math.exp(mid)) > p:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def needle_keys(q, channels: int, margin: float) -> np.ndarray:
    """One needle key per query (rows of ``q``), zero except on the first ``channels`` channels, where it
    is lambda * sign(q_c) with lambda = margin * sigma_q * sqrt(d) / sum_c |q_c|, sigma_q = ||q|| / sqrt(d):
    its logit q k / sqrt(d) is exactly ``margin`` standard deviations of a standard-normal key's logit.
    Concentrated on few channels, its elements are large (lambda grows as channels shrink): a key that
    stands out is a key a short calibration never saw. Returns float32 (queries, d)."""
    qa = np.asarray(q, dtype=np.float64)
    if qa.ndim != 2:
        raise ValueError(f"q must be (queries, d), got shape {qa.shape}")
    c = integer("channels", channels, 1, qa.shape[1], unit="(at most head_dim)")
    mu = real("margin", margin, 0, low_open=True, unit="(distractor standard deviations)")
    d = qa.shape[1]
    sigma = np.linalg.norm(qa, axis=1) / math.sqrt(d)
    lam = mu * sigma * math.sqrt(d) / np.maximum(np.abs(qa[:, :c]).sum(axis=1), 1e-30)
    k = np.zeros_like(qa)
    k[:, :c] = lam[:, None] * np.where(qa[:, :c] >= 0, 1.0, -1.0)
    return k.astype(np.float32)


def clipped_margins(q, channels: int, margin: float, clip: float) -> np.ndarray:
    """Per query: the margin (distractor sd) left to the needle of :func:`needle_keys` once a static scale
    clips its elements to ``clip`` (E4M3_MAX x the scale; rounding ignored). The needle's logit is
    lambda S_c / sqrt(d) with S_c the sum of the query's first ``channels`` |q|, so the margin stays
    ``margin`` while lambda <= clip and becomes clip S_c / (sqrt(d) sigma_q) past it: fewer channels,
    larger lambda, smaller clipped margin."""
    qa = np.asarray(q, dtype=np.float64)
    if qa.ndim != 2:
        raise ValueError(f"q must be (queries, d), got shape {qa.shape}")
    c = integer("channels", channels, 1, qa.shape[1], unit="(at most head_dim)")
    mu = real("margin", margin, 0, low_open=True, unit="(distractor standard deviations)")
    lim = real("clip", clip, 0, low_open=True, unit="(largest representable key element)")
    d = qa.shape[1]
    sigma = np.linalg.norm(qa, axis=1) / math.sqrt(d)
    s_c = np.abs(qa[:, :c]).sum(axis=1)
    lam = mu * sigma * math.sqrt(d) / np.maximum(s_c, 1e-30)
    return np.where(lam <= lim, mu, lim * s_c / (math.sqrt(d) * sigma))


def channels_to_lose_half(q, margin: float, clip: float, context: int) -> int:
    """The most channels a needle of ``margin`` may stand out on and still be clipped below the median
    largest of ``context`` distractors (its median :func:`clipped_margins` under
    :func:`gaussian_max_median`), i.e. lose about half the needles at that length; 0 when even one
    channel keeps it above."""
    qa = np.asarray(q, dtype=np.float64)
    n = integer("context", context, 1, unit="tokens")
    bar = gaussian_max_median(n)
    best = 0
    for c in range(1, qa.shape[1] + 1):  # the clipped margin grows with the channels: the last one under the bar
        if float(np.median(clipped_margins(qa, c, margin, clip))) < bar:
            best = c
    return best


def _kept(context: int, depths: np.ndarray, window: int) -> np.ndarray:
    """Needles inside a window that keeps the last ``window`` of ``context`` tokens: the needle at
    depth u sits (1 - u) context tokens from the end."""
    return (context - depths * context) <= window


def retrieved(q, keys, needles, context: int, depths=None, window: int | None = None) -> np.ndarray:
    """Per query (boolean array): does query r retrieve its needle at ``context`` (see
    :func:`retrieval_rates`, which averages this over the queries)."""
    qa, ka, na = (np.asarray(a, dtype=np.float32) for a in (q, keys, needles))
    if qa.ndim != 2 or ka.ndim != 2 or na.shape != qa.shape or ka.shape[1] != qa.shape[1]:
        raise ValueError("shapes must be q (R, d), keys (N, d), needles (R, d)")
    c = integer("context", context, 1, ka.shape[0], unit="(the keys available)")
    dep = np.zeros(qa.shape[0]) if depths is None else np.asarray(depths, dtype=float)
    if dep.shape != (qa.shape[0],) or np.any(dep < 0) or np.any(dep >= 1):
        raise ValueError("depths must be one fraction in [0, 1) per query")
    lo = 0
    kept = np.ones(qa.shape[0], bool)
    if window is not None:
        window = integer("window", window, 1, unit="tokens")
        lo = max(0, c - window)
        kept = _kept(c, dep, window)
    scale = np.float32(1.0 / math.sqrt(qa.shape[1]))
    best = ((qa @ ka[lo:c].T) * scale).max(axis=1)
    return kept & (np.einsum("rd,rd->r", qa, na) * scale > best)


@dataclass(frozen=True)
class NeedleRates:
    """Per context length: the share of queries that retrieve their needle, and the median margin
    (needle logit minus the largest distractor logit; -inf where the needle was truncated away)."""

    contexts: tuple[int, ...]
    success: np.ndarray
    median_margin: np.ndarray


def retrieval_rates(q, keys, needles, contexts, depths=None, window: int | None = None) -> NeedleRates:
    """Retrieval by argmax: query r finds its needle (row r of ``needles``) at context c when the needle
    is in the attended window and its logit beats every distractor among the first c rows of ``keys``.
    ``depths`` (fractions in [0, 1), one per query) place each needle in the document; ``window`` keeps
    only the last ``window`` tokens of a context (a truncating engine), which drops the needles that
    sit earlier and the distractors before them."""
    qa, ka, na = (np.asarray(a, dtype=np.float32) for a in (q, keys, needles))
    if qa.ndim != 2 or ka.ndim != 2 or na.shape != qa.shape or ka.shape[1] != qa.shape[1]:
        raise ValueError("shapes must be q (R, d), keys (N, d), needles (R, d)")
    ctx = tuple(integer("context", c, 1, ka.shape[0], unit="(the keys available)") for c in contexts)
    if not ctx or list(ctx) != sorted(ctx):
        raise ValueError(f"contexts must be a non-empty increasing list, got {list(contexts)}")
    r = qa.shape[0]
    dep = np.zeros(r) if depths is None else np.asarray(depths, dtype=float)
    if dep.shape != (r,) or np.any(dep < 0) or np.any(dep >= 1):
        raise ValueError("depths must be one fraction in [0, 1) per query")
    if window is not None:
        window = integer("window", window, 1, unit="tokens")
    scale = np.float32(1.0 / math.sqrt(qa.shape[1]))
    needle_logit = np.einsum("rd,rd->r", qa, na) * scale
    logits = (qa @ ka[: ctx[-1]].T) * scale  # float32: its rounding (~1e-7 relative) is far below the effects measured
    succ, marg = [], []
    for c in ctx:
        lo = 0 if window is None or c <= window else c - window
        best = logits[:, lo:c].max(axis=1)
        kept = np.ones(r, bool) if window is None else _kept(c, dep, window)
        margin = np.where(kept, (needle_logit - best).astype(np.float64), -np.inf)
        succ.append(float(np.mean(margin > 0)))
        marg.append(float(np.median(margin)))
    return NeedleRates(ctx, np.array(succ), np.array(marg))
