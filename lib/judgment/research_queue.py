"""The arithmetic under the research-platform behavioral answers (N079 saying-no-to-researchers,
N089 platform-tool-adoption, N083 holding-a-review-line): a shared GPU pool's queue made visible,
the idle slot a small run fits into now, a fast lane for small jobs, and a measured rollout.

* A pool of ``cluster_gpus`` GPUs runs gang-scheduled jobs (a job holds all its GPUs from start to
  end) in strict FIFO order: :func:`fifo_starts` gives each queued job's start given the running
  jobs' remaining times (an event loop over job ends). :func:`pool_snapshot` draws a seeded pool:
  running jobs that fill it and a queue behind them.
* The idle slot (:func:`free_profile`, :func:`slot_window_s`): GPUs that FIFO cannot give to the
  head of the queue (it needs more) stay idle until enough add up; a job that fits under the free
  profile delays nobody (conservative backfill, Mu'alem and Feitelson 2001, "Utilization,
  predictability, workloads, and user runtime estimates in scheduling the IBM SP2 with
  backfilling", IEEE TPDS 12(6)). :func:`pilot_run` sizes a scaled-down run for such a slot.
* Quotas (:func:`quota_now`): the GPUs a request gets this hour under guarantees with borrowing and
  fair-share ordering, by :func:`lib.fleet.quotas.allocate` (policy ``"four_layer"``).
* The pool as one server of GPU-time (the fluid view): a job of g GPUs for d seconds is
  g d / G seconds of the whole pool. Its mean wait at utilization rho is Pollaczek-Khinchine's
  (:func:`lib.scheduling.queueing.mg1_mean_wait_s`): :func:`pool_mean_wait_s`. Gang packing
  wastes GPUs the fluid view does not, so a real FIFO pool waits longer.
* A fast lane (:func:`fast_lane_waits`): small jobs and large ones share one FIFO server, or a
  share ``f`` of it is reserved for small jobs (two M/G/1 queues at speeds f and 1 - f); the
  small jobs' mean wait under each, by Pollaczek-Khinchine.
* A rollout's measured effect (:func:`diff_ci`): the difference of two proportions (job success
  with and without a tool) or of two means (time to first result) with its normal-approximation
  confidence interval; :func:`adoption_trial` draws a seeded randomized rollout to check it.

SI units: seconds, GPUs, GPU-seconds; display converts.
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from lib.inputs import fraction, integer, real
from lib.registry import assumptions
from lib.scheduling import queueing

__all__ = ["BlastRadius", "Job", "Pilot", "Snapshot", "adoption_trial", "blast_radius", "diff_ci", "fast_lane_sample", "fast_lane_waits", "fifo_starts",
           "free_profile",
           "gpu_s", "job_mix", "job_sizes", "pilot_run", "pool_mean_wait_s", "pool_snapshot", "power_of_two_floor",
           "quota_now", "slot_window_s", "verdict_requests"]

_N = NormalDist()


@functools.cache
def job_mix() -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(GPUs, share of jobs) of the sizes a research pool runs: ``judgment.research_job_gpus`` and
    ``judgment.research_job_gpu_weights`` in data/assumptions.yaml."""
    g = tuple(int(x) for x in assumptions.value("judgment.research_job_gpus"))
    w = tuple(float(x) for x in assumptions.value("judgment.research_job_gpu_weights"))
    if len(g) != len(w) or abs(sum(w) - 1) > 1e-9:
        raise ValueError("judgment.research_job_gpus and research_job_gpu_weights must pair up, weights summing to 1")
    return g, w


@dataclass(frozen=True)
class Job:
    """A gang-scheduled job: its ``owner`` (a team), ``gpus`` held, ``duration_s`` (for a running job:
    the time it still has to run)."""

    owner: str
    gpus: int
    duration_s: float

    @property
    def gpu_s(self) -> float:
        return self.gpus * self.duration_s


def gpu_s(jobs) -> float:
    """GPU-seconds of a list of jobs: sum of gpus x duration."""
    return float(sum(j.gpus * j.duration_s for j in jobs))


