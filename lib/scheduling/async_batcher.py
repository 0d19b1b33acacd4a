"""An asyncio dynamic batcher (N070): the reference, the self-cancelling-timer deadlock and its fix,
a real-time driver on a fake model, and the window's cost for Poisson arrivals.

:class:`AsyncBatcher` is the batching rule of :class:`lib.scheduling.batcher.SizeTimeoutBatcher`
(W04) on a real event loop. Callers ``await batcher.submit(item)`` and get that item's result. One
shared FIFO queue; a batch of at most ``max_batch`` items leaves when a slot is free (at most
``max_in_flight`` batches run at once) and either ``max_batch`` items wait (size trigger) or the
oldest has waited ``window_s`` (time trigger, a timer task). Decisions are made by one synchronous
function (``_pump``) that never awaits and never cancels a task: it runs one loop iteration after a
submit (so every caller that became ready in the same iteration is queued first, as
:func:`~lib.scheduling.batcher.run_fixed_cost` submits all arrivals at ``t`` before deciding), when
the timer task wakes, and when a batch finishes. Each batch runs in its own task, so:

* ``batch_fn`` raising fails exactly that batch's callers (each gets the exception) and the batcher
  keeps serving the others;
* a caller that gives up (``asyncio.wait_for``, a disconnect) cancels only its own wait: a queued
  item is taken out of the queue, a running batch is not touched;
* the timer task is never cancelled by the flush it triggers: it sleeps until the oldest item's
  deadline, clears itself, decides, and ends; a stale timer (its item already sent by the size
  trigger) wakes early, finds nothing due and arms the next one. Only :meth:`AsyncBatcher.close`
  cancels it, from another task.

``close(drain=True)`` refuses new items (:class:`BatcherClosed`, a ``RuntimeError``), sends every
queued item at once (batches of at most ``max_batch``, no window) and returns when nothing is in
flight; ``drain=False`` fails the queued callers with :class:`BatcherClosed` instead. No item is
ever left unanswered.

The deadlock. :class:`SelfCancellingBatcher` is the common first draft: ``flush()`` "resets" the
time trigger by cancelling the timer task, then awaits the batch inline. When the time trigger
fires, ``flush()`` runs *inside* the timer task and cancels itself; ``Task.cancel()`` on the running
task takes effect at its next suspension, which is the model call: the batch is cancelled
mid-flight, its items have already left the queue, and every caller of that batch waits forever.
It bites only the time-triggered batches (light load, the lone item), never the size-triggered
ones, so a load test passes; and only when ``batch_fn`` really suspends (a fake model that never
awaits hides it). :class:`GuardedTimerBatcher` is the one-line fix (do not cancel
``asyncio.current_task()``); it still runs a size-triggered batch inside the caller that filled it,
so that caller giving up cancels the batch for everyone, which the reference's own-task batches
avoid.

Measuring. :class:`FakeModel` is an async ``batch_fn`` that costs ``batch_s`` per call whatever
its size (``asyncio.sleep``) and records every call. :func:`drive` replays arrival times on the
running loop (``loop.call_at``) against any batcher class and records what happened;
:func:`run_in_fresh_loop` (:func:`run_in_fresh_loops` for several at once) runs such a coroutine
on a new loop in its own thread (this works inside Jupyter, whose loop is already running) with a
hard timeout. Agreement with W04's rule, two ways: :func:`replay_decisions` re-asks
``SizeTimeoutBatcher.next_batch`` at every batch on the observed clock (any arrival pattern;
a decision within ``tolerance_s`` of the model call may fall either side), and :func:`compare`
checks the whole schedule of :func:`model_schedule` (what ``run_fixed_cost`` says the nominal
arrivals give) whenever the observed lateness is under half the model's closest call
(:func:`decision_margin_s`). Their docstrings state the tolerances and why. asyncio's default loop
on Linux waits in epoll with millisecond resolution, so every timer here fires up to about a
millisecond late; ``clock="virtual"`` runs the same code on :class:`VirtualClockLoop`, whose clock
jumps from timer to timer, so the decisions can be checked exactly on a machine of any load.

The window's cost. :func:`poisson_window_wait_s` is the mean wait for Poisson arrivals in the
light-load limit (the server free whenever a batch is due), a closed form of the same model,
tested against :func:`~lib.scheduling.batcher.run_fixed_cost` (which stays the one model of the
latency: the closed form is its second method); :func:`poisson_mean_batch` the mean batch,
:func:`window_for_wait_s` its inverse, :func:`trigger_shares` which trigger sent a run's batches.
SI units: seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lib.inputs import integer, real

from .batcher import BatchRun, SizeTimeoutBatcher, run_fixed_cost

__all__ = [
    "Agreement",
    "AsyncBatcher",
    "AsyncRun",
    "BatchCall",
    "BatcherClosed",
    "FakeModel",
    "GuardedTimerBatcher",
    "SelfCancellingBatcher",
    "DecisionCheck",
    "VirtualClockLoop",
    "compare",
    "decision_margin_s",
    "drive",
    "model_schedule",
    "poisson_mean_batch",
    "poisson_window_wait_s",
    "replay_decisions",
    "run_in_fresh_loop",
    "run_in_fresh_loops",
    "square",
    "trigger_shares",
    "window_for_wait_s",
]


class BatcherClosed(RuntimeError):
    """``submit`` after ``close()``, or an item failed by ``close(drain=False)``."""


@dataclass(eq=False)
class _Entry:
    item: object
    future: asyncio.Future
    arrival: float  # loop time of the submit
    queued: bool = True


async def _call(batch_fn: Callable, items: list) -> list:
    """``batch_fn(items)`` (awaited when it returns an awaitable), checked to give one result per item."""
    out = batch_fn(items)
    if inspect.isawaitable(out):
        out = await out
    out = list(out)
    if len(out) != len(items):
        raise ValueError(f"batch_fn returned {len(out)} results for a batch of {len(items)} items")
    return out


def _check_args(batch_fn, max_batch, window_s, max_in_flight) -> tuple[int, float, int]:
    if not callable(batch_fn):
        raise ValueError(f"batch_fn must be callable (items -> results), got {batch_fn!r}")
    return (integer("max_batch", max_batch, 1), real("window_s", window_s, 0.0, unit="seconds"),
            integer("max_in_flight", max_in_flight, 1))


class AsyncBatcher:
    """The reference dynamic batcher (module doc): ``await submit(item)`` returns the item's result.

    ``batch_fn(items) -> results`` (a coroutine function, or a plain one) gets at most
    ``max_batch`` items and returns one result per item; ``window_s`` is the time trigger counted
    from the oldest waiting item; ``max_in_flight`` bounds the batches running at once;
    ``queue_limit`` (None: unbounded) makes ``submit`` raise :class:`asyncio.QueueFull` when that
    many items already wait.
    """

    def __init__(self, batch_fn: Callable, *, max_batch: int, window_s: float, max_in_flight: int = 1,
                 queue_limit: int | None = None) -> None:
        self.max_batch, self.window_s, self.max_in_flight = _check_args(batch_fn, max_batch, window_s, max_in_flight)
        self.queue_limit = None if queue_limit is None else integer("queue_limit", queue_limit, 1)
        self._batch_fn = batch_fn
        self._queue: deque[_Entry] = deque()
        self._in_flight = 0
        self._timer: asyncio.Task | None = None
        self._pump_pending = False
        self._closing = False
        self._drained: asyncio.Future | None = None
        self._tasks: set[asyncio.Task] = set()  # running batches (the loop keeps only weak references)
        self.batches_sent = 0
        self.batches_failed = 0

    @property
    def waiting(self) -> int:
        """Items queued, not yet in a batch."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Batches running now."""
        return self._in_flight

    async def submit(self, item):
        """Queue ``item`` and return its result, or raise the exception its batch raised.

        :class:`BatcherClosed` after :meth:`close`; :class:`asyncio.QueueFull` when ``queue_limit``
        items wait. A caller cancelled while its item still waits takes the item out of the queue.
        """
        if self._closing:
            raise BatcherClosed("submit() after close(): the batcher accepts no new items")
        if self.queue_limit is not None and len(self._queue) >= self.queue_limit:
            raise asyncio.QueueFull(f"{len(self._queue)} items already wait (queue_limit = {self.queue_limit})")
        loop = asyncio.get_running_loop()
        entry = _Entry(item, loop.create_future(), loop.time())
        self._queue.append(entry)
        self._schedule_pump(loop)
        try:
            return await entry.future
        except asyncio.CancelledError:
            if entry.queued:  # gave up before its batch left: it must not occupy a place in one
                entry.queued = False
                self._queue.remove(entry)
                self._schedule_pump(loop)
            raise

    def _schedule_pump(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._pump_pending:
            self._pump_pending = True
            loop.call_soon(self._pump)

    def _due(self, now: float) -> bool:
        q = self._queue
        return bool(q) and (self._closing or len(q) >= self.max_batch or now >= q[0].arrival + self.window_s)

    def _pump(self) -> None:
        """Send every due batch while a slot is free; arm the timer for the oldest item's deadline.
        Synchronous: it never awaits and never cancels a task, so it is safe from any task."""
        self._pump_pending = False
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._in_flight < self.max_in_flight and self._due(now):
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            for e in batch:
                e.queued = False
            self._in_flight += 1
            self.batches_sent += 1
            task = loop.create_task(self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._queue and self._in_flight < self.max_in_flight and self._timer is None:
            self._timer = loop.create_task(self._expire(self._queue[0].arrival + self.window_s))
        if self._closing and not self._queue and not self._in_flight and self._drained and not self._drained.done():
            self._drained.set_result(None)

    async def _expire(self, deadline: float) -> None:
        """The timer task: sleep until ``deadline``, clear itself, decide. It ends by itself; the
        decision it triggers never cancels it (a stale timer just wakes early and re-arms)."""
        await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
        self._timer = None
        self._pump()

    async def _run(self, batch: list[_Entry]) -> None:
        """One batch in its own task: results to its callers, or its exception to its callers only."""
        try:
            results = await _call(self._batch_fn, [e.item for e in batch])
        except Exception as err:  # this batch's failure belongs to this batch's callers
            self.batches_failed += 1
            for e in batch:
                if not e.future.done():  # a caller that gave up has a cancelled future
                    e.future.set_exception(err)
        except BaseException:  # cancelled (the loop is shutting down): do not leave callers waiting
            for e in batch:
                e.future.cancel()
            raise
        else:
            for e, r in zip(batch, results, strict=True):
                if not e.future.done():
                    e.future.set_result(r)
        finally:
            self._in_flight -= 1
            self._pump()

    async def close(self, *, drain: bool = True) -> None:
        """Refuse new items; ``drain``: send every queued item now (no window), else fail them with
        :class:`BatcherClosed`; return when no batch is in flight. Idempotent; cancelling the
        caller of ``close`` does not stop the drain."""
        loop = asyncio.get_running_loop()
        self._closing = True
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        if not drain:
            while self._queue:
                e = self._queue.popleft()
                e.queued = False
                if not e.future.done():
                    e.future.set_exception(BatcherClosed("close(drain=False) before this item's batch left"))
        if self._drained is None:
            self._drained = loop.create_future()
        self._pump()
        await asyncio.shield(self._drained)

    async def __aenter__(self) -> AsyncBatcher:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


# ---- the classic first draft, its deadlock, and the one-line fix ----------------------------------


async def _deliver(batch_fn: Callable, batch: list[_Entry]) -> None:
    """The draft's batch runner: results, or the exception, to this batch's callers. A
    CancelledError passes through and leaves them waiting (the draft does not expect one)."""
    try:
        results = await _call(batch_fn, [e.item for e in batch])
    except Exception as err:
        for e in batch:
            if not e.future.done():
                e.future.set_exception(err)
    else:
        for e, r in zip(batch, results, strict=True):
            if not e.future.done():
                e.future.set_result(r)


class SelfCancellingBatcher:
    """The classic first draft (module doc): ``_flush`` resets the time trigger by cancelling the
    timer task and then awaits the batch inline, in whichever task called it. When the timer task
    itself flushes, it cancels itself and the batch never completes: a deadlock for every caller
    of a time-triggered batch. Same interface as :class:`AsyncBatcher` (no ``queue_limit``)."""

    def __init__(self, batch_fn: Callable, *, max_batch: int, window_s: float, max_in_flight: int = 1) -> None:
        self.max_batch, self.window_s, self.max_in_flight = _check_args(batch_fn, max_batch, window_s, max_in_flight)
        self._batch_fn = batch_fn
        self._queue: deque[_Entry] = deque()
        self._timer: asyncio.Task | None = None
        self._in_flight = 0
        self._closed = False
        self._changed: asyncio.Event | None = None

    async def submit(self, item):
        """Queue ``item``; flush at once when the batch is full, else make sure a timer runs."""
        if self._closed:
            raise BatcherClosed("submit() after close()")
        loop = asyncio.get_running_loop()
        entry = _Entry(item, loop.create_future(), loop.time())
        self._queue.append(entry)
        if len(self._queue) >= self.max_batch:
            await self._flush()  # size trigger: the batch runs in this caller's task
        elif self._timer is None:
            self._timer = loop.create_task(self._expire())  # time trigger
        return await entry.future

    async def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        oldest = self._queue[0].arrival if self._queue else loop.time()  # a flush may have emptied it
        await asyncio.sleep(max(0.0, oldest + self.window_s - loop.time()))
        await self._flush()  # the time trigger flushes from inside the timer task

    def _stop_timer(self) -> None:
        """Reset the time trigger by cancelling the timer task (THE BUG: when this flush runs in
        the timer task, it cancels the task it is running in)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _flush(self) -> None:
        self._stop_timer()
        loop = asyncio.get_running_loop()
        try:
            while self._in_flight < self.max_in_flight and self._queue and (
                    self._closed or len(self._queue) >= self.max_batch
                    or loop.time() >= self._queue[0].arrival + self.window_s):
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                self._in_flight += 1
                try:
                    await _deliver(self._batch_fn, batch)  # inline: a cancel of this task cancels the batch
                finally:
                    self._in_flight -= 1
            if self._queue and self._timer is None and self._in_flight < self.max_in_flight and not self._closed:
                self._timer = loop.create_task(self._expire())
        finally:
            if self._changed is not None:
                self._changed.set()

    async def close(self) -> None:
        """Refuse new items, flush what waits, return when nothing is queued or in flight."""
        self._closed = True
        self._changed = self._changed or asyncio.Event()
        self._stop_timer()
        while self._queue or self._in_flight:
            await self._flush()
            if self._queue or self._in_flight:  # another task runs a batch: wait for its flush to end
                self._changed.clear()
                await self._changed.wait()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class GuardedTimerBatcher(SelfCancellingBatcher):
    """The one-line fix of :class:`SelfCancellingBatcher`: never cancel the task this flush runs
    in. The deadlock is gone; a size-triggered batch still runs inside the caller that filled it."""

    def _stop_timer(self) -> None:
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None


# ---- a fake model and a real-time driver ------------------------------------------------------------


def square(x):
    """The fake model's answer for item ``x``: ``x * x``."""
    return x * x


@dataclass(eq=False)
class BatchCall:
    """One call of :class:`FakeModel`: loop times (s, from the run's start once :func:`drive` has
    shifted them), the items, ``status`` ("running", "ok", "raised", "cancelled") and the task that
    ran it."""

    start: float
    items: list
    task: object = None
    end: float = math.nan
    status: str = "running"


class FakeModel:
    """An async ``batch_fn``: every call costs ``batch_s`` of loop time whatever its size
    (``asyncio.sleep``; ``suspend=False`` returns without awaiting, as a synchronous fake would),
    answers ``fn(x)`` per item and raises ``ValueError("bad item x")`` for a batch holding an item of
    ``bad``. Records each call (:class:`BatchCall`) and the most calls running at once;
    ``on_start(call)`` runs as a call starts."""

    def __init__(self, batch_s: float, *, fn: Callable = square, bad=(), suspend: bool = True,
                 on_start: Callable | None = None) -> None:
        self.batch_s = real("batch_s", batch_s, 0.0, unit="seconds")
        self.fn, self.bad, self.suspend, self.on_start = fn, frozenset(bad), suspend, on_start
        self.calls: list[BatchCall] = []
        self.active = 0
        self.max_active = 0

    async def __call__(self, items):
        loop = asyncio.get_running_loop()
        call = BatchCall(loop.time(), list(items), asyncio.current_task())
        self.calls.append(call)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.on_start is not None:
                self.on_start(call)
            if self.suspend:
                await asyncio.sleep(self.batch_s)
            bad = [x for x in call.items if x in self.bad]
            if bad:
                call.status = "raised"
                raise ValueError(f"bad item {bad[0]}")
            call.status = "ok"
            return [self.fn(x) for x in call.items]
        except asyncio.CancelledError:
            call.status = "cancelled"
            raise
        finally:
            call.end = loop.time()
            self.active -= 1


@dataclass
class AsyncRun:
    """What :func:`drive` observed. Times in seconds from the run's start (loop clock); NaN where
    nothing happened. ``outcomes[k]`` is ``("ok", result)``, ``("error", exc)`` (``submit`` raised:
    its batch failed, or it was refused), ``("cancelled", None)`` (the caller gave up) or
    ``("hung", None)`` (never answered); taken when :func:`drive` returns."""

    arrivals: list
    batch_s: float
    submitted: list = field(default_factory=list)
    answered: list = field(default_factory=list)
    outcomes: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # BatchCall, in start order
    max_active: int = 0
    caller_tasks: dict = field(default_factory=dict)  # item -> its caller's task (for diagnoses)
    answered_at_close: list = field(default_factory=list)  # items answered only by the final close()
    close_problem: str = ""
    closed_at: float = math.nan  # when close() was called
    leftover_tasks: list = field(default_factory=list)  # names of tasks still pending after close()
    not_implemented: BaseException | None = None
    loop_errors: list = field(default_factory=list)  # exceptions that escaped a task (loop's exception handler)

    @property
    def groups(self) -> list[list]:
        """Items of each batch the model was called with, in start order."""
        return [c.items for c in self.calls]

    @property
    def hung(self) -> list[int]:
        return [k for k, o in enumerate(self.outcomes) if o[0] == "hung"]

    @property
    def latencies_s(self) -> list[float]:
        """answer - submit for every item answered with a result."""
        return [self.answered[k] - self.submitted[k] for k, o in enumerate(self.outcomes) if o[0] == "ok"]

    @property
    def mean_latency_s(self) -> float:
        lat = self.latencies_s
        return sum(lat) / len(lat) if lat else math.nan


async def drive(factory: Callable, arrivals: Sequence[float], batch_s: float, *, max_batch: int, window_s: float,
                max_in_flight: int = 1, bad=(), impatient=(), close_at: float | None = None, suspend: bool = True,
                hang_after_s: float = 0.25, lead_s: float = 0.002) -> AsyncRun:
    """Replay ``arrivals`` (s, non-decreasing; item k arrives at ``arrivals[k]``) against
    ``factory(model, max_batch=, window_s=, max_in_flight=)`` on the running loop, with a
    :class:`FakeModel` costing ``batch_s`` per batch. Each item's caller is its own task started
    by ``loop.call_at`` (arrivals at the same time start in the same loop iteration).

    ``bad``: items whose batch raises; ``impatient``: items whose caller gives up (its task is
    cancelled) halfway through its batch's run; ``close_at``: when to call ``close()``. The run
    waits for every caller until ``hang_after_s`` past the last moment the model would answer
    them, then calls ``close()`` (unless called already) and, once it returns, waits up to one
    batch more: callers still waiting are "hung" (those answered by that close are listed in
    ``answered_at_close``). Never
    raises for the batcher's misbehaviour (it is recorded) except NotImplementedError.
    """
    times = [real(f"arrivals[{k}]", t, 0.0) for k, t in enumerate(arrivals)]
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("arrivals must be non-decreasing")
    n = len(times)
    loop = asyncio.get_running_loop()
    t0 = loop.time() + real("lead_s", lead_s, 0.0)
    impatient = set(impatient)
    run = AsyncRun(times, batch_s, [math.nan] * n, [math.nan] * n, [("hung", None)] * n)
    loop.set_exception_handler(lambda _loop, ctx: run.loop_errors.append(
        f"{ctx.get('message', '')}: {ctx.get('exception')!r}"))

    def on_start(call: BatchCall) -> None:
        for x in call.items:
            if x in impatient and x in run.caller_tasks:
                loop.call_at(call.start + batch_s / 2, run.caller_tasks[x].cancel)

    fake = FakeModel(batch_s, bad=bad, suspend=suspend, on_start=on_start)
    batcher = factory(fake, max_batch=max_batch, window_s=window_s, max_in_flight=max_in_flight)
    closer: dict = {}

    outcomes, answered = list(run.outcomes), list(run.answered)  # callers write here; run gets a snapshot

    async def caller(k: int) -> None:
        run.submitted[k] = loop.time() - t0
        try:
            result = await batcher.submit(k)
        except NotImplementedError as err:
            run.not_implemented = run.not_implemented or err
            outcomes[k] = ("error", err)
        except asyncio.CancelledError:
            outcomes[k] = ("cancelled", None)
        except Exception as err:  # its batch raised, or submit refused it
            outcomes[k] = ("error", err)
        else:
            outcomes[k] = ("ok", result)
        answered[k] = loop.time() - t0

    def start(ks: list[int]) -> None:  # arrivals at one time start together, in order
        for k in ks:
            run.caller_tasks[k] = loop.create_task(caller(k), name=f"caller-{k}")

    async def do_close() -> None:
        run.closed_at = loop.time() - t0
        try:
            await batcher.close()
        except NotImplementedError as err:
            run.not_implemented = run.not_implemented or err
        except Exception as err:
            run.close_problem = f"close() raised {type(err).__name__}: {err}"

    def start_close() -> None:
        closer["task"] = loop.create_task(do_close(), name="close")

    groups: dict[float, list[int]] = {}
    for k, t in enumerate(times):
        groups.setdefault(t, []).append(k)
    for t, ks in groups.items():
        loop.call_at(t0 + t, start, ks)
    if close_at is not None:
        loop.call_at(t0 + real("close_at", close_at, 0.0), start_close)
    # when the model answers the last caller (one batch in flight; more in flight only answer sooner)
    model = model_schedule(times, batch_s, max_batch, window_s, close_at)
    last_start = max(times + ([close_at] if close_at is not None else []), default=0.0)
    expected_end = max([d for d in model.done if not math.isnan(d)] + [last_start])
    await asyncio.sleep(max(0.0, t0 + last_start - loop.time()) + 0.001)  # every caller has started
    waiting = [t for t in run.caller_tasks.values() if not t.done()]
    if waiting:
        await asyncio.wait(waiting, timeout=max(0.0, t0 + expected_end + hang_after_s - loop.time()))
    before_close = {k for k, o in enumerate(outcomes) if o[0] != "hung"}
    if "task" not in closer:
        start_close()
    done, _ = await asyncio.wait([closer["task"]], timeout=hang_after_s + n * batch_s)
    if not done:
        run.close_problem = f"close() did not return within {hang_after_s + n * batch_s:.3g} s"
    waiting = [t for t in run.caller_tasks.values() if not t.done()]
    if waiting and done:  # what close() answered is answered by now, give or take a batch
        await asyncio.wait(waiting, timeout=min(hang_after_s, batch_s + 0.005))
    run.outcomes, run.answered = list(outcomes), list(answered)
    run.answered_at_close = sorted(k for k, o in enumerate(outcomes) if o[0] != "hung" and k not in before_close
                                   and (close_at is None or run.submitted[k] < close_at))
    for _ in range(3):  # let cancelled timers finish unwinding
        await asyncio.sleep(0)
    mine = set(run.caller_tasks.values()) | {closer["task"], asyncio.current_task()}
    run.leftover_tasks = sorted(t.get_name() + f" ({_coro_name(t)})" for t in asyncio.all_tasks()
                                if t not in mine and not t.done())
    for c in fake.calls:
        c.start -= t0
        c.end -= t0
    run.calls, run.max_active = fake.calls, fake.max_active
    if run.not_implemented is not None:
        raise run.not_implemented
    return run


def _coro_name(task: asyncio.Task) -> str:
    coro = task.get_coro()
    return getattr(coro, "__qualname__", type(coro).__name__)


class _SkipAheadSelector:
    """A selector that never sleeps for a timer: when nothing is ready it moves its loop's virtual
    clock to the next timer instead (it still blocks when no timer is set, e.g. waiting for a thread)."""

    def __init__(self, selector, loop: VirtualClockLoop) -> None:
        self._selector, self._loop = selector, loop

    def select(self, timeout=None):
        if timeout is None:
            return self._selector.select(None)
        events = self._selector.select(0)
        if not events and timeout > 0:
            self._loop._now += timeout
        return events

    def __getattr__(self, name):
        return getattr(self._selector, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An ordinary selector event loop whose clock is virtual: ``loop.time()`` starts at 0 and jumps
    to the next timer whenever every task waits on one, so ``asyncio.sleep``, ``call_at`` and
    timeouts run at the nominal instants however loaded the machine is, and code between awaits
    takes no time. For testing a batcher's decisions; it cannot show a batcher that blocks the loop
    (a ``time.sleep`` costs no loop time here), which only the real clock does."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _SkipAheadSelector(self._selector, self)

    def time(self) -> float:
        return self._now


CLOCKS = ("real", "virtual")


def run_in_fresh_loop(make_coro: Callable, timeout_s: float = 10.0, *, clock: str = "real"):
    """Run ``make_coro()`` on a new event loop in a new thread and return its result (or raise its
    exception). A new thread works where a loop is already running (Jupyter); TimeoutError if it
    has not finished within ``timeout_s`` of wall time (the thread is left behind as a daemon).
    ``clock``: ``"real"`` (asyncio's own loop) or ``"virtual"`` (:class:`VirtualClockLoop`)."""
    return run_in_fresh_loops([make_coro], timeout_s, clock=clock)[0]


def run_in_fresh_loops(makers: Sequence[Callable], timeout_s: float = 10.0, *, clock: str = "real") -> list:
    """:func:`run_in_fresh_loop` for several coroutines at once, each on its own loop and thread
    (runs that mostly sleep take as long together as the longest alone); their results in order,
    or the first exception. TimeoutError if any has not finished within ``timeout_s``."""
    limit = real("timeout_s", timeout_s, 0.0, low_open=True)
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
    factory = VirtualClockLoop if clock == "virtual" else None
    boxes: list[dict] = [{} for _ in makers]

    def target(make_coro: Callable, box: dict) -> None:
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                box["value"] = runner.run(make_coro())
        except BaseException as err:  # noqa: BLE001  (handed back to the caller's thread)
            box["error"] = err

    threads = [threading.Thread(target=target, args=(m, box), name="fresh-event-loop", daemon=True)
               for m, box in zip(makers, boxes, strict=True)]
    for t in threads:
        t.start()
    end = time.monotonic() + limit
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"the event loop did not finish within {limit:g} s")
    for box in boxes:
        if "error" in box:
            raise box["error"]
    return [box.get("value") for box in boxes]


# ---- the model's schedule, and where the real loop must agree with it --------------------------------


class _Closing(SizeTimeoutBatcher):
    """SizeTimeoutBatcher with close() at ``close_at``: later arrivals refused, and from then on
    whatever waits is due at once (batches of at most max_batch)."""

    def __init__(self, max_batch, timeout_s, close_at):
        super().__init__(max_batch, timeout_s)
        self.close_at = close_at

    def submit(self, item, now):
        return now < self.close_at and super().submit(item, now)

    def deadline(self):
        d = super().deadline()
        return None if d is None else min(d, self.close_at)

    def next_batch(self, now):
        if self._queue and now >= self.close_at:
            return [self._queue.popleft()[0] for _ in range(min(self.max_batch, len(self._queue)))]
        return super().next_batch(now)


def model_schedule(arrivals: Sequence[float], batch_s: float, max_batch: int, window_s: float,
                   close_at: float | None = None) -> BatchRun:
    """What W04's model says these arrivals give: :func:`run_fixed_cost` of
    :class:`SizeTimeoutBatcher` (one batch in flight, each costing ``batch_s``), with ``close()``
    at ``close_at`` (refuse later arrivals, send what waits at once) when given."""
    b = SizeTimeoutBatcher(max_batch, window_s) if close_at is None else _Closing(max_batch, window_s, close_at)
    return run_fixed_cost(b, arrivals, batch_s)


@dataclass(frozen=True)
class Agreement:
    """:func:`compare`'s verdict: ``same`` (the real batches equal the model's), ``compared`` (the
    timing allowed the comparison: observed lateness under half the model's closest call),
    ``margin_s``, ``lateness_s`` and the first difference in words."""

    same: bool
    compared: bool
    margin_s: float
    lateness_s: float
    difference: str = ""

    @property
    def ok(self) -> bool:
        """True unless the batches differ although the timing allowed no other outcome."""
        return self.same or not self.compared


def decision_margin_s(arrivals: Sequence[float], batch_s: float, max_batch: int, window_s: float,
                      close_at: float | None = None) -> float:
    """The model's closest call (s): ``min |arrival - decision instant|`` over the arrivals and the
    instants where W04's model decides (each batch's first item's time trigger, each batch's end,
    the close); inf without arrivals. See :func:`compare`."""
    model = model_schedule(arrivals, batch_s, max_batch, window_s, close_at)
    decisions = [start + batch_s for start, _ in model.batches]
    decisions += [model.arrivals[items[0]] + window_s for _, items in model.batches]
    if close_at is not None:
        decisions.append(close_at)
    return min((abs(a - d) for a in model.arrivals for d in decisions), default=math.inf)


def compare(run: AsyncRun, max_batch: int, window_s: float, close_at: float | None = None) -> Agreement:
    """Do the batches the asyncio batcher formed (one in flight) equal the model's for the same arrivals?

    The tolerance. A real loop runs every event a little late (scheduling, other threads): the
    arrivals, the timer, the model's ``sleep``. Batch membership can differ from the model only if
    two events swap order: an arrival and a *decision instant* (the time trigger of a batch's
    first item, a batch finishing, the close). ``margin_s`` is the model's closest call,
    ``min |arrival - decision instant|``; ``lateness_s`` is the largest observed offset of an
    arrival, a batch start or a batch end from the model's time. Events are only late, so no pair
    can swap while ``lateness_s < margin_s / 2``: then the batches must be identical
    (``compared``); otherwise the run is too close to call and only the properties hold (every
    item answered once, FIFO, no batch above the cap).
    """
    model = model_schedule(run.arrivals, run.batch_s, max_batch, window_s, close_at)
    want = [list(items) for _, items in model.batches]
    got = [list(g) for g in run.groups]
    margin = decision_margin_s(run.arrivals, run.batch_s, max_batch, window_s, close_at)
    k = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want)))
    offsets = [abs(run.submitted[j] - a) for j, a in enumerate(run.arrivals) if not math.isnan(run.submitted[j])]
    for i, ((start, _), call) in enumerate(zip(model.batches, run.calls, strict=False)):
        if i > k:
            break
        offsets += [abs(call.start - start)] + ([abs(call.end - (start + run.batch_s))] if i < k else [])
    lateness = max((o for o in offsets if not math.isnan(o)), default=0.0)
    diff = ""
    if got != want:
        diff = (f"batch {k}: asyncio sent {got[k] if k < len(got) else 'nothing'}, the model sends "
                f"{want[k] if k < len(want) else 'nothing'}")
    return Agreement(got == want, lateness < margin / 2, margin, lateness, diff)


