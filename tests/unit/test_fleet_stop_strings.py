"""Stop strings on a token stream (lib.fleet.stop_strings) and its practice grader."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import stop_strings as ss
from lib.fleet import stop_strings_practice as sp

_TEXT = st.text(alphabet=st.sampled_from(list("ab#€😀 \nUser:")), max_size=24)
_STOPS = st.lists(st.text(alphabet=st.sampled_from(list("ab#€😀")), min_size=1, max_size=4), min_size=1, max_size=3)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points[:-1], points[1:], strict=True) if b > a]


@settings(max_examples=300, deadline=None)
@given(_TEXT, _STOPS, st.lists(st.integers(0, 200), max_size=30))
def test_stream_matches_whole_output_reference_for_any_split(text, stops, cuts):
    pieces = _split(text.encode(), cuts)
    sp.run(ss.StopStringStreamer, (("stops", tuple(stops)), *pieces))  # raises on any difference


@settings(max_examples=300, deadline=None)
@given(_TEXT, _STOPS)
def test_holdback_is_the_longest_suffix_that_is_a_stop_prefix(text, stops):
    k = ss.holdback(text, stops)
    brute = max([j for j in range(len(text) + 1) for s in stops if j < len(s) and text[len(text) - j:] == s[:j]])
    assert k == brute


def test_first_stop_rule():
    assert ss.first_stop("abcd", ("abcd", "bc")) == 1  # bc completes first
    assert ss.first_stop("xaab", ("aab",)) == 1
    assert ss.first_stop("xyz", ("q",)) is None
    assert ss.reference_output("hi ###x", ["###"]) == ("hi ", True)
    assert ss.complete_text("a€".encode()[:-1]) == "a"


def test_bad_inputs():
    with pytest.raises(ValueError, match="stops"):
        ss.validate_stops("###")
    with pytest.raises(ValueError, match="stops"):
        ss.StopStringStreamer([b"a"], [""])


def test_grader_passes_reference_and_fails_every_draft():
    assert sp.check(sp.variant("reference")).passed
    for name in sp.VARIANTS:
        assert sp.check(sp.variant(name)).status == "failed", name
    assert sp.check(sp.Skeleton).status == "not implemented"
