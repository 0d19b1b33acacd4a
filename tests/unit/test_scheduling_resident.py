"""Little's law as a fixed point (lib.scheduling.resident): a closed-form oracle on a linear step,
the request-alone time against the simulator exactly, the mean-value model against simulated
runs, monotonicity and the unstable side."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lib.perf.deployment import Deployment
from lib.scheduling import LinearCost, Policy, Request, Workload, simulate, step_cost
from lib.scheduling.resident import (
    critical_rate,
    mean_decode_context,
    rate_for_resident,
    resident_sequences,
    resident_time_s,
    time_average,
)

DEP = Deployment("llama-3.1-8b", "h100-sxm")


def _linear_fixed_point(a, b, lam, o):
    """N = lam [O a + (O - 1) b + O b N] for step = a + b D (prefill tokens free): see the test."""
    return lam * (o * a + (o - 1) * b) / (1 - lam * o * b)


@settings(max_examples=40, deadline=None)
@given(a=st.floats(1e-3, 0.05), b=st.floats(1e-5, 1e-3), o=st.integers(2, 400), frac=st.floats(0.05, 0.9))
def test_linear_step_has_a_closed_form(a, b, o, frac):
    # step = a + b D: own prefill a + b N, others' prefill and decode steps a + b (N + 1), one step
    # each; r = 1 / (a + b (N + 1)), so W = a + b N + (O - 1)(a + b (N + 1)) and N = lam W is linear.
    cost = LinearCost(fixed_s=a, per_seq_s=b, max_running=100_000, token_budget=200_000)
    lam = frac / (o * b) * 0.5
    want = _linear_fixed_point(a, b, lam, o)
    assume(want + 1 < 100_000 and lam * (a + b * (want + 2)) < 1)  # below the cap; prefills leave time
    got = resident_sequences(cost, lam, 100, o)
    assert got.stable
    assert got.resident == pytest.approx(want, rel=1e-8)
    assert got.sojourn_s == pytest.approx(want / lam, rel=1e-8)
    assert got.naive_sojourn_s == pytest.approx(a + (o - 1) * (a + b), rel=1e-12)


def test_critical_rate_of_a_linear_step_is_where_the_batch_reaches_the_cap():
    a, b, o, cap = 0.01, 2e-4, 100, 64
    cost = LinearCost(fixed_s=a, per_seq_s=b, max_running=cap, token_budget=8192)
    # the largest fixed point allowed is N = cap - 1 (the batch N + 1 = cap)
    want = (cap - 1) / (o * a + (o - 1) * b + (cap - 1) * o * b)
    assert critical_rate(cost, 100, o, rel_tol=1e-7) == pytest.approx(want, rel=1e-5)
    assert resident_sequences(cost, want * 0.999, 100, o).stable
    bad = resident_sequences(cost, want * 1.01, 100, o)
    assert not bad.stable and math.isinf(bad.resident) and "max_running" in bad.why


def test_request_alone_is_the_simulated_single_request():
    cost = step_cost(DEP)
    for p, o in ((1000, 300), (3 * DEP.max_num_batched_tokens + 17, 40)):
        state = resident_sequences(cost, 1.0, p, o)
        res = simulate([Request(0, 0.0, p, o)], Policy(), cost)
        r = res.requests[0]
        assert r.ttft_s == pytest.approx(state.alone_ttft_s, rel=1e-12)
        # decode cost is linear in the context, so the mean context P + O / 2 is exact
        assert r.e2e_s == pytest.approx(state.naive_sojourn_s, rel=1e-9)


def test_trace_climbs_from_the_naive_answer_to_the_fixed_point():
    state = resident_sequences(step_cost(DEP), 10.0, 1000, 300, trace_steps=8)
    ns = [n for n, _ in state.trace]
    assert ns[0] == pytest.approx(state.naive_resident)
    assert all(b > a for a, b in zip(ns, ns[1:], strict=False))
    assert ns[-1] < state.resident
    assert state.trace[-1][1] * 10.0 == pytest.approx(state.resident, rel=0.01)
    # the fixed point's residual
    w = resident_time_s(step_cost(DEP), 10.0, 1000, 300, state.resident)
    assert 10.0 * w == pytest.approx(state.resident, rel=1e-8)


@settings(max_examples=25, deadline=None)
@given(r1=st.floats(0.1, 15), r2=st.floats(0.1, 15), p=st.integers(50, 4000), o=st.integers(2, 600))
def test_more_load_means_more_resident_sequences(r1, r2, p, o):
    cost = step_cost(DEP)
    lo, hi = sorted((r1, r2))
    a, b = resident_sequences(cost, lo, p, o), resident_sequences(cost, hi, p, o)
    if b.stable:
        assert a.stable and a.resident <= b.resident * (1 + 1e-9)
        assert a.tpot_s <= b.tpot_s * (1 + 1e-9)
    assert a.naive_resident <= b.naive_resident


@pytest.mark.parametrize(("rate", "tol"), [(2.0, 0.03), (10.0, 0.05)])
def test_mean_value_model_against_the_simulator(rate, tol):
    cost = step_cost(DEP)
    n = 3000
    res = simulate(Workload(prompt=1000, output=300, rate=rate, n_requests=n), Policy(), cost, seed=1)
    arrivals = np.array([r.arrival_s for r in res.requests])
    sim = time_average(res, "running", arrivals[n // 5], arrivals[9 * n // 10])
    model = resident_sequences(cost, rate, 1000, 300).resident
    assert model == pytest.approx(sim, rel=tol)
    assert model < sim  # the mean-value model ignores fluctuations: it runs low, never high


@pytest.mark.parametrize(("dep", "rate", "p", "o", "seed"), [
    (Deployment("llama-3.1-70b", "h100-sxm", tp=4), 6.0, 1000, 300, 0),
    (Deployment("llama-3.1-70b", "h100-sxm", tp=4), 6.0, 1000, 300, 3),
    (Deployment("mixtral-8x7b", "mi300x", weight_dtype="fp8", kv_dtype="fp8"), 5.0, 2000, 500, 3),
    (Deployment("llama-3.1-8b", "l4"), 1.0, 512, 256, 0),
    (Deployment("llama-3.1-70b", "h200", tp=2, weight_dtype="fp8", kv_dtype="fp8"), 2.0, 1000, 400, 11),
])
def test_within_seven_percent_while_prefills_take_under_half_the_time(dep, rate, p, o, seed):
    # the domain the I021 notebook answers for: prefill busy <= 0.5 and the pool under 80% full
    cost = step_cost(dep)
    state = resident_sequences(cost, rate, p, o)
    assert state.prefill_busy <= 0.5
    n = 2000
    res = simulate(Workload(prompt=p, output=o, rate=rate, n_requests=n), Policy(), cost, seed=seed)
    arrivals = np.array([r.arrival_s for r in res.requests])
    sim = time_average(res, "running", arrivals[n // 5], arrivals[9 * n // 10])
    assert state.resident == pytest.approx(sim, rel=0.07)


def test_unstable_rate_says_why():
    cost = step_cost(DEP)
    crit = critical_rate(cost, 1000, 300)
    assert resident_sequences(cost, 0.98 * crit, 1000, 300).stable
    bad = resident_sequences(cost, 1.05 * crit, 1000, 300)
    assert not bad.stable and bad.why and math.isinf(bad.resident)
    assert bad.naive_resident > 0  # the naive answer still exists: that is the trap


def test_time_average_counts_idle_time_as_zero():
    cost = LinearCost(fixed_s=0.1)
    res = simulate([Request(0, 0.0, 10, 5), Request(1, 2.0, 10, 5)], Policy(), cost)
    # each request runs 5 steps of 0.1 s with running = 1: 1 s busy in a 4 s window
    assert time_average(res, "running", 0.0, 4.0) == pytest.approx(0.25, rel=1e-12)
    assert time_average(res, "running", 0.0, 0.25) == pytest.approx(1.0, rel=1e-12)
    assert time_average(res, 2 * res.timeline.running, 0.0, 4.0) == pytest.approx(0.5, rel=1e-12)
    with pytest.raises(ValueError, match="one value per step"):
        time_average(res, [1.0, 2.0], 0.0, 4.0)


def test_inputs_are_validated():
    cost = step_cost(DEP)
    with pytest.raises(ValueError, match="arrival_rate"):
        resident_sequences(cost, 0, 100, 10)
    with pytest.raises(ValueError, match="prompt_len"):
        resident_sequences(cost, 1.0, 0, 10)
    with pytest.raises(ValueError, match="output_len"):
        resident_sequences(cost, 1.0, 10, 1.5)
    with pytest.raises(ValueError, match="cost"):
        resident_sequences(object(), 1.0, 10, 10)
    with pytest.raises(ValueError, match="field"):
        time_average(simulate([Request(0, 0.0, 10, 2)], Policy(), cost), "chunks", 0, 1)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 5000), outs=st.lists(st.integers(2, 3000), min_size=1, max_size=50))
def test_mean_decode_context_is_the_step_average_of_the_contexts(p, outs):
    # brute force: every decode step of every request (contexts P + 1 .. P + O - 1), averaged
    contexts = [p + g for o in outs for g in range(1, o)]
    o = np.asarray(outs, dtype=float)
    got = mean_decode_context(p, o.mean(), (o * o).mean())
    assert got == pytest.approx(np.mean(contexts), rel=1e-9)


def test_mean_decode_context_constant_and_geometric():
    from lib.scheduling import Constant, Geometric

    for dist, want in ((Constant(300), 1000 + 150), (Geometric(300), 1000 + 300)):
        assert mean_decode_context(1000, dist.mean, dist.second_moment) == pytest.approx(want, rel=1e-12)


def test_rate_for_resident_inverts_the_fixed_point():
    cost = step_cost(DEP)
    for target in (5.0, 40.0, 150.0):
        lam = rate_for_resident(cost, target, 1000, 300)
        assert resident_sequences(cost, lam, 1000, 300).resident == pytest.approx(target, rel=1e-4)
    assert math.isinf(rate_for_resident(cost, 5000.0, 1000, 300))  # past the cap: saturates first


def test_explorer_presets_are_labelled_by_their_deployment():
    from lib.explorers.scheduling_queue import DEPLOYMENTS, deployment

    for label in DEPLOYMENTS:
        assert deployment(label).label == label
    with pytest.raises(ValueError, match="deployment"):
        deployment("no such replica")
