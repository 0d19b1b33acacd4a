"""lib.decoding.verify: the greedy prefix match against a loop, the rejection verifier against its exact
output distribution (chi-square, seeded), losslessness by exact enumeration, and the biased rules."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import verify as V
from lib.decoding import verify_practice as vp


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 12))
def test_greedy_verify_matches_a_loop(seed, k, rows):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 3, (rows, k + 1))
    n = rng.integers(0, k + 1, rows)
    d = np.where(rng.random((rows, k)) < 0.7, t[:, :k], rng.integers(0, 3, (rows, k)))
    d[np.arange(k)[None, :] >= n[:, None]] = V.PAD
    r = V.greedy_verify(t, d, n)
    for b in range(rows):
        a = 0
        while a < n[b] and d[b, a] == t[b, a]:
            a += 1
        assert r.num_accepted[b] == a and r.emitted(b) == tuple(t[b, : a + 1]) and r.kv_rollback[b] == n[b] - a
        assert (r.tokens[b, a + 1:] == V.PAD).all()


def _fixed_tables(seed, k, vocab=4):
    rng = np.random.default_rng(seed)
    from lib.decoding.sampling import softmax

    p = softmax(rng.standard_normal((k + 1, vocab)) * 1.5)
    q = softmax(np.log(p[:k]) + rng.standard_normal((k, vocab)))
    return p, q


def _empirical(verify, p, q, rows, seed):
    k = q.shape[0]
    rng = np.random.default_rng(seed)
    d = V.inverse_cdf(np.broadcast_to(q, (rows, k, q.shape[1])), rng.random((rows, k)))
    out = verify(np.broadcast_to(p, (rows, *p.shape)), np.broadcast_to(q, (rows, *q.shape)), d, np.full(rows, k),
                 rng)
    counts: dict = {}
    for b in range(rows):
        s = tuple(int(x) for x in out.tokens[b] if x != V.PAD)
        counts[s] = counts.get(s, 0) + 1
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_verify_follows_the_exact_step_distribution(seed):
    p, q = _fixed_tables(seed, 3)
    want = V.step_distribution(lambda pre: p[len(pre)], lambda pre: q[len(pre)], 3)
    assert sum(want.values()) == pytest.approx(1.0)
    stat, crit = V.chi_square_test([_empirical(V.rejection_verify, p, q, 20_000, seed)], [want], alpha=1e-3)
    assert stat < crit


@pytest.mark.parametrize("name", ["residual not renormalised", "residual = p", "accept only if p >= q"])
def test_each_code_draft_follows_its_enumerated_rule(name):
    """The drafts of the practice module are the rules enumeration prices: their samples fit the rule's
    exact distribution and not the lossless one."""
    from lib.book.drafts import edited

    draft = edited(V.rejection_verify, vp._DRAFTS[name][1], name=name)
    p, q = _fixed_tables(5, 2)
    tp, tq = (lambda pre: p[len(pre)]), (lambda pre: q[len(pre)])
    counts = _empirical(draft, p, q, 20_000, 5)
    biased = V.step_distribution(tp, tq, 2, V.BIASED_RULES[name])
    lossless = V.step_distribution(tp, tq, 2)
    assert V.chi_square_test([counts], [biased])[0] < V.chi_square_test([counts], [biased])[1]
    assert V.chi_square_test([counts], [lossless])[0] > V.chi_square_test([counts], [lossless])[1]


@pytest.mark.parametrize("seed", [0, 3])
def test_lossless_rule_reproduces_the_target_stream_exactly(seed):
    m = V.ToyModel(vocab=3, seed=seed)
    target = V.target_stream_distribution(m.target, 3, 4)
    for k in (1, 2, 3):
        assert V.total_variation(V.stream_distribution(m.target, m.draft, k, 4), target) < 1e-12
    assert V.total_variation(V.stream_distribution(m.target, m.draft, 2, 4, V.BIASED_RULES["bonus token dropped"]),
                             target) < 1e-12  # a throughput bug, not a bias
    for name in ("residual not renormalised", "residual = p", "accept only if p >= q"):
        assert V.total_variation(V.stream_distribution(m.target, m.draft, 2, 4, V.BIASED_RULES[name]), target) > 0.01


def test_identical_draft_accepts_everything_and_acceptance_is_one_minus_tv():
    m = V.ToyModel(vocab=5, draft_noise=0.0, seed=1)
    assert V.step_distribution(m.target, m.draft, 3).keys() == {s for s in V.step_distribution(m.target, m.draft, 3)
                                                               if len(s) == 4}
    m = V.ToyModel(vocab=5, seed=2)
    p, q = m.target(()), m.draft(())
    one = V.step_distribution(m.target, m.draft, 1)
    accepted = sum(pr for s, pr in one.items() if len(s) == 2)
    assert accepted == pytest.approx(np.minimum(p, q).sum()) == pytest.approx(1 - 0.5 * np.abs(p - q).sum())


def test_ragged_rows_and_no_drafts():
    p, q = _fixed_tables(0, 3)
    P, Q = np.stack([p, p, p]), np.stack([q, q, q])
    d = np.array([[0, 1, 2], [1, V.PAD, V.PAD], [V.PAD, V.PAD, V.PAD]])
    r = V.rejection_verify(P, Q, d, [3, 1, 0], 0)
    assert (r.num_accepted <= [3, 1, 0]).all() and r.num_emitted.tolist() == (r.num_accepted + 1).tolist()
    assert (r.tokens[2, 1:] == V.PAD).all() and r.tokens[2, 0] >= 0
    empty = V.rejection_verify(P[:, :1], Q[:, :0], np.zeros((3, 0), int), [0, 0, 0], 1)
    assert empty.num_accepted.tolist() == [0, 0, 0]


def test_bad_inputs_are_named():
    p, q = _fixed_tables(0, 2)
    with pytest.raises(ValueError, match="num_drafted"):
        V.rejection_verify(p[None], q[None], [[0, 1]], [3], 0)
    with pytest.raises(ValueError, match="target_probs"):
        V.rejection_verify(p[None, :2], q[None], [[0, 1]], [2], 0)
    with pytest.raises(ValueError, match="drafted"):
        V.greedy_verify([[0, 1, 2]], [[V.PAD, 1]], [2])


def test_power_against_the_biased_rules_is_stated_and_high():
    p, q = vp._group_tables("group", 3, 8, 3)
    tp, tq = (lambda pre: p[len(pre)]), (lambda pre: q[len(pre)])
    exp = V.step_distribution(tp, tq, 3)
    for name in ("residual not renormalised", "residual = p", "accept only if p >= q", "bonus token dropped"):
        biased = V.step_distribution(tp, tq, 3, V.BIASED_RULES[name])
        assert V.detection_power([exp], [biased], [vp.ROWS], alpha=vp.ALPHA, sims=500) > 0.99
    assert V.detection_power([exp], [exp], [vp.ROWS], alpha=0.05, sims=2000) == pytest.approx(0.05, abs=0.02)


def test_practice_grader_passes_the_reference_and_fails_every_draft():
    assert vp.check(vp.variant("reference")).passed
    for name in vp.VARIANTS:
        assert vp.check(vp.variant(name)).status == "failed", name
    assert vp.check(vp.skeleton).status == "not implemented"
    assert vp.check_greedy(vp.greedy_variant("reference")).passed
    for name in vp.GREEDY_VARIANTS:
        assert vp.check_greedy(vp.greedy_variant(name)).status == "failed", name
    assert vp.check_greedy(vp.greedy_skeleton).status == "not implemented"


def test_practice_grader_rarely_fails_a_correct_verifier():
    """Level 1e-3 per case: over 30 rng seeds the reference fails the statistical cases at most once."""
    fails = 0
    for seed in range(30):
        for case in vp.cases()[4:]:
            try:
                vp.run(vp.variant("reference"), case.ops, seed=seed)
            except AssertionError:
                fails += 1
    assert fails <= 1


def test_kv_slots_count_what_the_pass_wrote_and_what_stays_valid():
    s = V.kv_slots([10, 10, 1], [4, 4, 0], [4, 1, 0])
    assert s["written_from"].tolist() == [9, 9, 0] and s["written_to"].tolist() == [14, 14, 1]
    assert s["valid_len"].tolist() == [14, 11, 1] and s["rollback"].tolist() == [0, 3, 0]
    assert (s["new_seq_len"] - 1 == s["valid_len"]).all()  # the emitted token has no KV yet
    with pytest.raises(ValueError, match="num_accepted"):
        V.kv_slots([10], [2], [3])


def test_the_vectorized_bootstrap_statistic_is_the_scalar_one():
    """_simulated_statistics bins like chi_square_statistic (the book's one chi-square): same draws,
    same X^2, including a pooled tail, a folded pool and an outcome the expected side never makes."""
    import math

    import numpy as np

    expected = {(0,): 0.5, (1,): 0.3, (2,): 0.15, (3,): 0.03, (4,): 0.02, (5,): 0.0}
    biased = {(0,): 0.45, (1,): 0.3, (2,): 0.15, (3,): 0.05, (4,): 0.02, (5,): 0.02, (6,): 0.01}
    for n in (40, 200, 5000):
        got = V._simulated_statistics([expected], [biased], [n], 50, np.random.default_rng(3))
        keys = list(expected)
        pb = np.array([biased.get(k, 0.0) for k in keys] + [1 - sum(biased.get(k, 0.0) for k in keys)])
        draws = np.random.default_rng(3).multinomial(n, pb / pb.sum(), size=50)
        for row, g in zip(draws, got, strict=True):
            counts = {k: int(c) for k, c in zip(keys, row[:-1], strict=True)}
            counts[(6,)] = int(row[-1])
            want = V.chi_square_statistic(counts, expected)[0]
            assert (math.isinf(g) and math.isinf(want)) or math.isclose(g, want, rel_tol=1e-9), (n, g, want)


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_reused_uniform_first_token_is_the_code_drafts_first_token(seed):
    """The exact first-token distribution of the reused-uniform draft against that draft's own samples
    (k = 2, chi-square), and it differs from p unless the residual has one token."""
    p, q = _fixed_tables(seed, 2)
    exact = V.reused_uniform_first_token(p[0], q[0])
    assert exact.sum() == pytest.approx(1.0, abs=1e-12)
    from lib.book.drafts import edited

    draft = edited(V.rejection_verify, vp._DRAFTS["acceptance uniform reused"][1], name="reused")
    counts = _empirical(draft, p, q, 40_000, seed)
    first: dict = {}
    for s, c in counts.items():
        first[s[:1]] = first.get(s[:1], 0) + c
    want = {(i,): float(x) for i, x in enumerate(exact)}
    stat, crit = V.chi_square_test([first], [want])
    assert stat < crit
    if (np.maximum(p[0] - q[0], 0) > 0).sum() > 1:
        assert 0.5 * np.abs(exact - p[0]).sum() > 1e-3
        stat_p, crit_p = V.chi_square_test([first], [{(i,): float(x) for i, x in enumerate(p[0])}])
        assert stat_p > crit_p


def test_reused_uniform_first_token_edge_cases():
    p = np.array([0.7, 0.3])
    assert np.allclose(V.reused_uniform_first_token(p, p), p)  # never rejected
    q = np.array([0.4, 0.6])  # one residual token: the uniform does not matter
    assert np.allclose(V.reused_uniform_first_token(p, q), p)
    with pytest.raises(ValueError, match="sum to 1"):
        V.reused_uniform_first_token([0.5, 0.4], [0.5, 0.5])


def test_binomial_upper_bound_is_clopper_pearson_and_covers():
    import math

    # no events: closed form, close to the rule of three
    assert V.binomial_upper_bound(0, 300) == pytest.approx(1 - 0.05 ** (1 / 300))
    assert V.binomial_upper_bound(0, 300) == pytest.approx(3 / 300, rel=0.01)
    # at the bound, P(X <= f) = 1 - confidence (the binomial CDF summed directly)
    for f, n in ((1, 20), (3, 300), (10, 50)):
        r = V.binomial_upper_bound(f, n, 0.9)
        cdf = sum(math.comb(n, i) * r**i * (1 - r) ** (n - i) for i in range(f + 1))
        assert cdf == pytest.approx(0.1, abs=1e-9) and r > f / n
    assert V.binomial_upper_bound(5, 5) == 1.0
    assert V.binomial_upper_bound(2, 100) < V.binomial_upper_bound(3, 100) < V.binomial_upper_bound(3, 100, 0.99)
    # coverage, exactly: summed over every outcome, the bound lies above the true rate with probability >= 95%
    for rate, n in ((0.01, 300), (0.2, 40), (0.003, 1000)):
        cover = sum(math.comb(n, f) * rate**f * (1 - rate) ** (n - f)
                    for f in range(n + 1) if f >= rate * n or V.binomial_upper_bound(f, n) >= rate)  # bound > f/n
        assert 0.95 <= cover < 0.999
    with pytest.raises(ValueError, match="events"):
        V.binomial_upper_bound(4, 3)
