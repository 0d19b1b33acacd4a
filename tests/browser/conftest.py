"""Fixtures for the real-browser tests: Debian's Chromium driven by Playwright (no browser download).

Servers listen on 127.0.0.1 only: the built book (a static file server) and JupyterLab on the repo.
"""

from __future__ import annotations

import functools
import http.server
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tools.notebooks import ROOT

CHROMIUM = Path(os.environ.get("BOOK_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HTML = ROOT / "_build" / "html"
PHONE = {"width": 390, "height": 844}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float = 90) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not come up in {seconds} s")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="session")
def book_url():
    if not (HTML / "intro.html").is_file():
        pytest.fail("the book is not built: run ./book build (./book test builds it first)")
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Quiet, directory=str(HTML)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """(base URL, token) of a JupyterLab started on the repository for this test session."""
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", f"--port={port}",
           "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = (tmp_path_factory.mktemp("lab") / "lab.log").open("w")
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path_factory.mktemp("jupyter-config"))}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{base}/api/status?token={token}")
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} missing: ./book test installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh page that records console errors, page errors and requests leaving 127.0.0.1."""
    context, pg = open_guarded_page(browser)
    yield pg
    context.close()


@pytest.fixture(scope="session")
def _shared_page(browser):
    context, pg = open_guarded_page(browser)
    yield pg
    context.close()


@pytest.fixture(scope="session")
def _shared_phone_page(browser):
    context, pg = open_guarded_page(browser, viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=3)
    yield pg
    context.close()


@pytest.fixture
def phone_page(_shared_phone_page):
    """Like ``book_page``, in a phone's viewport (390x844, touch, mobile layout)."""
    _shared_phone_page.console_errors.clear()
    _shared_phone_page.outside_requests.clear()
    return _shared_phone_page


@pytest.fixture
def book_page(_shared_page):
    """One guarded page reused across tests (pages of the static book visit it in turn, about a
    second each), its error and request records cleared for each test."""
    _shared_page.console_errors.clear()
    _shared_page.outside_requests.clear()
    return _shared_page


def open_guarded_page(browser, viewport=None, **options):
    """(context, page): the page records console errors and aborts requests leaving 127.0.0.1."""
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900}, **options)
    pg = context.new_page()
    pg.console_errors, pg.outside_requests, pg.in_flight = [], [], set()
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    pg.on("request", lambda r: pg.in_flight.add(r))
    pg.on("requestfinished", lambda r: pg.in_flight.discard(r))
    pg.on("requestfailed", lambda r: pg.in_flight.discard(r))

    def guard(route):
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "data:", "blob:", "about:")):
            route.continue_()
        else:
            pg.outside_requests.append(url)
            route.abort()

    pg.route("**/*", guard)
    return context, pg


SETTLE_TIMEOUT_MS = 15000


def settle(pg) -> None:
    """Wait until a loaded book page has done its own work: MathJax has typeset (its startup
    promise), the explorer snapshots are drawn (their controls present and disabled) and no request
    is in flight. What Playwright's ``networkidle`` waits for, without its fixed 500 ms of quiet."""
    from playwright.sync_api import Error as PlaywrightError

    for attempt in range(3):  # a page that redirects (index.html's meta refresh) replaces the context once
        try:
            pg.evaluate("""async () => { if (window.MathJax && MathJax.startup && MathJax.startup.promise)
                                             await MathJax.startup.promise; }""")
            break
        except PlaywrightError as err:
            if "context was destroyed" not in str(err) or attempt == 2:
                raise
            pg.wait_for_load_state("load")
    if pg.locator(".explorer-snapshot").count():
        pg.wait_for_function("""() => {
            const c = [...document.querySelectorAll('.explorer-snapshot .cell_output :is(select, input, textarea)')];
            return c.length > 0 && c.every(e => e.disabled);
        }""", timeout=SETTLE_TIMEOUT_MS)
    waited = 0
    while pg.in_flight and waited < SETTLE_TIMEOUT_MS:
        pg.wait_for_timeout(10)
        waited += 10
    assert not pg.in_flight, f"requests still in flight after {SETTLE_TIMEOUT_MS} ms: {[r.url for r in pg.in_flight][:3]}"