@dataclass(frozen=True)
class DecisionCheck:
    """:func:`replay_decisions`' verdict: of ``batches`` calls, ``matched`` were exactly the batch
    SizeTimeoutBatcher sends at that moment, ``close_calls`` differed with an arrival, a deadline,
    the previous batch's end or the close within the tolerance of the call (too close to call),
    ``wrong`` lists real disagreements and ``late`` batches that left more than ``late_s`` after
    they were due; ``max_late_s`` is the largest delay seen."""

    batches: int
    matched: int
    close_calls: int
    max_late_s: float
    wrong: tuple = ()
    late: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.late


def _explained(items, t, tol, unsent, sub, max_batch, window_s, prev_end, closed) -> bool:
    """Is ``items`` the rule's batch at some decision instant in [t - tol, t] (just before or after
    any arrival, deadline, batch end or close in that interval)?"""
    marks = [x for k in unsent for x in (sub[k], sub[k] + window_s)] + [prev_end, closed]
    candidates = [t] + [x + d for x in marks if not math.isnan(x) and t - tol <= x <= t for d in (-1e-9, 1e-9)]
    for u in candidates:
        if u < prev_end - 1e-9 or u < t - tol:
            continue
        queue = [k for k in unsent if sub[k] <= u]
        if not math.isnan(closed) and u >= closed:
            want = queue[:max_batch]
        else:
            rule = SizeTimeoutBatcher(max_batch, window_s)
            for k in queue:
                rule.submit(k, sub[k])
            want = rule.next_batch(u)
        if want and list(items) == want:
            return True
    return False


