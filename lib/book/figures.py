"""Figures: matplotlib configured in one place and rendered to deterministic SVG text.

An explorer keeps one figure for the whole session (:class:`LiveFigure`): ``build(fig)`` makes
its axes and named artists once, ``draw(art, ...)`` sets their data, labels, visibility and limits
from the new numbers on every widget change, then the figure is rendered once. That costs tens of
milliseconds where a fresh figure costs 100-400 ms on a 2-core machine. A static figure in a
notebook is ordinary matplotlib code: :func:`new_figure` inside ``with style():``, then
:func:`show`. Either way the caller gets a :class:`Drawing`: ``.svg()`` is the SVG text and
Jupyter displays it through ``_repr_svg_``.

The SVG is deterministic (strict nbval compares it): a fixed ``svg.hashsalt``, no metadata (no
date), text kept as ``<text>`` (``svg.fonttype: none``; layout uses matplotlib's bundled DejaVu
Sans, and a browser without it falls back to narrower fonts, so text never outgrows its legend
box). matplotlib is imported inside these functions only, never by ``import lib``; pyplot is never
used (no global figure registry, no GUI backend): every figure carries an SVG canvas.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: The book's one style, applied (as an ``rc_context``) while figures are built, drawn and rendered.
STYLE = {
    "svg.hashsalt": "lib.book.figures",  # clip-path and marker ids: the same on every run
    "svg.fonttype": "none",  # text stays text: smaller SVG, searchable, testable
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Arial", "Helvetica"],
    "font.size": 9.0,
    "axes.titlesize": 9.0,
    "axes.labelsize": 9.0,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "legend.fontsize": 7.5,
    "legend.framealpha": 0.85,
    "axes.formatter.use_mathtext": False,  # mathtext layout is the slowest part of a draw
    "grid.alpha": 0.3,
    "figure.dpi": 96,
    "figure.subplot.left": 0.12,
    "figure.subplot.right": 0.97,
    "figure.subplot.bottom": 0.16,
    "figure.subplot.top": 0.95,
}
#: No <metadata> block at all: no date, no version string that changes the text between runs.
SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
#: Added to the root element so an inline figure shrinks with a narrow page.
RESPONSIVE = 'style="max-width:100%;height:auto" '


@contextmanager
def style() -> Iterator[None]:
    """The book's matplotlib settings (:data:`STYLE`) for the code inside; imports matplotlib."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        yield


def new_figure(width: float, height: float):
    """A fresh ``matplotlib.figure.Figure`` of ``width`` x ``height`` inches on an SVG canvas.

    Create it (and its artists) inside ``with style():`` so fonts and sizes follow the book.
    """
    if not (width > 0 and height > 0):
        raise ValueError(f"figure size must be positive inches; got {width} x {height}")
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with style():
        fig = Figure(figsize=(width, height))
    FigureCanvasSVG(fig)
    return fig


def svg(fig) -> str:
    """``fig`` as SVG text: one draw, no XML prolog, deterministic (same figure, same bytes)."""
    buf = io.StringIO()
    with style():
        fig.savefig(buf, format="svg", metadata=SVG_METADATA)
    text = buf.getvalue()
    text = text[text.index("<svg ") :]
    # matplotlib's one style rule selects "*": inside a page that would restyle every SVG on it
    text = text.replace('<style type="text/css">*{', '<style type="text/css">svg.book-figure *{', 1)
    return '<svg class="book-figure" ' + RESPONSIVE + text[len("<svg ") :]


class Drawing:
    """A figure ready to show. ``svg()`` renders it on first use and keeps the text, so a
    :class:`LiveFigure` redrawn later for other inputs does not change a drawing already made."""

    def __init__(self, render: Callable[[], Any], live: LiveFigure | None = None):
        self._render, self._svg = render, None
        self.live = live  # the persistent figure this drawing updates (None: a one-off figure)

    @property
    def figure(self):
        """The matplotlib Figure showing this drawing's numbers (a live one is redrawn for them)."""
        return self._render()

    @property
    def axes(self) -> list:
        return self.figure.axes

    def svg(self) -> str:
        if self._svg is None:
            self._svg = svg(self._render())
        return self._svg

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        return "<matplotlib figure, shown as SVG>"


def show(fig) -> Drawing:
    """A one-off figure (from :func:`new_figure`) as a :class:`Drawing`."""
    return Drawing(lambda: fig)