@dataclass(frozen=True)
class Snapshot:
    """A pool at one moment: ``running`` jobs (remaining durations) and the FIFO ``queued`` behind them."""

    cluster_gpus: int
    running: tuple[Job, ...]
    queued: tuple[Job, ...]

    @property
    def busy_gpus(self) -> int:
        return sum(j.gpus for j in self.running)


def job_sizes(n: int, mean_job_s: float, sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(gpus, duration_s) of ``n`` jobs: GPUs and their shares from :func:`job_mix`,
    durations log-normal with mean ``mean_job_s`` and log-sd ``sigma`` (independent of the GPUs)."""
    n = integer("n", n, 1)
    m = real("mean_job_s", mean_job_s, 0, low_open=True, unit="seconds")
    s = real("sigma", sigma, 0, 3, unit="(log-sd)")
    rng = np.random.default_rng(integer("seed", seed, 0))
    sizes, weights = job_mix()
    g = rng.choice(np.array(sizes), size=n, p=np.array(weights))
    d = m * np.exp(s * rng.standard_normal(n) - s * s / 2)
    return g.astype(int), d


def pool_snapshot(cluster_gpus: int, owners, n_queued: int, mean_job_s: float, seed: int,
                  sigma: float = 1.0) -> Snapshot:
    """A seeded pool: jobs drawn by :func:`job_sizes` start running until the next would not fit (each
    has run a uniform share of its duration, so the remaining time is the rest), then ``n_queued`` more
    wait in FIFO order. ``owners``: team names, drawn uniformly for each job."""
    sizes = job_mix()[0]
    g = integer("cluster_gpus", cluster_gpus, max(sizes), unit="GPUs")
    names = list(owners)
    if not names:
        raise ValueError("owners must name at least one team")
    k = integer("n_queued", n_queued, 0, 200, unit="jobs")
    gpus, dur = job_sizes(g // min(sizes) + k + 1, mean_job_s, sigma, seed)
    rng = np.random.default_rng(seed + 1)
    who = rng.integers(0, len(names), len(gpus))
    done = rng.random(len(gpus))
    running, used, i = [], 0, 0
    while i < len(gpus) and used + gpus[i] <= g:
        running.append(Job(names[who[i]], int(gpus[i]), float(dur[i] * (1 - done[i]))))
        used += int(gpus[i])
        i += 1
    queued = [Job(names[who[j]], int(gpus[j]), float(dur[j])) for j in range(i, i + k)]
    return Snapshot(g, tuple(running), tuple(queued))


def fifo_starts(cluster_gpus: int, running, queued) -> np.ndarray:
    """Start time (s from now) of each queued job under strict FIFO gang scheduling.

    Job k starts at the first time t >= start of job k-1 at which the GPUs free at t (the pool minus
    the jobs still running) reach its size; jobs end at start + duration. An event loop: pop job ends
    from a heap until enough GPUs are free. A job larger than the pool raises."""
    g = integer("cluster_gpus", cluster_gpus, 1, unit="GPUs")
    ends = [(float(j.duration_s), int(j.gpus)) for j in running]
    free = g - sum(j.gpus for j in running)
    if free < 0:
        raise ValueError(f"the running jobs hold {g - free} GPUs, more than the pool's {g}")
    heapq.heapify(ends)
    t, out = 0.0, []
    for j in queued:
        if j.gpus > g:
            raise ValueError(f"a job of {j.gpus} GPUs can never start on a pool of {g}")
        while free < j.gpus:
            end, n = heapq.heappop(ends)
            t, free = max(t, end), free + n
        out.append(t)
        heapq.heappush(ends, (t + float(j.duration_s), int(j.gpus)))
        free -= j.gpus
    return np.array(out, dtype=float)


def free_profile(snap: Snapshot) -> tuple[np.ndarray, np.ndarray]:
    """(times_s, free_gpus): the GPUs free from each time on (a step function, first time 0) once the
    running jobs and the FIFO queue (:func:`fifo_starts`) are placed."""
    starts = fifo_starts(snap.cluster_gpus, snap.running, snap.queued)
    ev = [(0.0, 0)] + [(float(j.duration_s), -j.gpus) for j in snap.running]
    ev += [(float(t), j.gpus) for j, t in zip(snap.queued, starts, strict=True)]
    ev += [(float(t + j.duration_s), -j.gpus) for j, t in zip(snap.queued, starts, strict=True)]
    times = np.array(sorted({t for t, _ in ev}))
    dt = np.array([t for t, _ in ev])
    dg = np.array([g for _, g in ev])
    used = snap.busy_gpus + np.array([dg[dt <= t].sum() for t in times])
    return times, snap.cluster_gpus - used


def slot_window_s(snap: Snapshot, gpus: int) -> float:
    """How long ``gpus`` GPUs can run from now without delaying any queued job: until the free GPUs of
    :func:`free_profile` first drop below ``gpus`` (0 if they are below now, inf if never). A job that
    fits under the profile leaves every FIFO start where it was: each queued job still finds its GPUs
    at its start, and cannot start earlier with fewer GPUs free (conservative backfill's condition)."""
    g = integer("gpus", gpus, 1, unit="GPUs")
    times, free = free_profile(snap)
    short = np.flatnonzero(free < g)
    return float(times[short[0]]) if short.size else math.inf


def power_of_two_floor(n: int) -> int:
    """The largest power of two <= n (0 for n < 1): a data-parallel run scales in powers of two."""
    return 0 if n < 1 else 1 << (int(n).bit_length() - 1)


@dataclass(frozen=True)
class Pilot:
    """A scaled-down run: ``share`` of the request's GPU-seconds on ``gpus`` GPUs for ``duration_s``,
    inside a slot of ``window_s``; ``fits`` when it ends inside it; ``max_share`` the largest share of
    the request any power-of-two slot holds."""

    gpus: int
    share: float
    duration_s: float
    window_s: float
    fits: bool
    max_share: float


def pilot_run(request: Job, snap: Snapshot, share: float) -> Pilot:
    """Size ``share`` of ``request``'s work (its GPU-seconds) for the idle slots of ``snap``: on the
    largest power of two of GPUs (at most the request's) whose slot (:func:`slot_window_s`) holds
    duration = share x request GPU-s / gpus; when none does, the slot that holds the most work,
    reported with ``fits`` False; with no GPU free now, ``gpus`` 0."""
    sh = fraction("share", share, allow_zero=False)
    best = None
    g = power_of_two_floor(min(request.gpus, snap.cluster_gpus))
    while g >= 1:
        w = slot_window_s(snap, g)
        if w <= 0:  # fewer than g GPUs free now
            g //= 2
            continue
        dur = sh * request.gpu_s / g
        cap = min(1.0, g * w / request.gpu_s)
        if dur <= w:
            return Pilot(g, sh, dur, w, True, max(cap, best.max_share if best else 0.0))
        if best is None or cap > best.max_share:
            best = Pilot(g, sh, dur, w, False, cap)
        g //= 2
    return best if best is not None else Pilot(0, sh, math.inf, 0.0, False, 0.0)


def pool_mean_wait_s(utilization: float, gpus, durations_s, cluster_gpus: int) -> float:
    """Mean FIFO wait of a job in the pool seen as one server of GPU-time (the fluid view).

    Service S = g d / G (the job's GPU-seconds over the pool); rho = lambda E[S]; the wait is
    Pollaczek-Khinchine's lambda E[S^2] / (2 (1 - rho)) via :func:`lib.scheduling.queueing.mg1_mean_wait_s`,
    with E[S], E[S^2] the moments of the given job sample. A lower bound for a gang-scheduled pool."""
    rho = real("utilization", utilization, 0, 1, low_open=True, high_open=True)
    g = integer("cluster_gpus", cluster_gpus, 1, unit="GPUs")
    s = np.asarray(gpus, dtype=float) * np.asarray(durations_s, dtype=float) / g
    if s.ndim != 1 or not len(s) or np.any(s <= 0):
        raise ValueError("gpus and durations_s must be equal-length lists of positive job sizes")
    es, es2 = float(s.mean()), float((s * s).mean())
    return queueing.mg1_mean_wait_s(rho / es, es, es2)


def _fast_lane_inputs(small_share, small_s, large_mean_s, large_scv, utilization, lane_share):
    """The six inputs of :func:`fast_lane_waits` and :func:`fast_lane_sample`, validated once:
    (small_share in (0, 1), small_s > 0 s, large_mean_s > 0 s, large_scv >= 0, utilization in (0, 1),
    lane_share in (0, 1))."""
    p = real("small_share", small_share, 0, 1, low_open=True, high_open=True)
    a = real("small_s", small_s, 0, low_open=True, unit="seconds")
    b = real("large_mean_s", large_mean_s, 0, low_open=True, unit="seconds")
    c2 = real("large_scv", large_scv, 0)
    rho = real("utilization", utilization, 0, 1, low_open=True, high_open=True)
    f = real("lane_share", lane_share, 0, 1, low_open=True, high_open=True)
    return p, a, b, c2, rho, f


def fast_lane_waits(small_share: float, small_s: float, large_mean_s: float, large_scv: float,
                    utilization: float, lane_share: float) -> dict[str, float]:
    """Mean waits of small and large jobs: one FIFO queue versus a reserved fast lane.

    Jobs arrive as one Poisson stream at the rate that gives ``utilization``; a share ``small_share``
    of them are small (constant ``small_s`` seconds of the whole pool), the rest large (mean
    ``large_mean_s``, squared coefficient of variation ``large_scv``: heavy-tailed when large).
    Shared: one M/G/1 with the mixture's moments. Fast lane: a share ``lane_share`` of the pool serves
    only small jobs (service small_s / f), the rest only large ones (service / (1 - f)), each an M/G/1.
    Returns ``shared`` (everyone's wait), ``lane_small``, ``lane_large``, ``rho_lane``, ``rho_main``
    (inf where a lane is overloaded) and the arrival ``rate``."""
    p, a, b, c2, rho, f = _fast_lane_inputs(small_share, small_s, large_mean_s, large_scv, utilization, lane_share)
    es = p * a + (1 - p) * b
    es2 = p * a * a + (1 - p) * (1 + c2) * b * b
    lam = rho / es
    shared = queueing.mg1_mean_wait_s(lam, es, es2)
    rho_l = p * lam * a / f
    rho_m = (1 - p) * lam * b / (1 - f)
    lane = queueing.mg1_mean_wait_s(p * lam, a / f, (a / f) ** 2) if rho_l < 1 else math.inf
    main = (queueing.mg1_mean_wait_s((1 - p) * lam, b / (1 - f), (1 + c2) * (b / (1 - f)) ** 2)
            if rho_m < 1 else math.inf)
    return {"shared": shared, "lane_small": lane, "lane_large": main, "rho_lane": rho_l, "rho_main": rho_m,
            "rate": lam}


def diff_ci(x1, n1: float, x0, n0: float, conf: float = 0.95, *, sd1: float | None = None,
            sd0: float | None = None) -> tuple[float, float, float]:
    """(difference, low, high): arm 1 minus arm 0 with a two-sided normal-approximation interval.

    Proportions (``sd1``/``sd0`` None): x are success counts; the difference is x1/n1 - x0/n0 and the
    interval Agresti and Caffo's (2000, "Simple and effective confidence intervals for proportions and
    differences of proportions result from adding two successes and two failures", The American
    Statistician 54(4)): the Wald interval of (x + 1) / (n + 2) in each arm, close to nominal coverage
    even for small arms where the plain Wald interval undercovers; each arm's standard error is
    :func:`lib.numerics.evals.score_standard_error` of the adjusted rate on n + 2 (its home; evals'
    ``unpaired_difference_se`` is the same sum for equal arms without the adjustment). Means: x are the
    arms' means and ``sd1``, ``sd0`` their standard deviations: se = sqrt(sd1^2 / n1 + sd0^2 / n0)
    (Welch's, normal quantile). ``n1``, ``n0``: whole numbers of jobs."""
    from lib.numerics import evals

    a1 = integer("n1", n1, 1, unit="jobs")
    a0 = integer("n0", n0, 1, unit="jobs")
    z = _N.inv_cdf(0.5 + real("conf", conf, 0, 1, low_open=True, high_open=True) / 2)
    if (sd1 is None) != (sd0 is None):
        raise ValueError("give both sd1 and sd0 (a difference of means) or neither (of proportions)")
    if sd1 is None:
        k1, k0 = real("x1", x1, 0, a1), real("x0", x0, 0, a0)
        d = k1 / a1 - k0 / a0
        q1, q0 = (k1 + 1) / (a1 + 2), (k0 + 1) / (a0 + 2)  # Agresti-Caffo: one success and one failure added
        mid = q1 - q0
        se = math.hypot(evals.score_standard_error(q1, a1 + 2), evals.score_standard_error(q0, a0 + 2))
        return d, mid - z * se, mid + z * se
    else:
        d = real("x1", x1) - real("x0", x0)
        se = math.sqrt(real("sd1", sd1, 0) ** 2 / a1 + real("sd0", sd0, 0) ** 2 / a0)
    return d, d - z * se, d + z * se


def adoption_trial(n_per_arm: int, p0: float, p1: float, seed: int, trials: int = 1) -> np.ndarray:
    """Success counts of a seeded randomized rollout: shape (trials, 2), columns (control, tool), each arm
    ``n_per_arm`` jobs succeeding with probability ``p0`` (control) and ``p1`` (with the tool)."""
    n = integer("n_per_arm", n_per_arm, 1, unit="jobs")
    q0 = fraction("p0", p0)
    q1 = fraction("p1", p1)
    rng = np.random.default_rng(integer("seed", seed, 0))
    t = integer("trials", trials, 1)
    return np.stack([rng.binomial(n, q0, t), rng.binomial(n, q1, t)], axis=1)


def quota_now(snap: Snapshot, request: Job, teams, guarantees, usage) -> dict:
    """GPUs ``request`` gets this hour if the pool ran quotas instead of one FIFO queue.

    Each team's demand is its running and queued GPUs (plus the request for its owner); the hour's
    split is :func:`lib.fleet.quotas.allocate` with ``"four_layer"`` (guarantee first, the rest lent
    by weighted max-min, weights = guarantee shares x the fair-share factor 2^(-U/S) of ``usage``,
    each team's recent GPU-hours). The owner's team puts the request first in its own allocation:
    it gets min(request, team allocation). Returns ``gpus`` (the request's), ``alloc`` (per team),
    ``factor`` (fair-share factors) and ``guaranteed`` (min(request, guarantee))."""
    from lib.fleet import quotas

    names = list(teams)
    if request.owner not in names:
        raise ValueError(f"the request's owner {request.owner!r} is not one of the teams {names}")
    g = np.array([real("guarantee", x, 0, unit="GPUs") for x in guarantees], dtype=float)
    u = np.array([real("usage", x, 0, unit="GPU-hours") for x in usage], dtype=float)
    if not (len(g) == len(u) == len(names)):
        raise ValueError("teams, guarantees and usage need one entry per team")
    if g.sum() > snap.cluster_gpus + 1e-9:
        raise ValueError(f"the guarantees add up to {g.sum():g} GPUs, more than the pool's {snap.cluster_gpus}")
    demand = np.zeros(len(names))
    for j in snap.running + snap.queued + (request,):
        demand[names.index(j.owner)] += j.gpus
    shares = np.maximum(g, 1e-9)
    factor = quotas.fair_share_factor(u, shares)
    alloc = quotas.allocate(snap.cluster_gpus, demand, g, "four_layer", shares * factor)
    k = names.index(request.owner)
    return {"gpus": float(min(request.gpus, alloc[k])), "alloc": alloc, "factor": factor,
            "guaranteed": float(min(request.gpus, g[k])), "demand": demand}


def fast_lane_sample(small_share: float, small_s: float, large_mean_s: float, large_scv: float,
                     utilization: float, lane_share: float, n: int, seed: int) -> dict[str, float]:
    """The same comparison as :func:`fast_lane_waits` measured on a seeded sample path: ``n`` Poisson
    arrivals, small jobs constant, large ones log-normal with the given mean and squared coefficient of
    variation (sigma^2 = ln(1 + scv)); exact FCFS waits by Lindley's recursion
    (:func:`lib.scheduling.queueing.lindley_waits`) in the shared queue and in each lane. Returns the
    mean waits ``shared_small``, ``shared_large``, ``lane_small``, ``lane_large`` (nan where a lane is
    overloaded), ``small_p95_shared``, ``small_p95_lane``, and ``shared_pk_path``: Pollaczek-Khinchine's
    mean wait evaluated on this path's own arrival rate and service moments (inf if the path's load
    reaches 1). Heavy-tailed sizes make a path's E[S^2] converge slowly, so the path's mean wait is
    compared like for like with ``shared_pk_path``; the gap to the population closed form is the
    sampling of E[S^2], not the queue."""
    p, a, b, c2, rho, f = _fast_lane_inputs(small_share, small_s, large_mean_s, large_scv, utilization, lane_share)
    rng = np.random.default_rng(integer("seed", seed, 0))
    n = integer("n", n, 100)
    small = rng.random(n) < p
    s2 = math.log1p(c2)
    svc = np.where(small, a, b * np.exp(math.sqrt(s2) * rng.standard_normal(n) - s2 / 2))
    lam = rho / (p * a + (1 - p) * b)
    arr = np.cumsum(rng.exponential(1 / lam, n))
    shared = queueing.lindley_waits(arr, svc)
    out = {"shared_small": float(shared[small].mean()), "shared_large": float(shared[~small].mean()),
           "small_p95_shared": float(np.quantile(shared[small], 0.95))}
    lam_path, es_path = n / float(arr[-1]), float(svc.mean())
    out["shared_pk_path"] = (queueing.mg1_mean_wait_s(lam_path, es_path, float((svc * svc).mean()))
                             if lam_path * es_path < 1 else math.inf)
    lane_ok = p * lam * a / f < 1
    main_ok = (1 - p) * lam * b / (1 - f) < 1
    lane = queueing.lindley_waits(arr[small], svc[small] / f) if lane_ok else None
    out["lane_small"] = float(lane.mean()) if lane_ok else math.nan
    out["small_p95_lane"] = float(np.quantile(lane, 0.95)) if lane_ok else math.nan
    out["lane_large"] = float(queueing.lindley_waits(arr[~small], svc[~small] / (1 - f)).mean()) if main_ok else math.nan
    return out


@dataclass(frozen=True)
class BlastRadius:
    """What a regression ``p0 -> p1`` on ``share`` of the traffic costs before it is rolled back:
    ``detect_s`` (the first paging burn-rate rule or the stage's own verdict, whichever is sooner; inf
    if neither), ``by`` (which one), ``impact_s`` (detect + rollback, or ``cap_s`` if nothing detects it),
    ``budget`` (fraction of the window's error budget the extra bad requests spend) and ``bad_requests``."""

    share: float
    detect_s: float
    by: str
    impact_s: float
    budget: float
    bad_requests: float


def blast_radius(share: float, p0: float, p1: float, target: float, qps: float, rollback_s: float,
                 verdict_s: float = math.inf, cap_s: float | None = None,
                 ticket_response_s: float | None = None) -> BlastRadius:
    """The blast radius of a regression on ``share`` of the traffic (N083).

    The service's bad fraction steps from p0 to e = p0 + share (p1 - p0). Each burn-rate rule of the SRE
    Workbook (:func:`lib.sre.slo.workbook_rules`) detects it after :func:`lib.sre.slo.rule_detection_s`,
    a ticket rule plus ``ticket_response_s`` before anyone acts (default ``judgment.ticket_response_h``); a canary stage's own verdict after
    ``verdict_s``. Impact lasts
    detection + ``rollback_s``, or ``cap_s`` (default: the SLO window) when nothing detects it. The
    budget spent is :func:`lib.sre.slo.budget_consumed` of the extra burn share (p1 - p0) / (1 - target)."""
    from lib.sre import slo

    s = fraction("share", share, allow_zero=False)
    a0 = real("p0", p0, 0, 1, high_open=True, unit="(baseline bad rate)")
    a1 = real("p1", p1, 0, 1, unit="(regressed bad rate)")
    if not a1 > a0:
        raise ValueError(f"p1 ({a1:g}) must exceed p0 ({a0:g}): a regression raises the bad rate")
    if a0 >= slo.error_budget(target):
        raise ValueError(f"the baseline bad rate p0 ({a0:g}) already spends the whole budget of a {target:g} SLO")
    r = real("rollback_s", rollback_s, 0, unit="seconds")
    q = real("qps", qps, 0, low_open=True, unit="requests per second")
    cap = slo.default_window_s() if cap_s is None else real("cap_s", cap_s, 0, low_open=True, unit="seconds")
    e = a0 + s * (a1 - a0)
    det, by = math.inf, "nothing"
    tr = (3600.0 * float(assumptions.value("judgment.ticket_response_h")) if ticket_response_s is None else
          real("ticket_response_s", ticket_response_s, 0, unit="seconds"))
    for rule in slo.workbook_rules():
        t = slo.rule_detection_s(rule, e, target, a0) + (0.0 if rule.severity == "page" else tr)
        if t < det:
            det, by = t, f"the {rule.name.replace('_', ' ')} alert" + ("" if rule.severity == "page" else
                                                                       " (a ticket, acted on later)")
    v = math.inf if verdict_s == math.inf else real("verdict_s", verdict_s, 0, unit="seconds")
    if v < det:
        det, by = v, "the canary's verdict"
    impact = min(det + r, cap)
    extra = slo.burn_rate(s * (a1 - a0), target)
    return BlastRadius(s, det, by, impact, slo.budget_consumed(extra, impact), q * s * (a1 - a0) * impact)


def verdict_requests(p0: float, p1: float, alpha: float = 0.05, power: float = 0.8,
                     exact_limit: float = 50_000, bisect_limit: float | None = None) -> tuple[float, str]:
    """Requests a canary verdict needs to catch ``p0 -> p1`` (one-sided, ``alpha``, ``power``), and which
    method gave it: :func:`lib.sre.canary.requests_needed_exact` (the exact binomial test; rare bad rates
    make the normal approximation optimistic) when the normal approximation asks for at most
    ``exact_limit`` requests; above that, up to ``bisect_limit`` (default half of ``canary.MAX_EXACT_N``),
    an n at which the exact test reaches ``power``, by bisection on :func:`lib.sre.canary.power_exact` (to
    1 part in 20,000; ~20 evaluations instead of the scan's ~1,000). The exact power is a sawtooth in n,
    so the bisection may land on a later crossing than the first: conservative by up to ~10% (107,554
    against the first 100,448 at 0.03% to 0.045%). Beyond ``bisect_limit``, the normal approximation
    :func:`lib.sre.canary.requests_needed` (a few percent optimistic: at 0.03% to 0.045% it asks for
    95,419 where the exact test needs 100,448)."""
    from lib.sre import canary

    approx = canary.requests_needed(p0, p1, alpha, power)
    if approx <= real("exact_limit", exact_limit, 1):
        return float(canary.requests_needed_exact(p0, p1, alpha, power)), "exact binomial test"
    top = canary.MAX_EXACT_N / 2 if bisect_limit is None else real("bisect_limit", bisect_limit, 0)
    if approx <= min(top, canary.MAX_EXACT_N / 2):
        lo, hi = int(0.7 * approx), int(approx)
        while canary.power_exact(hi, p0, p1, alpha) < power:
            lo, hi = hi, min(int(hi * 1.25) + 1, canary.MAX_EXACT_N)
        while hi - lo > max(1, hi // 20_000):
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if canary.power_exact(mid, p0, p1, alpha) >= power else (mid, hi)
        return float(hi), "exact binomial test"
    return approx, "normal approximation"
