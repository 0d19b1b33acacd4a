"""Evaluating a quantized (or otherwise changed) model against its reference: the statistics of a
benchmark score, the paired comparison of two models on the same items, and token-level divergence.

Benchmark scores (n items, accuracy p, items independent):

* standard error of one score: SE = sqrt(p q / n), q = 1 - p (:func:`score_standard_error`);
* two models on the SAME items form a 2x2 table: both right, A only (``a_only``), B only
  (``b_only``), both wrong. The difference of accuracies is (a_only - b_only) / n and only the
  discordant items carry it. With discordance psi = P(A only) + P(B only) and delta = P(A only) -
  P(B only), the paired difference has SE = sqrt((psi - delta^2) / n) (:func:`paired_difference_se`),
  against sqrt((p_a q_a + p_b q_b) / n) for two independent samples (:func:`unpaired_difference_se`):
  a quantized model agrees with its reference on most items, so psi << p q and pairing shrinks the
  noise several-fold;
* McNemar's test: given m = a_only + b_only discordant items, a_only ~ Binomial(m, 1/2) under "no
  difference"; the exact two-sided p-value is min(1, 2 P(X >= max(a_only, b_only)))
  (:func:`mcnemar_exact_p`, the binomial tail from :mod:`lib.sre.canary`); its power at n items
  (normal approximation, Connor 1987, Biometrics 43:207) is
  Phi((sqrt(n) |delta| - z_{1-alpha/2} sqrt(psi)) / sqrt(psi - delta^2)) (:func:`mcnemar_power`),
  and the items needed n = ((z_{1-alpha/2} sqrt(psi) + z_{power} sqrt(psi - delta^2)) / delta)^2;
  the minimum detectable difference at n items solves that for delta
  (:func:`min_detectable_difference_paired`); the unpaired one bisects on the two-sample size of
  :func:`lib.sre.canary.requests_needed` (:func:`min_detectable_difference_unpaired`);
* :func:`paired_bootstrap` resamples items (the multinomial of the four cells, which is what an item
  resample changes) for a distribution-free interval; :func:`simulate_paired` draws per-item
  correctness of two models from the four cell probabilities (the seeded oracle for the closed forms).

Token level (logits of a reference and a changed model at the same positions): per-position
KL(ref || changed), whether the greedy token flips, and the change in the negative log-likelihood of
a given token (:func:`token_divergence`). Perplexity is exp(mean NLL): a signed mean over mostly easy
tokens, in which errors of both signs cancel; KL and flips cannot cancel.
:func:`synthetic_logits` makes seeded logits with a spread of confidences (most positions easy).

Deployment evaluations (the same weights through two serving configurations): :func:`pooled` is
the traffic-weighted average an unsliced report shows; :func:`allocate_items` samples by slice with a
floor of items per slice; :func:`discordance_excess_items` sizes the test of a candidate's discordance
with the reference against the reference's discordance with its own rerun (the noise floor).

Probabilities and rates in [0, 1]; accuracy differences in accuracy units (0.01 = one point).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from lib.inputs import fraction, integer, real
from lib.search import smallest_true
from lib.sre import canary

__all__ = ["PairedCells", "TokenDivergence", "allocate_items", "cell_probabilities", "discordance_excess_items",
           "items_needed_paired", "items_needed_paired_exact", "mcnemar_critical_count", "mcnemar_exact_p", "mcnemar_exact_power",
           "mcnemar_min_discordant", "mcnemar_rejects", "pooled",
           "mcnemar_power", "min_detectable_difference_paired", "min_detectable_difference_unpaired",
           "paired_bootstrap", "paired_cells", "paired_difference_se", "perturb_logits", "score_standard_error",
           "simulate_paired", "synthetic_logits", "token_divergence", "unpaired_difference_se"]

_N = NormalDist()


def _alpha(alpha: float) -> float:
    return real("alpha", alpha, 0, 0.5, low_open=True, unit="(two-sided false-alarm probability)")


def _power(power: float) -> float:
    return real("power", power, 0.5, 1, high_open=True, unit="(detection probability)")


def score_standard_error(accuracy: float, items: int) -> float:
    """Standard error of a benchmark score of ``items`` independent items at ``accuracy``: sqrt(p q / n)."""
    p = fraction("accuracy", accuracy)
    return math.sqrt(p * (1 - p) / integer("items", items, 1))


def unpaired_difference_se(acc_a: float, acc_b: float, items: int) -> float:
    """SE of the difference of two scores on independent item samples of ``items`` each:
    sqrt((p_a q_a + p_b q_b) / n)."""
    return math.hypot(score_standard_error(acc_a, items), score_standard_error(acc_b, items))


def cell_probabilities(acc_a: float, acc_b: float, discordance: float) -> np.ndarray:
    """The 2x2 cell probabilities (both right, A only, B only, both wrong) of two models with
    accuracies ``acc_a``, ``acc_b`` that disagree on ``discordance`` of the items:
    A only = (psi + delta) / 2, B only = (psi - delta) / 2, delta = acc_a - acc_b.
    Raises ValueError when the three cannot coexist (|delta| <= psi <= the room the accuracies leave)."""
    pa, pb = fraction("acc_a", acc_a), fraction("acc_b", acc_b)
    psi = fraction("discordance", discordance)
    d = pa - pb
    a_only, b_only = (psi + d) / 2, (psi - d) / 2
    both = pa - a_only
    neither = 1 - both - a_only - b_only
    if min(a_only, b_only, both, neither) < -1e-12:
        lo, hi = abs(d), min(pa + pb, 2 - pa - pb)
        raise ValueError(f"discordance {psi:g} is impossible for accuracies {pa:g} and {pb:g}: it must lie in "
                         f"[{lo:.4g}, {hi:.4g}] (at least their difference, at most what both-right and both-wrong leave)")
    return np.clip(np.array([both, a_only, b_only, neither]), 0.0, 1.0)


@dataclass(frozen=True)
class PairedCells:
    """Counts of the 2x2 table of two models on the same ``items``."""

    both: int
    a_only: int
    b_only: int
    neither: int

    @property
    def items(self) -> int:
        return self.both + self.a_only + self.b_only + self.neither

    @property
    def acc_a(self) -> float:
        return (self.both + self.a_only) / self.items

    @property
    def acc_b(self) -> float:
        return (self.both + self.b_only) / self.items

    @property
    def difference(self) -> float:
        """acc_a - acc_b = (a_only - b_only) / n."""
        return (self.a_only - self.b_only) / self.items

    @property
    def discordant(self) -> int:
        return self.a_only + self.b_only


def paired_cells(correct_a, correct_b) -> PairedCells:
    """The 2x2 table from two equal-length boolean arrays of per-item correctness."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"correct_a and correct_b must be non-empty 1-D arrays of the same length, got {a.shape} and {b.shape}")
    return PairedCells(int(np.sum(a & b)), int(np.sum(a & ~b)), int(np.sum(~a & b)), int(np.sum(~a & ~b)))


