"""Sphinx extension: render the prose's ``{eval}`glued.NAME``` citations from stored outputs.

In JupyterLab, jupyterlab-myst evaluates ``glued.NAME`` in the kernel (:mod:`lib.book.glue`).
The book is built from the notebooks' stored outputs with execution off, where myst-nb's own
``eval`` role has no kernel to ask; this role reads the text glued under NAME in the same
notebook instead, exactly as ``{glue:text}`NAME``` would, and refuses any other expression.
Inline math in a glued text (``$T^*$``) becomes a math node, as it does in JupyterLab's live label;
a dollar amount ("$0.05") does not (:func:`lib.book.glue.split_inline_math`'s rule).
"""

from __future__ import annotations

from docutils import nodes
from myst_nb.ext.glue.roles import PasteTextRole

from lib.book.glue import citation_name, split_inline_math


class GluedCitationRole(PasteTextRole):
    """``{eval}`glued.NAME``` -> the text glued under NAME in this notebook's stored outputs."""

    def run(self):
        try:
            name = citation_name(self.text)
        except ValueError as err:
            return [], [self.inliner.reporter.warning(str(err), line=self.line)]
        self.text = name
        out, messages = super().run()
        for node in out:
            if isinstance(node, nodes.inline) and len(node.children) == 1 and isinstance(node[0], nodes.Text):
                parts = split_inline_math(node.astext())
                if any(is_math for is_math, _ in parts):
                    node.children = []
                    for is_math, piece in parts:
                        node += nodes.math(f"${piece}$", piece) if is_math else nodes.Text(piece)
        return out, messages


def _register(app) -> None:
    app.add_role("eval", GluedCitationRole(), override=True)  # after myst-nb registered its own


def setup(app):
    app.connect("builder-inited", _register)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
