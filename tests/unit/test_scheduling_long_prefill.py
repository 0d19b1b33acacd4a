"""One long prompt against running decodes (lib.scheduling.long_prefill): the chunk plan, its step
times against a closed form (LinearCost) and against the simulator (StepCost), the budget window
against a brute-force reading of its definition, and the damage measured on simulated runs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time
from lib.scheduling import LinearCost, Policy, simulate, step_cost, trace
from lib.scheduling.long_prefill import (
    budget_window,
    chunk_plan,
    default_granularity,
    prefill_damage,
    prefill_steps,
)

DEP = Deployment("llama-3.1-8b", "h100-sxm")
LIN = LinearCost(fixed_s=0.01, per_seq_s=1e-4, per_context_token_s=1e-7, per_prefill_token_s=5e-5)


@settings(max_examples=200, deadline=None)
@given(P=st.integers(1, 50_000), D=st.integers(0, 300), extra=st.integers(1, 20_000),
       cap=st.none() | st.integers(1, 10_000))
def test_chunk_plan_covers_the_prompt_in_order(P, D, extra, cap):
    B = D + extra
    plan = chunk_plan(P, B, D, cap)
    assert sum(c for c, _ in plan) == P
    pos = 0
    for c, p in plan:
        assert p == pos and 1 <= c <= min(B - D, cap or B)
        pos += c
    assert all(c == plan[0][0] for c, _ in plan[:-1])  # every chunk but the last is full
    assert len(plan) == math.ceil(P / min(B - D, cap or B))


def test_chunk_plan_refuses_a_budget_the_decodes_fill():
    with pytest.raises(ValueError, match="budget"):
        chunk_plan(1000, 32, 32)
    with pytest.raises(ValueError, match="cap"):
        chunk_plan(1000, 64, 0, cap=0)


@settings(max_examples=100, deadline=None)
@given(P=st.integers(1, 40_000), D=st.integers(0, 64), extra=st.integers(1, 9000),
       ctx=st.integers(0, 200_000))
def test_prefill_steps_match_the_closed_form_of_a_linear_cost(P, D, extra, ctx):
    ctx = ctx if D else 0
    s = prefill_steps(LIN, P, D + extra, D, ctx)
    n = math.ceil(P / extra)
    # sum over k < n of fixed + per_seq D + per_ctx (C + k D) + per_prefill c_k
    want = (n * (LIN.fixed_s + LIN.per_seq_s * D) + LIN.per_context_token_s * (n * ctx + D * n * (n - 1) / 2)
            + LIN.per_prefill_token_s * P)
    assert s.n_steps == n
    assert s.ttft_s == pytest.approx(want, rel=1e-9)
    assert s.max_gap_s == pytest.approx(max(s.step_s), rel=0)
    assert s.prefill_tokens_per_s == pytest.approx(P / want, rel=1e-9)
    if D:
        assert s.decode_step_s == pytest.approx(LIN.fixed_s + LIN.per_seq_s * D + LIN.per_context_token_s * ctx)
        assert s.slowdown >= 1
    else:
        assert math.isnan(s.slowdown)


def test_one_step_prefill_is_the_prefill_model_plus_host_time():
    cost = step_cost(DEP)
    s = prefill_steps(cost, 8000, 8192)
    assert s.n_steps == 1
    assert s.ttft_s == pytest.approx(prefill_time(DEP, 8000).time_s + cost.host_s, rel=2e-3)


def test_prefill_steps_refuse_a_cache_without_decodes_and_a_bad_cost():
    with pytest.raises(ValueError, match="context_tokens"):
        prefill_steps(LIN, 100, 64, 0, 10)
    with pytest.raises(ValueError, match="cost"):
        prefill_steps(object(), 100, 64)


@pytest.mark.parametrize("cap", [None, 1500])
def test_prefill_steps_match_the_simulator(cap):
    """D decodes run long outputs; a long prompt arrives alone: the simulator schedules exactly
    the plan, and each of its steps costs what prefill_steps says."""
    cost = step_cost(DEP)
    D, P, B = 12, 20_000, 4096
    rows = [(0.0, 700 + 10 * i, 3000) for i in range(D)] + [(0.5, P, 4)]
    res = simulate(trace(rows), Policy(token_budget=B, long_prefill_cap=cap), cost)
    long = next(r for r in res.requests if r.prompt_len == P)
    tl = res.timeline
    k = int(np.searchsorted(tl.start_s, long.first_scheduled_s))
    assert tl.decode_tokens[k] == D
    s = prefill_steps(cost, P, B, D, tl.context_tokens[k], cap)
    mine = [i for i, ch in enumerate(tl.chunks) if any(r == long.rid for r, _, _ in ch)]
    assert [(n, p) for i in mine for r, n, p in tl.chunks[i] if r == long.rid] == list(s.chunks)
    np.testing.assert_allclose(tl.duration_s[mine], s.step_s, rtol=1e-9)
    assert long.first_token_s - long.first_scheduled_s == pytest.approx(s.ttft_s, rel=1e-9)


def _brute_edges(w):
    """The window's definition read literally off its candidates."""
    ok_t = w.ttft_s <= w.ttft_target_s
    ok_g = w.max_gap_s <= w.gap_target_s
    lo = next((int(b) for i, b in enumerate(w.budgets) if ok_t[i:].all()), None)
    hi = next((int(b) for i, b in reversed(list(enumerate(w.budgets))) if ok_g[:i + 1].all()), None)
    return lo, hi


