"""The built book in a real browser: every page loads without console errors, math is rendered,
and no request leaves 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.browser.conftest import HTML

PAGES = sorted(p.relative_to(HTML).as_posix() for p in HTML.rglob("*.html")
               if not p.relative_to(HTML).as_posix().startswith(("_", "assets/"))
               and p.name not in ("genindex.html", "search.html"))


@pytest.mark.parametrize("rel", PAGES)
def test_page_loads_offline_without_errors(book_page, book_url, rel):
    page = book_page
    page.goto(f"{book_url}/{rel}", wait_until="load")
    page.wait_for_load_state("networkidle")
    assert not page.outside_requests, f"requests left 127.0.0.1: {page.outside_requests}"
    assert not page.console_errors, f"console errors: {page.console_errors}"
    if page.locator(".math").count():
        page.wait_for_selector("mjx-container", state="attached", timeout=15000)
        raw = page.evaluate("""() => [...document.querySelectorAll('.math')]
            .filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60))""")
        assert not raw, f"math left as raw LaTeX: {raw[:3]}"


def test_question_page_folds_the_answer_and_links_to_lab(page, book_url):
    page.goto(f"{book_url}/chapters/01-roofline/decode-weight-floor.html", wait_until="networkidle")
    assert page.locator("details.toggle-details").count() >= 4, "answer sections are not folded"
    assert not page.locator("#worked-answer .cell_output").first.is_visible(), "worked answer visible before unfolding"
    link = page.locator("a.open-live-link")
    assert link.get_attribute("href").endswith("/lab/tree/chapters/01-roofline/decode-weight-floor.ipynb")
    assert page.locator(".jupyter-widgets").count() > 0, "the explorer's stored widget state did not render"


@pytest.mark.parametrize("width", [1280, 390])
def test_one_search_box_and_no_repeated_titles_in_the_sidebar(page, book_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="networkidle")
    boxes = [b for b in page.locator("button.search-button__button").all() if b.is_visible()]
    assert len(boxes) == 1, f"{len(boxes)} search boxes visible at {width} px"
    titles = [t.strip() for t in page.locator(".bd-sidebar-primary nav").locator("p.caption, a.reference").all_text_contents()]
    repeated = [a for a, b in zip(titles, titles[1:], strict=False) if a == b]
    assert titles and not repeated, f"the sidebar repeats {repeated}"
    book_title = page.locator(".navbar-brand").first.text_content().strip()
    assert titles.count(book_title) == 0, "the sidebar lists the book's title besides its logo"
