"""Sphinx extension: render the prose's ``{eval}`glued.NAME``` citations from stored outputs.

In JupyterLab, jupyterlab-myst evaluates ``glued.NAME`` in the kernel (:mod:`lib.book.glue`).
The book is built from the notebooks' stored outputs with execution off, where myst-nb's own
``eval`` role has no kernel to ask; this role reads the text glued under NAME in the same
notebook instead, exactly as ``{glue:text}`NAME``` would, and refuses any other expression.
"""

from __future__ import annotations

from myst_nb.ext.glue.roles import PasteTextRole

from lib.book.glue import citation_name


class GluedCitationRole(PasteTextRole):
    """``{eval}`glued.NAME``` -> the text glued under NAME in this notebook's stored outputs."""

    def run(self):
        try:
            name = citation_name(self.text)
        except ValueError as err:
            return [], [self.inliner.reporter.warning(str(err), line=self.line)]
        self.text = name
        return super().run()


def _register(app) -> None:
    app.add_role("eval", GluedCitationRole(), override=True)  # after myst-nb registered its own


def setup(app):
    app.connect("builder-inited", _register)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
