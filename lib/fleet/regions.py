"""Regions and the loss of one: N-1 capacity, where the spare sits, and what a failover without it costs.

* :func:`rtt_ms`: round trip between two named regions (``fleet.region_rtt_ms``).
* :func:`neighbors`: for each region, the regions its users may fail over to within ``max_rtt_ms``.
* :func:`base_replicas`: ``ceil(L_i / (c u))`` per region: each region's own load at the planned
  utilization ``u``, ``c`` requests/s per replica when always busy (``1 / replica_s``).
* :func:`n_minus_one`: the smallest fleet that survives the loss of any one region: integers
  ``n_i >= base_i`` minimising ``sum n_i`` such that, for each region ``j``, its neighbours can take its
  load at the failover utilization ``u_f``: ``sum_{i in N(j)} (c u_f n_i - L_i) >= L_j`` (the lost load
  splits among the neighbours in any proportion, so one sum per failure is the whole condition). An
  exact branch and bound over the spare ``n_i - base_i``; :func:`n_minus_one_brute` enumerates every
  spare vector up to a bound (the oracle, for small instances).
* :func:`retry_arrivals`: the stampede: requests/s arriving at the survivors, second by second, when a
  region drops with ``in_flight`` requests open (Little's law, :func:`lib.scheduling.queueing.littles_law`)
  and each client retries once after a delay uniform on [0, ``spread_s``] (full jitter; an immediate
  retry is a spread of about one reconnect), on top of the moved steady rate; a seeded Monte Carlo.
  :func:`retry_peak_rate` is its closed form, ``new_rate + in_flight / spread_s``.
* :func:`shortfall`: the load (requests/s) that finds no capacity when region ``j`` fails and its
  neighbours run at ``u_f``; :func:`failover_budget`: the error budget a failover spends while that
  load is refused for ``detect_s + start_s`` (a replica start, :func:`lib.fleet.capacity.replica_start_s`),
  through :mod:`lib.sre.slo`.

SI units: requests per second, seconds; round trips in milliseconds as the table gives them.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from lib.inputs import integer, real

__all__ = ["NMinusOne", "REGIONS", "base_replicas", "failover_budget", "n_minus_one", "n_minus_one_brute", "neighbors",
           "retry_arrivals", "retry_peak_rate", "rtt_ms", "shortfall"]

REGIONS = ("us-east", "us-west", "eu-west", "ap-northeast", "eu-central")


def rtt_ms(a: str, b: str) -> float:
    """Round trip between regions ``a`` and ``b`` in ms (0 for a region with itself)."""
    from lib.registry import assumptions

    for r in (a, b):
        if r not in REGIONS:
            raise ValueError(f"unknown region {r!r}: known regions are {', '.join(REGIONS)}")
    if a == b:
        return 0.0
    table = assumptions.entry("fleet.region_rtt_ms")
    key = f"{a}--{b}" if f"{a}--{b}" in table else f"{b}--{a}"
    return float(table[key]["value"])


def neighbors(regions, max_rtt_ms: float, residency: dict | None = None) -> list[list[int]]:
    """For each region (by index), the other regions within ``max_rtt_ms`` of it. ``residency`` maps a
    region to the jurisdiction its users' data must stay in (``{"eu-west": "EU"}``): such a region fails
    over only to regions of the same jurisdiction, whatever the latency."""
    names = list(regions)
    m = real("max_rtt_ms", max_rtt_ms, 0, unit="ms")
    if len(set(names)) != len(names) or len(names) < 2:
        raise ValueError(f"regions must be at least two distinct names, got {names}")
    res = dict(residency or {})
    for r in res:
        if r not in names:
            raise ValueError(f"residency names {r!r}, which is not among the regions {names}")

    def allowed(a: str, b: str) -> bool:
        return a not in res or res.get(b) == res[a]

    return [[i for i, b in enumerate(names) if b != a and rtt_ms(a, b) <= m and allowed(a, b)] for a in names]


def _rates(rates) -> list[float]:
    if not isinstance(rates, (list, tuple)) or len(rates) < 2:
        raise ValueError(f"rates must be a list of at least two regions' requests/s, got {rates!r}")
    return [real(f"rates[{i}]", r, 0, unit="requests/s") for i, r in enumerate(rates)]


def _cap(per_replica_rate: float) -> float:
    return real("per_replica_rate", per_replica_rate, 0, low_open=True, unit="requests/s per replica")


def base_replicas(rates, per_replica_rate: float, utilization: float | None = None) -> list[int]:
    """ceil(L_i / (c u)) per region (at least 1 where L_i > 0; 0 for an empty region)."""
    from lib.fleet.capacity import default_utilization

    ls, c, u = _rates(rates), _cap(per_replica_rate), default_utilization(utilization)
    return [max(1, math.ceil(x / (c * u) - 1e-9)) if x > 0 else 0 for x in ls]


def _deficits(ls, n, nbrs, c, uf) -> list[float]:
    """Replicas still missing for each region's failure: (L_j + sum_N L_i) / (c u_f) - sum_N n_i."""
    return [(ls[j] + sum(ls[i] for i in nbrs[j])) / (c * uf) - sum(n[i] for i in nbrs[j]) for j in range(len(ls))]