class LiveFigure:
    """One persistent figure, updated in place: what an explorer draws on every widget change.

    ``build(fig, *layout)`` adds the axes and the artists to a blank figure and returns them (any
    object: a namespace, a dict); ``draw(art, *args, **kwargs)`` sets every artist that depends on
    the numbers (data, heights, texts, labels, visibility, limits, the legend). ``draw`` must set
    everything it changes on every call, so the picture depends on its arguments only, never on
    the calls before. Calling the LiveFigure returns a :class:`Drawing` that draws when it is shown.
    ``layout`` is for the rare figure whose structure follows the inputs beyond what ``build``
    provisioned (prefer building the largest set of bars once and hiding the unused ones): a new
    layout builds a new figure, the same one reuses it.
    """

    def __init__(self, width: float, height: float, build: Callable[..., Any], draw: Callable[..., None]):
        self.width, self.height, self._build, self._draw = width, height, build, draw
        self._fig = self._art = self._layout = None
        self.builds = 0  # how many times build ran (the tests check the figure is reused)

    def __call__(self, *args, layout: tuple = (), **kwargs) -> Drawing:
        return Drawing(lambda: self._update(tuple(layout), args, kwargs), self)

    def _update(self, layout: tuple, args: tuple, kwargs: dict):
        with style():
            if self._fig is None or layout != self._layout:  # a blank figure: as on the first call
                self._fig = new_figure(self.width, self.height)
                self._art, self._layout = self._build(self._fig, *layout), layout
                self.builds += 1
            self._draw(self._art, *args, **kwargs)
        return self._fig

    def reset(self) -> None:
        """Forget the figure: the next drawing builds a new one."""
        self._fig = self._art = self._layout = None


# ---- the few settings a live figure needs to stay fast --------------------------------------


def legend(ax, handles, **kwargs):
    """A legend of the visible, labelled artists among ``handles`` (an update may hide some or
    relabel them; a bar series, ``ax.bar``'s container, counts as visible when one of its bars
    is); ``kwargs`` go to ``ax.legend``. Rebuilt on every call: a few milliseconds."""

    def shown(h) -> bool:
        visible = h.get_visible() if hasattr(h, "get_visible") else any(child.get_visible() for child in h)
        label = h.get_label()
        return visible and bool(label) and not label.startswith("_")

    return ax.legend(handles=[h for h in handles if shown(h)], **kwargs)


def log_scale(ax, which: str = "both", base: float = 10) -> None:
    """Log scale on the ``x``, ``y`` or ``both`` axes, with ticks that are cheap to draw.

    matplotlib's default log ticks are mathtext (about 80 ms per draw on a 2-core machine) plus
    minor ticks (as much again). Here: powers of ``base`` as plain text ("10⁴", "2¹⁰"), no minor
    ticks, and 1-2-5 steps (or plain linear ticks) when fewer than two powers fall in the view.
    """
    if which not in ("x", "y", "both"):
        raise ValueError(f"which must be 'x', 'y' or 'both'; got {which!r}")
    locator, formatter = _log_ticker_classes()
    for name in ("x", "y") if which == "both" else (which,):
        getattr(ax, f"set_{name}scale")("log", base=base)
        axis = getattr(ax, f"{name}axis")
        axis.set_major_locator(locator(base=base, numticks=9))
        axis.set_major_formatter(formatter(base))
        axis.set_minor_locator(_null_locator())


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_label(base: float, exponent: int) -> str:
    """``base`` to an integer power as plain text: power_label(10, -3) == '10⁻³'."""
    return f"{base:g}" + str(int(exponent)).translate(_SUPERSCRIPT)


def _null_locator():
    from matplotlib import ticker

    return ticker.NullLocator()


@functools.cache
def _log_ticker_classes():
    """(locator, formatter) classes for :func:`log_scale`, made on first use (matplotlib is
    imported lazily)."""
    import numpy as np
    from matplotlib import ticker

    class PowerLocator(ticker.LogLocator):
        """Powers of the base; 1-2-5 steps (matplotlib falls back to linear ticks) if under two."""

        def tick_values(self, vmin, vmax):
            ticks = super().tick_values(vmin, vmax)
            lo, hi = min(vmin, vmax), max(vmin, vmax)
            if np.count_nonzero((ticks >= lo * (1 - 1e-9)) & (ticks <= hi * (1 + 1e-9))) >= 2:
                return ticks
            return ticker.LogLocator(base=self._base, subs=(1.0, 2.0, 5.0)).tick_values(vmin, vmax)

    class PowerFormatter(ticker.Formatter):
        """'10⁴' when every tick is a power of the base, else the shortest decimal ('2', '0.5')."""

        def __init__(self, base: float):
            self.base, self.all_powers = base, True

        def _is_power(self, v: float) -> bool:
            return v > 0 and math.isclose(self.base ** round(math.log(v, self.base)), v, rel_tol=1e-9)

        def set_locs(self, locs):
            self.all_powers = all(self._is_power(v) for v in locs)

        def __call__(self, x, pos=None):
            if x <= 0:
                return ""
            if self.all_powers or (x >= 1e5 or x < 1e-3) and self._is_power(x):
                return power_label(self.base, round(math.log(x, self.base)))
            if 1e-3 <= x < 1e5:
                return f"{x:.6g}"
            exponent = math.floor(math.log10(x))
            return f"{x / 10**exponent:.3g}×" + power_label(10, exponent)

    return PowerLocator, PowerFormatter