@pytest.mark.parametrize("P,D,ttft,gap", [(20_000, 32, 2.0, 0.1), (20_000, 32, 0.5, 0.1), (4000, 8, 5.0, 1.0),
                                          (60_000, 64, 3.0, 0.05), (300, 0, 0.05, 0.02)])
def test_budget_window_edges_follow_their_definition(P, D, ttft, gap):
    cost = step_cost(DEP)
    w = budget_window(cost, P, D, D * 1500, ttft, gap, granularity=64)
    assert ((w.budgets[:-1] - D) % 64 == 0).all() and w.budgets[-1] == P + D
    assert (w.min_budget_for_ttft, w.max_budget_for_gap) == _brute_edges(w)
    for i, b in enumerate(w.budgets):  # the curves are prefill_steps at each candidate
        if i % 17 == 0:
            s = prefill_steps(cost, P, int(b), D, D * 1500)
            assert (w.ttft_s[i], w.max_gap_s[i]) == (s.ttft_s, s.max_gap_s)
    if w.feasible:
        inside = (w.budgets >= w.min_budget_for_ttft) & (w.budgets <= w.max_budget_for_gap)
        assert (w.ttft_s[inside] <= ttft).all() and (w.max_gap_s[inside] <= gap).all()


def test_budget_window_with_a_linear_cost_matches_its_closed_form():
    """LinearCost: the worst gap is the first full chunk's step, fixed + per_seq D + per_ctx C +
    per_prefill (B - D) (plus the context growth of later steps); so the gap edge is known."""
    D, C, P, gap = 10, 1000, 30_000, 0.2
    w = budget_window(LIN, P, D, C, 100.0, gap, granularity=1000)
    # largest chunk c (multiple of 1000) whose worst step, the last full chunk's, stays under the target
    best = max(c for c in range(1000, P + 1, 1000)
               if max(LIN.step_s(D, C + k * D, [(min(c, P - k * c), 0)]) for k in range(math.ceil(P / c))) <= gap)
    assert w.max_budget_for_gap == D + best
    assert w.min_budget_for_ttft == w.budgets[0]  # a generous TTFT target: every budget meets it


def test_budget_window_reports_infeasible_targets():
    cost = step_cost(DEP)
    w = budget_window(cost, 20_000, 32, 48_000, 0.05, 1e-3)
    assert w.min_budget_for_ttft is None and w.max_budget_for_gap is None and not w.feasible
    with pytest.raises(ValueError, match="gap_target_s"):
        budget_window(cost, 20_000, 32, 0, 1.0, 0.0)


