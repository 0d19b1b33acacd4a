"""Explorers for canary sizing (I072 canary-sizing).

Views call :mod:`lib.sre.canary` only (normal-approximation and exact binomial sample sizes, power,
stage durations). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.sre import canary
from lib.units import fmt_duration, fmt_int, fmt_pct, sig


@functools.lru_cache(maxsize=256)
def canary_summary(p0: float, p1: float, alpha: float, power: float, qps: float, share: float,
                   window_s: float) -> SimpleNamespace:
    """The requests a verdict needs (normal approximation; ``exact``: the exact test's power there), the time a stage at ``share``
    of ``qps`` takes to collect them, and the power of a canary that runs only ``window_s``."""
    n = canary.requests_needed(p0, p1, alpha, power)
    exact = canary.power_exact(max(1, round(n)), p0, p1, alpha) if n <= 200_000 else math.nan
    have = share * qps * window_s
    have_n = max(1, int(have))
    p_have = canary.power_exact(have_n, p0, p1, alpha) if have_n <= 200_000 else canary.power_normal(have_n, p0, p1, alpha)
    return SimpleNamespace(n=n, exact=exact, stage_s=canary.stage_s(n, share, qps), have=have, power_have=p_have)


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve = ax.plot([1.0], [0.5], color="C0", lw=1.8, label="power (normal approximation)")[0]
    a.need = ax.plot([1.0], [0.5], "o", color="C1", ms=6, label="requests needed")[0]
    a.have = ax.plot([1.0], [0.5], "s", color="C3", ms=6, label="what the window collects (exact test)")[0]
    a.target = ax.axhline(0.8, color="0.4", ls=":", lw=1.2)
    figures.log_scale(ax, "x")
    ax.set_xlabel("requests in the canary")
    ax.set_ylabel("probability of catching the regression")
    ax.set_ylim(0, 1.02)
    ax.grid(True)
    return a


def _draw(a, ns, pw, need, power, have, power_have) -> None:
    a.curve.set_data(ns, pw)
    a.need.set_data([need], [power])
    a.have.set_data([have], [power_have])
    a.target.set_ydata([power, power])
    a.ax.set_xlim(ns[0], ns[-1])
    figures.legend(a.ax, [a.curve, a.need, a.have], fontsize=7, loc="lower right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "sre.canary",
    p0_pct=FloatRange(0.01, 10.0, 0.01, label="baseline bad rate (%)"),
    ratio=FloatRange(1.1, 10.0, 0.1, label="regressed / baseline"),
    alpha=Choice((0.01, 0.05, 0.1), label="false-alarm rate"),
    power=Choice((0.8, 0.9, 0.95), label="power"),
    qps=FloatRange(1.0, 10000.0, 1.0, label="requests per second"),
    share_pct=FloatRange(0.1, 50.0, 0.1, label="canary share (%)"),
    window_min=FloatRange(1.0, 240.0, 1.0, label="canary runs (minutes)"),
)
def canary_size(p0_pct: float, ratio: float, alpha: float, power: float, qps: float, share_pct: float,
                window_min: float) -> View:
    """I072: requests per verdict to catch p0 -> ratio x p0, the time a stage takes, and the power of a
    canary that runs only ``window_min``."""
    p0 = p0_pct / 100.0
    p1 = min(ratio * p0, 0.999)
    if not p1 > p0:
        raise ValueError("the regressed rate must exceed the baseline: lower the baseline or the ratio")
    share = share_pct / 100.0
    s = canary_summary(p0, p1, alpha, power, qps, share, window_min * 60.0)
    hi = max(10 * s.n, 10 * s.have, 100.0)
    ns = np.logspace(0, math.log10(hi), 80)
    pw = np.array([canary.power_normal(n, p0, p1, alpha) for n in ns])
    rows = [("regression", f"{fmt_pct(p0)} -> {fmt_pct(p1)} bad"),
            ("requests per verdict", f"{fmt_int(s.n)} (normal approximation)"),
            ("exact binomial power there", fmt_pct(s.exact) if math.isfinite(s.exact) else "(too many requests to sum)"),
            ("stage time at this share", fmt_duration(s.stage_s)),
            (f"a {sig(window_min)}-minute canary sees", f"{fmt_int(s.have)} requests"),
            ("and catches the regression with", fmt_pct(s.power_have))]
    caption = (f"Probability of catching {fmt_pct(p0)} -> {fmt_pct(p1)} against the requests in the canary (log x); "
               f"{fmt_int(s.n)} requests reach {fmt_pct(power)}, while {sig(window_min)} minutes at {fmt_pct(share)} of "
               f"{sig(qps)} requests/s collect {fmt_int(s.have)} and catch it {fmt_pct(s.power_have)} of the time.")
    fig = _FIGURE(ns, pw, s.n, power, max(s.have, 1.0), s.power_have)
    return View(f"Canary sizing: {fmt_pct(p0)} -> {fmt_pct(p1)}", rows, fig, caption=caption,
                note="too small" if s.power_have < power else "big enough",
                values={"n": s.n, "power_have": s.power_have, "stage_s": s.stage_s})
