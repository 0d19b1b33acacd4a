"""lib.numerics.evals: benchmark-score statistics (closed forms against simulation and brute force)
and token-level divergence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.numerics import evals
from lib.sre import canary


def test_score_se_and_unpaired():
    assert evals.score_standard_error(0.8, 1319) == pytest.approx(math.sqrt(0.16 / 1319))
    assert evals.unpaired_difference_se(0.8, 0.79, 1000) == pytest.approx(math.sqrt((0.16 + 0.79 * 0.21) / 1000))


def test_cells_and_refusal():
    p = evals.cell_probabilities(0.8, 0.79, 0.05)
    assert p == pytest.approx([0.77, 0.03, 0.02, 0.18])
    with pytest.raises(ValueError, match="discordance"):
        evals.cell_probabilities(0.8, 0.7, 0.05)  # the difference exceeds the discordance
    with pytest.raises(ValueError, match="discordance"):
        evals.cell_probabilities(0.99, 0.99, 0.1)  # not enough wrong items to disagree on


def test_paired_se_matches_simulation():
    a, b = evals.simulate_paired(1000, 0.8, 0.79, 0.05, runs=4000, seed=1)
    diff = a.mean(axis=1) - b.mean(axis=1)
    assert diff.std(ddof=1) == pytest.approx(evals.paired_difference_se(0.03, 0.02, 1000), rel=0.05)
    assert diff.mean() == pytest.approx(0.01, abs=0.0005)


def test_mcnemar_min_discordant_is_where_the_exact_test_first_rejects():
    for alpha in (0.5, 0.1, 0.05, 0.05 / 6, 0.001):
        m = evals.mcnemar_min_discordant(alpha)
        assert evals.mcnemar_exact_p(m, 0) < alpha <= evals.mcnemar_exact_p(m - 1, 0)
    assert evals.mcnemar_min_discordant(0.05 / 6) == 8
    with pytest.raises(ValueError, match="alpha"):
        evals.mcnemar_min_discordant(0.0)


def test_mcnemar_exact_power_matches_simulated_exact_tests():
    alpha = 0.05 / 6
    for n, psi, d in ((8, 0.53, 0.5), (40, 0.53, 0.5), (120, 0.2, 0.1)):
        a, b = evals.simulate_paired(n, 0.9, 0.9 - d, psi, runs=20000, seed=n)
        ac, bc = (a & ~b).sum(axis=1), (~a & b).sum(axis=1)
        sim = float(np.mean(evals.mcnemar_rejects(ac, bc, alpha)))
        assert evals.mcnemar_exact_power(n, psi, d, alpha) == pytest.approx(sim, abs=0.015)
    assert evals.mcnemar_exact_power(7, 0.53, 0.5, alpha) == 0.0  # below the fewest discordant items that can reject
    assert evals.mcnemar_exact_power(2000, 0.1, 0.03, 0.05) == pytest.approx(evals.mcnemar_power(2000, 0.1, 0.03, 0.05), abs=0.02)
    for m in range(30):  # the critical count is where mcnemar_exact_p first falls under alpha
        k = evals.mcnemar_critical_count(m, alpha)
        top = min(k, m)  # the most lopsided split when the test cannot reject
        assert bool(evals.mcnemar_rejects(np.array([top]), np.array([m - top]), alpha)[0]) == (k <= m)
        if k <= m:
            assert evals.mcnemar_exact_p(k, m - k) < alpha <= evals.mcnemar_exact_p(k - 1, m - k + 1)


def test_mcnemar_power_matches_simulation():
    n, psi, d = 1319, 0.05, 0.01
    a, b = evals.simulate_paired(n, 0.8, 0.8 - d, psi, runs=4000, seed=2)
    ac, bc = (a & ~b).sum(axis=1), (~a & b).sum(axis=1)
    z = (ac - bc) / np.sqrt(np.maximum(ac + bc, 1))
    assert np.mean(np.abs(z) > 1.959964) == pytest.approx(evals.mcnemar_power(n, psi, d), abs=0.03)


def test_mcnemar_exact_p_brute_force_and_size():
    for a, b in ((0, 0), (5, 0), (41, 38), (20, 7), (3, 12)):
        m = a + b
        want = 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, k) for k in range(max(a, b), m + 1)) / 2**m)
        assert evals.mcnemar_exact_p(a, b) == pytest.approx(want, rel=1e-9)
    a, b = evals.simulate_paired(800, 0.7, 0.7, 0.08, runs=3000, seed=3)  # no difference: size at most alpha
    ac, bc = (a & ~b).sum(axis=1), (~a & b).sum(axis=1)
    size = np.mean([evals.mcnemar_exact_p(int(x), int(y)) < 0.05 for x, y in zip(ac, bc, strict=True)])
    assert size <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 3000)


def test_items_needed_and_mdd_are_inverse():
    n = evals.items_needed_paired(0.05, 0.01)
    assert evals.mcnemar_power(round(n), 0.05, 0.01) == pytest.approx(0.8, abs=0.005)
    mdd = evals.min_detectable_difference_paired(round(n), 0.05)
    assert mdd == pytest.approx(0.01, rel=0.01)


def test_unpaired_mdd_uses_canary_two_sample():
    mdd = evals.min_detectable_difference_unpaired(1319, 0.8)
    assert canary.requests_needed(0.2, 0.2 + mdd, 0.025, 0.8, two_sample=True) == pytest.approx(1319, rel=1e-6)


def test_bootstrap_se_matches_closed_form():
    cells = evals.PairedCells(1000, 60, 40, 300)
    b = evals.paired_bootstrap(cells, 4000, seed=0)
    assert b.difference == pytest.approx(20 / 1400)
    assert b.se == pytest.approx(evals.paired_difference_se(60 / 1400, 40 / 1400, 1400), rel=0.06)
    assert b.low < b.difference < b.high


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.floats(0.01, 0.6), st.floats(0.0, 1.0))
def test_pairing_never_hurts(n, psi, frac):
    """For a fixed accuracy difference, the paired SE is at most the unpaired one whenever the two
    models' correctness is not negatively correlated: discordance at most p_a q_b + p_b q_a, what two
    independent models would have."""
    p_a = 0.5
    d = frac * psi * 0.999
    p_b = p_a - d
    if psi > p_a * (1 - p_b) + p_b * (1 - p_a):
        return
    evals.cell_probabilities(p_a, p_b, psi)
    assert evals.paired_difference_se((psi + d) / 2, (psi - d) / 2, n) <= evals.unpaired_difference_se(p_a, p_a - d, n) + 1e-12


@settings(max_examples=40, deadline=None)
@given(st.integers(20, 20000), st.floats(0.005, 0.5))
def test_mdd_monotone_in_items(n, psi):
    assert evals.min_detectable_difference_paired(2 * n, psi) <= evals.min_detectable_difference_paired(n, psi) + 1e-12


def test_token_divergence():
    ref = evals.synthetic_logits(500, 64, seed=0)
    same = evals.token_divergence(ref, ref, ref.argmax(axis=1))
    assert np.allclose(same.kl, 0) and not same.flip.any() and same.perplexity_ratio == pytest.approx(1.0)
    q = evals.perturb_logits(ref, 0.3, seed=1)
    d = evals.token_divergence(ref, q, evals.sample_tokens(ref, 1.0, seed=2))
    assert (d.kl >= 0).all() and 0 < d.flip.mean() < 1
    # flips concentrate where the top-1 margin is small
    small = d.margin < np.median(d.margin)
    assert d.flip[small].mean() > d.flip[~small].mean()
    with pytest.raises(ValueError):
        evals.token_divergence(ref, q[:10], ref.argmax(axis=1))
    with pytest.raises(ValueError):
        evals.perturb_logits(ref, -1.0)


def test_pooled_and_allocation():
    assert evals.pooled([0.5, 0.5], [0.1, 0.3]) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        evals.pooled([0.5, 0.6], [0.1, 0.3])
    alloc = evals.allocate_items([0.4, 0.3, 0.2, 0.05, 0.03, 0.02], 1000, 50)
    assert alloc.sum() == 1000 and alloc.min() >= 50
    assert list(evals.allocate_items([0.5, 0.25, 0.25], 4)) == [2, 1, 1]
    with pytest.raises(ValueError, match="exceed"):
        evals.allocate_items([0.5, 0.5], 10, 6)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=8), st.integers(1, 5000), st.integers(0, 50))
def test_allocation_properties(raw, total, floor):
    shares = np.array(raw) / sum(raw)
    if floor * len(raw) > total:
        return
    alloc = evals.allocate_items(shares, total, floor)
    assert alloc.sum() == total and alloc.min() >= floor
    assert np.all(np.abs(alloc - floor - (total - floor * len(raw)) * shares) < 1 + 1e-9)  # within one of proportional


def test_discordance_excess_is_canary_two_sample():
    assert evals.discordance_excess_items(0.02, 0.04) == canary.requests_needed(0.02, 0.04, 0.05, 0.8, two_sample=True)


@pytest.mark.parametrize("psi, d, alpha, power", [(0.13, 0.10, 0.05 / 6, 0.8), (0.53, 0.5, 0.05 / 6, 0.8),
                                                  (0.27, 0.25, 0.05 / 6, 0.95), (0.105, 0.1, 0.01 / 6, 0.8)])
def test_items_needed_exact_is_the_first_n_of_a_scan(psi, d, alpha, power):
    n = evals.items_needed_paired_exact(psi, d, alpha, power)
    normal = evals.items_needed_paired(psi, d, alpha, power)
    scan = [evals.mcnemar_exact_power(m, psi, d, alpha) for m in range(1, int(1.5 * normal) + 2)]
    assert n == 1 + next(i for i, p in enumerate(scan) if p >= power)  # the first n that reaches the power
    assert all(p >= power for p in scan[n - 1:])  # and the power stays there over the scanned range
    assert abs(n - normal) <= 0.2 * normal  # the normal approximation is close, not equal


def test_items_needed_exact_reaches_the_power_in_simulated_exact_tests():
    psi, d, alpha = 0.13, 0.10, 0.05 / 6
    n = evals.items_needed_paired_exact(psi, d, alpha, 0.8)
    a, b = evals.simulate_paired(n, 0.8, 0.7, psi, runs=20_000, seed=4)
    hits = evals.mcnemar_rejects((a & ~b).sum(axis=1), (~a & b).sum(axis=1), alpha)
    assert abs(float(np.mean(hits)) - evals.mcnemar_exact_power(n, psi, d, alpha)) <= 4 * math.sqrt(0.25 / 20_000)
    assert float(np.mean(hits)) >= 0.8 - 4 * math.sqrt(0.25 / 20_000)
    with pytest.raises(ValueError, match="difference"):
        evals.items_needed_paired_exact(0.1, 0.2)
