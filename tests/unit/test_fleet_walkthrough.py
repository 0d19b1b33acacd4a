"""lib.fleet.walkthrough: users -> rate by Little's law (against a closed-loop simulation), the queue bound,
and the chain's replica count from lib.fleet.capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity
from lib.fleet import walkthrough as w
from lib.perf.deployment import deployment


@pytest.fixture(scope="module")
def dep():
    return deployment("llama-3.1-70b", "h100-sxm", tp=4)


def test_request_rate_textbook():
    # 2,000 users, 10 s answers, 30 s think time: 50 requests/s (interactive response-time law)
    assert w.request_rate(2000, 30.0, 10.0) == pytest.approx(50.0)
    assert w.request_rate(2000, 0.0, 10.0) == pytest.approx(200.0)


def test_request_rate_against_closed_loop_simulation():
    rng = np.random.default_rng(1)
    n, z, resp, horizon = 500, 20.0, 5.0, 5000.0
    think = rng.exponential(z, (n, 400))
    ends = np.cumsum(resp + think, axis=1) - think
    assert (ends <= horizon).sum() / horizon == pytest.approx(w.request_rate(n, z, resp), rel=0.02)


@pytest.mark.parametrize("bad", [dict(users=0), dict(think_s=-1.0), dict(response_s=0.0)])
def test_request_rate_refuses(bad):
    args = dict(users=10, think_s=1.0, response_s=1.0) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        w.request_rate(**args)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.001, 10.0), st.floats(0.001, 100.0))
def test_queue_depth_is_the_largest_that_keeps_the_budget(prefill, budget):
    k = w.queue_depth_for_ttft(prefill, budget)
    if k >= 0:
        assert (k + 1) * prefill <= budget * (1 + 1e-9)
    assert (k + 2) * prefill > budget * (1 - 1e-9)


def test_chain_uses_capacity(dep):
    ch = w.sizing_chain(dep, 2000, 30.0, 2000, 300, 0.05, 1.0, utilization=0.7)
    cost = capacity.request_cost(dep, 2000, 300, 0.05)
    assert ch.cost.replica_s == cost.replica_s
    assert ch.response_s == pytest.approx(cost.prefill_s + 300 * cost.decode_step_s)
    assert ch.rate * (ch.response_s + 30.0) == pytest.approx(2000)
    assert ch.in_flight == pytest.approx(ch.rate * ch.response_s)
    assert ch.replicas == capacity.fleet_for_load(ch.rate, cost, 0.7).replicas
    assert ch.gpus == ch.replicas * 4
    assert ch.usd_per_hour == pytest.approx(ch.gpus * capacity.gpu_hour_usd("h100-sxm"))
    assert len(w.BOXES) == 7 and len({b.name for b in w.BOXES}) == 7


@settings(max_examples=25, deadline=None)
@given(st.integers(10, 50_000), st.floats(0.0, 120.0), st.sampled_from([256, 1000, 4000]), st.sampled_from([64, 300, 1000]))
def test_decode_slots_never_bind_before_replica_seconds(users, think, p, o):
    dep = deployment("llama-3.1-8b", "h100-sxm", tp=1)
    ch = w.sizing_chain(dep, users, think, p, o, 0.05, 2.0)
    assert ch.slot_use < 1
    assert math.isclose(ch.rate * (ch.response_s + think), users, rel_tol=1e-9)
    # more users never need fewer replicas
    assert w.sizing_chain(dep, users * 2, think, p, o, 0.05, 2.0).replicas >= ch.replicas
