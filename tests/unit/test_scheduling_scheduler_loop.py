"""The standalone scheduler loop (I088): oracle against the engine, invariants, practice grader."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.scheduling import simulate
from lib.scheduling.cost import LinearCost
from lib.scheduling.policies import Policy
from lib.scheduling.scheduler_loop import (
    SchedState,
    Seq,
    Step,
    advance,
    blocks_for,
    check_invariants,
    run_loop,
    schedule_step,
)
from lib.scheduling.scheduler_loop_practice import VARIANTS, check, skeleton, variant
from lib.scheduling.workloads import Request


@st.composite
def programs(draw):
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    max_running = draw(st.integers(1, 6))
    budget = draw(st.integers(max_running, 48))
    reqs = draw(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 14)), min_size=1, max_size=9))
    need = max(blocks_for(p + o - 1, bs) for p, o in reqs)
    blocks = draw(st.integers(need, 4 * need))
    return reqs, budget, blocks, bs, max_running


def _engine_steps(reqs, budget, blocks, bs, max_running):
    rs = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(reqs)]
    cost = LinearCost(1e-3, kv_blocks=blocks, block_size=bs, max_running=max_running, token_budget=budget)
    res = simulate(rs, Policy(token_budget=budget, max_running=max_running), cost)
    tl = res.timeline
    steps = [(int(d), tuple((r, c) for r, c, _ in ch)) for d, ch in zip(tl.decode_tokens, tl.chunks, strict=True)]
    return steps, res


@settings(max_examples=300, deadline=None)
@given(programs())
def test_matches_the_engine_step_by_step(prog):
    """The oracle: lib.scheduling.simulate (continuous, chunked, FCFS, recompute) builds the same
    batches, step by step, including the steps after preemptions."""
    want, res = _engine_steps(*prog)
    trace = run_loop(*prog)
    got = [(len(s.decodes), s.chunks) for _, s in trace if s.tokens]
    assert got == want
    assert sum(len(s.preempted) for _, s in trace) == res.counters["preemptions"]


def test_the_oracle_sees_preemptions():
    """The random programs above do exercise preemption (else the oracle test proves little)."""
    trace = run_loop([(3, 6), (3, 6), (3, 4), (2, 2)], budget=16, num_blocks=6, block_size=2, max_running=4)
    assert sum(len(s.preempted) for _, s in trace) >= 1
    assert sum(len(s.resumed) for _, s in trace) >= 1


@settings(max_examples=300, deadline=None)
@given(programs())
def test_invariants_and_conservation(prog):
    reqs, budget, blocks, bs, max_running = prog
    trace = run_loop(reqs, budget, blocks, bs, max_running)  # asserts check_invariants each step
    finished = []
    state = trace[0][0]
    for before, step in trace:
        assert step.tokens <= budget
        assert before.free_blocks >= 0
        state, done = advance(before, step)
        finished += done
        rids = [s.rid for s in (*state.waiting, *state.running, *state.preempted)]
        assert len(rids) == len(set(rids)), "a request in two queues"
        held = sum(s.blocks for s in state.running)
        assert held + state.free_blocks == blocks, "blocks leaked or double-counted"
    assert sorted(finished) == list(range(len(reqs))), "every request finishes: preempted ones resume"
    assert state.free_blocks == blocks


@settings(max_examples=150, deadline=None)
@given(programs())
def test_tokens_emitted_equal_outputs(prog):
    reqs, budget, blocks, bs, max_running = prog
    emitted = [0] * len(reqs)
    for before, step in run_loop(reqs, budget, blocks, bs, max_running):
        running = {s.rid: s for s in before.running}
        for r in step.decodes:
            emitted[r] += 1
        for r, c in step.chunks:
            seq = running.get(r) or next(s for s in (*before.waiting, *before.preempted) if s.rid == r)
            emitted[r] += c == seq.prefill_left
    assert emitted == [o for _, o in reqs]


def test_decodes_first_and_budget_left_for_prefill():
    state = SchedState(waiting=(Seq(2, 100, 3),), running=(Seq(0, 0, 5, 10, 3), Seq(1, 0, 5, 8, 2)),
                       free_blocks=100, block_size=4, max_running=8)
    step = schedule_step(state, 16)
    assert step.decodes == (0, 1)
    assert step.chunks == ((2, 14),) and step.admitted == (2,)
    check_invariants(state, 16, step)


def test_invariant_checker_can_fail():
    state = SchedState(waiting=(Seq(1, 40, 3),), running=(Seq(0, 0, 5, 10, 3),), free_blocks=100,
                       block_size=4, max_running=8)
    with pytest.raises(AssertionError, match="over the budget"):
        check_invariants(state, 16, Step((0,), ((1, 16),), (), (), (1,)))
    with pytest.raises(AssertionError, match="got no token"):
        check_invariants(state, 16, Step((), ((1, 16),), (), (), (1,)))


def test_advance_refuses_over_allocation():
    state = SchedState(waiting=(Seq(0, 9, 2),), free_blocks=2, block_size=4, max_running=4)
    with pytest.raises(ValueError, match="over-allocates"):
        advance(state, Step((), ((0, 9),), (), (), (0,)))


def test_validation():
    with pytest.raises(ValueError, match="budget"):
        schedule_step(SchedState(max_running=8, free_blocks=4), 4)
    with pytest.raises(ValueError, match="pool"):
        run_loop([(100, 10)], budget=16, num_blocks=2, block_size=4, max_running=4)


def test_practice_reference_passes():
    assert check(schedule_step).passed


@pytest.mark.parametrize("name", VARIANTS)
def test_practice_every_defect_fails(name):
    report = check(variant(name))
    assert report.status == "failed", name
    assert "shrunk" in report.failure


def test_practice_skeleton_not_implemented():
    assert check(skeleton).status == "not implemented"


def test_a_decode_taken_by_a_prefill_does_not_decode():
    """A state the loop itself never reaches (a prefill older than a decode), but schedule_step
    takes any state: the prefill's make_room preempts the newer decode, which must leave the decodes."""
    prefill = Seq(0, prefill_left=64, output_left=5, context=32, blocks=2)
    decode = Seq(1, prefill_left=0, output_left=5, context=16, blocks=1)
    state = SchedState((), (prefill, decode), (), free_blocks=1, block_size=16, max_running=8)
    step = schedule_step(state, 64)
    assert step.preempted == (1, 0)
    assert step.decodes == () and step.chunks == () and step.tokens == 0
    check_invariants(state, 64, step)
