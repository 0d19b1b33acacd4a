"""lib.fleet.regions: N-1 capacity by branch and bound against brute-force enumeration."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import regions


def test_rtt_table_symmetric():
    assert regions.rtt_ms("us-east", "us-west") == regions.rtt_ms("us-west", "us-east") > 0
    assert regions.rtt_ms("eu-west", "eu-west") == 0
    with pytest.raises(ValueError):
        regions.rtt_ms("mars", "us-east")


def test_neighbors_by_budget():
    names = ["us-east", "us-west", "eu-west"]
    assert regions.neighbors(names, 100) == [[1, 2], [0], [0]]
    assert regions.neighbors(names, 1000) == [[1, 2], [0, 2], [0, 1]]
    assert regions.neighbors(names, 10) == [[], [], []]


def test_equal_full_mesh_matches_k_over_k_minus_one():
    # 3 equal regions of 9 requests/s, 1 request/s per replica, u = u_f = 0.9: each loss spreads over two others
    nbrs = [[1, 2], [0, 2], [0, 1]]
    plan = regions.n_minus_one([9.0, 9.0, 9.0], nbrs, 1.0, 0.9, utilization=0.9)
    assert plan.base == (10, 10, 10)
    assert plan.total == 15 * 3  # 27 / 0.9 x 3/2 = 45
    assert all(regions.shortfall([9.0] * 3, plan.replicas, nbrs, j, 1.0, 0.9) == 0 for j in range(3))


def test_single_neighbour_holds_the_whole_spare():
    nbrs = [[1, 2], [0], [0]]
    rates = [12.0, 8.0, 5.0]
    plan = regions.n_minus_one(rates, nbrs, 2.0, 0.9)
    # region 0 must take region 1's load with its own: (12 + 8) / (2 x 0.9) = 11.1 -> 12
    assert plan.replicas[0] >= math.ceil((12 + 8) / 1.8)
    assert plan.total == regions.n_minus_one_brute(rates, nbrs, 2.0, 0.9).total


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 6.0), min_size=2, max_size=4), st.sampled_from([70.0, 100.0, 140.0, 250.0]),
       st.sampled_from([0.8, 0.9, 1.0]))
def test_branch_and_bound_matches_brute_force(rates, budget, uf):
    names = list(regions.REGIONS[: len(rates)])
    nbrs = regions.neighbors(names, budget)
    try:
        plan = regions.n_minus_one(rates, nbrs, 1.0, uf)
    except ValueError:
        with pytest.raises(ValueError):
            regions.n_minus_one_brute(rates, nbrs, 1.0, uf)
        return
    brute = regions.n_minus_one_brute(rates, nbrs, 1.0, uf, max_spare=max(plan.spare) + 2)
    assert plan.total == brute.total
    assert all(regions.shortfall(rates, plan.replicas, nbrs, j, 1.0, uf) <= 1e-9 for j in range(len(rates)))


def test_shortfall_and_budget():
    nbrs = [[1], [0]]
    # region 1 (4 req/s) lost; region 0 holds 10 replicas at 1 req/s, u_f 0.9, its own load 7: room 2 -> 2 refused
    assert regions.shortfall([7.0, 4.0], [10, 6], nbrs, 1, 1.0, 0.9) == pytest.approx(2.0)
    # 2 of 11 requests/s refused for 30 days x 0.001 budget ... one hour spends 1/720 x (2/11) / 0.001
    spent = regions.failover_budget(2.0, 11.0, 3600.0, 0.999, window_s=30 * 86400.0)
    assert spent == pytest.approx((2 / 11) / 0.001 * 3600 / (30 * 86400))


@pytest.mark.parametrize("call", [
    lambda: regions.n_minus_one([1.0], [[]], 1.0, 0.9),
    lambda: regions.n_minus_one([1.0, 1.0], [[], [0]], 1.0, 0.9),
    lambda: regions.n_minus_one([1.0, 1.0], [[1], [0]], 0.0, 0.9),
    lambda: regions.n_minus_one([1.0, 1.0], [[1], [0]], 1.0, 0.5),
    lambda: regions.neighbors(["us-east"], 100),
    lambda: regions.failover_budget(5.0, 1.0, 10.0, 0.999),
])
def test_bad_inputs(call):
    with pytest.raises(ValueError):
        call()


def test_residency_keeps_eu_in_eu():
    names = ["us-east", "eu-west", "eu-central"]
    free = regions.neighbors(names, 100.0)
    res = regions.neighbors(names, 100.0, residency={"eu-west": "EU", "eu-central": "EU"})
    assert free[1] == [0, 2] and res[1] == [2] and res[2] == [1]
    assert res[0] == [1, 2]  # US users may still go to the EU
    with pytest.raises(ValueError):
        regions.neighbors(names, 100.0, residency={"mars": "EU"})


def test_retry_arrivals_against_closed_form():
    import numpy as np

    k, lam, w = 3000.0, 20.0, 30.0
    runs = [regions.retry_arrivals(k, lam, w, 60.0, seed) for seed in range(20)]
    inside = np.mean([r[:29].mean() for r in runs])
    after = np.mean([r[31:].mean() for r in runs])
    assert inside == pytest.approx(regions.retry_peak_rate(k, lam, w), rel=0.02)
    assert after == pytest.approx(lam, rel=0.05)
    assert sum(r.sum() for r in runs) / 20 == pytest.approx(k + lam * 60, rel=0.02)
    # immediate retries land in the first second
    assert regions.retry_arrivals(500, 0.0, 1.0, 10.0, 1)[0] == 500


def test_n_minus_one_large_spares_exact_and_feasible():
    # an instance with hundreds of spare replicas (the LP bound keeps the search short); 1267 is the
    # optimum found by the plain branch and bound and by an exhaustive search over the first three spares
    rates, nbrs = [50.0, 18.31, 44.14, 19.91], [[1, 2, 3], [0, 2], [0, 1, 3], [0, 2]]
    plan = regions.n_minus_one(rates, nbrs, 0.2, 0.748)
    assert plan.total == 1267
    assert all(regions.shortfall(rates, plan.replicas, nbrs, j, 0.2, 0.748) <= 1e-9 for j in range(4))
