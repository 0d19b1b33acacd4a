"""lib.fleet.capstone: preconditions per layout, the mechanism ladder, chunked prefill priced, the first request."""

from __future__ import annotations

import pytest

from lib.fleet import capacity, capstone
from lib.perf.deployment import deployment
from lib.perf.prefill import prefill_time
from lib.perf.throughput import step_s


def test_preconditions_per_layout():
    lays = capstone.layouts("llama-3.1-70b", "h100-sxm", 100.0, 4000, 2000, 400, 0.05, 1.0)
    by_tp = {lay.tp: lay for lay in lays}
    assert not by_tp[1].fits and by_tp[1].reason  # 141 GB of weights on one 80 GB GPU
    assert by_tp[4].viable and by_tp[4].fleet is not None
    d4 = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    assert by_tp[4].step1_s == step_s(d4, 1, 4400)
    assert by_tp[4].seqs_held == pytest.approx(d4.budget.max_concurrency(4400))
    tight = capstone.preconditions("llama-3.1-70b", "h100-sxm", 4, 4000, 0, 400, 0.01, 1.0)
    assert tight.fits and not tight.step_ok and not tight.viable  # batch-1 step over a 10 ms target
    slow = capstone.preconditions("llama-3.1-70b", "h100-sxm", 4, 4000, 0, 400, 0.05, 0.1)
    assert not slow.prefill_ok and slow.prefill_s == prefill_time(d4, 4000).time_s


def test_ladder_is_monotone_and_uses_capacity():
    d4 = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    rungs = capstone.mechanism_ladder(d4, 100.0, 4000, 2000, 400, 0.05, utilization=0.7)
    assert [r.name for r in rungs][0] == "one request at a time" and len(rungs) == 4
    assert all(b.fleet.gpus <= a.fleet.gpus for a, b in zip(rungs, rungs[1:], strict=False))
    one = capacity.request_cost(d4, 4000, 400, batch=1)
    assert rungs[0].fleet.exact == pytest.approx(100.0 * one.replica_s / 0.7)
    assert rungs[-1].cost.dep.weight_dtype == "fp8"


def test_chunking_and_first_request():
    d4 = deployment("llama-3.1-70b", "h100-sxm", tp=4)
    ch = capstone.chunking(d4, 4000, 2000, 400, 0.05, 1.0)
    assert ch.colocated.feasible and ch.colocated.step_s <= 0.05 + 1e-9 < ch.stall_s
    first = capstone.first_request(d4, 4000, 2000)
    assert first.start.total_s == capacity.replica_start_s(d4).total_s
    assert first.cold_prefill_s == prefill_time(d4, 4000).time_s > first.warm_prefill_s
    assert first.from_zero_s == pytest.approx(first.start.total_s + first.cold_prefill_s)
