"""Charts drawn straight to SVG text: the subset of matplotlib's Figure/Axes API the book uses.

Why not matplotlib's Agg: on a 2-core machine it takes 80-300 ms to lay out and rasterize even a
one-line chart (tick and text layout dominate), which alone breaks the 100 ms explorer budget.
Building the SVG here takes a millisecond or two; the browser does the text layout. The output is
deterministic text, so nbval compares figures too.

Geometry: a figure of ``figsize`` inches has a viewBox in points (72 per inch) and displays
``dpi`` pixels per inch. Axes sit in the figure like matplotlib's (``subplots_adjust`` fractions,
``wspace``/``hspace`` as fractions of the mean axes size). Text width is estimated (0.55 em per
character), which is all the legend box needs.

Method names and arguments follow matplotlib so a reader who knows it can read the plotting code;
an argument this module does not implement raises :class:`PlotError` rather than being ignored.
"""

from __future__ import annotations

import hashlib
import html
import math
from dataclasses import dataclass, field

import numpy as np

PT_PER_INCH = 72.0
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_SINGLE_LETTER = {"b": "#0000ff", "g": "#008000", "r": "#ff0000", "c": "#00bfbf", "m": "#bf00bf",
                  "y": "#bfbf00", "k": "#000000", "w": "#ffffff"}
_DASHES = {"-": None, "solid": None, "--": "6,3", "dashed": "6,3", ":": "1.5,2.5", "dotted": "1.5,2.5",
           "-.": "6,2.5,1.5,2.5", "dashdot": "6,2.5,1.5,2.5", "": "none", "None": "none", "none": "none"}
_MARKERS = "os^vDdx+.*"
_DEFAULT_FONT = 10.0
_CHAR_EM = 0.55  # mean glyph width of DejaVu/Helvetica-like fonts, in em


class PlotError(Exception):
    """A plotting call this module cannot draw: a bug in the calling code, never a reader's input.
    Deliberately not a ValueError, so an explorer cannot show it as an input message."""


def css_color(c, alpha: float | None = None) -> tuple[str, float]:
    """(SVG paint, opacity) for a matplotlib-style colour: 'C3', 'k', '#rrggbb', a CSS name,
    a grey level string '0.5', or an RGB(A) tuple of floats in [0, 1]."""
    if c is None:
        return "none", 1.0
    opacity = 1.0
    if isinstance(c, tuple | list):
        if len(c) not in (3, 4) or not all(0 <= v <= 1 for v in c):
            raise PlotError(f"colour tuple must hold 3 or 4 floats in [0, 1]; got {c!r}")
        paint = "#" + "".join(f"{round(v * 255):02x}" for v in c[:3])
        opacity = c[3] if len(c) == 4 else 1.0
    elif isinstance(c, str) and len(c) == 2 and c[0] == "C" and c[1].isdigit():
        paint = TAB10[int(c[1])]
    elif isinstance(c, str) and c in _SINGLE_LETTER:
        paint = _SINGLE_LETTER[c]
    elif isinstance(c, str) and c.startswith("tab:"):
        names = ("blue", "orange", "green", "red", "purple", "brown", "pink", "gray", "olive", "cyan")
        name = c[4:].replace("grey", "gray")
        if name not in names:
            raise PlotError(f"unknown colour {c!r}; tab: colours are {', '.join(names)}")
        paint = TAB10[names.index(name)]
    elif isinstance(c, str) and _is_float(c):
        level = round(float(c) * 255)
        paint = f"#{level:02x}{level:02x}{level:02x}"
    elif isinstance(c, str):
        paint = c
    else:
        raise PlotError(f"unknown colour {c!r}")
    return paint, opacity * (1.0 if alpha is None else alpha)


def _is_float(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _num(v: float) -> str:
    """A coordinate in points, rounded to 0.01 pt (stable text across machines)."""
    r = round(float(v), 2)
    return str(int(r)) if r == int(r) else f"{r:.2f}".rstrip("0")


def _esc(s) -> str:
    return html.escape(str(s), quote=True)


def text_width(s: str, fontsize: float) -> float:
    """Estimated width in points of the longest line of ``s`` at ``fontsize`` pt."""
    return max((len(line) for line in str(s).split("\n")), default=0) * _CHAR_EM * fontsize


def _parse_fmt(fmt: str) -> dict:
    """matplotlib's 'color marker line' format string, e.g. 'k--', 'o-', 'r.'."""
    out: dict = {}
    rest = fmt
    for style in ("--", "-.", "-", ":"):
        if style in rest:
            out["linestyle"] = style
            rest = rest.replace(style, "", 1)
            break
    for ch in rest:
        if ch in _SINGLE_LETTER:
            out["color"] = ch
        elif ch in _MARKERS:
            out["marker"] = ch
            out.setdefault("linestyle", "")
        else:
            raise PlotError(f"unknown format character {ch!r} in {fmt!r}")
    return out


def _array(values) -> np.ndarray:
    """Numbers as a 1-D float array (a scalar becomes one element)."""
    try:
        return np.atleast_1d(np.asarray(values, dtype=float)).ravel()
    except (TypeError, ValueError) as err:
        raise PlotError(f"expected numbers; got {values!r:.80}") from err


def _floats(values) -> list[float]:
    """Numbers as a list of floats (a scalar becomes one element)."""
    return _array(values).tolist()


# ---- artists ---------------------------------------------------------------------------


@dataclass
class Rectangle:
    """A patch at data (x, y) of ``width`` x ``height``, as matplotlib.patches.Rectangle."""

    xy: tuple[float, float]
    width: float
    height: float
    color: object = None
    facecolor: object = None
    edgecolor: object = None
    lw: float | None = None
    linewidth: float | None = None
    alpha: float | None = None
    hatch: str | None = None
    label: str | None = None

    def fill(self):
        return self.facecolor if self.facecolor is not None else (self.color if self.color is not None else "C0")


@dataclass
class Patch:
    """A legend handle: a filled square of ``color`` named ``label``."""

    color: object = None
    facecolor: object = None
    edgecolor: object = None
    label: str = ""
    hatch: str | None = None
    alpha: float | None = None

    def fill(self):
        return self.facecolor if self.facecolor is not None else self.color


@dataclass
class Line2D:
    """A polyline in data coordinates (also a legend handle)."""

    x: np.ndarray
    y: np.ndarray
    color: object
    linewidth: float = 1.5
    linestyle: str = "-"
    marker: str | None = None
    markersize: float = 6.0
    markerfacecolor: object = None  # None: the line colour
    alpha: float | None = None
    label: str | None = None
    zorder: float = 2.0


@dataclass
class _Text:
    x: float
    y: float
    s: str
    fontsize: float
    ha: str = "left"
    va: str = "baseline"
    rotation: float = 0.0
    color: object = "black"
    coords: str = "data"  # 'data' or 'axes'
    offset: tuple[float, float] = (0.0, 0.0)  # points, +y up
    weight: str = "normal"


@dataclass
class _VLine:
    value: float
    vertical: bool
    lo: float
    hi: float
    color: object
    linewidth: float
    linestyle: str
    alpha: float | None
    label: str | None


@dataclass
class _Polygon:
    xs: list[float]
    ys: list[float]
    color: object
    alpha: float | None
    label: str | None
    edgecolor: object = None


class _AxesCoords:
    """Sentinel for ``transform=ax.transAxes``: positions as fractions of the axes box."""


# ---- axis scaling and ticks --------------------------------------------------------------


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^k steps) covering [lo, hi], about ``target`` of them."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + step * 1e-9:
        ticks.append(round(k * step, 12))
        k += 1
    return ticks


