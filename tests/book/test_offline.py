"""The built book references no external script, stylesheet, font or image: it works offline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.notebooks import ROOT

HTML = ROOT / "_build" / "html"
# Resources a browser fetches by itself: script/img/iframe src, stylesheet/icon/preload href.
RESOURCE = re.compile(
    r"<(?:script|img|iframe|source|audio|video)\b[^>]*\bsrc=[\"'](https?:)?//[^\"']+[\"']"
    r"|<link\b(?=[^>]*\brel=[\"'][^\"']*(?:stylesheet|icon|preload|modulepreload|prefetch)[^\"']*[\"'])[^>]*\bhref=[\"'](?:https?:)?//[^\"']+",
    re.I,
)
CSS_REMOTE = re.compile(r"(?:url\(\s*[\"']?|@import\s+[\"'])(?:https?:)?//", re.I)


def _pages() -> list[Path]:
    if not (HTML / "intro.html").is_file():
        pytest.fail("the book is not built: run ./book build (./book test builds it before this test)")
    return sorted(HTML.rglob("*.html"))


def test_no_remote_resources_in_pages():
    bad = {}
    for page in _pages():
        found = [m.group(0)[:120] for m in RESOURCE.finditer(page.read_text(encoding="utf-8", errors="replace"))]
        if found:
            bad[page.relative_to(HTML).as_posix()] = found
    assert not bad, f"pages load remote resources: {bad}"


def test_no_remote_urls_in_stylesheets():
    _pages()
    bad = [css.relative_to(HTML).as_posix() for css in HTML.rglob("*.css")
           if CSS_REMOTE.search(css.read_text(encoding="utf-8", errors="replace"))]
    assert not bad, f"stylesheets import remote fonts or images: {bad}"


def test_vendored_assets_are_served_locally():
    _pages()
    for rel in ("assets/mathjax/tex-chtml.js", "assets/require.js", "assets/widgets/embed-amd.js"):
        assert (HTML / rel).is_file(), f"{rel} missing from the built book"
    page = (HTML / "chapters" / "01-roofline" / "ridge-point.html").read_text(encoding="utf-8")
    assert "assets/mathjax/tex-chtml.js" in page and "assets/widgets/embed-amd.js" in page


def test_glued_numbers_rendered_in_pages():
    _pages()
    page = (HTML / "chapters" / "01-roofline" / "ridge-point.html").read_text(encoding="utf-8")
    assert "glue:text" not in page and "papermill.record" not in page
