"""lib.book.svgplot: ticks, colours, data-to-point mapping, decimation, legends, and well-formed output."""

from __future__ import annotations

import math
import re
from xml.etree import ElementTree

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lib.book import svgplot
from lib.book.svgplot import Figure, PlotError

SVG = "{http://www.w3.org/2000/svg}"


def _parse(fig: Figure) -> ElementTree.Element:
    return ElementTree.fromstring(fig.svg())


# ---- ticks --------------------------------------------------------------------------------


@settings(max_examples=200)
@given(lo=st.floats(-1e9, 1e9), span=st.floats(1e-6, 1e9))
def test_nice_ticks_are_round_even_and_inside(lo, span):
    assume(span > 1e-6 * abs(lo))  # finer than that, float spacing itself is uneven
    hi = lo + span
    ticks = svgplot.nice_ticks(lo, hi)
    assert 2 <= len(ticks) <= 13
    assert all(lo - 1e-9 * span <= t <= hi + 1e-9 * span for t in ticks)
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0], rtol=1e-6)
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]) + 1e-6)
    assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5))


@settings(max_examples=200)
@given(lo_exp=st.floats(-6, 8), decades=st.floats(0.05, 12))
def test_log_ticks_inside_and_few(lo_exp, decades):
    lo, hi = 10**lo_exp, 10 ** (lo_exp + decades)
    ticks = svgplot.log_ticks(lo, hi)
    assert all(lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9) for t in ticks)
    assert len(ticks) <= 12
    if decades >= 2:  # wide ranges get powers of ten only
        assert all(math.isclose(math.log10(t), round(math.log10(t)), abs_tol=1e-9) for t in ticks)
    if decades >= math.log10(3):  # any range wider than 3x shows at least two ticks
        assert len(ticks) >= 2


def test_log_ticks_base_two():
    assert svgplot.log_ticks(1, 1024, base=2) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024][::2]


def test_tick_labels():
    assert svgplot.tick_label(100.0, [1.0, 10.0, 100.0], log=True) == "10^2"
    assert svgplot.tick_label(8.0, [2.0, 8.0], log=True, base=2) == "2^3"
    assert svgplot.tick_label(2.5, [0.0, 2.5, 5.0], log=False) == "2.5"
    assert svgplot.tick_label(0.0, [0.0, 1.0], log=False) == "0"
    assert svgplot.tick_label(2e7, [0.0, 2e7], log=False) == "2e7"
    assert svgplot.tick_label(200.0, [100.0, 200.0, 500.0], log=True) == "200"  # not all powers: decimals


# ---- colours -------------------------------------------------------------------------------


@pytest.mark.parametrize("color, paint, opacity", [
    ("C1", "#ff7f0e", 1.0), ("k", "#000000", 1.0), ("tab:grey", "#7f7f7f", 1.0), ("0.5", "#808080", 1.0),
    ("#123456", "#123456", 1.0), ("red", "red", 1.0), ((1.0, 0.0, 0.0, 0.5), "#ff0000", 0.5),
])
def test_css_color(color, paint, opacity):
    assert svgplot.css_color(color) == (paint, opacity)


@pytest.mark.parametrize("bad", [(2.0, 0, 0), "tab:mauve", 3])
def test_bad_colours_raise_plot_error_not_value_error(bad):
    with pytest.raises(PlotError) as err:
        svgplot.css_color(bad)
    assert not isinstance(err.value, ValueError)  # an explorer must not show a plotting bug as an input message


# ---- geometry -----------------------------------------------------------------------------


def _path_points(svg: str) -> list[list[tuple[float, float]]]:
    """Every polyline path's points (pen-down runs), in figure points."""
    runs = []
    for d in re.findall(r'<path d="([ML][^"]*)"', svg):
        for run in re.split(r"\s*M", d):
            pts = [tuple(map(float, p.split(","))) for p in re.findall(r"-?[\d.]+,-?[\d.]+", run)]
            if pts:
                runs.append(pts)
    return runs


def test_data_maps_onto_the_axes_box_on_log_axes():
    fig, ax = svgplot.figure(6.0, 3.0, left=0.1, right=0.9, bottom=0.2, top=0.9)
    ax.loglog([1, 10, 100], [1, 10, 100])
    ax.set_xlim(1, 100)
    ax.set_ylim(1, 100)
    [(x0, y0), (xm, ym), (x1, y1)] = _path_points(fig.svg())[0]
    width, height = 6.0 * 72, 3.0 * 72
    assert (x0, y0) == pytest.approx((0.1 * width, 0.8 * height), abs=0.01)  # bottom left of the box
    assert (x1, y1) == pytest.approx((0.9 * width, 0.1 * height), abs=0.01)  # top right
    assert (xm, ym) == pytest.approx(((x0 + x1) / 2, (y0 + y1) / 2), abs=0.01)  # 10 is halfway in log space