def log_ticks(lo: float, hi: float, base: float = 10.0) -> list[float]:
    """Powers of ``base`` in [lo, hi] (every n-th when there are many; at most 8); for base 10
    spanning under two decades, the 1-2-5 sequence instead."""
    a, b = math.floor(math.log(lo, base) + 1e-9), math.ceil(math.log(hi, base) - 1e-9)
    inside = lambda t: lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)  # noqa: E731
    if base == 10 and math.log10(hi / lo) < 1.5:
        for mults in ((1, 2, 5), range(1, 10)):
            ticks = [t for t in (m * 10.0**e for e in range(a - 1, b + 1) for m in mults) if inside(t)]
            if len(ticks) >= 3:
                break
        return ticks
    stride = max(1, math.ceil((b - a + 1) / 8))
    return [base**e for e in range(a, b + 1) if (e - a) % stride == 0 and inside(base**e)]


def _is_power(v: float, base: float) -> bool:
    return v > 0 and abs(math.log(v, base) - round(math.log(v, base))) < 1e-9


def tick_label(v: float, ticks: list[float], log: bool, base: float = 10.0) -> str:
    """Text of a tick at ``v``: base^k when every tick of a log axis is a power of the base, else the
    shortest exact decimal."""
    if log and len(ticks) > 1 and all(_is_power(t, base) for t in ticks):
        return f"{base:g}^{round(math.log(v, base))}"
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        mant, exp = f"{v:.3e}".split("e")
        return f"{float(mant):g}e{int(exp)}"
    return f"{v:.6f}".rstrip("0").rstrip(".")


@dataclass
class _Axis:
    scale: str = "linear"
    base: float = 10.0
    lim: tuple[float, float] | None = None
    ticks: list[float] | None = None
    ticklabels: list[str] | None = None
    label: str = ""
    label_size: float = _DEFAULT_FONT
    tick_size: float = _DEFAULT_FONT * 0.9
    rotation: float = 0.0
    inverted: bool = False
    data: list[np.ndarray] = field(default_factory=list)  # every artist's extent along this axis
    sticky: set = field(default_factory=set)  # values autoscaling must not pad past (bar baselines)

    def f(self, v: float) -> float:
        """Data value -> position along the axis (the logarithm on a log axis; NaN if not positive)."""
        if self.scale != "log":
            return v
        return math.log(v, self.base) if v > 0 else float("nan")

    def limits(self) -> tuple[float, float]:
        if self.lim is not None:
            lo, hi = self.lim
            if self.scale == "log" and (lo <= 0 or hi <= 0):
                raise PlotError(f"log axis limits must be positive; got {self.lim}")
            return lo, hi
        vals = np.concatenate(self.data) if self.data else np.zeros(0)
        vals = vals[np.isfinite(vals) & ((vals > 0) if self.scale == "log" else True)]
        if not vals.size:
            return (1.0, 10.0) if self.scale == "log" else (0.0, 1.0)
        lo, hi = float(vals.min()), float(vals.max())
        if self.scale == "log":
            a, b = self.f(lo), self.f(hi)
            if a == b:
                a, b = a - 1, b + 1
            pad = 0.05 * (b - a)
            lo2 = lo if lo in self.sticky else self.base ** (a - pad)
            hi2 = hi if hi in self.sticky else self.base ** (b + pad)
            return lo2, hi2
        if lo == hi:
            if lo in self.sticky:  # e.g. bars that are all zero: show [0, 1] above the baseline
                return lo, lo + 1.0
            d = abs(lo) * 0.05 or 1.0
            return lo - d, hi + d
        pad = 0.05 * (hi - lo)
        return (lo if lo in self.sticky else lo - pad), (hi if hi in self.sticky else hi + pad)

    def tick_values(self, lo: float, hi: float) -> list[float]:
        if self.ticks is not None:
            return self.ticks
        a, b = min(lo, hi), max(lo, hi)
        return log_ticks(a, b, self.base) if self.scale == "log" else nice_ticks(a, b)


# ---- axes --------------------------------------------------------------------------------