def paired_difference_se(a_only_rate: float, b_only_rate: float, items: int) -> float:
    """SE of acc_a - acc_b on the same ``items``: sqrt((psi - delta^2) / n), psi = a_only + b_only
    rates, delta = a_only - b_only."""
    a, b = fraction("a_only_rate", a_only_rate), fraction("b_only_rate", b_only_rate)
    if a + b > 1 + 1e-12:
        raise ValueError(f"a_only_rate + b_only_rate must be at most 1, got {a + b:g}")
    psi, d = a + b, a - b
    return math.sqrt(max(psi - d * d, 0.0) / integer("items", items, 1))


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: min(1, 2 P(X >= max(a_only, b_only))), X ~ Binomial(m, 1/2),
    m = a_only + b_only (1.0 with no discordant items)."""
    a = integer("a_only", a_only, 0)
    b = integer("b_only", b_only, 0)
    m = a + b
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * canary.binomial_sf(max(a, b), m, 0.5))


def mcnemar_min_discordant(alpha: float = 0.05) -> int:
    """The fewest discordant items on which the exact two-sided McNemar test can reject at ``alpha``:
    all m of them one way gives p = 2^(1 - m), so the smallest m with 2^(1 - m) < alpha. A sample
    (or slice) with fewer items than this cannot show any difference, however large."""
    a = _alpha(alpha)
    m = 1
    while 2.0 ** (1 - m) >= a:
        m += 1
    return m


def _log_factorials(n: int) -> np.ndarray:
    """log k! for k = 0..n."""
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=float)))))


def _binomial_pmf(m: int, p: float, lf: np.ndarray) -> np.ndarray:
    """P(X = k), k = 0..m, X ~ Binomial(m, p), from log factorials ``lf`` (at least m + 1 long)."""
    k = np.arange(m + 1)
    if p <= 0 or p >= 1:
        return (k == (m if p >= 1 else 0)).astype(float)
    return np.exp(lf[m] - lf[k] - lf[m - k] + k * math.log(p) + (m - k) * math.log1p(-p))


def _critical(m: int, a: float, lf: np.ndarray) -> int:
    if m == 0:
        return 1
    sf = np.cumsum(_binomial_pmf(m, 0.5, lf)[::-1])[::-1]  # P(X >= k), k = 0..m
    ok = np.flatnonzero(2.0 * sf < a)
    return int(ok[0]) if ok.size else m + 1


def mcnemar_critical_count(discordant: int, alpha: float = 0.05) -> int:
    """The exact two-sided McNemar test (:func:`mcnemar_exact_p` < ``alpha``) on ``discordant`` items rejects
    iff max(a_only, b_only) reaches this count; ``discordant`` + 1 when it cannot reject at all."""
    m = integer("discordant", discordant, 0)
    return _critical(m, _alpha(alpha), _log_factorials(m))


def mcnemar_rejects(a_only, b_only, alpha: float = 0.05) -> np.ndarray:
    """Element-wise: does the exact two-sided McNemar test reject at ``alpha`` on these discordant counts
    (arrays of one shape; the critical count is computed once per distinct total)."""
    a, b = np.asarray(a_only), np.asarray(b_only)
    if a.shape != b.shape or (a.size and (a.min() < 0 or b.min() < 0)):
        raise ValueError("a_only and b_only must be non-negative counts of one shape")
    al = _alpha(alpha)
    m = (a + b).astype(int)
    if m.size == 0:
        return np.zeros(m.shape, bool)
    lf = _log_factorials(int(m.max()))
    crit = {int(v): _critical(int(v), al, lf) for v in np.unique(m)}
    return np.maximum(a, b) >= np.vectorize(crit.__getitem__, otypes=[int])(m)


def mcnemar_exact_power(items: int, discordance: float, difference: float, alpha: float = 0.05) -> float:
    """Power of the exact two-sided McNemar test on ``items``, by enumeration: the discordant count m is
    Binomial(n, psi) and, given m, a_only is Binomial(m, (psi + |delta|) / (2 psi)); the test rejects when
    max(a_only, b_only) reaches :func:`mcnemar_critical_count`. Exact where :func:`mcnemar_power`'s normal
    approximation is not (a few dozen items); 0 below :func:`mcnemar_min_discordant` items."""
    n = integer("items", items, 1)
    psi, d = _psi_delta(discordance, difference)
    a = _alpha(alpha)
    lf = _log_factorials(n)
    pm = _binomial_pmf(n, psi, lf)
    p1 = min(1.0, (psi + d) / (2 * psi))
    total = 0.0
    for m in np.flatnonzero(pm > 1e-16 * pm.max()):
        k = _critical(int(m), a, lf)
        if k > m:
            continue
        pa = _binomial_pmf(int(m), p1, lf)
        total += pm[m] * (pa[k:].sum() + pa[: m - k + 1].sum())
    return float(min(1.0, total))


def _psi_delta(discordance: float, difference: float) -> tuple[float, float]:
    psi = fraction("discordance", discordance, allow_zero=False)
    d = abs(real("difference", difference, -1, 1))
    if not 0 < d <= psi:
        raise ValueError(f"|difference| must be above 0 and at most the discordance {psi:g}, got {d:g}")
    return psi, d


def mcnemar_power(items: int, discordance: float, difference: float, alpha: float = 0.05) -> float:
    """Power of the two-sided McNemar test on ``items`` (normal approximation):
    Phi((sqrt(n) |delta| - z_{1-alpha/2} sqrt(psi)) / sqrt(psi - delta^2)); 1.0 when the per-item difference
    has no variance (psi = delta^2: every item discordant, all one way). Poor at a handful of discordant items
    (n psi small): use :func:`mcnemar_exact_power` there."""
    n = integer("items", items, 1)
    psi, d = _psi_delta(discordance, difference)
    za = _N.inv_cdf(1 - _alpha(alpha) / 2)
    var = psi - d * d
    if var <= 0:
        return 1.0
    return _N.cdf((math.sqrt(n) * d - za * math.sqrt(psi)) / math.sqrt(var))


def items_needed_paired(discordance: float, difference: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Items for the two-sided McNemar test to catch ``difference`` at ``power``:
    ((z_{1-alpha/2} sqrt(psi) + z_power sqrt(psi - delta^2)) / delta)^2."""
    psi, d = _psi_delta(discordance, difference)
    za, zb = _N.inv_cdf(1 - _alpha(alpha) / 2), _N.inv_cdf(_power(power))
    return ((za * math.sqrt(psi) + zb * math.sqrt(max(psi - d * d, 0.0))) / d) ** 2


