"""Size-and-timeout batchers: the fixed-cost batcher (W04) on a fake clock, and its driver.

:class:`SizeTimeoutBatcher` is the whole batching rule, with time passed in (no clock, no threads):
items wait in a FIFO queue of at most ``queue_limit``; a batch of at most ``max_batch`` leaves when
the server is free and either ``max_batch`` items wait (size trigger) or the oldest has waited
``timeout_s`` (time trigger). :func:`run_fixed_cost` drives ANY object with that interface
(``submit(item, now) -> bool``, ``deadline() -> float | None``, ``next_batch(now) -> list``) on a
list of arrival times against one server whose batch costs ``batch_s`` whatever its size, and
records every item's fate. :func:`deterministic_mean_latency_s` is the closed form it is checked
against for evenly spaced arrivals.

The bound a bounded queue buys: with ``queue_limit <= max_batch`` every admitted item is in the
next batch that leaves, which leaves at most ``max(timeout_s, batch_s) <= timeout_s + batch_s``
after the item arrived (the trigger fires within ``timeout_s`` of the oldest item, the server frees
within ``batch_s``); its latency is at most that plus one ``batch_s``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from lib.inputs import integer, real

__all__ = ["BatchRun", "SizeTimeoutBatcher", "deterministic_batch_items", "deterministic_mean_latency_s",
           "run_fixed_cost", "throughput_ceiling"]


class SizeTimeoutBatcher:
    """FIFO batcher with a size trigger, a time trigger and a bounded queue (times in seconds).

    ``queue_limit`` None means unbounded (the overload failure mode: the queue, and every
    latency, grows without bound).
    """

    def __init__(self, max_batch: int, timeout_s: float, queue_limit: int | None = None) -> None:
        self.max_batch = integer("max_batch", max_batch, 1)
        self.timeout_s = real("timeout_s", timeout_s, 0.0)
        self.queue_limit = None if queue_limit is None else integer("queue_limit", queue_limit, 1)
        self._queue: deque = deque()  # (item, arrival time), oldest first

    def __len__(self) -> int:
        return len(self._queue)

    def submit(self, item, now: float) -> bool:
        """Queue ``item`` arriving at ``now``; False (rejected, nothing queued) when the queue is full."""
        if self.queue_limit is not None and len(self._queue) >= self.queue_limit:
            return False
        self._queue.append((item, now))
        return True

    def deadline(self) -> float | None:
        """When the time trigger fires: the oldest item's arrival + ``timeout_s`` (None when empty)."""
        return self._queue[0][1] + self.timeout_s if self._queue else None

    def next_batch(self, now: float) -> list:
        """Called when the server is free: the oldest ``min(len, max_batch)`` items if a trigger has
        fired (``len >= max_batch`` or ``now >= deadline``), else ``[]``."""
        if not self._queue or (len(self._queue) < self.max_batch and now < self.deadline()):
            return []
        return [self._queue.popleft()[0] for _ in range(min(self.max_batch, len(self._queue)))]


@dataclass
class BatchRun:
    """What :func:`run_fixed_cost` recorded. Times in seconds; ``dispatch``/``done`` are NaN for a
    rejected item."""

    arrivals: list
    batch_s: float
    accepted: list = field(default_factory=list)  # bool per item
    dispatch: list = field(default_factory=list)  # when its batch started
    done: list = field(default_factory=list)  # when its batch finished
    batches: list = field(default_factory=list)  # (start time, [items])

    @property
    def served(self) -> list:
        return [i for i, ok in enumerate(self.accepted) if ok]

    @property
    def latencies_s(self) -> list:
        """done - arrival for every served item."""
        return [self.done[i] - self.arrivals[i] for i in self.served]

    @property
    def waits_s(self) -> list:
        """dispatch - arrival for every served item (the batching and queueing delay)."""
        return [self.dispatch[i] - self.arrivals[i] for i in self.served]

    @property
    def reject_share(self) -> float:
        return 1 - len(self.served) / len(self.arrivals) if self.arrivals else 0.0

    @property
    def mean_batch(self) -> float:
        return sum(len(b) for _, b in self.batches) / len(self.batches) if self.batches else 0.0

    @property
    def throughput_per_s(self) -> float:
        """Served items / (last completion - first arrival)."""
        if not self.batches:
            return 0.0
        return len(self.served) / (max(self.done[i] for i in self.served) - self.arrivals[0])

    @property
    def busy_share(self) -> float:
        """Fraction of [first arrival, last completion] the server spent running batches."""
        if not self.batches:
            return 0.0
        return len(self.batches) * self.batch_s / (max(self.done[i] for i in self.served) - self.arrivals[0])

    def quantile_latency_s(self, q: float) -> float:
        """The ``q`` quantile of the served items' latency (nearest rank)."""
        lat = sorted(self.latencies_s)
        return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))] if lat else math.nan


