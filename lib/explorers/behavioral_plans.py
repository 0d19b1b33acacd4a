"""Explorers for dated plans and the first map of a system (N090 ninety-day-plan, N082
first-month-on-the-team).

The plans themselves are built here once, from :mod:`lib.judgment.plans` (the calendar, milestones,
decision points and when their evidence arrives), so a page and its explorer date the same plan:
:func:`ninety_day_plan` and :func:`first_month_plan`. Evidence durations come from the book's models
(:func:`lib.judgment.decisions.evidence_days`, :mod:`lib.sre.canary`). :func:`request_map` is a request's
time to first token part by part (:func:`lib.fleet.ttft.ttft_parts`, the book's one TTFT model) on a new
and a reused connection. One persistent matplotlib figure per explorer, updated in place.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from types import SimpleNamespace

from lib.book import figures
from lib.book.widgets import Choice, FloatRange, IntRange, Text, View, explorer
from lib.inputs import real
from lib.judgment import decisions, plans
from lib.units import fmt_pct, sig

#: Committed work of the first 30 days of the ninety-day plan: (name, business day it is done by).
NINETY_MILESTONES = (("postmortems and incident history read", 8),
                     ("the map: where requests' time and GPUs go", 12),
                     ("committed win on one region (canary)", 15))
CANARY_DAY = 15  # business day the committed win starts its canary (the last milestone above)


def ninety_day_plan(start, bake_days: float, quality_days: float, trend_weeks: float) -> plans.Plan:
    """The ninety-day plan's dated shape from ``start``: the first month's milestones, the readouts on
    calendar days 30, 60 and 90, and three decision points with the evidence each needs:

    * lift the batch cap everywhere, decided the business day before the day-30 readout, on the
      canary's ``bake_days`` (from the canary day);
    * the second bet (FP8 KV cache), decided at the day-60 readout, on ``quality_days`` of judged
      answers on mirrored traffic (from the canary day);
    * the GPU request for next quarter, decided on calendar day 75, on ``trend_weeks`` of traffic
      growth (from day 0)."""
    bake = real("bake_days", bake_days, 0, low_open=True, unit="calendar days")
    qd = real("quality_days", quality_days, 0, low_open=True, unit="calendar days")
    tw = real("trend_weeks", trend_weeks, 0, low_open=True, unit="weeks")
    d30, d60, d75, d90 = (plans.calendar_day(start, k) for k in (30, 60, 75, 90))
    ms = [plans.Milestone(n, d) for n, d in NINETY_MILESTONES]
    ms += [plans.Milestone("day-30 readout: the shape of days 31-90", d30), plans.Milestone("day-60 readout", d60),
           plans.Milestone("day-90 readout", d90)]
    ds = [plans.DecisionPoint("lift the batch cap everywhere", d30 - 1, "p99 TPOT on the canary through a full weekly cycle",
                              CANARY_DAY, bake),
          plans.DecisionPoint("second bet: FP8 KV cache", d60, "judged answer quality on mirrored traffic", CANARY_DAY, qd),
          plans.DecisionPoint("GPU request for next quarter", d75, "a trend of weekly traffic growth", 0, 7 * tw)]
    return plans.build_plan(start, ms, ds)


#: The first month (N082): (name, business day it is done by).
MONTH_MILESTONES = (("the postmortems read, as one set", 5),
                    ("the map: a request's path and where its time goes", 10),
                    ("one small fix in canary", 13),
                    ("the list of questions nobody could answer, shared", 19))
FIX_CANARY_DAY = 13


def first_month_plan(start, fix_evidence_days: float) -> plans.Plan:
    """The first month (20 business days) from ``start``: read, map, one small fix in canary, the
    question list; one decision point: ship the fix everywhere on business day 19, on
    ``fix_evidence_days`` of canary evidence from the canary day."""
    fe = real("fix_evidence_days", fix_evidence_days, 0, low_open=True, unit="calendar days")
    ms = [plans.Milestone(n, d) for n, d in MONTH_MILESTONES]
    ds = [plans.DecisionPoint("ship the small fix everywhere", 19, "the canary's p99 through its bake", FIX_CANARY_DAY, fe)]
    return plans.build_plan(start, ms, ds)


def _day(plan: plans.Plan, d: dt.date) -> float:
    return float((d - plan.start).days)


def _build(fig, n_rows: int) -> SimpleNamespace:
    fig.subplots_adjust(left=0.40, right=0.97, bottom=0.14, top=0.97)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax, n=n_rows)
    a.bars = [ax.barh(i, 1.0, left=0.0, height=0.5, color="C0", alpha=0.35)[0] for i in range(n_rows)]
    a.marks = [ax.plot([0.0], [i], marker="D", color="C0", ms=5, ls="none")[0] for i in range(n_rows)]
    a.lines = [ax.axvline(x, color="0.5", ls=":", lw=1.0) for x in (30, 60, 90)]
    ax.set_yticks(range(n_rows))
    ax.set_ylim(n_rows - 0.5, -0.5)
    ax.set_xlabel("calendar days from the start")
    ax.grid(True, axis="x")
    return a


def _draw(a, labels, spans, marks, colors, xmax, vlines) -> None:
    a.ax.set_yticklabels(labels, fontsize=7)
    for bar, (lo, hi), col in zip(a.bars, spans, colors, strict=True):
        bar.set_x(lo)
        bar.set_width(max(hi - lo, 0.0))
        bar.set_color(col)
        bar.set_alpha(0.35)
    for i, (m, x, col) in enumerate(zip(a.marks, marks, colors, strict=True)):
        m.set_data([x], [i])
        m.set_color(col)
    for line, x in zip(a.lines, vlines, strict=True):
        line.set_xdata([x, x])
    a.ax.set_xlim(0, xmax)


def _timeline_rows(plan: plans.Plan):
    """(labels, evidence spans, decision or milestone marks, colors) of a plan, in calendar days."""
    labels, spans, marks, colors = [], [], [], []
    for m, d in plan.milestones:
        labels.append(m.name)
        spans.append((0.0, 0.0))
        marks.append(_day(plan, d))
        colors.append("0.3")
    for d in plan.decisions:
        labels.append("decide: " + d.point.name)
        frm = _day(plan, plans.business_day(plan.start, d.point.evidence_from))
        spans.append((frm, _day(plan, d.evidence_on)))
        marks.append(_day(plan, d.decide_on))
        colors.append("C2" if d.ready else "C3")
    return labels, spans, marks, colors


_NINETY = figures.LiveFigure(6.4, 3.4, lambda fig: _build(fig, len(NINETY_MILESTONES) + 6), _draw)

_DATES = Text(("2026-03-02", "2026-07-03", "2027-01-01", "2026-12-21"), max_chars=10, label="start date (YYYY-MM-DD)")


@explorer(
    "behavioral.ninety_days",
    start=_DATES,
    bake_days=FloatRange(1.0, 28.0, 1.0, label="canary bake (days)"),
    judged_per_day=FloatRange(100.0, 100000.0, 100.0, label="answers judged a day"),
    regression=FloatRange(1.1, 2.0, 0.05, label="quality regression to catch (x)"),
    trend_weeks=FloatRange(1.0, 16.0, 1.0, label="weeks of growth data for the GPU request"),
    headroom=FloatRange(1.0, 3.0, 0.01, label="headroom the win frees (x)"),
    growth_pct=FloatRange(0.0, 20.0, 0.1, label="traffic growth a week (%)"),
    lead_weeks=IntRange(1, 52, label="GPU lead time (weeks)"),
)
def ninety_days_view(start: str, bake_days: float, judged_per_day: float, regression: float, trend_weeks: float,
                     headroom: float, growth_pct: float, lead_weeks: int) -> View:
    """N090: the dated shape of ninety days, each decision point's evidence window (green: in time,
    red: late), and whether the capacity trigger fires."""
    quality_days = decisions.evidence_days(0.02, min(0.02 * regression, 0.999), judged_per_day)
    plan = ninety_day_plan(start, bake_days, quality_days, trend_weeks)
    labels, spans, marks, colors = _timeline_rows(plan)
    runway = plans.weeks_until(headroom, growth_pct / 100)
    fires = runway <= lead_weeks
    xmax = max(95.0, *(hi for _, hi in spans), *marks) + 3
    fig = _NINETY(labels, spans, marks, colors, xmax, (30.0, 60.0, 90.0))
    rows = [("starts", plans.fmt_date(plan.start))]
    rows += [(d.point.name, f"decide {plans.fmt_date(d.decide_on)}, evidence {plans.fmt_date(d.evidence_on)}: "
              + ("in time" if d.ready else "LATE")) for d in plan.decisions]
    rows.append(("runway the win buys", "never runs out" if math.isinf(runway) else f"{sig(runway)} weeks at "
                 f"{fmt_pct(growth_pct / 100)} a week"))
    rows.append(("capacity trigger", "fires: capacity becomes the plan" if fires else "holds"))
    late = [d.point.name for d in plan.late]
    caption = (f"Ninety days from {plans.fmt_date(plan.start)}: milestones (grey diamonds), each decision point's evidence "
               f"window (bar) and decision day (diamond); "
               + (f"{len(late)} decision point(s) come before their evidence (red)." if late else
                  "every decision point's evidence arrives in time (green)."))
    return View("Ninety days, dated", rows, fig, caption=caption,
                note="capacity trigger fires" if fires else "capacity trigger holds",
                values={"late": float(len(late)), "runway_weeks": runway})


@functools.lru_cache(maxsize=64)
def _dep(model: str, gpu: str, tp: int):
    from lib.perf.deployment import deployment

    return deployment(model, gpu, tp=tp)


def request_map(model: str, gpu: str, tp: int, prompt_len: int, batch: int, rtt_s: float, queue_s: float):
    """(cold, warm) :class:`lib.fleet.ttft.TTFTParts` of one request: a new connection and a reused one, with
    ``queue_s`` in the engine's queue and half a decode step (``lib.perf.throughput.step_s`` at ``batch`` and
    the prompt's context) of waiting for the running step."""
    from lib.fleet.ttft import ttft_parts
    from lib.inputs import integer
    from lib.perf.throughput import step_s

    dep = _dep(model, gpu, integer("tp", tp, 1))
    wait = step_s(dep, integer("batch", batch, 1, unit="sequences"), integer("prompt_len", prompt_len, 1, unit="tokens")) / 2
    kw = dict(rtt_s=rtt_s, queue_s=queue_s, step_wait_s=wait)
    return ttft_parts(dep, prompt_len, warm=False, **kw), ttft_parts(dep, prompt_len, warm=True, **kw)


