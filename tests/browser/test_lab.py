"""JupyterLab in a real browser: the prose shows numbers (stored, then live after Run All); run all,
move a control of the explorer and see the value lib computes for the new input; and follow a book
page's open-live link into Lab."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest
import yaml

from lib.book.glue import cited_names, glued_texts
from lib.perf import roofline
from lib.units import sig
from tools.notebooks import ROOT

# every Lab test on one worker, so one JupyterLab server starts (the static book's page checks
# spread over both workers: ./book test runs this folder with -n 2 --dist loadgroup)
pytestmark = pytest.mark.xdist_group("lab")

NOTEBOOK = "chapters/01-roofline/ridge-point.ipynb"


def _open_lab(page, lab, path: str) -> None:
    base, token = lab
    # reset: start from an empty workspace, not with the notebooks an earlier test left open
    page.goto(f"{base}/lab/tree/{path}?reset&token={token}", wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=60000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90000)


def _menu(page, menu: str, item: str) -> None:
    page.get_by_role("menuitem", name=menu, exact=True).click()
    page.get_by_role("menuitem", name=item, exact=True).click()


def _expand_all(page) -> None:
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Escape")
    # the answer headings open collapsed (so an interviewer can share the screen): expand them
    page.keyboard.press("Control+Shift+ArrowRight")  # Expand All Headings
    page.wait_for_function("() => !document.querySelector('.jp-collapseHeadingButton.jp-mod-collapsed')")


def _prose(page) -> str:
    return "\n".join(page.locator(".jp-MarkdownCell").all_inner_texts())


PLACEHOLDERS = re.compile(r"\{glue|\{eval\}|glued\.")


@pytest.mark.parametrize("notebook", ["chapters/01-roofline/ridge-point.ipynb",
                                      "chapters/02-kv-cache/kv-per-sequence.ipynb"])
def test_prose_shows_numbers_stored_then_live(page, lab, notebook):
    """Opened: the prose shows the stored run's numbers. After Run All in a fresh kernel (including
    sentences above the cell that computes their number): every citation shows the glued text."""
    nb = json.loads((ROOT / notebook).read_text(encoding="utf-8"))
    texts = glued_texts(nb)
    cited = sorted(set(cited_names("\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"))))
    _open_lab(page, lab, notebook)
    _expand_all(page)
    page.wait_for_function("n => [...document.querySelectorAll('.jp-MarkdownCell')].filter(c => c.innerText.trim()).length >= n",
                           arg=8, timeout=30000)  # jupyterlab-myst renders cells asynchronously
    prose = _prose(page)
    assert not PLACEHOLDERS.search(prose), f"placeholder in the prose before running: {PLACEHOLDERS.search(prose).group(0)}"
    assert texts["ridge" if "ridge" in texts else next(iter(texts))] in prose
    _menu(page, "Kernel", "Restart Kernel and Run All Cells…")
    page.get_by_role("button", name="Confirm Kernel Restart").click()
    page.locator(".jp-OutputArea-output", has_text=re.compile(r"all \d+ checks passed")).first.wait_for(state="attached", timeout=180000)
    shown_js = ("() => [...document.querySelectorAll('.book-glued')].map(e => "
                "[([...e.classList].find(c => c.startsWith('glued-')) || 'glued-').slice(6), e.innerText]).filter(p => p[0])")
    # (a label whose glued-NAME class has not arrived yet is left out: ipywidgets may add a widget's classes
    # one sync at a time)
    page.wait_for_function(f"want => new Set(({shown_js})().map(p => p[0])).size >= want", arg=len(cited), timeout=60000)
    page.wait_for_function(f"() => !({shown_js})().some(p => p[1].trim() === '\u2026')", timeout=30000)
    shown = page.evaluate(shown_js)
    assert sorted({name for name, _ in shown}) == cited, "not every citation is live after Run All"
    wrong = {name: (text, texts.get(name)) for name, text in shown if text != texts.get(name)}
    assert not wrong, f"live citation differs from the glued text (shown, glued): {wrong}"
    prose = _prose(page)
    assert not PLACEHOLDERS.search(prose), f"placeholder in the prose after Run All: {PLACEHOLDERS.search(prose).group(0)}"
    assert not page.outside_requests, f"requests left 127.0.0.1: {page.outside_requests}"


def test_run_all_then_change_an_explorer_input(browser, lab):
    """One retry on a fresh page: after many page loads Lab's lazy cell rendering has flaked once."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from tests.browser.conftest import open_guarded_page

    for attempt in (1, 2):
        context, page = open_guarded_page(browser)
        try:
            _run_all_and_change_an_input(page, lab)
            return
        except PlaywrightTimeout:
            if attempt == 2:
                raise
        finally:
            context.close()


