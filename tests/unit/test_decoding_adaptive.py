"""lib.decoding.adaptive: the step table against speculative_step, the simulation against the
closed forms (eq. 1, the Beta posterior), the batch pricing rules, the policies' edge cases."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.decoding import adaptive as ad
from lib.decoding import speculative as sp
from lib.perf.deployment import deployment

TARGET = deployment("llama-3.1-70b", "h100-sxm", tp=8)
DRAFTER = sp.model_drafter(deployment("llama-3.2-1b", "h100-sxm", tp=8))
TABLE = ad.step_table(TARGET, DRAFTER, 1024)


@given(st.floats(0.0, 1.0), st.integers(0, 12))
def test_vector_tokens_per_step_is_eq_1(a, k):
    assert math.isclose(float(sp.speculative_tokens_per_step(np.array([a]), np.array([k]))[0]), sp.speculative_tokens_per_step(a, k), rel_tol=1e-12)


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("k", [0, 1, 4, 12])
def test_table_is_speculative_step_on_the_grid(batch, k):
    s = sp.speculative_step(TARGET, DRAFTER, k, 0.7, batch, 1024)
    assert math.isclose(TABLE.step_s(batch, k), s.step_s, rel_tol=1e-12)
    assert math.isclose(TABLE.plain(batch), s.plain_step_s, rel_tol=1e-12)


def test_table_interpolates_between_grid_batches():
    mid = TABLE.step_s(40, 3)
    assert min(TABLE.step_s(32, 3), TABLE.step_s(48, 3)) <= mid <= max(TABLE.step_s(32, 3), TABLE.step_s(48, 3))
    with pytest.raises(ValueError, match="batch"):
        TABLE.step_s(10_000, 3)
    with pytest.raises(ValueError, match="draft_tokens"):
        TABLE.step_s(8, 13)


def test_ragged_verify_matches_whole_counts_and_lies_between():
    for q in (1, 3, 13):
        assert math.isclose(TABLE.ragged_verify_s(16, q), TABLE.verify_s[4, q - 1], rel_tol=1e-12)
    assert TABLE.verify_s[4, 2] <= TABLE.ragged_verify_s(16, 3.5) <= TABLE.verify_s[4, 3]


@pytest.mark.parametrize("spread", [None, 3.0])
@pytest.mark.parametrize("a,k", [(0.6, 3), (0.9, 8)])
def test_fixed_k_tokens_per_step_match_eq_1(a, k, spread):
    # Monte Carlo of the engine against Leviathan eq. 1: 400 requests x 4,000 tokens (about 65,000 to
    # 270,000 steps; the standard error of the mean is under 0.3%); per-token spread keeps the mean,
    # so eq. 1 holds for a fixed k either way. Each request's last step is cut to the tokens it still
    # needed: long requests keep that under 0.1%.
    n, t = 400, 4000
    res = ad.simulate(np.full(n, a), np.full(n, t), TABLE, ad.Policy("fixed", k=k), seed=3, token_concentration=spread)
    per_step = res.tokens.sum() / res.steps.sum()
    assert per_step == pytest.approx(sp.speculative_tokens_per_step(a, k), rel=0.01)
    # and a biased engine (acceptance 0.02 lower) would be caught at this size
    assert abs(sp.speculative_tokens_per_step(a - 0.02, k) / sp.speculative_tokens_per_step(a, k) - 1) > 0.015


def test_estimator_counts_trials_not_drafts():
    # the posterior mean with a vanishing prior converges to the true acceptance; accepted / drafted
    # (drafts after a rejection counted as failures) is biased low
    n = 3000
    res = ad.simulate(np.full(n, 0.7), np.full(n, 200), TABLE, ad.Policy("fixed", k=6), seed=4)
    est = ad.estimate_acceptance(res.accepted.sum(), res.trials.sum(), 0.5, 1e-9)
    assert est == pytest.approx(0.7, abs=0.005)
    assert res.accepted.sum() / res.drafted.sum() < 0.6


def test_batch_one_time_is_the_sum_of_own_steps():
    acc = np.array([0.9, 0.5, 0.7])
    res = ad.simulate(acc, np.array([50, 50, 50]), TABLE, ad.Policy("fixed", k=4), seed=1)
    assert np.allclose(res.decode_s, res.steps * TABLE.step_s(1, 4))
    assert math.isclose(res.elapsed_s, res.decode_s.sum())


def test_padded_batch_step_costs_the_longest_draft():
    acc = np.array([0.95] * 4 + [0.3] * 4)
    pol = ad.Policy("oracle", k_min=0)
    res = ad.simulate(acc, np.full(8, 100), TABLE, pol, batch=8, seed=2)
    for kmax, size, dur in zip(res.step_k, res.step_batch, res.step_s, strict=True):
        assert math.isclose(dur, TABLE.step_s(size, kmax), rel_tol=1e-12)
    rag = ad.simulate(acc, np.full(8, 100), TABLE, pol, batch=8, seed=2, verify="ragged")
    assert rag.elapsed_s < res.elapsed_s


def test_best_k_minimizes_time_per_token():
    for a in (0.3, 0.6, 0.85, 0.95):
        k = ad.best_draft_tokens_for(TABLE, a, 1)
        want = min(range(13), key=lambda j: (TABLE.step_s(1, j) / sp.speculative_tokens_per_step(a, j), j))
        assert k == want
        # the same as lib.decoding.speculative.best_draft_tokens (most tokens per second)
        assert k == sp.best_draft_tokens(TARGET, DRAFTER, a, 1, 1024).draft_tokens


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([1, 8, 32, 128]), st.integers(1, 12))
def test_breakeven_acceptance_equalizes_time_per_token(batch, k):
    a = ad.breakeven_acceptance(TABLE, batch, k)
    if math.isinf(a):
        assert TABLE.step_s(batch, k) / (k + 1) > TABLE.plain(batch)
    elif a > 0:
        assert math.isclose(TABLE.step_s(batch, k) / sp.speculative_tokens_per_step(a, k), TABLE.plain(batch),
                            rel_tol=1e-7)


def test_confidence_policy_edges():
    p = np.array([[0.9, 0.9, 0.2, 0.9], [0.1, 0.9, 0.9, 0.9]])
    est = np.array([0.5, 0.5])
    assert ad.Policy("confidence", threshold=0.5, k_min=0, k_max=4).draft_tokens(TABLE, 1, est, est, p).tolist() == [2, 0]
    assert ad.Policy("confidence", threshold=0.0, k_min=0, k_max=4).draft_tokens(TABLE, 1, est, est, p).tolist() == [4, 4]
    assert ad.Policy("confidence", threshold=1.0, k_min=1, k_max=4).draft_tokens(TABLE, 1, est, est, p).tolist() == [1, 1]


def test_token_probabilities_keep_the_mean():
    rng = np.random.default_rng(0)
    p = ad.token_probabilities(rng, np.full(20000, 0.8), 4, 3.0)
    assert p.mean() == pytest.approx(0.8, abs=0.005) and p.std() > 0.1


def test_draw_requests_shares_and_means():
    pops = [ad.Population("code", 0.85, 10, 0.25, 64), ad.Population("chat", 0.5, 10, 0.75, 32)]
    acc, tok, which = ad.draw_requests(pops, 20000, seed=1)
    assert (which == 0).mean() == pytest.approx(0.25, abs=0.01)
    assert acc[which == 0].mean() == pytest.approx(0.85, abs=0.005)
    assert set(tok[which == 1]) == {32}


def test_refusals():
    with pytest.raises(ValueError, match="policy kind"):
        ad.Policy("greedy")
    with pytest.raises(ValueError, match="mean_acceptance"):
        ad.Population("x", 1.0, 10, 1, 10)
    with pytest.raises(ValueError, match="verify"):
        ad.simulate(np.array([0.5]), np.array([5]), TABLE, ad.Policy("fixed"), verify="max")
    with pytest.raises(ValueError, match="acceptance"):
        ad.simulate(np.array([1.5]), np.array([5]), TABLE, ad.Policy("fixed"))


# ---- the load side (I080) ------------------------------------------------------------------------


def test_weighted_quantile_against_repetition():
    rng = np.random.default_rng(0)
    v = rng.random(50)
    w = rng.integers(1, 6, 50)
    rep = np.repeat(v, w)
    for q in (0.1, 0.5, 0.9, 0.99):
        # the inverse CDF of the repeated sample: the ceil(q n)-th smallest
        want = np.sort(rep)[max(int(np.ceil(q * rep.size)) - 1, 0)]
        assert ad.weighted_quantile(v, w.astype(float), q) == want


def test_tpot_draws_match_the_engine():
    # the renewal central limit theorem against the step simulation: mean within 1.5%, spread and p99 within 5%
    for a, k in ((0.3, 3), (0.8, 4)):
        acc = np.full(3000, a)
        res = ad.simulate(acc, np.full(3000, 128), TABLE, ad.Policy("fixed", k=k), seed=1)
        sim = res.decode_s / res.tokens
        draw = ad.tpot_draws(TABLE, 1, k, acc, 128, seed=2)
        assert draw.mean() == pytest.approx(sim.mean(), rel=0.015)
        assert draw.std() == pytest.approx(sim.std(), rel=0.05)
        assert np.quantile(draw, 0.99) == pytest.approx(np.quantile(sim, 0.99), rel=0.05)


def test_until_done_keeps_the_batch_full():
    acc = np.full(200, 0.6)
    res = ad.simulate(acc, np.full(200, 40), TABLE, ad.Policy("fixed", k=2), batch=8, seed=3, until_done=16)
    assert res.done[:16].all()
    assert (res.step_batch == 8).all()


def test_breakeven_policy_and_guard():
    est = np.array([0.1, 0.9])
    pol = ad.Policy("per_load", prior_mean=0.7, off_breakeven=True)
    k = pol.draft_tokens(TABLE, 128, est, est)
    assert k[0] == 0 and k[1] > 0
    g = ad.Policy("guard").draft_tokens(TABLE, 128, est, est)
    assert (g == ad.best_draft_tokens_for(TABLE, 0.1, 128)).all()
    tab = ad.Policy("per_load", k_by_batch=((8, 4), (64, 2), (128, 0)))
    assert tab.draft_tokens(TABLE, 100, est, est).tolist() == [2, 2]
    assert tab.draft_tokens(TABLE, 4, est, est).tolist() == [4, 4]
    with pytest.raises(ValueError, match="pairs"):
        ad.Policy("per_load", k_by_batch=((8,),))


def test_simulate_load_weights_and_plain_step():
    pops = [ad.Population("code", 0.9, 10, 0.5, 48), ad.Population("chat", 0.5, 10, 0.5, 48)]
    r = ad.simulate_load(pops, TABLE, ad.Policy("fixed", k=0), (8, 64), (0.7, 0.3), per_level=1, seed=1)
    assert math.isclose(r.weight.sum(), 1.0)
    # plain decoding: every request's time per token is its level's plain step
    for b in (8, 64):
        assert np.allclose(r.per_token_s[r.batch == b], TABLE.plain(b))
    # level shares of requests: share x B / plain step, normalized
    want = np.array([0.7 * 8 / TABLE.plain(8), 0.3 * 64 / TABLE.plain(64)])
    got = np.array([r.weight[r.batch == b].sum() for b in (8, 64)])
    assert np.allclose(got, want / want.sum())
