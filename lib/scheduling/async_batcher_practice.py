"""Practice mode for the asyncio dynamic batcher (N070): a grader for any implementation, and the
classic defects.

The candidate implements :class:`Skeleton`: ``cls(batch_fn, max_batch=, window_s=,
max_in_flight=)``; ``await submit(item)`` returns that item's result (or raises its batch's
exception); ``await close()`` refuses new items (``RuntimeError``), sends every queued item at once
and returns when all are answered.

A program is an optional ``("config", max_batch, window_ms, batch_ms, max_in_flight)`` and
operations with a time in milliseconds: ``("submit", t)`` (item k, numbered in time order, answers
k * k), ``("bad", t)`` (its batch raises ``ValueError("bad item k")``), ``("impatient", t)`` (its
caller gives up, its task cancelled, halfway through its batch's run), ``("close", t)``. Each
program runs on a fresh event loop in its own thread, in real time, through
:func:`lib.scheduling.async_batcher.drive` with a fake model that costs ``batch_ms`` per batch;
nothing sleeps and hopes: every wait has a deadline (the moment W04's model answers, plus
``SLACK_S``). Checked, in this order:

* every batch holds 1 to ``max_batch`` items, each item in one batch; at most ``max_in_flight``
  batches run at once;
* nobody waits forever: a caller still waiting is diagnosed (its batch cancelled inside the timer
  task, i.e. the flush cancelled itself; cancelled inside another caller's task; never sent; lost
  at close);
* each caller gets its own answer: ``k * k``, or the exception of its own batch (a bad batch fails
  its callers and no one else); a caller who gives up does not take its batch down; ``submit``
  after ``close()`` raises ``RuntimeError``;
* FIFO; no item answered only by the final ``close()`` (a lone item must leave at its window);
* with one batch in flight, every batch is the one :class:`~lib.scheduling.batcher.SizeTimeoutBatcher`
  sends at that moment, replayed on the observed clock, and none leaves more than ``LATE_S`` after it
  was due (:func:`~lib.scheduling.async_batcher.replay_decisions`, tolerance ``TOLERANCE_S``);
* ``close()`` returns and leaves no task of the batcher running.

:func:`check` grades any class (or factory) through :func:`lib.book.practice.grade`;
``VARIANTS`` are drafts with one classic defect each, and :func:`grade_all` grades the reference
and every draft at once (in threads: the programs mostly sleep).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade
from lib.inputs import integer

from .async_batcher import (
    AsyncBatcher,
    GuardedTimerBatcher,
    SelfCancellingBatcher,
    drive,
    model_schedule,
    replay_decisions,
    run_in_fresh_loop,
)

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "grade_all", "run", "variant"]

QUESTION = "asyncio dynamic batcher (N070)"
DEFAULT_CONFIG = ("config", 4, 10.0, 5.0, 1)  # max_batch, window_ms, batch_ms, max_in_flight
SLACK_S = 0.1  # how long past the model's answer a caller may still wait before it counts as hung
TOLERANCE_S = 0.003  # decision vs model call: an event this close can fall either side
LATE_S = 0.04  # a batch leaving this long after it was due is late
STALL_S = 0.01  # an arrival this late means the loop itself stalled: a failing run is repeated once


class Skeleton:
    """An asyncio dynamic batcher: one shared queue, a size trigger, a time trigger."""

    def __init__(self, batch_fn, *, max_batch: int, window_s: float, max_in_flight: int = 1):
        """``await batch_fn(items)`` returns one result per item; at most ``max_in_flight`` batches run."""
        raise NotImplementedError

    async def submit(self, item):
        """Queue ``item``; return its result, or raise the exception its batch raised."""
        raise NotImplementedError

    async def close(self) -> None:
        """Refuse new items (RuntimeError); send every queued item now; return when all are answered."""
        raise NotImplementedError


def _split(ops: Sequence):
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    timed = sorted((op for op in ops if op[0] != "config"), key=lambda op: op[1])
    items = [op for op in timed if op[0] != "close"]
    closes = [op[1] for op in timed if op[0] == "close"]
    arrivals = [op[1] / 1e3 for op in items]
    bad = {k for k, op in enumerate(items) if op[0] == "bad"}
    impatient = {k for k, op in enumerate(items) if op[0] == "impatient"}
    return cfg[1:], arrivals, bad, impatient, (min(closes) / 1e3 if closes else None)


def _describe(ops: Sequence) -> str:
    (b, w, c, k), arrivals, bad, impatient, close_at = _split(ops)
    lines = [f"  b = cls(batch_fn, max_batch={b}, window_s={w / 1e3:g}, max_in_flight={k})   "
             f"# each batch_fn call takes {c:g} ms; item k answers k * k"]
    events = [(t, f"  t = {1e3 * t:g} ms: submit({i})" + (" (its batch raises ValueError)" if i in bad else "")
               + (" (its caller gives up halfway through the batch)" if i in impatient else ""))
              for i, t in enumerate(arrivals)]
    if close_at is not None:
        events.append((close_at, f"  t = {1e3 * close_at:g} ms: close()"))
    return "\n".join(lines + [e for _, e in sorted(events, key=lambda x: x[0])])


def _diagnose_hung(x: int, r, model, close_at) -> str:
    calls = [c for c in r.calls if x in c.items]
    if calls and calls[0].status == "cancelled":
        c = calls[0]
        owner = next((j for j, t in r.caller_tasks.items() if t is c.task), None)
        if owner is not None:
            return (f"item {x}'s batch {c.items} ran inside caller {owner}'s task and was cancelled when that caller "
                    f"gave up, so the batch's other callers never get an answer: run each batch in its own task")
        return (f"item {x}'s batch {c.items} was cancelled while batch_fn ran, inside a task the batcher created "
                "(not a caller's): a flush that cancels the timer task it is running in cancels itself. Never cancel "
                "asyncio.current_task(); let the timer end by itself")
    if calls:
        escaped = f"; an exception escaped a task of the batcher: {r.loop_errors[0]}" if r.loop_errors else ""
        return (f"batch_fn answered item {x}'s batch {calls[0].items} ({calls[0].status}) but its caller never got "
                f"the answer (a future left unresolved{escaped})")
    if close_at is not None and not math.isnan(model.dispatch[x]) and model.dispatch[x] >= close_at - 1e-9:
        return (f"item {x} was waiting when close() was called at {1e3 * close_at:g} ms and was never sent: close() "
                "must send (or fail) every queued item")
    return (f"item {x} was never sent to batch_fn; W04's model sends it at {1e3 * model.dispatch[x]:.4g} ms "
            "(is there a time trigger for a lone item? did its timer get cancelled?)")


def _trigger(model, x: int, max_batch: int, window_s: float, close_at) -> str:
    """Why W04's model sends item ``x``'s batch when it does, in words."""
    start, items = next((t, it) for t, it in model.batches if x in it)
    first = model.arrivals[items[0]]
    if close_at is not None and start >= close_at - 1e-12:
        return "close() sends what waits"
    if len(items) == max_batch and start <= first + window_s - 1e-12:
        return f"size trigger: {max_batch} items wait" if start == model.arrivals[items[-1]] else \
            "the server freed with a full batch waiting"
    if abs(start - (first + window_s)) < 1e-12:
        return f"time trigger: the oldest has waited window_s = {1e3 * window_s:g} ms"
    return "the server freed after the time trigger had fired"


def run(factory: Callable, ops: Sequence) -> None:
    """Replay ``ops`` (module doc) on ``factory``; raise AssertionError naming the first broken
    property. A failing run in which the loop itself stalled (an arrival more than ``STALL_S`` late:
    the machine, not the batcher) is run once more, and the second run decides."""
    (b, w_ms, c_ms, k), arrivals, bad, impatient, close_at = _split(ops)
    window_s, batch_s = w_ms / 1e3, c_ms / 1e3
    limit = (max(arrivals, default=0.0) + window_s + (len(arrivals) + 2) * batch_s + 4 * SLACK_S + 3.0)
    for attempt in range(2):
        try:
            r = run_in_fresh_loop(lambda: drive(factory, arrivals, batch_s, max_batch=b, window_s=window_s,
                                                max_in_flight=k, bad=bad, impatient=impatient, close_at=close_at,
                                                hang_after_s=SLACK_S), timeout_s=limit)
        except TimeoutError:
            raise AssertionError(f"the event loop did not finish within {limit:.3g} s: a blocking call (time.sleep?) "
                                 "or an endless loop in the batcher (a loop that never awaits keeps its thread "
                                 "running: restart the kernel)") from None
        stalled = max((s - a for s, a in zip(r.submitted, arrivals, strict=True) if not math.isnan(s)),
                      default=0.0) > STALL_S
        try:
            _verify(r, arrivals, b, window_s, batch_s, k, bad, impatient, close_at)
            return
        except AssertionError:
            if attempt or not stalled:
                raise


def _verify(r, arrivals, b, window_s, batch_s, k, bad, impatient, close_at) -> None:
    """The properties of one run (module doc), in order; AssertionError at the first broken one."""
    n = len(arrivals)
    seen: dict = {}
    for c in r.calls:
        if not c.items:
            raise AssertionError("batch_fn was called with an empty batch")
        if len(c.items) > b:
            raise AssertionError(f"the batch {c.items} holds {len(c.items)} items, above max_batch = {b}")
        for x in c.items:
            if x in seen or not (isinstance(x, int) and 0 <= x < n):
                raise AssertionError(f"item {x!r} was sent in more than one batch (or was never submitted)")
            seen[x] = c
    if r.max_active > k:
        raise AssertionError(f"{r.max_active} batches ran at once, above max_in_flight = {k}")
    model = model_schedule(arrivals, batch_s, b, window_s, close_at)
    for x in r.hung:
        raise AssertionError(f"item {x}'s caller waited forever (still waiting after the final close()): "
                             + _diagnose_hung(x, r, model, close_at))
    for x, (kind, value) in enumerate(r.outcomes):
        c = seen.get(x)
        if close_at is not None and arrivals[x] >= close_at:
            if kind != "error" or not isinstance(value, RuntimeError) or c is not None:
                raise AssertionError(f"submit({x}) after close() gave {kind} {value!r}: it must raise RuntimeError")
            continue
        if x in impatient:
            continue
        failing = c is not None and any(y in bad for y in c.items)
        if failing:
            first = next(y for y in c.items if y in bad)
            if kind != "error" or not isinstance(value, ValueError) or str(value) != f"bad item {first}":
                raise AssertionError(f"item {x} was in the failing batch {c.items}, so its caller must get that batch's "
                                     f"ValueError('bad item {first}'); it got {kind} {value!r}")
        elif kind == "error":
            where = next((cc.items for cc in r.calls if cc.status == "raised"), None)
            if where is not None and isinstance(value, ValueError) and str(value).startswith("bad item"):
                raise AssertionError(f"item {x} was not in the failing batch {where} but its caller got {value!r}: "
                                     "one bad batch must fail only its own callers")
            raise AssertionError(f"submit({x}) raised {value!r}" + ("" if c else " and its item was never sent")
                                 + " (before any close())")
        elif kind == "cancelled":
            raise AssertionError(f"item {x}'s caller was cancelled although it never gave up")
        elif value != x * x:
            raise AssertionError(f"item {x}'s caller got {value!r}; its result is {x * x}")
    sent = [x for c in sorted(r.calls, key=lambda c: c.start) for x in c.items]
    if sent != sorted(sent):
        raise AssertionError(f"items left out of order: {[c.items for c in r.calls]} (one FIFO queue: oldest first)")
    for x in r.answered_at_close:
        raise AssertionError(f"item {x} (submitted at {1e3 * arrivals[x]:g} ms) was answered only by the final "
                             f"close(), long after W04's model sends it at {1e3 * model.dispatch[x]:.4g} ms "
                             f"({_trigger(model, x, b, window_s, close_at)}): that trigger never fired")
    if k == 1:
        d = replay_decisions(r, b, window_s, tolerance_s=TOLERANCE_S, late_s=LATE_S)
        if d.wrong:
            raise AssertionError(f"{d.wrong[0]}: a batch leaves when max_batch items wait or the oldest has waited "
                                 "window_s, with the oldest min(waiting, max_batch) items")
        if d.late:
            raise AssertionError(f"{d.late[0]} (a trigger fired and no batch was in flight)")
    if r.close_problem:
        raise AssertionError(r.close_problem)
    if r.leftover_tasks:
        raise AssertionError(f"close() returned with tasks still pending: {', '.join(r.leftover_tasks)}")


def _random_program(rng: random.Random) -> list:
    b = rng.choice((1, 2, 3, 4))
    w = rng.choice((0.0, 5.0, 10.0, 20.0))
    c = rng.choice((5.0, 10.0))
    k = rng.choice((1, 1, 2))
    t, ops = 0.0, [("config", b, w, c, k)]
    for _ in range(rng.randint(3, 10)):
        t += rng.choice((0.0, 1.0, 3.0, 6.0, 12.0, 20.0))
        kind = rng.choices(("submit", "bad", "impatient"), (8, 1, 1))[0]
        ops.append((kind, t))
    if rng.random() < 0.25:
        ops.append(("close", round(rng.uniform(0, t + 10), 1)))
    return ops


def cases(num_random: int = 3, *, seed: int = 0) -> list[Case]:
    """The graded programs: the lone item, both triggers, a bad batch, callers who give up, close,
    a busy server, several batches in flight, window zero, a burst; then ``num_random`` seeded
    random programs."""
    n = integer("num_random", num_random, 0)

    def at(kind, *ts):
        return tuple((kind, t) for t in ts)

    scripted = [
        Case("a lone item leaves when its window closes", (("config", 4, 10.0, 5.0, 1), *at("submit", 0.0))),
        Case("a burst above the cap is split, oldest first", (("config", 4, 10.0, 5.0, 1), *at("submit", *[0.0] * 10))),
        Case("a full batch leaves at once", (("config", 3, 200.0, 5.0, 1), *at("submit", 0.0, 3.0, 6.0))),
        Case("the window counts from the oldest item", (("config", 4, 20.0, 5.0, 1), *at("submit", 0.0, 8.0, 16.0, 40.0))),
        Case("one bad batch fails only its own callers", (("config", 2, 10.0, 15.0, 1), *at("submit", 0.0),
                                                          *at("bad", 1.0), *at("submit", 5.0, 7.0, 30.0))),
        Case("the caller who filled the batch gives up", (("config", 3, 50.0, 20.0, 1), *at("submit", 0.0, 0.0),
                                                          *at("impatient", 0.0))),
        Case("the first caller of a batch gives up", (("config", 3, 50.0, 20.0, 1), *at("impatient", 0.0),
                                                      *at("submit", 0.0, 0.0))),
        Case("close() sends what waits, then refuses", (("config", 4, 200.0, 5.0, 1), *at("submit", 0.0, 5.0),
                                                        *at("close", 10.0), *at("submit", 20.0))),
        Case("a busy server holds the next batch back", (("config", 2, 5.0, 15.0, 1), *at("submit", 0.0, 0.0, 0.0, 10.0))),
        Case("at most max_in_flight batches at once", (("config", 1, 0.0, 10.0, 2), *at("submit", 0.0, 0.0, 0.0, 0.0))),
        Case("window zero sends whatever waits", (("config", 8, 0.0, 10.0, 1), *at("submit", 0.0, 3.0, 6.0, 25.0))),
    ]
    rng = random.Random(seed)
    return scripted + [Case(f"random program {i}", tuple(_random_program(rng))) for i in range(n)]


def _outcome(candidate: Callable, ops: tuple):
    """What ``run(candidate, ops)`` raised (None when it passed)."""
    try:
        run(candidate, ops)
    except BaseException as err:  # noqa: BLE001  (replayed to the grader in order)
        return err
    return None


def check(candidate: Callable, *, num_random: int = 3, seed: int = 0, parallel: bool = True) -> PracticeReport:
    """Grade any asyncio batcher class (or factory taking ``batch_fn, max_batch=, window_s=,
    max_in_flight=``): real event loops, real time, every wait bounded. Prints the first failing
    program, shrunk. ``parallel``: run every case at once first (each on its own loop and thread;
    they mostly sleep), then report them in order as :func:`lib.book.practice.grade` does; the
    shrinking reruns run one at a time."""
    if not callable(candidate):
        raise ValueError(f"check() takes a class or a factory that builds one, got {candidate!r}")
    graded = cases(num_random, seed=seed)
    first: dict = {}
    if parallel:
        with ThreadPoolExecutor(max_workers=len(graded)) as pool:
            first = dict(zip((c.ops for c in graded), pool.map(lambda c: _outcome(candidate, c.ops), graded),
                             strict=True))

    def replay(factory, ops) -> None:
        key = tuple(ops)
        if key in first:
            err = first.pop(key)
            if err is not None:
                raise err
            return
        run(factory, ops)

    return grade(QUESTION, lambda: candidate, graded, replay, describe=_describe)


# ---- defective drafts: each makes one classic mistake ------------------------------------------


# Drafts that change the reference's code are its own methods with the mistake edited in
# (lib.book.drafts: the edits are the whole difference); the others wrap the reference's methods.
_GUARDED_FAIL = "if not e.future.done():  # a caller that gave up has a cancelled future\ne.future.set_exception(err)"

_FailsEveryone = edited_class(
    AsyncBatcher, "_FailsEveryone",
    "A batch that raises fails every caller the batcher holds: its own and all the queued ones.",
    _run=[("for e in batch:\n" + _GUARDED_FAIL,
           "for e in batch + list(self._queue):  # the mistake: the queued callers fail too\n"
           "    if not e.future.done():\n        e.future.set_exception(err)\nself._queue.clear()")])

_CloseDropsQueue = edited_class(
    AsyncBatcher, "_CloseDropsQueue",
    "close() stops the timer and waits for the batches in flight, but forgets the queued items.",
    close=[("self._timer = None",
            "self._timer = None\nself._queue.clear()  # the mistake: the queued callers are never answered")])


class _NoTimerForLoneItem(AsyncBatcher):
    """The timer runs only while company waits ("no point batching one item"): a lone item waits
    for a second one forever."""

    def _pump(self) -> None:
        super()._pump()
        if len(self._queue) == 1 and not self._closing and self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _OffByOne(AsyncBatcher):
    """An off-by-one cap: the size trigger and the batch both count to ``max_batch + 1``."""

    def _pump(self) -> None:
        self.max_batch += 1
        try:
            super()._pump()
        finally:
            self.max_batch -= 1


_SetsCancelledFuture = edited_class(
    AsyncBatcher, "_SetsCancelledFuture",
    "Sets every result without asking whether the caller gave up: set_result on a cancelled future raises "
    "InvalidStateError and the rest of the batch is never answered.",
    _run=[(_GUARDED_FAIL, "e.future.set_exception(err)"),
          ("if not e.future.done():\ne.future.set_result(r)", "e.future.set_result(r)")])


VARIANTS = {
    "the timer cancels itself": SelfCancellingBatcher,
    "a caller who gives up cancels its batch": GuardedTimerBatcher,
    "one bad batch fails every caller": _FailsEveryone,
    "close() loses the queued items": _CloseDropsQueue,
    "no timer for a lone item": _NoTimerForLoneItem,
    "a batch above max_batch": _OffByOne,
    "set_result on a cancelled future": _SetsCancelledFuture,
}


def variant(name: str) -> Callable:
    """The reference (``"reference"``) or the defective draft ``name`` (one of :data:`VARIANTS`)."""
    if name == "reference":
        return AsyncBatcher
    if name not in VARIANTS:
        raise ValueError(f"variant must be 'reference' or one of {', '.join(VARIANTS)}; got {name!r}")
    return VARIANTS[name]


def grade_all(*, num_random: int = 3, seed: int = 0) -> dict[str, PracticeReport]:
    """``check`` of the reference and of every draft, run at once in threads (the programs mostly
    sleep, so this takes about as long as the slowest one): {name: report}, reference first."""
    names = ["reference", *VARIANTS]
    with ThreadPoolExecutor(max_workers=len(names)) as pool:  # one thread per draft, its cases one by one
        reports = pool.map(lambda name: check(variant(name), num_random=num_random, seed=seed,
                                              parallel=name == "reference"), names)
        return dict(zip(names, reports, strict=True))
