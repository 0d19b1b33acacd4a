"""lib.sre.tails (tail arithmetic against Monte Carlo and brute force) and lib.sre.tail_suspects (each
suspect injected alone is named by its own metric, across seeds)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.sre import tail_suspects as ts
from lib.sre import tails


def test_share_needed_is_one_minus_q():
    assert tails.affected_share_to_exceed(0.99) == pytest.approx(0.01)
    assert tails.affected_share_to_exceed(0.999) == pytest.approx(0.001)
    # half the affected requests above T: twice the share; healthy already above: nothing needed
    assert tails.affected_share_to_exceed(0.99, 0.0, 0.5) == pytest.approx(0.02)
    assert tails.affected_share_to_exceed(0.99, 0.02, 1.0) == 0.0
    assert tails.affected_share_to_exceed(0.99, 0.005, 0.005) == math.inf
    assert tails.quantile_exceeded(0.99, 0.011) and not tails.quantile_exceeded(0.99, 0.009)


def test_mixture_quantile_against_monte_carlo():
    rng = np.random.default_rng(0)
    healthy = rng.lognormal(np.log(0.06), 0.3, 5000)
    for f in (0.005, 0.02, 0.1):
        exact = tails.mixture_quantile(0.99, [(1 - f, healthy), (f, healthy + 1.0)])
        draw = np.where(rng.random(400000) < f, rng.choice(healthy, 400000) + 1.0, rng.choice(healthy, 400000))
        assert exact == pytest.approx(np.quantile(draw, 0.99), rel=0.05)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=1, max_size=30), st.floats(0.01, 0.99))
def test_mixture_of_one_part_is_the_empirical_quantile(xs, q):
    """One part: the smallest sample whose empirical CDF reaches q (numpy's 'inverted_cdf')."""
    assert tails.mixture_quantile(q, [(1.0, xs)]) == pytest.approx(float(np.quantile(xs, q, method="inverted_cdf")))


def test_mixture_validation():
    with pytest.raises(ValueError, match="sum to 1"):
        tails.mixture_quantile(0.5, [(0.5, [1.0])])
    with pytest.raises(ValueError, match="q must"):
        tails.mixture_quantile(1.0, [(1.0, [1.0])])
    with pytest.raises(ValueError, match="finite samples"):
        tails.mixture_quantile(0.5, [(1.0, [])])


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-5, 0.5), st.integers(1, 2000))
def test_p_hit_and_its_inverse(p, n):
    ph = tails.p_hit_any(p, n)
    assert ph == pytest.approx(1 - (1 - p) ** n, rel=1e-9, abs=1e-15)
    if ph < 1 - 1e-6:  # the inverse is ill-conditioned once (1 - p)^n underflows towards 0
        assert tails.step_probability_for(ph, n) == pytest.approx(p, rel=1e-5)


def test_p_hit_monte_carlo():
    rng = np.random.default_rng(1)
    hits = (rng.random((40000, 200)) < 0.001).any(axis=1).mean()
    assert abs(hits - tails.p_hit_any(0.001, 200)) < 4 * math.sqrt(0.18 * 0.82 / 40000)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=6), st.lists(st.floats(0.1, 60), min_size=6, max_size=6))
def test_ratio_order_is_optimal(w, c):
    p = [x / sum(w) for x in w]
    c = c[:len(p)]
    best = min(tails.expected_search_cost(o, p, c) for o in itertools.permutations(range(len(p))))
    assert tails.expected_search_cost(tails.best_search_order(p, c), p, c) == pytest.approx(best, rel=1e-12)
    assert tails.expected_search_cost(tails.best_search_order(p, c, brute_force=True), p, c) == pytest.approx(best)