class Axes:
    """One plotting area; the methods mirror matplotlib.axes.Axes for the book's needs."""

    transAxes = _AxesCoords  # noqa: N815 (matplotlib's name)

    def __init__(self, figure: Figure, position: tuple[int, int, int]):
        self.figure = figure
        self.position = position  # (nrows, ncols, index from 1)
        self.xaxis, self.yaxis = _Axis(), _Axis()
        self.artists: list = []
        self.legend_spec: dict | None = None
        self.title = ("", _DEFAULT_FONT * 1.2)
        self.grid_alpha: float | None = None
        self.visible = True
        self._cycle = 0

    # -- helpers
    def _next_color(self) -> str:
        c = TAB10[self._cycle % len(TAB10)]
        self._cycle += 1
        return c

    def _note(self, xs, ys, sticky_x=(), sticky_y=()):
        self.xaxis.data.append(_array(xs))
        self.yaxis.data.append(_array(ys))
        self.xaxis.sticky.update(sticky_x)
        self.yaxis.sticky.update(sticky_y)

    # -- lines
    def plot(self, *args, color=None, c=None, linewidth=None, lw=None, linestyle=None, ls=None, marker=None,
             markersize=None, ms=None, markerfacecolor=None, mfc=None, alpha=None, label=None, zorder=2.0):
        """Lines: plot(y), plot(x, y), plot(x, y, fmt); one Line2D per (x, y) pair."""
        if not args:
            raise PlotError("plot() needs data")
        groups, rest = [], list(args)
        while rest:
            if len(rest) >= 2 and not isinstance(rest[1], str):
                x, y, rest = rest[0], rest[1], rest[2:]
            else:
                y, rest = rest[0], rest[1:]
                x = np.arange(len(_array(y)))
            fmt = rest.pop(0) if rest and isinstance(rest[0], str) else ""
            groups.append((x, y, _parse_fmt(fmt)))
        lines = []
        for x, y, style in groups:
            xs, ys = _array(x), _array(y)
            if len(xs) != len(ys):
                raise PlotError(f"x and y must have the same length; got {len(xs)} and {len(ys)}")
            line = Line2D(xs, ys, color=(color or c or style.get("color") or self._next_color()),
                          linewidth=lw or linewidth or 1.5,
                          linestyle=ls if ls is not None else (linestyle if linestyle is not None
                                                               else style.get("linestyle", "-")),
                          marker=marker or style.get("marker"), markersize=ms or markersize or 6.0,
                          markerfacecolor=mfc or markerfacecolor,
                          alpha=alpha, label=label, zorder=zorder)
            self.artists.append(line)
            self._note(xs, ys)
            lines.append(line)
        return lines

    def loglog(self, *args, **kw):
        self.set_xscale("log")
        self.set_yscale("log")
        return self.plot(*args, **kw)

    def semilogx(self, *args, **kw):
        self.set_xscale("log")
        return self.plot(*args, **kw)

    def semilogy(self, *args, **kw):
        self.set_yscale("log")
        return self.plot(*args, **kw)

    def step(self, x, y, *args, where="pre", **kw):
        """A staircase: 'post' holds y[i] from x[i] to x[i+1]; 'pre' holds y[i] from x[i-1] to x[i]."""
        xs, ys = _floats(x), _floats(y)
        if where not in ("pre", "post", "mid"):
            raise PlotError(f"where must be 'pre', 'post' or 'mid'; got {where!r}")
        sx, sy = [], []
        for i in range(len(xs)):
            if i == 0:
                sx.append(xs[0])
                sy.append(ys[0])
                continue
            corner_x = {"post": xs[i], "pre": xs[i - 1], "mid": (xs[i - 1] + xs[i]) / 2}[where]
            corner_y = {"post": ys[i - 1], "pre": ys[i], "mid": ys[i - 1]}[where]
            sx += [corner_x] if where != "mid" else [corner_x, corner_x]
            sy += [corner_y] if where != "mid" else [ys[i - 1], ys[i]]
            sx.append(xs[i])
            sy.append(ys[i])
        return self.plot(sx, sy, *args, **kw)

    def axvline(self, x=0.0, ymin=0.0, ymax=1.0, color="black", linewidth=None, lw=None, linestyle="-", ls=None,
                alpha=None, label=None):
        """A vertical line at data x spanning axes fractions [ymin, ymax]."""
        self.artists.append(_VLine(float(x), True, ymin, ymax, color, lw or linewidth or 1.0,
                                   ls if ls is not None else linestyle, alpha, label))
        self._note([float(x)], [])

    def axhline(self, y=0.0, xmin=0.0, xmax=1.0, color="black", linewidth=None, lw=None, linestyle="-", ls=None,
                alpha=None, label=None):
        """A horizontal line at data y spanning axes fractions [xmin, xmax]."""
        self.artists.append(_VLine(float(y), False, xmin, xmax, color, lw or linewidth or 1.0,
                                   ls if ls is not None else linestyle, alpha, label))
        self._note([], [float(y)])

    # -- areas
    def bar(self, x, height, width=0.8, bottom=0.0, color=None, edgecolor=None, linewidth=None, lw=None,
            label=None, alpha=None, align="center", hatch=None, tick_label=None):
        """Vertical bars at x of the given heights (scalars broadcast)."""
        return self._bars(x, height, width, bottom, color, edgecolor, lw or linewidth, label, alpha, align, hatch,
                          vertical=True, tick_label=tick_label)

    def barh(self, y, width, height=0.8, left=0.0, color=None, edgecolor=None, linewidth=None, lw=None,
             label=None, alpha=None, align="center", hatch=None, tick_label=None):
        """Horizontal bars at y of the given widths (scalars broadcast)."""
        return self._bars(y, width, height, left, color, edgecolor, lw or linewidth, label, alpha, align, hatch,
                          vertical=False, tick_label=tick_label)

    def _bars(self, pos, size, thickness, base, color, edgecolor, lw, label, alpha, align, hatch, vertical,
              tick_label):
        if not isinstance(pos, str) and hasattr(pos, "__len__") and len(pos) and all(isinstance(p, str) for p in pos):
            tick_label, pos = list(pos), list(range(len(pos)))  # categories: one slot each, named on the axis
        pos, size = _floats(pos), _floats(size)
        n = max(len(pos), len(size))
        pos = pos * n if len(pos) == 1 else pos
        size = size * n if len(size) == 1 else size
        thick = _floats(thickness)
        thick = thick * n if len(thick) == 1 else thick
        base = _floats(base)
        base = base * n if len(base) == 1 else base
        if not (len(pos) == len(size) == len(thick) == len(base) == n):
            raise PlotError("bar positions, sizes, widths and bases must broadcast to one length")
        colors = list(color) if isinstance(color, list | tuple) and color and not isinstance(color[0], float) \
            else [color] * n
        if len(colors) != n:
            raise PlotError(f"{len(colors)} colours for {n} bars")
        default = self._next_color() if any(c is None for c in colors) else None
        if align not in ("center", "edge"):
            raise PlotError(f"align must be 'center' or 'edge'; got {align!r}")
        rects = []
        for p, s, t, b, col in zip(pos, size, thick, base, colors, strict=True):
            lo = p - t / 2 if align == "center" else p
            if vertical:
                rect = Rectangle((lo, b), t, s, facecolor=col or default, edgecolor=edgecolor, lw=lw, alpha=alpha,
                                 hatch=hatch)
            else:
                rect = Rectangle((b, lo), s, t, facecolor=col or default, edgecolor=edgecolor, lw=lw, alpha=alpha,
                                 hatch=hatch)
            rects.append(rect)
        if rects and label:
            rects[0].label = label
        for r in rects:
            self.artists.append(r)
        edges_lo = [p - t / 2 if align == "center" else p for p, t in zip(pos, thick, strict=True)]
        edges_hi = [e + t for e, t in zip(edges_lo, thick, strict=True)]
        ends = [b + s for b, s in zip(base, size, strict=True)]
        if vertical:
            self._note(edges_lo + edges_hi, base + ends, sticky_y=base)
        else:
            self._note(base + ends, edges_lo + edges_hi, sticky_x=base)
        if tick_label is not None:
            (self.set_xticks if vertical else self.set_yticks)(pos, list(tick_label))
        return rects

    def broken_barh(self, xranges, yrange, facecolors=None, edgecolor=None, linewidth=None, label=None):
        """Horizontal spans (x_start, x_width) at one row (y_bottom, y_height), e.g. a Gantt strip."""
        y, hgt = yrange
        rects = [Rectangle((float(x), float(y)), float(wd), float(hgt), facecolor=facecolors or self._next_color(),
                           edgecolor=edgecolor, lw=linewidth) for x, wd in xranges]
        if rects and label:
            rects[0].label = label
        for r in rects:
            self.add_patch(r)
        return rects

    def stackplot(self, x, *ys, labels=(), colors=None, alpha=None, baseline="zero"):
        """Stacked areas under the curves ys[0], ys[0]+ys[1], ..."""
        if baseline != "zero":
            raise PlotError("stackplot supports baseline='zero' only")
        xs = _floats(x)
        if len(ys) == 1 and hasattr(ys[0], "__len__") and len(ys[0]) and hasattr(ys[0][0], "__len__"):
            ys = tuple(ys[0])  # stackplot(x, rows) with rows 2-D, as matplotlib allows
        below = [0.0] * len(xs)
        labels, polys = list(labels), []
        for i, y in enumerate(ys):
            top = [b + v for b, v in zip(below, _floats(y), strict=True)]
            col = colors[i] if colors is not None else self._next_color()
            poly = _Polygon(xs + xs[::-1], top + below[::-1], col, alpha, labels[i] if i < len(labels) else None)
            self.artists.append(poly)
            polys.append(poly)
            self._note(xs, top + below, sticky_y=[0.0])
            below = top
        return polys

    def fill_between(self, x, y1, y2=0.0, color=None, alpha=None, label=None):
        """The area between two curves (y2 may be a scalar)."""
        xs, top = _floats(x), _floats(y1)
        bottom = _floats(y2)
        bottom = bottom * len(xs) if len(bottom) == 1 else bottom
        poly = _Polygon(xs + xs[::-1], top + bottom[::-1], color or self._next_color(), alpha, label)
        self.artists.append(poly)
        self._note(xs, top + bottom)
        return poly

    def pcolormesh(self, x_edges, y_edges, values, cmap, vmin, vmax, shading="flat"):
        """Cells between consecutive edges coloured from ``cmap`` (a list of colours, matplotlib's
        ListedColormap rule: index = floor((v - vmin) / (vmax - vmin) * len(cmap)), clipped)."""
        if shading != "flat":
            raise PlotError("pcolormesh supports shading='flat' only")
        xe, ye = _floats(x_edges), _floats(y_edges)
        colors = list(getattr(cmap, "colors", cmap))
        rows = [list(r) for r in values]
        if len(rows) != len(ye) - 1 or any(len(r) != len(xe) - 1 for r in rows):
            raise PlotError("values must be (len(y_edges) - 1) x (len(x_edges) - 1)")
        for j, row in enumerate(rows):
            for i, v in enumerate(row):
                k = min(len(colors) - 1, max(0, math.floor((float(v) - vmin) / (vmax - vmin) * len(colors))))
                self.artists.append(Rectangle((xe[i], ye[j]), xe[i + 1] - xe[i], ye[j + 1] - ye[j],
                                              facecolor=colors[k], edgecolor=colors[k], lw=0.5))  # no seams
        self._note(xe, ye, sticky_x=[xe[0], xe[-1]], sticky_y=[ye[0], ye[-1]])

    def add_patch(self, patch: Rectangle) -> Rectangle:
        """Add a Rectangle (data coordinates); it widens the data limits."""
        if not isinstance(patch, Rectangle):
            raise PlotError(f"add_patch takes an svgplot.Rectangle; got {type(patch).__name__}")
        self.artists.append(patch)
        x, y = patch.xy
        self._note([x, x + patch.width], [y, y + patch.height])
        return patch

    # -- text
    def text(self, x, y, s, fontsize=None, ha="left", va="baseline", rotation=0.0, color="black",
             transform=None, horizontalalignment=None, verticalalignment=None, fontweight="normal"):
        """Text at data (x, y), or at axes fractions with ``transform=ax.transAxes``."""
        t = _Text(float(x), float(y), str(s), fontsize or _DEFAULT_FONT, horizontalalignment or ha,
                  verticalalignment or va, float(rotation), color, "axes" if transform is _AxesCoords else "data",
                  weight=fontweight)
        self.artists.append(t)
        return t

    def annotate(self, text, xy, xytext=(0.0, 0.0), textcoords="offset points", fontsize=None, ha="left",
                 va="baseline", rotation=0.0, color="black"):
        """Text placed at data point ``xy``, shifted by ``xytext`` points."""
        if textcoords != "offset points":
            raise PlotError("annotate supports textcoords='offset points' only")
        t = _Text(float(xy[0]), float(xy[1]), str(text), fontsize or _DEFAULT_FONT, ha, va, float(rotation), color,
                  offset=(float(xytext[0]), float(xytext[1])))
        self.artists.append(t)
        return t

    # -- axes furniture
    def set_xlabel(self, s, fontsize=None):
        self.xaxis.label = str(s)
        self.xaxis.label_size = fontsize or _DEFAULT_FONT

    def set_ylabel(self, s, fontsize=None):
        self.yaxis.label = str(s)
        self.yaxis.label_size = fontsize or _DEFAULT_FONT

    def set_title(self, s, fontsize=None):
        self.title = (str(s), fontsize or _DEFAULT_FONT * 1.2)

    def _set_lim(self, axis, lo, hi, name):
        old = axis.lim or axis.limits()
        lo = old[0] if lo is None else float(lo)
        hi = old[1] if hi is None else float(hi)
        if lo == hi:
            raise PlotError(f"{name} limits must differ; got {lo} and {hi}")
        axis.lim = (lo, hi)

    def set_xlim(self, left=None, right=None):
        if isinstance(left, tuple | list):
            left, right = left
        self._set_lim(self.xaxis, left, right, "x")

    def set_ylim(self, bottom=None, top=None):
        if isinstance(bottom, tuple | list):
            bottom, top = bottom
        self._set_lim(self.yaxis, bottom, top, "y")

    def set_xscale(self, scale, base=10):
        self._set_scale(self.xaxis, scale, base)

    def set_yscale(self, scale, base=10):
        self._set_scale(self.yaxis, scale, base)

    @staticmethod
    def _set_scale(axis, scale, base):
        if scale not in ("linear", "log"):
            raise PlotError(f"scale must be 'linear' or 'log'; got {scale!r}")
        if base <= 1:
            raise PlotError(f"log base must exceed 1; got {base}")
        axis.scale, axis.base = scale, float(base)

    def _set_ticks(self, axis, ticks, labels, fontsize, rotation):
        axis.ticks = _floats(ticks) if len(list(ticks)) else []
        if labels is not None:
            axis.ticklabels = [str(lab) for lab in labels]
        if fontsize:
            axis.tick_size = fontsize
        if rotation:
            axis.rotation = float(rotation)

    def set_xticks(self, ticks, labels=None, fontsize=None, rotation=0.0, ha=None):
        self._set_ticks(self.xaxis, ticks, labels, fontsize, rotation)

    def set_yticks(self, ticks, labels=None, fontsize=None, rotation=0.0):
        self._set_ticks(self.yaxis, ticks, labels, fontsize, rotation)

    def set_xticklabels(self, labels, fontsize=None, rotation=0.0):
        self._set_ticks(self.xaxis, self.xaxis.ticks or [], labels, fontsize, rotation)

    def set_yticklabels(self, labels, fontsize=None):
        self._set_ticks(self.yaxis, self.yaxis.ticks or [], labels, fontsize, 0.0)

    def tick_params(self, axis="both", labelsize=None):
        for a in ((self.xaxis, self.yaxis) if axis == "both" else (self.xaxis if axis == "x" else self.yaxis,)):
            if labelsize:
                a.tick_size = labelsize

    def invert_yaxis(self):
        self.yaxis.inverted = not self.yaxis.inverted

    def invert_xaxis(self):
        self.xaxis.inverted = not self.xaxis.inverted

    def minorticks_off(self):
        """No-op: this renderer draws no minor ticks."""

    def grid(self, visible=True, alpha=0.3, which="major"):
        self.grid_alpha = alpha if visible else None

    def axis(self, option):
        if option != "off":
            raise PlotError("axis() supports 'off' only")
        self.visible = False

    def get_legend_handles_labels(self):
        handles = [a for a in self.artists if getattr(a, "label", None)]
        return handles, [h.label for h in handles]

    def legend(self, handles=None, labels=None, fontsize=None, ncol=1, loc="best", bbox_to_anchor=None,
               frameon=True, title=None):
        """A legend of labelled artists (or of the given handles), placed like matplotlib's."""
        if handles is None:
            handles, labels = self.get_legend_handles_labels()
        elif labels is None:
            labels = [h.label for h in handles]
        self.legend_spec = {"items": list(zip(handles, labels, strict=True)), "fontsize": fontsize or _DEFAULT_FONT,
                            "ncol": max(1, int(ncol)), "loc": loc, "anchor": bbox_to_anchor, "frameon": frameon,
                            "title": title}


