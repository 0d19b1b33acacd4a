"""lib.sre.periodic: the spike detector against the injected truth, the lock test for every source
(timers and counters), phase concentration against its exact values, and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lib.sre import periodic as pe
from lib.sre.tails import p_hit_any


@pytest.mark.parametrize("key", [s.key for s in pe.SOURCES])
@pytest.mark.parametrize("seed", [0, 1])
def test_lock_named_for_every_source(key, seed):
    s = pe.spike_series(0.01, duration_s=900.0, source_key=key, period_s=30.0, stall_s=0.2, rate_rps=12.0,
                        rate_change=1.6, seed=seed)
    r = pe.lock_test(s)
    assert sorted(r["spikes"].tolist()) == sorted(s.injected.tolist())
    assert r["lock"] == pe.source(key).lock
    expected_ratio = 1.6 if pe.source(key).lock == "count" else 1.0
    assert r["period_before_s"] / r["period_after_s"] == pytest.approx(expected_ratio, rel=0.1)


def test_wall_period_is_exact():
    s = pe.spike_series(0.01, duration_s=600.0, source_key="scrape", period_s=15.0, seed=3)
    t = s.start_s[s.injected]
    assert np.allclose(np.diff(t), 15.0, atol=0.011)  # within one step of each tick


def test_phase_concentration():
    assert pe.phase_concentration([0.0, 10.0, 20.0], 10.0) == pytest.approx(1.0)
    assert pe.phase_concentration([0.0, 5.0], 10.0) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    r = pe.phase_concentration(rng.random(10000) * 7.0, 7.0)
    assert r < 4 / math.sqrt(10000)


def test_window_share_matches_periodic_and_random_models():
    s = pe.spike_series(0.01, duration_s=1200.0, source_key="scrape", period_s=60.0, seed=0)
    n = 300
    spiky = np.zeros(len(s.dur_s) + 1)
    spiky[s.injected + 1] = 1
    cs = np.cumsum(spiky)
    share = float(((cs[n:] - cs[:-n]) > 0).mean())
    p = len(s.injected) / len(s.dur_s)
    assert share == pytest.approx(min(1.0, n * p), rel=0.05)
    assert share == pytest.approx(p_hit_any(p, n), rel=0.1)  # small n p: the two models agree


def test_rank_sources():
    names = [s.key for s in pe.rank_sources(60.0)]
    assert names[:2] == ["gc", "scrape"] and "health" not in names and "thp" not in names
    assert [s.key for s in pe.rank_sources(10.0)][0] in ("gc", "scrape")
    assert abs(sum(s.prior for s in pe.SOURCES) - 1.0) < 1e-9


def test_window_latencies_and_validation():
    lat = pe.window_latencies([1.0, 2.0, 3.0, 4.0], 2)
    assert lat.tolist() == [3.0, 5.0, 7.0]
    with pytest.raises(ValueError, match="n_steps"):
        pe.window_latencies([1.0, 2.0], 2)
    with pytest.raises(ValueError, match="source"):
        pe.spike_series(0.01, source_key="ghost")
    with pytest.raises(ValueError, match="period_s"):
        pe.spike_series(0.01, duration_s=100.0, period_s=90.0)
    with pytest.raises(ValueError, match="at least 10"):
        pe.detect_spikes([1.0, 2.0])
