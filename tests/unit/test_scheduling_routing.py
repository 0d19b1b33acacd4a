"""The batch-routing contract (lib.scheduling.routing, I097): under any permutation, packing and drop
between launch and completion every request receives exactly its own continuation; the buggy
completions are found by the same property (hypothesis shrinks each to its smallest trigger); the
runtime checks refuse every fault without changing anything; the closed forms agree with simulation;
the practice grader passes the reference and catches every draft with a short program."""

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from lib.book.widgets import render
from lib.scheduling import routing as rt
from lib.scheduling import routing_practice as rp

MODEL = rt.FakeLM(0, rt.VOCAB)


# ---- the fake model and the packing ----------------------------------------------------------------------------


@pytest.mark.parametrize("packing", rt.PACKINGS)
@pytest.mark.parametrize("micro_batch", [1, 2, 3, 8])
def test_each_row_is_the_continuation_of_its_own_slot(packing, micro_batch):
    running = {rid: rt.prompt_tokens(rid, n) for rid, n in enumerate([5, 1, 9, 9, 3, 7, 2])}
    for sort in rt.SORTS:
        lnch = rt.launch(running, sort, packing, micro_batch=micro_batch)
        out = MODEL.forward(lnch.batch)
        assert out.tokens.shape == (len(running),)
        for i, slot in enumerate(lnch.manifest):
            assert int(out.tokens[i]) == MODEL.next_token(running[slot.rid])  # oracle: the request alone
            assert int(out.rids[i]) == slot.rid and int(out.checksums[i]) == rt.checksum(running[slot.rid])


def test_packing_layouts_and_padding():
    lengths = [2, 9, 4, 4, 7]
    toks = [rt.prompt_tokens(i, n) for i, n in enumerate(lengths)]
    ragged = rt.pack(list(range(5)), toks, "ragged")
    assert ragged.tokens.size == sum(lengths) and ragged.padding_tokens == 0
    assert ragged.starts.tolist() == [0, 2, 11, 15, 19] and ragged.last.tolist() == [1, 10, 14, 18, 25]
    padded = rt.pack(list(range(5)), toks, "padded", micro_batch=2)
    assert padded.widths == (9, 4, 7)
    assert padded.tokens.size == 2 * 9 + 2 * 4 + 7 and padded.padding_tokens == 18 + 8 + 7 - sum(lengths)
    assert padded.tokens[padded.starts[0] + 2: padded.starts[0] + 9].tolist() == [rt.PAD_ID] * 7
    # sorting is what keeps the padding small: longest first puts like lengths in one micro-batch
    order = rt.sort_order(lengths, "longest_first")
    sorted_pad = rt.pack([order[i] for i in range(5)], [toks[i] for i in order], "padded", micro_batch=2)
    assert sorted_pad.padding_tokens < padded.padding_tokens
    with pytest.raises(ValueError):
        ragged.tokens[0] = 1  # the launched batch is frozen


def test_sort_order_is_stable():
    assert rt.sort_order([3, 5, 3, 5], "longest_first") == [1, 3, 0, 2]
    assert rt.sort_order([3, 5, 3, 5], "shortest_first") == [0, 2, 1, 3]
    assert rt.sort_order([4, 4, 4], "longest_first") == [0, 1, 2]
    assert rt.sort_order([3, 5], "fcfs") == [0, 1]


def test_invalid_inputs_are_refused():
    running = {0: [1, 2], 1: [3]}
    for bad in (lambda: rt.launch({}, "fcfs"), lambda: rt.launch(running, "random"),
                lambda: rt.launch(running, "fcfs", "sparse"), lambda: rt.launch(running, order=[0, 0]),
                lambda: rt.launch({0: []}), lambda: rt.pack([1, 1], [[1], [2]], "ragged"),
                lambda: rt.simulate(0), lambda: rt.simulate(4, drop_prob=1.5), lambda: rt.simulate(4, route="x"),
                lambda: rt.expected_misrouted("running_index", 8, 0.1, "longest_first"),
                lambda: rt.fault_check("nope", [3, 4]), lambda: rt.FakeLM(vocab=1),
                lambda: rt.StepRouter("random"), lambda: rt.prompt_tokens(0, 0)):
        with pytest.raises(ValueError):
            bad()


