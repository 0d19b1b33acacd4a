"""The book's glue emits exactly what myst-nb's glue emits for a string, without importing myst-nb."""

import subprocess
import sys

import pytest
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


def test_citations_name_glued_texts_only():
    assert book_glue.citation_name(" glued.kv_bytes ") == "kv_bytes"
    assert book_glue.cited_names("a {eval}`glued.x` b {eval}`glued.y_2`") == ["x", "y_2"]
    for bad in ("x", "glued.x + 1", "glued.", "__import__('os')", "glued.x.y"):
        with pytest.raises(ValueError, match="glued.NAME"):
            book_glue.citation_name(bad)


def _nb(markdown: str, glued: dict[str, str]) -> dict:
    outputs = [{"output_type": "display_data", "data": data, "metadata": meta}
               for data, meta in (book_glue.glue_output(k, v) for k, v in glued.items())]
    return {"cells": [{"cell_type": "markdown", "metadata": {}, "source": markdown},
                      {"cell_type": "code", "metadata": {}, "source": "", "outputs": outputs},
                      {"cell_type": "markdown", "metadata": {"user_expressions": ["stale"]}, "source": "no citation"}]}


def test_store_citations_writes_what_jupyterlab_myst_reads():
    nb = _nb("R = {eval}`glued.ridge` FLOP/byte at {eval}`glued.n`; again {eval}`glued.ridge`.",
             {"ridge": "295", "n": "8,192"})
    book_glue.store_citations(nb)
    stored = nb["cells"][0]["metadata"]["user_expressions"]
    assert [(e["expression"], e["result"]["data"]["text/plain"], e["result"]["status"]) for e in stored] == [
        ("glued.ridge", "295", "ok"), ("glued.n", "8,192", "ok")]
    assert "user_expressions" not in nb["cells"][2]["metadata"]  # a cell that cites nothing keeps nothing


def test_store_citations_refuses_a_name_never_glued():
    with pytest.raises(ValueError, match="glued.missing"):
        book_glue.store_citations(_nb("{eval}`glued.missing`", {"other": "1"}))


def test_live_citation_follows_glue():
    """glued.NAME is one widget per name: it shows the pending mark until glued, then each new text."""
    InteractiveShell.instance()
    with capture_output():
        label = book_glue.glued.later_name
        assert label.value == book_glue.PENDING
        assert book_glue.glued.later_name is label
        book_glue.glue("later_name", 8192, lambda v: f"{v:,}")
        assert label.value == "8,192"
        book_glue.glue("later_name", "1.5 ms")
    assert label.value == "1.5 ms" and book_glue.text("later_name") == "1.5 ms"
    assert "glued-later_name" in label._dom_classes


def test_glue_default_and_formatter_arguments():
    from lib.book import glue as g
    from lib.units import fmt_bytes

    g.forget()
    assert g.glue("n_tokens", 8192) == 8192
    assert g.text("n_tokens") == "8,192"
    g.glue("kv", 3 * 2**20, fmt_bytes, "MiB")
    assert g.text("kv") == "3.00 MiB"
    g.glue("ratio", 0.125)
    assert g.text("ratio") == "0.125"
    g.forget()


def test_glued_text_is_plain():
    """Citations paste plain text, so glue drops bold and code-span markers and keeps the words."""
    from lib.book.glue import plain_text

    assert plain_text("from **480 to 1,824** tokens, `long_prefill_token_threshold`") == \
        "from 480 to 1,824 tokens, long_prefill_token_threshold"
    assert plain_text("2**3 stays") == "2**3 stays" and plain_text("no markup") == "no markup"


def test_inline_math_in_glued_text_is_found_and_money_is_not():
    from lib.book.glue import split_inline_math

    assert split_inline_math("so $T^* = 2$ tokens") == [(False, "so "), (True, "T^* = 2"), (False, " tokens")]
    assert split_inline_math("$0.05 and $0.10/kWh") == [(False, "$0.05 and $0.10/kWh")]
    assert split_inline_math("$x$") == [(True, "x")] and split_inline_math("") == []
