"""lib.sre.incidents: alert intervals on bad-fraction series (against slo.first_alert_s and the closed forms)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import incidents, slo

RULES = {r.name: r for r in slo.workbook_rules()}


def _outage(rule, d_s, e, step):
    n_pre = int(rule.long_s / step)
    n_out = round(d_s / step)
    s = np.concatenate([np.zeros(n_pre), np.full(n_out, e), np.zeros(int(1.2 * rule.long_s / step))])
    return s, n_pre, n_out


@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("e", [1.0, 0.1, 0.03])
def test_first_interval_starts_where_first_alert_fires(name, e):
    rule = RULES[name]
    step = rule.long_s / 720
    s, n_pre, n_out = _outage(rule, 2 * rule.long_s, e, step)
    spans = incidents.alert_intervals(s, step, rule, 0.999)
    first = slo.first_alert_s(s, step, rule, 0.999)
    if math.isinf(first):
        assert spans == []
    else:
        assert spans[0][0] == pytest.approx(first)
        # and near the closed form (within a step)
        assert spans[0][0] - n_pre * step == pytest.approx(slo.rule_detection_s(rule, e, 0.999), abs=step)


@pytest.mark.parametrize("short", [True, False])
@pytest.mark.parametrize("d_min", [10.0, 30.0, 120.0])
def test_reset_is_a_window_less_its_threshold_share(short, d_min):
    """After an outage that made every window fire, the window that drains first drops below the
    threshold W (1 - threshold / e) after the fix, whatever the outage's length."""
    rule = RULES["fast_page"] if short else replace(RULES["fast_page"], short_s=0.0)
    step = 1.0
    s, n_pre, n_out = _outage(rule, d_min * 60, 1.0, step)
    spans = incidents.alert_intervals(s, step, rule, 0.999)
    assert len(spans) == 1
    w = rule.short_s if short else rule.long_s
    assert spans[0][1] - (n_pre + n_out) * step == pytest.approx(w * (1 - rule.threshold(0.999)), abs=2 * step)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=300), st.sampled_from(list(RULES)))
def test_intervals_are_the_firing_steps_brute_force(values, name):
    """Property: the intervals cover exactly the steps at which both trailing windows (over the steps
    there are) exceed the threshold, evaluated one by one."""
    rule = RULES[name]
    step = rule.long_s / 24
    s = np.array(values)
    thr = rule.threshold(0.99)
    n_long, n_short = round(rule.long_s / step), max(1, round(rule.short_s / step))
    want = []
    for k in range(s.size):
        i = k + 1
        long_w, short_w = s[max(0, i - n_long):i], s[max(0, i - n_short):i]
        want.append(long_w.sum() > thr * long_w.size and short_w.sum() > thr * short_w.size)
    got = np.zeros(s.size, dtype=bool)
    for a, b in incidents.alert_intervals(s, step, rule, 0.99):
        got[round(a / step) - 1:round(b / step) - 1] = True
        if b == s.size * step and want[-1]:
            got[-1] = True
    assert got.tolist() == want


def test_alert_intervals_refuses_bad_input():
    with pytest.raises(ValueError, match="bad_fractions"):
        incidents.alert_intervals([0.1, 1.5], 60.0, RULES["ticket"], 0.999)
    with pytest.raises(ValueError, match="step_s"):
        incidents.alert_intervals([0.1], 0.0, RULES["ticket"], 0.999)


def test_incident_intervals_and_budget():
    inc = incidents.Incident(0.0, 600.0, 600.0 + 1040.0, 600.0 + 1040.0 + 900.0, 86400.0, 0.05)
    assert inc.latent_s == 600.0
    assert inc.time_to_detect_s == 1040.0
    assert inc.time_to_mitigate_s == 900.0
    assert inc.impact_duration_s == 1940.0
    assert inc.bad_seconds() == pytest.approx(97.0)
    # budget by hand: 5% bad for 1,940 s against 0.1% of 30 days
    assert inc.budget_spent(0.999) == pytest.approx(0.05 * 1940 / (0.001 * 30 * 86400))
    assert inc.detection_share() == pytest.approx(1040 / 1940)


def test_incident_refuses_out_of_order_times():
    with pytest.raises(ValueError, match="in order"):
        incidents.Incident(0.0, 100.0, 50.0, 200.0, 300.0, 0.1)
    with pytest.raises(ValueError, match="bad_fraction"):
        incidents.Incident(0.0, 1.0, 2.0, 3.0, 4.0, 0.0)


