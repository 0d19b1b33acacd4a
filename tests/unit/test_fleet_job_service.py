"""W07 llm-job-service: retry/backoff/dead-letter arithmetic, the fair-queue simulation and budgets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import job_service as js


def test_closed_forms():
    assert js.dead_letter_probability(0.1, 4) == pytest.approx(1e-4)
    assert js.expected_attempts(0.5, 3) == pytest.approx(1.75)
    assert js.backoff_schedule(1.0, 10.0, 6) == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert js.expected_backoff_s(2.0, 100.0, 3, 0.5) == pytest.approx(0.5 * 1.0 + 0.25 * 2.0)
    with pytest.raises(ValueError, match="cap_s"):
        js.backoff_schedule(5.0, 1.0, 3)
    with pytest.raises(ValueError, match="f must"):
        js.dead_letter_probability(1.0, 3)


def test_simulation_matches_closed_forms():
    sim = js.simulate_retries(40000, 0.3, 3, 1.0, 8.0, seed=1)
    assert sim.dead_letter_share == pytest.approx(0.027, abs=0.004)
    assert sim.mean_attempts == pytest.approx(js.expected_attempts(0.3, 3), abs=0.01)
    assert sim.mean_wait_s == pytest.approx(js.expected_backoff_s(1.0, 8.0, 3, 0.3), rel=0.05)


def test_outage_tries():
    # waits 2, 4, 8, ... : tries at 0, 2, 6, 14, 30, 62, 126, 254, 510 before 600 s
    assert js.attempts_during_outage(600, 2, 300, 5, 10) == (9, 10)
    assert js.attempts_during_outage(600, 2, 300, 5, 1000)[1] == 120


def test_fifo_starves_and_round_robin_does_not():
    arrivals = {"bulk": [0.0] * 100, "small": [1.0, 2.0, 3.0]}
    fifo = js.simulate_queue(arrivals, 10.0, 4, "fifo")
    rr = js.simulate_queue(arrivals, 10.0, 4, "round_robin")
    assert fifo.waits["small"][0] == pytest.approx(js.fifo_wait_after_burst(100, 10.0, 4, 1.0))
    assert all(w <= math.ceil(2 * (k + 1) / 4) * 10.0 for k, w in enumerate(rr.waits["small"]))
    assert rr.mean("small") < fifo.mean("small")


@settings(max_examples=40, deadline=None)
@given(burst=st.integers(1, 60), small=st.lists(st.floats(0, 50), min_size=1, max_size=8),
       slots=st.integers(1, 8), service=st.floats(0.5, 10))
def test_queue_properties(burst, small, slots, service):
    """Every job runs once, never before it arrives, never more than `slots` at once; FIFO's first small
    job waits the drain arithmetic; round-robin keeps each small job within its turn-taking bound."""
    small = sorted(small)
    arrivals = {"bulk": [0.0] * burst, "small": small}
    for policy in ("fifo", "round_robin"):
        q = js.simulate_queue(arrivals, service, slots, policy)
        assert len(q.waits["bulk"]) == burst and len(q.waits["small"]) == len(small)
        assert min(min(q.waits["bulk"]), min(q.waits["small"])) >= -1e-9
        starts = sorted(list(q.waits["bulk"]) + [t + w for t, w in zip(small, q.waits["small"], strict=True)])
        for i, s in enumerate(starts):  # at most `slots` jobs running at any start
            assert sum(1 for x in starts[:i + 1] if x > s - service + 1e-9) <= slots
    fifo = js.simulate_queue(arrivals, service, slots, "fifo")
    if small[0] > 0:
        assert fifo.waits["small"][0] == pytest.approx(js.fifo_wait_after_burst(burst, service, slots, small[0]),
                                                       abs=1e-9)
    rr = js.simulate_queue(arrivals, service, slots, "round_robin")
    assert all(w <= math.ceil(2 * (k + 1) / slots) * service + 1e-9 for k, w in enumerate(rr.waits["small"]))


def test_budget_admissions_replay():
    from types import SimpleNamespace

    prices = SimpleNamespace(input_usd_per_m=0.3, output_usd_per_m=1.2)
    adm = js.budget_admissions(prices, 2000, 1024, 400, 10.0, 100000)
    left, ran = 10.0, 0
    while left >= adm.estimate_usd:
        left -= adm.actual_usd
        ran += 1
    assert adm.settled == ran and adm.reserve_only == math.floor(10.0 / adm.estimate_usd)
    assert js.budget_admissions(prices, 2000, 1024, 400, 1e-6, 10).settled == 0
    with pytest.raises(ValueError, match="mean_output"):
        js.budget_admissions(prices, 2000, 100, 400, 10.0, 10)
