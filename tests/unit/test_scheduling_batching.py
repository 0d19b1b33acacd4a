"""Batching closed forms: E[max of B output lengths] against exact enumeration, brute-force sums,
the exponential's harmonic number and seeded Monte Carlo; the survival functions against the
samplers; free prefill tokens against the step cost; and the simulator's static batch against
the closed form."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import Deployment
from lib.scheduling import (
    Bimodal,
    Constant,
    Empirical,
    Geometric,
    LinearCost,
    LogNormal,
    Policy,
    Uniform,
    Workload,
    simulate,
    step_cost,
    trace,
)
from lib.scheduling.batching import (
    continuous_gain,
    expected_max_length,
    free_prefill_tokens,
    length_mean,
    length_sf,
    prefill_tokens_within,
    static_slot_efficiency,
)

DEP = Deployment("llama-3.1-8b", "h100-sxm")
DISTS = [Constant(256), Uniform(1, 511), Geometric(256), LogNormal(180, 1.0), LogNormal(180, 2.0, cap=32768),
         Bimodal(Geometric(50), LogNormal(1000, 0.5), 0.2), Empirical((5, 10, 100, 1000))]


def exact_max_discrete(values, probs, batch):
    """E[max] of batch iid draws from a finite law, by enumerating every batch (exact fractions)."""
    total = Fraction(0)
    for combo in itertools.product(range(len(values)), repeat=batch):
        p = Fraction(1)
        for i in combo:
            p *= probs[i]
        total += p * max(values[i] for i in combo)
    return total


def test_constant_lengths_gain_nothing():
    for b in (1, 2, 32, 1024):
        assert expected_max_length(Constant(300), b) == 300
        assert continuous_gain(Constant(300), b) == 1.0
    assert continuous_gain(7, 16) == 1.0  # an int is a Constant


def test_empirical_and_uniform_against_enumeration():
    vals = (1, 3, 7)
    exact = exact_max_discrete(vals, [Fraction(1, 3)] * 3, 3)
    assert expected_max_length(Empirical(vals), 3) == pytest.approx(float(exact), rel=1e-12)
    exact_u = exact_max_discrete(list(range(2, 7)), [Fraction(1, 5)] * 5, 4)
    assert expected_max_length(Uniform(2, 6), 4) == pytest.approx(float(exact_u), rel=1e-12)
    # a repeated value weighs twice
    exact_w = exact_max_discrete((2, 9), [Fraction(2, 3), Fraction(1, 3)], 3)
    assert expected_max_length(Empirical((2, 2, 9)), 3) == pytest.approx(float(exact_w), rel=1e-12)


def test_bimodal_of_constants_against_enumeration():
    d = Bimodal(Constant(4), Constant(40), 0.25)
    exact = exact_max_discrete((4, 40), [Fraction(3, 4), Fraction(1, 4)], 5)
    assert expected_max_length(d, 5) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("mean,batch", [(30.0, 1), (30.0, 64), (1000.0, 8), (1000.0, 256), (5000.0, 32)])
def test_geometric_tail_against_a_brute_force_sum(mean, batch):
    """The log-grid tail against the term-by-term sum far into the tail."""
    q = 1 - 1 / mean
    k = np.arange(1, int(mean * 60), dtype=float)
    brute = 1 + float(np.sum(-np.expm1(batch * np.log1p(-q**k))))  # k = 0 adds 1
    assert expected_max_length(Geometric(mean), batch) == pytest.approx(brute, rel=1e-6)


def test_geometric_mean_and_the_harmonic_number():
    assert length_mean(Geometric(256)) == pytest.approx(256, rel=1e-9)
    # E[max of B geometric] = H_B / lambda + 1/2 + o(1), lambda = -ln(1 - p) (the exponential's H_B)
    for mean, b in ((256, 32), (2000, 128)):
        lam = -math.log1p(-1 / mean)
        h_b = sum(1 / i for i in range(1, b + 1))
        assert expected_max_length(Geometric(mean), b) == pytest.approx(h_b / lam + 0.5, rel=2e-3)


def test_lognormal_uncapped_mean_is_the_continuous_mean():
    d = LogNormal(200.0, 0.8)
    assert length_mean(d) == pytest.approx(d.mean, rel=2e-3)  # rounding moves it slightly


@pytest.mark.parametrize("dist", DISTS, ids=[repr(d)[:40] for d in DISTS])
def test_survival_function_matches_the_sampler(dist):
    rng = np.random.default_rng(7)
    x = dist.sample(rng, 200_000)
    ks = np.unique(np.quantile(x, [0.05, 0.25, 0.5, 0.75, 0.95, 0.99]).astype(int))
    for k in ks:
        emp = float(np.mean(x > k))
        se = math.sqrt(max(emp * (1 - emp), 1e-6) / len(x))
        assert abs(float(length_sf(dist, k)) - emp) <= 5 * se + 1e-9, (k, emp)


@pytest.mark.parametrize("dist", DISTS, ids=[repr(d)[:40] for d in DISTS])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_expected_max_against_monte_carlo(dist, batch):
    rng = np.random.default_rng(11 + batch)
    m = dist.sample(rng, batch * 40_000).reshape(-1, batch).max(axis=1)
    se = m.std() / math.sqrt(len(m))
    assert abs(expected_max_length(dist, batch) - m.mean()) <= 5 * se + 1e-9


@settings(max_examples=40, deadline=None)
@given(mean=st.floats(1.0, 5000.0), sigma=st.floats(0.0, 2.5), b=st.integers(1, 512))
def test_expected_max_is_monotone_and_bounded(mean, sigma, b):
    for d in (Geometric(mean), LogNormal(mean, sigma, cap=65536)):
        e1, eb, e2b = (expected_max_length(d, x) for x in (1, b, 2 * b))
        assert e1 <= eb * (1 + 1e-9) and eb <= e2b * (1 + 1e-9)
        assert 0 < static_slot_efficiency(d, b) <= 1 + 1e-9
        if isinstance(d, LogNormal):
            assert e2b <= 65536 * (1 + 1e-9)


def test_refusals():
    with pytest.raises(ValueError, match="batch"):
        expected_max_length(Geometric(10), 0)
    with pytest.raises(ValueError, match="length distribution"):
        expected_max_length("long", 4)
    with pytest.raises(ValueError, match="k must be"):
        length_sf(Geometric(10), -1)
    with pytest.raises(ValueError, match="sums at most"):
        expected_max_length(Constant(1 << 25), 2)


def test_simulated_static_batch_matches_the_closed_form():
    """Decode-only cost (a step costs the same with padding), saturated: static runs max(L) steps
    per batch, continuous sum(L) / B steps plus a drain shorter than the longest request, and
    their ratio is E[max]/E[L]."""
    b, n, dt = 16, 16 * 300, 0.01
    cost = LinearCost(fixed_s=dt, max_running=b, token_budget=1 << 16)
    wl = Workload(prompt=1, output=Geometric(100), arrival="burst", rate=None, n_requests=n)
    static = simulate(wl, Policy(batching="static", max_running=b), cost, seed=3, kv_blocks=1 << 16)
    cont = simulate(wl, Policy(max_running=b), cost, seed=3, kv_blocks=1 << 16)
    outs = np.array([r.output_len for r in static.requests])
    # static: each batch of b (arrival order) runs 1 prefill step + (max - 1) decode steps
    assert static.end_s == pytest.approx(sum(outs[i:i + b].max() for i in range(0, n, b)) * dt, rel=1e-9)
    assert outs.sum() / b * dt * (1 - 1e-9) <= cont.end_s <= (outs.sum() / b + outs.max()) * dt
    assert static.end_s / cont.end_s == pytest.approx(continuous_gain(Geometric(100), b), rel=0.04)


def test_static_batch_is_not_cut_by_the_token_budget():
    """A static batch admits all its members over several prefill steps before it decodes."""
    cost = LinearCost(fixed_s=0.1, max_running=4, token_budget=20)
    reqs = trace([(0.0, 10, 3)] * 4)
    res = simulate(reqs, Policy(batching="static"), cost, kv_blocks=64)
    assert [r.first_scheduled_s for r in res.requests] == pytest.approx([0.0, 0.0, 0.1, 0.1])
    tl = res.timeline
    assert list(tl.prefill_tokens[:2]) == [20, 20] and tl.decode_tokens[1] == 0
    assert list(tl.decode_tokens[2:]) == [4, 4]  # one batch of 4 decodes together
    assert [r.finish_s for r in res.requests] == pytest.approx([0.4] * 4)


def test_free_prefill_tokens_is_the_kink_of_the_step():
    cost = step_cost(DEP)
    for d, ctx in ((1, 0), (32, 32 * 1024), (256, 256 * 512)):
        t = free_prefill_tokens(cost, d, ctx)
        alone = cost.step_s(d, ctx)
        assert t > 0
        assert cost.step_s(d, ctx, [(t, 0)]) <= alone * (1 + 1e-12)
        assert cost.step_s(d, ctx, [(t + 1, 0)]) > alone
    # deeper in a prompt a chunk does more attention work: fewer tokens ride free
    assert free_prefill_tokens(cost, 32, 32 * 1024, position=16384) < free_prefill_tokens(cost, 32, 32 * 1024)
    # a linear cost charges every prefill token
    assert free_prefill_tokens(LinearCost(fixed_s=0.01, per_prefill_token_s=1e-6), 8) == 0


def test_prefill_tokens_within_a_step_target():
    cost = step_cost(DEP)
    target = 0.05
    t = prefill_tokens_within(cost, 32, 32 * 1024, target)
    assert cost.step_s(32, 32 * 1024, [(t, 0)]) <= target < cost.step_s(32, 32 * 1024, [(t + 1, 0)])
    assert t >= free_prefill_tokens(cost, 32, 32 * 1024)
    with pytest.raises(ValueError, match="no chunk fits"):
        prefill_tokens_within(cost, 32, 32 * 1024, 1e-4)
    with pytest.raises(ValueError, match="cost must offer step_s"):
        free_prefill_tokens(object(), 4)


def test_saturated_tokens_per_s_counts_the_window_only():
    """Equal step cost, burst: continuous keeps b slots busy until the queue empties, so the window
    rate is b tokens per step (plus nothing else); the drain after it is excluded."""
    from lib.scheduling.batching import saturated_tokens_per_s

    b, dt = 8, 0.01
    cost = LinearCost(fixed_s=dt, max_running=b, token_budget=1 << 12)
    res = simulate(trace([(0.0, 1, 20)] * (4 * b) + [(0.0, 1, 20 * (i + 2)) for i in range(b)]), Policy(max_running=b), cost,
                   kv_blocks=1 << 12)
    assert saturated_tokens_per_s(res) == pytest.approx(b / dt, rel=1e-9)
    whole = sum(r.output_len for r in res.requests) / res.end_s
    assert whole < saturated_tokens_per_s(res)  # the drain of the ragged last batch lowers the whole-run rate
    with pytest.raises(ValueError, match="never had requests waiting"):
        saturated_tokens_per_s(simulate(trace([(0.0, 1, 5)]), Policy(), cost, kv_blocks=64))


def test_doubling_batch_is_where_fixed_equals_per_sequence_cost():
    from lib.perf import throughput as tput
    from lib.scheduling.batching import batch_where_doubling_gains

    for dep in (DEP, Deployment("llama-3.1-70b", "h100-sxm", tp=8)):
        b = batch_where_doubling_gains(dep, 1024)
        x = lambda n, dep=dep: tput.tokens_per_s(dep, n, 1024)  # noqa: E731
        assert x(2 * b) / x(b) <= 4 / 3 < x(2 * (b - 1)) / x(b - 1)
        # the step is near-linear there: t(2B) / t(B) = 3/2 within the table's kinks
        assert tput.step_s(dep, 2 * b, 1024) / tput.step_s(dep, b, 1024) == pytest.approx(1.5, rel=0.01)
    with pytest.raises(ValueError, match="ratio"):
        batch_where_doubling_gains(DEP, 1024, ratio=2.5)


def test_closed_loop_goodput_counts_requests_within_the_slo():
    from lib.scheduling import SLO
    from lib.scheduling.batching import closed_loop_goodput, saturated_tokens_per_s

    b, dt = 4, 0.01
    cost = LinearCost(fixed_s=dt, max_running=b, token_budget=1 << 12)
    res = simulate(trace([(0.0, 1, 11)] * (6 * b)), Policy(max_running=b), cost, kv_blocks=1 << 12)
    # every request: first token in its admission step, then 10 more at one per step: TPOT = dt exactly
    eps = 1 + 1e-9  # rounding of the step sums
    assert closed_loop_goodput(res, SLO(ttft_s=dt * eps, tpot_s=dt * eps)) == pytest.approx(
        (saturated_tokens_per_s(res), 1.0))
    assert closed_loop_goodput(res, SLO(ttft_s=dt, tpot_s=0.9 * dt)) == (0.0, 0.0)  # one step time fails them all
    assert closed_loop_goodput(res, SLO(ttft_s=0.5 * dt, tpot_s=dt * eps))[0] == 0.0
    with pytest.raises(ValueError, match="slo must be"):
        closed_loop_goodput(res, (1.0, 1.0))


def test_resident_kv_tokens_is_the_length_biased_mean():
    from lib.scheduling.batching import resident_kv_tokens

    # equal lengths L: P + (L + 1) / 2 exactly
    assert resident_kv_tokens(100, Constant(51)) == pytest.approx(126.0, rel=1e-12)
    # a finite law by enumeration: sum over sequences of sum_g (P + g) over sum of L
    vals = (2, 10, 30)
    want = sum(sum(7 + g for g in range(1, v + 1)) for v in vals) / sum(vals)
    assert resident_kv_tokens(7, Empirical(vals)) == pytest.approx(want, rel=1e-12)
    # against the drawn lengths of a heavy tail (the unbounded tail's integral included)
    rng = np.random.default_rng(3)
    for d in (Geometric(300), LogNormal(500, 1.2), LogNormal(500, 1.2, cap=4000)):
        x = d.sample(rng, 400_000).astype(float)
        assert resident_kv_tokens(64, d) == pytest.approx(64 + (x * (x + 1) / 2).sum() / x.sum(), rel=0.02)
    assert resident_kv_tokens(0, Geometric(300)) > length_mean(Geometric(300)) / 2  # length-biased
