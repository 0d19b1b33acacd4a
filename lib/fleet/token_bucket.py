"""A token bucket: two parameters, a lazy refill, one lock, a monotonic clock and a retry-after.

* ``capacity`` (tokens) is the burst: the most a client can spend at once after being idle.
  ``rate`` (tokens/s) is the sustained refill. Over ANY window of length ``t`` the bucket admits at
  most ``capacity + rate x t`` tokens (:func:`admission_bound`); a greedy client reaches it.
* Lazy refill: no timer thread. Each call reads the clock once and credits
  ``min(capacity, tokens + rate x (now - last))``; O(1) per call, exact to the float.
* One lock around refill, check and take: the check-then-take is the race.
* The clock is injected (default :func:`time.monotonic`). A wall clock steps (NTP, VM resume,
  a manual fix); a reading earlier than one already seen counts as no time passing and never moves
  ``last`` back, so a step back neither refuses everyone nor credits the same seconds twice.
* :meth:`TokenBucket.retry_after`: seconds until ``n`` tokens are there if nobody else takes them,
  ``(n - tokens) / rate``; ``math.inf`` when ``n > capacity`` (it never fits: a 4xx, not a 429).

The oracle (:class:`TickOracle`) simulates the bucket one clock tick at a time with exact fractions;
:func:`greedy_admitted`, :func:`wall_clock_step` and :func:`burst_retries` are the small
simulations the N069 page prices its claims with. SI units: tokens, seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from fractions import Fraction

from lib.inputs import integer, real

_EPS = 1e-9  # tokens: the float slack of a refill summed from many small steps

__all__ = ["GCRA", "TickOracle", "TokenBucket", "admission_bound", "burst_retries", "greedy_admitted",
           "greedy_trace", "retry_after_header", "wall_clock_step"]


class TokenBucket:
    """``capacity`` tokens of burst, refilled at ``rate`` tokens/s, read through ``clock`` (module doc).

    Starts full. ``try_acquire(n)`` takes ``n`` tokens and returns True, or takes nothing and
    returns False; ``retry_after(n)`` says when ``n`` would fit."""

    def __init__(self, capacity: float, rate: float, clock: Callable[[], float] = time.monotonic):
        self.capacity = real("capacity", capacity, 0, low_open=True, unit="tokens")
        self.rate = real("rate", rate, 0, low_open=True, unit="tokens/s")
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        self.clock = clock
        self.tokens = self.capacity
        self.last = clock()
        self.lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        if now > self.last:  # a reading at or before the last one credits nothing
            self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def try_acquire(self, n: float = 1) -> bool:
        """Take ``n`` tokens if they are there (True), else take nothing (False)."""
        with self.lock:
            self._refill()
            if self.tokens >= n - _EPS:  # floats summed over many small refills fall a hair short
                self.tokens -= n
                return True
            return False

    def retry_after(self, n: float = 1) -> float:
        """Seconds until ``n`` tokens are there if nobody else takes any: max(0, n - tokens) / rate;
        ``math.inf`` when ``n`` exceeds the capacity (it never fits)."""
        with self.lock:
            self._refill()
            if n > self.capacity:
                return math.inf
            return max(0.0, n - self.tokens) / self.rate

    def refund(self, n: float) -> None:
        """Give back ``n`` tokens taken earlier (a settled reservation that used less), capped at capacity."""
        with self.lock:
            self._refill()
            self.tokens = min(self.capacity, self.tokens + real("n", n, 0, unit="tokens"))

    def debit(self, n: float) -> None:
        """Take ``n`` tokens whatever the balance (a settled reservation that used more): the balance may go
        negative, and the key waits until the refill repays it."""
        with self.lock:
            self._refill()
            self.tokens -= real("n", n, 0, unit="tokens")

    def available(self) -> float:
        """Tokens in the bucket now."""
        with self.lock:
            self._refill()
            return self.tokens


class GCRA:
    """The same contract with one number: the theoretical arrival time ``tat``. A request of ``n``
    tokens is admitted when ``now >= tat + n / rate - capacity / rate`` (with ``tat`` no earlier than
    now), and then ``tat = max(tat, now) + n / rate``. Admits exactly what :class:`TokenBucket` admits."""

    def __init__(self, capacity: float, rate: float, clock: Callable[[], float] = time.monotonic):
        self.capacity = real("capacity", capacity, 0, low_open=True, unit="tokens")
        self.rate = real("rate", rate, 0, low_open=True, unit="tokens/s")
        self.clock = clock
        self.tat = clock()  # a full bucket: the schedule is empty

    def try_acquire(self, n: float = 1) -> bool:
        now = self.clock()
        tat = max(self.tat, now)
        if tat + n / self.rate - now <= self.capacity / self.rate + _EPS / self.rate:
            self.tat = tat + n / self.rate
            return True
        return False


def admission_bound(capacity: float, rate: float, window_s: float) -> float:
    """The most tokens a bucket admits in any window of ``window_s`` seconds: capacity + rate x window."""
    c = real("capacity", capacity, 0, low_open=True, unit="tokens")
    r = real("rate", rate, 0, low_open=True, unit="tokens/s")
    return c + r * real("window_s", window_s, 0, unit="seconds")


def retry_after_header(seconds: float) -> str | None:
    """The HTTP ``Retry-After`` value (whole seconds, rounded UP so a client that obeys it finds the
    tokens there), or None when the request can never fit (answer 413/400, not 429)."""
    if math.isinf(seconds):
        return None
    return str(math.ceil(real("seconds", seconds, 0) - 1e-12))


class TickOracle:
    """The brute force: integer clock ticks, one refill of ``rate`` (a Fraction) per tick, capped at
    ``capacity``; a clock reading at or before the newest seen adds no ticks."""

    def __init__(self, capacity, rate, t0: int = 0):
        self.capacity, self.rate = Fraction(capacity), Fraction(rate)
        self.tokens, self.t = Fraction(capacity), int(t0)

    def advance(self, now: int) -> None:
        while self.t < now:
            self.t += 1
            self.tokens = min(self.capacity, self.tokens + self.rate)

    def acquire(self, now: int, n) -> bool:
        self.advance(now)
        if self.tokens >= n:
            self.tokens -= Fraction(n)
            return True
        return False

    def retry_after_ticks(self, now: int, n) -> int | float:
        """Whole ticks until ``n`` tokens are there, counted one tick at a time (inf: never)."""
        self.advance(now)
        if n > self.capacity:
            return math.inf
        k, tok = 0, self.tokens
        while tok < n:
            k += 1
            tok = min(self.capacity, tok + self.rate)
        return k


class _FakeClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def greedy_trace(capacity: float, rate: float, window_s: float, calls: int | None = 2000,
                 factory: Callable = TokenBucket) -> tuple[list[float], list[float]]:
    """A greedy client on a bucket built by ``factory(capacity, rate, clock)``, full at t = 0: it
    calls ``calls + 1`` times evenly over [0, window_s] and each time takes every whole token there.
    ``calls=None``: it calls at t = 0 and then each time the next whole token is due at ``rate`` (the
    ideal greedy client: a client polling on a grid coarser than (capacity - 1) / rate lets the
    bucket sit at its cap and loses refill). Returns (call times, cumulative tokens admitted)."""
    w = real("window_s", window_s, 0, low_open=True, unit="seconds")
    clock = _FakeClock()
    b = factory(capacity, rate, clock)
    got, ts, out = 0.0, [], []
    if calls is None:
        r = real("rate", rate, 0, low_open=True, unit="tokens/s")
        if w * r > 1_000_000:
            raise ValueError(f"window_s x rate = {w * r:.3g} calls; at most 1,000,000 are simulated")
        t = 0.0
        while True:
            clock.t = t
            avail = b.available()
            whole = math.floor(avail + _EPS)
            if whole >= 1 and b.try_acquire(whole):
                got += whole
            ts.append(t)
            out.append(got)
            if t >= w:
                return ts, out
            frac = b.available()
            t = min(w, t + max(1.0 - frac, 0.0) / r if frac < 1.0 - _EPS else t + 1.0 / r)
    n = integer("calls", calls, 1, 1_000_000)
    for k in range(n + 1):
        clock.t = w * k / n
        whole = math.floor(b.available() + _EPS)
        if whole >= 1 and b.try_acquire(whole):
            got += whole
        ts.append(clock.t)
        out.append(got)
    return ts, out


def greedy_admitted(capacity: float, rate: float, window_s: float, calls: int | None = 2000,
                    factory: Callable = TokenBucket) -> float:
    """Tokens the greedy client of :func:`greedy_trace` gets in ``window_s``: floor(capacity + rate x
    window) for a correct bucket (it never sits at the cap, so nothing refilled is wasted)."""
    return greedy_trace(capacity, rate, window_s, calls, factory)[1][-1]


def wall_clock_step(capacity: float, rate: float, step_s: float, horizon_s: float, *,
                    guard: bool = True, dt_s: float | None = None, at_s: float | None = None) -> tuple[float, float, float]:
    """A client asks for one token every ``dt_s`` of real time (default: twice the rate); at ``at_s``
    (default: once the burst is drained) the clock the bucket reads
    steps by ``step_s`` (negative: back, as an NTP correction does to a wall clock). Returns (tokens
    admitted in ``horizon_s`` real seconds, the longest run of real seconds in which every request was
    refused, the lowest token count reached). ``guard=False``: the naive refill that credits
    ``rate x (now - last)`` even when negative and always sets ``last = now``."""
    real("step_s", step_s)
    dt_s = 0.5 / rate if dt_s is None else dt_s  # twice the rate: the bucket is empty whenever it can be
    at_s = capacity / rate + 1.0 if at_s is None else at_s  # after the burst is drained
    clock = _FakeClock()
    b = TokenBucket(capacity, rate, clock)
    got, longest, start, lowest = 0.0, 0.0, None, b.tokens
    for k in range(int(round(real("horizon_s", horizon_s, 0, low_open=True) / dt_s)) + 1):
        t = k * dt_s
        clock.t = t + (step_s if t >= at_s else 0.0)
        if guard:
            ok = b.try_acquire(1)
        else:
            now = clock.t
            b.tokens = min(b.capacity, b.tokens + (now - b.last) * b.rate)
            b.last = now
            ok = b.tokens >= 1 - _EPS
            if ok:
                b.tokens -= 1
        lowest = min(lowest, b.tokens)
        if ok:
            got += 1
            if start is not None:
                longest, start = max(longest, t - start), None
        elif start is None:
            start = t
    if start is not None:
        longest = max(longest, horizon_s - start)
    return got, longest, lowest


def burst_retries(capacity: float, rate: float, clients: int, policy: str, *, backoff_s: float = 1.0,
                  seed: int = 0, cost: float = 1.0, limit_s: float = 3600.0) -> tuple[int, float]:
    """``clients`` each want ``cost`` tokens at t = 0 from a full bucket; a refused client comes back
    by ``policy``: ``"fixed"`` (every ``backoff_s``, no header), ``"header"`` (at its Retry-After,
    rounded up to whole seconds) or ``"header+jitter"`` (at Retry-After plus a uniform draw over the
    time the queue in front of it needs, ``clients x cost / rate``). Returns (attempts in all, time the
    last client got in)."""
    import heapq
    import random

    n = integer("clients", clients, 1, 100_000)
    if policy not in ("fixed", "header", "header+jitter"):
        raise ValueError(f"policy must be 'fixed', 'header' or 'header+jitter', got {policy!r}")
    rng = random.Random(seed)
    clock = _FakeClock()
    b = TokenBucket(capacity, rate, clock)
    spread = n * cost / rate
    events = [(0.0, i) for i in range(n)]
    heapq.heapify(events)
    attempts, last_in = 0, 0.0
    while events:
        t, i = heapq.heappop(events)
        if t > limit_s:
            break
        clock.t = t
        attempts += 1
        if b.try_acquire(cost):
            last_in = t
            continue
        if policy == "fixed":
            nxt = t + backoff_s
        else:
            ra = float(retry_after_header(b.retry_after(cost)))
            ra = max(ra, 1.0)  # a header says at least 1 s
            nxt = t + ra + (rng.uniform(0, spread) if policy == "header+jitter" else 0.0)
        heapq.heappush(events, (nxt, i))
    return attempts, last_in
