"""N059 eval-pipeline: run cost, sharding (naive / LPT / chunks), the content-addressed cache, noise floor."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import eval_pipeline as ep


def test_run_cost_uses_the_fleet_model():
    from lib.fleet.capacity import request_cost
    from lib.perf.deployment import deployment

    dep = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    run = ep.run_cost(dep, 1_000_000, 1000, 300, 256)
    b = dep.budget.max_sequences(1300)
    assert run.batch == b and run.replicas == 64
    assert run.replica_s_per_prompt == pytest.approx(request_cost(dep, 1000, 300, batch=b).replica_s)
    assert run.ideal_turnaround_s == pytest.approx(1_000_000 * run.replica_s_per_prompt / 64)
    with pytest.raises(ValueError, match="holds no replica"):
        ep.run_cost(dep, 10, 1000, 300, 2)


def _optimal(sizes, m):
    best = math.inf
    for assign in itertools.product(range(m), repeat=len(sizes)):
        loads = [0] * m
        for s, k in zip(sizes, assign, strict=True):
            loads[k] += s
        best = min(best, max(loads))
    return best


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=7), m=st.integers(1, 3))
def test_lpt_within_graham_bound_of_brute_force(sizes, m):
    opt = _optimal(sizes, m)
    lpt = ep.makespan(sizes, m, "lpt")[0]
    assert opt <= lpt <= (4 / 3 - 1 / (3 * m)) * opt + 1e-9
    assert ep.makespan_lower_bound(sizes, m) <= opt
    assert ep.makespan(sizes, m, "naive")[0] >= opt


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=40), m=st.integers(1, 9), c=st.integers(1, 60))
def test_chunked_lpt_shortcut_equals_explicit_lpt(sizes, m, c):
    chunks = ep.chunked(sizes, c)
    assert sum(chunks) == sum(sizes) and max(chunks) <= c
    assert ep.makespan_chunked_lpt(sizes, c, m) == ep.makespan(chunks, m, "lpt")[0]
    assert ep.makespan_chunked_lpt(sizes, c, m) <= sum(sizes) / m + c


def test_content_cache_keys_on_every_input():
    cache = ep.ContentCache()
    calls = []
    cache.get_or_compute(lambda: calls.append(1), checkpoint="a", prompt=1, temperature=0.0)
    cache.get_or_compute(lambda: calls.append(1), temperature=0.0, prompt=1, checkpoint="a")  # order-free
    cache.get_or_compute(lambda: calls.append(1), checkpoint="b", prompt=1, temperature=0.0)
    assert len(calls) == 2 and cache.hits == 1 and cache.misses == 2


@pytest.mark.parametrize("c_n,k,c,s", [(4, 3, 0.05, 0.3), (1, 1, 0.0, 0.0), (6, 2, 0.5, 0.9), (3, 5, 0.2, 0.0)])
def test_cache_simulation_matches_closed_form(c_n, k, c, s):
    gen, judge = ep.simulate_cache(1500, c_n, k, c, s, seed=4)
    gen_e, judge_e = ep.cache_hit_rates(c_n, k, c, s)
    assert gen == pytest.approx(gen_e, abs=0.02) and judge == pytest.approx(judge_e, abs=0.02)


def test_min_detectable_delta_monte_carlo():
    rng = np.random.default_rng(0)
    d = (rng.binomial(500, 0.7, 40000) - rng.binomial(500, 0.7, 40000)) / 500
    assert ep.min_detectable_delta(0.7, 500) == pytest.approx(1.96 * d.std(), rel=0.02)


def test_eval_sizes_mean_and_validation():
    sizes = ep.eval_sizes(20000, 5000.0, 1.0, seed=1)
    assert sizes.mean() == pytest.approx(5000, rel=0.05) and sizes.min() >= 1
    with pytest.raises(ValueError, match="sigma"):
        ep.eval_sizes(10, 100.0, 5.0, seed=0)
