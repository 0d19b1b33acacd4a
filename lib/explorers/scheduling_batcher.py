"""Explorer for the fixed-cost batcher (W04): latency against throughput as the size cap moves.

Calls lib only: :class:`lib.scheduling.batcher.SizeTimeoutBatcher` driven by
:func:`lib.scheduling.batcher.run_fixed_cost` on seeded Poisson arrivals, and
:func:`lib.scheduling.batcher.throughput_ceiling`. One persistent figure updated in place.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.units import fmt_pct, fmt_time, sig

CAPS = (1, 2, 4, 8, 16, 32, 64, 128)
N_ITEMS = 400


def poisson_arrivals(rate: float, n: int, seed: int) -> list:
    """``n`` Poisson arrival times (s) at ``rate`` per second, seeded."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.mean, = ax.plot([], [], "o-", color="C0", label="mean latency")
    a.p99, = ax.plot([], [], "s--", color="C3", label="p99 latency")
    a.bound = ax.axhline(1.0, color="grey", ls=":", label="bound: timeout + 2 × batch cost")
    a.pick, = ax.plot([], [], "*", color="k", ms=12, label="chosen cap")
    ax.set_xlabel("served items per second")
    ax.set_ylabel("latency (ms)")
    ax.grid(True)
    return a


def _draw(a, thr, mean, p99, bound, pick, xmax, ymax) -> None:
    a.mean.set_data(thr, mean)
    a.p99.set_data(thr, p99)
    a.bound.set_ydata([bound, bound])
    a.pick.set_data([pick[0]], [pick[1]])
    a.ax.set_xlim(0, xmax)
    a.ax.set_ylim(0, ymax)
    figures.legend(a.ax, [a.mean, a.p99, a.bound, a.pick], loc="upper left", fontsize=7)


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "scheduling.fixed_cost_batcher",
    rate=FloatRange(1.0, 2000.0, step=1.0, label="arrivals (items/s)"),
    batch_ms=FloatRange(1.0, 500.0, step=1.0, label="cost of one batch (ms)"),
    timeout_ms=FloatRange(0.0, 500.0, step=1.0, label="batch timeout (ms)"),
    max_batch=IntRange(1, 128, log=True, label="size cap"),
)
def fixed_cost_batcher(rate: float, batch_ms: float, timeout_ms: float, max_batch: int) -> View:
    """W04: each size cap's served throughput and mean / p99 latency for Poisson arrivals at ``rate``,
    a queue bounded at the cap (reject when full), every batch costing ``batch_ms``."""
    from lib.scheduling.batcher import SizeTimeoutBatcher, run_fixed_cost, throughput_ceiling

    if not 1 <= max_batch <= 128:
        raise ValueError(f"max_batch must be an integer from 1 to 128, got {max_batch!r}")
    batch_s, timeout_s = batch_ms / 1e3, timeout_ms / 1e3
    arrivals = poisson_arrivals(rate, N_ITEMS, seed=0)
    caps = sorted(set(CAPS) | {max_batch})
    runs = {b: run_fixed_cost(SizeTimeoutBatcher(b, timeout_s, queue_limit=b), arrivals, batch_s) for b in caps}
    thr = [runs[b].throughput_per_s for b in caps]
    mean = [1e3 * sum(runs[b].latencies_s) / len(runs[b].latencies_s) for b in caps]
    p99 = [1e3 * runs[b].quantile_latency_s(0.99) for b in caps]
    r = runs[max_batch]
    bound = 1e3 * (timeout_s + 2 * batch_s)
    k = caps.index(max_batch)
    fig = _FIGURE(thr, mean, p99, bound, (thr[k], mean[k]), 1.1 * max(max(thr), rate),
                  1.15 * max(max(p99), bound))
    ceiling = throughput_ceiling(max_batch, batch_s)
    rows = [("throughput ceiling B / T", f"{sig(ceiling)} items/s"),
            ("served", f"{sig(r.throughput_per_s)} items/s ({fmt_pct(1 - r.reject_share)} of arrivals)"),
            ("mean batch", f"{sig(r.mean_batch)} of {max_batch}"),
            ("latency mean / p99", f"{fmt_time(mean[k] / 1e3)} / {fmt_time(p99[k] / 1e3)}"),
            ("server busy", fmt_pct(r.busy_share))]
    verdict = ("the cap is too small for this rate: the bounded queue rejects the excess" if ceiling < rate else
               "the cap leaves headroom: every arrival is served")
    note = (f"Each point is one size cap ({', '.join(map(str, caps))}), {N_ITEMS} Poisson arrivals; {verdict}. "
            "Latency never crosses the dotted bound because the queue is capped at one batch.")
    caption = (f"Each point is one size cap, at the throughput it serves and its mean (blue) or p99 (red, dashed) "
               f"latency. The star, a cap of {max_batch}, serves {sig(r.throughput_per_s)} of the {sig(rate)} items/s "
               f"arriving at a mean latency of {fmt_time(mean[k] / 1e3)}, under the dotted bound.")
    return View("Fixed-cost batcher: latency vs throughput by size cap", rows, fig, note, caption=caption,
                values=dict(throughput=r.throughput_per_s, mean_latency_s=mean[k] / 1e3, ceiling=ceiling,
                            reject_share=r.reject_share))
