"""Explorers for SLOs and burn-rate alerts (N052 slos-and-burn-rate).

Views call :mod:`lib.sre.slo` only (budgets, burn rates, the Workbook's multiwindow rules and their
closed-form detection times). One persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.sre import slo
from lib.units import fmt_duration, fmt_pct, sig

TARGETS = (0.99, 0.995, 0.999, 0.9995, 0.9999)


@functools.lru_cache(maxsize=512)
def alert_table(target: float, bad_fraction: float) -> SimpleNamespace:
    """Each Workbook rule against a step to ``bad_fraction`` (from 0) under an SLO of ``target``:
    its threshold, detection time, the budget spent when it fires, and the time to spend the whole
    budget at that burn. Values: SimpleNamespace(burn, exhaustion_s, budget_s, rules={name: ...})."""
    burn = slo.burn_rate(bad_fraction, target)
    rules = {}
    for r in slo.workbook_rules():
        t = slo.rule_detection_s(r, bad_fraction, target)
        rules[r.name] = SimpleNamespace(rule=r, threshold=r.threshold(target), detect_s=t,
                                        spent=slo.budget_consumed(burn, t) if math.isfinite(t) else math.nan)
    return SimpleNamespace(burn=burn, exhaustion_s=slo.exhaustion_s(burn), budget_s=slo.error_budget_s(target),
                           rules=rules)


def detection_curves(target: float, burns: np.ndarray) -> dict[str, np.ndarray]:
    """Detection time (s) of each rule against the burn rate (NaN where the rule never fires)."""
    budget = slo.error_budget(target)
    out = {}
    for r in slo.workbook_rules():
        ts = [slo.rule_detection_s(r, min(1.0, b * budget), target) for b in burns]
        out[r.name] = np.array([t if math.isfinite(t) else math.nan for t in ts])
    return out


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, lines={}, dots={})
    for k, r in enumerate(slo.workbook_rules()):
        a.lines[r.name] = ax.plot([1.0], [1.0], color=f"C{k}", lw=1.8, label=f"{r.name} (burn {sig(r.burn)})")[0]
        a.dots[r.name] = ax.plot([1.0], [1.0], "o", color=f"C{k}", ms=5)[0]
    a.exhaust = ax.plot([1.0], [1.0], color="0.4", ls=":", lw=1.2, label="whole budget spent")[0]
    a.now = ax.axvline(1.0, color="0.3", lw=0.8)
    figures.log_scale(ax, "both")
    ax.set_xlabel("burn rate (bad fraction / error budget)")
    ax.set_ylabel("time to fire (hours)")
    ax.grid(True)
    return a


def _draw(a, burns, curves, exhaust_h, now_burn, dots) -> None:
    for name, line in a.lines.items():
        line.set_data(burns, curves[name] / 3600.0)
        t = dots[name]
        a.dots[name].set_data([now_burn], [t / 3600.0] if math.isfinite(t) else [math.nan])
    a.exhaust.set_data(burns, exhaust_h)
    a.now.set_xdata([now_burn, now_burn])
    a.ax.set_xlim(burns[0], burns[-1])
    a.ax.set_ylim(1e-3, 1e3)
    figures.legend(a.ax, list(a.lines.values()) + [a.exhaust], fontsize=7, loc="upper right")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "sre.burn_alerts",
    target=Choice(TARGETS, label="SLO target (good fraction)"),
    bad_pct=FloatRange(0.01, 100.0, 0.01, label="bad requests (%)"),
)
def burn_alerts(target: float, bad_pct: float) -> View:
    """N052: how long each multiwindow burn-rate rule takes to fire on a step to ``bad_pct`` bad requests."""
    e = bad_pct / 100.0
    tab = alert_table(target, e)
    burns = np.logspace(-1, math.log10(1.0 / slo.error_budget(target)), 80)
    curves = detection_curves(target, burns)
    exhaust_h = np.array([slo.exhaustion_s(b) for b in burns]) / 3600.0
    rows = [("error budget", f"{fmt_pct(slo.error_budget(target))} of requests, {sig(tab.budget_s / 60)} min a month"),
            ("burn rate", f"{sig(tab.burn)} (whole budget gone in {fmt_duration(tab.exhaustion_s)})")]
    for name, r in tab.rules.items():
        fire = fmt_duration(r.detect_s)
        spent = f", {fmt_pct(r.spent)} of the budget spent" if math.isfinite(r.detect_s) else ""
        rows.append((f"{name} (> {fmt_pct(r.threshold)} bad)", fire + spent))
    first = min(tab.rules.values(), key=lambda r: r.detect_s)
    if math.isfinite(first.detect_s):
        caption = (f"Time to fire against the burn rate (log-log); at burn {sig(tab.burn)} the {first.rule.name} rule "
                   f"fires first, after {fmt_duration(first.detect_s)}, having spent {fmt_pct(first.spent)} of the "
                   "budget; the dotted line is the time to spend all of it.")
    else:
        caption = (f"Time to fire against the burn rate (log-log); at burn {sig(tab.burn)} no rule ever fires: "
                   f"the budget would last {fmt_duration(tab.exhaustion_s)}.")
    fig = _FIGURE(burns, curves, exhaust_h, tab.burn, {n: r.detect_s for n, r in tab.rules.items()})
    return View(f"Burn-rate alerts at a {fmt_pct(target, 4)} SLO, {fmt_pct(e)} bad", rows, fig, caption=caption,
                note="each rule fires with its own share of the budget spent, whatever the burn, once it fires at all",
                values={"burn": tab.burn, **{f"detect_{n}": r.detect_s for n, r in tab.rules.items()}})
