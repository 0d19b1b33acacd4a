"""Practice mode for the token bucket (N069): write the bucket, graded against a tick-by-tick oracle.

The candidate writes a class with :class:`Skeleton`'s interface. A case is a program of operations
``("at", t)`` (the injected clock now reads ``t``, an integer tick; it may step back),
``("acquire", n)``, ``("retry_after", n)`` and ``("threads", k, m)`` (``k`` threads each try ``m``
single-token acquires while the clock stands still), run on a fresh bucket built as
``factory(capacity, rate, clock)`` (the first operation of every case is
``("config", capacity, rate)``). The oracle (:class:`lib.fleet.token_bucket.TickOracle`) refills one
tick at a time with exact fractions. After every operation the grader checks:

* ``acquire`` admits exactly when the oracle does (a clock reading earlier than one already seen
  counts as no time passing);
* over every window between two admissions, the tokens admitted are at most
  ``capacity + rate x window``;
* ``retry_after(n)`` rounds up to the oracle's count of ticks until ``n`` tokens are there, and is
  ``math.inf`` when ``n > capacity``; it takes nothing;
* the threaded acquires admit exactly what the oracle would admit one after another.

The defective drafts (:data:`VARIANTS`) are the reference with one classic mistake each.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .token_bucket import TickOracle, TokenBucket

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "random_ops", "run", "variant"]

QUESTION = "Token bucket with lazy refill and retry-after (N069)"


class Skeleton:
    """A token bucket: ``capacity`` tokens of burst, refilled at ``rate`` tokens per second of
    ``clock()``, starting full; safe to call from several threads."""

    def __init__(self, capacity: float, rate: float, clock: Callable[[], float]):
        """``clock()`` returns seconds; a reading earlier than one already seen means no time passed."""
        raise NotImplementedError

    def try_acquire(self, n: float = 1) -> bool:
        """Take ``n`` tokens and return True if they are there; otherwise take nothing, return False."""
        raise NotImplementedError

    def retry_after(self, n: float = 1) -> float:
        """Seconds until ``n`` tokens are there if nobody else takes any (0 if they are there now);
        ``math.inf`` if ``n`` can never fit. Takes nothing."""
        raise NotImplementedError


_DRAFTS = {
    "no cap at capacity": (
        "the refill adds rate x elapsed without the min with capacity: after an idle hour a client can spend "
        "an hour of tokens at once",
        {"_refill": [("self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)",
                      "self.tokens = self.tokens + (now - self.last) * self.rate")]}),
    "capacity used as the rate": (
        "capacity and rate conflated: the bucket refills its whole burst every second",
        {"_refill": [("self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)",
                      "self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.capacity)")]}),
    "fixed window reset": (
        "the bucket is reset to full once per capacity / rate seconds (a fixed-window counter): two "
        "bursts back to back across the reset",
        {"_refill": [("if now > self.last:  # a reading at or before the last one credits nothing\n"
                      "self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)\n"
                      "self.last = now",
                      "if now - self.last >= self.capacity / self.rate:\n"
                      "    self.tokens = self.capacity\n"
                      "    self.last = now")]}),
    "whole tokens only": (
        "the refill credits whole tokens but moves last to now: the fraction is lost on every call, so a "
        "client calling often at a low rate is starved",
        {"_refill": [("self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)",
                      "self.tokens = min(self.capacity, self.tokens + math.floor((now - self.last) * self.rate))")]}),
    "clock steps back": (
        "no guard for a clock that steps back (a wall clock under NTP): the negative elapsed time drains the "
        "bucket below zero and the key is refused until the clock catches up",
        {"_refill": [("if now > self.last:  # a reading at or before the last one credits nothing\n"
                      "self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)\n"
                      "self.last = now",
                      "self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)\n"
                      "self.last = now")]}),
    "retry-after ignores the bucket": (
        "retry-after answers n / rate whatever is already in the bucket: clients wait longer than needed",
        {"retry_after": [("return max(0.0, n - self.tokens) / self.rate", "return n / self.rate")]}),
    "retry-after for a request that never fits": (
        "a request larger than the capacity gets a finite retry-after: the client retries forever",
        {"retry_after": [("if n > self.capacity:\nreturn math.inf", "")]}),
}
VARIANTS = tuple(_DRAFTS)


def variant(name: str) -> type:
    """The reference (``"reference"``) or a draft class (one of :data:`VARIANTS`)."""
    if name == "reference":
        return TokenBucket
    if name not in _DRAFTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}, got {name!r}")
    doc, methods = _DRAFTS[name]
    return edited_class(TokenBucket, "Draft", f"Draft: {doc}.", **methods)


class _Clock:
    def __init__(self):
        self.t, self.reads = 0, 0

    def __call__(self):
        self.reads += 1
        return self.t


def _clock_hint(clock: _Clock) -> str:
    """A pointer for a bucket that never read the clock it was given (time.time() / time.monotonic())."""
    if clock.reads:
        return ""
    return ("; the bucket never called the clock it was given: read time through the injected clock, "
            "not time.time() or time.monotonic(), so a test (and a replay) controls it")


def run(factory: Callable, ops: Sequence) -> None:
    """Run ``ops`` on ``factory(capacity, rate, clock)`` and on the oracle; raise AssertionError at the
    first difference (module docstring)."""
    ops = list(ops)
    if not ops or ops[0][0] != "config":
        ops = [("config", 4, Fraction(1, 2))] + ops
    _, capacity, rate = ops[0]
    clock = _Clock()
    bucket, oracle = factory(float(capacity), float(rate), clock), TickOracle(capacity, rate)
    newest = 0
    admitted: list[tuple[int, Fraction]] = []  # (newest clock seen, tokens) of every admission
    for op in ops[1:]:
        kind = op[0]
        if kind == "at":
            clock.t = op[1]
            continue
        newest = max(newest, clock.t)
        if kind == "acquire":
            oracle.advance(clock.t)
            held = oracle.tokens
            got, want = bucket.try_acquire(op[1]), oracle.acquire(clock.t, op[1])
            if bool(got) != want:
                raise AssertionError(f"{op} at clock {clock.t}: returned {got!r}, the oracle says {want} "
                                     f"(it holds {float(held):.6g} tokens; capacity {capacity}, "
                                     f"rate {float(rate):g} per second){_clock_hint(clock)}")
            if got:
                admitted.append((newest, Fraction(op[1])))
        elif kind == "retry_after":
            got, ticks = bucket.retry_after(op[1]), oracle.retry_after_ticks(clock.t, op[1])
            if math.isinf(ticks):
                if not (isinstance(got, float | int) and math.isinf(got)):
                    raise AssertionError(f"{op}: returned {got!r}; {op[1]} tokens exceed the capacity {capacity}, "
                                         "so it never fits: return math.inf (the gateway answers 4xx, not 429)")
            elif not (isinstance(got, float | int) and math.isfinite(got) and math.ceil(got - 1e-9) == ticks):
                raise AssertionError(f"{op} at clock {clock.t}: returned {got!r}; with {float(oracle.tokens):.6g} "
                                     f"tokens at {float(rate):g} per second, {op[1]} are there after {ticks} s "
                                     + (f"(so the answer is in ({ticks - 1}, {ticks}])" if ticks else "(so the answer is 0)")
                                     + _clock_hint(clock))
        elif kind == "threads":
            k, m = op[1], op[2]
            count = [0] * k

            def worker(j, m=m, count=count):
                for _ in range(m):
                    if bucket.try_acquire(1):
                        count[j] += 1
            threads = [threading.Thread(target=worker, args=(j,)) for j in range(k)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            want = 0
            for _ in range(k * m):
                want += oracle.acquire(clock.t, 1)
            if sum(count) != want:
                raise AssertionError(f"{op}: {k} threads admitted {sum(count)} tokens with the clock standing "
                                     f"still; exactly {want} were there (refill, check and take under one lock)")
            admitted += [(newest, Fraction(1))] * want
        else:
            raise ValueError(f"unknown operation {op!r}")
        # the window bound, over every pair of admissions
        for i in range(len(admitted)):
            total = Fraction(0)
            for j in range(i, len(admitted)):
                total += admitted[j][1]
                window = admitted[j][0] - admitted[i][0]
                if total > Fraction(capacity) + Fraction(rate) * window:
                    raise AssertionError(f"admitted {float(total):g} tokens between clock {admitted[i][0]} and "
                                         f"{admitted[j][0]}: more than capacity + rate x window = "
                                         f"{float(Fraction(capacity) + Fraction(rate) * window):g}")


def random_ops(seed: int, n: int = 40) -> tuple:
    """A random program: a dyadic rate (exact in floats), clock steps (a few backwards), acquires of
    1 to capacity + 1 tokens, retry-afters."""
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(1, 9))
    rate = Fraction(int(rng.integers(1, 9)), int(rng.choice([1, 2, 4])))
    ops: list[tuple] = [("config", capacity, rate)]
    t = 0
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            step = int(rng.integers(-3, 6)) if rng.random() < 0.15 else int(rng.integers(0, 4))
            t = max(0, t + step)
            ops.append(("at", t))
        elif r < 0.8:
            ops.append(("acquire", int(rng.integers(1, capacity + 2))))
        else:
            ops.append(("retry_after", int(rng.integers(1, capacity + 2))))
    return tuple(ops)


def cases() -> list[Case]:
    """Hand-made cases (each shows one classic defect), then random programs."""
    return [
        Case("starts full: a burst of capacity, then refused",
             (("config", 3, 1), ("acquire", 1), ("acquire", 1), ("acquire", 1), ("acquire", 1))),
        Case("refill is capped at capacity after an idle spell",
             (("config", 2, 1), ("acquire", 2), ("at", 100), ("acquire", 2), ("acquire", 1))),
        Case("burst and rate are different knobs",
             (("config", 8, Fraction(1, 2)), ("acquire", 8), ("at", 1), ("acquire", 1), ("at", 2), ("acquire", 1))),
        Case("no second burst across a reset boundary",
             (("config", 4, 1), ("at", 3), ("acquire", 4), ("at", 4), ("acquire", 4), ("acquire", 1))),
        Case("fractions of a token accumulate between calls",
             (("config", 1, Fraction(1, 2)), ("acquire", 1), ("at", 1), ("acquire", 1), ("at", 2), ("acquire", 1))),
        Case("a clock that steps back credits nothing and takes nothing",
             (("config", 4, 1), ("at", 10), ("acquire", 3), ("at", 6), ("acquire", 1), ("at", 10), ("acquire", 1),
              ("at", 11), ("acquire", 1), ("acquire", 1))),
        Case("retry-after counts what is already in the bucket",
             (("config", 4, 1), ("acquire", 2), ("retry_after", 3), ("retry_after", 2))),
        Case("retry-after for more than the capacity",
             (("config", 4, 1), ("retry_after", 5))),
        Case("retry-after takes nothing", (("config", 2, 1), ("retry_after", 1), ("acquire", 2))),
        Case("threads with the clock standing still", (("config", 50, 1), ("threads", 8, 20))),
        *[Case(f"random program {k}", random_ops(k)) for k in range(16)],
    ]


def describe(ops: Sequence) -> str:
    return "\n".join(f"  {tuple(float(x) if isinstance(x, Fraction) else x for x in op)}" for op in ops)


def check(candidate: Callable) -> PracticeReport:
    """Grade any class (or factory) with :class:`Skeleton`'s interface; the report shows the first
    failing program, shrunk (a program shrunk past its config line runs with capacity 4, rate 0.5)."""
    return grade(QUESTION, lambda: candidate, cases(), lambda make, ops: run(make, ops), describe)
