"""Explorers for the behavioral pages about incidents and the people in them (N085
postmortems-that-change-things, N081 a-mistake-you-made, N086 mentoring-under-pressure).

Views call :mod:`lib.judgment.incident_people` (which calls :mod:`lib.sre` for every budget, burn and
detection quantity). One persistent matplotlib figure per explorer, updated in place.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, View, explorer
from lib.judgment import incident_people as ip
from lib.sre import incidents
from lib.units import fmt_count, fmt_duration, fmt_pct, sig

DAY_S = 86400.0
MONTH_S = 30 * DAY_S
TARGETS = (0.99, 0.995, 0.999, 0.9995, 0.9999)

# ---- N085: what an action item is worth ------------------------------------------------------------------------

ITEM_KINDS = (("owned and dated", "C0", "-"), ("no owner, no date", "C3", "--"), ("owned, dated, vague", "C1", ":"))


def item_kinds(owned_close_days: float, decor_close_days: float, decor_abandon: float, fix_effect: float,
               vague_fix_effect: float) -> tuple[tuple[str, float, float, float], ...]:
    """(label, mean close seconds, abandon probability, fix effect) of the three kinds of action item: a
    mechanism with an owner and a date; the same mechanism with neither (abandoned or slow); an owned,
    dated item that names a behaviour ("be more careful"), closed on time and fixing little. ValueError when
    the vague item would fix more than the mechanism (the comparison the page makes would invert)."""
    if vague_fix_effect > fix_effect:
        raise ValueError(f"vague_fix_effect ({vague_fix_effect:g}) must not exceed fix_effect ({fix_effect:g}): "
                         "an item that names a behaviour fixes at most what the mechanism does")
    return (("owned and dated", owned_close_days * DAY_S, 0.0, fix_effect),
            ("no owner, no date", decor_close_days * DAY_S, decor_abandon, fix_effect),
            ("owned, dated, vague", owned_close_days * DAY_S, 0.0, vague_fix_effect))


def _build_items(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.lines = [ax.plot([0], [0], color=c, ls=ls, lw=1.8, label=label)[0] for label, c, ls in ITEM_KINDS]
    a.none = ax.plot([0], [0], color="0.5", lw=1.0, label="no item at all")[0]
    ax.set_xlabel("months after the postmortem")
    ax.set_ylabel("expected repeat incidents (cumulative)")
    ax.grid(True)
    return a


def _draw_items(a, months, curves, none) -> None:
    for line, y in zip(a.lines, curves, strict=True):
        line.set_data(months, y)
    a.none.set_data(months, none)
    a.ax.set_xlim(0, months[-1])
    a.ax.set_ylim(0, max(1e-9, float(none[-1])) * 1.05)
    figures.legend(a.ax, [*a.lines, a.none], fontsize=7, loc="upper left")


_ITEMS = figures.LiveFigure(6.0, 3.2, _build_items, _draw_items)


@explorer(
    "behavioral.action_items",
    recur_per_month=FloatRange(0.05, 10.0, 0.05, label="the cause recurs (a month, before any fix)"),
    horizon_months=FloatRange(1.0, 36.0, 1.0, label="months looked ahead"),
    owned_close_days=FloatRange(1.0, 120.0, 1.0, label="owned item: mean days to close"),
    decor_close_days=FloatRange(7.0, 365.0, 1.0, label="unowned item: mean days, when it closes"),
    decor_abandon=FloatRange(0.0, 1.0, 0.05, label="unowned item: share never done"),
    fix_effect=FloatRange(0.0, 1.0, 0.05, label="a mechanism removes (share of recurrences)"),
    vague_fix_effect=FloatRange(0.0, 1.0, 0.05, label="a vague item removes"),
)
def action_items(recur_per_month: float, horizon_months: float, owned_close_days: float, decor_close_days: float,
                 decor_abandon: float, fix_effect: float, vague_fix_effect: float) -> View:
    """N085: expected repeat incidents of one cause after its postmortem, by the kind of action item."""
    rate = recur_per_month / MONTH_S
    months = np.linspace(0.0, horizon_months, 61)
    kinds = item_kinds(owned_close_days, decor_close_days, decor_abandon, fix_effect, vague_fix_effect)
    curves = [np.array([incidents.expected_repeats(rate, m * MONTH_S, c, ab, fx) for m in months]) for _, c, ab, fx in kinds]
    none = rate * months * MONTH_S
    rows = [(f"{label}: repeats in {horizon_months:g} months", f"{sig(float(y[-1]))} "
             f"(done by 90 days: {fmt_pct(incidents.closed_by(90 * DAY_S, c, ab))})")
            for (label, c, ab, _), y in zip(kinds, curves, strict=True)]
    rows.append(("no item at all", sig(float(none[-1]))))
    owned, decor = float(curves[0][-1]), float(curves[1][-1])
    caption = (f"Expected repeat incidents of one cause over {horizon_months:g} months after its postmortem: "
               f"{sig(owned)} with an owned, dated item against {sig(decor)} with the same item unowned.")
    return View("Action items priced in repeat incidents", rows, _ITEMS(months, curves, none), caption=caption,
                values={"owned": owned, "decor": decor, "vague": float(curves[2][-1]), "none": float(none[-1])})


# ---- N081: the price of a mistake and of the canary that would have caught it -----------------------------------


def mistake_and_canary(fail_share: float, target: float, qps: float, rollback_s: float, canary_share: float,
                       bake_s: float, baseline: float = 0.0005, customer_s: float = 4 * 3600.0
                       ) -> SimpleNamespace:
    """The one-step rollout's incident (``fail_share`` of requests bad from the push, detected by the first
    Workbook rule or a customer after ``customer_s``, rolled back ``rollback_s`` later) and the canary stage
    that would have caught it (:func:`lib.judgment.incident_people.canary_catch`)."""
    rule, rule_s = incidents.first_detection(fail_share, target)
    ttd = min(rule_s, customer_s)
    inc = incidents.Incident(0.0, 0.0, ttd, ttd + rollback_s, ttd + rollback_s, fail_share)
    cc = ip.canary_catch(fail_share, baseline, canary_share, qps, target, rollback_s, bake_s=bake_s)
    return SimpleNamespace(rule=rule if rule_s <= customer_s else "customer report", incident=inc,
                           budget=inc.budget_spent(target), canary=cc)


def _build_mistake(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.16, top=0.93)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.bars = ax.bar([0, 1], [1.0, 1.0], color=["C3", "C0"], width=0.55)
    ax.set_xticks([0, 1], ["one-step rollout", "canary stage first"])
    figures.log_scale(ax, "y")
    ax.set_ylabel("share of the month's error budget")
    ax.grid(True, axis="y")
    a.labels = [ax.text(i, 1.0, "", ha="center", va="bottom", fontsize=8) for i in (0, 1)]
    return a


def _draw_mistake(a, full, canary_b) -> None:
    for bar, lab, v in zip(a.bars, a.labels, (full, canary_b), strict=True):
        bar.set_height(v)
        lab.set_position((bar.get_x() + bar.get_width() / 2, v))
        lab.set_text(fmt_pct(v))
    a.ax.set_ylim(min(full, canary_b) / 3, max(full, canary_b) * 4)


_MISTAKE = figures.LiveFigure(6.0, 3.0, _build_mistake, _draw_mistake)


@explorer(
    "behavioral.mistake_price",
    fail_share=FloatRange(0.001, 0.9, 0.001, label="share of requests the change broke"),
    target=Choice(TARGETS, label="availability SLO"),
    qps=FloatRange(1.0, 100000.0, 1.0, label="requests per second"),
    rollback_min=FloatRange(1.0, 240.0, 1.0, label="detection to rolled back (min)"),
    canary_share=FloatRange(0.001, 0.5, 0.001, label="canary share of traffic"),
    bake_min=FloatRange(0.0, 240.0, 1.0, label="canary verdict read after (min)"),
)
def mistake_price(fail_share: float, target: float, qps: float, rollback_min: float, canary_share: float,
                  bake_min: float) -> View:
    """N081: the budget a one-step rollout of a broken change spent, against a canary stage that catches it."""
    r = mistake_and_canary(fail_share, target, qps, rollback_min * 60, canary_share, bake_min * 60)
    cc = r.canary
    rows = [("found by", f"{r.rule.replace('_', ' ')} after {fmt_duration(r.incident.time_to_detect_s)}"),
            ("budget spent, one-step rollout", fmt_pct(r.budget)),
            ("failed requests", fmt_count(qps * fail_share * r.incident.impact_duration_s)),
            ("canary verdict needs", f"{fmt_count(cc.requests)} requests, collected in {fmt_duration(cc.collect_s)}"),
            ("canary alarms after", fmt_duration(cc.detect_s)),
            ("budget spent with the canary", f"{fmt_pct(cc.budget)} ({sig(r.budget / cc.budget)}x less)")]
    caption = (f"Error budget spent by the broken change: {fmt_pct(r.budget)} shipped in one step against "
               f"{fmt_pct(cc.budget)} with a {fmt_pct(canary_share)} canary stage first (log scale).")
    return View("The mistake, priced, and the canary that would have caught it", rows,
                _MISTAKE(r.budget, cc.budget), caption=caption, values={"budget": r.budget, "canary": cc.budget})



# ---- N086: the take-over point ---------------------------------------------------------------------------------


def _build_takeover(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    a.curve = ax.plot([0], [0], color="C0", lw=1.8, label="expected time to mitigate, taking over at t")[0]
    a.limit = ax.axhline(1.0, color="C3", ls="--", lw=1.2, label="limit: your time + allowance")
    a.you = ax.axhline(1.0, color="C2", ls=":", lw=1.2, label="your time from the hand-off")
    a.point = ax.axvline(0.0, color="0.3", lw=1.0, label="take-over point")
    ax.set_xlabel("take-over time t, minutes since the hand-off")
    ax.set_ylabel("minutes to mitigation")
    ax.grid(True)
    return a


def _draw_takeover(a, t_min, finish_min, limit_min, you_min, point_min) -> None:
    a.curve.set_data(t_min, finish_min)
    a.limit.set_ydata([limit_min, limit_min])
    a.you.set_ydata([you_min, you_min])
    a.point.set_xdata([point_min, point_min])
    a.ax.set_xlim(0, t_min[-1])
    a.ax.set_ylim(0, max(float(np.max(finish_min)), limit_min) * 1.1)
    figures.legend(a.ax, [a.curve, a.limit, a.you, a.point], fontsize=7, loc="lower right")


def takeover_words(plan) -> str:
    """The take-over point in words: 'at once', 'never' or 'after <duration>'."""
    return ("at once" if plan.takeover_s == 0 else "never" if math.isinf(plan.takeover_s)
            else f"after {fmt_duration(plan.takeover_s)}")


_TAKEOVER = figures.LiveFigure(6.0, 3.2, _build_takeover, _draw_takeover)


@explorer(
    "behavioral.takeover",
    bad_fraction=FloatRange(0.001, 1.0, 0.001, label="share of requests failing"),
    target=Choice(TARGETS, label="availability SLO"),
    budget_left=FloatRange(0.01, 1.0, 0.01, label="share of the month's budget left"),
    mentee_median_min=FloatRange(1.0, 240.0, 1.0, label="mentee: median minutes to mitigate"),
    mentee_sigma=FloatRange(0.1, 2.0, 0.05, label="mentee: spread (log-sd)"),
    your_min=FloatRange(1.0, 120.0, 1.0, label="you: minutes to mitigate, context included"),
    allowance=FloatRange(0.0, 0.5, 0.005, label="budget allowed for teaching (share)"),
)
def takeover(bad_fraction: float, target: float, budget_left: float, mentee_median_min: float, mentee_sigma: float,
             your_min: float, allowance: float) -> View:
    """N086: the expected time to mitigate as a function of when the mentor takes over, against the limit (your
    time plus the allowance) whose last crossing is the take-over point."""
    p = ip.takeover_plan(bad_fraction, target, budget_left, mentee_median_min * 60, mentee_sigma, your_min * 60,
                         allowance)
    median_s = mentee_median_min * 60
    shown = p.takeover_s if math.isfinite(p.takeover_s) else median_s * 20
    span = max(min(shown * 1.5, median_s * 20), median_s * 2, 60.0)  # the point, unless far in the tail
    t = np.linspace(0.0, span, 80)
    finish = np.array([ip.expected_finish_s(x, median_s, mentee_sigma, your_min * 60) for x in t]) / 60
    point = takeover_words(p) + (" (the mentee is almost surely done by then)"
                                 if 0 < p.takeover_s < math.inf and p.p_mentee > 0.999 else "")
    binds = {"allowance": "the allowance is used up", "last chance": "your fix must still beat the breach",
             "never": "coaching to the end fits the allowance"}[p.reason]
    rows = [("burn rate", f"{sig(p.burn)} x"),
            ("remaining budget gone in", fmt_duration(p.breach_s)),
            ("teaching allowance at this burn", fmt_duration(p.allowance_s)),
            ("take over", f"{point} ({binds})"),
            ("mentee mitigates it themself", fmt_pct(p.p_mentee)),
            ("expected budget: plan / never take over / take over at once",
             f"{fmt_pct(p.budget_plan)} / {fmt_pct(p.budget_mentee_only)} / {fmt_pct(p.budget_you_only)}")]
    caption = (f"Taking over at t, the incident is expected to last E[min(T, t)] + P(T > t) x your time; the take-over "
               f"point is the last t where that stays under your time plus the allowance, {fmt_duration(p.limit_s)}"
               + (", moved earlier so that your own fix still lands before the budget is gone"
                  if p.reason == "last chance" else "") + f": {point}.")
    return View("When to stop asking and take over", rows,
                _TAKEOVER(t / 60, finish, p.limit_s / 60, your_min, min(shown, span) / 60), caption=caption,
                values={"takeover_s": p.takeover_s, "p_mentee": p.p_mentee})
