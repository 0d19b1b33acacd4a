"""lib.search: integer bisection against a brute-force scan, its call count and its contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.search import largest_true, smallest_true


class Counted:
    """A predicate that records every point it is called at."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, n):
        self.calls.append(n)
        return self.fn(n)


def _bracket(calls, lo, hi):
    """The call-count contract: only points of [lo, hi], none twice, floor..ceil of log2(hi - lo + 2)."""
    assert all(lo <= n <= hi for n in calls), (calls, lo, hi)
    assert len(set(calls)) == len(calls), calls
    width = hi - lo + 2
    assert math.floor(math.log2(width)) <= len(calls) <= math.ceil(math.log2(width)), (len(calls), width)


def _textbook(pred, lo, hi, largest):
    """The classic loop on the open bracket (lo, hi) that lib's callers used to write by hand."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid) == largest:
            lo = mid
        else:
            hi = mid
    return lo if largest else hi


ranges = st.integers(-2000, 2000).flatmap(
    lambda lo: st.tuples(st.just(lo), st.integers(lo - 1, lo + 3000)))


@given(ranges, st.data())
def test_largest_true_matches_a_scan_for_any_threshold(bounds, data):
    lo, hi = bounds
    t = data.draw(st.integers(lo - 2, hi + 2), label="last true")
    pred = Counted(lambda n: n <= t)
    got = largest_true(pred, lo, hi)
    assert got == max((n for n in range(lo, hi + 1) if n <= t), default=lo - 1)
    _bracket(pred.calls, lo, hi)


@given(ranges, st.data())
def test_smallest_true_matches_a_scan_for_any_threshold(bounds, data):
    lo, hi = bounds
    t = data.draw(st.integers(lo - 2, hi + 2), label="first true")
    pred = Counted(lambda n: n >= t)
    got = smallest_true(pred, lo, hi)
    assert got == min((n for n in range(lo, hi + 1) if n >= t), default=hi + 1)
    _bracket(pred.calls, lo, hi)


def test_random_monotone_predicates_from_sorted_values():
    """Monotone predicates that are not thresholds written as such: a cumulative sum under a cap."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        lo = int(rng.integers(-50, 50))
        hi = lo - 1 + int(rng.integers(0, 200))
        cum = np.cumsum(rng.exponential(1.0, hi - lo + 1))
        cap = float(rng.uniform(-1, cum[-1] + 1 if len(cum) else 1))
        fits = Counted(lambda n, cum=cum, lo=lo, cap=cap: cum[n - lo] <= cap)
        scan = [n for n in range(lo, hi + 1) if cum[n - lo] <= cap]
        assert largest_true(fits, lo, hi) == (scan[-1] if scan else lo - 1)
        _bracket(fits.calls, lo, hi)
        over = Counted(lambda n, cum=cum, lo=lo, cap=cap: cum[n - lo] > cap)
        assert smallest_true(over, lo, hi) == (scan[-1] + 1 if scan else lo)
        _bracket(over.calls, lo, hi)


@pytest.mark.parametrize("lo,hi", [(0, 2**62), (-(2**40), 2**40), (1, 1 << 22)])
def test_huge_ranges_take_a_logarithmic_number_of_calls(lo, hi):
    t = lo + (hi - lo) // 3
    pred = Counted(lambda n: n <= t)
    assert largest_true(pred, lo, hi) == t
    _bracket(pred.calls, lo, hi)
    pred = Counted(lambda n: n > t)
    assert smallest_true(pred, lo, hi) == t + 1
    _bracket(pred.calls, lo, hi)


def test_nowhere_everywhere_and_empty():
    assert largest_true(lambda n: False, 3, 9) == 2
    assert largest_true(lambda n: True, 3, 9) == 9
    assert smallest_true(lambda n: False, 3, 9) == 10
    assert smallest_true(lambda n: True, 3, 9) == 3
    assert largest_true(lambda n: True, 5, 5) == 5 and largest_true(lambda n: False, 5, 5) == 4
    assert smallest_true(lambda n: True, 5, 5) == 5 and smallest_true(lambda n: False, 5, 5) == 6
    never = Counted(lambda n: True)
    assert largest_true(never, 5, 4) == 4 and smallest_true(never, 5, 4) == 5
    assert never.calls == []  # the empty range calls nothing


@given(st.integers(-500, 500), st.integers(-1, 400), st.integers(0, 2**32 - 1))
def test_same_points_as_the_textbook_loop_on_the_open_bracket(lo, width, seed):
    """Searching [a + 1, b - 1] calls pred at exactly the points the hand-written ``while b - a > 1`` loop
    on (a, b) calls, in order, and returns the same answer, even for a predicate that is not monotone."""
    a, b = lo, lo + width + 1
    bits = np.random.default_rng(seed).random(width + 2) < 0.5
    for largest, fn in ((True, largest_true), (False, smallest_true)):
        ours, theirs = Counted(lambda n: bool(bits[n - a])), Counted(lambda n: bool(bits[n - a]))
        assert fn(ours, a + 1, b - 1) == _textbook(theirs, a, b, largest)
        assert ours.calls == theirs.calls


@given(st.integers(-100, 100), st.integers(-1, 300), st.integers(0, 2**32 - 1))
def test_a_non_monotone_predicate_still_gives_a_flip(lo, width, seed):
    hi = lo + width
    bits = np.random.default_rng(seed).random(width + 1) < 0.5
    pred = lambda n: bool(bits[n - lo])  # noqa: E731
    n = largest_true(pred, lo, hi)
    assert n == lo - 1 or pred(n)
    assert n == hi or not pred(n + 1)
    m = smallest_true(pred, lo, hi)
    assert m == hi + 1 or pred(m)
    assert m == lo or not pred(m - 1)


def test_numpy_bounds_and_truthy_results():
    assert largest_true(lambda n: np.float64(max(0, 10 - n)), np.int64(0), np.int32(20)) == 9  # truthy below 10
    assert type(largest_true(lambda n: n < 7, np.int64(0), np.int64(20))) is int
    assert largest_true(lambda n: np.bool_(n < 7), np.int64(0), np.int64(20)) == 6
    assert type(smallest_true(lambda n: n > 7, np.uint8(0), np.uint8(20))) is int


@pytest.mark.parametrize("fn", [largest_true, smallest_true])
def test_bad_input_names_what_is_wrong(fn):
    with pytest.raises(ValueError, match=r"^pred must be a callable"):
        fn(3, 0, 4)
    for bad in (True, 1.0, "1", None, np.float64(1)):
        with pytest.raises(ValueError, match=r"^lo must be an integer \(python or numpy, not bool\), got "):
            fn(bool, bad, 4)
        with pytest.raises(ValueError, match=r"^hi must be an integer \(python or numpy, not bool\), got "):
            fn(bool, 0, bad)
    with pytest.raises(ValueError, match=r"^hi must be an integer >= lo - 1 = 4 \(hi = lo - 1 is the empty "
                                         r"range\), got hi = 3 with lo = 5$"):
        fn(bool, 5, 3)


def test_exceptions_from_the_predicate_propagate():
    def boom(n):
        raise KeyError(n)

    with pytest.raises(KeyError):
        largest_true(boom, 0, 10)
