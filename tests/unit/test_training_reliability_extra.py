"""The checkpoint-write, asynchronous-checkpoint and restart-breakdown additions to lib.training.reliability."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import reliability as rel


def test_transfer_is_bytes_over_the_narrowest_pipe():
    assert rel.checkpoint_transfer_s(1e12, 1, 1e9) == pytest.approx(1000.0)
    assert rel.checkpoint_transfer_s(1e12, 1000, 1e9) == pytest.approx(1.0)
    assert rel.checkpoint_transfer_s(1e12, 1000, 1e9, storage_bytes_per_s=1e11) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="writers"):
        rel.checkpoint_transfer_s(1e12, 0, 1e9)
    with pytest.raises(ValueError, match="writer_bytes_per_s"):
        rel.checkpoint_transfer_s(1e12, 1, 0.0)


def test_async_with_zero_drain_is_the_blocking_formula():
    m = rel.job_mtbf_s(16384)
    for tau, c, r in ((60.0, 0.5, 0.0), (600.0, 3.0, 900.0), (3000.0, 400.0, 60.0)):
        assert rel.async_lost_fraction(tau, c, 0.0, m, r) == pytest.approx(rel.lost_fraction(tau, c, m, r))


def test_async_interval_is_young_above_the_drain_and_the_drain_below():
    m = 10_000.0
    assert rel.async_interval_s(0.01, 1.0, m) == pytest.approx(math.sqrt(2 * 0.01 * m))
    assert rel.async_interval_s(0.01, 100.0, m) == 100.0
    with pytest.raises(ValueError, match="drain_s"):
        rel.async_lost_fraction(10.0, 0.01, 20.0, m)
    with pytest.raises(ValueError, match="both be 0"):
        rel.async_interval_s(0.0, 0.0, m)


@settings(max_examples=40, deadline=None)
@given(b=st.floats(1e-3, 50.0), d=st.floats(0.0, 300.0), m=st.floats(3600.0, 1e6))
def test_async_interval_minimises_the_loss_over_allowed_intervals(b, d, m):
    tau = rel.async_interval_s(b, d, m)
    best = rel.async_lost_fraction(tau, b, d, m)
    for k in (1.01, 1.1, 2.0):
        assert rel.async_lost_fraction(tau * k, b, d, m) >= best - 1e-15
        if tau / k >= d:
            assert rel.async_lost_fraction(tau / k, b, d, m) >= best - 1e-15


def _segment_by_segment_goodput(tau, c, m, r, work, seed, runs):
    """The blocking job walked one checkpoint interval at a time (the oracle of lib's
    failure-by-failure sampler): compute tau, write for c; a failure restarts the interval."""
    rng = np.random.default_rng(seed)
    segments = math.ceil(work / tau)
    wall_total = 0.0
    for _ in range(runs):
        wall, done = 0.0, 0
        next_fail = rng.exponential(m)
        while done < segments:
            seg = min(tau, work - done * tau) + c
            if next_fail >= seg:
                wall += seg
                next_fail -= seg
                done += 1
            else:
                wall += next_fail + r
                next_fail = rng.exponential(m)
        wall_total += wall
    return work * runs / wall_total


@pytest.mark.parametrize("tau, c, r", [(300.0, 3.0, 900.0), (1000.0, 60.0, 0.0), (50.0, 0.5, 120.0)])
def test_goodput_sampler_against_a_segment_by_segment_walk(tau, c, r):
    m = rel.job_mtbf_s(16384)
    lib = rel.simulate_goodput(tau, c, m, r, work_s=50 * m, seed=4, runs=5)
    walk = _segment_by_segment_goodput(tau, c, m, r, 50 * m, seed=4, runs=5)
    assert lib == pytest.approx(walk, rel=1e-9)  # the same draws, consumed in the same order


@pytest.mark.parametrize("tau,b,d", [(60.0, 0.01, 3.0), (120.0, 0.1, 60.0), (600.0, 1.0, 600.0)])
def test_async_simulation_agrees_with_the_closed_form(tau, b, d):
    # No restart: the first-order closed form is exact up to O(((tau + D) / M)^2); 1,000 runs of 200 MTBFs.
    m = 20_000.0
    sim = rel.simulate_async_goodput(tau, b, d, m, 0.0, seed=1, runs=1000)
    assert sim == pytest.approx(1 - rel.async_lost_fraction(tau, b, d, m), abs=3e-4 + ((tau + d) / m) ** 2 / 2)


def test_async_simulation_detects_a_rewind_that_ignores_the_drain():
    # The rewind reaches back to the last DURABLE checkpoint: a long drain costs about D / M more.
    m, tau, d = 20_000.0, 1000.0, 1000.0
    sim = rel.simulate_async_goodput(tau, 1e-6, d, m, 0.0, seed=2, runs=1000)
    wrong = 1 - (tau / 2) / m  # forgetting the drain
    right = 1 - rel.async_lost_fraction(tau, 1e-6, d, m)
    assert abs(sim - right) < 0.2 * abs(wrong - right)


def test_restart_breakdown_sums_to_the_lost_fraction():
    m = rel.job_mtbf_s(4096)
    parts = rel.restart_loss_breakdown(m, 600.0, 600.0, 180.0, 150.0, blocking_s=0.5, drain_s=30.0)
    assert set(parts) == {"detection", "rescheduling", "reload", "rewound", "checkpoint"}
    assert sum(parts.values()) == pytest.approx(rel.async_lost_fraction(600.0, 0.5, 30.0, m, 930.0))
    assert parts["detection"] == pytest.approx(600.0 / m)
    with pytest.raises(ValueError, match="detect_s"):
        rel.restart_loss_breakdown(m, 600.0, -1.0, 0.0, 0.0)