def test_default_granularity_keeps_candidates_few_and_round():
    for P in (1, 100, 4096, 20_000, 131_072, 1_000_000):
        g = default_granularity(P)
        assert g >= 16 and g & (g - 1) == 0
        assert math.ceil(P / g) <= 256 or g == 16


def _long_prompt_run(cost, P, *, rate=4.0, n=120, t_long=8.0, policy=None):
    rows = [(i / rate, 512, 64) for i in range(n)] + [(t_long + 1e-3, P, 16)]
    res = simulate(trace(rows), policy or Policy(), cost)
    return res, next(r.rid for r in res.requests if r.prompt_len == P)


def test_prefill_damage_on_a_long_prompt():
    cost = step_cost(DEP)
    res, rid = _long_prompt_run(cost, 60_000)
    d = prefill_damage(res, rid, before_s=4.0)
    me = res.requests[rid]
    assert (d.start_s, d.end_s) == (me.first_scheduled_s, me.first_token_s)
    assert d.prefill_s == pytest.approx(d.step_s.sum(), rel=1e-9)  # it was scheduled every step
    assert d.last_step_s > d.first_step_s  # deeper chunks attend to more of the prompt
    assert d.peak_gap_s == pytest.approx(d.step_s.max(), rel=1e-9)
    assert d.baseline_gap_s < d.first_step_s / 5
    # arrivals during the prefill: 4 per second, none admitted (the prompt holds the budget)
    assert d.arrivals == sum(1 for r in res.requests if r.rid != rid and d.start_s <= r.arrival_s < d.end_s)
    assert d.arrivals >= int(4.0 * d.prefill_s) - 1
    # none started before the prompt's last step (its last chunk leaves room in the budget)
    last_start = d.end_s - d.last_step_s
    assert all(r.first_scheduled_s >= last_start - 1e-9 for r in res.requests
               if r.rid != rid and d.start_s <= r.arrival_s < d.end_s)
    assert d.locked_out < d.arrivals
    first = min((r for r in res.requests if r.rid != rid and r.arrival_s >= d.start_s), key=lambda r: r.arrival_s)
    assert d.lockout_s == pytest.approx(first.queue_s, rel=1e-9)
    assert d.lockout_s >= last_start - first.arrival_s - 1e-9  # it waited for the last chunk's step
    assert d.recovery_s >= 0 and d.backlog_end_s > 0


def test_prefill_damage_when_the_cap_lets_arrivals_in():
    cost = step_cost(DEP)
    res, rid = _long_prompt_run(cost, 60_000, policy=Policy(long_prefill_cap=2048))
    d = prefill_damage(res, rid)
    assert d.arrivals > 0 and d.locked_out == 0
    assert d.lockout_s < 0.5


def test_prefill_damage_without_arrivals_and_refusals():
    cost = step_cost(DEP)
    res = simulate(trace([(0.0, 512, 400), (0.0, 512, 400), (1.0, 30_000, 1)]), Policy(), cost)
    d = prefill_damage(res, 2, before_s=0.5)
    assert d.arrivals == 0 and d.lockout_s == 0 and math.isnan(d.backlog_end_s)
    assert d.recovery_s == 0 and math.isnan(d.after_gap_s)  # the decodes are back to normal at once
    cut = simulate(trace([(0.0, 512, 400), (1.0, 30_000, 4)]), Policy(), cost, horizon_s=1.2)
    with pytest.raises(ValueError, match="never finished its prefill"):
        prefill_damage(cut, 1)
    with pytest.raises(ValueError, match="rid"):
        prefill_damage(res, 3)


# ---- the two scenarios -----------------------------------------------------------------------


