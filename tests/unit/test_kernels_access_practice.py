"""lib.kernels.access_practice: the grader passes the reference, fails every classic draft with the right
diagnosis, and its plain-Python reference agrees with lib.kernels.access (two independent implementations)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import access as ac
from lib.kernels import access_practice as ap

WARP = 32


def test_the_reference_passes():
    report = ap.check(ap.reference_analyze)
    assert report.passed and report.cases_total == len(ap.cases())


@pytest.mark.parametrize("name", ap.VARIANTS)
def test_every_draft_fails_and_is_named(name):
    report = ap.check(ap.variant(name))
    assert report.status == "failed", name
    assert "shrunk to 1 operation" in report.failure
    text = ap._DRAFTS[name][0]
    if name != "no_broadcast":  # that draft first fails by raising (one active lane has no second lane)
        assert text in report.failure or "matches a classic mistake" in report.failure


def test_the_skeleton_is_not_implemented_and_bad_returns_are_explained():
    assert ap.check(ap.skeleton).status == "not implemented"
    assert "must return (pattern, sectors)" in ap.check(lambda a, w, m: 4).failure
    assert "is not one of" in ap.check(lambda a, w, m: ("coalesced", 4)).failure
    assert "must be an int" in ap.check(lambda a, w, m: ("contiguous", 4.0)).failure
    with pytest.raises(ValueError, match="analyze"):
        ap.check("analyze")


def test_cases_cover_the_edge_cases():
    ops = [op for case in ap.cases() for op in case.ops]
    widths = {op[1] for op in ops}
    kinds = {ap.expected(op)[0] for op in ops}
    assert widths == set(ac.WIDTHS)
    assert kinds == set(ac.PATTERNS)
    assert any(not all(op[3]) for op in ops) and any(not any(op[3]) for op in ops)
    assert ap.cases(3, 1) != ap.cases(3, 2) and ap.cases(3, 1) == ap.cases(3, 1)


widths = st.sampled_from(ac.WIDTHS)
masks = st.lists(st.booleans(), min_size=WARP, max_size=WARP)


@st.composite
def instructions(draw):
    width = draw(widths)
    kind = draw(st.sampled_from(["stride", "random", "broadcast"]))
    base = draw(st.integers(0, 5000))
    if kind == "stride":
        stride = draw(st.integers(-40, 40))
        a = [base + 40 * 16 * 32 + stride * lane for lane in range(WARP)]
    elif kind == "random":
        a = draw(st.lists(st.integers(0, 3000), min_size=WARP, max_size=WARP))
    else:
        a = [base] * WARP
    return a, width, draw(masks)


@settings(max_examples=400, deadline=None)
@given(instructions())
def test_the_plain_python_reference_agrees_with_lib(inst):
    a, width, mask = inst
    assert ap.reference_analyze(a, width, mask) == ap.expected(ap.instruction(a, width, mask))


def test_a_draft_is_an_edit_of_the_reference():
    import inspect

    with pytest.raises(ValueError, match="variant must be"):
        ap.variant("nonsense")
    assert ap.variant("reference") is ap.reference_analyze
    for name in ap.VARIANTS:
        assert inspect.isfunction(ap.variant(name))
    a = list(ac.contiguous(4))
    assert ap.variant("elements_not_bytes")(a, 4, [True] * WARP) == ("strided", 4)
    assert ap.variant("line_alignment")(list(ac.misaligned(32, 4)), 4, [True] * WARP) == ("misaligned", 4)
