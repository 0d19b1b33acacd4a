"""lib.judgment.decisions: the decide-now vs wait model, its threshold, reversal pricing, outcomes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import decisions as d

money = st.floats(0.0, 1e6, allow_nan=False)
positive = st.floats(1.0, 1e6, allow_nan=False)
weeks = st.floats(0.05, 52.0, allow_nan=False)
prob = st.floats(0.0, 1.0, allow_nan=False)


def test_worked_numbers():
    # R = 5k, h = 20k/week, D = 10k/week, w = 1.2 weeks: p* = 29 / 41.
    assert d.threshold(5_000, 20_000, 10_000, 1.2) == pytest.approx(29 / 41)
    c = d.decide(0.8, 10_000, 20_000, 5_000, 1.2)
    assert c.cost_now_usd == pytest.approx(0.2 * 29_000)
    assert c.cost_wait_usd == pytest.approx(0.8 * 12_000)
    assert c.decide_now and c.bad_outcome_probability == pytest.approx(0.2)


@given(prob, positive, money, money, weeks)
@settings(max_examples=200, deadline=None)
def test_verdict_is_the_threshold(p, value, harm, rev, w):
    c = d.decide(p, value, harm, rev, w)
    assert 0 <= c.threshold <= 1
    if abs(p - c.threshold) > 1e-9:
        assert c.decide_now == (p > c.threshold)
    # at the threshold the two expected costs are equal
    at = d.decide(c.threshold, value, harm, rev, w)
    assert at.cost_now_usd == pytest.approx(at.cost_wait_usd, rel=1e-9, abs=1e-6)


@given(positive, money, money, money, weeks)
@settings(max_examples=200, deadline=None)
def test_costlier_reversal_raises_the_bar(value, harm, rev, extra, w):
    assert d.threshold(rev + extra, harm, value, w) >= d.threshold(rev, harm, value, w) - 1e-12


@given(positive, positive, weeks)
@settings(max_examples=100, deadline=None)
def test_free_reversal_floor(value, harm, w):
    assert d.threshold(0.0, harm, value, w) == pytest.approx(harm / (harm + value))


def test_simulation_matches_expectation():
    c = d.decide(0.7, 10_000, 20_000, 5_000, 1.0)
    sim = d.simulate_decisions(c, 100_000, seed=1)
    assert sim.cost_now_usd.mean() == pytest.approx(c.cost_now_usd, rel=0.03)
    assert sim.cost_wait_usd.mean() == pytest.approx(c.cost_wait_usd, rel=0.03)


def test_bad_outcomes():
    b = d.bad_outcomes(10, 0.8)
    assert b.expected_bad == pytest.approx(2.0)
    assert b.at_least_one == pytest.approx(1 - 0.8 ** 10)


def test_reversal_and_restart():
    assert d.restart_gpu_hours(50, 4, 180.0) == pytest.approx(10.0)
    assert d.reversal_cost_usd(1.0, 10.0, 2.5, engineer_week=6000) == pytest.approx(6025.0)


def test_evidence_days_uses_the_canary_sample_size():
    from lib.sre import canary

    assert d.evidence_days(0.02, 0.024, 1000) == pytest.approx(canary.requests_needed(0.02, 0.024) / 1000)


@pytest.mark.parametrize("args", [(-0.1, 1, 1, 1, 1), (1.5, 1, 1, 1, 1), (0.5, 0, 1, 1, 1), (0.5, 1, -1, 1, 1),
                                  (0.5, 1, 1, -1, 1), (0.5, 1, 1, 1, 0), (0.5, 1, 1, 1, math.nan)])
def test_bad_inputs_refused(args):
    with pytest.raises(ValueError):
        d.decide(*args)


def _enumerated_costs(p, value, harm, rev, w):
    """Expected regret of each choice by enumerating the two outcomes, from the cash each choice books over
    a horizon of 2w (no Decision formula): now+good earns 2 D w, now+bad loses h w + R, wait+good earns D w,
    wait+bad nothing."""
    cash = {("good", "now"): 2 * value * w, ("bad", "now"): -(harm * w + rev),
            ("good", "wait"): value * w, ("bad", "wait"): 0.0}
    out = {}
    for choice in ("now", "wait"):
        out[choice] = sum(prob * (max(cash[o, c] for c in ("now", "wait")) - cash[o, choice])
                          for o, prob in (("good", p), ("bad", 1 - p)))
    return out["now"], out["wait"]


@settings(max_examples=60, deadline=None)
@given(positive, money, money, weeks)
def test_threshold_against_brute_force_grid_of_confidence(value, harm, rev, w):
    import numpy as np

    grid = np.linspace(0.0, 1.0, 20_001)
    # each choice's expected regret is linear in p: its regrets in the two outcomes, weighted
    good_now, good_wait = _enumerated_costs(1.0, value, harm, rev, w)
    bad_now, bad_wait = _enumerated_costs(0.0, value, harm, rev, w)
    better = grid * good_now + (1 - grid) * bad_now < grid * good_wait + (1 - grid) * bad_wait
    first = float(grid[np.argmax(better)]) if better.any() else 1.0
    assert abs(first - d.threshold(rev, harm, value, w)) <= 1 / 20_000 + 1e-9
    case = d.decide(0.7, value, harm, rev, w)
    now, wait = _enumerated_costs(0.7, value, harm, rev, w)
    assert case.cost_now_usd == pytest.approx(now, rel=1e-9, abs=1e-9)
    assert case.cost_wait_usd == pytest.approx(wait, rel=1e-9, abs=1e-9)
