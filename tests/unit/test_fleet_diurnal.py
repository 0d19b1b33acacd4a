"""lib.fleet.diurnal: the day's curve, the fixed fleet, the autoscaler replay against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import diurnal
from lib.fleet.capacity import request_cost
from lib.perf.deployment import deployment


@pytest.fixture(scope="module")
def cost():
    return request_cost(deployment("llama-3.1-70b", "h100-sxm", tp=4), 2000, 300, 0.05)


def test_peak_to_mean():
    assert diurnal.peak_to_mean(3.0) == pytest.approx(1.5)
    assert diurnal.peak_to_mean(1.0) == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(st.floats(0.1, 1000), st.floats(1.0, 10.0), st.floats(0, 24))
def test_demand_mean_peak_trough(mean, r, peak_hour):
    t = np.arange(0, diurnal.DAY_S, 30.0)
    rate = diurnal.demand(t, mean, r, peak_hour)
    assert rate.mean() == pytest.approx(mean, rel=1e-9)
    assert rate.max() <= mean * diurnal.peak_to_mean(r) * (1 + 1e-12)
    assert rate.max() / rate.min() == pytest.approx(r, rel=1e-3)


def test_fixed_fleet(cost):
    ff = diurnal.fixed_fleet(cost, 40.0, 3.0)
    assert ff.peak_rate == pytest.approx(60.0)
    assert ff.replicas == math.ceil(60.0 * cost.replica_s / 0.7)
    assert ff.busy_fraction == pytest.approx(40.0 * cost.replica_s / ff.replicas)
    assert ff.idle_replica_h == pytest.approx(ff.paid_replica_h - ff.work_replica_h)


@pytest.mark.parametrize("start_s,lead", [(0.0, False), (190.0, False), (190.0, True), (1800.0, True)])
def test_autoscaler_between_floor_and_fixed(cost, start_s, lead):
    ff = diurnal.fixed_fleet(cost, 40.0, 3.0)
    run = diurnal.autoscale_day(cost, 40.0, 3.0, start_s, lead_s=start_s + 60 if lead else 0.0)
    assert diurnal.fluid_replica_hours(cost, 40.0) <= run.paid_replica_h <= ff.paid_replica_h
    assert np.all(run.paid >= run.ready)
    if lead:
        assert run.over_plan_min == 0  # a forecast one start ahead keeps up with a smooth day


def test_reactive_lag_within_the_ramp_bound(cost):
    for start_s in (60.0, 600.0, 3600.0):
        run = diurnal.autoscale_day(cost, 40.0, 3.0, start_s)
        assert run.worst_deficit <= diurnal.ramp_lag_replicas(cost, 40.0, 3.0, start_s + 60) + 1e-9


def test_instant_start_no_cooldown_tracks_the_ceiling(cost):
    run = diurnal.autoscale_day(cost, 40.0, 3.0, 0.0, cooldown_s=0.0, min_replicas=0)
    assert np.array_equal(run.ready, np.ceil(run.need - 1e-9))


def test_burst_overloads_for_about_one_start(cost):
    start_s = 600.0
    run = diurnal.autoscale_day(cost, 40.0, 3.0, start_s, lead_s=start_s + 60, burst_hour=9.0, burst_s=1800.0,
                                burst_factor=2.0)
    # a doubling exceeds the 1 / 0.7 headroom: overloaded until the launched replicas serve
    assert start_s / 60 - 1 <= run.overload_min <= start_s / 60 + 2
    calm = diurnal.autoscale_day(cost, 40.0, 3.0, start_s, lead_s=start_s + 60, burst_hour=9.0, burst_s=1800.0,
                                 burst_factor=1.2)
    assert calm.overload_min == 0


def test_day_costs(cost):
    ff = diurnal.fixed_fleet(cost, 40.0, 3.0)
    run = diurnal.autoscale_day(cost, 40.0, 3.0, 190.0, lead_s=250.0)
    c = diurnal.day_costs(ff, run, 10.0, 0.4)
    assert c.fixed_reserved == pytest.approx(ff.replicas * 24 * 10 * 0.6)
    assert c.auto_on_demand == pytest.approx(run.paid_replica_h * 10)
    assert c.base_replicas == run.paid.min()
    assert c.hybrid <= c.auto_on_demand  # reserving the always-on base never costs more
    assert c.cheapest == "a reserved base with on-demand peaks"


@pytest.mark.parametrize("call", [
    lambda c: diurnal.demand(0, 0, 3),
    lambda c: diurnal.demand(0, 1, 0.5),
    lambda c: diurnal.fixed_fleet("not a cost", 1, 3),
    lambda c: diurnal.autoscale_day(c, 1, 3, -1),
    lambda c: diurnal.autoscale_day(c, 1, 3, 10, step_s=0),
    lambda c: diurnal.ramp_lag_replicas(c, 1, 3, -5),
])
def test_bad_inputs(cost, call):
    with pytest.raises(ValueError):
        call(cost)
