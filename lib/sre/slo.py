"""Service-level objectives, error budgets and burn-rate alerts: the arithmetic every SRE page shares.

* An SLO is a target fraction of good events (``target``: 0.999 means 99.9% of requests are good)
  over a compliance window (30 days by default). The error budget is the bad fraction it allows,
  ``1 - target``, or that fraction of the window in time: 43.2 minutes a 30-day month at 99.9%.
* The burn rate of a bad fraction ``e`` is ``e / (1 - target)``: 1 spends the budget exactly over
  the window; ``b`` spends it in ``window / b``. A burn ``b`` held for ``t`` consumes ``b t / window``
  of the budget.
* A burn-rate alert fires when the bad fraction measured over a trailing window exceeds
  ``burn x (1 - target)``; a multiwindow rule needs its long and its short window both over the
  threshold (the short one makes it reset soon after the errors stop). The threshold that spends a
  fraction ``f`` of the budget in a window ``W`` is ``f x window / W`` (the SRE Workbook's 14.4 for
  2% in an hour of a 30-day window: :func:`burn_for_budget`).
* Detection time of a step from a bad fraction ``e0`` to ``e`` and the reset time after it ends
  (closed forms, :func:`detection_s`, :func:`reset_s`), and the one discrete evaluation of a rule on a
  bad-fraction series (:func:`firing`, :func:`first_alert_s`: the independent check of the closed forms).

SI units: seconds; fractions in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import fraction, real
from lib.registry import assumptions

__all__ = [
    "AlertRule", "budget_consumed", "burn_for_budget", "burn_rate", "default_window_s", "detection_s",
    "error_budget", "error_budget_s", "exhaustion_s", "firing", "first_alert_s", "reset_s", "rule_detection_s",
    "workbook_rules",
]

DAY_S = 86400.0


def default_window_s(window_s: float | None = None) -> float:
    """The compliance window, seconds: ``window_s`` or the book's default (``sre.slo_window_days``)."""
    if window_s is None:
        return float(assumptions.value("sre.slo_window_days")) * DAY_S
    return real("window_s", window_s, 0, low_open=True, unit="seconds")


def _target(target) -> float:
    return real("target", target, 0, 1, low_open=True, high_open=True, unit="(fraction of good events)")


def error_budget(target: float) -> float:
    """The bad fraction an SLO allows: 1 - target (0.001 at 99.9%)."""
    return 1.0 - _target(target)


def error_budget_s(target: float, window_s: float | None = None) -> float:
    """The budget as time: (1 - target) x window, seconds (2,592 s = 43.2 min at 99.9% over 30 days)."""
    return error_budget(target) * default_window_s(window_s)


def burn_rate(bad_fraction: float, target: float) -> float:
    """How fast a bad fraction spends the budget: bad_fraction / (1 - target) (1 = exactly on budget)."""
    return fraction("bad_fraction", bad_fraction) / error_budget(target)


def exhaustion_s(burn: float, window_s: float | None = None) -> float:
    """Time for a burn rate to spend a whole budget: window / burn, seconds (inf at burn 0)."""
    b = real("burn", burn, 0, unit="(multiple of the budget rate)")
    return math.inf if b == 0 else default_window_s(window_s) / b


def budget_consumed(burn: float, duration_s: float, window_s: float | None = None) -> float:
    """Fraction of the budget a burn rate held for ``duration_s`` spends: burn x duration / window."""
    b = real("burn", burn, 0, unit="(multiple of the budget rate)")
    return b * real("duration_s", duration_s, 0, unit="seconds") / default_window_s(window_s)


def burn_for_budget(budget_fraction: float, alert_window_s: float, window_s: float | None = None) -> float:
    """The burn-rate threshold that spends ``budget_fraction`` of the budget in ``alert_window_s``:
    budget_fraction x window / alert_window (14.4 for 2% in 1 h of 30 days)."""
    f = fraction("budget_fraction", budget_fraction, allow_zero=False)
    return f * default_window_s(window_s) / real("alert_window_s", alert_window_s, 0, low_open=True, unit="seconds")


@dataclass(frozen=True)
class AlertRule:
    """A multiwindow burn-rate rule: fires while the bad fraction over the last ``long_s`` AND over the
    last ``short_s`` both exceed ``burn x (1 - target)``. ``short_s = 0``: a single-window rule."""

    name: str
    long_s: float
    short_s: float
    burn: float
    severity: str = "page"

    def __post_init__(self) -> None:
        real("long_s", self.long_s, 0, low_open=True, unit="seconds")
        real("short_s", self.short_s, 0, self.long_s, unit="seconds (at most long_s)")
        real("burn", self.burn, 0, low_open=True, unit="(multiple of the budget rate)")

    def threshold(self, target: float) -> float:
        """The bad fraction the rule compares with: burn x (1 - target)."""
        return self.burn * error_budget(target)

    def budget_fraction(self, window_s: float | None = None) -> float:
        """Fraction of the budget spent by the time the long window alone fires at exactly its threshold:
        burn x long / window."""
        return budget_consumed(self.burn, self.long_s, window_s)


