"""GPU quotas for a shared cluster: pooling, guarantees with borrowing, fair-share ordering with decay,
and the price of preemption (N046 gpu-quota-policy, N066 research-cluster-fair-share).

* Pooling (:func:`pooling`): teams whose GPU demand has mean ``mu_i`` and standard deviation
  ``sigma_i``. Sizing each team's static quota for its own ``z``-sigma peak takes
  ``sum(mu_i + z sigma_i)`` GPUs; one pool sized for the same ``z`` on the total takes
  ``sum(mu_i) + z sqrt(sum sigma_i^2)`` (independent demands, normal approximation).
  :func:`demand_series` draws demands (gamma, piecewise constant over blocks) and
  :func:`empirical_pooling` measures the same two fleets as quantiles (the Monte Carlo check).
* Allocation each hour (:func:`allocate`): ``"static"`` (each team capped at its quota),
  ``"free"`` (no quotas: running jobs keep their GPUs, and what frees up is split in proportion to the
  GPUs still asked for, so a team with a deep queue takes most of it)
  and ``"four_layer"``: each team first gets ``min(demand, guarantee)``; the rest is lent to unmet
  demand by weighted max-min (water-filling, weights from the fair-share factor); a borrower whose
  GPUs are needed back for a guarantee is preempted. :func:`run_policy` runs a demand series through
  one policy and counts utilization, guarantee misses and preemptions.
* Fair share (:func:`fair_share_factor`, the classic Slurm form): ``F = 2^(-U / S)`` with ``U`` a
  team's share of the cluster's (decayed) usage and ``S`` its share of the shares.
  :func:`decayed_usage` weighs past usage by ``2^(-age / half_life)``.
* Preemption (:func:`preemption_cost_s`): a preempted job loses the work since its last checkpoint
  (half an interval on average) plus its restart; the interval is Young's for the job's interruption
  rate (:func:`lib.training.reliability.young_interval_s`).

Units: GPUs, hours for the hourly simulation, seconds for the checkpoint arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["POLICIES", "Pooling", "PolicyRun", "allocate", "decayed_usage", "demand_series", "empirical_pooling",
           "fair_share_factor", "pooling", "preemption_cost_s", "recovery_days", "run_policy", "tree_allocate",
           "water_fill"]

POLICIES = ("static", "free", "four_layer")


@dataclass(frozen=True)
class Pooling:
    """GPUs for the same peak quantile sized per team (``static``) and as one pool (``pooled``)."""

    mean_total: float
    static: float
    pooled: float

    @property
    def static_utilization(self) -> float:
        return self.mean_total / self.static

    @property
    def pooled_utilization(self) -> float:
        return self.mean_total / self.pooled

    @property
    def saved(self) -> float:
        """Share of the static fleet pooling saves: 1 - pooled / static."""
        return 1 - self.pooled / self.static


def _arrays(means, cvs) -> tuple[np.ndarray, np.ndarray]:
    mu = np.asarray([real("mean", m, 0, low_open=True, unit="GPUs") for m in means], dtype=float)
    cv = np.asarray([real("cv", c, 0, unit="(std / mean)") for c in cvs], dtype=float)
    if mu.shape != cv.shape or mu.ndim != 1 or not len(mu):
        raise ValueError("means and cvs must be equal-length non-empty lists, one per team")
    return mu, cv


def pooling(means, cvs, z: float) -> Pooling:
    """Static versus pooled GPUs at ``z`` standard deviations above the mean (module doc)."""
    mu, cv = _arrays(means, cvs)
    zz = real("z", z, 0, unit="standard deviations")
    sd = mu * cv
    return Pooling(float(mu.sum()), float((mu + zz * sd).sum()), float(mu.sum() + zz * math.sqrt(float((sd ** 2).sum()))))


def demand_series(means, cvs, hours: int, seed: int, block_h: int = 6) -> np.ndarray:
    """GPU demand of each team each hour, shape (hours, teams): gamma with the team's mean and cv,
    redrawn every ``block_h`` hours (jobs last hours), independent across teams."""
    mu, cv = _arrays(means, cvs)
    h = integer("hours", hours, 1)
    b = integer("block_h", block_h, 1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    blocks = -(-h // b)
    out = np.empty((blocks, len(mu)))
    for k, (m, c) in enumerate(zip(mu, cv, strict=True)):
        out[:, k] = m if c == 0 else rng.gamma(1 / c ** 2, m * c ** 2, blocks)
    return np.repeat(out, b, axis=0)[:h]


def empirical_pooling(series: np.ndarray, q: float) -> Pooling:
    """The two fleets measured on a demand series: sum of each team's ``q`` quantile versus the ``q``
    quantile of the total."""
    qq = real("q", q, 0, 1)
    return Pooling(float(series.sum(axis=1).mean()), float(np.quantile(series, qq, axis=0).sum()),
                   float(np.quantile(series.sum(axis=1), qq)))


def fair_share_factor(usage, shares) -> np.ndarray:
    """Slurm's classic factor 2^(-U/S) per team: U = usage_i / sum(usage), S = shares_i / sum(shares)."""
    u = np.asarray(usage, dtype=float)
    s = np.asarray(shares, dtype=float)
    if u.shape != s.shape or np.any(u < 0) or np.any(s <= 0):
        raise ValueError("usage (>= 0) and shares (> 0) must be equal-length lists, one per team")
    un = u / u.sum() if u.sum() > 0 else np.zeros_like(u)
    return 2.0 ** (-un / (s / s.sum()))