def replay_decisions(run: AsyncRun, max_batch: int, window_s: float, *, tolerance_s: float = 0.002,
                     late_s: float = 0.05) -> DecisionCheck:
    """Check every batch the asyncio batcher sent (one in flight) against the W04 rule, on the
    times the run observed: at each model call, feed :class:`SizeTimeoutBatcher` the items
    submitted by then and not yet sent (with their observed submit times) and ask ``next_batch``
    at the call's start (after ``close()``, everything waiting is due).

    Unlike :func:`compare` (the whole schedule on nominal times), this re-synchronises at every
    batch on the real clock, so a late timer changes the inputs of the next decision, not the
    verdict: it works for any arrival pattern. The tolerance: a batcher decides a loop iteration or
    two before the model call starts, so an item submitted, a deadline passing or a batch ending
    within ``tolerance_s`` of the call can fall either side; a difference explained that way is a
    close call, not an error. A batch is *late* when it leaves more than ``late_s`` after the rule
    made it due (the server free and the size or time trigger fired, or the close). A batch
    is *explained* when it equals the rule's batch at some instant in ``[start - tolerance_s,
    start]``, after the previous batch ended.
    """
    tol = real("tolerance_s", tolerance_s, 0.0, unit="seconds")
    late_s = real("late_s", late_s, 0.0, unit="seconds")
    sub = run.submitted
    in_calls = {x for c in run.calls for x in c.items}
    live = sorted((k for k, o in enumerate(run.outcomes) if (k in in_calls or o[0] == "hung") and not math.isnan(sub[k])),
                  key=lambda k: (sub[k], k))
    sent: set = set()
    prev_end = -math.inf
    closed = run.closed_at
    matched = close_calls = 0
    worst = 0.0
    wrong, late = [], []
    for call in sorted(run.calls, key=lambda c: c.start):
        t = call.start
        queue = [k for k in live if k not in sent and sub[k] <= t]
        if not math.isnan(closed) and t >= closed:
            want = queue[:max_batch]
        else:
            rule = SizeTimeoutBatcher(max_batch, window_s)
            for k in queue:
                rule.submit(k, sub[k])
            want = rule.next_batch(t)
        if list(call.items) == want:
            matched += 1
        elif _explained(call.items, t, tol, [k for k in live if k not in sent], sub, max_batch, window_s, prev_end,
                        closed):
            close_calls += 1
        else:
            wrong.append(f"at {1e3 * t:.4g} ms the batcher sent {list(call.items)}; SizeTimeoutBatcher sends {want} "
                         f"(waiting: {queue})")
        if queue:
            due = sub[queue[0]] + window_s
            if len(queue) >= max_batch:
                due = min(due, sub[queue[max_batch - 1]])
            if not math.isnan(closed):
                due = min(due, max(closed, sub[queue[0]]))
            due = max(due, prev_end)
            worst = max(worst, t - due)
            if t - due > late_s:
                late.append(f"the batch {list(call.items)} left at {1e3 * t:.4g} ms, {1e3 * (t - due):.4g} ms after "
                            f"it was due ({1e3 * due:.4g} ms)")
        sent |= set(call.items)
        prev_end = max(prev_end, call.end)
    return DecisionCheck(len(run.calls), matched, close_calls, worst, tuple(wrong), tuple(late))