PART_LABELS = {"connect_s": "connect (TCP + TLS)", "upload_s": "upload", "gateway_s": "gateway", "routing_s": "routing",
               "queue_s": "engine queue", "step_wait_s": "running step", "prefill_s": "prefill", "downlink_s": "downlink"}


def _build_map(fig) -> SimpleNamespace:
    fig.subplots_adjust(left=0.30, right=0.97, bottom=0.16, top=0.95)
    ax = fig.add_subplot()
    a = SimpleNamespace(ax=ax)
    n = len(PART_LABELS)
    a.cold = ax.barh([i - 0.2 for i in range(n)], [0.0] * n, height=0.38, color="C3", label="new connection")
    a.warm = ax.barh([i + 0.2 for i in range(n)], [0.0] * n, height=0.38, color="C0", label="reused connection")
    ax.set_yticks(range(n))
    ax.set_yticklabels(list(PART_LABELS.values()), fontsize=7)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("milliseconds of the client's time to first token")
    ax.grid(True, axis="x")
    figures.legend(ax, [a.cold, a.warm], fontsize=7, loc="center right")
    return a


def _draw_map(a, cold_ms, warm_ms) -> None:
    for bar, v in zip(a.cold, cold_ms, strict=True):
        bar.set_width(v)
    for bar, v in zip(a.warm, warm_ms, strict=True):
        bar.set_width(v)
    a.ax.set_xlim(0, 1.05 * max(max(cold_ms), 1e-3))


