"""Deferred reclamation with request-id reuse (lib.scheduling.reclaim): late or duplicate completions
never stream stale output or free another request's pages, as a hypothesis search with a model GPU
that records which pages each in-flight step writes; the practice grader passes the reference and
catches every draft."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.scheduling.reclaim import RequestTable
from lib.scheduling.reclaim_practice import (
    RECLAIM_VARIANTS,
    ReclaimModel,
    check,
    parse_program,
    reclaim_cases,
    reclaim_variant,
    replay,
    run_program,
)


def test_the_race():
    t = RequestTable(4)
    old = t.admit("a", 2)
    t1 = t.launch("a")
    t.disconnect("a")
    assert t.free_pages == 2  # deferred: the step still writes the old pages
    new = t.admit("a", 2)  # the id is reusable at once
    assert not set(old) & set(new)
    t2 = t.launch("a")
    assert t.complete(t1, "old") is None  # stale: dropped
    assert t.free_pages == 2 and t.deferred_pages == 2  # the old pages, and only they, came back
    assert t.complete(t2, "new") == ("a", "new")
    assert t.complete(t2, "new") is None  # duplicate delivery
    t.disconnect("a")
    assert t.free_pages == 4


def test_misuse_is_refused_without_change():
    t = RequestTable(3)
    with pytest.raises(ValueError):
        t.launch("a")
    with pytest.raises(ValueError):
        t.disconnect("a")
    with pytest.raises(ValueError):
        t.complete(0, "x")  # never issued
    t.admit("a", 1)
    with pytest.raises(ValueError):
        t.admit("a", 1)
    assert t.admit("b", 5) is None and t.free_pages == 2
    with pytest.raises(ValueError):
        RequestTable(0)
    with pytest.raises(ValueError):
        t.admit("c", 0)


OPS = st.lists(st.one_of(
    st.tuples(st.just("admit"), st.sampled_from("abc"), st.integers(1, 4)),
    st.tuples(st.just("launch"), st.sampled_from("abc")),
    st.tuples(st.just("complete"), st.integers(0, 30)),
    st.tuples(st.just("dup"), st.integers(0, 30)),
    st.tuples(st.just("disconnect"), st.sampled_from("abc")),
), max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.integers(2, 10), OPS)
def test_no_stale_output_no_page_under_a_running_step_no_leak(num_pages, ops):
    t = RequestTable(num_pages)
    writing: dict = {}  # ticket -> pages its in-flight step writes (the model GPU)
    incarnation: dict = {}  # rid -> serial of its live incarnation
    ticket_inc: dict = {}  # ticket -> (rid, serial)
    pages_of: dict = {}  # serial -> pages
    done: set = set()
    serial = 0
    tickets: list = []
    for op in ops:
        kind = op[0]
        if kind == "admit":
            try:
                got = t.admit(op[1], op[2])
            except ValueError:
                assert op[1] in incarnation
                continue
            assert op[1] not in incarnation
            if got is None:
                continue
            busy = set().union(*writing.values()) if writing else set()
            held = set().union(*(pages_of[s] for s in incarnation.values())) if incarnation else set()
            assert not set(got) & busy, "a page was handed out while an in-flight step writes it"
            assert not set(got) & held, "a page was handed out while a live request holds it"
            serial += 1
            incarnation[op[1]], pages_of[serial] = serial, set(got)
        elif kind == "launch":
            if op[1] not in incarnation:
                with pytest.raises(ValueError):
                    t.launch(op[1])
                continue
            tk = t.launch(op[1])
            tickets.append(tk)
            s = incarnation[op[1]]
            ticket_inc[tk], writing[tk] = (op[1], s), set(pages_of[s])
        elif kind in ("complete", "dup"):
            if op[1] >= len(tickets):
                continue
            tk = tickets[op[1]]
            out = t.complete(tk, f"tok{tk}")
            rid, s = ticket_inc[tk]
            if tk in done:
                assert out is None, "a duplicate completion streamed again"
            elif incarnation.get(rid) == s:
                assert out == (rid, f"tok{tk}")
            else:
                assert out is None, "stale output: the ticket's request is gone"
            done.add(tk)
            writing.pop(tk, None)
        if kind == "disconnect":
            if op[1] not in incarnation:
                with pytest.raises(ValueError):
                    t.disconnect(op[1])
            else:
                t.disconnect(op[1])
                del incarnation[op[1]]
        # pages held = live incarnations + dead ones with a step in flight, exactly
        dead_busy = {s for tk, (rid, s) in ticket_inc.items() if tk in writing and incarnation.get(rid) != s}
        expected = sum(len(pages_of[s]) for s in set(incarnation.values()) | dead_busy)
        assert t.free_pages == num_pages - expected
    for tk in tickets:
        t.complete(tk, "x")
    for rid in list(t.live()):
        t.disconnect(rid)
    assert t.free_pages == num_pages, "pages leaked"


def test_model_agrees_with_the_reference_on_the_cases():
    for case in reclaim_cases(40):
        run_program(RequestTable, case.ops)


def test_reference_passes_the_grader():
    report = check(RequestTable)
    assert report.passed, report


@pytest.mark.parametrize("name", RECLAIM_VARIANTS)
def test_every_draft_fails_with_a_short_program(name):
    report = check(reclaim_variant(name))
    assert report.status == "failed", name
    assert int(report.failure.split("shrunk to ")[1].split(" ")[0]) <= 8, report


def test_grader_names_a_page_reused_under_a_running_step():
    class NoCount(RequestTable):  # frees at disconnect and hides free_pages: only page ownership can tell
        free_pages = None

        def disconnect(self, rid):
            inc = self._live.pop(rid)
            inc.alive = False
            self._release(inc)

    with pytest.raises(AssertionError, match="still belongs to"):
        run_program(NoCount, [("pool", 4), ("admit", "a", 2), ("launch", "a"), ("disconnect", "a"), ("admit", "b", 2)])


def test_parse_and_replay():
    ops = parse_program("admit a 2; launch a; disconnect a; admit a 2; complete 1; dup 1")
    assert ops == [("admit", "a", 2), ("launch", "a"), ("disconnect", "a"), ("admit", "a", 2), ("complete", 1),
                   ("dup", 1)]
    rows = replay(reclaim_variant("streams_by_id"), 4, ops)
    assert rows[-1][1].startswith("the grader says") and "stale output" in rows[-1][1]
    assert replay(RequestTable, 4, ops)[-1][1] == "the grader finds nothing wrong with this program"
    for bad in ("", "admit a", "launch", "complete x", "frobnicate a"):
        with pytest.raises(ValueError):
            parse_program(bad)
    with pytest.raises(ValueError):
        reclaim_variant("nope")
    assert ReclaimModel(3).free == 3
