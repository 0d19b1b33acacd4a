"""Token-reservation admission (lib.scheduling.reservation): the reference against a brute-force
model, the bound as a property with requests that really decode, the practice grader (reference
passes, every draft fails with a short shrunk program), and agreement with the simulator's
``admission="reserve"`` policy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf.deployment import Deployment
from lib.scheduling import LogNormal, Policy, Request, simulate, step_cost
from lib.scheduling.reservation import (
    ADMITTED,
    QUEUED,
    REJECTED,
    ReservationAdmission,
    reservation_tradeoff,
)
from lib.scheduling.reservation_practice import (
    RESERVATION_VARIANTS,
    ReservationModel,
    check,
    reservation_cases,
    reservation_variant,
    run_program,
    worst_pool_use,
)

# ---- the reference ---------------------------------------------------------------------------------


def test_admit_queue_reject_refund():
    b = ReservationAdmission(100)
    assert b.submit("huge", 60, 50) == REJECTED
    assert b.submit("a", 30, 50) == ADMITTED and b.free_tokens == 20
    assert b.submit("b", 30, 30) == QUEUED
    assert b.submit("tiny", 1, 1) == QUEUED  # fits, but FIFO: it does not pass the head
    assert b.complete("a", 35) == ["b", "tiny"]
    assert b.free_tokens == 100 - 60 - 2 and b.refunded == 80 - 35
    assert b.running() == ["b", "tiny"] and b.queued() == []
    assert b.complete("b", 60) == [] and b.complete("tiny", 2) == []
    assert b.free_tokens == 100 and b.reserved_tokens == 0


def test_exact_fit_and_cancel():
    b = ReservationAdmission(100)
    assert b.submit("a", 60, 40) == ADMITTED and b.free_tokens == 0
    assert b.submit("b", 50, 40) == QUEUED and b.submit("c", 1, 1) == QUEUED
    assert b.cancel("b") == []  # the head leaves, but c still does not fit (0 free)
    assert b.cancel("a") == ["c"]
    assert b.free_tokens == 98


def test_misuse_raises_and_changes_nothing():
    b = ReservationAdmission(100)
    b.submit("a", 10, 10)
    b.submit("q", 90, 10)
    before = (b.free_tokens, b.running(), b.queued())
    for bad in (lambda: b.submit("a", 1, 1), lambda: b.submit("q", 1, 1), lambda: b.complete("q", 5),
                lambda: b.complete("zz", 1), lambda: b.complete("a", 21), lambda: b.cancel("zz"),
                lambda: b.submit("x", 0, 5), lambda: b.complete("a", -1)):
        with pytest.raises(ValueError):
            bad()
        assert (b.free_tokens, b.running(), b.queued()) == before
    with pytest.raises(ValueError, match="capacity"):
        ReservationAdmission(0)
    b.complete("a", 20)
    assert b.submit("a", 1, 1) == QUEUED  # ids are reusable once done (q still heads the queue)


OPS = st.lists(st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 7), st.integers(1, 60), st.integers(1, 80)),
    st.tuples(st.just("complete"), st.integers(0, 7), st.integers(0, 140)),
    st.tuples(st.just("cancel"), st.integers(0, 7)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.integers(10, 150), OPS)
def test_reference_matches_the_model_and_keeps_the_bound(capacity, ops):
    b, model = ReservationAdmission(capacity), ReservationModel(capacity)
    for op in ops:
        try:
            want = getattr(model, op[0])(*op[1:])
        except ValueError:
            want = ValueError
        try:
            got = getattr(b, op[0])(*op[1:])
        except ValueError:
            got = ValueError
        assert got == want, op
        assert b.free_tokens == model.free >= 0
        assert b.reserved_tokens == sum(model.running.values()) <= capacity
        assert b.running() == list(model.running) and b.queued() == [r for r, _ in model.queue]
        # FIFO liveness: a non-empty queue means its head does not fit
        if b.queued():
            assert model.queue[0][1] > b.free_tokens


@settings(max_examples=100, deadline=None)
@given(st.integers(20, 200), st.lists(st.tuples(st.integers(1, 60), st.integers(1, 100), st.floats(0, 1)),
                                      min_size=1, max_size=30))
def test_the_bound_with_requests_that_decode(capacity, reqs):
    """Every running request writes a token per tick up to a hidden real cost; the KV written at once
    never exceeds the capacity, and at the end the bucket is whole."""
    b = ReservationAdmission(capacity)
    written, cost, prompt = {}, {}, {}
    pending = list(enumerate(reqs))
    for _tick in range(2000):
        if pending:
            rid, (p, m, frac) = pending.pop(0)
            prompt[rid], cost[rid] = p, p + max(1, round(frac * m))
            if b.submit(rid, p, m) == ADMITTED:
                written[rid] = p
        for rid in written:
            written[rid] += 1
        assert sum(written.values()) <= capacity
        for rid in [r for r, w in written.items() if w >= cost[r]]:
            for new in b.complete(rid, written.pop(rid)):
                written[new] = prompt[new]
        assert sum(written.values()) <= capacity
        if not pending and not written and not b.queued():
            break
    assert b.free_tokens == capacity and not b.queued()


# ---- the practice grader -------------------------------------------------------------------------


def test_reference_passes_the_grader():
    report = check(ReservationAdmission)
    assert report.passed, report
    assert report.cases_total == len(reservation_cases())


@pytest.mark.parametrize("name", RESERVATION_VARIANTS)
def test_every_draft_fails_with_a_short_program(name):
    report = check(reservation_variant(name))
    assert report.status == "failed", name
    n_ops = int(report.failure.split("shrunk to ")[1].split(" ")[0])
    assert n_ops <= 5, report


def test_not_implemented_and_bad_factory():
    class Skeleton:
        def __init__(self, capacity):
            pass

        def submit(self, rid, prompt_tokens, max_tokens):
            raise NotImplementedError

    assert check(Skeleton).status == "not implemented"
    with pytest.raises(ValueError):
        reservation_variant("nope")


def test_grader_reports_the_broken_bound():
    class Overcommits:  # no free_tokens: only the bound check can catch it
        def __init__(self, capacity):
            self.running = {}

        def submit(self, rid, p, m):
            if rid in self.running:
                raise ValueError("dup")
            if p + m > 100:
                return REJECTED
            self.running[rid] = p
            return ADMITTED

        def complete(self, rid, used):
            if rid not in self.running:
                raise ValueError("no")
            del self.running[rid]
            return []

        def cancel(self, rid):
            return self.complete(rid, 0)

    with pytest.raises(AssertionError, match="the bound broke"):
        run_program(Overcommits, [("pool", 100), ("submit", "a", 40, 40), ("submit", "b", 40, 40)])


def test_worst_pool_use_separates_reference_from_greedy():
    assert worst_pool_use(ReservationAdmission, num_programs=80)[0] <= 1.0
    assert worst_pool_use(reservation_variant("reserves_prompt_only"), num_programs=80)[0] > 1.0


# ---- against the simulator and the trade-off statistics ---------------------------------------------


def test_engine_reserve_admits_what_the_ledger_admits_in_blocks():
    dep = Deployment("llama-3.1-8b", "h100-sxm")
    cost = step_cost(dep)
    burst = [Request(i, 0.0, 1500, 1, 0, 8192) for i in range(200)]
    first = simulate(burst, Policy(admission="reserve", token_budget=1 << 22, max_running=cost.max_running), cost,
                     max_steps=1)
    blocks = -(-(1500 + 8192 - 1) // cost.block_size)
    ledger = ReservationAdmission(cost.kv_blocks)  # in blocks: each hold is `blocks`
    admitted = sum(ledger.submit(i, blocks - 1, 1) == ADMITTED for i in range(200))
    assert int(first.timeline.running[0]) == admitted == cost.kv_blocks // blocks


def test_reservation_tradeoff():
    rng = np.random.default_rng(0)
    p = LogNormal(1000, 0.5).sample(rng, 5000)
    o = LogNormal(300, 1.2).sample(rng, 5000)
    t = reservation_tradeoff(400_000, p, o, [256, 1024, 8192])
    assert np.all(np.diff(t["cut"]) <= 0) and np.all(np.diff(t["idle"]) >= 0)
    assert t["cut"][1] == pytest.approx(np.mean(o > 1024))
    assert t["reserve_conc"][2] == pytest.approx(400_000 / np.mean(p + 8192))
    assert np.all(t["reserve_conc"] <= t["greedy_conc"])
    with pytest.raises(ValueError):
        reservation_tradeoff(0, p, o, [1])


def test_explorer_view_matches_lib():
    from lib.explorers.scheduling_memory import token_reservation

    view = token_reservation("llama-3.1-8b", "h100-sxm", 1, 1500, 300, 1.2, 8192)
    pool = Deployment("llama-3.1-8b", "h100-sxm").budget.num_blocks * 16
    assert view.values["pool"] == pool
    assert view.values["reserve_conc"] == pytest.approx(pool / (1500 * np.exp(0.125) + 8192), rel=0.03)
