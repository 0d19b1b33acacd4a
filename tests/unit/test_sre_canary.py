"""lib.sre.canary: sample sizes against the exact binomial test and Monte Carlo; rollout arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import canary as c


def test_z_values_match_tables():
    assert c.z_value(0.95) == pytest.approx(1.6449, abs=1e-4)  # standard normal table
    assert c.z_value(0.80) == pytest.approx(0.8416, abs=1e-4)


def test_textbook_sample_size():
    # one-sample test of a proportion, 1% -> 2%, alpha 0.05 one-sided, power 0.8: about 792
    assert c.requests_needed(0.01, 0.02) == pytest.approx(792.35, rel=1e-3)


@pytest.mark.parametrize("n,p", [(10, 0.3), (57, 0.01), (400, 0.002)])
def test_binomial_sf_against_brute_force(n, p):
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    for k in range(0, n + 2, max(1, n // 7)):
        assert c.binomial_sf(k, n, p) == pytest.approx(sum(pmf[k:]), rel=1e-9, abs=1e-300)


@settings(max_examples=40, deadline=None)
@given(st.integers(5, 3000), st.floats(0.0005, 0.2), st.sampled_from([0.01, 0.05, 0.1]))
def test_critical_count_is_the_smallest_significant_count(n, p0, alpha):
    k = c.critical_count(n, p0, alpha)
    if k <= n:
        assert c.binomial_sf(k, n, p0) <= alpha
    if k >= 1:
        assert c.binomial_sf(k - 1, n, p0) > alpha


@pytest.mark.parametrize("p0,p1", [(0.001, 0.002), (0.01, 0.02), (0.05, 0.08)])
def test_exact_n_reaches_power_by_monte_carlo(p0, p1):
    n = c.requests_needed_exact(p0, p1)
    assert c.power_exact(n, p0, p1) >= 0.8 > c.power_exact(n - 1, p0, p1)
    fa, det = c.detection_monte_carlo(n, p0, p1, trials=200_000, seed=1)
    assert det == pytest.approx(c.power_exact(n, p0, p1), abs=0.005)
    assert fa <= 0.05 + 0.002
    # the normal approximation is within 25% of the exact answer for these rates
    assert c.requests_needed(p0, p1) == pytest.approx(n, rel=0.25)


def test_power_normal_at_the_normal_n_is_the_target():
    n = c.requests_needed(0.001, 0.002, 0.05, 0.9)
    assert c.power_normal(n, 0.001, 0.002, 0.05) == pytest.approx(0.9, abs=1e-9)


def test_two_sample_needs_about_twice_per_arm():
    one, two = c.requests_needed(0.001, 0.002), c.requests_needed(0.001, 0.002, two_sample=True)
    assert 1.8 < two / one < 2.6


def test_rollout_and_false_alarm():
    plan = c.rollout_plan([0.01, 0.1], 1000, 100.0, min_stage_s=600.0)
    assert [s.collect_s for s in plan] == pytest.approx([1000.0, 100.0])
    assert [s.duration_s for s in plan] == pytest.approx([1000.0, 600.0])
    assert c.false_alarm(0.05, 4) == pytest.approx(1 - 0.95**4)
    rng = np.random.default_rng(0)
    sim = np.mean((rng.random((100_000, 4)) < 0.05).any(axis=1))
    assert sim == pytest.approx(c.false_alarm(0.05, 4), abs=0.005)


def test_refusals():
    with pytest.raises(ValueError, match="p1 must exceed p0"):
        c.requests_needed(0.02, 0.01)
    with pytest.raises(ValueError, match="alpha"):
        c.requests_needed(0.01, 0.02, alpha=0.0)
    with pytest.raises(ValueError, match="shares"):
        c.rollout_plan([0.1, 0.05], 100, 10.0)
    with pytest.raises(ValueError, match="exact search"):
        c.requests_needed_exact(1e-6, 1.1e-6)


@pytest.mark.parametrize("n", [300, 8026, 100_000])
def test_detectable_rate_inverts_requests_needed(n):
    p1 = c.detectable_rate(n, 0.001)
    assert c.requests_needed(0.001, p1) == pytest.approx(n, rel=1e-6)