@dataclass(frozen=True)
class NMinusOne:
    """The smallest fleet that survives any one region's loss (:func:`n_minus_one`)."""

    base: tuple[int, ...]
    replicas: tuple[int, ...]
    neighbors: tuple[tuple[int, ...], ...]

    @property
    def spare(self) -> tuple[int, ...]:
        return tuple(n - b for n, b in zip(self.replicas, self.base, strict=True))

    @property
    def total(self) -> int:
        return sum(self.replicas)

    @property
    def overhead(self) -> float:
        """Spare replicas over the base fleet."""
        return sum(self.spare) / sum(self.base)


def _check(rates, nbrs, per_replica_rate, utilization, failover_utilization):
    from lib.fleet.capacity import default_utilization

    ls, c, u = _rates(rates), _cap(per_replica_rate), default_utilization(utilization)
    uf = real("failover_utilization", failover_utilization, u, 1.0)
    if len(nbrs) != len(ls):
        raise ValueError(f"neighbors must list one entry per region ({len(ls)}), got {len(nbrs)}")
    for j, nb in enumerate(nbrs):
        if ls[j] > 0 and not nb:
            raise ValueError(f"region {j} has load but no region within the latency budget to fail over to: "
                             "raise max_rtt_ms or accept that its users see an outage")
    return ls, c, u, uf


@functools.lru_cache(maxsize=256)
def _dual_vertices(nbrs: tuple, first: int) -> tuple:
    """Vertices of the dual of the covering LP over the regions ``first..k-1``: y >= 0 on the failures some of
    them can help (0 elsewhere), sum of y over the failures each region helps <= 1. Any such y gives the lower
    bound y . deficits on the spare those regions must add (weak duality)."""
    import numpy as np

    k = len(nbrs)
    rows = [j for j in range(k) if any(r >= first for r in nbrs[j])]
    m = len(rows)
    if m == 0:
        return ((0.0,) * k,)
    a = [np.eye(m)[t] for t in range(m)]
    a += [np.array([1.0 if r in nbrs[j] else 0.0 for j in rows]) for r in range(first, k)]
    b = [0.0] * m + [1.0] * (k - first)
    out = []
    for sub in itertools.combinations(range(len(a)), m):
        mat = np.array([a[x] for x in sub])
        if abs(np.linalg.det(mat)) < 1e-9:
            continue
        y = np.linalg.solve(mat, np.array([b[x] for x in sub]))
        if (y >= -1e-9).all() and all(a[x] @ y <= b[x] + 1e-9 for x in range(m, len(a))):
            full = [0.0] * k
            for t, j in enumerate(rows):
                full[j] = float(max(0.0, y[t]))
            out.append(tuple(full))
    return tuple(sorted(set(out))) or ((0.0,) * k,)


