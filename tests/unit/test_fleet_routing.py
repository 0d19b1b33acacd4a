"""lib.fleet.routing (N030, I067, W03): the prefill table, the prefix LRU against a radix cache, the queue
engine against M/G/1, and the policies' limiting cases."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import routing as rt
from lib.fleet.capacity import prefill_s
from lib.perf.deployment import deployment
from lib.perf.prefill import prefill_time
from lib.scheduling.queueing import mg1_mean_wait_s

DEP = deployment("llama-3.1-70b", "h100-sxm", tp=4)


@pytest.fixture(scope="module")
def fleet():
    return rt.chat_fleet(DEP, 4, 0.7, turns=4.0, system_len=500, user_len=100, output_len=200, think_s=10.0,
                         tenants=5, cache_share=0.5, duration_s=120.0, seed=1)


def test_prefill_table_reads_the_one_prefill_model():
    table = rt.prefill_table(DEP, 16384)
    for n in (1, 37, 1000, 5000, 16384):
        assert math.isclose(table.full_s(n), prefill_time(DEP, n).time_s, rel_tol=1e-3)
    assert table.full_s(0) == 0.0
    with pytest.raises(ValueError, match="beyond"):
        table.full_s(20000)
    with pytest.raises(ValueError, match="beyond"):
        table.with_hit_s(20000, 10000)


@pytest.mark.parametrize("dep", [DEP, deployment("llama-3.1-8b", "h100-sxm", tp=1),
                                 deployment("llama-3.1-8b", "l4", tp=1)], ids=lambda d: d.label)
def test_with_hit_s_is_capacity_prefill_s(dep):
    """The warm prefill has one home, lib.fleet.capacity.prefill_s; the table reads it within 1e-3."""
    table = rt.PrefillTable(dep, 1 << 17)
    for L in (2, 3, 64, 500, 1000, 2048, 4096, 10_000, 32_768, 100_000):
        for h in sorted({0, 1, L // 4, L // 2, 3 * L // 4, L - 2, L - 1}):
            if 0 <= h < L:
                want = prefill_s(dep, L, h)
                assert math.isclose(table.with_hit_s(L, h), want, rel_tol=1e-3), (L, h)
                assert math.isclose(table.saved_s(L, h), prefill_s(dep, L) - want, rel_tol=1e-3, abs_tol=1e-3 * want)


@settings(max_examples=60, deadline=None)
@given(L=st.integers(2, 16000), frac=st.floats(0, 1))
def test_a_hit_never_costs_more_and_never_below_a_fresh_pass(L, frac):
    table = rt.prefill_table(DEP, 16384)
    h = int(frac * L)
    cost = table.with_hit_s(L, h)
    assert cost <= table.full_s(L) + 1e-12
    assert cost >= table.full_s(L - min(h, L - 1)) - 1e-12
    assert table.saved_s(L, h) >= -1e-12
    assert rt.spill_threshold_s(table, L, h) == table.saved_s(L, h)


@settings(max_examples=40, deadline=None)
@given(cap=st.integers(0, 3000), ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 6)),
                                              max_size=40))
def test_lru_never_exceeds_capacity_and_hits_stay_inside_the_prompt(cap, ops):
    lru = rt.PrefixLRU(cap)
    for conv, tenant, turn in ops:
        r = rt.Turn(0.0, conv, tenant, turn, 200 + turn * 150 + 50, 100, 200)
        assert 0 <= lru.hit(r) <= r.prompt_len
        lru.serve(r)
        assert lru.tokens <= cap
        assert lru.tokens == sum(lru.entries.values())


def test_lru_hits_equal_a_radix_cache_without_eviction():
    tiny = rt.chat_fleet(DEP, 3, 0.5, turns=3.0, system_len=120, user_len=30, output_len=40, think_s=2.0, tenants=2,
                         cache_share=1.0, duration_s=5.0, seed=4)
    for policy in ("least_loaded", "affinity", "score"):
        res = rt.route_trace(tiny.trace, 3, policy, table=tiny.table, decode_s=tiny.decode_s, cache_tokens=10**9)
        assert np.array_equal(res.cached, rt.radix_hits(tiny.trace, res.replica, 3)), policy


def test_random_routing_matches_pollaczek_khinchine(fleet):
    res = rt.route(fleet, "random", seed=2)
    span = fleet.trace[-1].t
    got, want = [], []
    for j in range(fleet.n_replicas):
        mask = res.replica == j
        s = np.array([fleet.table.with_hit_s(r.prompt_len, int(c)) + fleet.decode_s
                      for r, c, m in zip(fleet.trace, res.cached, mask, strict=True) if m])
        got.append(res.wait_s[mask].mean())
        want.append(mg1_mean_wait_s(mask.sum() / span, s.mean(), float(np.mean(s ** 2))))
    assert abs(np.mean(got) / np.mean(want) - 1) < 0.35


def test_limiting_cases_of_the_score_and_the_spill(fleet):
    ll = rt.route(fleet, "least_loaded")
    assert np.array_equal(rt.route(fleet, "score", cache_weight=0.0).replica, ll.replica)
    aff = rt.route(fleet, "affinity")
    never = rt.route(fleet, "spill", spill_threshold=1e9)
    assert np.array_equal(never.replica, aff.replica) and never.spill_share == 0
    sc = rt.route(fleet, "score")
    assert sc.hit_rate > ll.hit_rate
    assert aff.hit_rate > ll.hit_rate


def test_work_is_conserved_and_ttft_includes_the_wait(fleet):
    res = rt.route(fleet, "score")
    pre = np.array([fleet.table.with_hit_s(r.prompt_len, int(c)) for r, c in zip(fleet.trace, res.cached, strict=True)])
    assert math.isclose(res.busy_s.sum(), pre.sum() + len(fleet.trace) * fleet.decode_s, rel_tol=1e-9)
    assert np.allclose(res.ttft_s, res.wait_s + pre)
    assert (res.wait_s >= 0).all()


def test_refusals():
    with pytest.raises(ValueError, match="policy"):
        rt.route_trace([rt.Turn(0, 0, 0, 0, 10, 5, 0)], 2, "nope", table=rt.prefill_table(DEP, 1024), decode_s=0.1,
                       cache_tokens=100)
    with pytest.raises(ValueError, match="empty"):
        rt.route_trace([], 2, "random", table=rt.prefill_table(DEP, 1024), decode_s=0.1, cache_tokens=100)
    with pytest.raises(ValueError, match="session_rate"):
        rt.chat_trace(0, 10, turns=2, system_len=0, user_len=10, output_len=10, think_s=1)
