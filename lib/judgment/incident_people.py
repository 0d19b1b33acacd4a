"""Incidents seen from the people in them: what a postmortem action item is worth, what a mistake cost
and what the process change would have caught, and when a mentor stops asking and takes over.

Every budget, burn and detection quantity is :mod:`lib.sre` (``slo``, ``incidents.Incident``,
``canary``); prices are :func:`lib.fleet.capacity.gpu_hour_usd`. What lives here is only the arithmetic
that joins them (an action item's closure and the repeats it prevents are
:func:`lib.sre.incidents.closed_by` and :func:`lib.sre.incidents.expected_repeats`):

* :func:`incident_cost`: one :class:`~lib.sre.incidents.Incident` priced in the SLO's budget (all, and
  the part spent before detection), in failed requests, and in the GPU-hours and dollars the failed
  work burned.
* :func:`canary_catch`: the counterfactual: a canary stage at ``share`` of traffic that alarms on the
  same regression (:func:`lib.sre.canary.requests_needed`, ``stage_s``), and the budget it would have
  spent instead.
* :func:`takeover_plan`: the take-over point of a mentor during an incident: the mentee's time to
  mitigate T is log-normal; taking over at t ends the incident, in expectation, at
  E(t) = E[min(T, t)] + P(T > t) your_ttm (:func:`expected_finish_s`). The point is the largest t whose
  expected extra time over taking the keyboard at once, E(t) - your_ttm, fits the teaching allowance (a share
  of the budget converted to seconds at the current burn), so the plan's expected budget is at most the
  mentor's own plus the allowance; never later than the time left before the remaining budget is exhausted
  (:func:`lib.sre.slo.exhaustion_s`) minus the mentor's own, so that taking over still beats the breach.

SI units: seconds, requests per second; fractions in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from lib.inputs import fraction, integer, real
from lib.sre import canary, slo
from lib.sre.incidents import Incident

__all__ = ["CanaryCatch", "IncidentCost", "TakeoverPlan", "canary_catch", "expected_finish_s", "incident_cost",
           "lognormal_mean_after", "lognormal_sf", "simulate_takeover", "takeover_plan"]

_N = NormalDist()


# ---- action items (N085) ------------------------------------------------------------------------------------


# ---- the price of a mistake, and the canary that would have caught it (N081) ----------------------------------


@dataclass(frozen=True)
class IncidentCost:
    """One incident priced: ``budget`` (fraction of the SLO's budget), ``budget_before_detection`` (the
    part spent before anyone knew), ``bad_requests``, ``gpu_hours`` and ``usd`` of the work the failed
    requests burned."""

    budget: float
    budget_before_detection: float
    bad_requests: float
    gpu_hours: float
    usd: float


def incident_cost(incident: Incident, target: float, qps: float, gpus: float, work_share: float | None = None,
                  chip=None, usd_per_gpu_hour: float | None = None, window_s: float | None = None) -> IncidentCost:
    """Price ``incident`` on a ``target`` SLO for a service at ``qps`` on ``gpus`` GPUs: the budget
    (:meth:`Incident.budget_spent`), its part before detection (burn x time to detect / window), bad
    requests = qps x bad_fraction x impact, GPU-hours = gpus x work_share x impact / 3600 (``work_share``:
    the share of the fleet's work the failed requests took, default their share of requests) and dollars at
    :func:`lib.fleet.capacity.gpu_hour_usd`."""
    from lib.fleet.capacity import gpu_hour_usd

    if not isinstance(incident, Incident):
        raise ValueError(f"incident must be a lib.sre.incidents.Incident; got {type(incident).__name__}")
    q = real("qps", qps, 0, low_open=True, unit="requests per second")
    g = real("gpus", gpus, 0, low_open=True, unit="GPUs")
    w = incident.bad_fraction if work_share is None else fraction("work_share", work_share)
    burn = slo.burn_rate(incident.bad_fraction, target)
    gpu_hours = g * w * incident.impact_duration_s / 3600.0
    return IncidentCost(incident.budget_spent(target, window_s),
                        slo.budget_consumed(burn, incident.time_to_detect_s, window_s),
                        q * incident.bad_fraction * incident.impact_duration_s, gpu_hours,
                        gpu_hours * gpu_hour_usd(chip, usd_per_gpu_hour))


@dataclass(frozen=True)
class CanaryCatch:
    """The canary that would have caught a regression: ``requests`` its verdict needs, ``collect_s`` to
    collect them at its share, ``detect_s`` (the longer of that and the bake time), ``incident`` (the
    canary's own, smaller incident: ``share x bad_fraction`` of all traffic bad from the start of the stage
    to the end of the rollback) and ``budget`` it spends."""

    requests: float
    collect_s: float
    detect_s: float
    incident: Incident
    budget: float


def canary_catch(bad_fraction: float, baseline: float, share: float, qps: float, target: float, rollback_s: float,
                 bake_s: float = 0.0, alpha: float = 0.05, power: float = 0.8,
                 window_s: float | None = None) -> CanaryCatch:
    """A canary stage at ``share`` of ``qps`` whose requests fail at ``baseline`` plus ``bad_fraction`` of the
    rest (p1 = baseline + bad_fraction (1 - baseline)): the requests its one-sided test needs
    (:func:`lib.sre.canary.requests_needed`), the time to collect them (:func:`lib.sre.canary.stage_s`),
    the alarm at the later of that and ``bake_s``, then ``rollback_s``; the budget of that incident on the
    whole service (bad fraction ``share x bad_fraction``). The requests are the exact binomial test's
    (:func:`lib.sre.canary.requests_needed_exact`) up to 100,000, the normal approximation beyond."""
    e = fraction("bad_fraction", bad_fraction, allow_zero=False)
    p0 = real("baseline", baseline, 0, 1, low_open=True, high_open=True, unit="(baseline bad rate)")
    p1 = p0 + e * (1.0 - p0)
    if p1 >= 1.0:
        raise ValueError("bad_fraction must leave some requests good (a regression to 100% bad needs no canary "
                         "statistics: the first request fails)")
    s = fraction("share", share, allow_zero=False)
    n = canary.requests_needed(p0, p1, alpha, power)
    if n <= 100_000:  # few requests: the normal approximation overstates the power; take the exact test's n
        n = float(canary.requests_needed_exact(p0, p1, alpha, power))
    collect = canary.stage_s(n, s, qps)
    detect = max(collect, real("bake_s", bake_s, 0, unit="seconds"))
    rb = real("rollback_s", rollback_s, 0, unit="seconds")
    inc = Incident(0.0, 0.0, detect, detect + rb, detect + rb, s * e)
    return CanaryCatch(n, collect, detect, inc, inc.budget_spent(target, window_s))


# ---- the take-over point (N086) ------------------------------------------------------------------------------


def lognormal_sf(t_s: float, median_s: float, sigma: float) -> float:
    """P(T > t) for T log-normal with ``median_s`` and log-sd ``sigma``: 1 - Phi((ln t - ln median) / sigma)."""
    t = real("t_s", t_s, 0, unit="seconds")
    m = real("median_s", median_s, 0, low_open=True, unit="seconds")
    s = real("sigma", sigma, 0, low_open=True, unit="(log-sd)")
    return 1.0 if t == 0 else 1.0 - _N.cdf((math.log(t) - math.log(m)) / s)


def lognormal_mean_after(t_s: float, median_s: float, sigma: float) -> float:
    """E[T | T > t] for T log-normal with ``median_s`` and log-sd ``sigma``, seconds:
    exp(mu + sigma^2 / 2) Phi((mu + sigma^2 - ln t) / sigma) / Phi((mu - ln t) / sigma), mu = ln median
    (E[T] at t = 0). Grows with t: the longer someone has been stuck, the longer they are expected to take."""
    t = real("t_s", t_s, 0, unit="seconds")
    m = real("median_s", median_s, 0, low_open=True, unit="seconds")
    s = real("sigma", sigma, 0, low_open=True, unit="(log-sd)")
    mu = math.log(m)
    mean = math.exp(mu + s * s / 2)
    if t == 0:
        return mean
    z = (mu - math.log(t)) / s
    tail = _N.cdf(z)
    if tail < 1e-300:  # far in the tail: the mean residual life tends to t s^2 / ln(t / m)
        return t * (1 + s * s / max(math.log(t / m), 1e-12))
    return mean * _N.cdf(z + s) / tail


@dataclass(frozen=True)
class TakeoverPlan:
    """A mentor's plan during an incident (:func:`takeover_plan`). Seconds from the hand-off.

    ``burn``: the incident's burn rate; ``breach_s``: time until the remaining budget is gone at that burn;
    ``allowance_s``: the teaching allowance as seconds of impact at that burn; ``limit_s``: the expected
    time to mitigate the mentor tolerates, your_ttm + allowance; ``takeover_s``: the take-over point (0:
    keep the keyboard; inf: never take over); ``reason``: what sets it ("allowance": E(takeover) = limit,
    "last chance": moved earlier to breach - your_ttm so that your own fix still lands before the budget is
    gone, "never": coaching to the end fits the allowance and your own fix cannot beat the breach anyway);
    ``p_mentee``: P(the mentee mitigates before it); ``expected_s`` of the plan, ``mentee_only_s`` and
    ``you_only_s``: the expected time to mitigate of the plan, of never taking over, and of taking the
    keyboard at once; ``budget_*``: the same as fractions of the budget."""

    burn: float
    breach_s: float
    allowance_s: float
    limit_s: float
    takeover_s: float
    reason: str
    p_mentee: float
    expected_s: float
    mentee_only_s: float
    you_only_s: float
    budget_plan: float
    budget_mentee_only: float
    budget_you_only: float

    @property
    def finish_after_takeover_s(self) -> float:
        """When the incident ends if the mentor takes over at the take-over point: takeover_s + your_ttm."""
        return self.takeover_s + self.you_only_s


def _partial_mean(t: float, mu: float, s: float) -> float:
    """E[min(T, t)] for T log-normal(mu, s): E[T 1{T <= t}] + t P(T > t)."""
    if t <= 0:
        return 0.0
    if math.isinf(t):
        return math.exp(mu + s * s / 2)
    z = (math.log(t) - mu) / s
    return math.exp(mu + s * s / 2) * _N.cdf(z - s) + t * (1 - _N.cdf(z))


def expected_finish_s(takeover_s: float, mentee_median_s: float, mentee_sigma: float, your_ttm_s: float) -> float:
    """E(t): the expected time to mitigate when the mentor takes over at ``takeover_s`` if the mentee (log-normal
    T, ``mentee_median_s``, ``mentee_sigma``) is not done: E[min(T, t)] + P(T > t) your_ttm, seconds
    (your_ttm at t = 0, E[T] at t = inf). dE/dt = P(T > t) (1 - your_ttm h(t)), h the hazard of T."""
    t = math.inf if takeover_s == math.inf else real("takeover_s", takeover_s, 0, unit="seconds (or inf: never)")
    m = real("mentee_median_s", mentee_median_s, 0, low_open=True, unit="seconds")
    s = real("mentee_sigma", mentee_sigma, 0, low_open=True, unit="(log-sd)")
    y = real("your_ttm_s", your_ttm_s, 0, unit="seconds")
    return _finish(t, math.log(m), s, y)


def _finish(t: float, mu: float, s: float, y: float) -> float:
    """E(t) of :func:`expected_finish_s` with mu = ln median."""
    if t <= 0:
        return y
    if math.isinf(t):
        return math.exp(mu + s * s / 2)
    return _partial_mean(t, mu, s) + y * (1 - _N.cdf((math.log(t) - mu) / s))


_Z_MAX = 37.0  # beyond z = 37 the normal tail underflows a double: treat t = exp(mu + 37 s) as the end of time


def _bisect_z(f, lo: float, hi: float) -> float:
    """The z in [lo, hi] where f changes sign (f(lo), f(hi) of opposite signs), to machine precision."""
    f_lo = f(lo)
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if (f(mid) > 0) == (f_lo > 0):
            lo, f_lo = mid, f(mid)
        else:
            hi = mid
    return hi


def _largest_crossing(mu: float, s: float, y: float, limit: float) -> float:
    """The largest t with E(t) <= limit, given E(inf) = E[T] > limit >= E(0) = y. E rises where
    y h(t) < 1; the log-normal hazard is unimodal, so E rises, may fall on the interval where y h >= 1, then
    rises to E[T]: the largest crossing is on the last rising stretch if E at its start is under the limit,
    else on the first. Each stretch is monotone, so bisection in z = (ln t - mu) / s finds it exactly."""
    def t_of(z: float) -> float:
        return math.exp(mu + s * z)

    def excess(z: float) -> float:
        return _finish(t_of(z), mu, s, y) - limit

    def log_yh(z: float) -> float:  # log(y h(t(z))) - 0: h = phi(z) / (s t Q(z))
        q = 0.5 * math.erfc(z / math.sqrt(2.0))
        return math.log(y) - z * z / 2 - 0.5 * math.log(2 * math.pi) - math.log(s) - mu - s * z - math.log(q)

    z_lo = -_Z_MAX
    if y > 0:
        # the hazard's mode: phi(z) / Q(z) - z = s (the left side falls from +inf to 0)
        z_mode = _bisect_z(lambda z: NormalDist().pdf(z) / (0.5 * math.erfc(z / math.sqrt(2.0))) - z - s, -_Z_MAX, _Z_MAX)
        if log_yh(z_mode) > 0:  # E falls between z1 < z_mode < z2
            z2 = _bisect_z(log_yh, z_mode, _Z_MAX) if log_yh(_Z_MAX) < 0 else _Z_MAX
            if excess(z2) <= 0:
                z_lo = z2
            else:
                z1 = _bisect_z(log_yh, -_Z_MAX, z_mode) if log_yh(-_Z_MAX) < 0 else -_Z_MAX
                return t_of(_bisect_z(excess, -_Z_MAX, z1)) if excess(-_Z_MAX) < 0 else 0.0
    if excess(_Z_MAX) <= 0:
        return t_of(_Z_MAX)
    return 0.0 if excess(z_lo) > 0 else t_of(_bisect_z(excess, z_lo, _Z_MAX))


def takeover_plan(bad_fraction: float, target: float, budget_left: float, mentee_median_s: float,
                  mentee_sigma: float, your_ttm_s: float, allowance: float,
                  window_s: float | None = None) -> TakeoverPlan:
    """The take-over point (module docstring). ``budget_left``: the share of the window's budget not yet
    spent; ``allowance``: the share of the budget the team accepts to spend on letting the mentee finish
    beyond what the mentor alone would spend. The mentee's time T is log-normal (``mentee_median_s``,
    ``mentee_sigma``); the mentor's is ``your_ttm_s`` from whenever it takes the keyboard (context included).

    Take over at t* = the largest t with E(t) - your_ttm <= allowance (seconds at this burn), E from
    :func:`expected_finish_s`: the plan's expected budget exceeds taking over at once by at most the allowance
    (exactly the allowance when it binds), and no later point does. inf (never) when even E[T] fits; and,
    when you can still beat the breach (your_ttm < breach), no later than breach - your_ttm, the last moment
    at which your own fix lands before the remaining budget is gone (reason "last chance")."""
    e = fraction("bad_fraction", bad_fraction, allow_zero=False)
    left = fraction("budget_left", budget_left, allow_zero=False)
    m = real("mentee_median_s", mentee_median_s, 0, low_open=True, unit="seconds")
    s = real("mentee_sigma", mentee_sigma, 0.05, 2.5, unit="(log-sd, 0.05 to 2.5)")
    y = real("your_ttm_s", your_ttm_s, 0, low_open=True, unit="seconds")
    a = fraction("allowance", allowance)
    burn = slo.burn_rate(e, target)
    full = slo.exhaustion_s(burn, window_s)  # the whole budget at this burn
    breach, allow_s = left * full, a * full
    limit = y + allow_s
    mu = math.log(m)
    mentee_only = math.exp(mu + s * s / 2)
    if mentee_only <= limit:
        t_star, reason = math.inf, "never"
    else:
        t_star, reason = _largest_crossing(mu, s, y, limit), "allowance"
    if y < breach and t_star > breach - y:  # later, your own fix would land after the budget is gone
        t_star, reason = breach - y, "last chance"
    p_mentee = 0.0 if t_star == 0 else 1.0 if math.isinf(t_star) else _N.cdf((math.log(t_star) - mu) / s)
    expected = _finish(t_star, mu, s, y)

    def spent(t: float) -> float:
        return slo.budget_consumed(burn, t, window_s)

    return TakeoverPlan(burn, breach, allow_s, limit, t_star, reason, p_mentee, expected, mentee_only, y,
                        spent(expected), spent(mentee_only), spent(y))


def simulate_takeover(plan: TakeoverPlan, mentee_median_s: float, mentee_sigma: float, trials: int = 20000,
                      seed: int = 0) -> tuple[float, float]:
    """(mean time to mitigate, share mitigated by the mentee) of ``plan`` by sampling the mentee's time:
    the Monte Carlo check of :func:`takeover_plan`'s closed forms."""
    import numpy as np

    n = integer("trials", trials, 1, unit="samples")
    rng = np.random.default_rng(integer("seed", seed, 0))
    t = np.exp(math.log(real("mentee_median_s", mentee_median_s, 0, low_open=True))
               + real("mentee_sigma", mentee_sigma, 0, low_open=True) * rng.standard_normal(n))
    mentee = t <= plan.takeover_s
    total = np.where(mentee, t, plan.takeover_s + plan.you_only_s)
    return float(total.mean()), float(mentee.mean())
