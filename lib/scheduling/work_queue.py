"""A bounded work queue with consumer threads (N071): the reference, and the arithmetic of its bound.

:class:`WorkQueue` runs ``handler(item)`` on ``workers`` threads fed by a FIFO of at most ``bound``
waiting items:

* ``submit(item, timeout)`` returns a :class:`concurrent.futures.Future`; it blocks while
  ``bound`` items wait (backpressure: a producer faster than the consumers is slowed to their
  pace instead of piling up work), and raises :class:`queue.Full` after ``timeout`` seconds;
  after :meth:`WorkQueue.shutdown` it raises ``RuntimeError``;
* a worker takes the next item, runs the handler and sets the future's result; an exception
  raised by the handler is set on that item's future and the worker takes the next item (an
  exception never ends a worker, and never vanishes: the submitter sees it);
* ``shutdown(timeout)`` stops new submissions, puts **one sentinel per worker** behind the
  queued work (a worker that takes a sentinel exits, so each needs its own: one sentinel for
  all stops one worker and leaves the others blocked forever), and joins every worker within
  ``timeout`` seconds (``TimeoutError`` otherwise).

The bound is a latency budget: by Little's law an item that finds the queue full waits about
``bound x service_s / workers`` before a worker takes it (:func:`queue_wait_s`), so the largest
bound that keeps that wait within a client's patience is ``workers x timeout_s / service_s``
(:func:`max_bound`); a larger one accepts work that will be stale when it runs.
SI units: seconds.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from lib.inputs import integer, real

__all__ = ["WorkQueue", "max_bound", "queue_wait_s"]

_STOP = object()  # the sentinel: a worker that takes it exits


class WorkQueue:
    """A FIFO of at most ``bound`` items, consumed by ``workers`` daemon threads (module doc)."""

    def __init__(self, handler: Callable, *, workers: int, bound: int) -> None:
        if not callable(handler):
            raise ValueError(f"handler must be callable, got {handler!r}")
        self._handler = handler
        self._n = integer("workers", workers, 1)
        self._queue: queue.Queue = queue.Queue(maxsize=integer("bound", bound, 1))
        self._lock = threading.Lock()  # orders submissions against shutdown
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"worker-{i}", daemon=True)
                         for i in range(self._n)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is _STOP:
                return
            item, future = entry
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                result = self._handler(item)
            except Exception as err:  # the handler's failure belongs to its item, not to the worker
                future.set_exception(err)
            else:
                future.set_result(result)

    def submit(self, item, timeout: float | None = None) -> Future:
        """Queue ``item``; block while ``bound`` items wait, at most ``timeout`` seconds (None:
        without limit), then raise :class:`queue.Full`. RuntimeError after shutdown."""
        if timeout is not None:
            real("timeout", timeout, 0, unit="seconds")
        future: Future = Future()
        with self._lock:  # no submission slips in behind the sentinels
            if self._closed:
                raise RuntimeError("submit after shutdown")
            self._queue.put((item, future), timeout=timeout)
        return future

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop accepting work, let the workers finish what is queued, and stop every one of them:
        one sentinel per worker, behind the queued items; join each within ``timeout`` seconds
        in all (TimeoutError if a worker is still running: a handler that never returns)."""
        limit = real("timeout", timeout, 0, unit="seconds")
        with self._lock:
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._queue.put(_STOP)
        end = time.monotonic() + limit
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            raise TimeoutError(f"{self.alive_workers} of {self._n} workers still running after {limit:g} s")

    @property
    def alive_workers(self) -> int:
        """How many worker threads are running."""
        return sum(t.is_alive() for t in self._threads)

    @property
    def waiting(self) -> int:
        """Items queued and not yet taken by a worker (sentinels included after shutdown)."""
        return self._queue.qsize()


def queue_wait_s(bound: int, workers: int, service_s: float) -> float:
    """Wait of an item that finds ``bound`` items queued before it: bound x service_s / workers
    seconds (Little's law for the queue: its length over the rate the workers drain it)."""
    b = integer("bound", bound, 0)
    w = integer("workers", workers, 1)
    s = real("service_s", service_s, 0, low_open=True, unit="seconds")
    return b * s / w


def max_bound(workers: int, service_s: float, timeout_s: float) -> int:
    """The largest bound whose full-queue wait (:func:`queue_wait_s`) stays within ``timeout_s``:
    floor(workers x timeout_s / service_s) (0: even one queued item would wait too long)."""
    w = integer("workers", workers, 1)
    s = real("service_s", service_s, 0, low_open=True, unit="seconds")
    t = real("timeout_s", timeout_s, 0, low_open=True, unit="seconds")
    return math.floor(w * t / s * (1 + 1e-12))