def test_search_cost_by_hand():
    # check A (p 0.5, 1 min) then B (p 0.5, 10 min): 1 + 0.5 x 10 = 6
    assert tails.expected_search_cost([0, 1], [0.5, 0.5], [1, 10]) == pytest.approx(6.0)
    assert tails.expected_search_cost([1, 0], [0.5, 0.5], [1, 10]) == pytest.approx(10.5)
    with pytest.raises(ValueError, match="permutation"):
        tails.expected_search_cost([0, 0], [0.5, 0.5], [1, 10])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_suspect_is_named_alone(seed):
    s = ts.TailSetup(seed=seed)
    assert ts.diagnose(ts.tail_metrics(ts.evidence(s, None))) is None
    for k in ts.SUSPECTS:
        assert ts.diagnose(ts.tail_metrics(ts.evidence(s, k))) == k, (seed, k)


def test_all_evidence_is_every_suspects_cached_evidence():
    s = ts.TailSetup()
    every = ts.all_evidence(s)
    assert list(every) == [None, *ts.SUSPECTS]
    misses = ts._evidence.cache_info().misses
    assert all(every[k] is ts.evidence(s, k) for k in every)  # the same objects: nothing computed twice
    assert ts.all_evidence(s) == every and ts._evidence.cache_info().misses == misses


def test_capacity_and_littles_law():
    from lib.scheduling.queueing import littles_law

    s = ts.TailSetup()
    run = ts.capacity_run(s)
    fin = [r for r in run.requests if r.status == "finished"]
    lam = littles_law(L=run.metrics().mean_running, W=float(np.mean([r.finish_s - r.first_scheduled_s for r in fin])))
    assert ts.capacity_rps(s) == pytest.approx(lam, rel=0.1)


def test_setup_validation():
    with pytest.raises(ValueError, match="replicas"):
        ts.TailSetup(replicas=1)
    with pytest.raises(ValueError, match="suspect"):
        ts.evidence(ts.TailSetup(), "gremlins")


def test_diagnose_sets_aside_what_a_long_prompt_explains():
    # 70B on B200, 600 requests a replica, seed 999: the 32k prompts preempt 10 per 100 requests and slow a
    # replica; the preemption metric is furthest past its threshold, yet the cause is the long prefill
    m = {"queueing": 0.61, "long_prefill": 1.0, "preemption": 10.0, "host_stall": 0.0, "bad_replica": 1.3}
    assert ts.diagnose(m) == "long_prefill"
    # preemption alone (no long prompt in the tail) is still named
    assert ts.diagnose({**m, "long_prefill": 0.0}) == "preemption"
    assert ts.diagnose({k: 0.0 for k in ts.SUSPECTS} | {"queueing": 0.5, "bad_replica": 1.0}) is None


def test_a_small_preemption_count_that_owns_the_tail_is_named():
    # seed 2, pool at half of what 32 average requests need: two preemptions in 480 requests move the p99
    # 1.6x; a threshold of 1 per 100 requests missed them
    s = ts.TailSetup(stall_s=0.05, slow_factor=1.3, saturation=0.9, kv_fraction=0.5, long_share=0.005, seed=2)
    m = ts.tail_metrics(ts.evidence(s, "preemption"))
    assert 0 < m["preemption"] < 1.0
    assert ts.diagnose(m) == "preemption"


def test_long_prompt_must_stand_out_from_the_traffic():
    with pytest.raises(ValueError, match="long_prompt must be at least 8 x prompt_median"):
        ts.TailSetup(prompt_median=8000, long_prompt=8192)


def test_preemption_injection_never_enlarges_the_pool():
    # 70B on two H100s: the deployment's own pool is smaller than half of what 32 average requests need, so the
    # injection once handed the "preempted" fleet a bigger pool than the healthy one (fewer preemptions, a better tail)
    s = ts.TailSetup(model="llama-3.1-70b", slow_factor=1.3, stall_s=0.05, saturation=0.9, kv_fraction=0.5,
                     long_share=0.005, seed=8)
    healthy = ts.tail_metrics(ts.evidence(s, None))["preemption"]
    injected = ts.tail_metrics(ts.evidence(s, "preemption"))["preemption"]
    assert healthy > 0
    assert injected >= healthy