# ---- figure -----------------------------------------------------------------------------


class Figure:
    """A figure of ``figsize`` inches holding Axes; ``svg()`` is the drawing, shown inline in Jupyter."""

    def __init__(self, figsize=(6.4, 4.8), dpi=96):
        self.width_pt, self.height_pt = figsize[0] * PT_PER_INCH, figsize[1] * PT_PER_INCH
        self.dpi = dpi
        self.axes: list[Axes] = []
        self.params = {"left": 0.125, "right": 0.9, "bottom": 0.11, "top": 0.88, "wspace": 0.2, "hspace": 0.2}

    def add_subplot(self, nrows=1, ncols=1, index=1) -> Axes:
        if not 1 <= index <= nrows * ncols:
            raise PlotError(f"subplot index {index} outside a {nrows}x{ncols} grid")
        ax = Axes(self, (nrows, ncols, index))
        self.axes.append(ax)
        return ax

    def subplots_adjust(self, left=None, right=None, bottom=None, top=None, wspace=None, hspace=None):
        for key, value in (("left", left), ("right", right), ("bottom", bottom), ("top", top),
                           ("wspace", wspace), ("hspace", hspace)):
            if value is not None:
                self.params[key] = float(value)

    def clear(self):
        self.axes.clear()

    def _box(self, ax: Axes) -> tuple[float, float, float, float]:
        """(x, y, width, height) of an axes in points, y measured down from the top edge."""
        p = self.params
        nrows, ncols, index = ax.position
        row, col = divmod(index - 1, ncols)
        total_w = (p["right"] - p["left"]) * self.width_pt
        total_h = (p["top"] - p["bottom"]) * self.height_pt
        cell_w = total_w / (ncols + p["wspace"] * (ncols - 1))
        cell_h = total_h / (nrows + p["hspace"] * (nrows - 1))
        x = p["left"] * self.width_pt + col * cell_w * (1 + p["wspace"])
        y = (1 - p["top"]) * self.height_pt + row * cell_h * (1 + p["hspace"])
        return x, y, cell_w, cell_h

    def svg(self) -> str:
        """The figure as a standalone SVG document (deterministic text)."""
        body, defs = [], {}
        ext = [(0.0, 0.0, self.width_pt, self.height_pt)]
        for ax in self.axes:
            body.append(_draw_axes(self, ax, defs, ext))
        inner = "".join(defs.values()) + "".join(body)
        uid = hashlib.sha1(inner.encode()).hexdigest()[:8]
        inner = inner.replace("@ID@", uid)
        # grow past the nominal size wherever labels or a legend stick out, so nothing is clipped
        x0, y0 = min(e[0] for e in ext) - 2, min(e[1] for e in ext) - 2
        x0, y0 = min(x0, 0.0), min(y0, 0.0)
        w = max(max(e[2] for e in ext) + 2, self.width_pt) - x0
        h = max(max(e[3] for e in ext) + 2, self.height_pt) - y0
        scale = self.dpi / PT_PER_INCH
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(w * scale)}" height="{_num(h * scale)}" '
                f'viewBox="{_num(x0)} {_num(y0)} {_num(w)} {_num(h)}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" '
                f'style="max-width:100%;height:auto"><rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(w)}" height="{_num(h)}" fill="white"/>{inner}</svg>')

    def _repr_svg_(self) -> str:
        return self.svg()

    def __repr__(self) -> str:
        return f"<svgplot.Figure {self.width_pt / PT_PER_INCH:g}x{self.height_pt / PT_PER_INCH:g} in, " \
               f"{len(self.axes)} axes>"


