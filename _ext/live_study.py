"""Sphinx extension for the book's question pages.

* Folds the answer: the body of "Worked answer", "Explore", "Where it breaks" and "Interviewer's
  notes" goes behind a toggle (sphinx-togglebutton), so the question, hints and parameters show
  first and an interviewer can share the page without giving the answer away.
* Serves the widget manager's fonts from the vendored copy, lets it typeset through MathJax 3,
  removes duplicate script tags and gives first-time readers the "auto" colour mode (the theme
  logs an error when none is set).
* Says under each question's title how to run it live (clone the repository, ``./book study``;
  ``./book test`` runs every check) and links the same notebook in JupyterLab. The link's base URL
  is the config value ``live_lab_url`` (the Lab that ``./book study`` starts on 127.0.0.1),
  overridable at build time with the environment variable ``BOOK_LAB_URL`` for a book hosted
  elsewhere; the repository's address is ``book_repository_url`` (env ``BOOK_REPOSITORY_URL``).
* Labels every explorer (a code cell tagged ``nbval-ignore-output`` that calls ``explore(...)`` and
  stored a widget) as a snapshot at the page's default inputs; ``static/live-study.js`` freezes its
  controls, since no kernel answers them in the static book.
* Serves ``static/live-study.css`` and ``static/live-study.js`` on every page: the snapshot panel
  (readable in dark mode too), sidebar buttons that work at phone widths, code that scrolls inside
  its box, controls and figures that fit a phone, long code lines wrapped in print, and search
  result snippets without code.
* Keeps code cells (sources and outputs: glue calls, widget reprs) and the per-page "run it live"
  boilerplate out of the search index, so a search matches the prose.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from urllib.parse import urlparse

from docutils import nodes

STATIC = Path(__file__).parent / "static"
FOLDED_SECTIONS = ("Worked answer", "Explore", "Where it breaks", "Interviewer's notes")
CHECKS_NOTE = ("The checks cell is hidden in the book: it asserts this page's headline numbers against "
               "published values or a second method, and CI re-runs it on every change. Open the notebook "
               "live to read it.")
NO_SEARCH = "no-search"  # class of the nodes the search index leaves out
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _is_question_page(app, docname: str) -> bool:
    return docname.startswith("chapters/") and str(app.env.doc2path(docname)).endswith(".ipynb")


def _lab_base(app) -> str:
    return (os.environ.get("BOOK_LAB_URL") or app.config.live_lab_url).rstrip("/")


def _is_local(url: str) -> bool:
    return (urlparse(url).hostname or "") in ("127.0.0.1", "localhost", "::1")


def _repository(app) -> str:
    url = os.environ.get("BOOK_REPOSITORY_URL") or app.config.book_repository_url
    if not url:
        return "the book's repository"
    return f'the book\'s repository (<a href="{html.escape(url)}">{html.escape(url)}</a>)'


def go_live_html(app, docname: str) -> str:
    """One line under the title: how to get the live notebook, and the link to it."""
    base = _lab_base(app)
    href = html.escape(f"{base}/lab/tree/{docname}.ipynb")
    how = (f"clone {_repository(app)} and run <code>./book study</code> (it serves this book and starts "
           "JupyterLab on your machine; <code>./book test</code> runs every check)")
    if _is_local(base):
        return (f'<p class="open-live"><strong>Run it live:</strong> {how}, then '
                f'<a class="open-live-link" href="{href}">open this question in the local JupyterLab '
                "(needs <code>./book study</code> running)</a>.</p>")
    host = html.escape(urlparse(base).netloc or base)
    return (f'<p class="open-live"><strong>Run it live:</strong> <a class="open-live-link" href="{href}">'
            f"open this question in JupyterLab on {host}</a>, or {how}.</p>")


def snapshot_note_html(app, docname: str) -> str:
    """The label above a stored explorer: what it shows and how to make it move."""
    href = html.escape(f"{_lab_base(app)}/lab/tree/{docname}.ipynb")
    where = ("the local JupyterLab that <code>./book study</code> starts" if _is_local(_lab_base(app))
             else "JupyterLab")
    return ('<p class="explorer-snapshot-note"><strong>Snapshot</strong> at this page\'s default inputs: '
            "in the static book its controls are frozen and the view below does not change. To move them, "
            f'<a href="{href}">open this notebook live</a> in {where}.</p>')


def _text(node) -> str:
    return node.astext() if node is not None else ""


def mark_explorers(app, doctree) -> int:
    """Label each explorer cell (tag nbval-ignore-output, calls explore(...), stored a widget view)
    as a snapshot: a class for the stylesheet and script, and a note between its code and output."""
    count = 0
    for cell in list(doctree.findall(nodes.container)):
        if cell.get("nb_element") != "cell_code" or "tag_nbval-ignore-output" not in cell["classes"]:
            continue
        source = next((c for c in cell.children if "cell_input" in c.get("classes", ())), None)
        output = next((c for c in cell.children if "cell_output" in c.get("classes", ())), None)
        if output is None or "explore(" not in _text(source):
            continue
        if not any(n.get("mime_type") == WIDGET_VIEW for n in output.findall(nodes.container)):
            continue  # no stored widget (e.g. the explorer refused the page's inputs): nothing looks live
        cell["classes"].append("explorer-snapshot")
        note = nodes.raw("", snapshot_note_html(app, app.env.docname), format="html", classes=[NO_SEARCH])
        cell.insert(cell.index(output), note)
        count += 1
    return count


def fold_answers(app, doctree) -> None:
    docname = app.env.docname
    if not _is_question_page(app, docname):
        return
    for section in list(doctree.findall(nodes.section)):
        if not section.children or not isinstance(section[0], nodes.title):
            continue
        title = section[0].astext().replace("\u2019", "'")
        if title == "Checks" and len(section.children) == 1:
            section.append(nodes.paragraph(text=CHECKS_NOTE))
        if title not in FOLDED_SECTIONS:
            continue
        body = section.children[1:]
        fold = nodes.container(classes=["toggle", "answer-fold"])
        for child in body:
            section.remove(child)
            fold.append(child)
        section.append(fold)
    mark_explorers(app, doctree)
    link = nodes.raw("", go_live_html(app, docname), format="html", classes=[NO_SEARCH])
    titles = list(doctree.findall(nodes.title))
    if titles:
        top = titles[0].parent
        top.insert(top.index(titles[0]) + 1, link)


def searchable(doctree):
    """A copy of ``doctree`` without code cells (their sources and outputs) and the nodes marked
    ``no-search``: what the search index should see of a page."""
    copy = doctree.deepcopy()
    drop = [n for n in copy.findall(nodes.Element)
            if n.get("nb_element") == "cell_code" or NO_SEARCH in n.get("classes", ())]
    for node in drop:
        if node.parent is not None:
            node.parent.remove(node)
    return copy


def index_prose_only(app) -> None:
    """Feed the search index the page without its code: Sphinx has no hook to filter what it
    indexes, so wrap this builder's ``index_page`` (called once per page, in the main process)."""
    builder = app.builder
    original = getattr(builder, "index_page", None)
    if original is None or getattr(original, "_prose_only", False):
        return

    def index_page(pagename, doctree, title):
        original(pagename, searchable(doctree), title)

    index_page._prose_only = True
    builder.index_page = index_page


