"""lib.judgment.plans: business-day calendar, evidence dates, dated plans and triggers."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import plans

dates = st.dates(dt.date(2020, 1, 1), dt.date(2035, 12, 31))


def _walk(start: dt.date, n: int) -> dt.date:
    """Oracle: roll forward to a weekday, then step n weekdays, one calendar day at a time."""
    day = start
    while day.weekday() >= 5:
        day += dt.timedelta(days=1)
    left = n
    while left:
        day += dt.timedelta(days=1)
        if day.weekday() < 5:
            left -= 1
    return day


@given(dates, st.integers(0, 400))
@settings(max_examples=300, deadline=None)
def test_business_day_against_a_calendar_walk(start, n):
    assert plans.business_day(start, n) == _walk(start, n)


@given(dates, st.integers(0, 400))
@settings(max_examples=200, deadline=None)
def test_business_days_between_inverts(start, n):
    s = plans.business_day(start, 0)
    assert plans.business_days_between(s, plans.business_day(s, n)) == n


@given(dates, st.floats(0, 200, allow_nan=False))
@settings(max_examples=200, deadline=None)
def test_evidence_date_is_first_weekday_after(start, days):
    e = plans.evidence_date(start, days)
    assert e.weekday() < 5
    assert e >= start + dt.timedelta(days=days) - dt.timedelta(days=1e-9)
    assert (e - start).days <= days + 3 + 1


def test_examples():
    assert plans.business_day("2026-03-02", 5) == dt.date(2026, 3, 9)
    assert plans.business_day("2026-03-07", 0) == dt.date(2026, 3, 9)  # Saturday rolls to Monday
    assert plans.evidence_date("2026-03-02", 8.06) == dt.date(2026, 3, 11)
    assert plans.fmt_date("2026-03-02") == "Mon 2 Mar 2026"


def test_build_plan_marks_late_decisions():
    p = plans.build_plan("2026-03-02", [plans.Milestone("fix", 10)],
                         [plans.DecisionPoint("a", 20, "x", 0, 10.0), plans.DecisionPoint("b", 5, "y", 3, 30.0)])
    assert p.milestones[0][1] == dt.date(2026, 3, 16)
    assert [d.point.name for d in p.late] == ["b"]
    assert p.decisions[0].ready and p.decisions[0].slack_business_days > 0


def test_trigger():
    assert plans.Trigger("t", 5, 3).fires and not plans.Trigger("t", 2, 3).fires
    assert plans.Trigger("t", 2, 3, "<=").fires
    with pytest.raises(ValueError):
        plans.Trigger("t", 1, 2, ">")


@pytest.mark.parametrize("bad", ["2026-13-01", "tomorrow", 20260301, None])
def test_bad_dates(bad):
    with pytest.raises(ValueError):
        plans.parse_date(bad)


def test_calendar_day_and_weeks_until():
    assert plans.calendar_day("2026-03-02", 30) == 22  # Mon 2 Mar + 30 days = Wed 1 Apr, 22 weekdays later
    assert plans.weeks_until(1.0, 0.05) == 0.0
    assert plans.weeks_until(2.0, 0.0) == float("inf")
    import math
    assert plans.weeks_until(1.03 ** 8, 0.03) == pytest.approx(8.0)
    assert math.isclose(plans.weeks_until(1.5, 0.1), math.log(1.5) / math.log(1.1))


def test_trigger_accepts_infinite_runway():
    assert not plans.Trigger("runway", float("inf"), 12, "<=").fires
    with pytest.raises(ValueError):
        plans.Trigger("t", float("nan"), 1)


def test_ninety_day_plan_shape():
    from lib.explorers.behavioral_plans import ninety_day_plan

    p = ninety_day_plan("2026-03-02", 7.0, 8.06, 6.0)
    names = [m.name for m, _ in p.milestones]
    assert names[3].startswith("day-30") and p.milestones[3][1] == dt.date(2026, 4, 1)
    assert [d.ready for d in p.decisions] == [True, True, True]
    slow = ninety_day_plan("2026-03-02", 7.0, 60.0, 20.0)
    assert not slow.decisions[1].ready and not slow.decisions[2].ready


def test_first_month_plan_and_request_map():
    from lib.explorers.behavioral_plans import first_month_plan, request_map

    p = first_month_plan("2026-03-02", 2.0)
    assert p.decisions[0].decide_on == dt.date(2026, 3, 27) and p.decisions[0].ready
    assert not first_month_plan("2026-03-02", 15.0).decisions[0].ready
    cold, warm = request_map("llama-3.1-8b", "h100-sxm", 1, 1000, 16, 0.05, 0.0)
    assert cold.client_s - warm.client_s == pytest.approx(cold.connect_s)
    assert sum(v for _, v in cold.parts()) == pytest.approx(cold.client_s)
