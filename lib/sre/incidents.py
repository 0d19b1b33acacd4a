"""Incidents as records: a timeline, the intervals derived from it, the budget it spent, and when the
alert rules of :mod:`lib.sre.slo` fired and stopped on its bad-fraction series.

* :class:`Incident`: the five timestamps of an incident (trigger, start of impact, detection,
  mitigation, resolution) and the bad fraction during impact; derived intervals (latency from
  trigger to impact, time to detect, to mitigate, impact length) and the budget it spent.
* :func:`first_detection`: which rule of a set fires first on a step to a bad fraction, and when
  (:func:`lib.sre.slo.rule_detection_s`): the detection gap an alerting setup guarantees.
* :func:`simulate_program`: a seeded history of incidents from recurring causes and the postmortem
  action items they open, closed with or without tracking (:class:`ProgramRun`): repeat incidents,
  detection gaps and budget over time, closure rates and open items' ages.
* :func:`closed_by` and :func:`expected_repeats`: the same item process in closed form (the chance an item
  is closed by a time; the incidents one cause still produces over a horizon).
* :func:`alert_intervals`: evaluate a multiwindow rule step by step on a bad-fraction series and
  return the intervals during which it fires (the first start is :func:`lib.sre.slo.first_alert_s`;
  the end of an interval gives the reset time).

SI units: seconds; fractions in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, integer, real
from lib.sre import slo
from lib.sre.slo import AlertRule

__all__ = ["Incident", "ProgramRun", "alert_intervals", "closed_by", "expected_repeats", "first_detection",
           "simulate_program"]

PHASES = ("trigger_s", "impact_s", "detect_s", "mitigate_s", "resolve_s")


@dataclass(frozen=True)
class Incident:
    """One incident's timeline, seconds from any origin, in order: the change or event that set it off
    (``trigger_s``), the first bad request (``impact_s``), the first human or alert that knew
    (``detect_s``), the end of user impact (``mitigate_s``: rollback, drain, failover) and the end of
    the incident (``resolve_s``: root cause fixed, back to normal operation); ``bad_fraction`` of all
    requests are bad between impact and mitigation."""

    trigger_s: float
    impact_s: float
    detect_s: float
    mitigate_s: float
    resolve_s: float
    bad_fraction: float

    def __post_init__(self) -> None:
        times = [real(name, getattr(self, name), unit="seconds") for name in PHASES]
        if any(b < a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("an incident's times must be in order: trigger <= impact <= detect <= mitigate <= resolve; "
                             f"got {dict(zip(PHASES, times, strict=True))}")
        fraction("bad_fraction", self.bad_fraction, allow_zero=False)

    @property
    def latent_s(self) -> float:
        """Trigger to first impact (a change that waits for traffic, a cache that must expire)."""
        return self.impact_s - self.trigger_s

    @property
    def time_to_detect_s(self) -> float:
        """The detection gap: first impact to first knowledge."""
        return self.detect_s - self.impact_s

    @property
    def time_to_mitigate_s(self) -> float:
        """Detection to the end of user impact."""
        return self.mitigate_s - self.detect_s

    @property
    def impact_duration_s(self) -> float:
        """First impact to mitigation: how long users saw it."""
        return self.mitigate_s - self.impact_s

    @property
    def time_to_resolve_s(self) -> float:
        """Mitigation to resolution (the fix behind the rollback)."""
        return self.resolve_s - self.mitigate_s

    def bad_seconds(self) -> float:
        """Full-outage-equivalent seconds: bad_fraction x impact duration."""
        return self.bad_fraction * self.impact_duration_s

    def budget_spent(self, target: float, window_s: float | None = None) -> float:
        """Fraction of the SLO's budget spent: burn x impact duration / window."""
        return slo.budget_consumed(slo.burn_rate(self.bad_fraction, target), self.impact_duration_s, window_s)

    def detection_share(self) -> float:
        """Share of the impact that passed before anyone knew: time to detect / impact duration."""
        return self.time_to_detect_s / self.impact_duration_s if self.impact_duration_s > 0 else 0.0


def first_detection(bad_fraction: float, target: float, rules=None) -> tuple[str | None, float]:
    """(name, seconds) of the rule that fires first on a step from 0 to ``bad_fraction``; (None, inf)
    when none does. ``rules`` defaults to :func:`lib.sre.slo.workbook_rules`."""
    rules = slo.workbook_rules() if rules is None else tuple(rules)
    if not rules:
        raise ValueError("rules must name at least one AlertRule")
    best = min(((r.name, slo.rule_detection_s(r, bad_fraction, target)) for r in rules), key=lambda x: x[1])
    return best if math.isfinite(best[1]) else (None, math.inf)