def decayed_usage(usage_by_day, half_life_days: float) -> np.ndarray:
    """Usage weighed by age: sum_k usage[k] 2^(-age_k / H), the last row the most recent day (age 0).
    ``usage_by_day``: shape (days,) or (days, teams)."""
    u = np.asarray(usage_by_day, dtype=float)
    hl = real("half_life_days", half_life_days, 0, low_open=True, unit="days")
    ages = np.arange(len(u))[::-1]
    w = 2.0 ** (-ages / hl)
    return np.tensordot(w, u, axes=(0, 0))


def water_fill(capacity: float, want: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted max-min fair split of ``capacity`` among ``want``: raise a common level ``x``; each gets
    min(want_i, x w_i). Returns the allocation (sums to min(capacity, sum(want)))."""
    want = np.asarray(want, dtype=float)
    w = np.asarray(weights, dtype=float)
    c = max(0.0, float(capacity))
    if want.sum() <= c + 1e-12:
        return want.copy()
    alloc = np.zeros_like(want)
    active = want > 0
    while c > 1e-12 and active.any():
        level = c / w[active].sum()
        need = want - alloc
        full = active & (need <= level * w + 1e-12)
        if full.any():
            c -= need[full].sum()
            alloc[full] = want[full]
            active &= ~full
        else:
            alloc[active] += level * w[active]
            c = 0.0
    return alloc


def allocate(capacity: float, demand: np.ndarray, guarantees: np.ndarray, policy: str,
             weights: np.ndarray | None = None, held: np.ndarray | None = None) -> np.ndarray:
    """GPUs each team gets for one hour under ``policy`` (module doc). ``held``: last hour's allocation
    (the free-for-all keeps running jobs and hands out only what is free)."""
    d = np.asarray(demand, dtype=float)
    g = np.asarray(guarantees, dtype=float)
    if policy == "static":
        return np.minimum(d, g)
    if policy == "free":
        keep = np.minimum(d, np.zeros_like(d) if held is None else np.asarray(held, dtype=float))
        want = d - keep
        free = max(0.0, capacity - keep.sum())
        return keep + (want * min(1.0, free / want.sum()) if want.sum() > 0 else want)
    if policy == "four_layer":
        base = np.minimum(d, g)
        w = np.ones_like(d) if weights is None else np.asarray(weights, dtype=float)
        return base + water_fill(capacity - base.sum(), d - base, w)
    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


@dataclass(frozen=True)
class PolicyRun:
    """One policy over a demand series: ``alloc`` (hours, teams), ``utilization`` (allocated / capacity),
    ``guarantee_met`` (per team: share of hours it got min(demand, guarantee)), ``served`` (per team:
    allocated / demanded), ``preempted_gpu_h`` (GPU-hours of running work taken away while still wanted)
    and ``preemptions`` (GPUs taken back, summed over hours)."""

    policy: str
    alloc: np.ndarray
    utilization: float
    guarantee_met: np.ndarray
    served: np.ndarray
    preemptions: float


def run_policy(series: np.ndarray, capacity: float, guarantees, policy: str, shares=None,
               half_life_h: float | None = None) -> PolicyRun:
    """Run a demand series (hours, teams) through ``policy``. For ``"four_layer"`` the borrowing
    weights are ``shares x`` the fair-share factor of usage decayed with ``half_life_h`` (None: shares
    only). A preemption is a GPU a team held last hour, still wants, and no longer has."""
    d = np.asarray(series, dtype=float)
    g = np.asarray(guarantees, dtype=float)
    cap = real("capacity", capacity, 0, low_open=True, unit="GPUs")
    s = np.ones(d.shape[1]) if shares is None else np.asarray(shares, dtype=float)
    usage = np.zeros(d.shape[1])
    decay = 1.0 if half_life_h is None else 2.0 ** (-1.0 / real("half_life_h", half_life_h, 0, low_open=True))
    alloc = np.zeros_like(d)
    pre = 0.0
    for t in range(len(d)):
        w = s if half_life_h is None or usage.sum() == 0 else s * fair_share_factor(usage, s)
        a = allocate(cap, d[t], g, policy, w, alloc[t - 1] if t else None)
        if t:
            pre += float(np.maximum(0.0, np.minimum(alloc[t - 1], d[t]) - a).sum())
        alloc[t] = a
        usage = usage * decay + a
    want_g = np.minimum(d, g)
    met = np.mean(alloc >= want_g - 1e-9, axis=0)
    served = alloc.sum(axis=0) / np.maximum(d.sum(axis=0), 1e-12)
    return PolicyRun(policy, alloc, float(alloc.sum() / (cap * len(d))), met, served, pre)


def preemption_cost_s(n_gpus: int, checkpoint_s: float, restart_s: float, preemptions_per_day: float = 0.0,
                      rate_per_gpu_s: float | None = None) -> tuple[float, float]:
    """(checkpoint interval, lost seconds per preemption) for a job of ``n_gpus``: the interval is
    Young's for its interruptions (hardware failures at ``rate_per_gpu_s`` per GPU, default the book's
    Llama 3 rate, plus ``preemptions_per_day``), and a preemption loses half an interval plus the restart."""
    from lib.training.reliability import failure_rate_per_gpu_s, young_interval_s

    n = integer("n_gpus", n_gpus, 1)
    r = failure_rate_per_gpu_s() if rate_per_gpu_s is None else real("rate_per_gpu_s", rate_per_gpu_s, 0)
    rate = n * r + real("preemptions_per_day", preemptions_per_day, 0) / 86400.0
    tau = young_interval_s(real("checkpoint_s", checkpoint_s, 0, low_open=True), 1.0 / rate)
    return tau, tau / 2 + real("restart_s", restart_s, 0)


def tree_allocate(node: dict, capacity: float, weight_of=None) -> dict:
    """Split ``capacity`` GPUs down a quota tree. A node is ``{"name", "guarantee", "children"}`` or a
    leaf ``{"name", "guarantee", "demand"}``. At each node every child first gets
    ``min(subtree demand, guarantee)``; what is left is lent to the children still short, by weighted
    max-min (weights: ``weight_of(child)``, default the guarantee), and each child's amount is split
    among its own children the same way. Borrowing therefore stays inside a team before it crosses
    teams. Returns {leaf name: GPUs}."""
    def demand(n):
        return float(n["demand"]) if "children" not in n else sum(demand(c) for c in n["children"])

    if "children" not in node:
        return {node["name"]: min(float(capacity), demand(node))}
    kids = node["children"]
    if not kids:
        raise ValueError(f"node {node.get('name')!r} has an empty children list")
    d = np.array([demand(c) for c in kids])
    g = np.array([real(f"guarantee of {c.get('name')!r}", c["guarantee"], 0) for c in kids])
    base = np.minimum(d, g)
    if base.sum() > capacity + 1e-9:  # guarantees sold beyond the node: scale them down
        base = base * capacity / base.sum()
    w = np.array([max(1e-9, float(weight_of(c)) if weight_of else float(c["guarantee"]) or 1e-9) for c in kids])
    share = base + water_fill(capacity - base.sum(), d - base, w)
    out: dict = {}
    for c, amount in zip(kids, share, strict=True):
        out.update(tree_allocate(c, float(amount), weight_of))
    return out


def recovery_days(usage_share: float, fair_share: float, half_life_days: float) -> float:
    """Days of no further usage until a burst that left a team at ``usage_share`` of the decayed usage
    decays to its ``fair_share`` (the others' usage steady): solves
    ``usage_share 2^(-t/H) / (usage_share 2^(-t/H) + 1 - usage_share) = fair_share``; 0 if already below."""
    u = real("usage_share", usage_share, 0, 1, high_open=True)
    f = real("fair_share", fair_share, 0, 1, low_open=True, high_open=True)
    h = real("half_life_days", half_life_days, 0, low_open=True, unit="days")
    if u <= f:
        return 0.0
    # x = u 2^(-t/H): x / (x + 1 - u) = f  ->  x = f (1 - u) / (1 - f)
    return h * math.log2(u * (1 - f) / (f * (1 - u)))