# ---- drawing ------------------------------------------------------------------------------


class _Map:
    """Data -> figure points for one axes."""

    def __init__(self, ax: Axes, box):
        self.x0, self.y0, self.w, self.h = box
        self.furniture_bottom = self.y0 + self.h  # lowest tick label or x label, set when the frame is drawn
        self.ax = ax
        self.xlo, self.xhi = ax.xaxis.limits()
        self.ylo, self.yhi = ax.yaxis.limits()
        fx, fy = ax.xaxis.f, ax.yaxis.f
        self.fxlo, self.fxhi, self.fylo, self.fyhi = fx(self.xlo), fx(self.xhi), fy(self.ylo), fy(self.yhi)
        if ax.xaxis.inverted:
            self.fxlo, self.fxhi = self.fxhi, self.fxlo
        if ax.yaxis.inverted:
            self.fylo, self.fyhi = self.fyhi, self.fylo

    def px(self, x: float) -> float:
        return self.x0 + (self.ax.xaxis.f(x) - self.fxlo) / (self.fxhi - self.fxlo) * self.w

    def py(self, y: float) -> float:
        return self.y0 + self.h - (self.ax.yaxis.f(y) - self.fylo) / (self.fyhi - self.fylo) * self.h


def _stroke(color, lw, ls, alpha) -> str:
    paint, op = css_color(color, alpha)
    dash = _DASHES.get(ls, None) if isinstance(ls, str) else None
    if isinstance(ls, str) and ls not in _DASHES:
        raise PlotError(f"unknown line style {ls!r}; use one of '-', '--', ':', '-.'")
    out = f'stroke="{paint}" stroke-width="{_num(lw)}" fill="none"'
    if dash and dash != "none":
        out += f' stroke-dasharray="{dash}"'
    if op < 1:
        out += f' stroke-opacity="{_num(op)}"'
    return out


def _fill(color, alpha, edgecolor=None, lw=None, hatch=None, defs=None) -> str:
    paint, op = css_color(color, alpha)
    out = f'fill="{paint}"'
    if op < 1:
        out += f' fill-opacity="{_num(op)}"'
    if edgecolor is not None:
        epaint, eop = css_color(edgecolor, None)
        out += f' stroke="{epaint}" stroke-width="{_num(lw if lw is not None else 1.0)}"'
    if hatch:  # diagonal white stripes over the fill colour
        pid = f"hatch{paint.lstrip('#')}-@ID@"
        if defs is not None:
            defs[pid] = (f'<defs><pattern id="{pid}" width="6" height="6" patternUnits="userSpaceOnUse" '
                         f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{paint}"/>'
                         f'<line x1="0" y1="0" x2="0" y2="6" stroke="white" stroke-width="2"/></pattern></defs>')
        out = out.replace(f'fill="{paint}"', f'fill="url(#{pid})"')
    return out


def _marker(kind: str, x: float, y: float, size: float, paint: str, face: str | None = None) -> str:
    """A marker of ``size`` points centred on (x, y): edge ``paint``, filled with ``face`` (default: paint)."""
    r = size / 2
    fill = f'fill="{face or paint}" stroke="{paint}" stroke-width="1"'
    if kind in "o.":
        r = r if kind == "o" else r / 2.5
        return f'<circle cx="{_num(x)}" cy="{_num(y)}" r="{_num(r)}" {fill}/>'
    if kind == "s":
        return f'<rect x="{_num(x - r)}" y="{_num(y - r)}" width="{_num(2 * r)}" height="{_num(2 * r)}" {fill}/>'
    if kind in "^v":
        s = -1 if kind == "^" else 1
        return (f'<path d="M{_num(x)},{_num(y + s * r)} L{_num(x - r)},{_num(y - s * r)} '
                f'L{_num(x + r)},{_num(y - s * r)} Z" {fill}/>')
    if kind in "Dd":
        return (f'<path d="M{_num(x)},{_num(y - r)} L{_num(x + r)},{_num(y)} L{_num(x)},{_num(y + r)} '
                f'L{_num(x - r)},{_num(y)} Z" {fill}/>')
    # x, +, *: strokes
    a = r * 0.8
    d = (f"M{_num(x - a)},{_num(y - a)} L{_num(x + a)},{_num(y + a)} M{_num(x - a)},{_num(y + a)} "
         f"L{_num(x + a)},{_num(y - a)}")
    if kind in "+*":
        d = f"M{_num(x - r)},{_num(y)} L{_num(x + r)},{_num(y)} M{_num(x)},{_num(y - r)} L{_num(x)},{_num(y + r)}" + \
            (" " + d if kind == "*" else "")
    return f'<path d="{d}" stroke="{paint}" stroke-width="1.5" fill="none"/>'


