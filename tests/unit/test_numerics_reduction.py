"""lib.numerics.formats.bf16_round against torch, and lib.numerics.reduction: two reduction orders differ in
the last bits, and the greedy token flips only at near-ties."""

import numpy as np
import pytest

from lib.numerics import reduction as R
from lib.numerics.formats import bf16_round


def test_bf16_round_against_torch_and_ties_to_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -3.14159, 1e-3, 65504.0], np.float32)
    want = np.array([1.0, 1.0, 1.015625], np.float32)  # 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 ties up to 1 + 2^-6
    assert bf16_round(x[:3]).tolist() == want.tolist()
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    y = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-5, 5, 10_000)).astype(np.float32)
    y = np.concatenate([x, y])
    assert (bf16_round(y) == torch.from_numpy(y).to(torch.bfloat16).float().numpy()).all()


def test_argmax_flips_happen_only_at_near_ties():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((200, 64)).astype(np.float32)
    w = rng.standard_normal((64, 50)).astype(np.float32)
    r = R.argmax_flips(h, w, 4, output_bf16=False)
    assert r["differ_share"] > 0.5  # the orders differ in the last bits almost everywhere
    logits = h.astype(np.float64) @ w.astype(np.float64)
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert (top2[r["flips"], 1] - top2[r["flips"], 0] < 1e-4).all()


def test_near_tie_problem_pairs_twin_tokens():
    x, w1, w2 = R.near_tie_problem(50, 16, 8, 1e-3, 4.0, 0)
    logits = (x @ w1).astype(np.float64) @ w2.astype(np.float64)
    twin_gap = np.abs(logits[:, 1::2] - logits[:, 0::2])
    assert twin_gap.max() < 0.01 and x.dtype == np.float32


def test_a_split_outside_the_inner_dimension_is_refused():
    with pytest.raises(ValueError, match="split"):
        R.argmax_flips(np.ones((2, 4)), np.ones((4, 3)), 9)


# ---- batch invariance: split sums, logits in two orders, flip rate vs gap, divergence, kernel choice ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _per_term_loop(h, w, split):
    """The oracle: one float32 accumulator per piece, one product and one add per term, written out."""
    pieces = np.array_split(np.arange(h.shape[1]), split)
    total = None
    for idx in pieces:
        acc = np.zeros((h.shape[0], w.shape[1]), np.float32)
        for r in range(h.shape[0]):
            for c in range(w.shape[1]):
                s = np.float32(0.0)
                for i in idx:
                    s = np.float32(s + np.float32(h[r, i] * w[i, c]))
                acc[r, c] = s
        total = acc if total is None else (total + acc).astype(np.float32)
    return total


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 10_000))
def test_split_sum_matches_the_per_term_loop(split, d_extra, seed):
    rng = np.random.default_rng(seed)
    d = split + d_extra
    h = rng.standard_normal((5, d)).astype(np.float32)
    w = rng.standard_normal((d, 7)).astype(np.float32)
    bits = R.split_sum(h, w, split).view(np.uint32)
    assert np.array_equal(bits, _per_term_loop(h, w, split).view(np.uint32))
    if d >= 2:  # sum_two_orders is split_sum twice: (one accumulator, the split)
        one, parts = R.sum_two_orders(h, w, max(split, 2))
        assert np.array_equal(one.view(np.uint32), _per_term_loop(h, w, 1).view(np.uint32))
        assert np.array_equal(parts.view(np.uint32), _per_term_loop(h, w, max(split, 2)).view(np.uint32))
    exact = h.astype(np.float64) @ w.astype(np.float64)
    assert np.allclose(R.split_sum(h, w, split), exact, rtol=1e-4, atol=1e-4)


def test_split_sum_matches_torch_float32_accumulation_order():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    h = rng.standard_normal((3, 40)).astype(np.float32)
    w = rng.standard_normal((40, 4)).astype(np.float32)
    want = torch.zeros(3, 4)
    for i in range(40):  # one accumulator, one float32 rounding per term
        want += torch.from_numpy(h[:, i:i + 1] * w[i])
    assert np.array_equal(R.split_sum(h, w, 1), want.numpy())


def test_two_orders_move_logits_and_flip_only_below_the_swing():
    a, b = R.logits_two_orders(5, 1, layers=4, rows=200, d=32, seed=3)
    assert (a != b).any() and np.abs(a.astype(np.float64) - b).max() < 0.5
    gaps = np.array([0.0, 1e-6, 1e-3, 1.0])
    f = R.flip_rate_vs_gap(a, b, gaps)
    assert np.all(np.diff(f) <= 0) and f[-1] == 0.0  # monotone in the gap, none at a large gap
    same = R.flip_rate_vs_gap(a, a, gaps)
    assert (same == 0).all()  # one order: no flips at any gap
    a2, _ = R.logits_two_orders(5, 1, layers=4, rows=200, d=32, seed=3)
    assert np.array_equal(a, a2)  # deterministic for one shape


