"""Practice mode for the bounded work queue (N071): a grader for any implementation, and the classic
defects.

The candidate implements :class:`Skeleton`: ``factory(handler, workers=W, bound=B)`` starts W
consumer threads; ``submit(item, timeout)`` returns a :class:`concurrent.futures.Future`, blocks
while B items wait and raises :class:`queue.Full` after ``timeout``; ``shutdown(timeout)`` lets the
queued work finish and stops every worker; ``alive_workers`` counts running workers.

A program is an optional ``("config", workers, bound)`` and operations, run with real threads and
real timeouts (every call that could hang runs in a helper thread with a deadline; nothing sleeps
and hopes):

* ``("submit", x)``: the handler returns x * x; ``("raise", x)``: the handler raises
  ``ValueError(x)``; either must come back on that item's future;
* ``("hold",)``: after every earlier item is done, handlers block until ``("release",)``; while
  held, the first W items submitted must each be picked up by a free worker, the next B wait,
  and one more submit must raise ``queue.Full`` within ``FULL_TIMEOUT_S`` (backpressure);
* ``("release_soon",)``: release from another thread 50 ms later (the next operation, a
  shutdown, then runs while work is still queued); any other shutdown first releases and waits
  for the submitted items to finish, so every program is valid and its outcome deterministic;
* ``("shutdown",)``: shutdown must return within ``TIMEOUT_S`` with every worker stopped and every
  submitted item done, and a later submit must raise RuntimeError.

Every program ends with a release and a shutdown. Before a shutdown all W workers must be alive
(an exception must not kill one), and a worker thread that dies with an exception is reported.
:func:`check` grades any factory (the class itself or a lambda; never a subclass of the reference)
through :func:`lib.book.practice.grade`; ``VARIANTS`` are drafts with one classic defect each.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from lib.book.drafts import edited_class
from lib.book.practice import Case, PracticeReport, grade

from .work_queue import WorkQueue

__all__ = ["QUESTION", "VARIANTS", "Skeleton", "cases", "check", "run", "variant"]

QUESTION = "bounded work queue (N071)"
DEFAULT_CONFIG = ("config", 2, 3)
TIMEOUT_S = 0.25  # shutdown, a worker picking up an item, an item finishing (a correct queue takes ms)
FULL_TIMEOUT_S = 0.05  # the submit timeout when the queue must be full


class Skeleton:
    """A FIFO of at most ``bound`` items consumed by ``workers`` threads running ``handler(item)``."""

    def __init__(self, handler: Callable, *, workers: int, bound: int):
        """Start ``workers`` daemon threads; at most ``bound`` items may wait."""
        raise NotImplementedError

    def submit(self, item, timeout: float | None = None) -> Future:
        """Queue ``item`` and return its Future; block while ``bound`` items wait, and raise
        queue.Full after ``timeout`` seconds. RuntimeError after shutdown."""
        raise NotImplementedError

    def shutdown(self, timeout: float = 5.0) -> None:
        """Refuse new items, let the queued ones finish, stop every worker (within ``timeout``)."""
        raise NotImplementedError

    @property
    def alive_workers(self) -> int:
        """How many worker threads are running."""
        raise NotImplementedError


# ---- the harness: a handler the grader controls ------------------------------------------------


class _Harness:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = 0
        self.cond = threading.Condition()

    def handler(self, item):
        with self.cond:
            self.entered += 1
            self.cond.notify_all()
        self.gate.wait(5.0)  # never forever: a grader that hangs helps nobody
        if isinstance(item, tuple) and item[0] == "raise":
            raise ValueError(f"bad item {item[1]}")
        return item * item

    def wait_entered(self, n: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.entered >= n, timeout)


def _call(fn: Callable, what: str, deadline: float):
    """Run ``fn`` in a helper thread; its result, its exception re-raised, or AssertionError if it
    has not returned within ``deadline`` seconds."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001  (handed back to the grader)
            box["error"] = err

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(deadline)
    if t.is_alive():
        raise AssertionError(f"{what} did not return within {deadline:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _split(ops: Sequence):
    ops = list(ops)
    cfg = ops[0] if ops and ops[0][0] == "config" else DEFAULT_CONFIG
    return cfg[1], cfg[2], [op for op in ops if op[0] != "config"]


def run(factory: Callable, ops: Sequence) -> None:
    """Replay ``ops`` on ``factory(handler, workers=W, bound=B)``; raise AssertionError naming the
    first broken property (module doc)."""
    workers, bound, body = _split(ops)
    h = _Harness()
    died: list[str] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: died.append(f"{args.exc_type.__name__}: {args.exc_value}")
    try:
        _run(factory, workers, bound, body, h, died)
    finally:
        h.gate.set()
        threading.excepthook = old_hook


def _run(factory, workers, bound, body, h, died):
    wq = _call(lambda: factory(h.handler, workers=workers, bound=bound), "the constructor", TIMEOUT_S)
    futures: list[tuple] = []  # (future, item, raises)
    held = 0  # items submitted since the hold began
    shut = False
    racing = False  # a release_soon is pending: the next shutdown runs while work is queued

    def settle(what: str):
        for fut, item, _ in futures:
            try:
                _call(lambda f=fut: f.exception(timeout=TIMEOUT_S), f"item {item}'s future", TIMEOUT_S + 0.5)
            except TimeoutError:
                raise AssertionError(f"item {item} was not processed within {TIMEOUT_S:g} s ({what})"
                                     + (f"; a worker thread died: {died[0]}" if died else "")) from None

    def verify_results():
        for fut, item, raises in futures:
            if not fut.done():
                raise AssertionError(f"item {item}'s future is not done after shutdown: the queued work was dropped")
            err = fut.exception()
            if raises:
                if not isinstance(err, ValueError) or str(err) != f"bad item {item}":
                    raise AssertionError(f"item {item} raised ValueError('bad item {item}') in the handler, but its "
                                         f"future holds {err!r}: the exception must reach the submitter")
            elif err is not None:
                raise AssertionError(f"item {item}'s future holds {err!r}; expected the result {item * item}")
            elif fut.result() != item * item:
                raise AssertionError(f"item {item}'s result is {fut.result()!r}; expected {item * item}")

    def do_shutdown():
        nonlocal shut
        alive = wq.alive_workers
        if not died and alive != workers:
            raise AssertionError(f"{alive} of {workers} workers alive before shutdown")
        if died:
            raise AssertionError(f"a worker thread died: {died[0]} (an exception in the handler must not end the "
                                 f"worker); {wq.alive_workers} of {workers} left")
        try:
            _call(lambda: wq.shutdown(timeout=TIMEOUT_S), "shutdown()", TIMEOUT_S + 1.0)
        except TimeoutError as err:
            raise AssertionError(f"shutdown timed out ({err}): {wq.alive_workers} of {workers} workers never "
                                 "stopped (does every worker get its own sentinel?)") from None
        left = wq.alive_workers
        if left:
            raise AssertionError(f"shutdown returned with {left} of {workers} workers still running: each worker "
                                 "needs its own sentinel")
        verify_results()
        try:
            _call(lambda: wq.submit(0, timeout=FULL_TIMEOUT_S), "submit() after shutdown", TIMEOUT_S)
        except RuntimeError:
            pass
        else:
            raise AssertionError("submit() after shutdown was accepted: it must raise RuntimeError (the item would "
                                 "wait behind the sentinels forever)")
        shut = True

    for op in body:
        if shut:
            break
        kind = op[0]
        if kind in ("submit", "raise"):
            x = op[1]
            item = ("raise", x) if kind == "raise" else x
            if not h.gate.is_set() and held >= workers + bound:
                if not h.wait_entered(h.entered_at_hold + workers, TIMEOUT_S):
                    raise AssertionError(f"only {h.entered - h.entered_at_hold} of {workers} workers picked up an item "
                                         f"within {TIMEOUT_S:g} s")
                try:
                    _call(lambda it=item: wq.submit(it, timeout=FULL_TIMEOUT_S),
                          f"submit({x}, timeout={FULL_TIMEOUT_S})", TIMEOUT_S + 0.5)
                except queue.Full:
                    continue
                raise AssertionError(f"submit({x}) was accepted with {workers} items running and {bound} waiting: the "
                                     f"queue must hold at most bound = {bound} (no backpressure)")
            try:
                fut = _call(lambda it=item: wq.submit(it, timeout=TIMEOUT_S), f"submit({x})", TIMEOUT_S + 0.5)
            except queue.Full:
                raise AssertionError(f"submit({x}) raised queue.Full with room in the queue") from None
            if not isinstance(fut, Future):
                raise AssertionError(f"submit({x}) returned {fut!r}, not a concurrent.futures.Future")
            futures.append((fut, x, kind == "raise"))
            if not h.gate.is_set():
                held += 1
                if held <= workers and not h.wait_entered(h.entered_at_hold + held, TIMEOUT_S):
                    raise AssertionError(f"no worker picked up item {x} within {TIMEOUT_S:g} s although "
                                         f"{workers - held + 1} were free")
        elif kind == "hold":
            settle("before the hold")
            h.gate.clear()
            h.entered_at_hold = h.entered
            held = 0
        elif kind == "release":
            h.gate.set()
        elif kind == "release_soon":
            if not h.gate.is_set():  # only a held program races its shutdown
                threading.Timer(0.05, h.gate.set).start()
                racing = True
        elif kind == "shutdown":
            if not racing:  # a held program releases first, and nothing is left to race the shutdown
                h.gate.set()
                settle("before the shutdown")
            do_shutdown()
        else:
            raise ValueError(f"unknown operation {op!r}")
    h.gate.set()
    if not shut:
        settle("at the end of the program")
        do_shutdown()


def _describe(ops: Sequence) -> str:
    workers, bound, body = _split(ops)
    lines = [f"  wq = factory(handler, workers={workers}, bound={bound})   # handler(x) = x * x"]
    for op in body:
        lines.append({"submit": lambda o: f"  wq.submit({o[1]})",
                      "raise": lambda o: f"  wq.submit(item {o[1]} whose handler raises ValueError)",
                      "hold": lambda o: "  (every handler now blocks until released)",
                      "release": lambda o: "  (handlers released)",
                      "release_soon": lambda o: "  (handlers released 50 ms later, from another thread)",
                      "shutdown": lambda o: f"  wq.shutdown(timeout={TIMEOUT_S})"}[op[0]](op))
    return "\n".join(lines)


def cases() -> list[Case]:
    """The graded programs: results, exceptions, worker survival, shutdown, backpressure, drain."""
    def s(*xs):
        return [("submit", x) for x in xs]

    return [
        Case("results come back on their futures", (("config", 2, 3), *s(1, 2, 3, 4, 5, 6), ("shutdown",))),
        Case("an exception stays with its item", (("config", 2, 3), ("submit", 1), ("raise", 2), ("submit", 3),
                                                  ("raise", 4), ("submit", 5), ("shutdown",))),
        Case("exceptions do not use up the workers", (("config", 3, 2), ("raise", 1), ("raise", 2), ("raise", 3),
                                                      ("raise", 4), *s(5, 6, 7), ("shutdown",))),
        Case("shutdown stops every worker", (("config", 4, 2), *s(1, 2), ("shutdown",))),
        Case("a full queue pushes back", (("config", 2, 3), ("hold",), *s(1, 2, 3, 4, 5, 6), ("release",),
                                          ("shutdown",))),
        Case("shutdown finishes the queued work", (("config", 1, 4), ("hold",), *s(1, 2, 3, 4, 5),
                                                   ("release_soon",), ("shutdown",))),
        Case("submit after shutdown is refused", (("config", 1, 1), ("submit", 1), ("shutdown",))),
    ]


def check(factory: Callable) -> PracticeReport:
    """Grade any work-queue implementation (the class, or a factory taking handler, workers, bound)."""
    if not callable(factory):
        raise ValueError(f"check() takes a class or a factory that builds one, got {factory!r}")
    return grade(QUESTION, lambda: factory, cases(), run, describe=_describe)


# ---- defective drafts (each must fail the grader): the reference with one mistake each ---------------
# A draft is either the reference's methods with the mistake edited into their source (edited_class:
# the edits are the whole difference) or a subclass that wraps the reference's methods.


class _Unbounded(WorkQueue):
    """queue.Queue() without maxsize: submit never blocks, so nothing slows the producer."""

    def __init__(self, handler, *, workers, bound):
        super().__init__(handler, workers=workers, bound=bound)
        self._queue.maxsize = 0


class _DropsQueuedWork(WorkQueue):
    """shutdown() empties the queue before the sentinels: queued items' futures never complete."""

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._lock:
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
        super().shutdown(timeout)


VARIANTS = {
    "one sentinel for all workers": edited_class(
        WorkQueue, "_OneSentinel", "shutdown() puts one sentinel for all workers: one exits, the others block forever.",
        shutdown=[("for _ in self._threads:\nself._queue.put(_STOP)", "self._queue.put(_STOP)")]),
    "an exception kills the worker": edited_class(
        WorkQueue, "_ExceptionKillsWorker",
        "The handler runs outside any try: its exception ends the worker thread, and the item's future is never "
        "completed.",
        _work=[("try:\nresult = self._handler(item)\n"
                "except Exception as err:  # the handler's failure belongs to its item, not to the worker\n"
                "future.set_exception(err)\nelse:\nfuture.set_result(result)",
                "future.set_result(self._handler(item))")]),
    "the exception is swallowed": edited_class(
        WorkQueue, "_SwallowsException",
        "The worker survives, but the exception is logged nowhere and the future never completes.",
        _work=[("future.set_exception(err)", "pass")]),
    "no bound": _Unbounded,
    "shutdown drops queued work": _DropsQueuedWork,
    "submit accepted after shutdown": edited_class(
        WorkQueue, "_AcceptsAfterShutdown",
        "submit() does not check for shutdown: an item lands behind the sentinels and never runs.",
        submit=[('if self._closed:\nraise RuntimeError("submit after shutdown")', "")]),
}


def variant(name: str) -> Callable:
    """The defective draft ``name`` (one of :data:`VARIANTS`)."""
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {name!r}")
    return VARIANTS[name]
