"""lib.judgment.incident_people: action-item repeats, incident prices, the counterfactual canary and the
take-over point, each against a second method (simulation or a closed form)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import incident_people as ip
from lib.sre import incidents, slo

DAY = 86400.0


def test_closed_by_limits():
    assert incidents.closed_by(0, 21 * DAY, 0.0) == 0.0
    assert incidents.closed_by(1e9, 21 * DAY, 0.5) == pytest.approx(0.5)
    assert incidents.closed_by(90 * DAY, 60 * DAY, 0.5) == pytest.approx(0.5 * (1 - math.exp(-1.5)))


def test_expected_repeats_limits():
    r = 1 / (30 * DAY)
    h = 365 * DAY
    assert incidents.expected_repeats(r, h, 21 * DAY, 0.0, 0.0) == pytest.approx(r * h)  # no fix: all recur
    assert incidents.expected_repeats(r, h, 21 * DAY, 1.0, 1.0) == pytest.approx(r * h)  # never closed
    # instant closure and a perfect fix: nothing recurs
    assert incidents.expected_repeats(r, h, 1e-6, 0.0, 1.0) == pytest.approx(0.0, abs=1e-9)


def test_expected_repeats_matches_simulate_program():
    """The closed form applied to each cause's first-incident time against simulate_program's counts."""
    months, ipm, causes = 12, 40.0, 200
    kw = dict(tracked_close_days=21.0, untracked_close_days=60.0, untracked_abandon=0.5, fix_effect=0.8)
    rate = ipm / causes / (30 * DAY)
    for tracked in (True, False):
        got = want = 0.0
        for seed in range(6):
            run = incidents.simulate_program(months, ipm, causes, tracked, seed=seed, **kw)
            first = {}
            for t, c in zip(run.times_s, run.causes, strict=True):
                first.setdefault(int(c), float(t))
            got += run.repeat.sum()
            m = (21.0 if tracked else 60.0) * DAY
            a = 0.0 if tracked else 0.5
            want += sum(incidents.expected_repeats(rate, run.horizon_s - t0, m, a, 0.8) for t0 in first.values())
        assert got == pytest.approx(want, rel=0.08), (tracked, got, want)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(1.0, 200.0))
def test_expected_repeats_monotone(abandon, fix, close_days):
    r, h = 1 / (30 * DAY), 365 * DAY
    base = incidents.expected_repeats(r, h, close_days * DAY, abandon, fix)
    assert 0 <= base <= r * h + 1e-9
    assert incidents.expected_repeats(r, h, close_days * DAY, min(1.0, abandon + 0.1), fix) >= base - 1e-9
    assert incidents.expected_repeats(r, h, close_days * DAY * 2, abandon, fix) >= base - 1e-9


def test_incident_cost_by_hand():
    inc = incidents.Incident(0, 60, 660, 1560, 5000, 0.1)
    c = ip.incident_cost(inc, 0.999, qps=500, gpus=64, usd_per_gpu_hour=2.0)
    assert c.budget == pytest.approx(0.1 * 1500 / (0.001 * 30 * DAY))
    assert c.budget_before_detection == pytest.approx(0.1 * 600 / (0.001 * 30 * DAY))
    assert c.bad_requests == pytest.approx(500 * 0.1 * 1500)
    assert c.gpu_hours == pytest.approx(64 * 0.1 * 1500 / 3600)
    assert c.usd == pytest.approx(c.gpu_hours * 2.0)
    with pytest.raises(ValueError, match="Incident"):
        ip.incident_cost("x", 0.999, 1, 1)


def test_canary_catch_budget_and_monte_carlo():
    cc = ip.canary_catch(0.1, 0.001, 0.01, 500, 0.999, 900, bake_s=600)
    assert cc.detect_s == 600 and cc.collect_s < 600
    assert cc.budget == pytest.approx(0.01 * 0.1 * 1500 / (0.001 * 30 * DAY))
    # the requests it needs give about the asked power by simulation of the exact test
    from lib.sre import canary
    n = max(1, round(cc.requests))
    _, det = canary.detection_monte_carlo(n, 0.001, 0.001 + 0.1 * 0.999, 0.05, trials=20000, seed=1)
    assert det >= 0.7
    with pytest.raises(ValueError):
        ip.canary_catch(1.0, 0.5, 0.01, 500, 0.999, 900)


def test_lognormal_mean_after_against_sampling():
    rng = np.random.default_rng(0)
    t = np.exp(math.log(900) + 0.8 * rng.standard_normal(400_000))
    for cut in (0.0, 600.0, 1800.0):
        assert ip.lognormal_mean_after(cut, 900, 0.8) == pytest.approx(t[t > cut].mean(), rel=0.02)


def test_takeover_plan_against_simulation_and_limits():
    p = ip.takeover_plan(0.10, 0.999, 0.5, 900, 0.8, 480, 0.05)
    assert p.burn == pytest.approx(100)
    assert p.allowance_s == pytest.approx(0.05 * slo.exhaustion_s(100))
    assert p.reason == "allowance"
    assert ip.lognormal_mean_after(p.takeover_s, 900, 0.8) == pytest.approx(p.limit_s, rel=1e-4)
    mean, share = ip.simulate_takeover(p, 900, 0.8, trials=200_000, seed=3)
    assert mean == pytest.approx(p.expected_s, rel=0.02)
    assert share == pytest.approx(p.p_mentee, abs=0.01)
    # a full outage with little budget left: keep the keyboard
    q = ip.takeover_plan(1.0, 0.999, 0.2, 900, 0.8, 480, 0.05)
    assert q.takeover_s == 0.0 and q.p_mentee == 0.0 and q.expected_s == pytest.approx(480)
    # no allowance, plenty of budget: take over the moment the mentee's expected finish passes yours
    z = ip.takeover_plan(0.01, 0.999, 1.0, 300, 0.8, 480, 0.0)
    assert ip.lognormal_mean_after(z.takeover_s, 300, 0.8) == pytest.approx(480, rel=1e-4)


def test_takeover_plan_last_chance_and_faster_mentee():
    # little budget left and a slow mentor: the point moves to breach - your time, so your fix beats the breach
    p = ip.takeover_plan(0.10, 0.999, 0.05, 900, 0.8, 1200, 0.05)
    assert p.reason == "last chance"
    assert p.takeover_s == pytest.approx(p.breach_s - 1200)
    assert p.finish_after_takeover_s == pytest.approx(p.breach_s)
    assert ip.lognormal_mean_after(p.takeover_s, 900, 0.8) < p.limit_s
    # a mentee faster than you: coaching is the cheaper plan
    f = ip.takeover_plan(0.10, 0.999, 0.5, 180, 0.8, 480, 0.05)
    assert f.takeover_s > 0 and f.budget_plan < f.budget_you_only
    mean, share = ip.simulate_takeover(f, 180, 0.8, trials=100_000, seed=5)
    assert mean == pytest.approx(f.expected_s, rel=0.02) and share == pytest.approx(f.p_mentee, abs=0.01)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.001, 1.0), st.floats(0.01, 1.0), st.floats(60, 7200), st.floats(0.1, 2.0), st.floats(60, 3600),
       st.floats(0.0, 0.5))
def test_takeover_plan_properties(e, left, med, sig, you, allow):
    p = ip.takeover_plan(e, 0.999, left, med, sig, you, allow)
    assert 0 <= p.p_mentee <= 1 and p.takeover_s >= 0
    assert p.limit_s <= p.breach_s + 1e-9
    if p.you_only_s < p.breach_s:  # taking over at the point still beats the breach
        assert p.finish_after_takeover_s <= p.breach_s * (1 + 1e-9)
    # the plan is never slower in expectation than the worse of its two pure strategies
    assert p.expected_s <= max(p.mentee_only_s, p.you_only_s + p.takeover_s) + 1e-6


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="mentee_sigma"):
        ip.takeover_plan(0.1, 0.999, 0.5, 900, 5.0, 480, 0.05)
    with pytest.raises(ValueError, match="abandon"):
        incidents.expected_repeats(1e-6, 1e6, 1e5, 1.5, 0.5)


def test_lognormal_sf():
    assert ip.lognormal_sf(900, 900, 0.8) == pytest.approx(0.5)
    assert ip.lognormal_sf(0, 900, 0.8) == 1.0
    rng = np.random.default_rng(1)
    t = np.exp(math.log(900) + 0.8 * rng.standard_normal(200_000))
    assert ip.lognormal_sf(2000, 900, 0.8) == pytest.approx(float(np.mean(t > 2000)), abs=0.005)


def test_explorer_views_agree_with_lib():
    from lib.book import widgets

    v = widgets.render("behavioral.action_items", recur_per_month=1.0, horizon_months=12.0, owned_close_days=21.0,
                       decor_close_days=60.0, decor_abandon=0.5, fix_effect=0.8, vague_fix_effect=0.1)
    assert v.values["owned"] == pytest.approx(incidents.expected_repeats(1 / (30 * DAY), 360 * DAY, 21 * DAY, 0.0, 0.8))
    assert v.values["owned"] < v.values["decor"] < v.values["none"]
    m = widgets.render("behavioral.mistake_price", fail_share=0.1, target=0.999, qps=400.0, rollback_min=15.0,
                       canary_share=0.01, bake_min=10.0)
    assert m.values["budget"] == pytest.approx(0.1 * (518.4 + 900) / (0.001 * 30 * DAY))
    assert m.values["canary"] < m.values["budget"]
    t = widgets.render("behavioral.takeover", bad_fraction=1.0, target=0.999, budget_left=0.5, mentee_median_min=15.0,
                       mentee_sigma=0.8, your_min=8.0, allowance=0.05)
    assert t.values["takeover_s"] == 0.0  # a full outage: keep the keyboard
