"""Explorers for postmortem programmes (N055 postmortem-process).

Views call :func:`lib.sre.incidents.simulate_program` only: a seeded history of incidents from
recurring causes with and without action-item tracking. One persistent matplotlib figure.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, IntRange, View, explorer
from lib.sre import incidents
from lib.units import fmt_duration, fmt_pct, sig

PERIOD_S = 30 * 86400.0


@functools.lru_cache(maxsize=128)
def program_compare(months: int, incidents_per_month: float, n_causes: int, tracked_close_days: float,
                    untracked_close_days: float, untracked_abandon: float, fix_effect: float, runs: int = 6,
                    seed: int = 0, target: float = 0.999, share_median: float = 0.03) -> dict:
    """Pooled over ``runs`` seeds, for ``tracked`` True and False: per-month repeat share and mean
    detection gap, incidents a month, closure within 30 and 90 days, items open at the end and their
    median age, budget spent a month."""
    out = {}
    for tracked in (True, False):
        rs = [incidents.simulate_program(months, incidents_per_month, n_causes, tracked, seed=seed + k, target=target,
                                         share_median=share_median, tracked_close_days=tracked_close_days,
                                         untracked_close_days=untracked_close_days,
                                         untracked_abandon=untracked_abandon, fix_effect=fix_effect)
              for k in range(runs)]
        n_per = int(math.ceil(months * 30 * 86400.0 / PERIOD_S))
        counts = np.zeros(n_per)
        reps = np.zeros(n_per)
        ttd = np.zeros(n_per)
        for r in rs:
            idx = np.minimum((r.times_s // PERIOD_S).astype(int), n_per - 1)
            np.add.at(counts, idx, 1)
            np.add.at(reps, idx, r.repeat)
            np.add.at(ttd, idx, r.ttd_s)
        with np.errstate(invalid="ignore", divide="ignore"):
            repeat_m = reps / counts
            ttd_m = ttd / counts
        items_open = np.concatenate([r.item_open_s for r in rs])
        items_close = np.concatenate([r.item_close_s for r in rs])
        horizon = rs[0].horizon_s

        def closed(days: float, opened=items_open, shut=items_close, end=horizon) -> float:
            old = opened <= end - days * 86400
            return float(np.mean(shut[old] - opened[old] <= days * 86400)) if old.any() else math.nan

        ages = np.concatenate([r.open_ages_s() for r in rs])
        out[tracked] = SimpleNamespace(
            repeat_m=repeat_m, ttd_m=ttd_m, incidents_m=counts / runs, closed30=closed(30), closed90=closed(90),
            open_end=ages.size / runs, open_age_median_s=float(np.median(ages)) if ages.size else 0.0,
            repeat=float(np.sum(reps) / np.sum(counts)), ttd_mean_s=float(np.sum(ttd) / np.sum(counts)),
            budget_m=sum(float(r.budget.sum()) for r in rs) / runs / months,
            last_quarter_incidents=float(np.mean(counts[-3:]) / runs))
    return out


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.rep_t = ax.plot([0], [0], color="C0", lw=1.8, label="tracked items")[0]
    a.rep_u = ax.plot([0], [0], color="C3", lw=1.8, ls="--", label="untracked items")[0]
    ax.set_xlabel("month")
    ax.set_ylabel("share of incidents repeating a known cause")
    ax.set_ylim(0, 1)
    ax.grid(True)
    return a


def _draw(a, t, u) -> None:
    x = np.arange(1, t.repeat_m.size + 1)
    a.rep_t.set_data(x, t.repeat_m)
    a.rep_u.set_data(x, u.repeat_m)
    a.ax.set_xlim(1, max(2, x.size))
    figures.legend(a.ax, [a.rep_t, a.rep_u], fontsize=7, loc="upper left")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "sre.postmortem_program",
    months=IntRange(3, 24, label="months simulated"),
    incidents_per_month=FloatRange(1.0, 30.0, 0.5, label="incidents a month (before fixes)"),
    n_causes=IntRange(2, 60, label="recurring causes"),
    tracked_close_days=FloatRange(3.0, 90.0, 1.0, label="tracked: mean days to close"),
    untracked_abandon=FloatRange(0.0, 1.0, 0.05, label="untracked: share never closed"),
    fix_effect=FloatRange(0.0, 1.0, 0.05, label="a closed item removes (share of recurrences)"),
)
def postmortem_program(months: int, incidents_per_month: float, n_causes: int, tracked_close_days: float,
                       untracked_abandon: float, fix_effect: float) -> View:
    """N055: repeat incidents and detection gaps month by month, with and without tracked action items."""
    runs = max(2, min(6, round(1000 / (months * incidents_per_month))))  # keep an update near 100 ms
    res = program_compare(months, incidents_per_month, n_causes, tracked_close_days, 60.0, untracked_abandon,
                          fix_effect, runs=runs)
    t, u = res[True], res[False]
    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else fmt_pct(x)

    rows = [("items closed within 30 days", f"{pct(t.closed30)} tracked, {pct(u.closed30)} untracked"),
            ("items closed within 90 days", f"{pct(t.closed90)} tracked, {pct(u.closed90)} untracked"),
            ("repeat incidents", f"{fmt_pct(t.repeat)} tracked, {fmt_pct(u.repeat)} untracked"),
            ("mean time to detect", f"{fmt_duration(t.ttd_mean_s)} tracked, {fmt_duration(u.ttd_mean_s)} untracked"),
            ("incidents a month, last quarter", f"{sig(t.last_quarter_incidents)} tracked, {sig(u.last_quarter_incidents)} untracked"),
            ("budget spent a month", f"{fmt_pct(t.budget_m)} tracked, {fmt_pct(u.budget_m)} untracked")]
    caption = (f"Share of incidents that repeat a cause already postmortemed, month by month, with tracked action items "
               f"(solid) and untracked (dashed): over {months} months {fmt_pct(t.repeat)} against {fmt_pct(u.repeat)}.")
    fig = _FIGURE(t, u)
    return View(f"Postmortem programme over {months} months", rows, fig, caption=caption,
                note=f"{runs} seeded histories pooled per setting",
                values={"repeat_tracked": t.repeat, "repeat_untracked": u.repeat})
