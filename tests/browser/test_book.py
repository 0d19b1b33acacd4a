"""The built book in a real browser: every page loads without console errors, math is rendered,
and no request leaves 127.0.0.1; explorers are labelled frozen snapshots (readable in dark mode),
code wraps in print, a phone can open the navigation and nothing runs off its screen, and search
finds the field's names in prose, not code."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest

from lib.book.glue import glued_texts
from tests.browser.conftest import HTML, settle
from tools.notebooks import ROOT, notebook_paths

NOTEBOOKS = notebook_paths()
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

PAGES = sorted(p.relative_to(HTML).as_posix() for p in HTML.rglob("*.html")
               if not p.relative_to(HTML).as_posix().startswith(("_", "assets/"))
               and p.name not in ("genindex.html", "search.html"))


@pytest.mark.parametrize("rel", PAGES)
def test_page_loads_offline_without_errors(book_page, book_url, rel):
    page = book_page
    page.goto(f"{book_url}/{rel}", wait_until="load")
    settle(page)
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


def test_question_page_says_how_to_go_live(book_page, book_url):
    page = book_page
    page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="load")
    line = page.locator("p.open-live")
    assert line.count() == 1, "the question page lacks its 'run it live' line"
    text = " ".join(line.text_content().split())
    for needed in ("repository", "./book study", "./book test"):
        assert needed in text, f"the 'run it live' line does not mention {needed!r}: {text}"
    link = line.locator("a.open-live-link")
    assert "local JupyterLab" in link.text_content(), "the live link does not say it needs the local Lab"


# ---- explorers: a labelled snapshot whose controls do not move -------------------------------

def test_every_stored_explorer_is_labelled_a_snapshot():
    unlabelled = []
    for built in sorted((HTML / "chapters").glob("*/*.html")):
        page = built.read_text(encoding="utf-8")
        for cell in re.findall(r'<div class="cell [^"]*">.*?(?=<div class="cell |</section>)', page, re.S):
            if "explore</span><span class=\"p\">(" in cell and WIDGET_VIEW in cell:
                if "explorer-snapshot" not in cell.split(">", 1)[0] or "explorer-snapshot-note" not in cell:
                    unlabelled.append(built.relative_to(HTML).as_posix())
    assert not unlabelled, f"explorers not labelled as snapshots on: {unlabelled}"


def test_static_explorer_is_a_frozen_snapshot(book_page, book_url):
    page = book_page
    page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="networkidle")
    note = " ".join(page.locator(".explorer-snapshot .explorer-snapshot-note").first.text_content().split())
    assert note.startswith("Snapshot at this page's default inputs") and "open this notebook live" in note, note
    settle(page)  # every dropdown and number box disabled once the widgets are drawn
    sliders = page.evaluate("""() => [...document.querySelectorAll('.explorer-snapshot .noUi-target')]
        .map(s => s.hasAttribute('disabled') && getComputedStyle(s).pointerEvents === 'none')""")
    assert sliders and all(sliders), f"explorer sliders still movable: {sliders}"
    assert not page.console_errors, f"console errors: {page.console_errors}"


CONTRAST = """(el) => {
  const rgba = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map(v => v / 255)
      .map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)
      .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  let bg = null;
  for (let e = el; e && !bg; e = e.parentElement) {
    const c = rgba(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || c[3] > 0.5) bg = c;
  }
  const [hi, lo] = [lum(rgba(getComputedStyle(el).color)), lum(bg)].sort((a, b) => b - a);
  return (hi + 0.05) / (lo + 0.05);
}"""


def test_explorer_reads_in_dark_mode(book_page, book_url):
    page = book_page
    page.emulate_media(color_scheme="dark")
    try:
        page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="networkidle")
        assert page.evaluate("document.documentElement.dataset.theme") == "dark"
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        settle(page)
        panel = page.locator(".explorer-snapshot .widget-subarea").first
        for what, target in (("the explorer's label", panel.locator(".widget-html-content code").first),
                             ("a control's label", panel.locator(".widget-label:visible").first),
                             ("the snapshot note", page.locator(".explorer-snapshot-note").first)):
            ratio = target.evaluate(CONTRAST)
            assert ratio >= 4.5, f"{what} has a contrast of {ratio:.1f}:1 in dark mode (WCAG asks 4.5)"
    finally:
        page.emulate_media(color_scheme="light")


def test_print_wraps_long_code_lines(book_page, book_url):
    page = book_page
    page.emulate_media(media="print")
    try:
        page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="load")
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        cut = page.evaluate("""() => [...document.querySelectorAll('div.cell div.highlight pre')]
            .filter(p => getComputedStyle(p).whiteSpace !== 'pre-wrap' || p.scrollWidth > p.clientWidth + 1).length""")
        assert cut == 0, f"{cut} code blocks cut at the margin in print"
    finally:
        page.emulate_media(media="screen")


# ---- phones -----------------------------------------------------------------------------------

# Elements past the right edge of the viewport. Code, tables and display math may scroll sideways
# inside their own box; a box that clips (overflow hidden) hides what it cuts on purpose; anything
# else must fit, explorer controls included.
OVERFLOWING = """() => {
  const limit = window.innerWidth + 1, bad = [];
  const walk = (el) => {
    const s = getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden') return;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > limit)
      bad.push(`${el.tagName.toLowerCase()}.${String(el.className.baseVal ?? el.className).split(' ')[0]} ends at ${Math.round(r.right)} px`);
    if (['hidden', 'clip'].includes(s.overflowX)) return;
    if (['auto', 'scroll'].includes(s.overflowX)
        && el.matches('pre, table, .math, mjx-container, div.highlight, .pst-scrollable-table-container')) return;
    for (const child of el.children) walk(child);
  };
  walk(document.body);
  return bad;
}"""
PHONE_PAGES = ["chapters/01-roofline/ridge-point.html", "chapters/02-kv-cache/radix-prefix-cache.html",
               "chapters/02-kv-cache/fp8-kv-cache-scales.html"]


def test_phone_navigation_drawers_open(phone_page, book_url):
    page = phone_page
    page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="networkidle")
    page.locator(".primary-toggle:visible").first.click()
    page.wait_for_function("document.getElementById('pst-primary-sidebar-modal').open", timeout=5000)
    chapter = page.locator("#pst-primary-sidebar-modal a.reference", has_text="KV cache and GPU memory")
    assert chapter.first.is_visible(), "the navigation drawer shows no chapter link"
    page.keyboard.press("Escape")
    page.wait_for_function("!document.getElementById('pst-primary-sidebar-modal').open", timeout=5000)
    page.locator(".secondary-toggle:visible").first.click()
    page.wait_for_function("document.getElementById('pst-secondary-sidebar-modal').open", timeout=5000)
    assert page.locator("#pst-secondary-sidebar-modal a[href='#worked-answer']").first.is_visible(), \
        "the page-contents drawer does not list the page's sections"
    page.keyboard.press("Escape")
    assert not page.console_errors, f"console errors: {page.console_errors}"


@pytest.mark.parametrize("rel", PHONE_PAGES)
def test_phone_page_fits_the_viewport(phone_page, book_url, rel):
    page = phone_page
    page.goto(f"{book_url}/{rel}", wait_until="networkidle")
    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    if page.locator(".explorer-snapshot").count():
        settle(page)
    width, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= inner, f"{rel} is {width} px wide in a {inner} px viewport"
    bad = page.evaluate(OVERFLOWING)
    assert not bad, f"{rel}: {len(bad)} elements run past the right edge, e.g. {bad[:5]}"
    cut = page.evaluate("""() => [...document.querySelectorAll('.explorer-snapshot .widget-subarea')].flatMap(panel => {
        const edge = panel.getBoundingClientRect().right + 0.5;
        return [...panel.querySelectorAll('select, input, textarea, .slider')]
            .filter(c => c.getBoundingClientRect().right > edge).map(c => c.tagName.toLowerCase());
    })""")
    assert not cut, f"{rel}: explorer controls run past their panel: {cut}"
    unscrollable = page.evaluate("""() => [...document.querySelectorAll('div.cell pre')]
        .filter(p => p.scrollWidth > p.clientWidth + 1 && !['auto', 'scroll'].includes(getComputedStyle(p).overflowX)).length""")
    assert unscrollable == 0, f"{rel}: {unscrollable} code blocks are cut instead of scrolling"


# ---- where to start, the glossary and search ------------------------------------------------------

def test_front_page_starts_candidates_on_roofline(book_page, book_url):
    page = book_page
    page.goto(f"{book_url}/intro.html", wait_until="load")
    assert page.locator("section#start-here").count() == 1, "the front page has no 'Start here'"
    assert page.locator("a.right-next").get_attribute("href").endswith("chapters/01-roofline/index.html"), \
        "the front page's Next link does not lead to the first section"
    hrefs = [h.split("#")[0] for h in page.locator(".bd-sidebar-primary nav a.reference").evaluate_all(
        "links => links.map(a => a.getAttribute('href'))")]
    assert hrefs.index("chapters/01-roofline/index.html") < hrefs.index("interviewer-index.html"), \
        "the sidebar lists the interviewer's index before the sections"
    assert "glossary.html" in hrefs, "the glossary is not in the sidebar"


def test_glossary_defines_the_fields_terms():
    page = (HTML / "glossary.html").read_text(encoding="utf-8")
    terms = re.findall(r'<dt id="term-[^"]*">([^<]+)<', page)
    assert 25 <= len(terms) <= 60, f"the glossary defines {len(terms)} terms"
    for term in ("Roofline", "Ridge point", "MBU", "MFU", "TTFT", "TPOT", "KV cache", "PagedAttention",
                 "RadixAttention", "Continuous batching", "Chunked prefill", "Prefix caching", "GQA", "MLA",
                 "MoE", "Tensor parallelism", "All-reduce", "NVLink", "FlashAttention", "Speculative decoding",
                 "Goodput"):
        assert term in terms, f"the glossary lacks {term!r}"


def _search_index() -> dict:
    text = (HTML / "searchindex.js").read_text(encoding="utf-8")
    return json.loads(text[text.index("(") + 1:text.rindex(")")])


def test_search_index_holds_prose_not_code():
    from sphinx.search.en import SearchEnglish

    raw = (HTML / "searchindex.js").read_text(encoding="utf-8")
    assert "glue(" not in raw, "glue calls reached the search index"
    index = _search_index()
    terms = set(index["terms"]) | set(index["titleterms"])
    code, prose = set(), set()
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            words = set(re.findall(r"\w+", "".join(cell["source"]).lower()))
            (code if cell["cell_type"] == "code" else prose).update(words)
        for text in glued_texts(nb).values():  # what code glues into the prose is prose
            prose |= set(re.findall(r"\w+", text.lower()))
    for md in ROOT.glob("**/*.md"):
        if not md.relative_to(ROOT).parts[0].startswith(("_build", ".venv", "vendor", "node_modules")):
            prose |= set(re.findall(r"\w+", md.read_text(encoding="utf-8").lower()))
    stem = SearchEnglish({}).stem
    # identifiers only code uses (names with an underscore: glue keys, lib calls, variables)
    prose_stems = {stem(w) for w in prose}
    leaked = sorted(w for w in code - prose if "_" in w.strip("_") and stem(w) in terms - prose_stems)
    assert not leaked, f"{len(leaked)} code identifiers are in the search index, e.g. {leaked[:8]}"


def _search(page, book_url, query):
    page.goto(f"{book_url}/search.html?q={quote(query)}", wait_until="networkidle")
    # the summary line is filled in once every result (and its snippet) is shown
    page.wait_for_function("(document.querySelector('#search-results p.search-summary') || {}).textContent",
                           timeout=15000)
    return page.evaluate("""() => [...document.querySelectorAll('#search-results li')].map(li => [
        li.querySelector('a').getAttribute('href'), (li.querySelector('p.context') || {}).textContent || ''])""")


@pytest.mark.parametrize(("query", "page_expected"), [
    ("PagedAttention", "chapters/02-kv-cache/index.html"),
    ("RadixAttention", "chapters/02-kv-cache/radix-prefix-cache.html"),
    ("continuous batching", "glossary.html"),
])
def test_search_finds_the_fields_names(book_page, book_url, query, page_expected):
    results = _search(book_page, book_url, query)
    pages = [href.split("#")[0] for href, _ in results]
    assert page_expected in pages, f"searching {query!r} does not find {page_expected}: {pages}"
    code = [snippet for _, snippet in results if re.search(r"\bglue\(|\bexplore\(|^from lib|\bimport\b", snippet)]
    assert not code, f"search snippets show code: {code[:2]}"


@pytest.mark.parametrize(("query", "page_expected"), [
    ("KV cache size", "chapters/02-kv-cache/kv-per-sequence.html"),
    ("ridge point", "chapters/01-roofline/ridge-point.html"),
    ("memory budget", "chapters/02-kv-cache/kv-capacity-memory-budget.html"),
])
def test_the_page_named_by_the_query_ranks_first(book_page, book_url, query, page_expected):
    """The page whose title holds the query comes first among the pages (glossary entries aside):
    _ext/search_scorer.js; Sphinx alone ties every page with the words in any heading."""
    pages = [href.split("#")[0] for href, _ in _search(book_page, book_url, query)]
    pages = [p for p in pages if p != "glossary.html"]
    assert pages and pages[0] == page_expected, f"searching {query!r}: {pages[:5]}"