def add_static_path(app, config) -> None:
    config.html_static_path = [*config.html_static_path, str(STATIC)]


# The widget manager (an AMD module loaded by require.js) locates its font files relative to where
# require.js resolves its module name; map that name to the vendored copy, from any page depth.
WIDGETS_REQUIRE_CONFIG = (
    "var require = {paths: {'@jupyter-widgets/html-manager/dist': "
    "document.documentElement.dataset.content_root + 'assets/widgets'}};"
)
# The theme logs a console error when no colour mode is stored yet; start first-time readers on auto.
DEFAULT_MODE = "document.documentElement.dataset.mode = document.documentElement.dataset.mode || 'auto';"


# The widget manager typesets widget labels through MathJax 2's MathJax.Hub.Queue; the book loads
# MathJax 3. Give both the config object and the loaded MathJax a Hub that forwards to MathJax 3.
MATHJAX2_SHIM = """(function () {
  function shim() {
    var mj = window.MathJax;
    if (mj && !mj.Hub) {
      mj.Hub = {Queue: function (job) {
        var el = job && job[2];
        if (el && window.MathJax.typesetPromise) { window.MathJax.typesetPromise([el]).catch(function () {}); }
      }};
    }
  }
  shim();
  document.addEventListener("DOMContentLoaded", shim);
  window.addEventListener("load", shim);
})();"""


def dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated script entries (sphinx-thebe registers its inline config twice)."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", script) or "", repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.add_config_value("live_lab_url", "http://127.0.0.1:8888", "html")
    app.add_config_value("book_repository_url", "", "html")
    app.connect("config-inited", add_static_path)
    app.add_css_file("live-study.css")
    app.add_js_file("live-study.js", defer="defer")
    app.add_js_file(None, body=WIDGETS_REQUIRE_CONFIG + " " + DEFAULT_MODE, priority=100)
    app.add_js_file(None, body=MATHJAX2_SHIM, priority=999)
    app.connect("html-page-context", dedupe_scripts)
    app.connect("doctree-read", fold_answers)
    app.connect("builder-inited", index_prose_only)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
