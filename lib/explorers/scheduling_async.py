"""Explorer for the asyncio dynamic batcher (N070): what the time window costs in latency and buys in
batch size, computed with W04's fake-clock model (fast and deterministic; no event loop).

Calls lib only: :class:`lib.scheduling.batcher.SizeTimeoutBatcher` driven by
:func:`lib.scheduling.batcher.run_fixed_cost` on seeded Poisson arrivals (the rule
:class:`lib.scheduling.async_batcher.AsyncBatcher` implements), :func:`~lib.scheduling.batcher.throughput_ceiling`
and the light-load closed form :func:`lib.scheduling.async_batcher.poisson_window_wait_s`. One
persistent figure updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_time, sig

N_ITEMS = 300
N_WINDOWS = 9


def window_sweep(rate: float, max_batch: int, window_s: float, batch_s: float, *, n_items: int = N_ITEMS,
                 seed: int = 0) -> dict:
    """The W04 model at every window of a sweep from 0 to ``max(2 x window, batch, 1 ms)`` (plus
    ``window_s`` itself), for ``n_items`` Poisson arrivals at ``rate``: per window the run
    (:class:`~lib.scheduling.batcher.BatchRun`), its mean and p99 latency (s), mean batch, and the
    light-load closed form's mean latency ``W(tau) + batch_s``."""
    from lib.explorers.scheduling_batcher import poisson_arrivals
    from lib.scheduling.async_batcher import poisson_window_wait_s
    from lib.scheduling.batcher import SizeTimeoutBatcher, run_fixed_cost

    hi = max(2 * window_s, batch_s, 1e-3)
    windows = sorted({hi * i / (N_WINDOWS - 1) for i in range(N_WINDOWS)} | {window_s})
    arrivals = poisson_arrivals(rate, n_items, seed)
    runs = [run_fixed_cost(SizeTimeoutBatcher(max_batch, w), arrivals, batch_s) for w in windows]
    return {
        "windows": windows,
        "runs": runs,
        "mean_s": [sum(r.latencies_s) / len(r.latencies_s) for r in runs],
        "p99_s": [r.quantile_latency_s(0.99) for r in runs],
        "mean_batch": [r.mean_batch for r in runs],
        "closed_s": [poisson_window_wait_s(rate, max_batch, w) + batch_s for w in windows],
        "at": windows.index(window_s),
    }


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.mean, = ax.plot([], [], "o-", color="C0", ms=4, label="mean latency (model)")
    a.p99, = ax.plot([], [], "s--", color="C3", ms=4, label="p99 latency (model)")
    a.closed, = ax.plot([], [], ":", color="k", lw=1.5, label="mean, light-load closed form")
    a.pick, = ax.plot([], [], "*", color="k", ms=12, label="chosen window")
    ax.set_xlabel("window (ms)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True)
    return a


def _draw(a, win_ms, mean_ms, p99_ms, closed_ms, pick, ymax) -> None:
    a.mean.set_data(win_ms, mean_ms)
    a.p99.set_data(win_ms, p99_ms)
    a.closed.set_data(win_ms, closed_ms)
    a.pick.set_data([pick[0]], [pick[1]])
    a.ax.set_xlim(0, win_ms[-1])
    a.ax.set_ylim(0, ymax)
    figures.legend(a.ax, [a.mean, a.p99, a.closed, a.pick], loc="upper left", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.3, _build, _draw)


@explorer(
    "scheduling.dynamic_batcher",
    rate=FloatRange(1.0, 5000.0, step=1.0, label="arrivals (items/s)"),
    max_batch=IntRange(1, 256, log=True, label="size cap (items)"),
    window_ms=FloatRange(0.0, 200.0, step=0.5, label="window (ms)"),
    batch_ms=FloatRange(0.5, 500.0, step=0.5, label="cost of one batch (ms)"),
)
def dynamic_batcher(rate: float, max_batch: int, window_ms: float, batch_ms: float) -> View:
    """N070: mean and p99 latency and mean batch size against the window, one batch in flight,
    Poisson arrivals at ``rate``, every batch costing ``batch_ms``; the chosen window starred."""
    from lib.scheduling.batcher import throughput_ceiling

    if not 1 <= max_batch <= 256:
        raise ValueError(f"max_batch must be an integer from 1 to 256, got {max_batch!r}")
    window_s, batch_s = window_ms / 1e3, batch_ms / 1e3
    sw = window_sweep(rate, max_batch, window_s, batch_s)
    k = sw["at"]
    win_ms = [1e3 * w for w in sw["windows"]]
    mean_ms, p99_ms = [1e3 * x for x in sw["mean_s"]], [1e3 * x for x in sw["p99_s"]]
    closed_ms = [1e3 * x for x in sw["closed_s"]]
    fig = _FIGURE(win_ms, mean_ms, p99_ms, closed_ms, (win_ms[k], mean_ms[k]), 1.15 * max(max(p99_ms), max(closed_ms)))
    ceiling = throughput_ceiling(max_batch, batch_s)
    cost = sw["mean_s"][k] - sw["mean_s"][0]
    rows = [("throughput ceiling B / T", f"{sig(ceiling)} items/s (load {fmt_pct(rate / ceiling)})"),
            ("mean / p99 latency at this window", f"{fmt_time(sw['mean_s'][k])} / {fmt_time(sw['p99_s'][k])}"),
            ("mean latency the window adds over window 0", fmt_time(cost)),
            ("mean batch at this window / at window 0", f"{sig(sw['mean_batch'][k])} / {sig(sw['mean_batch'][0])}"),
            ("a lone item's latency (window + batch)", fmt_time(window_s + batch_s))]
    if rate >= ceiling:
        verdict = ("the arrivals exceed the ceiling: the queue grows for as long as they last, and the latencies "
                   f"shown are those of {N_ITEMS} items only")
    elif cost > 0.05 * sw["mean_s"][0]:
        verdict = "the window costs latency: compare what it buys in batch size"
    else:
        verdict = "the window costs next to nothing here: the size trigger or a busy server sets the batches"
    note = (f"Each point is W04's model (one batch in flight) at one window, {N_ITEMS} Poisson arrivals; the dotted "
            f"line is the closed form for a server that is never busy, which the model meets when batches are cheap. "
            f"{verdict[0].upper()}{verdict[1:]}.")
    change = f"adds {fmt_time(cost)}" if cost >= 0 else f"saves {fmt_time(-cost)}"
    caption = (f"Mean (blue) and p99 (red, dashed) latency against the batching window, the light-load closed form "
               f"dotted. The star, a window of {fmt_time(window_s)}, {change} of mean latency against no window and "
               f"moves the mean batch from {sig(sw['mean_batch'][0])} to {sig(sw['mean_batch'][k])} items.")
    return View("Dynamic batcher: what the window costs and buys", rows, fig, note, caption=caption,
                values=dict(mean_latency_s=sw["mean_s"][k], p99_latency_s=sw["p99_s"][k], window_cost_s=cost,
                            mean_batch=sw["mean_batch"][k], ceiling=ceiling))
