"""Drafts as edits of the reference's own source (lib.book.drafts), used by the practice graders."""

from __future__ import annotations

import traceback

import pytest

from lib.book.drafts import edited, edited_class

SCALE = 10  # a module constant the drafts must see (they run in this module's namespace)


def clipped_total(xs: list[int], cap: int) -> int:
    """Sum of xs, each clipped to cap, times SCALE."""
    total = 0
    for x in xs:
        if x > cap:
            x = cap
        total += x
    return total * SCALE


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        if k < 0:
            raise ValueError("k must be >= 0")
        self.n += k
        return self.n


def test_an_edit_replaces_one_run_of_lines_keeping_relative_indentation():
    no_clip = edited(clipped_total, [("if x > cap:\nx = cap", "")], name="no_clip")
    assert no_clip([1, 5, 9], 4) == 150
    halves = edited(clipped_total, [("total += x", "if x % 2:\n    x -= 1\ntotal += x // 2")], name="halves")
    assert halves([1, 5, 9], 9) == (0 + 2 + 4) * SCALE
    assert clipped_total([1, 5, 9], 4) == 90  # the reference is untouched
    assert no_clip.__qualname__ == "clipped_total[no_clip]"


def twice(x: int) -> int:
    x += 1
    x += 1
    return x


def test_an_edit_must_match_exactly_once():
    with pytest.raises(ValueError, match="occur 0 times"):
        edited(clipped_total, [("total -= x", "total += x")], name="stale")
    with pytest.raises(ValueError, match="occur 2 times"):
        edited(twice, [("x += 1", "x += 2")], name="ambiguous")
    assert edited(twice, [("x += 1\nreturn x", "return x")], name="context")(0) == 1  # more lines: one place
    with pytest.raises(ValueError, match="at least one edit"):
        edited(clipped_total, [], name="empty")


def test_only_plain_functions_can_be_edited():
    with pytest.raises(ValueError, match="function or method"):
        edited(len, [("a", "b")], name="builtin")


def test_edited_class_overrides_the_named_methods_and_shows_its_lines_in_tracebacks():
    Lenient = edited_class(Counter, "Lenient", "Accepts negative k.",
                           add=[('raise ValueError("k must be >= 0")', 'raise RuntimeError("edited line")')])
    assert issubclass(Lenient, Counter) and Lenient.__doc__ == "Accepts negative k."
    assert Lenient.__init__ is Counter.__init__
    c = Lenient()
    assert c.add(3) == 3
    with pytest.raises(RuntimeError) as err:
        c.add(-1)
    frame = traceback.extract_tb(err.value.__traceback__)[-1]
    assert frame.line == 'raise RuntimeError("edited line")'
    assert frame.filename == "<draft Lenient of Counter.add>"
    with pytest.raises(ValueError, match=">= 0"):
        Counter().add(-1)