# ---- the window's cost for Poisson arrivals (closed form) --------------------------------------------


def _poisson_sums(rate: float, max_batch: int, window_s: float) -> tuple[float, float]:
    """(sum_{j=1}^{B-1} P(K >= j), sum_{j=1}^{B-1} j P(K >= j)) for K ~ Poisson(rate x window)."""
    m = rate * window_s

    def pmf(j: int) -> float:  # P(K = j), in log space so that a large m does not underflow exp(-m)
        return (1.0 if j == 0 else 0.0) if m == 0 else math.exp(j * math.log(m) - m - math.lgamma(j + 1))

    cdf = pmf(0)
    s1 = s2 = 0.0
    for j in range(1, max_batch):
        tail = max(0.0, 1.0 - cdf)  # P(K >= j)
        s1 += tail
        s2 += j * tail
        cdf += pmf(j)
    return s1, s2


def poisson_mean_batch(rate: float, max_batch: int, window_s: float) -> float:
    """Mean batch size for Poisson arrivals at ``rate`` (1/s) in the light-load limit:
    ``E[N] = 1 + E[min(B - 1, K)] = 1 + sum_{j=1}^{B-1} P(K >= j)``, K ~ Poisson(rate x window):
    the batch opens with its first item and takes the arrivals of the next ``window_s``, up to the cap."""
    rate = real("rate", rate, 0.0, low_open=True, unit="1/s")
    s1, _ = _poisson_sums(rate, integer("max_batch", max_batch, 1), real("window_s", window_s, 0.0, unit="seconds"))
    return 1.0 + s1