# ---- the property: every request receives exactly its own continuation ----------------------------------------


@st.composite
def steps(draw, max_requests=8):
    """One step: prompt lengths (admission order), any batch order, a packing, the requests that leave
    while the step runs and the ones admitted meanwhile."""
    n = draw(st.integers(1, max_requests))
    lengths = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    packing = draw(st.sampled_from(rt.PACKINGS))
    micro = draw(st.integers(1, 4))
    drops = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    arrivals = draw(st.lists(st.integers(1, 12), max_size=3))
    return lengths, order, packing, micro, drops, arrivals


def _run(case, route="manifest", checks=False):
    """(state after completion by ``route``, the state before, the launched snapshot, launch)."""
    lengths, order, packing, micro, drops, arrivals = case
    running = {rid: rt.prompt_tokens(rid, n) for rid, n in enumerate(lengths)}
    lnch = rt.launch(running, packing=packing, micro_batch=micro, order=order)
    out = MODEL.forward(lnch.batch)
    snap = {rid: list(t) for rid, t in running.items()}
    for rid, gone in enumerate(drops):
        if gone:
            del running[rid]
    for j, n in enumerate(arrivals):
        running[len(lengths) + j] = rt.prompt_tokens(len(lengths) + j, n)
    before = {rid: list(t) for rid, t in running.items()}
    rt.complete(lnch, out, running, route=route, checks=checks)
    return running, before, snap, lnch


def _own_continuation(case, route="manifest", checks=False) -> bool:
    after, before, snap, _ = _run(case, route, checks)
    for rid, toks in after.items():
        want = before[rid] + [MODEL.next_token(snap[rid])] if rid in snap else before[rid]
        if toks != want:
            return False
    return set(after) == set(before)


@settings(max_examples=400, deadline=None)
@given(steps())
def test_fixed_contract_every_request_gets_exactly_its_own_continuation(case):
    after, before, snap, lnch = _run(case, checks=True)
    assert set(after) == set(before)
    for rid, toks in after.items():
        if rid in snap:  # launched and still running: exactly one token, its own continuation
            assert toks == before[rid] + [MODEL.next_token(snap[rid])]
        else:  # admitted mid-step: untouched
            assert toks == before[rid]


@pytest.mark.parametrize("route", ["presort", "running_index", "filter_zip"])
def test_the_property_finds_each_bug(route):
    """The same property, run on a buggy completion, fails; hypothesis shrinks the failure to its
    smallest trigger: two requests, and either a sort that swaps them or the first one leaving."""
    with pytest.raises(AssertionError):
        @settings(max_examples=300, deadline=None, database=None, derandomize=True)
        @given(steps())
        def holds(case):
            assert _own_continuation(case, route)
        holds()
    smallest = find(steps(), lambda c: not _own_continuation(c, route),
                    settings=settings(max_examples=2000, database=None, derandomize=True))
    lengths, order, _, _, drops, arrivals = smallest
    assert len(lengths) + len(arrivals) == 2, smallest  # two requests: the smallest batch a row can miss in
    if route == "presort":  # a permutation, nothing else
        assert list(order) == [1, 0] and not any(drops) and not arrivals
    elif route == "filter_zip":  # no reordering needed: one drop before a survivor
        assert drops[order[0]] and not drops[order[1]]


@settings(max_examples=300, deadline=None)
@given(steps(), st.sampled_from(["presort", "running_index", "filter_zip"]))
def test_the_runtime_checks_refuse_every_misroute(case, route):
    """With the checks on, a buggy route either raises RoutingError (changing nothing) or did the same
    as the fix: nothing reaches the wrong request silently."""
    try:
        after, before, _, _ = _run(case, route, checks=True)
    except rt.RoutingError as err:
        assert err.check in ("destination id", "destination length", "destination checksum")
        return
    assert _own_continuation(case, route)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.tuples(st.just("admit"), st.integers(1, 6), st.integers(1, 9)),
    st.tuples(st.just("launch")),
    st.tuples(st.just("drop"), st.integers(1, 6)),
    st.tuples(st.just("complete")),
    st.tuples(st.just("complete"), st.sampled_from(rp.FAULT_OPS)),
), max_size=30), st.sampled_from(rt.SORTS), st.sampled_from(rt.PACKINGS))
def test_reference_router_survives_any_program(ops, sort, packing):
    rp.run_program(rt.StepRouter, [("config", sort, packing), *ops])


