"""Tail closed forms of lib.scheduling.queueing (the sojourn quantile, the utilization a p99 target
allows) against exact sample paths, and Lindley's recursion against a plain loop and the engine."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import Deployment
from lib.scheduling import LinearCost, Policy, Request, Workload, simulate, step_cost
from lib.scheduling.queueing import (
    lindley_waits,
    mm1_sojourn_quantile_s,
    sample_path_utilization,
    sojourn_quantile_approx_s,
    utilization_for_sojourn_quantile,
)
from lib.scheduling.utilization import prompt_service_s, service_moments


def _loop_waits(arrivals, services):
    w, out = 0.0, [0.0]
    for i in range(1, len(arrivals)):
        w = max(0.0, w + services[i - 1] - (arrivals[i] - arrivals[i - 1]))
        out.append(w)
    return np.array(out)


@settings(max_examples=50, deadline=None)
@given(gaps=st.lists(st.floats(0, 5), min_size=1, max_size=60), data=st.data())
def test_lindley_waits_equal_the_plain_recursion(gaps, data):
    arrivals = np.cumsum(gaps)
    services = np.array(data.draw(st.lists(st.floats(0, 5), min_size=len(gaps), max_size=len(gaps))))
    assert lindley_waits(arrivals, services) == pytest.approx(_loop_waits(arrivals, services), abs=1e-9)


def test_lindley_waits_are_the_engines_batch_one_queue():
    # batch 1, FCFS, each request one prefill step of P x per-token time: an M/G/1 queue
    cost = LinearCost(per_prefill_token_s=1e-4, max_running=1, token_budget=1 << 20)
    res = simulate(Workload(prompt=500, output=1, rate=15.0, n_requests=400), Policy(), cost, seed=4)
    arr = res.array("arrival_s", None)
    svc = res.array("prompt_len", None) * 1e-4
    assert res.array("queue_s", None) == pytest.approx(lindley_waits(arr, svc), abs=1e-9)


def test_mm1_sojourn_quantile_matches_an_exact_sample_path():
    rng = np.random.default_rng(0)
    lam, mu, n = 0.7, 1.0, 400_000
    arr = np.cumsum(rng.exponential(1 / lam, n))
    svc = rng.exponential(1 / mu, n)
    sojourn = lindley_waits(arr, svc) + svc
    assert np.percentile(sojourn, 99) == pytest.approx(mm1_sojourn_quantile_s(lam, mu, 0.99), rel=0.04)
    assert mm1_sojourn_quantile_s(lam, mu) == pytest.approx(math.log(100) / 0.3, rel=1e-12)


def test_approximation_is_exact_for_exponential_and_close_for_constant_service():
    assert sojourn_quantile_approx_s(0.7, 1.0, 1.0) == pytest.approx(mm1_sojourn_quantile_s(0.7, 1.0), rel=1e-12)
    # M/D/1: bisect the exact sample path for the utilization whose p99 sojourn is 6 service times
    rng = np.random.default_rng(1)
    n = 200_000
    svc = np.ones(n)
    gaps = rng.exponential(1.0, n)

    def p99(rho):
        arr = np.cumsum(gaps / rho)
        return np.percentile(lindley_waits(arr, svc) + svc, 99)

    lo, hi = 0.05, 0.99
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if p99(mid) <= 6.0 else (lo, mid)
    assert utilization_for_sojourn_quantile(1.0, 6.0, 0.99, scv=0.0) == pytest.approx(lo, abs=0.03)


def test_heavy_tails_need_less_utilization_than_the_approximation_says():
    rng = np.random.default_rng(2)
    n = 200_000
    svc = rng.lognormal(0.0, 1.0, n)
    es, c2 = svc.mean(), svc.var() / svc.mean() ** 2
    target = 25 * es
    gaps = rng.exponential(1.0, n)
    approx = utilization_for_sojourn_quantile(es, target, 0.99, scv=c2)
    arr = np.cumsum(gaps * es / approx)
    assert np.percentile(lindley_waits(arr, svc) + svc, 99) > target  # the approximation is optimistic


@settings(max_examples=60, deadline=None)
@given(es=st.floats(1e-3, 10), k=st.floats(1.5, 200), c2=st.floats(0, 10), q=st.sampled_from([0.9, 0.99, 0.999]))
def test_utilization_inverts_the_quantile(es, k, c2, q):
    rho = utilization_for_sojourn_quantile(es, k * es, q, scv=c2)
    assert 0 <= rho < 1
    if rho > 0:
        assert sojourn_quantile_approx_s(rho / es, es, c2, q) == pytest.approx(k * es, rel=1e-9)
    # more variance, a lower utilization
    assert utilization_for_sojourn_quantile(es, k * es, q, scv=c2 + 1) <= rho


def test_validation():
    with pytest.raises(ValueError, match="sorted"):
        lindley_waits([1.0, 0.5], [1.0, 1.0])
    with pytest.raises(ValueError, match="same length"):
        lindley_waits([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="below 1"):
        sojourn_quantile_approx_s(2.0, 1.0)
    with pytest.raises(ValueError, match="target_s"):
        utilization_for_sojourn_quantile(1.0, 0.0)


def test_prompt_service_is_the_engines_idle_prefill():
    dep = Deployment("llama-3.1-8b", "h100-sxm")
    cost = step_cost(dep)
    for p in (1, 700, 3 * dep.max_num_batched_tokens + 5):
        res = simulate([Request(0, 0.0, p, 1)], Policy(), cost)
        assert prompt_service_s(cost, p) == pytest.approx(res.requests[0].ttft_s, rel=1e-12)
    arr = prompt_service_s(cost, np.array([700, 1, 700]))
    assert arr.shape == (3,) and arr[0] == arr[2]
    with pytest.raises(ValueError, match="prompt_lens"):
        prompt_service_s(cost, [0, 5])


def test_sample_path_utilization_recovers_mm1_and_md1():
    rng = np.random.default_rng(5)
    svc = rng.exponential(1.0, 200_000)
    target = mm1_sojourn_quantile_s(0.7, 1.0)
    assert sample_path_utilization(svc, target, seed=3) == pytest.approx(0.7, abs=0.02)
    const = np.ones(200_000)
    assert sample_path_utilization(const, 6.0, seed=3) == pytest.approx(
        utilization_for_sojourn_quantile(1.0, 6.0, scv=0.0), abs=0.03)
    assert sample_path_utilization(const, 0.5) == 0.0  # the service alone misses the target
    with pytest.raises(ValueError, match="services_s"):
        sample_path_utilization([1.0] * 10, 5.0)


def test_service_moments_by_quadrature_match_a_large_sample():
    from lib.scheduling import Constant, LogNormal

    cost = step_cost(Deployment("llama-3.1-8b", "h100-sxm"))
    m = service_moments(cost, 1000)
    assert m.mean_s == pytest.approx(prompt_service_s(cost, 1000), rel=1e-12) and m.scv == 0
    assert service_moments(cost, Constant(1000)) == m
    dist = LogNormal(1200, 0.6, cap=100_000)  # a light enough tail for a sample to pin E[S^2]
    q = service_moments(cost, dist)
    svc = prompt_service_s(cost, dist.sample(np.random.default_rng(0), 400_000))
    assert q.mean_s == pytest.approx(svc.mean(), rel=0.005)
    assert q.second_moment_s2 == pytest.approx((svc**2).mean(), rel=0.02)
    # lengths alone: the quadrature reproduces the lognormal's own moments (cap far away)
    lin = LinearCost(per_prefill_token_s=1.0, token_budget=1 << 30, max_running=1)
    lm = service_moments(lin, dist)
    assert lm.mean_s == pytest.approx(dist.mean, rel=1e-3)
    assert lm.second_moment_s2 == pytest.approx(dist.second_moment, rel=1e-3)
    with pytest.raises(ValueError, match="prompt"):
        service_moments(cost, 1.5)


def test_sampled_services_interpolate_the_exact_prices():
    from lib.scheduling import LogNormal
    from lib.scheduling.utilization import sample_services

    cost = step_cost(Deployment("llama-3.1-70b", "h100-sxm", tp=4))
    dist = LogNormal(1500, 1.0, cap=131071)
    lens, svc = sample_services(cost, dist, 3000, seed=2)
    exact = prompt_service_s(cost, lens)
    assert svc == pytest.approx(exact, rel=1e-3)
    lens2, _ = sample_services(cost, dist, 3000, seed=2)
    assert (lens2 == lens).all()  # the seed fixes the draw
    c_lens, c_svc = sample_services(cost, 700, 5)
    assert (c_lens == 700).all() and c_svc == pytest.approx([prompt_service_s(cost, 700)] * 5)
