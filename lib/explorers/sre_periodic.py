"""Explorer for periodic latency spikes (I079): each spike's phase against the wall clock and against the
request count, for a source injected into a seeded step series (:mod:`lib.sre.periodic`); a locked
phase is a flat line, an unlocked one drifts once the traffic changes."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.units import fmt_time, sig

SOURCE_KEYS = ("scrape", "gc", "cron", "health", "flush", "allocator", "thp")


@functools.lru_cache(maxsize=8)
def base_step_s(model: str, gpu: str, batch: int, context: int) -> float:
    """The book's decode step (s) for ``batch`` sequences of ``context`` tokens, at the smallest TP that fits."""
    from lib.perf.step import decode_step
    from lib.perf.throughput import smallest_fitting_deployment

    return decode_step(smallest_fitting_deployment(model, gpu), batch, context).total_s


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.wall = ax.plot([0.0], [0.0], "o-", color="C0", ms=4, lw=1.0, label="phase against the wall clock")[0]
    a.count = ax.plot([0.0], [0.0], "s-", color="C1", ms=4, lw=1.0, label="phase against the request count")[0]
    a.change = ax.axvline(0.0, color="0.5", ls=":", lw=1.2, label="traffic changes")
    ax.set_xlabel("spike number")
    ax.set_ylabel("phase (fraction of the period)")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(True)
    figures.legend(ax, [a.wall, a.count, a.change], fontsize=7, loc="upper left")
    return a


def _draw(a, wall, count, change_at) -> None:
    x = np.arange(len(wall))
    a.wall.set_data(x, wall)
    a.count.set_data(x, count)
    a.change.set_xdata([change_at, change_at])
    a.ax.set_xlim(-0.5, max(len(wall) - 0.5, 1.0))


_FIGURE = figures.LiveFigure(6.0, 3.0, _build, _draw)


@explorer(
    "sre.periodic_spikes",
    source=Choice(SOURCE_KEYS),
    period_s=FloatRange(5.0, 120.0, 5.0, label="period (s)"),
    rate_change=FloatRange(0.5, 3.0, 0.1, label="traffic after / before"),
)
def periodic_spikes(source: str, period_s: float, rate_change: float, *, model: str = "llama-3.1-8b",
                    gpu: str = "h100-sxm", batch: int = 32, context: int = 2000, stall_ms: float = 300.0,
                    rate_rps: float = 10.0, minutes: float = 20.0, seed: int = 0) -> View:
    """I079: the spikes' phase against the wall clock and the request count; keyword-only inputs are
    the page's other parameters (not widgets)."""
    from lib.sre import periodic as pe

    dur = minutes * 60.0
    if period_s > dur / 4:
        raise ValueError(f"period_s must be at most a quarter of the {sig(minutes)} minutes observed, got {period_s}")
    s = pe.spike_series(base_step_s(model, gpu, batch, context), duration_s=dur, source_key=source,
                        period_s=period_s, stall_s=stall_ms / 1e3, rate_rps=rate_rps, rate_change=rate_change,
                        seed=seed)
    r = pe.lock_test(s)
    idx = r["spikes"]
    if len(idx) < 3:
        raise ValueError("fewer than three spikes were found: lengthen the window or shorten the period")
    t, c = s.start_s[idx], s.count[idx]
    wall = (t / r["period_s"]) % 1.0
    count = (c / r["requests_per_spike"]) % 1.0
    change_at = float(np.searchsorted(t, s.change_s)) - 0.5
    fig = _FIGURE(wall, count, change_at)
    src = pe.source(source)
    rows = [("injected", f"{src.name} (locked to the {'wall clock' if src.lock == 'wall' else 'request count'})"),
            ("spikes found", f"{len(idx)} of {len(s.dur_s):,} steps"),
            ("period before / after the change", f"{fmt_time(r['period_before_s'])} / {fmt_time(r['period_after_s'])}"),
            ("concentration: wall clock / count", f"{sig(r['r_wall'])} / {sig(r['r_count'])}"),
            ("verdict", f"locked to the {'wall clock' if r['lock'] == 'wall' else 'request count'}")]
    caption = (f"Each spike's phase: against the wall clock (period {fmt_time(r['period_s'])}) and against the request "
               f"count ({sig(r['requests_per_spike'])} requests per spike); the flatter line is the lock, here the "
               f"{'wall clock' if r['lock'] == 'wall' else 'request count'} (concentration {sig(r['r_wall'])} vs "
               f"{sig(r['r_count'])}).")
    return View(f"Periodic spikes: {src.name}", rows, fig, caption=caption,
                values={"r_wall": r["r_wall"], "r_count": r["r_count"], "period_s": r["period_s"]})
