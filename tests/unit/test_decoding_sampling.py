"""lib.decoding.sampling: the temperature softmax against a direct float64 formula, its greedy limit,
and logits that would overflow a naive exp."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lib.decoding.sampling import softmax

rows = arrays(np.float64, st.integers(1, 40), elements=st.floats(-30, 30))


@given(rows, st.floats(0.05, 5.0))
def test_softmax_matches_the_definition(z, t):
    want = [math.exp(x / t) for x in z]
    s = sum(want)
    assert np.allclose(softmax(z, t), [w / s for w in want], rtol=1e-9, atol=1e-300)


def test_large_logits_do_not_overflow_and_masked_tokens_get_zero():
    p = softmax([1000.0, 999.0, -np.inf])
    assert np.isfinite(p).all() and p[2] == 0 and p[0] == pytest.approx(1 / (1 + math.exp(-1)))


def test_temperature_zero_is_greedy_with_ties_to_the_lowest_id():
    assert softmax([1.0, 3.0, 3.0, 2.0], 0).tolist() == [0, 1, 0, 0]
    assert softmax([[1.0, 2.0], [5.0, 4.0]], 0).tolist() == [[0, 1], [1, 0]]


def test_bad_inputs_named():
    with pytest.raises(ValueError, match="temperature"):
        softmax([1.0], -1)
    with pytest.raises(ValueError, match="NaN"):
        softmax([1.0, float("nan")])
    with pytest.raises(ValueError, match="unmasked"):
        softmax([-np.inf, -np.inf])


# ---- the filters, their order, the statistics (lib.decoding.sampling beyond softmax) -------------------

from itertools import permutations  # noqa: E402

from lib.decoding import sampling as s  # noqa: E402

tie_rows = arrays(np.float64, st.integers(1, 30), elements=st.sampled_from([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0, -np.inf]))


def _brute_top_p(z, p):
    """The definition: the smallest set of top tokens holding >= p, a boundary tie group kept whole."""
    probs = softmax(z)
    keep = set()
    for v in sorted(set(z[np.isfinite(z)]), reverse=True):
        if probs[z > v].sum() < p - 1e-12:
            keep |= set(np.flatnonzero(z == v))
    return sorted(keep)


@given(tie_rows.filter(lambda z: np.isfinite(z).any()), st.floats(0.01, 0.99))
def test_top_p_matches_the_definition_and_ignores_the_vocabulary_order(z, p):
    kept = np.flatnonzero(np.isfinite(s.top_p_filter(z, p))).tolist()
    assert kept == _brute_top_p(z, p) or abs(softmax(z)[kept].sum() - p) < 1e-9
    perm = np.random.default_rng(len(z)).permutation(len(z))
    kept_perm = np.flatnonzero(np.isfinite(s.top_p_filter(z[perm], p)))
    assert sorted(perm[kept_perm].tolist()) == kept


def test_top_p_of_one_keeps_every_token_of_a_128k_vocabulary():
    z = np.random.default_rng(0).standard_normal(128_256) * 3
    assert np.isfinite(s.top_p_filter(z, 1.0)).all()
    assert len(s.kept_tokens(z, top_p=1.0)) == 128_256


@given(tie_rows.filter(lambda z: np.isfinite(z).any()), st.integers(0, 35), st.floats(0.0, 1.0))
def test_top_k_and_min_p_are_thresholds_that_keep_ties(z, k, m):
    finite = np.sort(z[np.isfinite(z)])[::-1]
    kept = np.isfinite(s.top_k_filter(z, k))
    if 0 < k < z.size and k <= finite.size:
        assert kept.tolist() == (z >= finite[k - 1]).tolist()
    else:
        assert kept.tolist() == np.isfinite(z).tolist()
    probs = softmax(z)
    kept_m = np.isfinite(s.min_p_filter(z, m))
    assert (probs[kept_m] >= m * probs.max() * (1 - 1e-12)).all() and kept_m[np.argmax(z)]


def test_torch_oracle_transformers_style_warpers():
    """Temperature, top-k, top-p, min-p written as transformers' warpers do it, in torch (no ties)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    for trial in range(40):
        z = rng.standard_normal(50) * 2
        t, k, p, m = 0.4 + rng.random(), int(rng.integers(0, 20)), 0.3 + 0.69 * rng.random(), 0.05 * rng.random()
        x = torch.tensor(z)[None] / t
        if k:
            x = x.masked_fill(x < torch.topk(x, k)[0][..., -1, None], -float("inf"))
        sorted_logits, idx = torch.sort(x, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum <= 1 - p
        remove[..., -1:] = False
        x = x.masked_fill(remove.scatter(1, idx, remove), -float("inf"))
        probs = x.softmax(-1)
        x = x.masked_fill(probs < m * probs.max(), -float("inf"))
        want = x.softmax(-1)[0].numpy()
        got = s.sampling_probs(z, t, k, p, m, order=s.ENGINE_ORDERS["transformers"])
        assert np.allclose(got, want, atol=1e-12), trial


def test_the_order_changes_the_kept_set_only_where_it_should():
    z = np.array([3.0, 2.4, 2.0, 1.2, 0.5, -1.0])
    sets = {o: tuple(s.kept_tokens(z, 1.8, 4, 0.7, order=o)) for o in permutations(("temperature", "top_k", "top_p"))}
    assert len(set(sets.values())) > 1
    for o in permutations(("temperature", "top_k", "min_p")):  # ranks and ratios: order-free up to temperature
        if o.index("temperature") == 0:
            assert tuple(s.kept_tokens(z, 1.8, 4, min_p=0.3, order=o)) == tuple(s.kept_tokens(z, 1.8, 4, min_p=0.3))


def test_temperature_zero_is_greedy_under_every_filter_and_order():
    z = [1.0, 4.0, 4.0, 2.0]
    for o in permutations(s.KNOBS):
        assert s.kept_tokens(z, 0, 2, 0.1, 0.5, order=o).tolist() == [1, 2]
        assert s.sampling_probs(z, 0, 2, 0.1, 0.5, order=o).tolist() == [0, 1, 0, 0]


def test_chi2_sf_against_torch_gammaincc():
    torch = pytest.importorskip("torch")
    for x, dof in [(0.5, 1), (3.84, 1), (10.0, 3), (100.0, 50), (30.0, 5), (1e-3, 7), (400.0, 300)]:
        want = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64)))
        assert s.chi2_sf(x, dof) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_chi_square_tells_a_correct_sampler_from_a_biased_one():
    z = np.array([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    p = s.sampling_probs(z, 0.8)
    passes = [s.chi_square_gof(s.sample(z, seed, 20_000, temperature=0.8), p).p_value for seed in range(20)]
    assert min(passes) > 1e-4 and np.mean(np.array(passes) < 0.05) <= 0.2  # p-values of a true null spread out
    biased = [s.chi_square_gof(s.sample(z, seed, 20_000, temperature=0.9), p).p_value for seed in range(20)]
    assert max(biased) < 1e-4
    masked = s.sampling_probs(z, 0.8, top_k=3)
    assert s.chi_square_gof(s.sample(z, 0, 1000, temperature=0.8), masked).impossible > 0


def test_exp_overflow_logit():
    with np.errstate(over="ignore"):
        for dt in (np.float16, np.float32, np.float64):
            x = dt(s.exp_overflow_logit(dt))
            assert np.isfinite(np.exp(x)) and not np.isfinite(np.exp(np.nextafter(x, dt(np.inf))))
    assert s.exp_overflow_logit("float32") == pytest.approx(math.log(np.finfo(np.float32).max), abs=1e-5)


def test_sampler_inputs_refused_with_a_message():
    with pytest.raises(ValueError, match="top_p"):
        s.sampling_probs([1.0, 2.0], top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        s.sampling_probs([1.0, 2.0], top_k=-1)
    with pytest.raises(ValueError, match="leaves out"):
        s.sampling_probs([1.0, 2.0], min_p=0.1, order=("temperature", "top_k"))
    with pytest.raises(ValueError, match="distinct"):
        s.filter_logits([1.0], order=("temperature", "temperature"))


def test_draws_to_detect_gives_about_even_power_by_simulation():
    z = np.array([2.0, 1.5, 1.0, 0.0, -1.0, -3.0])
    p, q = s.sampling_probs(z, 0.8), s.sampling_probs(z, 0.84)
    n = round(s.chi_square_draws_to_detect(p, q, 1e-4))
    rng = np.random.default_rng(0)
    hits = [s.chi_square_gof(rng.choice(6, n, p=q), p).p_value < 1e-4 for _ in range(300)]
    assert 0.3 < np.mean(hits) < 0.7
    assert s.chi2_sf(s.chi2_isf(1e-4, 5), 5) == pytest.approx(1e-4, rel=1e-6)


def test_a_bias_that_changes_nothing_needs_infinitely_many_draws():
    # tied logits: temperature moves no mass, so no test can catch a wrong temperature
    z = np.array([4.0, 4.0, -1e4])
    p, q = s.sampling_probs(z, 0.5), s.sampling_probs(z, 0.6)
    assert np.array_equal(p, q)
    assert s.chi_square_draws_to_detect(p, q, 1e-4) == math.inf
    with pytest.raises(ValueError, match="never draws"):
        s.chi_square_draws_to_detect([1.0, 0.0], [0.5, 0.5])
