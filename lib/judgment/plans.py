"""Dated plans: business-day calendars, when evidence arrives, and a plan's decision points and
triggers (N082 first-month-on-the-team, N088 deciding-under-uncertainty, N090 ninety-day-plan).

* Calendar: :func:`parse_date`, :func:`business_day` (the n-th business day after a start, Monday to
  Friday, no holidays), :func:`business_days_between`, :func:`calendar_day` ("day 30" as a business-day
  index), :func:`evidence_date` (the first business day on or after evidence that takes ``days``
  calendar days to accumulate has arrived).
* A plan is a list of :class:`Milestone` (a committed piece of work placed at a business-day offset)
  and :class:`DecisionPoint` (a decision with the evidence it needs and when that evidence arrives);
  :func:`build_plan` dates them and says which decision points fall after their deadline.
* :class:`Trigger`: a condition that would change the plan, written as a computed test of an
  observed value against a threshold (``observed >= threshold`` or ``<=``); :func:`weeks_until` is the
  runway of a growing load (the test behind a capacity trigger).

Dates are ``datetime.date``; durations in business days (integers) or calendar days (floats).
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass

import numpy as np

from lib.inputs import integer, real

__all__ = ["DecisionPoint", "Milestone", "Plan", "Trigger", "build_plan", "business_day", "business_days_between",
           "calendar_day", "evidence_date", "fmt_date", "parse_date", "weeks_until"]


def parse_date(value) -> _dt.date:
    """A ``datetime.date`` from an ISO ``'YYYY-MM-DD'`` string or a date; ValueError otherwise."""
    if isinstance(value, _dt.datetime):
        return value.date()
    if isinstance(value, _dt.date):
        return value
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise ValueError(f"date must be an ISO date 'YYYY-MM-DD' (e.g. '2026-03-02'), got {value!r}")


def _np(d: _dt.date) -> np.datetime64:
    return np.datetime64(d.isoformat(), "D")


def _py(d: np.datetime64) -> _dt.date:
    return _dt.date.fromisoformat(str(d))


def business_day(start, n: int) -> _dt.date:
    """The date ``n`` business days (Mon-Fri) after ``start``; ``start`` itself is first rolled forward to
    a business day, so ``business_day(saturday, 0)`` is the next Monday."""
    s = parse_date(start)
    k = integer("n", n, 0, unit="business days")
    return _py(np.busday_offset(_np(s), k, roll="forward"))


def business_days_between(a, b) -> int:
    """Business days in [a, b): how many working days separate two dates (negative when b < a)."""
    return int(np.busday_count(_np(parse_date(a)), _np(parse_date(b))))


def calendar_day(start, days: int) -> int:
    """The business-day index (from ``start`` rolled to a business day) of the day ``days`` calendar days
    after it: "day 30" of a plan as the business day a milestone is placed on."""
    s = business_day(start, 0)
    return business_days_between(s, s + _dt.timedelta(days=integer("days", days, 0, unit="calendar days")))


def weeks_until(ratio: float, growth_per_week: float) -> float:
    """Weeks until a load growing ``growth_per_week`` (compounded weekly) has grown by ``ratio``:
    ln(ratio) / ln(1 + g); inf when it does not grow, 0 when ``ratio`` <= 1 (already there)."""
    r = real("ratio", ratio, 0, low_open=True)
    g = real("growth_per_week", growth_per_week, -1, low_open=True, unit="(fraction a week)")
    if r <= 1:
        return 0.0
    return math.inf if g <= 0 else math.log(r) / math.log1p(g)


def evidence_date(start, days: float) -> _dt.date:
    """The first business day on or after ``start + days`` (calendar days, rounded up to whole days): the
    day a check-in can read evidence that accumulates around the clock for ``days``."""
    d = real("days", days, 0, unit="calendar days")
    if not math.isfinite(d):
        raise ValueError("days must be finite: evidence that never arrives has no check-in date")
    s = parse_date(start) + _dt.timedelta(days=math.ceil(d - 1e-9))
    return _py(np.busday_offset(_np(s), 0, roll="forward"))


def fmt_date(d) -> str:
    """``'Mon 2 Mar 2026'``: a date as a person reads it in a plan."""
    d = parse_date(d)
    return f"{d.strftime('%a')} {d.day} {d.strftime('%b %Y')}"


@dataclass(frozen=True)
class Milestone:
    """Committed work: ``name`` done ``day`` business days after the plan's start."""

    name: str
    day: int


@dataclass(frozen=True)
class DecisionPoint:
    """A decision the plan leaves open: taken on business day ``decide_day``, it needs ``evidence``,
    which starts accumulating on business day ``evidence_from`` and takes ``evidence_days`` calendar days."""

    name: str
    decide_day: int
    evidence: str
    evidence_from: int
    evidence_days: float


@dataclass(frozen=True)
class DatedDecision:
    point: DecisionPoint
    decide_on: _dt.date
    evidence_on: _dt.date

    @property
    def ready(self) -> bool:
        """The evidence has arrived by the decision date."""
        return self.evidence_on <= self.decide_on

    @property
    def slack_business_days(self) -> int:
        """Business days between the evidence arriving and the decision (negative: it arrives late)."""
        return business_days_between(self.evidence_on, self.decide_on)


@dataclass(frozen=True)
class Plan:
    start: _dt.date
    milestones: tuple[tuple[Milestone, _dt.date], ...]
    decisions: tuple[DatedDecision, ...]

    @property
    def late(self) -> tuple[DatedDecision, ...]:
        """Decision points whose evidence arrives after their decision date."""
        return tuple(d for d in self.decisions if not d.ready)


def build_plan(start, milestones=(), decisions=()) -> Plan:
    """Date a plan that begins on ``start`` (rolled forward to a business day): each milestone on its
    business day, each decision point on its decision day with the date its evidence arrives
    (:func:`evidence_date` from the business day it starts accumulating)."""
    s = business_day(start, 0)
    ms = []
    for m in milestones:
        if not isinstance(m, Milestone):
            raise ValueError(f"milestones must be Milestone records, got {type(m).__name__}")
        ms.append((m, business_day(s, integer(f"{m.name}: day", m.day, 0, unit="business days"))))
    ds = []
    for d in decisions:
        if not isinstance(d, DecisionPoint):
            raise ValueError(f"decisions must be DecisionPoint records, got {type(d).__name__}")
        on = business_day(s, integer(f"{d.name}: decide_day", d.decide_day, 0, unit="business days"))
        frm = business_day(s, integer(f"{d.name}: evidence_from", d.evidence_from, 0, unit="business days"))
        ds.append(DatedDecision(d, on, evidence_date(frm, d.evidence_days)))
    return Plan(s, tuple(ms), tuple(ds))


@dataclass(frozen=True)
class Trigger:
    """A condition that changes the plan: fires when ``observed`` crosses ``threshold`` in ``direction``
    (``">="``: at or above; ``"<="``: at or below)."""

    name: str
    observed: float
    threshold: float
    direction: str = ">="
    then: str = ""

    def __post_init__(self) -> None:
        if self.direction not in (">=", "<="):
            raise ValueError(f"{self.name}: direction must be '>=' or '<=', got {self.direction!r}")
        for what, v in (("observed", self.observed), ("threshold", self.threshold)):
            if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
                raise ValueError(f"{self.name}: {what} must be a number (inf allowed, e.g. a runway that never ends), "
                                 f"got {v!r}")

    @property
    def fires(self) -> bool:
        return self.observed >= self.threshold if self.direction == ">=" else self.observed <= self.threshold
