"""The fixed-cost size/timeout batcher (W04): closed form, properties, and its practice grader."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.scheduling import batcher_practice as bp
from lib.scheduling.batcher import (
    SizeTimeoutBatcher,
    deterministic_batch_items,
    deterministic_mean_latency_s,
    run_fixed_cost,
    throughput_ceiling,
)


def test_throughput_ceiling():
    assert throughput_ceiling(32, 0.1) == pytest.approx(320.0)
    with pytest.raises(ValueError, match="batch_s"):
        throughput_ceiling(32, 0.0)


@pytest.mark.parametrize("rate,b,tau", [(50.0, 8, 0.2), (50.0, 16, 0.105), (7.0, 8, 0.25), (200.0, 32, 0.5)])
def test_deterministic_closed_form_matches_simulation(rate, b, tau):
    arrivals = [k / rate for k in range(2000)]
    run = run_fixed_cost(SizeTimeoutBatcher(b, tau), arrivals, 0.1)
    want = deterministic_mean_latency_s(rate, b, tau, 0.1)
    lat = run.latencies_s[: len(run.latencies_s) // b * b]  # whole batches (the tail may time out)
    assert sum(lat) / len(lat) == pytest.approx(want, rel=0.02)


def test_deterministic_batch_items_counts_arrivals_within_the_timeout():
    assert deterministic_batch_items(198.0, 32, 0.02) == 4  # arrivals at 0, 5.05, 10.1, 15.2 ms inside 20 ms
    assert deterministic_batch_items(200.0, 32, 0.02) == 5  # the fifth lands exactly on the deadline
    assert deterministic_batch_items(459.0, 32, 0.387) == 32  # the size trigger caps it
    with pytest.raises(ValueError, match="rate"):
        deterministic_batch_items(0.0, 32, 0.02)


def test_closed_form_matches_a_whole_number_of_batches_with_a_long_timeout():
    rate, tau, batch_s = 459.2, 0.387, 0.05  # size trigger; a partial last batch would wait the whole timeout
    k = deterministic_batch_items(rate, 32, tau)
    n = 2000 - 2000 % k
    run = run_fixed_cost(SizeTimeoutBatcher(32, tau), [i / rate for i in range(n)], batch_s)
    want = deterministic_mean_latency_s(rate, 32, tau, batch_s)
    assert sum(run.latencies_s) / n == pytest.approx(want, rel=1e-9)


def test_closed_form_refuses_server_bound_regime():
    with pytest.raises(ValueError, match="bottleneck"):
        deterministic_mean_latency_s(100.0, 4, 0.01, 0.1)


def test_unbounded_queue_grows_under_overload_and_bounded_rejects():
    arrivals = [k / 500 for k in range(2000)]  # 500/s against a ceiling of 8 / 0.1 s = 80/s
    free = run_fixed_cost(SizeTimeoutBatcher(8, 0.02), arrivals, 0.1)
    capped = run_fixed_cost(SizeTimeoutBatcher(8, 0.02, queue_limit=8), arrivals, 0.1)
    assert max(free.latencies_s) > 10.0
    assert max(capped.latencies_s) <= 0.02 + 2 * 0.1 + 1e-9
    assert capped.reject_share == pytest.approx(1 - 80 / 500, abs=0.02)


programs = st.tuples(
    st.integers(1, 8), st.sampled_from([0.0, 0.01, 0.05, 0.2]), st.sampled_from([None, 1, 2, 4, 8, 16]),
    st.sampled_from([0.01, 0.1]),
    st.lists(st.floats(0, 0.2, allow_nan=False), min_size=0, max_size=40))


@settings(max_examples=300, deadline=None)
@given(programs)
def test_properties(prog):
    b, tau, limit, cost, gaps = prog
    arrivals = [sum(gaps[: k + 1]) for k in range(len(gaps))]
    run = run_fixed_cost(SizeTimeoutBatcher(b, tau, limit), arrivals, cost)
    sent = [x for _, batch in run.batches for x in batch]
    assert sorted(sent) == run.served == sent  # every accepted item answered exactly once, FIFO
    assert all(len(batch) <= b for _, batch in run.batches)
    starts = [t for t, _ in run.batches]
    assert all(t2 >= t1 + cost - 1e-12 for t1, t2 in zip(starts, starts[1:], strict=False))  # one server
    if limit is not None and limit <= b:
        assert all(w <= max(tau, cost) + 1e-9 for w in run.waits_s)
        assert all(lat <= tau + 2 * cost + 1e-9 for lat in run.latencies_s)
    if limit is None:
        assert run.reject_share == 0


def test_grader_passes_reference_and_catches_every_draft():
    assert bp.check(bp.batcher_variant("reference")).passed
    for name in bp.BATCHER_VARIANTS:
        report = bp.check(bp.batcher_variant(name))
        assert report.status == "failed", name
        assert "shrunk" in report.failure


def test_grader_reports_skeleton_as_not_implemented():
    class Skeleton:
        def __init__(self, *a):
            pass

        def submit(self, item, now):
            raise NotImplementedError

    assert bp.check(Skeleton).status == "not implemented"


def test_inputs_validated():
    with pytest.raises(ValueError, match="max_batch"):
        SizeTimeoutBatcher(0, 0.1)
    with pytest.raises(ValueError, match="non-decreasing"):
        run_fixed_cost(SizeTimeoutBatcher(2, 0.1), [0.2, 0.1], 0.1)
    with pytest.raises(ValueError, match="variant"):
        bp.batcher_variant("nope")
    assert math.isnan(run_fixed_cost(SizeTimeoutBatcher(2, 0.1), [], 0.1).quantile_latency_s(0.5))
