"""The token bucket (N069): the reference against the tick-by-tick oracle, its window bound, the
grader against the drafts, and the page's small simulations."""

from __future__ import annotations

import math
import threading
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import token_bucket as tb
from lib.fleet import token_bucket_practice as tp


def test_reference_passes_and_every_draft_is_caught():
    assert tp.check(tp.variant("reference")).passed
    for name in tp.VARIANTS:
        assert tp.check(tp.variant(name)).status == "failed", name


def test_variant_refuses_unknown_names():
    with pytest.raises(ValueError, match="variant must be"):
        tp.variant("nope")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_random_programs_match_the_oracle(seed):
    tp.run(tb.TokenBucket, tp.random_ops(seed, n=60))


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 20), num=st.integers(1, 16), den=st.sampled_from([1, 2, 4, 8]),
       steps=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=40))
def test_never_more_than_capacity_plus_rate_times_window(capacity, num, den, steps):
    """Property: over every window [t_i, t_j] the admitted tokens are at most C + r (t_j - t_i)."""
    rate = Fraction(num, den)
    clock = tp._Clock()
    b = tb.TokenBucket(capacity, float(rate), clock)
    log = []
    for dt, n in steps:
        clock.t += dt
        if b.try_acquire(n):
            log.append((clock.t, n))
    for i in range(len(log)):
        total = 0
        for j in range(i, len(log)):
            total += log[j][1]
            assert total <= capacity + rate * (log[j][0] - log[i][0])


def test_greedy_client_reaches_the_bound():
    assert tb.greedy_admitted(20, 10, 60) == tb.admission_bound(20, 10, 60) == 620


def test_retry_after_and_header():
    clock = tp._Clock()
    b = tb.TokenBucket(4, 2, clock)
    assert b.retry_after(3) == 0
    assert b.try_acquire(4)
    assert b.retry_after(3) == pytest.approx(1.5)
    assert tb.retry_after_header(1.5) == "2" and tb.retry_after_header(2.0) == "2"
    assert math.isinf(b.retry_after(5)) and tb.retry_after_header(math.inf) is None
    clock.t = 1.5
    assert b.try_acquire(3)


def test_threads_admit_exactly_the_tokens_there():
    b = tb.TokenBucket(100, 1, lambda: 0.0)
    count = []

    def worker():
        count.append(sum(b.try_acquire(1) for _ in range(50)))
    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sum(count) == 100


def test_wall_clock_step_back_freezes_refill_and_naive_code_goes_negative():
    base, _, _ = tb.wall_clock_step(20, 10, 0, 120)
    got, refused, low = tb.wall_clock_step(20, 10, -30, 120)
    assert base - got == pytest.approx(10 * 30, abs=2) and refused == pytest.approx(30, abs=1)
    fwd, _, _ = tb.wall_clock_step(20, 10, 30, 120)
    assert fwd - base == pytest.approx(20, abs=1)
    _, _, low_naive = tb.wall_clock_step(20, 10, -30, 120, guard=False)
    assert low > -1e-6 and low_naive == pytest.approx(-300, abs=2)


def test_burst_retries_drain_no_faster_than_the_rate():
    for policy in ("fixed", "header", "header+jitter"):
        attempts, last = tb.burst_retries(20, 10, 200, policy, seed=3)
        assert attempts >= 200 and last >= (200 - 20) / 10 - 1e-9
    with pytest.raises(ValueError, match="policy"):
        tb.burst_retries(20, 10, 5, "never")


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="capacity"):
        tb.TokenBucket(0, 1)
    with pytest.raises(ValueError, match="rate"):
        tb.TokenBucket(1, -1)
    with pytest.raises(ValueError, match="clock"):
        tb.TokenBucket(1, 1, clock=3)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 12), num=st.integers(1, 8), den=st.sampled_from([1, 2, 4]),
       steps=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6)), min_size=1, max_size=40))
def test_gcra_admits_what_the_bucket_admits(capacity, num, den, steps):
    clock = tp._Clock()
    rate = num / den
    b, g = tb.TokenBucket(capacity, rate, clock), tb.GCRA(capacity, rate, clock)
    for dt, n in steps:
        clock.t += dt
        assert b.try_acquire(n) == g.try_acquire(n)


def test_grader_catches_a_wall_clock_and_an_eager_per_request_refill():
    import time

    class WallClock(tb.TokenBucket):  # right logic, but reads time.time() instead of the injected clock
        def __init__(self, capacity, rate, clock):
            super().__init__(capacity, rate, time.time)

    class EagerPerRequest(tb.TokenBucket):  # credits `rate` on every call, whatever time passed
        def _refill(self):
            self.tokens = min(self.capacity, self.tokens + self.rate)

    wall = tp.check(WallClock)
    assert not wall.passed and "never called the clock it was given" in str(wall)
    assert not tp.check(EagerPerRequest).passed


def test_the_ideal_greedy_client_reaches_the_bound_where_a_coarse_poller_cannot():
    # capacity 1 at 1/s over 600 s: the bound is 601; polling 2,000 times (every 0.3 s) lets the bucket sit
    # at its cap and loses refill, calling as each token is due does not
    assert tb.greedy_admitted(1, 1, 600, calls=None) == 601
    assert tb.greedy_admitted(1, 1, 600) < 601
    assert tb.greedy_admitted(10, 100, 600, calls=None) == math.floor(tb.admission_bound(10, 100, 600))
