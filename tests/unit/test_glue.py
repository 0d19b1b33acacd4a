"""The book's glue emits exactly what myst-nb's glue emits for a string, without importing myst-nb."""

import subprocess
import sys

from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from lib.book import glue as book_glue


def _capture(fn):
    InteractiveShell.instance()
    with capture_output() as cap:
        fn()
    return [(o.data, o.metadata) for o in cap.outputs]


def test_same_output_as_myst_nb():
    import myst_nb

    for text in ("8,192", "11.9 ms", "NVLink", "1.99", "it's 'quoted'"):
        ours = _capture(lambda t=text: book_glue.glue("x", t))
        theirs = _capture(lambda t=text: myst_nb.glue("x", t, display=False))
        assert ours == theirs, text


def test_commas_survive_the_glue_role():
    """What the {glue:text} role renders is the glued text itself (no tuple from '8,192')."""
    from myst_nb.core.variables import format_plain_text

    data, _ = book_glue.glue_output("n", "8,192")
    assert format_plain_text(data[book_glue.GLUE_PREFIX + "text/plain"], "") == "8,192"


def test_glue_does_not_import_myst_nb_or_sphinx():
    code = ("import sys; from IPython.core.interactiveshell import InteractiveShell; "
            "InteractiveShell.instance(); from lib.book.glue import glue; glue('a', '1'); "
            "print(any(m.split('.')[0] in ('myst_nb', 'sphinx') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