def items_needed_paired_exact(discordance: float, difference: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Items for the exact two-sided McNemar test to catch ``difference`` at ``power``: the smallest n with
    :func:`mcnemar_exact_power` (n) >= power, by bisection (the exact power rises with n: n draws the
    discordant count Binomial(n, psi), which smooths the test's discreteness; the unit tests scan n to
    confirm). :func:`items_needed_paired` (Connor's normal approximation) is the explanation and the
    starting bracket; the two differ by a few items to tens of percent at the small n of one slice."""
    psi, d = _psi_delta(discordance, difference)
    a, pw = _alpha(alpha), _power(power)
    lo = max(mcnemar_min_discordant(a) - 1, 0)  # below the minimum discordant count the exact test never fires
    hi = max(lo + 1, math.ceil(items_needed_paired(psi, d, a, pw)))
    while mcnemar_exact_power(hi, psi, d, a) < pw:
        lo, hi = hi, 2 * hi
        if hi > 10**8:
            raise ValueError(f"the exact test needs more than 10^8 items for difference {d:g} at discordance {psi:g}")
    guess = int(0.8 * hi)  # a tighter lower bracket when the approximation overshoots by less than a fifth
    if lo < guess < hi and mcnemar_exact_power(guess, psi, d, a) < pw:
        lo = guess
    # power(lo) < pw <= power(hi), lo = 0 meaning none: the first n between with enough power, else hi
    return smallest_true(lambda n: mcnemar_exact_power(n, psi, d, a) >= pw, lo + 1, hi - 1)


def min_detectable_difference_paired(items: int, discordance: float, alpha: float = 0.05,
                                     power: float = 0.8) -> float:
    """The smallest accuracy difference the paired test on ``items`` catches at ``power``, for two
    models that disagree on ``discordance`` of the items (bisection on :func:`items_needed_paired`,
    which falls as delta grows); ``discordance`` itself when even a one-sided disagreement is not caught."""
    n = integer("items", items, 1)
    psi = fraction("discordance", discordance, allow_zero=False)
    _alpha(alpha), _power(power)
    if items_needed_paired(psi, psi, alpha, power) > n:
        return psi
    lo, hi = 0.0, psi
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid == 0 or items_needed_paired(psi, mid, alpha, power) > n:
            lo = mid
        else:
            hi = mid
    return hi


def min_detectable_difference_unpaired(items: int, accuracy: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest accuracy DROP from ``accuracy`` that two independent samples of ``items`` each catch
    at ``power`` with a two-sided test at ``alpha``: bisection on the per-arm two-sample size of
    :func:`lib.sre.canary.requests_needed` (error rates 1 - accuracy, one-sided at alpha / 2).
    Returns ``accuracy`` when even a drop to zero is not caught."""
    n = integer("items", items, 1)
    p = real("accuracy", accuracy, 0, 1, low_open=True, high_open=True)
    al, pw = _alpha(alpha), _power(power)
    e0 = 1 - p

    def need(drop: float) -> float:
        return canary.requests_needed(e0, min(e0 + drop, 1 - 1e-12), al / 2, pw, two_sample=True)

    if need(p * (1 - 1e-9)) > n:
        return p
    lo, hi = 0.0, p * (1 - 1e-9)
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid == 0 or need(mid) > n:
            lo = mid
        else:
            hi = mid
    return hi


def simulate_paired(items: int, acc_a: float, acc_b: float, discordance: float, runs: int = 1,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-item correctness of two models, ``runs`` benchmarks of ``items`` each: every item falls in
    one cell of the 2x2 table with :func:`cell_probabilities`. Returns boolean arrays (runs, items)."""
    n = integer("items", items, 1)
    r = integer("runs", runs, 1)
    p = cell_probabilities(acc_a, acc_b, discordance)
    rng = np.random.default_rng(integer("seed", seed, 0))
    cell = rng.choice(4, size=(r, n), p=p / p.sum())
    return (cell == 0) | (cell == 1), (cell == 0) | (cell == 2)


@dataclass(frozen=True)
class Bootstrap:
    """A paired bootstrap of acc_a - acc_b: the observed difference, the bootstrap SE, the percentile
    interval and the two-sided p-value (twice the share of resamples on the other side of zero)."""

    difference: float
    se: float
    low: float
    high: float
    p_value: float


def paired_bootstrap(cells: PairedCells, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> Bootstrap:
    """Resample the ``cells.items`` items with replacement ``resamples`` times (drawn as the multinomial of
    the four cell counts, which is exactly what resampling items does to the table) and read the
    difference's SE, percentile interval and a two-sided p-value."""
    if not isinstance(cells, PairedCells):
        raise ValueError("cells must be a PairedCells (see paired_cells)")
    b = integer("resamples", resamples, 100)
    c = real("confidence", confidence, 0, 1, low_open=True, high_open=True)
    n = cells.items
    freq = np.array([cells.both, cells.a_only, cells.b_only, cells.neither], dtype=float) / n
    draws = np.random.default_rng(integer("seed", seed, 0)).multinomial(n, freq, size=b)
    diff = (draws[:, 1] - draws[:, 2]) / n
    lo, hi = np.quantile(diff, [(1 - c) / 2, (1 + c) / 2])
    d0 = cells.difference
    other = np.mean(diff <= 0) if d0 > 0 else np.mean(diff >= 0) if d0 < 0 else 1.0
    return Bootstrap(d0, float(diff.std(ddof=1)), float(lo), float(hi), float(min(1.0, 2 * other)))


# ---- token level ------------------------------------------------------------------------------


def synthetic_logits(positions: int, vocab: int = 512, sharpness: float = 3.0, spread: float = 0.6,
                     seed: int = 0) -> np.ndarray:
    """Seeded reference logits (positions, vocab): Gaussian logits times a per-position sharpness
    drawn log-normal (median ``sharpness``, log-sd ``spread``), so most positions are confident and a
    minority are near ties, as in a language model's own next-token distributions."""
    t = integer("positions", positions, 1)
    v = integer("vocab", vocab, 2)
    s = real("sharpness", sharpness, 0, low_open=True)
    sp = real("spread", spread, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    scale = s * np.exp(sp * rng.standard_normal((t, 1)))
    return scale * rng.standard_normal((t, v))


def perturb_logits(logits, sigma, seed: int = 0) -> np.ndarray:
    """``logits`` plus independent Gaussian noise of standard deviation ``sigma`` (a number, or one per
    position): the logit error a quantized model adds, in logit units."""
    x = np.asarray(logits, dtype=float)
    if x.ndim != 2:
        raise ValueError(f"logits must be (positions, vocab), got shape {x.shape}")
    sg = np.asarray(sigma, dtype=float)
    if sg.ndim == 1:
        if sg.shape[0] != x.shape[0]:
            raise ValueError(f"sigma per position needs {x.shape[0]} values, got {sg.shape[0]}")
        sg = sg[:, None]
    elif sg.ndim != 0:
        raise ValueError("sigma must be a number or one value per position")
    if not np.all(np.isfinite(sg)) or np.any(sg < 0):
        raise ValueError("sigma must be finite and >= 0")
    rng = np.random.default_rng(integer("seed", seed, 0))
    return x + sg * rng.standard_normal(x.shape)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class TokenDivergence:
    """Per-position comparison of a changed model with its reference (arrays of length positions):
    kl = KL(ref || changed) in nats; flip: the greedy token differs; nll_ref / nll_changed: -log p of
    the scored token under each; margin: the reference's top-1 minus top-2 logit."""

    kl: np.ndarray
    flip: np.ndarray
    nll_ref: np.ndarray
    nll_changed: np.ndarray
    margin: np.ndarray

    @property
    def perplexity_ratio(self) -> float:
        """exp(mean nll_changed - mean nll_ref): the changed model's perplexity over the reference's."""
        return float(np.exp(self.nll_changed.mean() - self.nll_ref.mean()))


def token_divergence(ref_logits, changed_logits, tokens) -> TokenDivergence:
    """KL(ref || changed), greedy flips and the NLL of ``tokens`` (one token id per position) under the
    reference and the changed logits (both (positions, vocab))."""
    r, c = np.asarray(ref_logits, dtype=float), np.asarray(changed_logits, dtype=float)
    if r.ndim != 2 or r.shape != c.shape:
        raise ValueError(f"ref_logits and changed_logits must be (positions, vocab) of one shape, got {r.shape} and {c.shape}")
    tok = np.asarray(tokens)
    if tok.shape != (r.shape[0],) or tok.dtype.kind not in "iu" or tok.min() < 0 or tok.max() >= r.shape[1]:
        raise ValueError(f"tokens must be {r.shape[0]} integer ids in [0, {r.shape[1]})")
    lr, lc = _log_softmax(r), _log_softmax(c)
    kl = np.sum(np.exp(lr) * (lr - lc), axis=1)
    rows = np.arange(r.shape[0])
    top2 = np.sort(r, axis=1)[:, -2:]
    return TokenDivergence(np.maximum(kl, 0.0), r.argmax(axis=1) != c.argmax(axis=1), -lr[rows, tok], -lc[rows, tok],
                           top2[:, 1] - top2[:, 0])


def sample_tokens(logits, temperature: float = 1.0, seed: int = 0) -> np.ndarray:
    """One token per position drawn from softmax(logits / temperature) (Gumbel-max)."""
    x = np.asarray(logits, dtype=float)
    if x.ndim != 2:
        raise ValueError(f"logits must be (positions, vocab), got shape {x.shape}")
    t = real("temperature", temperature, 0, low_open=True)
    g = np.random.default_rng(integer("seed", seed, 0)).gumbel(size=x.shape)
    return np.argmax(x / t + g, axis=1)


# ---- deployment evaluations: slices, allocation, the reference's noise floor ----------------------


def pooled(shares, values) -> float:
    """The traffic-weighted mean of per-slice ``values`` (accuracy, difference or discordance):
    sum_c s_c v_c, the number an unsliced report shows (``shares`` add up to 1)."""
    s, v = np.asarray(shares, dtype=float), np.asarray(values, dtype=float)
    if s.ndim != 1 or s.shape != v.shape or s.size == 0:
        raise ValueError("shares and values must be non-empty 1-D lists of one length")
    if np.any(s < 0) or abs(s.sum() - 1) > 1e-6:
        raise ValueError(f"shares must be non-negative and add up to 1, got {list(s)}")
    return float(s @ v)


def allocate_items(shares, total: int, floor: int = 0) -> np.ndarray:
    """Items per slice for an evaluation of ``total`` items: every slice gets at least ``floor``
    (enough to see the regression that matters in it), the rest in proportion to ``shares``
    (largest remainders). Raises ValueError when the floors alone exceed ``total``."""
    s = np.asarray(shares, dtype=float)
    if s.ndim != 1 or s.size == 0 or np.any(s < 0) or abs(s.sum() - 1) > 1e-6:
        raise ValueError(f"shares must be non-negative and add up to 1, got {list(s)}")
    t = integer("total", total, 1)
    f = integer("floor", floor, 0)
    if f * s.size > t:
        raise ValueError(f"{s.size} slices x floor {f} = {f * s.size} items exceed total = {t}")
    free = t - f * s.size
    raw = free * s
    base = np.floor(raw).astype(int)
    left = free - int(base.sum())
    base[np.argsort(-(raw - base), kind="stable")[:left]] += 1
    return base + f


def discordance_excess_items(floor: float, candidate: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Items (per run) to tell a candidate's discordance with the reference, ``candidate``, from the
    reference's discordance with itself, ``floor`` (a rerun at the same settings): a one-sided
    two-proportion test, :func:`lib.sre.canary.requests_needed` with ``two_sample=True``."""
    return canary.requests_needed(floor, candidate, alpha, power, two_sample=True)