# ---- where the bug hides -----------------------------------------------------------------------------------------


def test_which_reorderings_trigger_and_which_hide():
    varied = [30, 12, 50, 7, 41, 22]

    def mis(route, lengths=varied, sort="longest_first", drop=(), arrivals=0):
        return len(rt.scenario(lengths, sort=sort, route=route, drop=drop, arrivals=arrivals).misrouted)

    assert mis("presort") > 0 and mis("running_index") > 0
    assert mis("presort", [20] * 6) == 0  # equal lengths: a stable sort is the identity
    assert mis("presort", sorted(varied, reverse=True)) == 0  # already in the sort's order
    assert mis("presort", sort="fcfs") == 0 and mis("running_index", sort="fcfs") == 0
    assert mis("filter_zip") == 0  # no drop: the shift bug hides whatever the order
    assert mis("filter_zip", sort="fcfs", drop=(0,)) == 5  # the first slot leaves: every later row shifts
    assert mis("filter_zip", sort="fcfs", drop=(5,)) == 0  # the last slot leaves: nothing shifts
    assert mis("running_index", sort="fcfs", drop=(5,), arrivals=1) == 1  # its row lands on the newcomer
    assert mis("manifest", drop=(0, 3), arrivals=2) == 0


def test_packing_twin_hides_with_equal_lengths():
    for packing in rt.PACKINGS:
        equal = rt.fault_check("index_presort", [6, 6, 6], packing=packing)
        varied = rt.fault_check("index_presort", [3, 8, 5], packing=packing)
        assert equal.corrupted == 0 and equal.check is None
        assert varied.corrupted > 0 and varied.check == "echoed checksums"


EXPECTED_CHECK = {"presort": "destination id", "running_index": "destination id", "filter_zip": "destination id",
                  "index_presort": "echoed checksums", "swapped_rows": "echoed ids", "short_output": "shape",
                  "phantom_row": "shape", "bad_token": "token ids", "stale_output": "launch id",
                  "replayed_output": "destination length"}


@pytest.mark.parametrize("fault", list(rt.FAULTS))
def test_each_fault_is_refused_by_its_check(fault):
    r = rt.fault_check(fault, [9, 3, 12, 5], drop=(2,))  # request 2, the longest: slot 0 under longest_first
    assert r.check == EXPECTED_CHECK[fault], r
    assert r.check in rt.CHECKS


def test_a_refusal_changes_nothing_and_the_genuine_output_still_applies():
    running = {rid: rt.prompt_tokens(rid, n) for rid, n in enumerate([4, 9, 2])}
    lnch = rt.launch(running, step=3)
    out = MODEL.forward(lnch.batch)
    before = {rid: list(t) for rid, t in running.items()}
    for kind in ("swapped_rows", "short_output", "phantom_row", "bad_token"):
        with pytest.raises(rt.RoutingError):
            rt.complete(lnch, rt.corrupt(out, kind), running)
        assert running == before
    rt.complete(lnch, out, running)
    assert all(running[r] == before[r] + [MODEL.next_token(before[r])] for r in running)
    with pytest.raises(rt.RoutingError, match="applied before"):
        rt.complete(lnch, out, running)  # the same completion twice


# ---- closed forms vs simulation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("route,sort,p", [("presort", "longest_first", 0.0), ("presort", "shortest_first", 0.1),
                                         ("filter_zip", "longest_first", 0.05), ("filter_zip", "fcfs", 0.2),
                                         ("running_index", "fcfs", 0.1), ("manifest", "longest_first", 0.3)])
def test_expected_misrouted_matches_simulation(route, sort, p):
    """Monte Carlo over one step with distinct random lengths (the closed form's assumption): each request
    leaves with probability p and one is admitted per departure."""
    b, runs, rng = 24, 400, random.Random(11)
    got = []
    for _ in range(runs):
        drop = [i for i in range(b) if rng.random() < p]
        rec = rt.scenario(rng.sample(range(1, 200), b), sort=sort, route=route, drop=drop, arrivals=len(drop))
        got.append(len(rec.misrouted))
    want = rt.expected_misrouted(route, b, p, sort)
    se = max(np.std(got) / runs**0.5, 1e-9)
    assert abs(np.mean(got) - want) <= 4 * se + 1e-9, (np.mean(got), want, se)


