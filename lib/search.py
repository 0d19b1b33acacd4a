"""Integer bisection for a monotone predicate: the one search lib's "largest batch that fits" and
"shortest prompt that crosses" questions share.

:func:`largest_true` finds where a predicate that holds and then stops holding flips;
:func:`smallest_true` finds where one that fails and then starts holding flips. Both search an
inclusive range [lo, hi] and never call the predicate outside it, so a caller that has already
evaluated an endpoint (to return early, or after an exponential search for ``hi``) passes the range
without it. The bracket it halves is (lo - 1, hi + 1) with the midpoint ``(a + b) // 2``: searching
[lo + 1, hi - 1] evaluates the same points as the textbook loop ``while hi - lo > 1`` on (lo, hi).
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral

__all__ = ["largest_true", "smallest_true"]


def _bounds(pred: object, lo: object, hi: object) -> tuple[int, int]:
    if not callable(pred):
        raise ValueError(f"pred must be a callable taking an integer and returning a truth value, got {pred!r}")
    for name, v in (("lo", lo), ("hi", hi)):
        if not isinstance(v, Integral) or isinstance(v, bool):
            raise ValueError(f"{name} must be an integer (python or numpy, not bool), got {v!r}")
    lo, hi = int(lo), int(hi)
    if hi < lo - 1:
        raise ValueError(f"hi must be an integer >= lo - 1 = {lo - 1} (hi = lo - 1 is the empty range), "
                         f"got hi = {hi} with lo = {lo}")
    return lo, hi


def largest_true(pred: Callable[[int], object], lo: int, hi: int) -> int:
    """The largest integer n in [lo, hi] with ``pred(n)`` true, for a ``pred`` that is true and then
    false on [lo, hi] (pred(n) true implies pred(m) true for every lo <= m <= n).

    Returns lo - 1 when pred holds nowhere in the range (and for the empty range hi = lo - 1,
    without a call); hi when it holds everywhere. Bisection of the bracket (lo - 1, hi + 1), taking
    pred as true at lo - 1 and false at hi + 1 without calling it: pred is called only at points of
    [lo, hi], each at most once, floor(log2(hi - lo + 2)) to ceil(log2(hi - lo + 2)) times in all;
    lo and hi are not pre-checked (either may be called as a midpoint). For a ``pred`` that is not
    monotone the result is still a flip: n == lo - 1 or pred(n), and n == hi or not pred(n + 1).
    ValueError for a non-callable pred, non-integer bounds (bool excluded) or hi < lo - 1;
    exceptions from pred propagate.
    """
    lo, hi = _bounds(pred, lo, hi)
    yes, no = lo - 1, hi + 1
    while no - yes > 1:
        mid = (yes + no) // 2
        if pred(mid):
            yes = mid
        else:
            no = mid
    return yes


def smallest_true(pred: Callable[[int], object], lo: int, hi: int) -> int:
    """The smallest integer n in [lo, hi] with ``pred(n)`` true, for a ``pred`` that is false and
    then true on [lo, hi] (pred(n) true implies pred(m) true for every n <= m <= hi).

    Returns hi + 1 when pred holds nowhere in the range (and for the empty range hi = lo - 1,
    without a call); lo when it holds everywhere. Bisection of the bracket (lo - 1, hi + 1), taking
    pred as false at lo - 1 and true at hi + 1 without calling it: pred is called only at points of
    [lo, hi], each at most once, floor(log2(hi - lo + 2)) to ceil(log2(hi - lo + 2)) times in all;
    lo and hi are not pre-checked (either may be called as a midpoint). For a ``pred`` that is not
    monotone the result is still a flip: n == hi + 1 or pred(n), and n == lo or not pred(n - 1).
    ValueError for a non-callable pred, non-integer bounds (bool excluded) or hi < lo - 1;
    exceptions from pred propagate.
    """
    lo, hi = _bounds(pred, lo, hi)
    return largest_true(lambda n: not pred(n), lo, hi) + 1  # the same midpoints, the last false one plus one
