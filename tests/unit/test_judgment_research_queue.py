"""lib.judgment.research_queue: FIFO placement against a brute-force simulation, the idle-slot
condition, Pollaczek-Khinchine against Lindley's recursion, the fast lane, and the rollout interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import research_queue as rq
from lib.scheduling.queueing import lindley_waits


def brute_fifo(cluster, running, queued, step=1.0):
    """FIFO gang scheduling on an integer time grid (durations are integers in these tests)."""
    ends = [(j.duration_s, j.gpus) for j in running]
    queue, t, out = list(queued), 0.0, []
    while queue:
        free = cluster - sum(g for e, g in ends if e > t)
        if queue[0].gpus <= free:
            j = queue.pop(0)
            out.append(t)
            ends.append((t + j.duration_s, j.gpus))
            continue
        t += step
    return np.array(out)


jobs = st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 20)), min_size=0, max_size=8)


@settings(max_examples=60, deadline=None)
@given(run=jobs, que=jobs)
def test_fifo_starts_match_a_time_stepped_simulation(run, que):
    cluster = 16
    running, used = [], 0
    for g, d in run:
        if used + g <= cluster:
            running.append(rq.Job("a", g, float(d)))
            used += g
    queued = [rq.Job("b", g, float(d)) for g, d in que]
    got = rq.fifo_starts(cluster, running, queued)
    assert np.allclose(got, brute_fifo(cluster, running, queued))
    assert np.all(np.diff(got) >= 0)  # FIFO: starts in order


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 15), share=st.floats(0.001, 0.2))
def test_a_pilot_that_fits_delays_nobody_and_one_that_does_not_fit_does(seed, n, share):
    snap = rq.pool_snapshot(128, ["a", "b"], n, 6 * 3600.0, seed)
    req = rq.Job("b", 32, 12 * 3600.0)
    p = rq.pilot_run(req, snap, share)
    base = rq.fifo_starts(128, snap.running, snap.queued)
    if p.gpus == 0:
        assert snap.cluster_gpus - snap.busy_gpus - sum(j.gpus for j, s in zip(snap.queued, base, strict=True) if s <= 0) < 1
        return
    moved = rq.fifo_starts(128, snap.running + (rq.Job("b", p.gpus, p.duration_s),), snap.queued)
    if p.fits:
        assert np.allclose(moved, base)
        assert p.duration_s == pytest.approx(share * req.gpu_s / p.gpus)
    elif base.size:
        assert np.any(moved > base + 1e-9)


def test_slot_window_is_zero_when_too_few_gpus_are_free_and_open_when_nothing_waits():
    snap = rq.Snapshot(16, (rq.Job("a", 12, 10.0),), ())
    assert rq.slot_window_s(snap, 8) == 0.0
    assert math.isinf(rq.slot_window_s(snap, 4))
    snap = rq.Snapshot(16, (rq.Job("a", 12, 10.0),), (rq.Job("b", 16, 5.0),))
    assert rq.slot_window_s(snap, 4) == 10.0  # the 16-GPU job starts when the running one ends


def test_pool_mean_wait_agrees_with_lindley():
    g, d = rq.job_sizes(300_000, 3600.0, 0.8, seed=3)
    svc = g * d / 256
    rho = 0.8
    arr = np.cumsum(np.random.default_rng(4).exponential(svc.mean() / rho, svc.size))
    want = rq.pool_mean_wait_s(rho, g, d, 256)
    assert lindley_waits(arr, svc).mean() == pytest.approx(want, rel=0.12)


def test_fast_lane_closed_form_matches_simulation():
    p, a, b, c2, rho, f = 0.8, 1.0, 20.0, 4.0, 0.8, 0.2
    w = rq.fast_lane_waits(p, a, b, c2, rho, f)
    rng = np.random.default_rng(0)
    n = 400_000
    small = rng.random(n) < p
    sigma2 = math.log(1 + c2)
    svc = np.where(small, a, b * np.exp(math.sqrt(sigma2) * rng.standard_normal(n) - sigma2 / 2))
    arr = np.cumsum(rng.exponential(1 / w["rate"], n))
    shared = lindley_waits(arr, svc)
    assert shared[small].mean() == pytest.approx(w["shared"], rel=0.15)
    lane = lindley_waits(arr[small], svc[small] / f)
    assert lane.mean() == pytest.approx(w["lane_small"], rel=0.1)
    assert w["lane_small"] < w["shared"]


def test_fast_lane_overloaded_lane_is_infinite():
    w = rq.fast_lane_waits(0.9, 1.0, 5.0, 1.0, 0.9, 0.05)
    assert math.isinf(w["lane_small"]) and w["rho_lane"] >= 1


def test_diff_ci_covers_the_truth_about_95_percent_of_the_time():
    counts = rq.adoption_trial(2000, 0.80, 0.83, seed=1, trials=2000)
    hits = 0
    for x0, x1 in counts:
        _, lo, hi = rq.diff_ci(x1, 2000, x0, 2000)
        hits += lo <= 0.03 <= hi
    assert 0.93 <= hits / len(counts) <= 0.97


def test_diff_ci_of_means():
    d, lo, hi = rq.diff_ci(10.0, 100, 12.0, 100, sd1=5.0, sd0=5.0)
    assert d == -2.0 and hi - d == pytest.approx(1.959964 * math.sqrt(0.5), rel=1e-5) and lo < d < hi


@pytest.mark.parametrize("call", [
    lambda: rq.fifo_starts(8, [], [rq.Job("a", 16, 1.0)]),
    lambda: rq.fifo_starts(8, [rq.Job("a", 16, 1.0)], []),
    lambda: rq.pool_snapshot(4, ["a"], 1, 10.0, 0),
    lambda: rq.pool_snapshot(64, [], 1, 10.0, 0),
    lambda: rq.pool_mean_wait_s(1.0, [8], [1.0], 64),
    lambda: rq.fast_lane_waits(0.0, 1.0, 1.0, 1.0, 0.5, 0.5),
    lambda: rq.diff_ci(1, 10, 1, 10, sd1=1.0),
    lambda: rq.quota_now(rq.Snapshot(64, (), ()), rq.Job("x", 8, 1.0), ["a"], [8], [0.0]),
    lambda: rq.quota_now(rq.Snapshot(64, (), ()), rq.Job("a", 8, 1.0), ["a"], [128], [0.0]),
])
def test_bad_inputs_raise_valueerror(call):
    with pytest.raises(ValueError):
        call()


def test_quota_honours_the_guarantee():
    snap = rq.Snapshot(64, (rq.Job("a", 64, 10.0),), ())
    q = rq.quota_now(snap, rq.Job("b", 32, 5.0), ["a", "b"], [32, 16], [100.0, 0.0])
    assert q["gpus"] >= 16 - 1e-9 and q["alloc"].sum() == pytest.approx(64)


def test_power_of_two_floor():
    assert [rq.power_of_two_floor(n) for n in (0, 1, 3, 8, 63)] == [0, 1, 2, 8, 32]


def test_diff_ci_keeps_its_coverage_in_small_arms():
    counts = rq.adoption_trial(8, 0.17, 0.75, seed=2, trials=4000)
    cover = np.mean([(lambda r: r[1] <= 0.58 <= r[2])(rq.diff_ci(x1, 8, x0, 8)) for x0, x1 in counts])
    assert cover >= 0.93  # the plain Wald interval covers about 86% here


def test_fast_lane_sample_reports_an_overloaded_lane_as_nan():
    s = rq.fast_lane_sample(0.9, 1.0, 5.0, 1.0, 0.9, 0.05, 2000, 0)
    assert math.isnan(s["lane_small"]) and s["shared_small"] > 0


def test_blast_radius_against_a_minute_by_minute_rule_evaluation():
    from lib.sre import slo

    p0, p1, target = 0.0003, 0.02, 0.999
    b = rq.blast_radius(1.0, p0, p1, target, 50.0, 1200.0)
    series = np.concatenate([np.full(3 * 24 * 60, p0), np.full(24 * 60, p1)])
    det = min(slo.first_alert_s(series, 60.0, r, target) - 3 * 86400.0 for r in slo.workbook_rules()
              if r.severity == "page")
    assert b.by.startswith("the fast page") and b.detect_s == pytest.approx(det, abs=60.0)
    assert b.budget == pytest.approx((p1 - p0) * (det + 1200.0) / ((1 - target) * 30 * 86400.0), rel=0.03)


def test_blast_radius_takes_the_sooner_of_verdict_and_alerts_and_caps_silent_regressions():
    quiet = rq.blast_radius(0.01, 0.0003, 0.003, 0.999, 50.0, 600.0)
    assert math.isinf(quiet.detect_s) and quiet.impact_s == 30 * 86400.0
    caught = rq.blast_radius(0.01, 0.0003, 0.003, 0.999, 50.0, 600.0, verdict_s=3600.0)
    assert caught.by == "the canary's verdict" and caught.impact_s == 4200.0
    with pytest.raises(ValueError):
        rq.blast_radius(0.5, 0.002, 0.003, 0.999, 50.0, 600.0)  # the baseline already overspends a 99.9% budget


def test_verdict_requests_reaches_its_power_by_simulation():
    from lib.sre import canary

    n, method = rq.verdict_requests(0.0003, 0.003)
    assert method == "exact binomial test"
    _, detect = canary.detection_monte_carlo(int(n), 0.0003, 0.003, 0.05, 20000, 3)
    assert detect == pytest.approx(0.8, abs=0.03)
    assert rq.verdict_requests(0.00001, 0.000015)[1] == "normal approximation"


def test_verdict_requests_bisects_the_exact_power_above_the_scan_limit():
    from lib.sre import canary

    n, method = rq.verdict_requests(0.0003, 0.00045)  # the normal approximation says 95,419: power 0.75
    assert method == "exact binomial test"
    assert canary.power_exact(int(n), 0.0003, 0.00045) >= 0.8
    # conservative against the first n that reaches the power (canary's scan: 100,448), by under 10%
    assert 100_448 <= n <= 1.1 * 100_448
    fast = rq.verdict_requests(0.0003, 0.00045, bisect_limit=0)
    assert fast[1] == "normal approximation"


def test_diff_ci_uses_the_evals_standard_error_and_wants_whole_arms():
    from lib.numerics import evals

    d, lo, hi = rq.diff_ci(74, 100, 68, 100)
    q1, q0 = 75 / 102, 69 / 102
    se = math.hypot(evals.score_standard_error(q1, 102), evals.score_standard_error(q0, 102))
    assert d == pytest.approx(0.06) and (lo + hi) / 2 == pytest.approx(q1 - q0)
    assert (hi - lo) / 2 == pytest.approx(1.959963984540054 * se)
    with pytest.raises(ValueError):
        rq.diff_ci(74, 100.5, 68, 100)


def test_fast_lane_sample_matches_pollaczek_khinchine_on_its_own_moments():
    # like for like: the path's mean wait against P-K at the path's own rate and service moments (light tails)
    s = rq.fast_lane_sample(0.8, 30.0, 600.0, 1.0, 0.7, 0.1, 200_000, 1)
    assert s["shared_small"] == pytest.approx(s["shared_pk_path"], rel=0.05)
