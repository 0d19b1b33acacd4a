"""lib.judgment.incident_people: action-item repeats, incident prices, the counterfactual canary and the
take-over point, each against a second method (simulation or a closed form)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import incident_people as ip
from lib.sre import incidents

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


def _brute_takeover(median_s, sigma, your_s, limit_s, t_max, n_points=40_001):
    """The largest take-over point on a grid whose expected time to mitigate fits the limit, each point's
    expectation summed over a discretized density (no closed form): E(t) = sum_i w_i min(T_i, t) +
    your_s sum_{T_i > t} w_i."""
    z = np.linspace(-12.0, 12.0, 400_001)
    w = np.exp(-z * z / 2)
    w /= w.sum()
    tt = np.exp(math.log(median_s) + sigma * z)
    cw, cwt = np.cumsum(w), np.cumsum(w * tt)
    cand = np.linspace(0.0, t_max, n_points)
    k = np.searchsorted(tt, cand, side="right")
    below = np.where(k > 0, cwt[np.maximum(k - 1, 0)], 0.0)
    wb = np.where(k > 0, cw[np.maximum(k - 1, 0)], 0.0)
    e = below + cand * (1 - wb) + your_s * (1 - wb)
    fits = e <= limit_s
    return float(cand[fits].max()), float(cand[1] - cand[0])


def test_expected_finish_ends_and_against_sampling():
    assert ip.expected_finish_s(0.0, 900, 0.8, 480) == 480
    assert ip.expected_finish_s(math.inf, 900, 0.8, 480) == pytest.approx(900 * math.exp(0.32))
    rng = np.random.default_rng(0)
    t = np.exp(math.log(900) + 0.8 * rng.standard_normal(400_000))
    for cut in (300.0, 900.0, 3000.0):
        want = np.where(t <= cut, t, cut + 480).mean()
        assert ip.expected_finish_s(cut, 900, 0.8, 480) == pytest.approx(want, rel=0.01)


def test_takeover_point_is_the_largest_fitting_point_by_brute_force():
    # a full outage: the allowance binds; the point is where the plan's expected extra time uses it up
    p = ip.takeover_plan(1.0, 0.999, 0.5, 900, 0.8, 480, 0.05)
    assert p.reason == "allowance" and 0 < p.takeover_s < p.breach_s - 480
    assert ip.expected_finish_s(p.takeover_s, 900, 0.8, 480) == pytest.approx(p.limit_s, rel=1e-12)
    assert p.budget_plan - p.budget_you_only == pytest.approx(0.05, rel=1e-9)  # exactly the allowance
    brute, step = _brute_takeover(900, 0.8, 480, p.limit_s, 4 * p.takeover_s)
    assert abs(brute - p.takeover_s) <= step + 1e-3 * p.takeover_s
    mean, share = ip.simulate_takeover(p, 900, 0.8, trials=200_000, seed=3)
    assert mean == pytest.approx(p.expected_s, rel=0.02)
    assert share == pytest.approx(p.p_mentee, abs=0.01)
    # a mentee much faster than you at first, then stuck: E(t) rises, falls below the limit and rises again,
    # so the largest crossing is not the first one
    # (median 5 min, log-sd 1.5, you 10 min, an allowance of about 2 s: E peaks near 603 s, dips to 511 s)
    q = ip.takeover_plan(0.01, 0.999, 1.0, 300, 1.5, 600, 8e-6)
    ts = np.linspace(0.5, q.takeover_s, 4000)
    es = np.array([ip.expected_finish_s(x, 300, 1.5, 600) for x in ts])
    assert q.reason == "allowance" and (es > q.limit_s).any()  # an earlier stretch above the limit
    brute, step = _brute_takeover(300, 1.5, 600, q.limit_s, 3 * q.takeover_s)
    assert abs(brute - q.takeover_s) <= step + 2e-3 * q.takeover_s


def test_takeover_plan_last_chance_never_and_no_allowance():
    # plenty of allowance: coaching to the end fits, so the only point is the last chance to beat the breach
    p = ip.takeover_plan(0.10, 0.999, 0.5, 900, 0.8, 480, 0.05)
    assert p.reason == "last chance" and p.takeover_s == pytest.approx(p.breach_s - 480)
    assert p.finish_after_takeover_s == pytest.approx(p.breach_s)
    assert ip.expected_finish_s(p.takeover_s, 900, 0.8, 480) <= p.limit_s
    # your own fix cannot beat the breach and coaching to the end fits: never take over
    n = ip.takeover_plan(0.3, 0.9995, 0.05, 900, 0.8, 1200, 0.2)
    assert n.reason == "never" and math.isinf(n.takeover_s) and n.p_mentee == 1.0
    assert n.expected_s == pytest.approx(n.mentee_only_s)
    mean, share = ip.simulate_takeover(n, 900, 0.8, trials=50_000, seed=1)
    assert share == 1.0 and mean == pytest.approx(n.mentee_only_s, rel=0.03)
    # no allowance: take the keyboard at once (E rises from your time at t = 0)
    z = ip.takeover_plan(1.0, 0.999, 0.5, 900, 0.8, 480, 0.0)
    assert z.takeover_s == 0.0 and z.p_mentee == 0.0 and z.expected_s == pytest.approx(480)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.001, 1.0), st.floats(0.01, 1.0), st.floats(60, 7200), st.floats(0.1, 2.0), st.floats(60, 3600),
       st.floats(0.0, 0.5))
def test_takeover_plan_properties(e, left, med, sig, you, allow):
    p = ip.takeover_plan(e, 0.999, left, med, sig, you, allow)
    assert 0 <= p.p_mentee <= 1 and p.takeover_s >= 0
    assert p.limit_s == pytest.approx(p.you_only_s + p.allowance_s)
    # the plan's expected extra budget never exceeds the allowance
    assert p.budget_plan - p.budget_you_only <= allow + 1e-9
    if p.you_only_s < p.breach_s:  # taking over at the point still beats the breach
        assert p.finish_after_takeover_s <= p.breach_s * (1 + 1e-9)
    if p.reason == "allowance":  # and no later point fits: just past it the expectation exceeds the limit
        assert ip.expected_finish_s(p.takeover_s * (1 + 1e-6) + 1e-6, med, sig, you) > p.limit_s
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
    full = ip.takeover_plan(1.0, 0.999, 0.5, 900, 0.8, 480, 0.05)
    assert t.values["takeover_s"] == full.takeover_s > 0  # a full outage: the allowance is minutes, then take over