def n_minus_one(rates, nbrs, per_replica_rate: float, failover_utilization: float, utilization: float | None = None,
                max_replicas: int = 100_000) -> NMinusOne:
    """Smallest sum n_i with n_i >= base_i and every failure covered (module doc), exactly, by branch and
    bound: regions in turn take a spare from the largest deficit they could help cover down to 0 (the
    last region takes exactly what is still missing); a greedy cover (one replica at a time to the region that
    lowers the most open deficits) is the first incumbent, and a branch is cut when its spare so far plus the
    largest of three lower bounds cannot beat the best found: the summed deficits of failures with no helper in
    common, all remaining deficits over the most failures one region's replica can help with, and the covering
    LP's bound from the vertices of its dual (weak duality)."""
    ls, c, u, uf = _check(rates, nbrs, per_replica_rate, utilization, failover_utilization)
    base = base_replicas(ls, c, u)
    k = len(ls)
    need = [math.ceil(d - 1e-9) for d in _deficits(ls, base, nbrs, c, uf)]  # spare each failure needs, integer
    covers = [[j for j in range(k) if i in nbrs[j]] for i in range(k)]
    top = [max([0] + [need[j] for j in covers[i]]) for i in range(k)]
    if sum(base) + max(0, max(need)) > max_replicas:
        raise ValueError(f"the fleet needs more than max_replicas = {max_replicas} replicas")
    best = [sum(max(0, need[j]) for j in range(k)) + 1, None]  # any cover costs at most the sum of the needs
    # a greedy cover first: an incumbent close to the optimum lets the bounds below cut most branches at once
    left0, greedy = [max(0, x) for x in need], [0] * k
    while max(left0) > 0:
        r = max(range(k), key=lambda x: (sum(1 for j in covers[x] if left0[j] > 0),
                                         sum(max(0, left0[j]) for j in covers[x])))
        if not any(left0[j] > 0 for j in covers[r]):
            break  # a failure nobody can help: the search below reports it
        greedy[r] += 1  # one replica at a time, to the region that lowers the most open deficits
        left0 = [left0[j] - 1 if j in covers[r] else left0[j] for j in range(k)]
    if max(left0) <= 0:
        best = [sum(greedy), greedy]

    key = tuple(tuple(nb) for nb in nbrs)
    duals = [_dual_vertices(key, i) for i in range(k + 1)]

    def packing_bound(i: int, left: list[int]) -> int:
        # failures whose remaining helpers (regions i..k-1) do not overlap must be paid separately
        total, taken = 0, set()
        for j in sorted(range(k), key=lambda x: -left[x]):
            helpers = {r for r in nbrs[j] if r >= i}
            if left[j] > 0 and not helpers & taken:
                total += left[j]
                taken |= helpers
        # one spare replica of region r lowers at most |covers[r]| deficits by one
        reach = max([1] + [sum(1 for j in covers[r] if left[j] > 0) for r in range(i, k)])
        # the LP bound by weak duality: y . left for every vertex y of {y >= 0, sum_{j helped by r} y_j <= 1}
        lp = max(sum(y[j] * left[j] for j in range(k)) for y in duals[i])
        return max(total, math.ceil(sum(left) / reach - 1e-9), math.ceil(lp - 1e-6))

    def search(i: int, spare: list[int], left: list[int], used: int) -> None:
        remaining = max([0] + left)
        if used + packing_bound(i, left) >= best[0]:
            return
        if remaining == 0:
            best[0], best[1] = used, spare + [0] * (k - i)
            return
        if i == k:
            return
        if i == k - 1:  # the last region takes exactly what is still missing where it helps
            if any(left[j] > 0 and j not in covers[i] for j in range(k)):
                return
            e = max([0] + [left[j] for j in covers[i]])
            if used + e < best[0]:
                best[0], best[1] = used + e, spare + [e]
            return
        # a failure none of the later regions can help with must be covered now
        for e in range(top[i], -1, -1) if any(left[j] > 0 for j in covers[i]) else (0,):
            new_left = [left[j] - e if j in covers[i] else left[j] for j in range(k)]
            if any(new_left[j] > 0 and all(r <= i for r in nbrs[j]) for j in range(k)):
                continue
            search(i + 1, spare + [e], [max(0, x) for x in new_left], used + e)

    search(0, [], [max(0, x) for x in need], 0)
    if best[1] is None:
        raise ValueError("no fleet survives every single-region loss with these neighbours")
    reps = tuple(b + e for b, e in zip(base, best[1], strict=True))
    return NMinusOne(tuple(base), reps, tuple(tuple(nb) for nb in nbrs))


