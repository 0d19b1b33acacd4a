"""lib.fleet.autoscaling (W03): the GPU-utilization reading, warm spares, and the fluid fleet simulation."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import autoscaling as asc


def test_gpu_util_reading_saturates_and_matches_monte_carlo():
    assert asc.gpu_util_reading(0.0, 10.0) == 0.0
    assert asc.gpu_util_reading(1.0, 10.0) > 0.9999
    rng = np.random.default_rng(0)
    r, d, horizon = 0.05, 10.0, 200_000.0
    arr = np.sort(rng.uniform(0, horizon, rng.poisson(r * horizon)))
    grid = np.linspace(0, horizon, 20_001)
    idx = np.searchsorted(arr, grid, side="right")
    last = np.where(idx > 0, arr[np.maximum(idx - 1, 0)], -np.inf)
    busy = np.mean(grid - last < d)
    assert abs(busy - asc.gpu_util_reading(r, d)) < 0.02


@settings(max_examples=50, deadline=None)
@given(rise=st.floats(0, 500), ramp_s=st.floats(0, 3600), start=st.floats(0, 1000), rs=st.floats(0.01, 2),
       u=st.floats(0.1, 1))
def test_spares_cover_the_load_added_during_one_start(rise, ramp_s, start, rs, u):
    k = asc.spares_for_ramp(rise, ramp_s, start, rs, u)
    added = rise if ramp_s == 0 else rise * min(1, start / ramp_s)
    assert k * u / rs >= added - 1e-6
    assert (k - 1) * u / rs < added + 1e-6 or k == 0


def test_fixed_fleet_queue_is_the_overflow_integral():
    rates = asc.ramp(300, 10, 30, 50, 0)
    run = asc.simulate(rates, 0.2, 100, policy="fixed", replicas0=4)  # capacity 20 requests/s
    want = np.cumsum(np.maximum(rates - 20, 0))
    assert np.allclose(run.queue, want)
    assert math.isclose(run.wait_s[-1], want[-1] * 0.2 / 4)


def test_queue_autoscaler_with_spares_beats_none_and_gpu_util_holds_more():
    rates = asc.ramp(1800, 20, 60, 300, 600)
    kw = dict(replicas0=6, utilization=0.7, request_s=10.0, max_replicas=64)
    q0 = asc.simulate(rates, 0.196, 190, policy="queue", **kw)
    qs = asc.simulate(rates, 0.196, 190, policy="queue", spares=4, **kw)
    g = asc.simulate(rates, 0.196, 190, policy="gpu_util", **kw)
    assert qs.slo_violation_s(1.0) <= q0.slo_violation_s(1.0)
    assert g.gpu_hours > qs.gpu_hours and g.ready.max() == 64


def test_shedding_batch_lowers_the_wait():
    rates = asc.ramp(600, 50, 250, 60, 0)
    kw = dict(replicas0=40, max_replicas=40, batch_share=0.3)
    a = asc.simulate(rates, 0.196, 190, policy="fixed", **kw)
    b = asc.simulate(rates, 0.196, 190, policy="fixed", shed_after_s=1.0, **kw)
    assert b.max_wait_s < a.max_wait_s and b.shed_requests > 0


def test_refusals():
    with pytest.raises(ValueError, match="policy"):
        asc.simulate(np.ones(3), 0.1, 1, policy="cpu", replicas0=1)
    with pytest.raises(ValueError, match="replicas0"):
        asc.simulate(np.ones(3), 0.1, 1, replicas0=0)
    with pytest.raises(ValueError, match="rise"):
        asc.spares_for_ramp(-1, 10, 10, 0.1, 0.7)
