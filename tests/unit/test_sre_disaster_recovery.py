"""lib.sre.disaster_recovery: the recovery point's closed form against a walk of the replication
timeline, the recovery time's parts, and the bill's bookkeeping."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import disaster_recovery as dr
from lib.training.checkpoint import checkpoint_bytes


def test_replication_time_of_a_405b_checkpoint():
    # 405B x 14 bytes = 5.67 TB over 400 Gb/s (50 GB/s): 113.6 s
    b = checkpoint_bytes("llama-3.1-405b")
    assert dr.replication_s(b, 50e9) == pytest.approx(b / 50e9)
    assert dr.replication_s(b, 50e9, 0.25) == pytest.approx(0.25 * b / 50e9)
    assert 110 < dr.replication_s(b, 50e9) < 120


@settings(max_examples=30, deadline=None)
@given(every=st.floats(60, 86400), lag_share=st.floats(0, 1))
def test_recovery_point_matches_the_timeline(every, lag_share):
    lag = every * lag_share
    mean, worst = dr.recovery_point_s(every, lag)
    sim = dr.simulate_recovery_point(every, lag, losses=20_000, seed=1)
    assert sim.max() <= worst + 1e-6 * worst
    assert sim.min() >= lag - 1e-6 * worst
    # uniform on [L, E + L): sd E / sqrt(12)
    assert sim.mean() == pytest.approx(mean, abs=5 * every / math.sqrt(12 * 20_000))


def test_recovery_point_refuses_a_growing_backlog():
    with pytest.raises(ValueError, match="backlog"):
        dr.recovery_point_s(60.0, 120.0)


def _assess(strategy, outage_days=30.0):
    return dr.assess(strategy, 8192, 90.0, outage_days, lag_s=114.0, detect_s=300.0, decide_s=7200.0,
                     stage_s=3600.0, provision_s=30 * 86400.0, restore_s=60.0, reform_s=300.0, second_speed=0.3)


def test_bookkeeping():
    warm = _assess(dr.Strategy("warm", 3600.0, True, 0.25, 0.1))
    assert warm.rpo_mean_s == pytest.approx(1800 + 114)
    assert warm.rto.total_s == pytest.approx(300 + 7200 + 60 + 300)  # staged, standby: no stage, no provision
    assert warm.lost_progress_gpu_days == pytest.approx(8192 * (1800 + 114) / 86400)
    assert warm.idle_gpu_days == pytest.approx(8192 * warm.rto.total_s / 86400)
    # the building's 30 days outlast no run that has more than 0.3 x 29.9 days of work left
    w = (30 * 86400 - warm.rto.total_s) / 86400
    assert warm.slow_gpu_days == pytest.approx(8192 * (0.7 / 0.3 * (0.3 * w) ** 2 / 2 + 0.7 * w * (90 - 0.3 * w)) / 90)
    assert warm.warm_gpu_days == pytest.approx(0.25 * 8192 * 90 * 0.1)
    assert warm.expected_gpu_days(0.01) == pytest.approx(warm.warm_gpu_days + 0.01 * warm.loss_gpu_days)


def test_no_copy_loses_half_the_run_and_cold_waits_for_the_building():
    none = _assess(dr.Strategy("none", None, False, 0.0))
    assert none.rpo_mean_s == pytest.approx(45 * 86400)
    assert none.idle_gpu_days == pytest.approx(8192 * 30)  # provisioning (30 d) >= the outage: the job waits
    assert none.slow_gpu_days == 0.0
    cold = _assess(dr.Strategy("cold", 86400.0, False, 0.0))
    assert cold.loss_gpu_days < none.loss_gpu_days
    assert cold.warm_gpu_days == 0.0


def test_validation():
    with pytest.raises(ValueError, match="standby_fraction"):
        dr.Strategy("x", 60.0, True, 1.5)
    with pytest.raises(ValueError, match="changed_fraction"):
        dr.replication_s(1e12, 1e9, 2.0)
    with pytest.raises(ValueError, match="second_speed"):
        dr.assess(dr.Strategy("x", 60.0, True, 0.5), 8, 1.0, 1.0, 0, 0, 0, 0, 0, 0, 0, 1.5)


@settings(max_examples=25, deadline=None)
@given(run=st.floats(5, 180), out=st.floats(1, 365), speed=st.floats(0.0, 1.0))
def test_slow_days_match_simulated_losses(run, out, speed):
    # Monte Carlo oracle: a loss at a uniform time leaves R ~ U(0, run) days of work; on the second cluster at speed s
    # the run falls behind by min((1 - s) w, R (1 - s) / s) days, w the days the building stays out after recovery.
    import numpy as np

    r = dr.assess(dr.Strategy("warm", 3600.0, True, 0.25, 0.1), 100, run, out, lag_s=100.0, detect_s=300.0,
                  decide_s=7200.0, stage_s=0.0, provision_s=0.0, restore_s=60.0, reform_s=300.0, second_speed=speed)
    w = max(0.0, out - r.rto.total_s / 86400)
    rem = np.random.default_rng(0).uniform(0, run, 200_000)
    behind = np.full_like(rem, w) if speed == 0 else np.minimum((1 - speed) * w, rem * (1 - speed) / speed)
    assert r.slow_gpu_days / 100 == pytest.approx(behind.mean(), rel=0.01, abs=1e-3 * max(w, 1e-9) + 1e-9)


def test_incremental_delta_ships_nearly_everything():
    # an unchanged state compresses to almost nothing; one Adam step changes every fp32 weight and moment
    still = dr.incremental_delta(0, n=4096)
    assert still["w32"] == still["m"] == still["v"] == 0.0 and still["compressed"] < 0.02
    one = dr.incremental_delta(1, n=4096)
    assert one["w32"] > 0.99 and one["m"] == one["v"] == 1.0 and 0.0 < one["w16"] < 1.0
    many = dr.incremental_delta(300, n=4096)
    assert many["w16"] > one["w16"] and many["compressed"] > 0.6
    with pytest.raises(ValueError, match="steps"):
        dr.incremental_delta(-1)


def test_plan_copies_no_more_often_than_checkpoints_and_found_gpus_train():
    from lib.explorers.sre_recovery import dr_plan

    # a warm copy every 5 minutes cannot beat copying every local checkpoint (one every ~6 minutes here)
    d = dr_plan("llama-3.1-405b", "h100-sxm", 8192, 90.0, 400.0, 5.0, 0.25, 30.0, 0.02)
    assert d.results["warm"].strategy.replicate_every_s >= d.hot_every_s
    assert d.results["warm"].rpo_mean_s >= d.results["hot"].rpo_mean_s
    # with no copy the GPUs found after the loss restart the run, as they carry it in the cold strategy
    long = dr_plan("llama-3.1-70b", "h200", 1024, 7.0, 400.0, 60.0, 0.25, 180.0, 0.02)
    none, cold = long.results["no off-site copy"], long.results["cold"]
    assert none.slow_gpu_days == pytest.approx(cold.slow_gpu_days)
    assert 0 < none.slow_gpu_days < 1024 * (180 - 30)
