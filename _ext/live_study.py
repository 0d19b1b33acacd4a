"""Sphinx extension for the book's question pages.

* Folds the answer: the body of "Worked answer", "Explore", "Where it breaks" and "Interviewer's
  notes" goes behind a toggle (sphinx-togglebutton), so the question, hints and parameters show
  first and an interviewer can share the page without giving the answer away.
* Serves the widget manager's fonts from the vendored copy, lets it typeset through MathJax 3,
  removes duplicate script tags and gives first-time readers the "auto" colour mode (the theme
  logs an error when none is set).
* Adds an "Open live" link to the same notebook in JupyterLab. Its base URL is the config value
  ``live_lab_url`` (the Lab that ``./book study`` starts on 127.0.0.1), overridable at build time
  with the environment variable ``BOOK_LAB_URL`` for a book hosted elsewhere.
"""

from __future__ import annotations

import html
import os

from docutils import nodes

FOLDED_SECTIONS = ("Worked answer", "Explore", "Where it breaks", "Interviewer's notes")
CHECKS_NOTE = ("The checks cell is hidden in the book: it asserts this page's headline numbers against "
               "published values or a second method, and CI re-runs it on every change. Open the notebook "
               "live to read it.")


def _is_question_page(app, docname: str) -> bool:
    return docname.startswith("chapters/") and str(app.env.doc2path(docname)).endswith(".ipynb")


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
    base = os.environ.get("BOOK_LAB_URL") or app.config.live_lab_url
    href = f"{base.rstrip('/')}/lab/tree/{docname}.ipynb"
    link = nodes.raw(
        "",
        f'<p class="open-live"><a class="open-live-link" href="{html.escape(href)}">'
        "Open this question live in JupyterLab</a> "
        '<span class="open-live-hint">(start it with <code>./book study</code>)</span></p>',
        format="html",
    )
    titles = list(doctree.findall(nodes.title))
    if titles:
        top = titles[0].parent
        top.insert(top.index(titles[0]) + 1, link)


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
    app.add_js_file(None, body=WIDGETS_REQUIRE_CONFIG + " " + DEFAULT_MODE, priority=100)
    app.add_js_file(None, body=MATHJAX2_SHIM, priority=999)
    app.connect("html-page-context", dedupe_scripts)
    app.add_config_value("live_lab_url", "http://127.0.0.1:8888", "html")
    app.connect("doctree-read", fold_answers)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
