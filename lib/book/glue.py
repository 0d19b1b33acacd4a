"""Glue computed numbers into the book's prose (myst-nb ``{glue:text}``) as formatted text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_GLUED: dict[str, str] = {}


class GluedText:
    """A formatted number whose plain-text repr is the text itself (no quotes in the prose)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text)


def glue(name: str, value: Any, fmt: Callable[[Any], str] = str) -> Any:
    """Store ``fmt(value)`` under ``name`` for ``{glue:text}`name``` in the prose; return ``value``.

    Do not end a cell with a bare ``glue(...)``: the returned value would be displayed (and nbval
    ignores a trailing ``;``). End such cells with :func:`show`.
    """
    from myst_nb import glue as myst_glue

    text = fmt(value)
    _GLUED[name] = text
    myst_glue(name, GluedText(text), display=False)
    return value


def show(*names: str) -> None:
    """Print ``name: text`` for glued values, so a live reader sees what the prose will cite."""
    missing = [n for n in names if n not in _GLUED]
    if missing:
        raise ValueError(f"not glued yet: {missing}; glued so far: {sorted(_GLUED)}")
    width = max(len(n) for n in names)
    print("\n".join(f"{n:<{width}}  {_GLUED[n]}" for n in names))