def _text_svg(x: float, y: float, s: str, size: float, ha="left", va="baseline", rotation=0.0,
              color="black", weight="normal", ext: list | None = None) -> str:
    """SVG text anchored at (x, y) points; multi-line text stacks downward, aligned as a block.
    Its estimated bounding box is appended to ``ext`` (so the figure can grow to show it)."""
    lines = str(s).split("\n")
    anchor = {"left": "start", "center": "middle", "right": "end"}.get(ha)
    if anchor is None:
        raise PlotError(f"ha must be 'left', 'center' or 'right'; got {ha!r}")
    lead = 1.2 * size
    block = lead * (len(lines) - 1)
    first = {"baseline": 0.0, "bottom": -block - 0.25 * size, "top": 0.8 * size,
             "center": 0.35 * size - block / 2, "center_baseline": -block / 2}.get(va)
    if first is None:
        raise PlotError(f"va must be 'top', 'center', 'bottom' or 'baseline'; got {va!r}")
    if ext is not None:
        _note_text_box(ext, x, y, s, size, ha, first - 0.8 * size, block + size, rotation)
    paint, op = css_color(color)
    spans = []
    for i, line in enumerate(lines):
        dy = first if i == 0 else lead
        spans.append(f'<tspan x="0" dy="{_num(dy)}">{_rich(line, size)}</tspan>')
    rot = f" rotate({_num(-rotation)})" if rotation else ""
    extra = f' fill-opacity="{_num(op)}"' if op < 1 else ""
    extra += ' font-weight="bold"' if weight == "bold" else ""
    return (f'<text transform="translate({_num(x)},{_num(y)}){rot}" font-size="{_num(size)}" '
            f'text-anchor="{anchor}" fill="{paint}"{extra}>{"".join(spans)}</text>')


def _note_text_box(ext: list, x, y, s, size, ha, top, height, rotation) -> None:
    """Append the (x0, y0, x1, y1) box of a text block whose first line's top is ``top`` below (x, y)."""
    wid = text_width(s, size)
    left = {"left": 0.0, "center": -wid / 2, "right": -wid}[ha]
    corners = [(left, top), (left + wid, top), (left, top + height), (left + wid, top + height)]
    c, sn = math.cos(math.radians(-rotation)), math.sin(math.radians(-rotation))
    pts = [(x + cx * c - cy * sn, y + cx * sn + cy * c) for cx, cy in corners]
    ext.append((min(p[0] for p in pts), min(p[1] for p in pts), max(p[0] for p in pts), max(p[1] for p in pts)))


def _rich(s: str, size: float) -> str:
    """Escape text; 'b^k' (digits) becomes b with a superscript k."""
    base, _, power = s.partition("^")
    if power.lstrip("-").isdigit() and base.isdigit():
        return f'{base}<tspan dy="{_num(-0.4 * size)}" font-size="{_num(0.7 * size)}">{_esc(power)}</tspan>' \
               f'<tspan dy="{_num(0.4 * size)}"></tspan>'
    return _esc(s)


def _path(points) -> str:
    """An SVG path through an (n, 2) array of points; a NaN row (e.g. a non-positive value on a log
    axis) lifts the pen."""
    out, pen_down = [], False
    for x, y in points.tolist():
        if not (math.isfinite(x) and math.isfinite(y)):
            pen_down = False
            continue
        out.append(f"{'L' if pen_down else 'M'}{x:.2f},{y:.2f}")
        pen_down = True
    return " ".join(out)


def _decimate(points, per_pt: int = 2):
    """Thin a dense (n, 2) polyline without changing its look: in each 1/``per_pt``-point column keep
    the first, lowest, highest and last point, in order. NaN rows (pen lifts) are kept."""
    n = len(points)
    if n < 400:
        return points
    x, y = points[:, 0], points[:, 1]
    finite = np.isfinite(x) & np.isfinite(y)
    column = np.where(finite, np.floor(np.where(finite, x, 0) * per_pt), -1.0 - np.arange(n))
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    counts = np.diff(np.r_[starts, n])
    yy = np.where(finite, y, 0.0)
    lo = np.repeat(np.minimum.reduceat(yy, starts), counts)
    hi = np.repeat(np.maximum.reduceat(yy, starts), counts)
    first = np.zeros(n, bool)
    first[starts] = True
    last = np.zeros(n, bool)
    last[starts + counts - 1] = True
    return points[first | last | (yy == lo) | (yy == hi) | ~finite]


def _to_points(m: _Map, xs, ys):
    """Data -> (n, 2) figure points, vectorized (NaN where a log axis meets a value <= 0)."""
    def axis(values, ax, lo, hi, origin, size, flip):
        v = np.asarray(values, dtype=float)
        if ax.scale == "log":
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.where(v > 0, np.log(np.where(v > 0, v, 1.0)) / math.log(ax.base), np.nan)
        frac = (v - lo) / (hi - lo)
        return origin + (size - frac * size if flip else frac * size)

    px = axis(xs, m.ax.xaxis, m.fxlo, m.fxhi, m.x0, m.w, False)
    py = axis(ys, m.ax.yaxis, m.fylo, m.fyhi, m.y0, m.h, True)
    return np.column_stack([px, py])


