"""Per-tenant token limits (N061): two buckets, reserve-then-settle, the distributed counter and the
fleet arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import rate_limits as rl


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_two_buckets_take_both_or_neither():
    clock = Clock()
    lim = rl.TenantModelLimiter(600, 60, policy="refund", clock=clock)  # 10 input, 1 output token per second
    r = lim.admit(500, 40)
    assert r is not None and lim.input.available() == 100 and lim.output.available() == 20
    assert lim.admit(50, 30) is None  # output short: the input bucket keeps its 100
    assert lim.input.available() == 100
    lim.settle(r, 10)  # used 10 of 40: 30 back
    assert lim.output.available() == 50
    with pytest.raises(ValueError, match="never fits"):
        lim.admit(10, 61)


@settings(max_examples=40, deadline=None)
@given(used=st.lists(st.integers(0, 200), min_size=1, max_size=20))
def test_settle_policies_charge_what_they_say(used):
    clock = Clock()
    for policy, charged in (("max_tokens", lambda o: 200), ("refund", lambda o: o), ("estimate", lambda o: o)):
        lim = rl.TenantModelLimiter(1e9, 1e9, policy=policy, estimate=50, clock=clock)
        start = lim.output.available()
        for o in used:
            res = lim.admit(1, 200)
            lim.settle(res, o)
        assert start - lim.output.available() == pytest.approx(sum(charged(o) for o in used))


def test_reservation_run_flow_balances():
    outs = rl.output_lengths(300, 1.0, 4096, 2000, 0)
    mt = rl.reservation_run(100_000, outs, 4096, 0.05, "max_tokens", horizon_s=600)
    assert mt.per_min / 100_000 == pytest.approx(outs.mean() / 4096, rel=0.15)
    rf = rl.reservation_run(100_000, outs, 4096, 0.05, "refund", horizon_s=3000, dt_s=0.5)
    assert rf.per_min / 100_000 == pytest.approx(1.0, rel=0.1)
    es = rl.reservation_run(100_000, outs, 4096, 0.05, "estimate", horizon_s=600)
    assert es.first_s > rf.first_s >= math.floor(100_000 / 4096)


def test_output_lengths_mean_and_clip():
    x = rl.output_lengths(300, 1.0, 1000, 20000, 1)
    assert x.max() <= 1000 and x.min() >= 1
    assert rl.output_lengths(300, 0.0, 1000, 5, 1).tolist() == [300.0] * 5


@pytest.mark.parametrize("g,s", [(2, 1.0), (8, 0.5), (16, 2.0)])
def test_sync_greedy_reaches_the_bound_and_split_never_over(g, s):
    r, c = 100.0, 6000.0
    dt = s / 10
    sync = rl.distributed_run(r, c, g, s, "sync", horizon_s=10 * s + 5, dt_s=dt)
    assert sync.overshoot == pytest.approx(rl.sync_overshoot_bound(r, c, g, s), abs=g * r * dt + 1e-6)
    for scheme in ("central", "split"):
        assert rl.distributed_run(r, c, g, s, scheme, horizon_s=30, dt_s=dt).overshoot == 0


def test_split_starves_a_hot_gateway():
    run = rl.distributed_run(100.0, 100.0, 4, 1.0, "split", demand=400.0, hot_share=1.0, horizon_s=200, dt_s=0.05)
    assert run.admitted_rate == pytest.approx(25.0, rel=0.05)


def test_limit_cost_binding_and_replicas():
    from lib.fleet.capacity import request_cost
    from lib.perf.deployment import deployment

    dep = deployment("llama-3.1-8b", "h100-sxm")
    lc = rl.limit_cost(dep, 1_000_000, 100_000, 1000, 200, 0.05)
    assert lc.requests_per_min == 500 and lc.binding == "output"
    cost = request_cost(dep, 1000, 200, 0.05)
    assert lc.replicas.exact == pytest.approx(500 / 60 * cost.replica_s / lc.replicas.utilization)
    assert lc.output_per_input == pytest.approx((cost.decode_step_s / cost.batch) / (cost.prefill_s / 1000))


def test_bad_inputs():
    with pytest.raises(ValueError, match="policy"):
        rl.TenantModelLimiter(1, 1, policy="x")
    with pytest.raises(ValueError, match="estimate"):
        rl.TenantModelLimiter(1, 1, policy="estimate")
    with pytest.raises(ValueError, match="scheme"):
        rl.distributed_run(1, 1, 1, 1, "x")
    assert np.isfinite(rl.sync_overshoot_bound(1, 1, 1, 1))


def test_refunds_are_spent_at_once_so_a_two_max_tokens_bucket_reaches_the_limit():
    # a bucket of exactly two max_tokens: each refund refills it past max_tokens and the greedy tenant spends it
    # before the next refund lands, so nothing spills over the capacity and the flow balance holds
    outs = rl.output_lengths(300, 1.0, 16384, 4000, 0)
    run = rl.reservation_run(2 * 16384, outs, 16384, 0.05, "refund", horizon_s=12 * 0.05 * 16384, dt_s=1.6384)
    assert run.per_min / (2 * 16384) > 0.95
    # under two max_tokens only a few streams run at once: at least floor(C / max_tokens) of them
    narrow = rl.reservation_run(6000, outs, 4096, 0.05, "refund", horizon_s=2458, dt_s=0.41)
    assert 60.0 / 0.05 * 300 / (300 + 0.41 / 0.05) * 0.9 / 6000 <= narrow.per_min / 6000 < 0.9