def _run_all_and_change_an_input(page, lab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    _open_lab(page, lab, NOTEBOOK)
    _expand_all(page)
    _menu(page, "Edit", "Clear Outputs of All Cells")  # so the checks verdict below is from this run
    _menu(page, "Run", "Run All Cells")
    page.locator(".jp-OutputArea-output", has_text=re.compile(r"all \d+ checks passed")).first.wait_for(state="attached", timeout=180000)
    # the live explorer (the newest render), scrolled on screen; force= skips Playwright's visibility
    # wait, which JupyterLab's lazy rendering of off-screen cells can otherwise trip
    explorer = page.locator(".widget-vbox").filter(has=page.locator("table.explorer-table")).last
    explorer.evaluate("e => e.scrollIntoView({block: 'center'})")
    table = explorer.locator("table.explorer-table")
    assert "295" in table.inner_text()  # H100 SXM BF16 ridge, as lib computes it
    dropdown = explorer.locator("select").first  # gpu
    dropdown.select_option("b200", force=True)
    expected = sig(roofline.ridge_point("b200", "bf16"))
    page.wait_for_function(
        "([sel, want]) => [...document.querySelectorAll(sel)].some(t => t.innerText.includes(want + ' FLOP/byte'))",
        arg=["table.explorer-table", expected], timeout=30000)
    # move the M slider one step with the keyboard: M 1 -> 2 doubles the GEMM's intensity
    slider = explorer.locator(".widget-slider .ui-slider-handle, .widget-slider [role='slider']").first
    slider.evaluate("e => e.scrollIntoView({block: 'center'})")
    # the figure's legend names the GEMM the explorer drew ("GEMM Mx28672x8192"): press until it
    # shows an M above 1 (a key press can be lost while Lab re-renders under load, so at most
    # three presses), then expect the table's intensity for that M as lib computes it
    drawn_m = "() => Math.max(0, ...[...document.querySelectorAll('.widget-vbox svg text')].map(t => (t.textContent.match(/GEMM (\\d+)x28672x8192/) || [0, 0])[1] * 1))"
    for _ in range(3):
        slider.focus()
        slider.press("ArrowRight")
        try:
            page.wait_for_function(f"() => ({drawn_m})() >= 2", timeout=10000)
            break
        except PlaywrightTimeout:
            continue
    m = page.evaluate(drawn_m)
    flops, nbytes = roofline.gemm_flops_bytes(max(m, 2), 28672, 8192)
    want = sig(flops / nbytes)
    page.wait_for_function(
        "([sel, want]) => [...document.querySelectorAll(sel)].some(t => t.innerText.includes(want + ' FLOP/byte'))",
        arg=["table.explorer-table", want], timeout=30000)
    assert not page.outside_requests, f"requests left 127.0.0.1: {page.outside_requests}"


def test_open_live_link_lands_on_the_notebook(page, lab, book_url):
    page.goto(f"{book_url}/chapters/01-roofline/ridge-point.html", wait_until="networkidle")
    href = page.locator("a.open-live-link").get_attribute("href")
    configured = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]["live_lab_url"]
    assert href.startswith(configured.rstrip("/") + "/lab/tree/")
    # the book was built for the study command's Lab; point the same path at this session's Lab
    base, token = lab
    page.goto(f"{base}/lab?token={token}", wait_until="domcontentloaded")  # log in once, like a reader
    page.goto(base + urlparse(href).path, wait_until="domcontentloaded")
    page.wait_for_selector(".jp-Notebook", timeout=60000)
    tab = page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabLabel, .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
    assert any("ridge-point.ipynb" in t for t in tab.all_inner_texts())
