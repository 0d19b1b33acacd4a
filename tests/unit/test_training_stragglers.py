"""lib.training.stragglers: order statistics of the slowest rank, one slow rank on the step model, the detector."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.training import stragglers
from lib.training import stragglers as s
from lib.training.step import TrainingLayout, training_step


def test_expected_max_of_two_normals_is_one_over_sqrt_pi():
    # E[max(Z1, Z2)] = 1 / sqrt(pi) exactly.
    assert s.expected_slowest(2, 0.01) == pytest.approx(1 + 0.01 / math.sqrt(math.pi), rel=1e-9)
    assert s.expected_slowest(1, 0.01) == pytest.approx(1.0, abs=1e-9)
    assert s.expected_slowest(1000, 0.0, 1.3) == 1.3


@pytest.mark.parametrize("n", [3, 16, 256, 4096, 16384])
def test_expected_slowest_against_monte_carlo(n):
    steps = max(400, 4_000_000 // n)
    sim = s.simulate_rank_times(n, steps, 0.02, seed=3).max(axis=1)
    se = sim.std(ddof=1) / math.sqrt(steps)
    assert s.expected_slowest(n, 0.02) == pytest.approx(sim.mean(), abs=5 * se)


def test_expected_slowest_with_one_slow_rank_against_monte_carlo():
    for factor in (1.01, 1.03, 1.2):
        sim = s.simulate_rank_times(1024, 4000, 0.01, {7: factor}, seed=4).max(axis=1)
        se = sim.std(ddof=1) / math.sqrt(4000)
        assert s.expected_slowest(1024, 0.01, factor) == pytest.approx(sim.mean(), abs=5 * se)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 20000), cv=st.floats(0.001, 0.05))
def test_expected_slowest_grows_with_n_and_cv(n, cv):
    e = s.expected_slowest(n, cv)
    assert 1.0 < e < 1 + 5 * cv
    assert s.expected_slowest(n + 1, cv) >= e - 1e-12
    assert s.expected_slowest(n, cv * 1.1) > e


def _step():
    return training_step(TrainingLayout("llama-3.1-405b", "h100-sxm", tp=8, pp=16, dp=128, micro_batches=16,
                                        interleave=4))


def test_straggler_step_identities():
    st_ = _step()
    assert s.straggler_step_s(st_) == pytest.approx(st_.step_s, rel=1e-12)
    assert s.straggler_step_s(st_, host_stall_s=0.5) == pytest.approx(st_.step_s + 0.5)
    # A slower clock stretches at least the compute (less what a longer backward hides of the gradient
    # collective), at most the whole step; it is the step model with the GEMM rate scaled.
    slow = s.straggler_step_s(st_, 1.25)
    compute = st_.matmul_s + st_.nonmatmul_s
    assert st_.step_s + 0.25 * compute - st_.dp_exposed_s < slow < 1.25 * st_.step_s + 1e-9
    from lib.training.step import training_assumptions

    a = training_assumptions()
    every_slow = training_step(st_.layout, training_assumptions(gemm_efficiency=a.gemm_efficiency / 1.25))
    assert slow == pytest.approx(every_slow.step_s, rel=1e-12)
    # A slow link stretches only the network collectives; TP stays on NVLink here.
    assert st_.fabrics["TP"] != "network"
    net = s.straggler_step_s(st_, 1.0, 2.0)
    assert st_.step_s < net <= st_.step_s + st_.dp_s + st_.p2p_exposed_s + 1e-12
    with pytest.raises(ValueError, match="compute_slowdown"):
        s.straggler_step_s(st_, 0.5)


def test_detector_finds_the_slow_rank_in_one_step_and_no_healthy_one():
    for seed in range(20):
        t = s.simulate_rank_times(16384, 1, 0.01, {seed * 97: 1.1}, seed=seed)
        assert s.find_stragglers(t) == [seed * 97]
    # No straggler: 100 steps of 4,096 ranks, no false alarm at z = 6 (expected 4e-4).
    healthy = s.simulate_rank_times(4096, 100, 0.01, seed=11)
    assert all(s.find_stragglers(row) == [] for row in healthy)


def test_detector_needs_several_steps_for_a_small_excess():
    # 3% slow at 1% jitter is a 3-sigma rank: not separable in one step, clear after 16 (12 sigma).
    t = s.simulate_rank_times(16384, 16, 0.01, {1234: 1.03}, seed=0)
    assert 1234 not in s.find_stragglers(t[0])
    assert s.find_stragglers(t) == [1234]


def test_a_biased_detector_is_caught():
    # The mean and SD are pulled by the straggler itself; a 3-sigma-of-SD rule misses a 30% rank at 8 ranks,
    # the median/MAD rule does not.
    t = np.array([1.0, 1.001, 0.999, 1.002, 0.998, 1.0, 1.001, 1.3])
    naive = [i for i, x in enumerate(t) if (x - t.mean()) / t.std() > 3]
    assert naive == [] and s.find_stragglers(t) == [7]


def test_detector_validates():
    with pytest.raises(ValueError, match="at least 3 ranks"):
        s.find_stragglers([1.0, 2.0])
    with pytest.raises(ValueError, match="z_threshold"):
        s.find_stragglers([1.0, 1.0, 2.0], z_threshold=0)


def test_every_cause_names_a_command():
    assert len(s.CAUSES) >= 4
    for c in s.CAUSES:
        assert c.command and c.slows in ("compute", "network", "host", "nothing yet")


# ---- E[max of n standard normals] (moved from lib.training.flops) --------------------------------


@pytest.mark.parametrize("n, exact", [(1, 0.0), (2, 1 / math.sqrt(math.pi)), (3, 1.5 / math.sqrt(math.pi)),
                                      (5, 1.1629644736405196)])
def test_expected_max_normal_exact_values(n, exact):
    # n = 2, 3: closed forms; n = 5: the tabulated expected maximum of five standard normals
    assert math.isclose(stragglers.expected_max_normal(n), exact, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize("n", [8, 64, 1024, 8192])
def test_expected_max_normal_against_monte_carlo(n):
    rng = np.random.default_rng(n)
    draws = rng.standard_normal((4000, n)).max(axis=1)
    se = draws.std() / math.sqrt(len(draws))
    assert abs(stragglers.expected_max_normal(n) - draws.mean()) < 4 * se


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 100_000))
def test_expected_max_normal_grows_slower_than_the_gumbel_bound(n):
    v = stragglers.expected_max_normal(n)
    assert v <= math.sqrt(2 * math.log(n)) + 1e-9  # E[max] <= sqrt(2 ln n)
    assert v <= stragglers.expected_max_normal(n + 1) + 1e-12


def test_expected_slowest_without_a_slow_rank_is_one_plus_cv_times_the_normal_max():
    assert math.isclose(stragglers.expected_slowest(4096, 0.02) - 1, 2 * (stragglers.expected_slowest(4096, 0.01) - 1))
    assert stragglers.expected_slowest(1, 0.05) == pytest.approx(1.0, abs=1e-12)
    # the general quadrature (one rank slowed by a hair) agrees with the closed path
    assert stragglers.expected_slowest(64, 0.01, slow_factor=1.0 + 1e-9) == pytest.approx(
        stragglers.expected_slowest(64, 0.01), rel=1e-6)
    with pytest.raises(ValueError, match="cv"):
        stragglers.expected_slowest(8, 0.5)