def test_head_of_line_matches_the_closed_form_of_a_linear_cost():
    """FCFS, chunked: the long prompt's four chunk steps, then one step with the short prompts and the
    long request's first decode, reading its P + 1 cached tokens (the prompt and the token its
    prefill emitted): the extra TTFT is exactly that."""
    from lib.scheduling.long_prefill import head_of_line

    P, B, n, S = 4000, 1000, 3, 100
    hol = head_of_line(LIN, Policy(token_budget=B, max_running=8), P, 50, S, 20, n)
    f, p = LIN.fixed_s, LIN.per_prefill_token_s
    extra = 4 * (f + B * p) + LIN.per_seq_s + LIN.per_context_token_s * (P + 1)
    np.testing.assert_allclose(hol.extra_ttft_s, extra, rtol=1e-12)
    np.testing.assert_allclose(hol.ttft_alone_s, f + n * S * p, rtol=1e-12)
    assert hol.long_ttft_s == pytest.approx(4 * (f + B * p), rel=1e-12)


@pytest.mark.parametrize("policy", [Policy(token_budget=2048), Policy(token_budget=2048, order="spf"),
                                    Policy(token_budget=2048, long_prefill_cap=512),
                                    Policy(chunked_prefill=False, step_mix="prefill_first", token_budget=40_000)])
@pytest.mark.parametrize("lead", [0.0, 0.004])
def test_head_of_line_first_tokens_only_changes_nothing_it_reports(policy, lead):
    from lib.scheduling.long_prefill import head_of_line

    cost = step_cost(DEP)
    full = head_of_line(cost, policy, 30_000, 200, 300, 50, 6, lead)
    quick = head_of_line(cost, policy, 30_000, 200, 300, 50, 6, lead, first_tokens_only=True)
    np.testing.assert_allclose(quick.ttft_s, full.ttft_s, rtol=1e-12)
    np.testing.assert_allclose(quick.ttft_alone_s, full.ttft_alone_s, rtol=1e-12)
    assert quick.long_ttft_s == pytest.approx(full.long_ttft_s, rel=1e-12)
    assert len(quick.with_long.timeline) <= len(full.with_long.timeline)


def test_shortest_prompt_first_is_fcfs_on_a_hand_sorted_queue():
    from lib.scheduling.long_prefill import head_of_line

    cost = step_cost(DEP)
    spf = head_of_line(cost, Policy(token_budget=4096, order="spf"), 30_000, 64, 500, 64, 5)
    by_hand = simulate(trace([(0.0, 500, 64)] * 5 + [(0.0, 30_000, 64)]), Policy(token_budget=4096), cost)
    np.testing.assert_allclose(spf.ttft_s, [r.ttft_s for r in by_hand.requests[:5]], rtol=1e-12)
    assert spf.extra_ttft_s.max() < 0.2 * prefill_steps(cost, 30_000, 4096).ttft_s


def test_long_prompt_run_places_the_long_request_and_covers_the_after_window():
    from lib.scheduling.long_prefill import long_prompt_run

    cost = step_cost(DEP)
    res, rid = long_prompt_run(cost, Policy(), 40_000, 8, 512, 64, 3.0, 4.0, 3.0)
    me = res.requests[rid]
    assert (me.arrival_s, me.prompt_len, me.output_len) == (4.0, 40_000, 8)
    others = [r for r in res.requests if r.rid != rid]
    assert all(r.prompt_len == 512 and r.output_len == 64 for r in others)
    assert np.allclose(np.diff([r.arrival_s for r in others]), 1 / 3.0)
    assert res.complete or res.end_s >= me.first_token_s + 3.0
    # a cap that makes the prefill far slower than its estimate: the horizon follows it
    slow, rid = long_prompt_run(cost, Policy(long_prefill_cap=64), 20_000, 8, 512, 64, 3.0, 2.0, 1.0)
    assert math.isfinite(slow.requests[rid].first_token_s)