def test_simulate_agrees_with_the_closed_form_at_its_first_step():
    b, p = 32, 0.05
    got = [len(rt.simulate(b, route="filter_zip", drop_prob=p, steps=1, seed=s, prompt_max=64).records[0].misrouted)
           for s in range(150)]
    se = np.std(got) / len(got) ** 0.5
    assert abs(np.mean(got) - rt.expected_misrouted("filter_zip", b, p)) <= 4 * se


def test_corrupted_requests_equal_misrouted_rows_and_fixed_never_corrupts():
    for route in rt.ROUTES:
        run = rt.simulate(16, route=route, drop_prob=0.1, steps=8, seed=3)
        for rec in run.records:
            assert len(rec.corrupted) == len(rec.misrouted)  # 1 / vocab chance of a coincidence: none here
            assert (rec.refused_by is None) == (not rec.misrouted)
        if route == "manifest":
            assert run.corrupted_total == 0 and run.first_refusal is None and not run.diverged


@pytest.mark.parametrize("route", list(rt.ROUTES))
def test_oracle_replay_finds_the_same_wrong_streams(route):
    """A second method for ``diverged``: replay each request's prompt through the model."""
    run = rt.simulate(12, route=route, drop_prob=0.15, steps=10, seed=5, prompt_max=64)
    assert set(run.wrong_streams()) == set(run.diverged)
    assert len(run.streams) == run.requests and run.initial_prompts == [n for _, n, _ in run.streams[:12]]


def test_padding_share_is_what_sorting_buys():
    lengths = [10, 200, 12, 190, 11, 205, 9, 199]
    unsorted = rt.padding_share(lengths, "fcfs", 2)
    assert unsorted == pytest.approx(1 - sum(lengths) / (2 * (200 + 190 + 205 + 199)))
    assert rt.padding_share(lengths, "longest_first", 2) < 0.05 < unsorted
    assert rt.padding_share([7] * 5, "fcfs", 2) == 0


def test_simulation_is_deterministic():
    a = rt.simulate(12, route="filter_zip", drop_prob=0.2, steps=5, seed=7)
    b = rt.simulate(12, route="filter_zip", drop_prob=0.2, steps=5, seed=7)
    assert [r.misrouted for r in a.records] == [r.misrouted for r in b.records]


# ---- the practice grader --------------------------------------------------------------------------------------------


def test_reference_passes_the_grader():
    report = rp.check(rp.variant("reference"))
    assert report.passed, report


@pytest.mark.parametrize("name", rp.VARIANTS)
def test_every_draft_fails_with_a_short_program(name):
    report = rp.check(rp.variant(name))
    assert report.status == "failed", name
    assert 1 <= rp.shrunk_ops(report) <= 5, report


def test_the_skeleton_is_not_implemented_yet():
    assert rp.check(rp.Skeleton).status == "not implemented"


def test_grader_names_whose_token_was_received():
    report = rp.check(rp.variant("presort"))
    assert "continuation" in report.failure and "right shape, valid id, wrong request" in report.failure


# ---- the explorer -----------------------------------------------------------------------------------------------------


def test_explorer_fixed_vs_buggy():
    args = dict(batch=16, sort="longest_first", drop_prob=0.1, seed=1, prompts="varied")
    fixed = render("scheduling.routing", completion="manifest", **args)
    buggy = render("scheduling.routing", completion="presort", **args)
    assert fixed.values["corrupted"] == 0 and not fixed.values["refused"]
    assert buggy.values["corrupted"] > 0 and buggy.values["refused"]
    hidden = render("scheduling.routing", completion="presort", **{**args, "prompts": "equal", "drop_prob": 0.0})
    assert hidden.values["corrupted"] == 0
    assert "<svg" in buggy.svg()


def test_random_programs_are_valid_for_the_reference():
    rng = random.Random(5)
    for _ in range(50):
        rp.run_program(rt.StepRouter, rp._random_program(rng))