def alert_intervals(bad_fractions, step_s: float, rule: AlertRule, target: float) -> list[tuple[float, float]]:
    """The intervals (start, end), seconds from the start of the series, during which ``rule`` fires on a
    series of bad fractions, one per ``step_s`` (:func:`lib.sre.slo.firing`: both trailing windows over the
    threshold at the end of a step; start the series with the baseline). An interval starts at the first
    evaluation that fires and ends at the first that does not (one still open at the end of the series
    ends there)."""
    fire = slo.firing(bad_fractions, step_s, rule, target)
    dt = float(step_s)
    edges = np.diff(np.concatenate([[0], fire.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    # fire[k] is the evaluation at the end of step k, time (k + 1) dt; an interval ends at the first
    # evaluation that no longer fires (or at the end of the series)
    return [(float((s + 1) * dt), float(min(e + 1, fire.size) * dt)) for s, e in zip(starts, ends, strict=True)]


# ---- a postmortem programme over time (N055) ------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramRun:
    """One simulated stretch of incidents and their postmortem action items (:func:`simulate_program`).

    Per incident (time order): ``times_s``, ``causes``, ``repeat`` (its cause had an incident before),
    ``ttd_s`` (detection gap), ``paged`` (a page rule fired before the customer report), ``budget``
    (fraction of the SLO budget spent). Per action item: ``item_cause``, ``item_open_s``,
    ``item_close_s`` (inf: never closed). ``horizon_s``: the end of the run; ``mitigate_s``: detection to
    the end of impact, the same for every incident (:attr:`impact_s` is the impact each budget was priced on)."""

    times_s: np.ndarray
    causes: np.ndarray
    repeat: np.ndarray
    ttd_s: np.ndarray
    paged: np.ndarray
    budget: np.ndarray
    item_cause: np.ndarray
    item_open_s: np.ndarray
    item_close_s: np.ndarray
    horizon_s: float
    mitigate_s: float

    @property
    def impact_s(self) -> np.ndarray:
        """Per incident, first impact to mitigation: the detection gap plus ``mitigate_s``, seconds."""
        return self.ttd_s + self.mitigate_s

    def closed_within(self, days: float) -> float:
        """Share of the items opened at least ``days`` before the end that closed within ``days``
        (nan when there are none)."""
        d = real("days", days, 0, unit="days") * 86400.0
        old = self.item_open_s <= self.horizon_s - d
        if not old.any():
            return math.nan
        return float(np.mean(self.item_close_s[old] - self.item_open_s[old] <= d))

    def open_ages_s(self) -> np.ndarray:
        """Ages at the end of the run of the items still open then, seconds."""
        still = self.item_close_s > self.horizon_s
        return self.horizon_s - self.item_open_s[still]

    def per_period(self, values: np.ndarray, period_s: float, reduce=np.mean) -> np.ndarray:
        """``reduce`` of a per-incident array over consecutive periods of ``period_s`` (nan where empty)."""
        p = real("period_s", period_s, 0, low_open=True, unit="seconds")
        n = int(math.ceil(self.horizon_s / p))
        idx = np.minimum((self.times_s // p).astype(int), n - 1)
        return np.array([reduce(values[idx == k]) if np.any(idx == k) else math.nan for k in range(n)])


def simulate_program(months: float, incidents_per_month: float, n_causes: int, tracked: bool, seed: int = 0, *,
                     target: float = 0.999, share_median: float = 0.05, share_sigma: float = 1.0,
                     tracked_close_days: float = 21.0, untracked_close_days: float = 60.0,
                     untracked_abandon: float = 0.5, fix_effect: float = 0.8, customer_s: float = 6 * 3600.0,
                     mitigate_s: float = 1200.0, window_s: float | None = None) -> ProgramRun:
    """Simulate ``months`` (30-day) of incidents and postmortems.

    * ``n_causes`` latent causes each produce incidents as a Poisson process at
      ``incidents_per_month / n_causes`` a month; each cause breaks a fixed share of traffic
      (log-normal, median ``share_median``, log-sd ``share_sigma``, capped at 1).
    * The first incident of a cause opens one action item for it. It closes after an exponential
      time of mean ``tracked_close_days`` when ``tracked``; untracked, it is abandoned (never closes)
      with probability ``untracked_abandon`` and otherwise closes after a mean ``untracked_close_days``.
    * Once a cause's item is closed, the cause recurs at ``1 - fix_effect`` of its rate (thinning) and
      is detected by a per-class SLI (a step to 100% bad); before that, the first Workbook rule to fire
      on its share (:func:`first_detection`) or a customer report after ``customer_s``, whichever first.
    * Impact lasts the detection gap plus ``mitigate_s``; the budget spent is
      :meth:`Incident.budget_spent` on the ``target`` SLO.
    """
    months = real("months", months, 0, low_open=True, unit="months")
    ipm = real("incidents_per_month", incidents_per_month, 0, low_open=True, unit="incidents a month")
    n_causes = integer("n_causes", n_causes, 1, unit="causes")
    fix = fraction("fix_effect", fix_effect)
    abandon = fraction("untracked_abandon", untracked_abandon)
    for name, v in (("tracked_close_days", tracked_close_days), ("untracked_close_days", untracked_close_days),
                    ("customer_s", customer_s), ("mitigate_s", mitigate_s)):
        real(name, v, 0, low_open=True)
    real("share_median", share_median, 0, 1, low_open=True)
    real("share_sigma", share_sigma, 0)
    rng = np.random.default_rng(integer("seed", seed, 0))
    horizon = months * 30 * 86400.0
    rate = ipm / n_causes / (30 * 86400.0)
    shares = np.minimum(1.0, share_median * np.exp(share_sigma * rng.standard_normal(n_causes)))
    # candidate events of every cause at its full rate, in time order; thinned once the cause is fixed
    counts = rng.poisson(rate * horizon, n_causes)
    cand_t = rng.uniform(0, horizon, counts.sum())
    cand_c = np.repeat(np.arange(n_causes), counts)
    order = np.argsort(cand_t)
    cand_t, cand_c = cand_t[order], cand_c[order]
    keep_u = rng.random(cand_t.size)
    close_draw = rng.exponential(tracked_close_days if tracked else untracked_close_days, n_causes) * 86400.0
    abandoned = (~tracked) & (rng.random(n_causes) < abandon)
    rules = slo.workbook_rules(window_s)
    per_class_s = first_detection(1.0, target, rules)[1]
    first = [first_detection(float(s), target, rules) for s in shares]
    ttd_of = np.array([min(t, customer_s) for _, t in first])
    paged_of = np.array([name in ("fast_page", "slow_page") and t <= customer_s for name, t in first])

    def spent(share: float, ttd: float) -> float:  # Incident.budget_spent of an impact of ttd + mitigate_s
        return slo.budget_consumed(slo.burn_rate(share, target), ttd + mitigate_s, window_s)

    budget_of = {False: np.array([spent(float(s), t) for s, t in zip(shares, ttd_of, strict=True)]),
                 True: np.array([spent(float(s), per_class_s) for s in shares])}
    item_close = np.full(n_causes, math.inf)
    item_open = np.full(n_causes, math.nan)
    out = {k: [] for k in ("t", "c", "repeat", "ttd", "paged", "budget")}
    seen = np.zeros(n_causes, dtype=bool)
    for t, c, u in zip(cand_t.tolist(), cand_c.tolist(), keep_u.tolist(), strict=True):
        fixed = item_close[c] <= t
        if fixed and u >= 1 - fix:
            continue
        out["t"].append(t)
        out["c"].append(c)
        out["repeat"].append(bool(seen[c]))
        out["ttd"].append(per_class_s if fixed else ttd_of[c])
        out["paged"].append(True if fixed else bool(paged_of[c]))
        out["budget"].append(budget_of[bool(fixed)][c])
        if not seen[c]:
            seen[c] = True
            item_open[c] = t
            item_close[c] = math.inf if abandoned[c] else t + close_draw[c]
    opened = ~np.isnan(item_open)
    return ProgramRun(np.array(out["t"]), np.array(out["c"], dtype=int), np.array(out["repeat"], dtype=bool),
                      np.array(out["ttd"]), np.array(out["paged"], dtype=bool), np.array(out["budget"]),
                      np.flatnonzero(opened), item_open[opened], item_close[opened], horizon,
                      float(mitigate_s))


# ---- the closed forms of one cause's action item (the process simulate_program samples) --------------


def closed_by(t_s: float, close_mean_s: float, abandon: float) -> float:
    """P(an item is closed ``t_s`` after it opens): (1 - abandon)(1 - exp(-t / close_mean))."""
    t = real("t_s", t_s, 0, unit="seconds")
    m = real("close_mean_s", close_mean_s, 0, low_open=True, unit="seconds")
    return (1.0 - fraction("abandon", abandon)) * -math.expm1(-t / m)


def expected_repeats(rate_per_s: float, horizon_s: float, close_mean_s: float, abandon: float,
                     fix_effect: float) -> float:
    """Expected incidents of one cause in the ``horizon_s`` after its postmortem opens the item: a Poisson
    process at ``rate_per_s`` thinned to ``1 - fix_effect`` once the item closes,
    rate [H - fix (1 - a)(H - m (1 - exp(-H / m)))] (the integral of P(closed by s) over [0, H])."""
    r = real("rate_per_s", rate_per_s, 0, unit="incidents per second")
    h = real("horizon_s", horizon_s, 0, unit="seconds")
    m = real("close_mean_s", close_mean_s, 0, low_open=True, unit="seconds")
    a = fraction("abandon", abandon)
    fix = fraction("fix_effect", fix_effect)
    closed_time = (1.0 - a) * (h + m * math.expm1(-h / m))  # integral of P(closed by s) ds
    return r * (h - fix * closed_time)