def workbook_rules(window_s: float | None = None) -> tuple[AlertRule, ...]:
    """The SRE Workbook's recommended multiwindow rules (``sre.burn_alerts``): 2% of the budget in 1 h
    (5 min short window) and 5% in 6 h (30 min) page; 10% in 3 days (6 h) opens a ticket. Burn
    thresholds are derived from the budget fractions for the given window (14.4, 6, 1 at 30 days)."""
    rules = []
    for name, e in assumptions.value("sre.burn_alerts").items():
        long_s = float(e["long_h"]) * 3600.0
        rules.append(AlertRule(name, long_s, float(e["short_min"]) * 60.0,
                               burn_for_budget(float(e["budget_fraction"]), long_s, window_s), e["severity"]))
    return tuple(rules)


def detection_s(bad_fraction: float, target: float, alert_window_s: float, burn: float,
                baseline_fraction: float = 0.0) -> float:
    """Time from a step (bad fraction ``baseline`` -> ``bad_fraction``) until a single trailing window of
    ``alert_window_s`` measures more than ``burn x (1 - target)``, seconds (inf if it never does).

    The window average at time t < W is (baseline (W - t) + e t) / W, so
    t = W (threshold - baseline) / (e - baseline); 0 when the baseline already exceeds the threshold."""
    e = fraction("bad_fraction", bad_fraction)
    b0 = fraction("baseline_fraction", baseline_fraction)
    w = real("alert_window_s", alert_window_s, 0, low_open=True, unit="seconds")
    thr = real("burn", burn, 0, low_open=True, unit="(multiple of the budget rate)") * error_budget(target)
    if b0 > thr:
        return 0.0
    if e <= thr:
        return math.inf
    return w * (thr - b0) / (e - b0)


def rule_detection_s(rule: AlertRule, bad_fraction: float, target: float, baseline_fraction: float = 0.0) -> float:
    """Detection time of a multiwindow rule: the later of its two windows' detection times (both must
    exceed the threshold), seconds."""
    t_long = detection_s(bad_fraction, target, rule.long_s, rule.burn, baseline_fraction)
    if rule.short_s == 0:
        return t_long
    return max(t_long, detection_s(bad_fraction, target, rule.short_s, rule.burn, baseline_fraction))


def reset_s(rule: AlertRule, bad_fraction: float, duration_s: float, target: float) -> float:
    """How long a rule keeps firing after an incident of ``bad_fraction`` lasting ``duration_s`` ends
    (baseline 0), seconds. A window of length W that fired holds the incident's bad time until it ages
    out, whatever the incident's length, and drops under the threshold when only thr x W / e of it is
    left: W (1 - thr / e) after the end. The rule stops when its first window clears, so the short
    window bounds the reset; a single-window rule fires for nearly ``long_s`` after the fix. 0 when
    the incident never made the rule fire."""
    e = fraction("bad_fraction", bad_fraction)
    d = real("duration_s", duration_s, 0, unit="seconds")
    thr = rule.threshold(target)
    windows = (rule.long_s,) if rule.short_s == 0 else (rule.long_s, rule.short_s)
    if e <= thr or any(d <= thr * w / e for w in windows):
        return 0.0
    return min(w * (1.0 - thr / e) for w in windows)


def firing(bad_fractions, step_s: float, rule: AlertRule, target: float, request_weights=None):
    """Evaluate a rule on a series of bad fractions, one per ``step_s`` interval: a boolean per interval,
    True where at the interval's end both trailing windows (whole intervals, request-weighted when
    ``request_weights`` is given) measure a bad fraction above the threshold. Windows that reach back
    before the series use the intervals there are: start the series with at least ``long_s`` of the
    baseline to measure a detection delay. The discrete check of :func:`detection_s` and :func:`reset_s`."""
    bad = np.asarray(bad_fractions, dtype=float)
    if bad.ndim != 1 or bad.size == 0 or not np.all(np.isfinite(bad)) or np.any((bad < 0) | (bad > 1)):
        raise ValueError("bad_fractions must be a non-empty 1-D series of fractions in [0, 1]")
    dt = real("step_s", step_s, 0, low_open=True, unit="seconds")
    w = np.ones_like(bad) if request_weights is None else np.asarray(request_weights, dtype=float)
    if w.shape != bad.shape or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("request_weights must be finite and non-negative, one per interval of bad_fractions")
    thr = rule.threshold(target)
    cb = np.concatenate([[0.0], np.cumsum(bad * w)])
    cw = np.concatenate([[0.0], np.cumsum(w)])
    i = np.arange(1, bad.size + 1)

    def over(window_s: float) -> np.ndarray:
        lo = np.maximum(0, i - max(1, round(window_s / dt)))
        tot = cw[i] - cw[lo]
        return (tot > 0) & ((cb[i] - cb[lo]) > thr * tot)

    fire = over(rule.long_s)
    if rule.short_s > 0:
        fire &= over(rule.short_s)
    return fire


def first_alert_s(bad_fractions, step_s: float, rule: AlertRule, target: float,
                  request_weights=None) -> float:
    """The end time of the first interval at which :func:`firing` is True, seconds; inf if never."""
    hits = np.flatnonzero(firing(bad_fractions, step_s, rule, target, request_weights))
    return math.inf if hits.size == 0 else float((hits[0] + 1) * real("step_s", step_s, 0, low_open=True))