def test_planted_gap_flips_agree_with_argmax():
    a, b = R.logits_two_orders(7, 2, layers=8, rows=300, d=32, seed=1)
    lo, hi = a.astype(np.float64), b.astype(np.float64)
    r = np.arange(lo.shape[0])
    order = np.argsort(-lo, axis=1, kind="stable")
    for g in (1e-6, 1e-4, 1e-2):
        bias = np.zeros_like(lo)
        bias[r, order[:, 1]] = (lo[r, order[:, 0]] - g) - lo[r, order[:, 1]]
        direct = np.mean((lo + bias).argmax(1) != (hi + bias).argmax(1))
        assert abs(direct - R.flip_rate_vs_gap(a, b, [g])[0]) <= 1 / 300


def test_stack_two_orders_gives_the_logits_of_layered_logits():
    s = R.stack_two_orders(5, 1, layers=4, rows=200, d=32, seed=3)
    a, b = R.logits_two_orders(5, 1, layers=4, rows=200, d=32, seed=3)
    la, lb = s.logits()
    assert np.array_equal(a, la) and np.array_equal(b, lb)
    assert s.head_std == pytest.approx(4.0 / np.sqrt(32))


def test_flip_rate_closed_form_matches_counts_over_many_heads():
    """The closed form's claim is an expectation over the head's random columns given the hidden states:
    redraw the head many times, count the flips each time, and compare the total with the summed
    expectations (Poisson-binomial spread; a closed form that dropped the selection term or the
    orthogonal projection would be off by many standard deviations here)."""
    base = R.stack_two_orders(5, 3, layers=32, rows=1500, d=64, seed=0)
    assert np.any(base.hidden_a != base.hidden_b)  # some rows carry a bf16 flip to the end
    rng = np.random.default_rng(11)
    got = want = var = 0.0
    for _ in range(25):
        head = (rng.standard_normal(base.head.shape) * base.head_std).astype(np.float32)
        s = R.TwoOrderStack(base.hidden_a, base.hidden_b, head, base.head_std, 5, 3)
        a, b = s.logits()
        rate, sd = R.flip_rate_expected(s, [1e-3, 1e-2])
        got += R.flip_rate_vs_gap(a, b, [1e-3, 1e-2]) * 1500
        want += rate * 1500
        var += sd ** 2
    assert np.all(want > 20)  # enough flips expected for the test to have power
    assert np.all(np.abs(got - want) <= 4 * np.sqrt(var)), (got, want, np.sqrt(var))


def test_flip_rate_closed_form_without_an_upstream_change_is_the_rounding_indicator():
    s = R.stack_two_orders(5, 1, layers=4, rows=200, d=32, seed=3)
    same = R.TwoOrderStack(s.hidden_a, s.hidden_a, s.head, s.head_std, 5, 1)
    a, b = same.logits()
    gaps = [0.0, 1e-7, 1e-6, 1e-3]
    rate, sd = R.flip_rate_expected(same, gaps)
    assert np.array_equal(rate, R.flip_rate_vs_gap(a, b, gaps)) and np.all(sd == 0)
    with pytest.raises(ValueError, match="gaps"):
        R.flip_rate_expected(s, [-1e-3])
    with pytest.raises(ValueError, match="TwoOrderStack"):
        R.flip_rate_expected((a, b), [1e-3])


@given(st.floats(0, 0.5), st.integers(0, 10**6))
def test_divergence_probability_closed_form(p, n):
    got = R.divergence_probability(p, n)
    assert 0 <= got <= 1
    assert abs(got - (1 - (1 - p) ** n)) < 1e-9
    if 0 < p < 1 and 0 < got < 1 - 1e-9:
        assert abs(R.divergence_probability(p, R.tokens_to_divergence(p, got)) - got) < 1e-6


def test_divergence_refuses_bad_inputs():
    with pytest.raises(ValueError, match="p_token"):
        R.divergence_probability(1.5, 10)
    with pytest.raises(ValueError, match="tokens"):
        R.divergence_probability(0.1, -1)
    assert R.tokens_to_divergence(0.0) == float("inf")


def test_kernel_choice_changes_split_with_the_batch_and_fixed_config_costs():
    from lib.kernels import gemm_waves as gw

    n, k = gw.projection_nk("llama-3.1-70b", "qkv_proj", 8)
    c = R.batch_invariant_cost(n, k, "h100-sxm", [1, 64, 512, 4096])
    assert c.orders >= 2  # the narrow TP-8 shard splits K at small batch, not at large
    assert (c.ratio >= 1 - 1e-12).all() and c.ratio[0] > 1.5
    one = R.kernel_choice(1, n, k, "h100-sxm")
    brute = min((gw.split_leftover(1, n, k, "h100-sxm", t, splits=s).time_s, t, s) for t in gw.TILE_SHAPES
                for s in range(1, gw.split_leftover(1, n, k, "h100-sxm", t).max_splits + 1))
    assert one.time_s == brute[0] and one.splits == brute[2]
    with pytest.raises(ValueError, match="batches"):
        R.batch_invariant_cost(n, k, "h100-sxm", [])
