"""Canary sizing: how many requests a verdict needs to catch a regression, and the staged rollout
built around that number.

A regression is a rate that moves from ``p0`` (the baseline, known from the fleet's much larger
traffic) to ``p1``: an error rate (0.1% -> 0.2%), or the fraction of requests slower than the
baseline's p99 (1% -> 2%: a latency regression read as a rate). The canary counts bad requests X
among n and alarms when X is improbably high under ``p0`` (one-sided, false-alarm rate ``alpha``).

* Normal approximation (:func:`requests_needed`):
  n = ((z_{1-alpha} sqrt(p0 q0) + z_{power} sqrt(p1 q1)) / (p1 - p0))^2, q = 1 - p;
  for a concurrent control arm of equal size (two-sample), n per arm =
  ((z_{1-alpha} sqrt(2 pbar qbar) + z_{power} sqrt(p0 q0 + p1 q1)) / (p1 - p0))^2.
* Exact binomial test (:func:`critical_count`, :func:`power_exact`, :func:`requests_needed_exact`):
  alarm when X >= c, c the smallest count with P(X >= c | p0) <= alpha; power P(X >= c | p1).
* A stage that routes ``share`` of ``qps`` collects n requests in n / (share qps) seconds
  (:func:`stage_s`); a rollout of k verdicts, each at ``alpha``, false-alarms with probability
  1 - (1 - alpha)^k (:func:`false_alarm`).

SI units: seconds, requests per second; rates and probabilities in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = ["Stage", "binomial_sf", "critical_count", "detectable_rate", "detection_monte_carlo", "false_alarm", "power_exact",
           "power_normal", "requests_needed", "requests_needed_exact", "rollout_plan", "stage_s", "z_value"]

_N = NormalDist()
MAX_EXACT_N = 2_000_000


def z_value(prob: float) -> float:
    """The standard normal quantile: P(Z <= z) = prob (1.645 at 0.95, 0.842 at 0.80)."""
    p = real("prob", prob, 0, 1, low_open=True, high_open=True, unit="(probability)")
    return _N.inv_cdf(p)


def _rates(p0: float, p1: float) -> tuple[float, float]:
    a = real("p0", p0, 0, 1, low_open=True, high_open=True, unit="(baseline rate)")
    b = real("p1", p1, 0, 1, low_open=True, high_open=True, unit="(regressed rate)")
    if not b > a:
        raise ValueError(f"p1 must exceed p0 (a regression raises the bad rate); got p0={a}, p1={b}")
    return a, b


def _alpha_power(alpha: float, power: float) -> tuple[float, float]:
    a = real("alpha", alpha, 0, 0.5, low_open=True, unit="(false-alarm probability, below 0.5)")
    pw = real("power", power, 0.5, 1, high_open=True, unit="(detection probability, 0.5 to below 1)")
    return a, pw


def requests_needed(p0: float, p1: float, alpha: float = 0.05, power: float = 0.8, two_sample: bool = False) -> float:
    """Requests per verdict (normal approximation) for a one-sided test to catch ``p0 -> p1`` with
    false-alarm rate ``alpha`` and detection probability ``power``: against a known baseline, or per
    arm against a concurrent control of the same size (``two_sample``). See the module docstring."""
    a0, a1 = _rates(p0, p1)
    al, pw = _alpha_power(alpha, power)
    za, zb = z_value(1 - al), z_value(pw)
    if two_sample:
        pbar = (a0 + a1) / 2
        num = za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(a0 * (1 - a0) + a1 * (1 - a1))
    else:
        num = za * math.sqrt(a0 * (1 - a0)) + zb * math.sqrt(a1 * (1 - a1))
    return (num / (a1 - a0)) ** 2


def power_normal(n: float, p0: float, p1: float, alpha: float = 0.05) -> float:
    """Detection probability of the one-sided test on ``n`` requests (normal approximation):
    Phi((sqrt(n) (p1 - p0) - z_{1-alpha} sqrt(p0 q0)) / sqrt(p1 q1))."""
    a0, a1 = _rates(p0, p1)
    n = real("n", n, 0, low_open=True, unit="requests")
    za = z_value(1 - real("alpha", alpha, 0, 0.5, low_open=True, unit="(false-alarm probability)"))
    return _N.cdf((math.sqrt(n) * (a1 - a0) - za * math.sqrt(a0 * (1 - a0))) / math.sqrt(a1 * (1 - a1)))


def detectable_rate(n: float, p0: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest regressed rate p1 that ``n`` requests catch with ``power`` (normal approximation,
    bisection on :func:`power_normal`, which rises with p1); 1.0 when even p1 -> 1 is not caught."""
    n = real("n", n, 0, low_open=True, unit="requests")
    a0 = real("p0", p0, 0, 1, low_open=True, high_open=True, unit="(baseline rate)")
    al, pw = _alpha_power(alpha, power)
    lo, hi = a0, 1.0 - 1e-12
    if power_normal(n, a0, hi, al) < pw:
        return 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power_normal(n, a0, mid, al) < pw else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return hi


def _log_pmf(n: int, p: float) -> np.ndarray:
    """log P(X = k), k = 0..n, X ~ Binomial(n, p), by the ratio recursion (no factorials)."""
    k = np.arange(1, n + 1, dtype=float)
    steps = np.log((n - k + 1) / k) + math.log(p) - math.log1p(-p)
    return np.concatenate([[n * math.log1p(-p)], n * math.log1p(-p) + np.cumsum(steps)])