def run_fixed_cost(batcher, arrivals: Sequence[float], batch_s: float, *, max_events: int | None = None) -> BatchRun:
    """Drive ``batcher`` on ``arrivals`` (non-decreasing, seconds; item ``k`` arrives at ``arrivals[k]``)
    against one server whose every batch costs ``batch_s`` whatever its size.

    Event loop: at each event time t (an arrival, the server freeing, the batcher's deadline) the
    items arriving at t are submitted first, then, while the server is free, ``next_batch(t)`` may
    start a batch that ends at t + ``batch_s``. Raises AssertionError when the batcher breaks the
    protocol (a deadline that has passed with the server free but no batch, an unknown or repeated
    item) so a grader can report it; ValueError on bad inputs.
    """
    times = [real(f"arrivals[{k}]", t, 0.0) for k, t in enumerate(arrivals)]
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("arrivals must be non-decreasing")
    batch_s = real("batch_s", batch_s, 0.0, low_open=True)
    n = len(times)
    run = BatchRun(times, batch_s, [False] * n, [math.nan] * n, [math.nan] * n, [])
    seen = [False] * n
    i, free_at, now, pending = 0, 0.0, 0.0, 0
    limit = max_events if max_events is not None else 10 * n + 100
    for _ in range(limit):
        while i < n and times[i] <= now:
            run.accepted[i] = bool(batcher.submit(i, times[i]))
            pending += run.accepted[i]
            i += 1
        if free_at <= now:
            batch = list(batcher.next_batch(now))
            if batch:
                for item in batch:
                    if not (isinstance(item, int) and 0 <= item < i and run.accepted[item]) or seen[item]:
                        raise AssertionError(f"next_batch returned item {item!r}, which is not waiting "
                                             "(never submitted, rejected, or already sent)")
                    seen[item] = True
                    run.dispatch[item], run.done[item] = now, now + batch_s
                pending -= len(batch)
                run.batches.append((now, batch))
                free_at = now + batch_s
        if i >= n and pending == 0:
            return run
        nxt = [times[i]] if i < n else []
        if free_at > now:
            nxt.append(free_at)
        elif pending:
            d = batcher.deadline()
            if d is not None and d <= now:
                raise AssertionError(f"at t = {now:.6g} s the deadline ({d:.6g} s) has passed and the server is "
                                     f"free, but next_batch returned no batch ({pending} items waiting)")
            if d is not None:
                nxt.append(d)
        if not nxt:
            raise AssertionError(f"{pending} accepted items are unanswered, deadline() is None and no arrivals "
                                 "remain: they will never be sent (no time trigger, or items lost)")
        now = min(nxt)
    raise AssertionError(f"no end after {limit} events")


def throughput_ceiling(max_batch: int, batch_s: float) -> float:
    """The most items per second a fixed-cost server can serve: ``max_batch / batch_s`` (items/s)."""
    return integer("max_batch", max_batch, 1) / real("batch_s", batch_s, 0.0, low_open=True)


def deterministic_batch_items(rate: float, max_batch: int, timeout_s: float) -> int:
    """Items per batch of the size-timeout batcher for arrivals exactly ``1 / rate`` apart (server free):
    ``k = min(B, floor(timeout * rate) + 1)`` (the oldest item and those arriving within its timeout)."""
    rate = real("rate", rate, 0.0, low_open=True)
    max_batch = integer("max_batch", max_batch, 1)
    timeout_s = real("timeout_s", timeout_s, 0.0)
    return min(max_batch, math.floor(timeout_s * rate + 1e-9) + 1)


def deterministic_mean_latency_s(rate: float, max_batch: int, timeout_s: float, batch_s: float) -> float:
    """Mean latency (s) of the size-timeout batcher for arrivals exactly ``1 / rate`` apart, when the
    server is always free when a batch is due.

    A batch holds ``k = min(B, floor(timeout * rate) + 1)`` items. Size trigger (``k = B``): item j of
    the batch (j = 0..B-1) waits ``(B - 1 - j) / rate``, mean ``(B - 1) / (2 rate)``. Time trigger
    (``k < B``): item j waits ``timeout - j / rate``, mean ``timeout - (k - 1) / (2 rate)``. Latency =
    mean wait + ``batch_s``. Valid while a batch leaves every ``k / rate >= batch_s`` seconds; raises
    ValueError otherwise (the server, not the triggers, sets the batches then).
    """
    batch_s = real("batch_s", batch_s, 0.0, low_open=True)
    k = deterministic_batch_items(rate, max_batch, timeout_s)
    if k / rate < batch_s:
        raise ValueError(f"a batch of {k} leaves every {k / rate:.4g} s, less than batch_s = {batch_s:.4g} s: "
                         "the server is the bottleneck and this closed form does not apply")
    wait = (k - 1) / (2 * rate) if k == max_batch else timeout_s - (k - 1) / (2 * rate)
    return wait + batch_s
