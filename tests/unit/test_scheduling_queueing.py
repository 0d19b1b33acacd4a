"""Queueing closed forms, and the simulator against them: Lindley's recursion (exact, per
request), M/M/1 and M/G/1 (Pollaczek-Khinchine) mean waits over long seeded runs, Little's law
on the simulator's own traces."""

import math

import numpy as np
import pytest

from lib.perf.deployment import Deployment
from lib.scheduling import (
    Bimodal,
    Constant,
    Geometric,
    LinearCost,
    LogNormal,
    Policy,
    Uniform,
    Workload,
    simulate,
)
from lib.scheduling.queueing import (
    littles_law,
    mg1_mean_wait_s,
    mg1_utilization_for_mean_wait,
    mm1_mean_in_system,
    mm1_mean_sojourn_s,
    mm1_mean_wait_s,
    mm1_utilization_for_wait_quantile,
    mm1_wait_quantile_s,
)

# ---- closed forms ----------------------------------------------------------------------------


def test_mm1_textbook_values():
    # lambda = 0.8, mu = 1: rho 0.8, Wq = 4, W = 5, L = 4 (Kleinrock 1975 ch. 3)
    assert mm1_mean_wait_s(0.8, 1.0) == pytest.approx(4.0)
    assert mm1_mean_sojourn_s(0.8, 1.0) == pytest.approx(5.0)
    assert mm1_mean_in_system(0.8, 1.0) == pytest.approx(4.0)
    assert littles_law(arrival_rate=0.8, W=5.0) == pytest.approx(mm1_mean_in_system(0.8, 1.0))


def test_mm1_quantile_is_the_tail_formula():
    lam, mu = 0.7, 1.0
    t99 = mm1_wait_quantile_s(lam, mu, 0.99)
    assert t99 == pytest.approx(math.log(100 * 0.7) / (mu - lam))
    # P(Wq > t) = rho exp(-(mu - lambda) t) equals 1 - q at the quantile
    assert 0.7 * math.exp(-(mu - lam) * t99) == pytest.approx(0.01)
    assert mm1_wait_quantile_s(0.005, 1.0, 0.99) == 0.0  # fewer than 1% ever wait


@pytest.mark.parametrize("service_s, target_s", [(0.2, 2.0), (1.0, 20.0), (0.05, 0.1)])
def test_utilization_for_p99_inverts_the_quantile(service_s, target_s):
    rho = mm1_utilization_for_wait_quantile(service_s, target_s)
    assert 0.01 < rho < 1
    assert mm1_wait_quantile_s(rho / service_s, 1 / service_s) == pytest.approx(target_s, rel=1e-9)


def test_pollaczek_khinchine_special_cases():
    lam, es = 0.6, 1.0
    assert mg1_mean_wait_s(lam, es, scv=1.0) == pytest.approx(mm1_mean_wait_s(lam, 1 / es))
    assert mg1_mean_wait_s(lam, es, scv=0.0) == pytest.approx(mm1_mean_wait_s(lam, 1 / es) / 2)  # M/D/1
    assert mg1_mean_wait_s(lam, es, 2.0) == pytest.approx(mg1_mean_wait_s(lam, es, scv=1.0))
    rho = mg1_utilization_for_mean_wait(es, 3.0, target_s=2.0)
    assert mg1_mean_wait_s(rho / es, es, scv=3.0) == pytest.approx(2.0)
    # more service-time variance, lower usable utilization
    assert mg1_utilization_for_mean_wait(es, 3.0, 2.0) < mg1_utilization_for_mean_wait(es, 1.0, 2.0)


def test_closed_form_validation():
    with pytest.raises(ValueError, match="arrival_rate .* must be below service_rate"):
        mm1_mean_wait_s(1.0, 1.0)
    with pytest.raises(ValueError, match="give exactly one of second_moment_s2 and scv"):
        mg1_mean_wait_s(0.5, 1.0)
    with pytest.raises(ValueError, match="cannot be below mean_service_s"):
        mg1_mean_wait_s(0.5, 1.0, 0.5)
    with pytest.raises(ValueError, match="utilization lambda E\\[S\\] = 1.2 must be below 1"):
        mg1_mean_wait_s(1.2, 1.0, scv=1.0)
    with pytest.raises(ValueError, match="give exactly two of L, arrival_rate and W"):
        littles_law(L=1.0)
    with pytest.raises(ValueError, match="q must be a number in"):
        mm1_wait_quantile_s(0.5, 1.0, 1.0)


# ---- the simulator as a single-server queue -----------------------------------------------------

S_TOK = 1e-3  # seconds per prompt token: a request's service time is prompt_len x S_TOK
SERVER = Policy(max_running=1, token_budget=1 << 20, chunked_prefill=False)
POOL = dict(kv_blocks=64, block_size=1 << 16)  # one block per request: the pool never binds


