"""lib.fleet.shared_pool (N048): the day's traffic, the reclaim buffer, and the three pool designs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import diurnal
from lib.fleet import shared_pool as sp


def test_diurnal_rate_mean_extremes_and_climb():
    r = sp.diurnal_rate(20, 120, dt=60)
    assert math.isclose(r.mean(), 70, rel_tol=1e-9)
    assert math.isclose(r.max(), 120) and r.min() >= 20 - 1e-9
    assert math.isclose(np.max(np.diff(r)) / 60, diurnal.steepest_climb(70, 6), rel_tol=1e-3)


def test_surge_shape():
    base = np.zeros(1440)
    s = sp.with_surge(base, 60, 10, 120, hold_s=3600)
    assert s[599] == 0 and math.isclose(s[601], 30) and s[602] == 60 and s[600 + 61] == 60 and s[600 + 62] == 0


@settings(max_examples=40, deadline=None)
@given(climb=st.floats(0, 0.05), surge=st.floats(0, 300), ramp=st.floats(0, 3600), rec=st.floats(1, 1000),
       rs=st.floats(0.01, 1), u=st.floats(0.3, 1))
def test_buffer_covers_climb_plus_surge_within_one_reclaim(climb, surge, ramp, rec, rs, u):
    b = sp.buffer_for(climb, surge, ramp, rec, rs, u)
    added = climb * rec + (surge if ramp == 0 else surge * min(1, rec / ramp))
    assert b * u / rs >= added - 1e-6


def _day(design, **kw):
    rates = sp.with_surge(sp.diurnal_rate(20, 120), 60, 10, 60)
    args = dict(utilization=0.7, reclaim=240, save_s=20, restart_s=300, buffer=17, floor=23,
                forecast=sp.diurnal_rate(20, 120))
    args.update(kw)
    return sp.simulate_day(rates, 0.196, 4, 51 * 4 + 256, 32, design=design, **args)


def test_designs_order_and_the_shared_pool_is_short_during_the_surge():
    de = _day("dedicated", floor=51)
    sh = _day("shared", buffer=0)
    fb = _day("floor_borrow")
    assert de.utilization < fb.utilization < sh.utilization
    assert sh.short_s > 0 and fb.short_s == 0 and de.short_s == 0
    assert de.preemptions == 0 and de.train_lost_gpu_s == 0
    assert (fb.train_gpus % 32 == 0).all() and (fb.held * 4 + fb.train_gpus <= 51 * 4 + 256).all()
    assert (fb.held >= 23).all()


def test_rises_arrive_one_reclaim_late_and_releases_at_once():
    rates = np.r_[np.full(100, 10.0), np.full(100, 50.0), np.full(100, 10.0)]
    r = sp.simulate_day(rates, 0.1, 1, 100, 8, design="shared", utilization=1.0, reclaim=600, save_s=0, restart_s=0)
    assert r.held[100] == 1 and r.held[109] == 1 and r.held[110] == 5
    assert r.held[200] == 1


def test_refusals():
    with pytest.raises(ValueError, match="design"):
        _day("greedy")
    with pytest.raises(ValueError, match="grow the pool"):
        sp.simulate_day(np.full(10, 1000.0), 1.0, 8, 64, 8, design="shared", utilization=0.5, reclaim=60, save_s=0,
                        restart_s=0)
