"""Glue computed text into the book's prose (myst-nb ``{glue:text}``) without importing myst-nb.

myst-nb's ``glue(name, value, display=False)`` displays the value's mime bundle under the prefix
``application/papermill.record/`` with ``{"scrapbook": {"name", "mime_prefix"}}`` metadata, and
the book build reads it back from the stored outputs. Importing ``myst_nb`` to do that costs
3-4 s per kernel (it pulls in Sphinx), so :func:`glue` emits the same output itself;
``tests/unit/test_glue.py`` compares the two so a format change fails a test, not the book.

The text is glued as a Python string (its ``text/plain`` is the quoted repr): myst-nb's
``{glue:text}`` role evaluates plain text as a literal, so an unquoted ``8,192`` would render
as the tuple ``(8, 192)``; a quoted one renders exactly as glued.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

GLUE_PREFIX = "application/papermill.record/"
_GLUED: dict[str, str] = {}


def glue_output(name: str, text: str) -> tuple[dict, dict]:
    """(data, metadata) of the display output that glues ``text`` under ``name``."""
    return ({GLUE_PREFIX + "text/plain": repr(text)},
            {"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})


def glue(name: str, value: Any, fmt: Callable[[Any], str] = str) -> Any:
    """Store ``fmt(value)`` under ``name`` for ``{glue:text}`name``` in the prose; return ``value``.

    Do not end a cell with a bare ``glue(...)``: the returned value would be displayed (and nbval
    ignores a trailing ``;``). End such cells with :func:`show`.
    """
    from IPython.display import display

    text = fmt(value)
    if not isinstance(text, str):
        raise ValueError(f"fmt must return a str for glue {name!r}, got {type(text).__name__}")
    _GLUED[name] = text
    data, metadata = glue_output(name, text)
    display(data, raw=True, metadata=metadata)
    return value


def show(*names: str) -> None:
    """Print ``name: text`` for glued values, so a live reader sees what the prose will cite."""
    missing = [n for n in names if n not in _GLUED]
    if missing:
        raise ValueError(f"not glued yet: {missing}; glued so far: {sorted(_GLUED)}")
    width = max(len(n) for n in names)
    print("\n".join(f"{n:<{width}}  {_GLUED[n]}" for n in names))


def glued_texts(nb: dict) -> dict[str, str]:
    """{glue name: glued text} read back from a notebook's stored outputs (a notebook dict)."""
    out = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            text = o.get("data", {}).get(GLUE_PREFIX + "text/plain")
            if name is None or text is None:
                continue
            try:  # glued as a quoted string; outputs stored before that held the bare text
                value = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                value = text
            out[name] = value if isinstance(value, str) else text
    return out
