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


def test_book_styles_and_script_are_served_locally():
    """The book's own stylesheet and script (_ext/static, served by _ext/live_study.py) are in the
    build and every page links them from _static, not from a remote host."""
    bad = []
    for page in _pages():
        rel = page.relative_to(HTML).as_posix()
        if rel.startswith(("_", "assets/")):
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        if 'http-equiv="Refresh"' in text:  # index.html only redirects to intro.html
            continue
        if not re.search(r'href="(\.\./)*_static/live-study\.css', text) or \
                not re.search(r'src="(\.\./)*_static/live-study\.js', text):
            bad.append(rel)
    assert not bad, f"pages without the book's stylesheet or script: {bad[:5]}"
    for rel in ("_static/live-study.css", "_static/live-study.js"):
        assert (HTML / rel).is_file(), f"{rel} missing from the built book"
