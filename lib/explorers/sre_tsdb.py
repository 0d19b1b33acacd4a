"""Explorer for the time-series store (N076): how many sealed segments a window query opens, against
the window's length and the segment span (:mod:`lib.sre.tsdb`).

Views call lib only; the figure is one persistent matplotlib figure updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import FloatRange, View, explorer
from lib.units import fmt_pct, sig


def pruning_numbers(window_h: float, segment_h: float, retention_days: float) -> dict:
    """Segments kept for the retention, the segments a window of ``window_h`` hours opens on average
    and at worst, and the fraction skipped: back-to-back segments of ``segment_h`` hours."""
    from lib.inputs import real
    from lib.sre.tsdb import expected_segments_touched

    w = real("window_h", window_h, 0, low_open=True, unit="hours")
    s = real("segment_h", segment_h, 0, low_open=True, unit="hours")
    days = real("retention_days", retention_days, 0, low_open=True, unit="days")
    n = max(1, math.ceil(days * 24 / s))
    avg = expected_segments_touched(w * 3600, s * 3600, n)
    worst = min(n, math.ceil(w / s) + 1)  # a window of length W meets at most ceil(W/S) + 1 tiles
    best = min(n, math.ceil(w / s))
    return {"segments": n, "avg": avg, "worst": worst, "best": best, "skipped_worst": (n - worst) / n,
            "skipped_avg": (n - avg) / n}


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.17, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.avg, = ax.plot([], [], lw=2, color="C0", label="opened, average over window placement")
    a.worst, = ax.plot([], [], lw=1.2, ls="--", color="C1", label="opened, worst placement")
    a.total, = ax.plot([], [], lw=1, ls=":", color="grey", label="segments stored")
    a.mark, = ax.plot([], [], "o", color="C3", ms=7, label="this window")
    ax.set_xlabel("query window (hours)")
    ax.set_ylabel("sealed segments")
    figures.log_scale(ax, "both")
    ax.grid(True)
    return a


def _draw(a, windows, avg, worst, n, at_w, at_avg) -> None:
    a.avg.set_data(windows, avg)
    a.worst.set_data(windows, worst)
    a.total.set_data([windows[0], windows[-1]], [n, n])
    a.mark.set_data([at_w], [at_avg])
    a.ax.set_xlim(windows[0], windows[-1])
    a.ax.set_ylim(0.7, n * 1.6)
    figures.legend(a.ax, [a.avg, a.worst, a.total, a.mark], loc="upper left", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "sre.tsdb_pruning",
    window_h=FloatRange(0.05, 720.0, 0.05, label="query window (hours)"),
    segment_h=FloatRange(0.25, 48.0, 0.25, label="segment span (hours)"),
    retention_days=FloatRange(1.0, 90.0, 1.0, label="retention (days)"),
)
def tsdb_pruning(window_h: float, segment_h: float, retention_days: float) -> View:
    """N076: segments a window query opens (average and worst placement) against the window length."""
    r = pruning_numbers(window_h, segment_h, retention_days)
    n = r["segments"]
    hi = retention_days * 24
    windows = [0.05 * (hi / 0.05) ** (k / 59) for k in range(60)]
    avg = [pruning_numbers(w, segment_h, retention_days)["avg"] for w in windows]
    worst = [pruning_numbers(w, segment_h, retention_days)["worst"] for w in windows]
    fig = _FIGURE(windows, avg, worst, n, window_h, r["avg"])
    rows = [("segments stored", f"{n:,}"), ("opened on average", sig(r["avg"])),
            ("opened at worst", f"{r['worst']:,}"), ("skipped at worst", fmt_pct(r["skipped_worst"]))]
    caption = (f"A {sig(window_h)}-hour window over {n:,} segments of {sig(segment_h)} hours opens {sig(r['avg'])} "
               f"on average and {r['worst']:,} at worst (red dot): it skips {fmt_pct(r['skipped_worst'])} of the "
               f"store even when placed badly. The curves climb to every segment as the window nears the "
               f"{sig(retention_days)}-day retention.")
    return View(f"Pruning a {sig(window_h)}-hour window", rows, fig, caption=caption,
                values={"segments": n, "avg": r["avg"], "worst": r["worst"]})
