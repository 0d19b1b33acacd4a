"""lib.sre.slo: error budgets and burn-rate alerts against the SRE Workbook's published numbers and
a discrete evaluation of each rule on a bad-fraction series."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import slo


def test_budget_minutes_per_month():
    # 99.9% over 30 days: 43.2 minutes (0.001 x 43,200 min)
    assert slo.error_budget_s(0.999) / 60 == pytest.approx(43.2)
    assert slo.error_budget_s(0.99, 7 * 86400) == pytest.approx(0.01 * 7 * 86400)


def test_workbook_thresholds():
    # SRE Workbook ch. 5, Table 5-8: burn 14.4 (1 h), 6 (6 h), 1 (3 d) for 2%, 5%, 10% of a 30-day budget
    rules = {r.name: r for r in slo.workbook_rules()}
    assert rules["fast_page"].burn == pytest.approx(14.4)
    assert rules["slow_page"].burn == pytest.approx(6.0)
    assert rules["ticket"].burn == pytest.approx(1.0)
    for r, f in zip(rules.values(), (0.02, 0.05, 0.10), strict=True):
        assert r.budget_fraction() == pytest.approx(f)
        assert r.short_s == pytest.approx(r.long_s / 12)


def test_exhaustion_and_consumption():
    assert slo.exhaustion_s(14.4) / 86400 == pytest.approx(30 / 14.4)
    assert slo.exhaustion_s(0) == math.inf
    assert slo.budget_consumed(14.4, 3600) == pytest.approx(0.02)
    assert slo.burn_rate(0.0144, 0.999) == pytest.approx(14.4)


def test_detection_closed_forms():
    r = slo.workbook_rules()[0]
    # a full outage at 99.9%: the 1 h window crosses 1.44% after 14.4 x 0.001 x 3600 s
    assert slo.detection_s(1.0, 0.999, 3600, 14.4) == pytest.approx(51.84)
    assert slo.rule_detection_s(r, 1.0, 0.999) == pytest.approx(51.84)
    # below the threshold: never
    assert slo.detection_s(0.01, 0.999, 3600, 14.4) == math.inf
    # baseline already over: at once
    assert slo.detection_s(0.5, 0.999, 3600, 14.4, baseline_fraction=0.02) == 0.0


def test_reset_short_window_bounds_it():
    r = slo.workbook_rules()[0]
    single = slo.AlertRule("one", 3600, 0, r.burn)
    # after a full outage a single 1 h window fires for almost an hour more, however short the outage was
    for d in (1800, 3600, 7200):
        assert slo.reset_s(single, 1.0, d, 0.999) == pytest.approx(3600 * (1 - 0.0144))
    assert slo.reset_s(r, 1.0, 3600, 0.999) == pytest.approx(300 * (1 - 0.0144))
    # an incident too short to fire the rule has nothing to reset
    assert slo.reset_s(single, 1.0, 30, 0.999) == 0.0


@settings(max_examples=40, deadline=None)
@given(e=st.floats(0.02, 1.0), minutes=st.integers(2, 240), rule_i=st.integers(0, 1))
def test_reset_matches_the_discrete_evaluation(e, minutes, rule_i):
    r = slo.workbook_rules()[rule_i]
    dt = r.short_s / 60
    n_base, n_inc = int(r.long_s / dt), int(round(minutes * 60 / dt))
    series = np.r_[np.zeros(n_base), np.full(n_inc, e), np.zeros(2 * n_base)]
    c = np.r_[0.0, np.cumsum(series)]
    i = np.arange(1, series.size + 1)

    def over(n):  # the window's bad fraction at the end of each interval, above the threshold
        return (c[i] - c[np.maximum(0, i - n)]) / n > r.threshold(0.999)

    firing = over(round(r.long_s / dt)) & over(round(r.short_s / dt))
    closed = slo.reset_s(r, e, n_inc * dt, 0.999)
    end = (n_base + n_inc) * dt
    still = i[firing & (i * dt > end)]
    measured = (still.max() * dt - end) if still.size else 0.0
    assert measured == pytest.approx(closed, abs=2 * dt)


@settings(max_examples=60, deadline=None)
@given(e=st.floats(0.005, 1.0), rule_i=st.integers(0, 1), target=st.sampled_from([0.99, 0.995, 0.999]))
def test_discrete_rule_matches_closed_form(e, rule_i, target):
    r = slo.workbook_rules()[rule_i]
    dt = r.short_s / 60
    n_base = int(r.long_s / dt)
    series = np.r_[np.zeros(n_base), np.full(2 * n_base, e)]
    measured = slo.first_alert_s(series, dt, r, target)
    closed = slo.rule_detection_s(r, e, target)
    if math.isinf(closed):
        assert math.isinf(measured) or measured - n_base * dt >= 2 * n_base * dt - dt
    else:
        assert measured - n_base * dt == pytest.approx(closed, abs=dt * 1.001)


@pytest.mark.parametrize("call", [
    lambda: slo.error_budget(1.0),
    lambda: slo.burn_rate(1.5, 0.999),
    lambda: slo.AlertRule("x", 60, 120, 1.0),
    lambda: slo.first_alert_s([], 1.0, slo.workbook_rules()[0], 0.999),
    lambda: slo.default_window_s(0),
])
def test_bad_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()
