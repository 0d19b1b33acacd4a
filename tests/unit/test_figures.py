"""lib.book.figures: deterministic, well-formed SVG; persistent explorer figures updated in place
(reused, history-free); no pyplot; matplotlib only when a figure is drawn."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from lib.book import figures, widgets

SVG = "{http://www.w3.org/2000/svg}"
REGISTRY = widgets.registry()


def _static(label: str = "a line"):
    with figures.style():
        fig = figures.new_figure(4.0, 2.5)
        ax = fig.add_subplot()
        ax.plot([1, 2, 3], [1, 4, 9], label=label)
        ax.bar([1, 2], [3, 5], label="bars")
        ax.set_xlabel("x")
        ax.legend()
    return figures.show(fig)


def _counting_live():
    """A LiveFigure whose build and draw are counted: one line and a title from the numbers."""
    calls = {"build": 0, "draw": 0}

    def build(fig):
        calls["build"] += 1
        ax = fig.add_subplot()
        line, = ax.plot([], [], label="y = a x")
        return {"ax": ax, "line": line}

    def draw(art, a):
        calls["draw"] += 1
        art["line"].set_data([0, 1, 2], [0, a, 2 * a])
        art["ax"].set_title(f"a = {a}")
        art["ax"].relim()
        art["ax"].autoscale_view()
        figures.legend(art["ax"], [art["line"]])

    return figures.LiveFigure(4.0, 2.5, build, draw), calls


# ---- the SVG text ------------------------------------------------------------------------------


def test_svg_is_deterministic_and_well_formed():
    a, b = _static().svg(), _static().svg()
    assert a == b  # two figures drawn alike give the same bytes (fixed hash salt, no date)
    root = ElementTree.fromstring(a)
    assert root.tag == f"{SVG}svg"
    assert a.startswith("<svg ") and "max-width:100%" in a.split(">", 1)[0]
    assert "*{" not in a.replace("svg.book-figure *{", "")  # no style rule that reaches outside the figure
    assert "<metadata" not in a and "<?xml" not in a and "<!DOCTYPE" not in a
    assert not re.search(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", a)  # no timestamp anywhere
    # text stays text (svg.fonttype none): labels are searchable, and a browser test can read them
    texts = {"".join(t.itertext()) for t in root.iter(f"{SVG}text")}
    assert {"a line", "bars", "x"} <= texts


def test_svg_is_identical_in_another_process():
    """What strict nbval relies on: a fresh kernel draws the same bytes (hash salt fixed)."""
    code = ("from lib.book import widgets; import sys; sys.stdout.write(widgets.render('roofline.ridge_point', "
            "gpu='h100-sxm', dtype='bf16', m=64, m_prefill=4096, n=28672, k=8192).svg())")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    here = widgets.render("roofline.ridge_point", gpu="h100-sxm", dtype="bf16", m=64, m_prefill=4096, n=28672, k=8192).svg()
    assert runs[0] == runs[1] == here


def test_drawing_shows_in_jupyter_as_svg():
    d = _static()
    assert d._repr_svg_() == d.svg()
    assert repr(d) == "<matplotlib figure, shown as SVG>"  # deterministic text/plain for nbval
    assert d.axes and d.live is None


def test_bad_figure_size_is_refused():
    with pytest.raises(ValueError, match="positive"):
        figures.new_figure(0, 2)


# ---- the persistent figure ---------------------------------------------------------------------


def test_live_figure_is_built_once_and_updated_in_place():
    live, calls = _counting_live()
    one, two = live(1.0), live(3.0)
    svg_one = one.svg()
    fig = live._fig
    svg_two = two.svg()
    assert live._fig is fig and one.figure is two.figure  # the same matplotlib Figure, reused
    assert calls["build"] == live.builds == 1
    assert svg_one != svg_two and "a = 3.0" in svg_two and "a = 1.0" in svg_one
    assert live(1.0).svg() == svg_one  # the picture depends on the numbers, not on the calls before


def test_a_drawing_keeps_its_own_numbers():
    """A drawing renders when shown: one made earlier still shows its own numbers, and once shown
    it keeps its text even after the figure moved on."""
    live, _ = _counting_live()
    first, second = live(1.0), live(2.0)
    assert "a = 2.0" in second.svg()
    assert "a = 1.0" in first.svg()
    assert "a = 2.0" in second.svg()  # kept, not redrawn with first's numbers


def test_a_new_layout_rebuilds_and_the_same_layout_reuses():
    seen = []

    def build(fig, n):
        seen.append(n)
        return [fig.add_subplot().bar(range(n), [0] * n)]

    def draw(art, heights):
        for bar, h in zip(art[0], heights, strict=True):
            bar.set_height(h)

    live = figures.LiveFigure(3.0, 2.0, build, draw)
    live([1, 2], layout=(2,)).svg()
    live([2, 1], layout=(2,)).svg()
    live([1, 2, 3], layout=(3,)).svg()
    assert seen == [2, 3] and len(live._fig.axes) == 1 and live.builds == 2


def _two_views(name: str):
    """Two views of explorer ``name`` for different seeded random inputs."""
    rng, exp, views = random.Random(1), REGISTRY[name], []
    for _ in range(300):
        kwargs = {arg: dom.sample(rng) for arg, dom in exp.domains.items()}
        if isinstance(widgets.render(name, **kwargs), widgets.View):
            views.append(kwargs)
            if len(views) == 2:
                return views
    pytest.skip(f"{name}: no two random inputs give a view")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_explorer_reuses_its_figure_and_redraws_without_history(name):
    """Fresh build for A, then B, then A again: the same Figure throughout, and A's SVG unchanged,
    so every draw function sets everything it changes (a stale label, limit, bar or legend entry
    from B would show here)."""
    a, b = _two_views(name)
    view = widgets.render(name, **a)
    if view.figure is None:
        return
    live = view.figure.live
    assert live is not None, f"{name}: an explorer draws on a persistent LiveFigure"
    live.reset()
    first = view.figure.svg()
    fig, builds = live._fig, live.builds
    widgets.render(name, **b).svg()
    again = widgets.render(name, **a).svg()
    assert live.builds == builds or live._layout != (), "rebuilt although the layout did not change"
    assert live._fig is fig or live._layout != ()
    assert again == first
    ElementTree.fromstring(first)


# ---- ticks of the fast log scale ---------------------------------------------------------------


def _tick_labels(lo: float, hi: float, base: float = 10) -> list[str]:
    with figures.style():
        fig = figures.new_figure(4.0, 2.5)
        ax = fig.add_subplot()
        figures.log_scale(ax, "x", base=base)
        ax.set_xlim(lo, hi)
        fig.draw_without_rendering()
        return [t.get_text() for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]


def test_power_labels_are_plain_text():
    assert figures.power_label(10, -3) == "10⁻³"
    assert figures.power_label(2, 10) == "2¹⁰"


def test_log_ticks_are_powers_over_wide_ranges_and_decimals_over_narrow_ones():
    assert _tick_labels(1, 1e6)[:3] == ["10⁰", "10¹", "10²"]
    assert _tick_labels(1, 1024, base=2)[0] == "2⁰"
    narrow = _tick_labels(1.5, 6)  # no power of ten inside: 1-2-5 steps or linear ticks, as decimals
    assert len(narrow) >= 2 and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in narrow), narrow
    with pytest.raises(ValueError, match="which"):
        figures.log_scale(None, "z")


# ---- state and imports -------------------------------------------------------------------------


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys\n{code}\nprint(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_no_pyplot_and_matplotlib_only_when_drawn():
    """Importing the figure helpers and every explorer loads no matplotlib; drawing every kind of
    figure loads it but never pyplot (no global figure registry, no GUI backend)."""
    loaded = _modules_after("import lib.book.figures, lib.book.widgets as w; w.registry()")
    assert not {m for m in loaded if m.split(".")[0] == "matplotlib"}
    drawn = _modules_after(
        "from lib.book import widgets as w\n"
        "for name, exp in sorted(w.registry().items()):\n"
        "    import random; rng = random.Random(0)\n"
        "    for _ in range(50):\n"
        "        v = w.render(name, **{a: d.sample(rng) for a, d in exp.domains.items()})\n"
        "        if isinstance(v, w.View):\n"
        "            v._repr_html_(); break")
    assert "matplotlib.figure" in drawn and "matplotlib.backends.backend_svg" in drawn
    assert "matplotlib.pyplot" not in drawn


def test_figures_leave_the_global_matplotlib_settings_alone():
    import matplotlib

    before = dict(matplotlib.rcParams)
    _static().svg()
    assert dict(matplotlib.rcParams) == before