# ---- the chunk cap and the backlog gate --------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(D=st.integers(0, 64), ctx=st.integers(0, 100_000), target=st.floats(0.001, 2.0))
def test_chunk_cap_matches_the_closed_form_of_a_linear_cost(D, ctx, target):
    from lib.scheduling.long_prefill import chunk_cap

    ctx = ctx if D else 0
    room = target - LIN.fixed_s - LIN.per_seq_s * D - LIN.per_context_token_s * ctx
    want = max(0, math.floor(room / LIN.per_prefill_token_s + 1e-9))
    got = chunk_cap(LIN, D, ctx, target, max_chunk=1 << 30)
    assert abs(got - want) <= 1  # floating-point ties at the boundary
    if got:
        assert LIN.step_s(D, ctx, [(got, 0)]) <= target


def test_chunk_cap_with_the_step_models_is_the_boundary():
    from lib.scheduling.long_prefill import chunk_cap

    cost = step_cost(DEP)
    for target, position in ((0.05, 0), (0.1, 0), (0.1, 60_000), (0.5, 20_000)):
        c = chunk_cap(cost, 16, 16 * 2000, target, position)
        assert cost.step_s(16, 32_000, [(c, position)]) <= target < cost.step_s(16, 32_000, [(c + 1, position)])
    assert chunk_cap(cost, 16, 32_000, 0.1, 60_000) < chunk_cap(cost, 16, 32_000, 0.1, 0)  # deeper: smaller
    assert chunk_cap(cost, 16, 32_000, 1e-4) == 0  # below a decode step


def _fluid_oracle(arrivals, prompts, mu, target):
    """The gate's rule by an explicit event list: a work queue of admitted prompts served at mu."""
    served_until, out = 0.0, []  # time at which everything admitted so far is prefilled
    for t, p in zip(arrivals, prompts, strict=True):
        finish = max(served_until, t) + p / mu
        if finish - t <= target + 1e-12:
            served_until = finish
            out.append(True)
        else:
            out.append(False)
    return out


@settings(max_examples=100, deadline=None)
@given(gaps=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=60), seed=st.integers(0, 1000),
       mu=st.floats(500.0, 50_000.0), target=st.floats(0.05, 5.0))
def test_backlog_gate_is_a_fluid_queue(gaps, seed, mu, target):
    from lib.scheduling import Request
    from lib.scheduling.long_prefill import backlog_gate

    rng = np.random.default_rng(seed)
    times = np.cumsum(gaps)
    prompts = rng.integers(1, 20_000, len(times))
    reqs = [Request(i, float(t), int(p), 1) for i, (t, p) in enumerate(zip(times, prompts, strict=True))]
    g = backlog_gate(reqs, mu, target)
    assert list(g.admitted) == _fluid_oracle(times, prompts, mu, target)
    assert ((g.backlog_tokens + prompts)[g.admitted] <= mu * target * (1 + 1e-9)).all()
    assert (g.retry_after_s[~g.admitted] > 0).all() and (g.retry_after_s[g.admitted] == 0).all()
    assert g.max_backlog_tokens == pytest.approx(mu * target)


def test_a_rejected_request_passes_when_it_retries_after_the_advice():
    from lib.scheduling import Request
    from lib.scheduling.long_prefill import backlog_gate

    burst = [Request(i, 0.0, 4000, 1) for i in range(10)]
    g = backlog_gate(burst, 10_000.0, 1.0)  # 10,000 tokens absorbed: two of the ten fit
    assert g.admitted.sum() == 2 and g.admitted_fraction == pytest.approx(0.2)
    late = burst[2]
    again = backlog_gate(burst[:2] + [Request(2, g.retry_after_s[2] + 1e-9, late.prompt_len, 1)], 10_000.0, 1.0)
    assert again.admitted.all()
    sooner = backlog_gate(burst[:2] + [Request(2, 0.9 * g.retry_after_s[2], late.prompt_len, 1)], 10_000.0, 1.0)
    assert not sooner.admitted[-1]
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        backlog_gate(burst, 0.0, 1.0)