def _draw_axes(fig: Figure, ax: Axes, defs: dict, ext: list) -> str:
    box = fig._box(ax)
    m = _Map(ax, box)
    x0, y0, w, h = box
    clip = f"c{len(defs)}-@ID@"
    defs[clip] = (f'<defs><clipPath id="{clip}"><rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(w)}" '
                  f'height="{_num(h)}"/></clipPath></defs>')
    out = [f'<g clip-path="url(#{clip})">']
    xt = [t for t in ax.xaxis.tick_values(m.xlo, m.xhi) if _inside(t, m.xlo, m.xhi)]
    yt = [t for t in ax.yaxis.tick_values(m.ylo, m.yhi) if _inside(t, m.ylo, m.yhi)]
    if ax.grid_alpha is not None and ax.visible:
        for t in xt:
            out.append(f'<line x1="{_num(m.px(t))}" y1="{_num(y0)}" x2="{_num(m.px(t))}" y2="{_num(y0 + h)}" '
                       f'stroke="#b0b0b0" stroke-width="0.8" stroke-opacity="{_num(ax.grid_alpha)}"/>')
        for t in yt:
            out.append(f'<line x1="{_num(x0)}" y1="{_num(m.py(t))}" x2="{_num(x0 + w)}" y2="{_num(m.py(t))}" '
                       f'stroke="#b0b0b0" stroke-width="0.8" stroke-opacity="{_num(ax.grid_alpha)}"/>')
    texts = []
    for art in sorted(ax.artists, key=lambda a: 2.0 if isinstance(a, _Text) else getattr(a, "zorder", 1.0)):
        if isinstance(art, Line2D):
            pts = _decimate(_to_points(m, art.x, art.y))
            ls = art.linestyle
            if _DASHES.get(ls, None) != "none":
                out.append(f'<path d="{_path(pts)}" {_stroke(art.color, art.linewidth, ls, art.alpha)} '
                           f'stroke-linejoin="round"/>')
            if art.marker:
                paint = css_color(art.color)[0]
                face = css_color(art.markerfacecolor)[0] if art.markerfacecolor is not None else None
                out += [_marker(art.marker, x, y, art.markersize, paint, face) for x, y in pts.tolist()
                        if math.isfinite(x) and math.isfinite(y)]
        elif isinstance(art, _VLine):
            if art.vertical:
                x = m.px(art.value)
                seg = (x, y0 + h * (1 - art.lo), x, y0 + h * (1 - art.hi))
            else:
                y = m.py(art.value)
                seg = (x0 + w * art.lo, y, x0 + w * art.hi, y)
            if all(math.isfinite(v) for v in seg):
                out.append(f'<line x1="{_num(seg[0])}" y1="{_num(seg[1])}" x2="{_num(seg[2])}" y2="{_num(seg[3])}" '
                           f'{_stroke(art.color, art.linewidth, art.linestyle, art.alpha)}/>')
        elif isinstance(art, Rectangle):
            (x, y), rw, rh = art.xy, art.width, art.height
            x, xe = _log_floor(ax.xaxis, m.xlo, m.xhi, x), _log_floor(ax.xaxis, m.xlo, m.xhi, x + rw)
            y, ye = _log_floor(ax.yaxis, m.ylo, m.yhi, y), _log_floor(ax.yaxis, m.ylo, m.yhi, y + rh)
            xa, xb, ya, yb = m.px(x), m.px(xe), m.py(y), m.py(ye)
            if all(math.isfinite(v) for v in (xa, xb, ya, yb)):
                lw = art.lw if art.lw is not None else art.linewidth
                out.append(f'<rect x="{_num(min(xa, xb))}" y="{_num(min(ya, yb))}" width="{_num(abs(xb - xa))}" '
                           f'height="{_num(abs(yb - ya))}" '
                           f'{_fill(art.fill(), art.alpha, art.edgecolor, lw, art.hatch, defs)}/>')
        elif isinstance(art, _Polygon):
            d = _path(_to_points(m, art.xs, art.ys))
            if d:
                out.append(f'<path d="{d} Z" {_fill(art.color, art.alpha)}/>')
        elif isinstance(art, _Text):
            texts.append(art)
    out.append("</g>")
    for t in texts:  # text is not clipped (labels next to bars may overhang the axes)
        if t.coords == "axes":
            x, y = x0 + t.x * w, y0 + h * (1 - t.y)
        else:
            x, y = m.px(t.x), m.py(t.y)
        x, y = x + t.offset[0], y - t.offset[1]
        if math.isfinite(x) and math.isfinite(y):
            out.append(_text_svg(x, y, t.s, t.fontsize, t.ha, t.va, t.rotation, t.color, t.weight, ext=ext))
    if ax.visible:
        out.append(_draw_frame(ax, m, xt, yt, ext))
    if ax.legend_spec and ax.legend_spec["items"]:
        out.append(_draw_legend(ax, m, defs, ext))
    return "".join(out)


def _log_floor(axis: _Axis, lo: float, hi: float, v: float) -> float:
    """On a log axis a bar edge at or below zero is drawn at the axis minimum (as matplotlib clips)."""
    return min(lo, hi) if axis.scale == "log" and v <= 0 else v


def _inside(t: float, lo: float, hi: float) -> bool:
    a, b = min(lo, hi), max(lo, hi)
    slack = 1e-9 * max(abs(a), abs(b), 1e-300)
    return a - slack <= t <= b + slack


def _tick_pairs(axis: _Axis, shown: list[float], lo: float, hi: float) -> list[tuple[float, str]]:
    """(tick, label) for the ticks inside [lo, hi]; fixed ticks keep their own labels even when some
    of them fall outside the limits."""
    if axis.ticks is None:
        return [(t, tick_label(t, shown, axis.scale == "log", axis.base)) for t in shown]
    labels = axis.ticklabels if axis.ticklabels is not None else \
        [tick_label(t, shown, axis.scale == "log", axis.base) for t in axis.ticks]
    return [(t, lab) for t, lab in zip(axis.ticks, labels, strict=False) if _inside(t, lo, hi)]


def _draw_frame(ax: Axes, m: _Map, xt: list[float], yt: list[float], ext: list) -> str:
    x0, y0, w, h = m.x0, m.y0, m.w, m.h
    out = [f'<rect x="{_num(x0)}" y="{_num(y0)}" width="{_num(w)}" height="{_num(h)}" fill="none" '
           f'stroke="black" stroke-width="0.8"/>']
    xa, ya = ax.xaxis, ax.yaxis
    pairs = _tick_pairs(xa, xt, m.xlo, m.xhi)
    below = 0.0
    for t, lab in pairs:
        px = m.px(t)
        out.append(f'<line x1="{_num(px)}" y1="{_num(y0 + h)}" x2="{_num(px)}" y2="{_num(y0 + h + 3.5)}" '
                   f'stroke="black" stroke-width="0.8"/>')
        if xa.rotation:
            out.append(_text_svg(px, y0 + h + 5, lab, xa.tick_size, "right", "top", xa.rotation, ext=ext))
            below = max(below, text_width(lab, xa.tick_size) * math.sin(math.radians(xa.rotation)))
        else:
            out.append(_text_svg(px, y0 + h + 5, lab, xa.tick_size, "center", "top", ext=ext))
            below = max(below, 1.2 * xa.tick_size * (lab.count("\n") + 1))
    ypairs = _tick_pairs(ya, yt, m.ylo, m.yhi)
    left = 0.0
    for t, lab in ypairs:
        py = m.py(t)
        out.append(f'<line x1="{_num(x0 - 3.5)}" y1="{_num(py)}" x2="{_num(x0)}" y2="{_num(py)}" '
                   f'stroke="black" stroke-width="0.8"/>')
        out.append(_text_svg(x0 - 5, py, lab, ya.tick_size, "right", "center", ext=ext))
        left = max(left, text_width(lab, ya.tick_size))
    m.furniture_bottom = y0 + h + (5 + below if pairs else 0.0)
    if xa.label:
        top = y0 + h + 8 + (below or 1.2 * xa.tick_size)
        out.append(_text_svg(x0 + w / 2, top, xa.label, xa.label_size, "center", "top", ext=ext))
        m.furniture_bottom = top + 1.2 * xa.label_size
    if ya.label:
        out.append(_text_svg(x0 - 9 - left, y0 + h / 2, ya.label, ya.label_size, "center", "bottom", 90.0, ext=ext))
    if ax.title[0]:
        out.append(_text_svg(x0 + w / 2, y0 - 5, ax.title[0], ax.title[1], "center", "bottom", ext=ext))
    return "".join(out)