def n_minus_one_brute(rates, nbrs, per_replica_rate: float, failover_utilization: float,
                      utilization: float | None = None, max_spare: int = 12) -> NMinusOne:
    """The oracle: every spare vector with entries 0..max_spare, the smallest total that covers every
    failure (ties: the first in lexicographic order is not guaranteed to match :func:`n_minus_one`)."""
    ls, c, u, uf = _check(rates, nbrs, per_replica_rate, utilization, failover_utilization)
    base = base_replicas(ls, c, u)
    best = None
    for spare in itertools.product(range(integer("max_spare", max_spare, 0) + 1), repeat=len(ls)):
        n = [b + e for b, e in zip(base, spare, strict=True)]
        if all(d <= 1e-9 for d in _deficits(ls, n, nbrs, c, uf)) and (best is None or sum(n) < sum(best)):
            best = n
    if best is None:
        raise ValueError(f"no cover with at most {max_spare} spare replicas per region")
    return NMinusOne(tuple(base), tuple(best), tuple(tuple(nb) for nb in nbrs))


def shortfall(rates, replicas, nbrs, lost: int, per_replica_rate: float, failover_utilization: float) -> float:
    """Requests/s of region ``lost`` that its neighbours cannot take at u_f:
    max(0, L_lost - sum_{i in N(lost)} (c u_f n_i - L_i)^+)."""
    ls, c = _rates(rates), _cap(per_replica_rate)
    uf = real("failover_utilization", failover_utilization, 0, 1.0, low_open=True)
    j = integer("lost", lost, 0, len(ls) - 1)
    if len(replicas) != len(ls):
        raise ValueError(f"replicas must give one count per region ({len(ls)})")
    room = sum(max(0.0, c * uf * replicas[i] - ls[i]) for i in nbrs[j])
    return max(0.0, ls[j] - room)


def failover_budget(unserved_rate: float, total_rate: float, duration_s: float, target: float,
                    window_s: float | None = None) -> float:
    """Fraction of the SLO window's error budget spent while ``unserved_rate`` of ``total_rate`` fails for
    ``duration_s``: budget_consumed(burn_rate(unserved / total, target), duration) (lib.sre.slo)."""
    from lib.sre import slo

    lost = real("unserved_rate", unserved_rate, 0, unit="requests/s")
    tot = real("total_rate", total_rate, 0, low_open=True, unit="requests/s")
    if lost > tot:
        raise ValueError(f"unserved_rate = {lost} exceeds total_rate = {tot}")
    d = real("duration_s", duration_s, 0, unit="seconds")
    return slo.budget_consumed(slo.burn_rate(lost / tot, target), d, window_s)


def retry_peak_rate(in_flight: float, new_rate: float, spread_s: float) -> float:
    """new_rate + in_flight / spread_s: the mean arrival rate while the retries of ``in_flight`` requests,
    spread uniformly over ``spread_s``, land on top of the moved steady rate."""
    k = real("in_flight", in_flight, 0, unit="requests")
    lam = real("new_rate", new_rate, 0, unit="requests/s")
    w = real("spread_s", spread_s, 0, low_open=True, unit="seconds")
    return lam + k / w


def retry_arrivals(in_flight: float, new_rate: float, spread_s: float, horizon_s: float = 60.0, seed: int = 0,
                   step_s: float = 1.0):
    """Arrivals per second at the survivors (array over ``horizon_s``): Poisson arrivals at ``new_rate`` plus
    round(in_flight) retries, each at a uniform time in [0, spread_s)."""
    import numpy as np

    k = int(round(real("in_flight", in_flight, 0, 1e7, unit="requests")))
    lam = real("new_rate", new_rate, 0, unit="requests/s")
    w = real("spread_s", spread_s, 0, low_open=True, unit="seconds")
    h = real("horizon_s", horizon_s, 1, 86_400, unit="seconds")
    dt = real("step_s", step_s, 0.01, h, unit="seconds")
    rng = np.random.default_rng(integer("seed", seed, 0))
    bins = int(math.ceil(h / dt - 1e-9))
    counts = rng.poisson(lam * dt, bins).astype(float)
    retries = rng.uniform(0, w, k)
    counts += np.bincount(np.minimum((retries // dt).astype(int), bins), minlength=bins + 1)[:bins]
    return counts / dt
