"""Tail-latency arithmetic: one home for the few formulas every p99 investigation uses.

* :func:`mixture_quantile`: the q-quantile of a mixture of populations given as samples with
  weights (a healthy majority and an affected minority), exact on the weighted empirical CDF;
* :func:`affected_share_to_exceed`: the smallest share f of requests an effect must reach to push
  the q-quantile past a latency T, ``f > (1 - q - s_b) / (s_a - s_b)`` with s_b, s_a the shares of
  healthy and affected requests above T; with s_b = 0 and s_a = 1 it is ``1 - q`` (0.01 for p99);
* :func:`p_hit_any`: the probability that a request of n steps meets at least one slow step,
  ``1 - (1 - p)^n``, and :func:`step_probability_for` its inverse;
* :func:`quantile_exceeded`: whether a quantile q is owned by an effect that reaches a share f of
  requests (``f > 1 - q``), the verdict a page prints;
* :func:`expected_search_cost` and :func:`best_search_order`: the expected time to find the cause
  when suspects are checked one after the other (probability p_i, cost c_i); the order by
  decreasing p_i / c_i is optimal (the classic search result), and the brute force over every order
  is the test's oracle.
Units: seconds where times appear; shares and probabilities in [0, 1].
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from lib.inputs import fraction, integer, real

__all__ = ["affected_share_to_exceed", "best_search_order", "expected_search_cost", "mixture_quantile", "p_hit_any",
           "quantile_exceeded", "step_probability_for"]


def _q(q: float) -> float:
    q = real("q", q, 0, 1, low_open=True, high_open=True)
    return q


def mixture_quantile(q: float, parts: Sequence[tuple[float, Sequence[float]]]) -> float:
    """The q-quantile of a mixture: ``parts`` = [(weight, samples), ...], weights >= 0 summing to 1
    (a part's samples share its weight equally). Exact on the weighted empirical CDF: the smallest
    sample x with P(X <= x) >= q."""
    q = _q(q)
    if not parts:
        raise ValueError("parts must hold at least one (weight, samples) pair")
    xs, ws = [], []
    total = 0.0
    for w, s in parts:
        w = fraction("weight", w)
        arr = np.asarray(s, dtype=float).ravel()
        if w > 0:
            if arr.size == 0 or not np.isfinite(arr).all():
                raise ValueError("each part with a weight > 0 needs finite samples")
            xs.append(arr)
            ws.append(np.full(arr.size, w / arr.size))
        total += w
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        raise ValueError(f"weights must sum to 1, got {total!r}")
    x = np.concatenate(xs)
    w = np.concatenate(ws)
    order = np.argsort(x, kind="stable")
    cdf = np.cumsum(w[order])
    i = int(np.searchsorted(cdf, q - 1e-12, side="left"))
    return float(x[order][min(i, len(x) - 1)])


def affected_share_to_exceed(q: float, healthy_above: float = 0.0, affected_above: float = 1.0) -> float:
    """The share f of requests an effect must reach for the q-quantile to exceed a latency T.

    ``healthy_above`` (s_b) and ``affected_above`` (s_a): the shares of healthy and of affected
    requests slower than T. The mixture's share above T is (1 - f) s_b + f s_a, and the q-quantile
    exceeds T once that share is above 1 - q: f > (1 - q - s_b) / (s_a - s_b). Returns that bound
    (0 when the healthy requests alone already exceed it; inf when the affected ones cannot).
    """
    q = _q(q)
    sb = fraction("healthy_above", healthy_above)
    sa = fraction("affected_above", affected_above)
    need = 1 - q - sb
    if need < 0:
        return 0.0
    if sa <= sb:
        return math.inf
    f = need / (sa - sb)
    return f if f <= 1 else math.inf


def quantile_exceeded(q: float, share: float) -> bool:
    """Whether an effect reaching ``share`` of requests, all of them slower than every healthy one,
    owns the q-quantile: share > 1 - q."""
    return fraction("share", share) > 1 - _q(q)


def p_hit_any(p: float, n: int | float) -> float:
    """Probability that a request of ``n`` independent steps meets at least one slow step, each slow
    with probability ``p``: 1 - (1 - p)^n (computed as -expm1(n log1p(-p)) for small p)."""
    p = fraction("p", p)
    n = real("n", n, 0, unit="steps")
    if p == 1:
        return 1.0 if n > 0 else 0.0
    return float(-math.expm1(n * math.log1p(-p)))


def step_probability_for(p_request: float, n: int | float) -> float:
    """The per-step probability that makes a request of ``n`` steps meet a slow step with probability
    ``p_request``: 1 - (1 - p_request)^(1 / n)."""
    pr = fraction("p_request", p_request)
    n = real("n", n, 0, low_open=True, unit="steps")
    if pr == 1:
        return 1.0
    return float(-math.expm1(math.log1p(-pr) / n))


def expected_search_cost(order: Sequence[int], p: Sequence[float], cost: Sequence[float]) -> float:
    """Expected cost (s) of checking suspects in ``order`` until the cause is found: suspect i is the
    cause with probability p_i (summing to 1) and checking it costs c_i; checks stop at the cause:
    E = sum_k c_(k) P(cause not among the first k - 1) = sum_k c_(k) (1 - sum_(j<k) p_(j))."""
    p = [fraction("p", x) for x in p]
    c = [real("cost", x, 0, unit="seconds") for x in cost]
    if len(p) != len(c) or not p:
        raise ValueError("p and cost must be non-empty and of the same length")
    if not math.isclose(sum(p), 1.0, abs_tol=1e-9):
        raise ValueError(f"p must sum to 1, got {sum(p)!r}")
    if sorted(order) != list(range(len(p))):
        raise ValueError(f"order must be a permutation of 0..{len(p) - 1}, got {list(order)!r}")
    left, total = 1.0, 0.0
    for i in order:
        total += c[i] * left
        left -= p[i]
    return total


def best_search_order(p: Sequence[float], cost: Sequence[float], *, brute_force: bool = False) -> list[int]:
    """The order of checks with the least :func:`expected_search_cost`: decreasing p_i / c_i (ties by
    index; a free check first). ``brute_force``: try every permutation instead (the oracle; up to 8)."""
    if brute_force:
        n = integer("suspects", len(p), 1, 8)
        return list(min(itertools.permutations(range(n)), key=lambda o: (expected_search_cost(o, p, cost), o)))
    expected_search_cost(list(range(len(p))), p, cost)  # validates
    return sorted(range(len(p)), key=lambda i: (-(p[i] / cost[i]) if cost[i] > 0 else -math.inf, i))
