"""Glue computed text into the book's prose without importing myst-nb; ``glued`` cites it.

The prose cites a glued text as ``{eval}`glued.NAME``` (MyST's inline-expression role):

* in JupyterLab, jupyterlab-myst evaluates the expression in the kernel; ``glued.NAME`` is a small
  text widget that :func:`glue` fills, so a sentence placed above the cell that computes its
  number still shows that number once the cell has run, and follows it when the reader changes a
  parameter and runs again. ``./book execute`` also stores each cell's rendered texts in its
  metadata (``user_expressions``, jupyterlab-myst's format), so a notebook opened without
  running shows the numbers of its stored run;
* in the book, ``_ext/eval_glue.py`` renders the same role from the stored glue outputs.

myst-nb's ``glue(name, value, display=False)`` displays the value's mime bundle under the prefix
``application/papermill.record/`` with ``{"scrapbook": {"name", "mime_prefix"}}`` metadata, and
the book build reads it back from the stored outputs. Importing ``myst_nb`` to do that costs
3-4 s per kernel (it pulls in Sphinx), so :func:`glue` emits the same output itself;
``tests/unit/test_glue.py`` compares the two so a format change fails a test, not the book.

The text is glued as a Python string (its ``text/plain`` is the quoted repr): myst-nb's
text-pasting role, which the book's citations go through, evaluates plain text as a literal, so an unquoted ``8,192`` would render
as the tuple ``(8, 192)``; a quoted one renders exactly as glued.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

GLUE_PREFIX = "application/papermill.record/"
_GLUED: dict[str, str] = {}
_LIVE: dict[str, Any] = {}  # name -> the text widget shown in the prose (JupyterLab only)
PENDING = "\u2026"  # what a live citation shows until its cell has run
CITATION = re.compile(r"\{eval\}`([^`]*)`")  # a citation in a markdown cell: {eval}`glued.NAME`
_CITED_NAME = re.compile(r"glued\.([A-Za-z_][A-Za-z0-9_]*)")


def glue_output(name: str, text: str) -> tuple[dict, dict]:
    """(data, metadata) of the display output that glues ``text`` under ``name``."""
    return ({GLUE_PREFIX + "text/plain": repr(text)},
            {"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})


def plain_text(text: str) -> str:
    """``text`` without the inline markdown a citation cannot show: a citation pastes its glued text
    as plain text (in the book and in JupyterLab's live label), so ``**bold**`` and ```code``` would
    appear with their markers; the markers are dropped, the words kept. Emphasis belongs in the prose
    around a citation."""
    return re.sub(r"`([^`\n]*)`", r"\1", re.sub(r"\*\*(.+?)\*\*", r"\1", text, flags=re.S))


INLINE_MATH = re.compile(r"\$(?=\S)([^$\n]*?\S)\$(?!\d)")


def split_inline_math(text: str) -> list[tuple[bool, str]]:
    """``text`` cut into (is_math, piece) runs at inline ``$...$`` math: an opening ``$`` followed by
    a non-space, a closing ``$`` preceded by a non-space and not followed by a digit (pandoc's rule,
    so "$0.05 and $0.10" stays text)."""
    out, at = [], 0
    for m in INLINE_MATH.finditer(text):
        if m.start() > at:
            out.append((False, text[at:m.start()]))
        out.append((True, m.group(1)))
        at = m.end()
    if at < len(text):
        out.append((False, text[at:]))
    return out


def glue(name: str, value: Any, fmt: Callable[..., str] | None = None, *fmt_args: Any) -> Any:
    """Store ``fmt(value, *fmt_args)`` under ``name`` for ``{eval}`glued.name``` in the prose; return ``value``.

    ``fmt`` defaults to :func:`lib.units.fmt_auto` (ints with thousands separators, other values as
    ``str``); the formatters of :mod:`lib.units` take their unit and digits as ``fmt_args``:
    ``glue("kv", kv_bytes, fmt_bytes, "MiB")``, ``glue("speedup", s, fmt_ratio, 2)``.

    Do not end a cell with a bare ``glue(...)``: the returned value would be displayed (and nbval
    ignores a trailing ``;``). End such cells with :func:`show`.
    """
    from IPython.display import display

    if fmt is None:
        from lib.units import fmt_auto as fmt
    text = fmt(value, *fmt_args)
    if not isinstance(text, str):
        raise ValueError(f"fmt must return a str for glue {name!r}, got {type(text).__name__}")
    text = plain_text(text)
    _GLUED[name] = text
    if name in _LIVE:
        _LIVE[name].value = text
    data, metadata = glue_output(name, text)
    display(data, raw=True, metadata=metadata)
    return value


class Glued:
    """The prose's view of the glued texts: ``glued.NAME`` (in ``{eval}`glued.NAME```).

    Each attribute is a text widget (created on first use, one per name) showing the text glued
    under NAME, or an ellipsis until :func:`glue` has run for it. Only jupyterlab-myst evaluates
    these; code reads glued texts with :func:`text`.
    """

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in _LIVE:
            import ipywidgets

            _LIVE[name] = ipywidgets.Label(value=_GLUED.get(name, PENDING),
                                           layout=ipywidgets.Layout(margin="0", height="auto", width="auto"))
            _LIVE[name].add_class("book-glued").add_class(f"glued-{name}")  # the Lab test reads these
        return _LIVE[name]

    def __dir__(self):
        return sorted(_GLUED)


glued = Glued()


def forget() -> None:
    """Forget every glued text of this kernel, so a kernel reused for another notebook starts clean
    (tools.variant.SharedKernel)."""
    _GLUED.clear()


def text(name: str) -> str:
    """The text glued under ``name`` in this kernel (ValueError if nothing was glued under it)."""
    if name not in _GLUED:
        raise ValueError(f"not glued yet: {name!r}; glued so far: {sorted(_GLUED)}")
    return _GLUED[name]


def citation_name(expression: str) -> str:
    """NAME from a citation's expression ``glued.NAME`` (ValueError for any other expression)."""
    m = _CITED_NAME.fullmatch(expression.strip())
    if not m:
        raise ValueError(f"the prose cites glued texts only, as {{eval}}`glued.NAME`; got {expression!r}")
    return m.group(1)


def cited_names(markdown: str) -> list[str]:
    """The glue names a markdown text cites, in order (ValueError for a citation not of a glued name)."""
    return [citation_name(e) for e in CITATION.findall(markdown)]


def store_citations(nb) -> None:
    """Store, in each markdown cell's metadata, the texts its citations show (jupyterlab-myst's
    ``user_expressions``), from the glue outputs of ``nb`` (a notebook dict after a run), so a
    notebook opened without running shows the numbers of its stored run.

    Raises ValueError naming a cited name that the notebook never glues.
    """
    texts = glued_texts(nb)
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        expressions = list(dict.fromkeys(CITATION.findall(source)))
        if not expressions:
            cell.get("metadata", {}).pop("user_expressions", None)
            continue
        stored = []
        for expression in expressions:
            name = citation_name(expression)
            if name not in texts:
                raise ValueError(f"the prose cites glued.{name}, which this notebook never glues")
            stored.append({"expression": expression,
                           "result": {"status": "ok", "data": {"text/plain": texts[name]}, "metadata": {}}})
        cell.setdefault("metadata", {})["user_expressions"] = stored


def show(*names: str) -> None:
    """Print ``name: text`` for glued values, so a live reader sees what the prose will cite."""
    texts = [text(n) for n in names]
    width = max(len(n) for n in names)
    print("\n".join(f"{n:<{width}}  {t}" for n, t in zip(names, texts, strict=True)))


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
