"""Glue computed numbers into the book's prose (myst-nb ``{glue:text}``) as formatted text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class GluedText:
    """A formatted number whose plain-text repr is the text itself (no quotes in the prose)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.text)


def glue(name: str, value: Any, fmt: Callable[[Any], str] = str) -> Any:
    """Store ``fmt(value)`` under ``name`` for ``{glue:text}`name``` in the prose; return ``value``."""
    from myst_nb import glue as myst_glue

    myst_glue(name, GluedText(fmt(value)), display=False)
    return value