def test_non_positive_values_on_a_log_axis_break_the_line():
    fig = Figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.semilogy([0, 1, 2, 3, 4], [1, 2, 0, 4, 8])
    svg = fig.svg()
    assert "nan" not in svg.lower()
    assert [len(run) for run in _path_points(svg)] == [2, 2]


def test_autoscale_pads_five_percent_and_bars_stick_to_zero():
    fig, ax = svgplot.figure()
    ax.bar([0, 1], [3, 5])
    m = svgplot._Map(ax, fig._box(ax))
    assert m.ylo == 0.0 and m.yhi == pytest.approx(5.25)
    assert m.xlo == pytest.approx(-0.4 - 0.09) and m.xhi == pytest.approx(1.4 + 0.09)


def test_inverted_axis_flips():
    fig, ax = svgplot.figure()
    ax.barh(["a", "b"], [1, 2])
    ax.invert_yaxis()
    svg = fig.svg()
    ys = {lab: float(y) for y, lab in re.findall(r'translate\([\d.]+,([\d.]+)\)[^>]*><tspan[^>]*>([ab])<', svg)}
    assert ys["a"] < ys["b"]  # first category on top once inverted


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=400, max_size=3000))
def test_decimation_keeps_each_column_extremes_and_the_ends(ys):
    pts = np.column_stack([np.linspace(0, 100, len(ys)), np.array(ys)])
    kept = svgplot._decimate(pts)
    assert kept[0].tolist() == pts[0].tolist() and kept[-1].tolist() == pts[-1].tolist()
    columns = np.floor(pts[:, 0] * 2)
    for c in np.unique(columns)[:: max(1, len(np.unique(columns)) // 20)]:
        full, thin = pts[columns == c, 1], kept[np.floor(kept[:, 0] * 2) == c, 1]
        assert thin.min() == full.min() and thin.max() == full.max()
    assert len(kept) <= 4 * len(np.unique(columns))


# ---- legends, text, growth ------------------------------------------------------------------


def test_best_legend_avoids_the_data():
    fig, ax = svgplot.figure()
    ax.plot(np.linspace(0, 1, 50), np.linspace(0, 1, 50) ** 4, label="rising late")  # fills the upper right
    ax.legend()
    assert svgplot._best_loc(ax, svgplot._Map(ax, fig._box(ax)), 60, 20) == "upper left"


def test_figure_grows_to_show_a_legend_below_the_axes():
    fig, ax = svgplot.figure(6.0, 2.0)
    ax.plot([0, 1], [0, 1], label="a")
    ax.plot([0, 1], [1, 0], label="b")
    ax.set_xlabel("x")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5))
    view_box = [float(v) for v in _parse(fig).get("viewBox").split()]
    assert view_box[3] > 2.0 * 72  # taller than asked, so nothing is clipped


def test_output_is_deterministic_well_formed_and_ids_are_per_figure():
    def make(slope):
        fig, ax = svgplot.figure()
        ax.plot([0, 1, 2], [0, slope, 2 * slope], "o--", label="line <&>")
        ax.bar([0.5], [1.0], hatch="//", label="bar")
        ax.text(0.5, 0.5, "two\nlines", transform=ax.transAxes, ha="center", va="center")
        ax.legend()
        return fig

    a, b = make(1.0), make(2.0)
    assert a.svg() == make(1.0).svg()
    root = _parse(a)
    ids_a = {e.get("id") for e in root.iter() if e.get("id")}
    ids_b = {e.get("id") for e in _parse(b).iter() if e.get("id")}
    assert ids_a and not ids_a & ids_b  # two figures inline on one page do not share clip/pattern ids
    assert "line &lt;&amp;&gt;" in a.svg()


def test_unsupported_options_fail_loudly():
    fig, ax = svgplot.figure()
    with pytest.raises(TypeError):
        ax.plot([0, 1], [0, 1], drawstyle="steps")
    with pytest.raises(PlotError):
        ax.axis("equal")
    with pytest.raises(PlotError):
        ax.plot([0, 1], [0, 1, 2])
    ax.plot([0, 1], [0, 1], ls="~")
    with pytest.raises(PlotError):
        fig.svg()