def _sf_all(n: int, p: float) -> np.ndarray:
    """P(X >= k) for k = 0..n (a reversed cumulative sum of the pmf)."""
    lp = _log_pmf(n, p)
    pmf = np.exp(lp - lp.max()) * math.exp(lp.max())
    return np.minimum(1.0, np.cumsum(pmf[::-1])[::-1])


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    n = integer("n", n, 1, MAX_EXACT_N, unit="requests")
    k = integer("k", k, 0, n + 1, unit="bad requests")
    p = real("p", p, 0, 1, low_open=True, high_open=True, unit="(rate)")
    return 0.0 if k > n else float(_sf_all(n, p)[k])


def critical_count(n: int, p0: float, alpha: float = 0.05) -> int:
    """The smallest count c with P(X >= c | n, p0) <= alpha: the canary alarms at c bad requests or more
    (n + 1 when even all n bad would not reach significance)."""
    n = integer("n", n, 1, MAX_EXACT_N, unit="requests")
    p0 = real("p0", p0, 0, 1, low_open=True, high_open=True, unit="(baseline rate)")
    al = real("alpha", alpha, 0, 0.5, low_open=True, unit="(false-alarm probability)")
    sf = _sf_all(n, p0)
    ok = np.flatnonzero(sf <= al)
    return int(ok[0]) if ok.size else n + 1


def power_exact(n: int, p0: float, p1: float, alpha: float = 0.05) -> float:
    """Detection probability of the exact one-sided binomial test on ``n`` requests: P(X >= c | p1)."""
    a0, a1 = _rates(p0, p1)
    c = critical_count(n, a0, alpha)
    return 0.0 if c > n else float(_sf_all(int(n), a1)[c])


def requests_needed_exact(p0: float, p1: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """The smallest n whose exact binomial test reaches ``power`` (scanned upward from below the normal
    approximation; the exact power is a sawtooth in n, so this is the first n that reaches it)."""
    a0, a1 = _rates(p0, p1)
    al, pw = _alpha_power(alpha, power)
    approx = requests_needed(a0, a1, al, pw)
    if approx > MAX_EXACT_N / 2:
        raise ValueError(f"the exact search is limited to about {MAX_EXACT_N // 2:,} requests; this regression needs "
                         f"about {approx:,.0f}: use requests_needed (normal approximation)")
    n = max(1, int(0.7 * approx))
    stride = max(1, int(approx / 400))
    while power_exact(n, a0, a1, al) < pw:  # coarse pass, then step back and walk by one
        n += stride
    for m in range(max(1, n - 4 * stride), n + 1):
        if power_exact(m, a0, a1, al) >= pw:
            return m
    return n


def detection_monte_carlo(n: int, p0: float, p1: float, alpha: float = 0.05, trials: int = 20000,
                          seed: int = 0) -> tuple[float, float]:
    """(false-alarm rate, detection rate) of the exact test on ``n`` requests by simulation: ``trials``
    canaries drawn at ``p0`` and at ``p1``, each alarming at the critical count."""
    a0, a1 = _rates(p0, p1)
    trials = integer("trials", trials, 1, unit="simulated canaries")
    rng = np.random.default_rng(integer("seed", seed, 0))
    c = critical_count(n, a0, alpha)
    return (float(np.mean(rng.binomial(n, a0, trials) >= c)), float(np.mean(rng.binomial(n, a1, trials) >= c)))


def stage_s(requests: float, share: float, qps: float) -> float:
    """Seconds for a stage routing ``share`` of ``qps`` to collect ``requests``: requests / (share qps)."""
    r = real("requests", requests, 0, unit="requests")
    s = fraction("share", share, allow_zero=False)
    return r / (s * real("qps", qps, 0, low_open=True, unit="requests per second"))


def false_alarm(alpha: float, tests: int) -> float:
    """Probability that at least one of ``tests`` independent verdicts at ``alpha`` alarms on a good
    release: 1 - (1 - alpha)^tests."""
    al = real("alpha", alpha, 0, 1, unit="(false-alarm probability)")
    return 1.0 - (1.0 - al) ** integer("tests", tests, 0, unit="verdicts")


@dataclass(frozen=True)
class Stage:
    """One rollout stage: the traffic share, the requests its verdict needs, and how long it runs (the
    longer of collecting them and the minimum bake time)."""

    share: float
    requests: float
    collect_s: float
    duration_s: float


def rollout_plan(shares, requests: float, qps: float, min_stage_s: float = 0.0) -> tuple[Stage, ...]:
    """The stages of a rollout that needs ``requests`` per verdict at each share in ``shares`` (increasing,
    each in (0, 1)); each runs max(stage_s, ``min_stage_s``). The full rollout after the last is not a stage."""
    sh = [fraction("share", s, allow_zero=False) for s in shares]
    if not sh or any(s >= 1 for s in sh) or any(b <= a for a, b in zip(sh, sh[1:], strict=False)):
        raise ValueError(f"shares must be a non-empty increasing list of fractions below 1; got {list(shares)}")
    m = real("min_stage_s", min_stage_s, 0, unit="seconds")
    out = []
    for s in sh:
        t = stage_s(requests, s, qps)
        out.append(Stage(s, float(requests), t, max(t, m)))
    return tuple(out)