@pytest.mark.parametrize("e", [1.0, 0.05, 0.004, 0.0005])
def test_first_detection_matches_the_discrete_evaluation(e):
    name, t = incidents.first_detection(e, 0.999)
    best = math.inf
    for rule in RULES.values():
        step = rule.long_s / 720
        s = np.concatenate([np.zeros(720), np.full(1440, e)])
        best = min(best, slo.first_alert_s(s, step, rule, 0.999) - rule.long_s)
        if name == rule.name:
            assert t == pytest.approx(slo.first_alert_s(s, step, rule, 0.999) - rule.long_s, abs=step)
    if name is None:
        assert math.isinf(t) and math.isinf(best)


def _pooled(tracked, seeds=range(40), **kw):
    return [incidents.simulate_program(12, 8, 10, tracked, seed=s, **kw) for s in seeds]


def test_program_closure_matches_the_exponential():
    runs = _pooled(True)
    d = 30.0
    old = np.concatenate([r.item_open_s <= r.horizon_s - d * 86400 for r in runs])
    age = np.concatenate([r.item_close_s - r.item_open_s for r in runs])[old]
    assert np.mean(age <= d * 86400) == pytest.approx(1 - math.exp(-d / 21.0), abs=0.06)
    runs_u = _pooled(False)
    old = np.concatenate([r.item_open_s <= r.horizon_s - 90 * 86400 for r in runs_u])
    age = np.concatenate([r.item_close_s - r.item_open_s for r in runs_u])[old]
    assert np.mean(age <= 90 * 86400) == pytest.approx(0.5 * (1 - math.exp(-90 / 60.0)), abs=0.07)


def test_program_without_fixes_is_a_poisson_process_and_repeats_match_distinct_causes():
    runs = _pooled(True, seeds=range(200), fix_effect=0.0)
    n = np.array([r.times_s.size for r in runs])
    assert n.mean() == pytest.approx(8 * 12, rel=0.03)
    lam_t = 8 * 12 / 10  # expected incidents per cause over the run
    distinct = 10 * (1 - math.exp(-lam_t))
    repeats = np.array([r.repeat.sum() for r in runs])
    assert repeats.mean() == pytest.approx(8 * 12 - distinct, rel=0.03)


def test_tracking_lowers_repeats_and_detection_gaps():
    tr, un = _pooled(True), _pooled(False)
    rep = lambda runs: np.mean(np.concatenate([r.repeat for r in runs]))  # noqa: E731
    ttd = lambda runs: np.mean(np.concatenate([r.ttd_s for r in runs]))  # noqa: E731
    assert rep(tr) < rep(un)
    assert ttd(tr) < ttd(un)


def test_program_budget_is_the_incident_record():
    r = incidents.simulate_program(6, 5, 4, False, seed=3, untracked_abandon=1.0, mitigate_s=600.0)
    assert np.isinf(r.item_close_s).all()
    for ttd, b in zip(r.ttd_s, r.budget, strict=True):
        share = b * 0.001 * 30 * 86400 / (ttd + 600.0)
        assert 0 < share <= 1
    same = {c: r.budget[r.causes == c] for c in set(r.causes.tolist())}
    assert all(np.allclose(v, v[0]) for v in same.values())  # an unfixed cause costs the same each time


def test_program_impact_is_the_gap_plus_mitigation_and_prices_the_budget():
    """impact_s = detection gap + mitigate_s, and each incident's budget is its cause's share x impact over the
    budget in seconds: one share per cause, whatever the detection gap (fixed causes are detected sooner)."""
    r = incidents.simulate_program(12, 8, 5, True, seed=4, mitigate_s=900.0, fix_effect=0.5)
    assert r.mitigate_s == 900.0
    assert np.allclose(r.impact_s, r.ttd_s + 900.0)
    share = r.budget * 0.001 * 30 * 86400 / r.impact_s
    for c in set(r.causes.tolist()):
        assert np.allclose(share[r.causes == c], share[r.causes == c][0])
    assert len(set(r.ttd_s.round(6).tolist())) > 1  # the check is not vacuous: the gaps differ


def test_program_refuses_bad_input():
    with pytest.raises(ValueError, match="n_causes"):
        incidents.simulate_program(12, 5, 0, True)
    with pytest.raises(ValueError, match="fix_effect"):
        incidents.simulate_program(12, 5, 3, True, fix_effect=1.5)


def test_fmt_duration_picks_the_spoken_unit():
    from lib.units import fmt_duration

    assert fmt_duration(51.84) == "51.8 s"
    assert fmt_duration(518.4) == "8.64 min"
    assert fmt_duration(129600.0) == "36.0 h"
    assert fmt_duration(30 * 86400.0) == "30.0 days"
    assert fmt_duration(math.inf) == "never"
    with pytest.raises(ValueError, match="seconds"):
        fmt_duration(-1.0)