def poisson_window_wait_s(rate: float, max_batch: int, window_s: float) -> float:
    """Mean time (s) an item waits for its batch to leave, for Poisson arrivals at ``rate`` (1/s),
    size cap ``B`` and time trigger ``window_s`` = tau, when the server is free whenever a batch is
    due (the light-load limit: exact as the batch cost goes to zero; a busy server only adds wait).

    A batch opens with an item at 0 and leaves at D = min(tau, time of the (B-1)-th later arrival);
    the items present at t < D are 1 + A(t), so the batch's total wait is the integral of
    (1 + A(t)) 1{A(t) <= B - 2} over [0, tau]. With the Poisson-Gamma identity
    int_0^tau rate e^{-rate t} (rate t)^k / k! dt = P(K >= k + 1) and renewal-reward (batches are
    independent cycles):

        W = sum_{j=1}^{B-1} j P(K >= j) / (rate x E[N]),    E[N] = 1 + sum_{j=1}^{B-1} P(K >= j).

    Without a binding cap (B large) this is W = tau (1 + m/2) / (1 + m), m = rate x tau: a lone item
    (m << 1) pays the whole window, a busy stream (m >> 1) half of it; with the cap binding
    (m >> B) it tends to (B - 1) / (2 rate), the size trigger's wait.
    """
    rate = real("rate", rate, 0.0, low_open=True, unit="1/s")
    max_batch = integer("max_batch", max_batch, 1)
    s1, s2 = _poisson_sums(rate, max_batch, real("window_s", window_s, 0.0, unit="seconds"))
    return s2 / (rate * (1.0 + s1))


