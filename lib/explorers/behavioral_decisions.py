"""Explorer for deciding under uncertainty (N088 deciding-under-uncertainty).

The view calls :mod:`lib.judgment.decisions` only: the expected cost of deciding now against
waiting for the evidence, across the confidence axis, with the threshold reversibility sets. One
persistent matplotlib figure, updated in place.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import FloatRange, View, explorer
from lib.judgment import decisions
from lib.units import fmt_pct, sig

_P = np.linspace(0.0, 1.0, 101)


def _k(usd: float) -> str:
    return f"${sig(usd / 1e3)}k"


def _build(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.now = ax.plot(_P, _P, color="C3", lw=1.8, label="decide now: (1 - p)(R + h w)")[0]
    a.wait = ax.plot(_P, _P, color="C0", lw=1.8, ls="--", label="wait for the evidence: p D w")[0]
    a.bar = ax.axvline(0.5, color="0.35", ls=":", lw=1.2, label="evidence threshold p*")
    a.you = ax.plot([0.5], [0.0], "o", color="k", ms=6, label="your confidence")[0]
    ax.set_xlabel("confidence that the change is good, p")
    ax.set_ylabel("expected cost (k$)")
    ax.set_xlim(0, 1)
    ax.grid(True)
    return a


def _draw(a, now_k, wait_k, p_star, p, cost_k) -> None:
    a.now.set_ydata(now_k)
    a.wait.set_ydata(wait_k)
    a.bar.set_xdata([p_star, p_star])
    a.you.set_data([p], [cost_k])
    a.ax.set_ylim(0, 1.4 * max(float(now_k.max()), float(wait_k.max()), 1e-3))
    figures.legend(a.ax, [a.now, a.wait, a.bar, a.you], fontsize=7, loc="upper center")


_FIGURE = figures.LiveFigure(6.0, 3.2, _build, _draw)


@explorer(
    "behavioral.decision",
    p_good=FloatRange(0.0, 1.0, 0.01, label="confidence the change is good"),
    value_k=FloatRange(0.1, 1000.0, 0.1, label="value a week when good (k$)"),
    harm_k=FloatRange(0.0, 1000.0, 0.1, label="harm a week when bad (k$)"),
    reversal_k=FloatRange(0.0, 5000.0, 0.1, label="cost to reverse (k$)"),
    evidence_weeks=FloatRange(0.1, 26.0, 0.1, label="weeks until the evidence arrives"),
)
def decision_view(p_good: float, value_k: float, harm_k: float, reversal_k: float, evidence_weeks: float) -> View:
    """N088: expected cost of deciding now vs waiting, against the confidence p, and the threshold."""
    case = decisions.decide(p_good, value_k * 1e3, harm_k * 1e3, reversal_k * 1e3, evidence_weeks)
    now_k = (1 - _P) * case.cost_if_wrong_usd / 1e3
    wait_k = _P * case.delay_cost_usd / 1e3
    verdict = "decide now, check in when the evidence arrives" if case.decide_now else "wait for the evidence"
    rows = [("evidence threshold p*", fmt_pct(case.threshold)),
            ("at your confidence", f"{fmt_pct(p_good)}: {verdict}"),
            ("expected cost, deciding now", _k(case.cost_now_usd)),
            ("expected cost, waiting", _k(case.cost_wait_usd)),
            ("a bad change costs (R + h w)", _k(case.cost_if_wrong_usd)),
            ("deciding now ends badly", fmt_pct(case.bad_outcome_probability) + " of the time")]
    cost_k = (case.cost_now_usd if case.decide_now else case.cost_wait_usd) / 1e3
    caption = (f"Expected cost of deciding now (solid) and of waiting {sig(evidence_weeks)} weeks for the evidence "
               f"(dashed) against the confidence p; they cross at p* = {fmt_pct(case.threshold)}, and at "
               f"p = {fmt_pct(p_good)} the better choice is to {verdict.split(',')[0]}.")
    fig = _FIGURE(now_k, wait_k, case.threshold, p_good, cost_k)
    return View("Decide now or wait", rows, fig, caption=caption, note=verdict,
                values={"threshold": case.threshold, "cost_now": case.cost_now_usd, "cost_wait": case.cost_wait_usd})