def lindley_waits(arrivals, services):
    """FCFS single-server waits by Lindley's recursion W_{n+1} = max(0, W_n + S_n - A_{n+1})."""
    w = np.zeros(len(arrivals))
    for n in range(1, len(arrivals)):
        w[n] = max(0.0, w[n - 1] + services[n - 1] - (arrivals[n] - arrivals[n - 1]))
    return w


@pytest.mark.parametrize("per_seq_s", [0.0, 0.002])
def test_batch_one_fcfs_is_lindleys_recursion(per_seq_s):
    """Exact per-request oracle: with batch size 1 a request's service is its prefill plus its
    output - 1 decode steps; every queue wait matches Lindley's recursion to 1e-9 s."""
    cost = LinearCost(per_seq_s=per_seq_s, per_prefill_token_s=S_TOK, max_running=1, token_budget=1 << 20)
    w = Workload(prompt=Geometric(200), output=Uniform(1, 20) if per_seq_s else 1, rate=3.0,
                 n_requests=3000)
    res = simulate(w, SERVER, cost, seed=5, **POOL)
    arr = res.array("arrival_s")
    svc = res.array("prompt_len") * S_TOK + (res.array("output_len") - 1) * per_seq_s
    assert res.array("queue_s") == pytest.approx(lindley_waits(arr, svc), abs=1e-9)


def batch_means_se(x, batches=20):
    """Standard error of the mean of a correlated series by batch means (Law & Kelton)."""
    m = np.array([b.mean() for b in np.array_split(np.asarray(x), batches)])
    return m.std(ddof=1) / math.sqrt(batches)


@pytest.mark.parametrize(
    "dist, rho",
    [
        (Geometric(1000), 0.5),  # M/M/1 (geometric of mean 1000 is exponential to 0.05%)
        (Constant(1000), 0.7),  # M/D/1
        (Uniform(1, 1999), 0.7),  # M/G/1, C^2 = 1/3
        (Bimodal(200, 5000, 0.1), 0.6),  # M/G/1, C^2 = 2.1: heavy prompt-length variance
    ],
    ids=["M/M/1", "M/D/1", "M/G/1-uniform", "M/G/1-bimodal"],
)
def test_long_run_mean_wait_matches_pollaczek_khinchine(dist, rho):
    """40,000 seeded requests; tolerance: 4 batch-means standard errors (one SE is 2-4% of the
    mean at these loads) and at most 12%. With seed 11 the four runs land within 2.5%."""
    es, es2 = dist.mean * S_TOK, dist.second_moment * S_TOK**2
    lam = rho / es
    cost = LinearCost(per_prefill_token_s=S_TOK, max_running=1, token_budget=1 << 20)
    res = simulate(Workload(prompt=dist, output=1, rate=lam, n_requests=40_000), SERVER, cost, seed=11,
                   **POOL)
    waits = res.array("queue_s")
    theory = mg1_mean_wait_s(lam, es, es2)
    se = batch_means_se(waits)
    assert abs(waits.mean() - theory) <= 4 * se, (waits.mean(), theory, se)
    assert abs(waits.mean() / theory - 1) < 0.12
    if isinstance(dist, Geometric):
        assert theory == pytest.approx(mm1_mean_wait_s(lam, 1 / es), rel=1e-3)
        # Little on the simulator's own occupancy: L = rho / (1 - rho) within the same error
        little = res.littles_law()
        assert little.L_timeline == pytest.approx(little.L_predicted, rel=1e-9)
        soj_se = batch_means_se(res.array("sojourn_s"))
        assert abs(little.L_timeline - mm1_mean_in_system(lam, 1 / es)) <= 4 * lam * soj_se


@pytest.mark.parametrize(
    "policy, kv_blocks",
    [
        (Policy(), None),
        (Policy(preemption="swap"), 1500),
        (Policy(), 1500),
        (Policy(batching="static", max_running=32, batch_timeout_s=0.2), None),
        (Policy(queue_limit=30, max_queue_wait_s=3.0), 1200),
    ],
    ids=["continuous", "swap", "recompute", "static", "overload"],
)
def test_littles_law_on_the_simulators_own_traces(policy, kv_blocks):
    """L from the engine's step-by-step occupancy counts equals lambda W from its records
    (to 1e-9), whatever the policy: the two bookkeepings tell one story."""
    dep = Deployment("llama-3.1-8b", "h100-sxm")
    w = Workload(prompt=LogNormal(600, 1.0, cap=8000), output=LogNormal(120, 1.0, cap=1500), rate=25.0,
                 n_requests=600)
    res = simulate(w, policy, dep, seed=3, kv_blocks=kv_blocks)
    little = res.littles_law()
    assert little.L_timeline == pytest.approx(little.L_predicted, rel=1e-9)
    assert little.identity_L == pytest.approx(little.L_predicted, rel=1e-12)
    assert littles_law(L=little.L_timeline, arrival_rate=little.arrival_rate) == pytest.approx(
        little.mean_sojourn_s, rel=1e-9)
