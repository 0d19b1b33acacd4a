"""Explorer for the p99 suspects (N029): the worst-wait distribution of a healthy fleet against the same
fleet with one suspect injected, and the five separating metrics.

Calls :mod:`lib.sre.tail_suspects` (seeded evidence from the book's serving simulator, cached per
setup; the first draw computes every suspect's, as the page already has) and :mod:`lib.sre.tails`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.units import fmt_time, sig

SUSPECT_CHOICES = ("queueing", "long_prefill", "preemption", "host_stall", "bad_replica")


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.healthy = ax.plot([1e-3, 1.0], [0.0, 1.0], color="0.45", lw=1.6, drawstyle="steps-post", label="healthy")[0]
    a.sick = ax.plot([1e-3, 1.0], [0.0, 1.0], color="C3", lw=1.8, drawstyle="steps-post", label="suspect injected")[0]
    a.q = ax.axhline(0.99, color="C0", ls=":", lw=1.0, label="the quantile")
    a.half = ax.axhline(0.5, color="0.6", ls=":", lw=0.8)
    figures.log_scale(ax, "x")
    ax.set_xlabel("worst wait of a request, max(TTFT, longest token gap) (s)")
    ax.set_ylabel("share of requests at or below")
    ax.grid(True)
    figures.legend(ax, [a.healthy, a.sick, a.q], fontsize=7, loc="lower right")
    return a


def _draw(a, h, s, q) -> None:
    for line, x in ((a.healthy, h), (a.sick, s)):
        xs = np.sort(x)
        line.set_data(xs, np.arange(1, len(xs) + 1) / len(xs))
    a.q.set_ydata([q, q])
    lo = max(min(float(np.min(h)), float(np.min(s))) / 1.3, 1e-4)
    a.ax.set_xlim(lo, max(float(np.max(h)), float(np.max(s))) * 1.3)
    a.ax.set_ylim(0.0, 1.01)


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "sre.tail_suspects",
    suspect=Choice(SUSPECT_CHOICES),
    q=FloatRange(0.9, 0.999, 0.001, label="quantile"),
)
def tail_suspects(suspect: str, q: float, *, setup=None) -> View:
    """N029: a healthy fleet's worst waits against the same fleet with one suspect injected, and the
    metric that separates each suspect. ``setup``: a :class:`lib.sre.tail_suspects.TailSetup` (None:
    the page's defaults); not a widget. The first draw computes the evidence of every suspect, as the
    page already has (:func:`lib.sre.tail_suspects.all_evidence`, cached per setup), so later views only
    read it."""
    from lib.sre import tail_suspects as ts

    s = ts.TailSetup() if setup is None else setup
    if suspect not in ts.SUSPECTS:
        raise ValueError(f"suspect must be one of {', '.join(ts.SUSPECTS)}, got {suspect!r}")
    every = ts.all_evidence(s)
    healthy, sick = every[None], every[suspect]
    m = ts.tail_metrics(sick, q)
    named = ts.diagnose(m)
    hq, sq = float(np.quantile(healthy.worst_wait_s, q)), float(np.quantile(sick.worst_wait_s, q))
    h50, s50 = float(np.median(healthy.worst_wait_s)), float(np.median(sick.worst_wait_s))
    qt = f"{100 * q:g}"
    rows = [("median worst wait, healthy / injected", f"{fmt_time(h50)} / {fmt_time(s50)}"),
            (f"p{qt} worst wait, healthy / injected", f"{fmt_time(hq)} / {fmt_time(sq)}")]
    for k in ts.SUSPECTS:
        fired = "fires" if m[k] >= ts.THRESHOLDS[k] else "quiet"
        rows.append((ts.METRIC_NAMES[k], f"{sig(m[k])} ({fired}, threshold {sig(ts.THRESHOLDS[k])})"))
    rows.append(("diagnosis", named or "none fires"))
    caption = (f"With {suspect.replace('_', ' ')} injected the p{qt} worst wait goes from {fmt_time(hq)} to "
               f"{fmt_time(sq)} ({sig(sq / hq)}x) while the median goes from {fmt_time(h50)} to {fmt_time(s50)}; "
               f"the metrics name {named.replace('_', ' ') if named else 'nothing'}.")
    fig = _FIGURE(healthy.worst_wait_s, sick.worst_wait_s, q)
    return View(f"Tail suspects: {suspect.replace('_', ' ')} injected", rows, fig, caption=caption,
                values={"healthy_q_s": hq, "sick_q_s": sq, **{f"metric_{k}": v for k, v in m.items()}})