_MAP = figures.LiveFigure(6.0, 3.2, _build_map, _draw_map)


@explorer(
    "behavioral.request_map",
    model=Choice(("llama-3.1-70b", "llama-3.1-8b", "qwen2.5-72b", "mixtral-8x7b"), label="model"),
    gpu=Choice(("h100-sxm", "h200", "b200"), label="GPU"),
    tp=Choice((1, 2, 4, 8), label="GPUs per replica"),
    prompt_len=IntRange(64, 32768, label="prompt tokens"),
    batch=IntRange(1, 512, label="running batch"),
    rtt_ms=FloatRange(1.0, 300.0, 1.0, label="client round trip (ms)"),
    queue_ms=FloatRange(0.0, 5000.0, 1.0, label="engine queue wait (ms)"),
    cold_pct=FloatRange(0.0, 100.0, 1.0, label="requests on a new connection (%)"),
)
def request_map_view(model: str, gpu: str, tp: int, prompt_len: int, batch: int, rtt_ms: float, queue_ms: float,
                     cold_pct: float) -> View:
    """N082: a request's time to first token part by part, on a new and a reused connection, what the
    engine's own TTFT metric sees, and what connection reuse saves on the mean."""
    cold, warm = request_map(model, gpu, tp, prompt_len, batch, rtt_ms / 1e3, queue_ms / 1e3)
    cold_ms = [1e3 * v for _, v in cold.parts()]
    warm_ms = [1e3 * v for _, v in warm.parts()]
    share = cold_pct / 100
    mean_s = share * cold.client_s + (1 - share) * warm.client_s
    saved_s = share * (cold.client_s - warm.client_s)
    biggest = max(cold.parts(), key=lambda kv: kv[1])[0]
    rows = [("client TTFT, new connection", f"{sig(1e3 * cold.client_s)} ms"),
            ("client TTFT, reused connection", f"{sig(1e3 * warm.client_s)} ms"),
            ("the engine's TTFT metric sees", f"{sig(1e3 * cold.engine_s)} ms ({fmt_pct(cold.engine_s / mean_s)} of the mean)"),
            ("largest part (new connection)", PART_LABELS[biggest]),
            ("reusing connections saves on the mean", f"{sig(1e3 * saved_s)} ms ({fmt_pct(saved_s / mean_s)})")]
    caption = (f"Where a request's first token waits, part by part, on a new connection (red) and a reused one (blue): "
               f"{sig(1e3 * cold.client_s)} ms against {sig(1e3 * warm.client_s)} ms, of which the engine's own metric "
               f"sees {sig(1e3 * cold.engine_s)} ms.")
    fig = _MAP(cold_ms, warm_ms)
    return View("A request's path: where its time goes", rows, fig, caption=caption,
                note=f"largest part: {PART_LABELS[biggest]}",
                values={"client_cold_s": cold.client_s, "client_warm_s": warm.client_s, "saved_s": saved_s})
