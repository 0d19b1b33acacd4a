"""lib.judgment.isolation (N091) and lib.judgment.safety's log volume: the timing channel, the probe
arithmetic against simulation, and the tenant-salted cache with its regression test."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import isolation
from lib.judgment.safety import logged_bytes_per_day
from lib.perf.deployment import deployment

DEP = deployment("llama-3.1-70b", "h100-sxm", tp=4)


def test_timing_channel_caches_whole_blocks_and_a_long_prefix_opens_a_wide_gap():
    ch = isolation.timing_channel(DEP, 2050, 30)
    assert ch.cached_len == 2048 and ch.prompt_len == 2080
    assert 0 < ch.warm_s < ch.cold_s
    assert ch.delta_s > 0.5 * ch.cold_s  # compute-bound prefix: the hit removes most of the prefill
    short = isolation.timing_channel(DEP, 64, 30)
    assert short.delta_s < 0.1 * short.cold_s  # a weight read either way


def test_timing_channel_gap_grows_with_the_prefix():
    gaps = [isolation.timing_channel(DEP, p, 32).delta_s for p in (256, 1024, 4096, 16384)]
    assert gaps == sorted(gaps)


@settings(max_examples=40, deadline=None)
@given(delta=st.floats(1e-4, 1.0), sigma=st.floats(1e-3, 0.5), err=st.floats(1e-4, 0.3))
def test_probes_for_error_inverts_probe_error(delta, sigma, err):
    n = isolation.probes_for_error(delta, sigma, err)
    if n < 1e7:
        assert isolation.probe_error(delta, sigma, max(1, math.ceil(n))) <= err + 1e-9


@settings(max_examples=40, deadline=None)
@given(delta=st.floats(1e-3, 1.0), sigma=st.floats(1e-3, 0.5), alpha=st.sampled_from([0.001, 0.01, 0.05]),
       power=st.sampled_from([0.8, 0.9, 0.99]))
def test_audit_pairs_reach_their_power(delta, sigma, alpha, power):
    n = isolation.audit_pairs(delta, sigma, alpha, power)
    if n < 1e7:
        assert isolation.audit_power(max(1, math.ceil(n)), delta, sigma, alpha) >= power - 1e-9


def test_zero_gap_needs_infinite_probes_and_bad_inputs_are_refused():
    assert isolation.probes_for_error(0.0, 0.03, 0.01) == math.inf
    assert isolation.audit_pairs(0.0, 0.03) == math.inf
    for call in (lambda: isolation.probe_error(0.1, 0.0), lambda: isolation.probes_for_error(0.1, 0.03, 0.5),
                 lambda: isolation.audit_pairs(-1.0, 0.03), lambda: isolation.timing_channel(DEP, 0, 10),
                 lambda: isolation.tier_residency_s(0.0, 1.0), lambda: isolation.audit_power(0, 0.1, 0.03)):
        with pytest.raises(ValueError):
            call()


def test_single_probe_error_matches_monte_carlo():
    delta, sigma = 0.05, 0.04
    rng = np.random.default_rng(3)
    k = 200_000
    hit = sigma * rng.standard_normal(k)
    miss = delta + sigma * rng.standard_normal(k)
    mc = 0.5 * (np.mean(hit > delta / 2) + np.mean(miss <= delta / 2))
    assert mc == pytest.approx(isolation.probe_error(delta, sigma), abs=0.004)


@pytest.mark.parametrize("pairs", [2, 4, 12])
def test_simulated_audit_matches_the_closed_form_and_the_salted_cache_only_false_alarms(pairs):
    sigma = 0.2  # wide jitter so the power is away from 0 and 1
    sim = isolation.simulate_audit(DEP, 512, 32, sigma, pairs, alpha=0.05, trials=3000, seed=1)
    assert set(sim.hit_arm_cached) == {512} and set(sim.miss_arm_cached) == {0}
    assert sim.power == pytest.approx(sim.power_closed_form, abs=4 * math.sqrt(0.25 / 3000) + 0.01)
    fixed = isolation.simulate_audit(DEP, 512, 32, sigma, pairs, alpha=0.05, trials=3000, seed=1, salted=True)
    assert set(fixed.hit_arm_cached) == {0}
    assert fixed.power == pytest.approx(0.05, abs=4 * math.sqrt(0.05 * 0.95 / 3000) + 0.005)


def test_regression_test_fails_shared_keys_and_a_cache_switched_off_and_passes_salted_keys():
    with pytest.raises(AssertionError, match="cross-tenant"):
        isolation.regression_test(lambda: isolation.TenantPrefixCache(64, 16, salted=False))
    assert isolation.regression_test(lambda: isolation.TenantPrefixCache(64, 16, salted=True)).startswith("passed")

    class CachingOff(isolation.TenantPrefixCache):
        def match_prefix(self, tenant, tokens):
            return 0

    with pytest.raises(AssertionError, match="turned caching off"):
        isolation.regression_test(lambda: CachingOff(64, 16, salted=False))


@settings(max_examples=30, deadline=None)
@given(tokens=st.lists(st.integers(0, 50), min_size=1, max_size=80), block=st.sampled_from([1, 4, 16]),
       a=st.text(min_size=1, max_size=5), b=st.text(min_size=1, max_size=5))
def test_salted_cache_never_hits_across_tenants_and_always_within(tokens, block, a, b):
    cache = isolation.TenantPrefixCache(2 * (len(tokens) // block + 2), block, salted=True)
    cache.allocate(a, "r", tokens)
    cache.free("r")
    full = len(tokens) // block * block
    assert cache.match_prefix(a, tokens) == full
    if a != b:
        assert cache.match_prefix(b, tokens) == 0
    shared = isolation.TenantPrefixCache(2 * (len(tokens) // block + 2), block, salted=False)
    shared.allocate(a, "r", tokens)
    shared.free("r")
    assert shared.match_prefix(b, tokens) == full  # the gap the salt closes


def test_memory_and_tier_arithmetic():
    freed = isolation.freed_kv_bytes_per_s(DEP, 2.0, 1000, 24)
    assert freed == pytest.approx(2.0 * 1024 * DEP.mdl.kv_bytes_per_token("bf16"))
    share = isolation.scrub_share(DEP, 2.0, 1000, 24)
    assert share == pytest.approx(freed / (4 * DEP.chip.memory_bandwidth))
    assert isolation.tier_residency_s(1e12, freed) == pytest.approx(1e12 / freed)
    assert 0 < isolation.step_alignment_sd(DEP, 32, 4096) < 0.05


def test_log_volume_against_serialized_records():
    # Oracle: serialize real JSON records whose text has the modelled length; the fixed fields are measured, not assumed.
    vol0 = logged_bytes_per_day(10.0, 1000, 200, 7.0, record_overhead_bytes=0.0)
    text = "x" * round((1000 + 200) * vol0.bytes_per_token)
    record = {"id": "0" * 36, "tenant": "t-123", "ts": 1.7e9, "model": "llama-3.1-70b", "in": 1000, "out": 200}
    overhead = len(json.dumps({**record, "prompt": "", "completion": ""}))
    line = json.dumps({**record, "prompt": text[:4000], "completion": text[4000:]})
    vol = logged_bytes_per_day(10.0, 1000, 200, 7.0, record_overhead_bytes=overhead)
    assert vol.bytes_per_request == pytest.approx(len(line), rel=1e-3)
    assert vol.bytes_per_day == pytest.approx(10.0 * 86_400 * len(line), rel=1e-3)
    assert vol.bytes_held == pytest.approx(7 * vol.bytes_per_day)
    with pytest.raises(ValueError):
        logged_bytes_per_day(-1.0, 10, 10)
