"""Fixtures shared by the lib unit tests."""

import random

import pytest

from lib.book import widgets
from lib.book.widgets import Choice, FloatRange, IntRange


def _fuzz_explorer(name: str, n: int = 40, seed: int = 0) -> None:
    """Call explorer ``name`` with ``n`` seeded random arguments from its widget domains.

    Each call must return a view whose rows are (label, str) pairs, or raise ValueError (a
    combination the explorer refuses with a message). Integer ranges draw the ends, a uniform
    value and a small power of two; float ranges a uniform value; choices any option.
    """
    exp = widgets.registry()[name]
    rng = random.Random(seed)
    for _ in range(n):
        kw = {}
        for arg, dom in exp.domains.items():
            if isinstance(dom, Choice):
                kw[arg] = rng.choice(dom.options)
            elif isinstance(dom, IntRange):
                kw[arg] = rng.choice(
                    [
                        dom.low,
                        dom.high,
                        rng.randint(dom.low, dom.high),
                        min(dom.high, 2 ** rng.randint(0, 4)),
                    ]
                )
            elif isinstance(dom, FloatRange):
                kw[arg] = rng.uniform(dom.low, dom.high)
        try:
            view = exp.func(**kw)
        except ValueError:
            continue
        assert view.rows and all(isinstance(v, str) for _, v in view.rows)


@pytest.fixture
def fuzz_explorer():
    """``fuzz_explorer(name, n=40, seed=0)``: see :func:`_fuzz_explorer`."""
    return _fuzz_explorer