_LOCS = {"upper right": (1, 1), "upper left": (0, 1), "lower left": (0, 0), "lower right": (1, 0),
         "right": (1, 0.5), "center left": (0, 0.5), "center right": (1, 0.5), "lower center": (0.5, 0),
         "upper center": (0.5, 1), "center": (0.5, 0.5)}


def _draw_legend(ax: Axes, m: _Map, defs: dict, ext: list) -> str:
    spec = ax.legend_spec
    fs, ncol, items = spec["fontsize"], spec["ncol"], spec["items"]
    nrows = math.ceil(len(items) / ncol)
    columns = [items[i * nrows:(i + 1) * nrows] for i in range(ncol)]  # filled column by column, as matplotlib
    handle_w, gap, pad, row_h = 2.0 * fs, 0.8 * fs, 0.4 * fs, 1.25 * fs
    col_w = [handle_w + gap + max((text_width(lab, fs) for _, lab in col), default=0) for col in columns]
    title_h = row_h if spec["title"] else 0.0
    box_w = sum(col_w) + 1.5 * fs * (len(columns) - 1) + 2 * pad
    box_h = nrows * row_h + 2 * pad + title_h
    loc = spec["loc"]
    if loc == "best":
        loc = _best_loc(ax, m, box_w, box_h)
    if loc not in _LOCS:
        raise PlotError(f"unknown legend loc {loc!r}; use one of {', '.join(_LOCS)}")
    fx, fy = _LOCS[loc]
    if spec["anchor"] is not None:
        ax_x, ax_y = spec["anchor"][:2]
        ref_x, ref_y = m.x0 + ax_x * m.w, m.y0 + (1 - ax_y) * m.h
        bx, by = ref_x - fx * box_w, ref_y - (1 - fy) * box_h
        if m.y0 + m.h < by + box_h and by < m.furniture_bottom + 2:  # below the axes: clear the x labels
            by = m.furniture_bottom + 2
    else:
        inset = 0.5 * fs
        bx = m.x0 + inset + fx * (m.w - 2 * inset - box_w)
        by = m.y0 + inset + (1 - fy) * (m.h - 2 * inset - box_h)
    ext.append((bx, by, bx + box_w, by + box_h))
    out = []
    if spec["frameon"]:
        out.append(f'<rect x="{_num(bx)}" y="{_num(by)}" width="{_num(box_w)}" height="{_num(box_h)}" rx="2" '
                   f'fill="white" fill-opacity="0.85" stroke="#cccccc" stroke-width="0.8"/>')
    if spec["title"]:
        out.append(_text_svg(bx + box_w / 2, by + pad, spec["title"], fs, "center", "top", ext=ext))
    cx = bx + pad
    for col, cw in zip(columns, col_w, strict=True):
        for i, (handle, lab) in enumerate(col):
            cy = by + pad + title_h + (i + 0.5) * row_h
            out.append(_legend_handle(handle, cx, cy, handle_w, fs, defs))
            out.append(_text_svg(cx + handle_w + gap / 2, cy, lab, fs, "left", "center", ext=ext))
        cx += cw + 1.5 * fs
    return "".join(out)


def _legend_handle(handle, x: float, y: float, width: float, fs: float, defs: dict) -> str:
    if isinstance(handle, Line2D):
        out = ""
        if _DASHES.get(handle.linestyle, None) != "none":
            out = (f'<line x1="{_num(x)}" y1="{_num(y)}" x2="{_num(x + width)}" y2="{_num(y)}" '
                   f'{_stroke(handle.color, handle.linewidth, handle.linestyle, handle.alpha)}/>')
        if handle.marker:
            out += _marker(handle.marker, x + width / 2, y, min(handle.markersize, fs), css_color(handle.color)[0])
        return out
    if isinstance(handle, _VLine):
        return (f'<line x1="{_num(x)}" y1="{_num(y)}" x2="{_num(x + width)}" y2="{_num(y)}" '
                f'{_stroke(handle.color, handle.linewidth, handle.linestyle, handle.alpha)}/>')
    if isinstance(handle, Rectangle | Patch):
        edge = handle.edgecolor
        return (f'<rect x="{_num(x)}" y="{_num(y - 0.35 * fs)}" width="{_num(width)}" height="{_num(0.7 * fs)}" '
                f'{_fill(handle.fill(), handle.alpha, edge, 0.8, handle.hatch, defs)}/>')
    if isinstance(handle, _Polygon):
        return (f'<rect x="{_num(x)}" y="{_num(y - 0.35 * fs)}" width="{_num(width)}" height="{_num(0.7 * fs)}" '
                f'{_fill(handle.color, handle.alpha)}/>')
    raise PlotError(f"cannot draw a legend handle for {type(handle).__name__}")


def _best_loc(ax: Axes, m: _Map, box_w: float, box_h: float) -> str:
    """The corner or edge position whose legend box hides the least: plotted points (lines, area
    outlines) count 20 pt² each, rectangles (bars, cells) by the area they share with the box."""
    parts, rects = [], []
    for art in ax.artists:
        if isinstance(art, Line2D):
            parts.append(_decimate(_to_points(m, art.x, art.y)))
        elif isinstance(art, _Polygon):
            parts.append(_to_points(m, art.xs, art.ys))
        elif isinstance(art, Rectangle):
            (x, y), rw, rh = art.xy, art.width, art.height
            xs = [m.px(_log_floor(ax.xaxis, m.xlo, m.xhi, v)) for v in (x, x + rw)]
            ys = [m.py(_log_floor(ax.yaxis, m.ylo, m.yhi, v)) for v in (y, y + rh)]
            rects.append((min(xs), min(ys), max(xs), max(ys)))
    pts = np.concatenate(parts) if parts else np.zeros((0, 2))
    px, py = pts[:, 0], pts[:, 1]
    boxes = np.array(rects, dtype=float).reshape(-1, 4)
    inset = 0.5 * _DEFAULT_FONT
    best, best_cost = "upper right", None
    for loc in ("upper right", "upper left", "lower left", "lower right", "center right", "center left",
                "lower center", "upper center", "center"):
        fx, fy = _LOCS[loc]
        bx = m.x0 + inset + fx * (m.w - 2 * inset - box_w)
        by = m.y0 + inset + (1 - fy) * (m.h - 2 * inset - box_h)
        hidden = np.count_nonzero((bx <= px) & (px <= bx + box_w) & (by <= py) & (py <= by + box_h))
        over_w = np.clip(np.minimum(boxes[:, 2], bx + box_w) - np.maximum(boxes[:, 0], bx), 0, None)
        over_h = np.clip(np.minimum(boxes[:, 3], by + box_h) - np.maximum(boxes[:, 1], by), 0, None)
        cost = 20.0 * hidden + float(np.nansum(over_w * over_h))
        if best_cost is None or cost < best_cost - 1e-9:
            best, best_cost = loc, cost
    return best


# ---- shortcuts ----------------------------------------------------------------------------


def figure(width: float = 6.0, height: float = 3.0, **margins) -> tuple[Figure, Axes]:
    """A ``width`` x ``height`` inch figure with one axes; ``margins`` go to ``subplots_adjust``."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(**margins)
    return fig, fig.add_subplot()


def subplots(width: float, height: float, ncols: int = 1, **margins) -> tuple[Figure, list[Axes]]:
    """A figure with ``ncols`` axes side by side; ``margins`` go to ``subplots_adjust``."""
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(**margins)
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
