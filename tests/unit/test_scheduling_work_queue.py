"""The bounded work queue (N071) with real threads and real timeouts: results and exceptions on the
futures, workers that survive exceptions, backpressure, shutdown with one sentinel per worker,
the bound's arithmetic; and its practice grader against every defective draft."""

import queue
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.scheduling import work_queue_practice as wp
from lib.scheduling.work_queue import WorkQueue, max_bound, queue_wait_s


def test_results_and_exceptions_come_back_on_their_futures():
    def handler(x):
        if x % 3 == 0:
            raise ValueError(f"bad {x}")
        return x * 10

    wq = WorkQueue(handler, workers=3, bound=4)
    futures = {x: wq.submit(x, timeout=2.0) for x in range(1, 31)}
    for x, fut in futures.items():
        if x % 3 == 0:
            assert isinstance(fut.exception(timeout=2.0), ValueError) and str(fut.exception()) == f"bad {x}"
        else:
            assert fut.result(timeout=2.0) == x * 10
    assert wq.alive_workers == 3  # ten exceptions, no worker lost
    wq.shutdown(timeout=2.0)
    assert wq.alive_workers == 0


def test_a_full_queue_blocks_the_producer_then_raises_full():
    gate, started = threading.Event(), threading.Semaphore(0)

    def handler(x):
        started.release()
        gate.wait(5.0)
        return x

    wq = WorkQueue(handler, workers=2, bound=3)
    try:
        futs = [wq.submit(x, timeout=2.0) for x in range(2)]
        assert started.acquire(timeout=2.0) and started.acquire(timeout=2.0)  # both workers busy
        futs += [wq.submit(x, timeout=2.0) for x in range(2, 5)]  # three wait: the bound
        assert wq.waiting == 3
        t0 = time.monotonic()
        with pytest.raises(queue.Full):
            wq.submit(99, timeout=0.1)
        waited = time.monotonic() - t0
        assert 0.09 <= waited < 2.0  # it blocked for its timeout, no longer
    finally:
        gate.set()
    assert [f.result(timeout=2.0) for f in futs] == list(range(5))
    wq.shutdown(timeout=2.0)


def test_shutdown_drains_the_queue_and_stops_every_worker():
    gate = threading.Event()
    wq = WorkQueue(lambda x: (gate.wait(5.0), x)[1], workers=4, bound=8)
    futs = [wq.submit(x, timeout=2.0) for x in range(12)]
    threading.Timer(0.05, gate.set).start()  # shutdown starts while twelve items are in flight
    wq.shutdown(timeout=3.0)
    assert [f.result(timeout=0) for f in futs] == list(range(12))
    assert wq.alive_workers == 0
    with pytest.raises(RuntimeError, match="after shutdown"):
        wq.submit(1)
    wq.shutdown(timeout=0.1)  # idempotent


def test_shutdown_times_out_on_a_handler_that_never_returns():
    gate = threading.Event()
    wq = WorkQueue(lambda x: gate.wait(10.0), workers=2, bound=2)
    wq.submit(1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="still running"):
        wq.shutdown(timeout=0.2)
    assert time.monotonic() - t0 < 2.0
    gate.set()  # let the thread go


def test_one_sentinel_for_all_workers_leaves_them_blocked():
    wq = wp.variant("one sentinel for all workers")(lambda x: x, workers=4, bound=2)
    with pytest.raises(TimeoutError):
        wq.shutdown(timeout=0.2)
    assert wq.alive_workers == 3  # one sentinel stopped one worker


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 64), service=st.floats(1e-3, 10), timeout=st.floats(1e-3, 100))
def test_max_bound_is_the_largest_bound_within_the_timeout(workers, service, timeout):
    b = max_bound(workers, service, timeout)
    assert queue_wait_s(b, workers, service) <= timeout * (1 + 1e-9)
    assert queue_wait_s(b + 1, workers, service) > timeout * (1 - 1e-9)


def test_validation():
    with pytest.raises(ValueError, match="handler"):
        WorkQueue(None, workers=1, bound=1)
    with pytest.raises(ValueError, match="bound"):
        WorkQueue(lambda x: x, workers=1, bound=0)
    with pytest.raises(ValueError, match="workers"):
        max_bound(0, 1.0, 1.0)


# ---- the practice grader ---------------------------------------------------------------------------


def test_grader_passes_the_reference_and_reports_the_skeleton():
    assert wp.check(WorkQueue).passed
    assert wp.check(lambda handler, workers, bound: WorkQueue(handler, workers=workers, bound=bound)).passed
    assert wp.check(wp.Skeleton).status == "not implemented"


@pytest.mark.parametrize(("name", "why"), [
    ("one sentinel for all workers", "own sentinel"),
    ("an exception kills the worker", "worker thread died"),
    ("the exception is swallowed", "was not processed"),
    ("no bound", "no backpressure"),
    ("shutdown drops queued work", "queued work was dropped"),
    ("submit accepted after shutdown", "RuntimeError"),
])
def test_every_defective_draft_fails_for_its_own_reason(name, why):
    report = wp.check(wp.variant(name))
    assert report.status == "failed"
    assert why in report.failure, report.failure


@settings(max_examples=15, deadline=None)
@given(workers=st.integers(1, 4), bound=st.integers(1, 4),
       items=st.lists(st.tuples(st.sampled_from(["submit", "raise"]), st.integers(0, 50)), max_size=12))
def test_reference_passes_random_programs(workers, bound, items):
    wp.run(WorkQueue, [("config", workers, bound), *items, ("shutdown",)])


def test_grader_runs_hold_and_full_on_random_configs():
    for workers, bound in ((1, 1), (3, 2), (2, 5)):
        n = workers + bound
        wp.run(WorkQueue, [("config", workers, bound), ("hold",), *[("submit", x) for x in range(n + 2)],
                                   ("release",), ("shutdown",)])
