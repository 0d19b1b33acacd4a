"""Every glued text appears in its built page exactly as glued: no number turned into a tuple.

The book renders a citation {eval}`glued.NAME` from the stored glue output (_ext/eval_glue.py,
through myst-nb's text-pasting role, which evaluates the stored plain text as a Python literal:
a bare ``8,192`` once rendered as ``(8, 192)``; lib.book.glue stores a quoted string instead).
This test reads each notebook's glued texts from its stored outputs and looks for each one the
prose cites in the rendered HTML, and for no citation left unrendered.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from lib.book.glue import cited_names, glued_texts, split_inline_math
from tools.notebooks import ROOT, notebook_paths

HTML = ROOT / "_build" / "html"
TUPLE_NUMBER = re.compile(r"\(\d{1,3}, \d{3}\)")
NOTEBOOKS = notebook_paths()




def _as_rendered(text: str) -> str:
    """A glued text as the built page's text shows it: inline $...$ math becomes a math node, \\(...\\),
    set off by the spaces :func:`_text_of` leaves where its tags were."""
    return "".join(f" \\({piece}\\) " if is_math else piece for is_math, piece in split_inline_math(text))


def _text_of(page: str) -> str:
    """The page's visible text, tags dropped, entities decoded, Sphinx's smart quotes undone,
    white space folded."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_cited_glue_renders_as_glued(path):
    built = HTML / path.relative_to(ROOT).with_suffix(".html")
    if not built.is_file():
        pytest.fail(f"{built} is not built: run ./book build (./book test builds it first)")
    nb = json.loads(path.read_text(encoding="utf-8"))
    cited = set(cited_names("\n".join("".join(c["source"]) for c in nb["cells"]
                                       if c["cell_type"] == "markdown")))
    assert cited, "the prose cites no glued text"
    texts = glued_texts(nb)
    page = _text_of(built.read_text(encoding="utf-8"))
    missing = {n: texts[n] for n in cited if n in texts and " ".join(_as_rendered(texts[n]).split()) not in page}
    assert not missing, f"glued text not found verbatim in {built.name}: {missing}"
    assert "glued." not in page and "{eval}" not in page, "a citation was left unrendered"
    assert not TUPLE_NUMBER.search(page), f"a number rendered as a tuple: {TUPLE_NUMBER.search(page).group(0)}"


DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_citation_inside_display_math(path):
    """MathJax typesets $$...$$ itself: a citation inside it reaches the page as the literal
    ``{eval}`glued.NAME``` text (caught here without a build; the rendered check above needs one)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    inside = [m.group(1).strip()[:80] for c in nb["cells"] if c["cell_type"] == "markdown"
              for m in DISPLAY_MATH.finditer("".join(c["source"])) if "{eval}" in m.group(1)]
    assert not inside, f"citations inside $$ math (move the number out of the formula): {inside}"


MARKDOWN_IN_GLUE = re.compile(r"\*\*|`|^\s*\|", re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_cited_glue_is_plain_text(path):
    """A citation pastes its glued text as plain text: markdown inside (bold, code spans, table rows)
    would show literally on the page. Tables belong in a cell's output; emphasis in the prose."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cited = set(cited_names("\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")))
    texts = glued_texts(nb)
    marked = {n: texts[n][:60] for n in sorted(cited) if n in texts and MARKDOWN_IN_GLUE.search(texts[n])}
    assert not marked, f"glued texts cited in prose carry markdown: {marked}"