def window_for_wait_s(rate: float, max_batch: int, wait_s: float) -> float:
    """The window (s) whose light-load mean wait :func:`poisson_window_wait_s` equals ``wait_s``
    (bisection: the wait grows with the window). ValueError when ``wait_s`` is beyond what any
    window gives (the size trigger caps the wait at ``(B - 1) / (2 rate)``)."""
    rate = real("rate", rate, 0.0, low_open=True, unit="1/s")
    max_batch = integer("max_batch", max_batch, 1)
    wait_s = real("wait_s", wait_s, 0.0, unit="seconds")
    hi = 1.0 / rate
    while poisson_window_wait_s(rate, max_batch, hi) < wait_s:
        hi *= 2
        if hi > 1e6 / rate:
            raise ValueError(f"wait_s = {wait_s:.4g} s is more than any window gives at rate {rate:g}/s with "
                             f"max_batch = {max_batch} (the size trigger caps the wait near {(max_batch - 1) / (2 * rate):.4g} s)")
    lo = 0.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if poisson_window_wait_s(rate, max_batch, mid) < wait_s else (lo, mid)
    return (lo + hi) / 2


def trigger_shares(run: BatchRun, max_batch: int, window_s: float) -> dict[str, float]:
    """Share of a :func:`~lib.scheduling.batcher.run_fixed_cost` run's batches by what sent them:
    ``"size"`` (``max_batch`` items waited: left as the last one arrived, or as the server freed),
    ``"time"`` (left exactly at the oldest item's deadline, the server free: the batches the
    self-cancelling timer loses), ``"server"`` (the deadline had passed while the server was busy;
    left when it freed). Shares of the number of batches; they sum to 1."""
    max_batch = integer("max_batch", max_batch, 1)
    window_s = real("window_s", window_s, 0.0, unit="seconds")
    counts = {"size": 0, "time": 0, "server": 0}
    for start, items in run.batches:
        at_deadline = abs(start - (run.arrivals[items[0]] + window_s)) <= 1e-12 * max(1.0, start)
        if at_deadline and len(items) < max_batch:
            counts["time"] += 1
        elif len(items) == max_batch:
            counts["size"] += 1
        else:
            counts["server"] += 1
    n = max(1, len(run.batches))
    return {k: v / n for k, v in counts.items()}
