"""TTFT clocks, budgets and admission (lib.fleet.ttft)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import ttft
from lib.perf.deployment import deployment
from lib.perf.prefill import prefill_time
from lib.scheduling.queueing import (
    lindley_waits,
    sample_path_utilization,
    utilization_for_sojourn_quantile,
)

DEP = deployment("llama-3.1-70b", "h100-sxm", tp=4)


def test_clocks_nest_and_add_up():
    p = ttft.ttft_parts(DEP, 1000, rtt_s=0.05, warm=False, queue_s=0.02, step_wait_s=0.01)
    assert p.engine_prefill_s == pytest.approx(prefill_time(DEP, 1000).time_s)
    assert p.engine_prefill_s <= p.engine_s <= p.gateway_clock_s <= p.client_s
    assert p.client_s == pytest.approx(sum(v for _, v in p.parts()))
    warm = ttft.ttft_parts(DEP, 1000, rtt_s=0.05, warm=True, queue_s=0.02, step_wait_s=0.01)
    assert p.client_s - warm.client_s == pytest.approx(0.05 * 2)  # TCP + TLS 1.3 round trips


@settings(max_examples=30, deadline=None)
@given(st.floats(0.01, 5.0), st.floats(0.0, 0.05), st.floats(0.0, 1e-5))
def test_prompt_len_for_budget_is_the_boundary(budget, fixed, per_token):
    n = ttft.prompt_len_for_budget(DEP, budget, fixed, per_token_s=per_token)
    left = budget - fixed
    if n == 0:
        assert prefill_time(DEP, 1).time_s + per_token > left
    else:
        assert prefill_time(DEP, n).time_s + n * per_token <= left
        if n < DEP.mdl.max_position_embeddings:
            assert prefill_time(DEP, n + 1).time_s + (n + 1) * per_token > left


def test_the_two_moment_slo_utilization_matches_the_exact_queue_for_exponential_service():
    rng = np.random.default_rng(1)
    svc = rng.exponential(0.05, 20000)
    closed = utilization_for_sojourn_quantile(0.05, 0.7, q=0.99, scv=1.0)
    exact = sample_path_utilization(svc, 0.7, q=0.99, seed=2)
    assert closed == pytest.approx(exact, abs=0.03)


def test_admission_without_a_budget_is_lindley_and_with_one_meets_it():
    rng = np.random.default_rng(3)
    arr = np.cumsum(rng.exponential(0.1, 2000))
    svc = rng.exponential(0.08, 2000)
    ok, t = ttft.admit_fcfs(arr, svc, math.inf)
    assert ok.all() and np.allclose(t, lindley_waits(arr, svc) + svc)
    ok, t = ttft.admit_fcfs(arr, svc, 0.3)
    assert 0 < ok.mean() < 1 and np.nanmax(t) <= 0.3 + 1e-12


def test_bad_inputs():
    with pytest.raises(ValueError, match="prompt_len"):
        ttft.ttft_parts(DEP, 0)
    with pytest.raises(ValueError, match="warm"):
        ttft.ttft_parts(DEP, 10, warm="yes")
    with pytest.raises(ValueError, match="budget_s"):
        ttft.admit_fcfs([0.0], [0.1], 0)
    with pytest.raises(ValueError, match="arrivals_s"):
        ttft.admit_fcfs([1.0, 0.0], [0.1, 0.1], 1.0)


def test_prompt_len_for_budget_with_a_cached_prefix():
    from lib.fleet.capacity import prefill_s

    cold = ttft.prompt_len_for_budget(DEP, 0.2, 0.08)
    warm = ttft.prompt_len_for_budget(DEP, 0.2, 0.08, cached_fraction=0.9)
    assert cold < warm < 10 * cold  # the new tokens still attend to the cached ones and read the weights
    assert prefill_s(DEP, warm, int(0.9 * warm)) <= 0.12 < prefill_s(DEP, warm + 1, int(0.9 * (warm + 1)))
    with pytest.raises(ValueError, match="cached_fraction"):
        ttft.prompt_len_for_budget(DEP, 0.2, cached_fraction=1.0)
