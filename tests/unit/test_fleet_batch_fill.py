"""lib.fleet.batch_fill: batch beside chat against the simulator, the batch-only replica, the day's totals."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import batch_fill as bf
from lib.fleet import capacity, diurnal
from lib.perf.deployment import deployment
from lib.scheduling.cost import step_cost


@pytest.fixture(scope="module")
def dep70():
    return deployment("llama-3.1-70b", "h100-sxm", tp=8)


def test_dedicated_batch_is_kv_bound_at_long_contexts(dep70):
    d = bf.dedicated_batch(dep70, 16384, 1024)
    assert d.binding == "the KV pool" and d.kv_batch < d.compute_bound_batch
    assert d.cost.batch == int(d.kv_batch)
    # by hand: the pool's bytes per GPU over one sequence's KV per GPU (8 KV heads over TP8)
    per_gpu = dep70.mdl.kv_bytes_per_token("bf16") * 17408 / 8
    assert d.kv_batch == pytest.approx(dep70.budget.kv_cache_bytes / per_gpu, rel=0.02)
    assert bf.dedicated_batch(dep70, 1024, 512).binding == "compute"


def test_headroom_step_and_kv_limits(dep70):
    h = bf.batch_headroom(dep70, 2.67, 1024, 256, 0.05, 16384, 1024)
    assert h.batch_rate > 0 and h.step_s <= 0.05 * (1 + 1e-9)
    assert h.chat_decodes == pytest.approx(2.67 * 256 * 0.05)
    assert h.batch_decodes == pytest.approx(h.batch_rate * 1024 * 0.05)
    cap = dep70.budget.token_capacity
    used = h.chat_decodes * 1280 + h.batch_decodes * 17408 + 1024 + 16384
    assert used <= cap
    # the batch's share counts its decodes and the one document being prefilled (its whole prompt)
    assert h.kv_share == pytest.approx((h.batch_decodes * 17408 + 16384) / cap)


@settings(max_examples=12, deadline=None)
@given(a=st.floats(0, 10), b=st.floats(0, 10))
def test_more_chat_leaves_less_batch(dep70, a, b):
    lo, hi = sorted((a, b))
    assert bf.batch_headroom(dep70, hi, 1024, 256, 0.05, 16384, 1024).batch_rate <= \
        bf.batch_headroom(dep70, lo, 1024, 256, 0.05, 16384, 1024).batch_rate + 1e-9


def test_headroom_against_the_simulator(dep70):
    """Oracle: two priority classes in the discrete-event simulator, with the step's token budget and a KV share."""
    from lib.scheduling.engine import simulate
    from lib.scheduling.policies import Policy
    from lib.scheduling.workloads import Workload, mix

    lam_c, t = 2.67, 0.05
    h = bf.batch_headroom(dep70, lam_c, 1024, 256, t, 16384, 1024)
    d = h.chat_decodes + h.batch_decodes
    c = (lam_c * 1024 + h.batch_rate * 16384) * t
    pol = Policy(use_priority=True, token_budget=max(round(d + c), math.ceil(d) + 2), max_running=math.ceil(d) + 2,
                 kv_share_cap={1: min(1.0, h.kv_share * 1.1)})
    reqs = mix([Workload(prompt=1024, output=256, rate=lam_c, n_requests=640, priority=0, arrival="uniform"),
                Workload(prompt=16384, output=1024, rate=h.batch_rate, n_requests=int(h.batch_rate * 240), priority=1,
                         arrival="uniform")], seed=0)
    res = simulate(reqs, pol, step_cost(dep70))
    assert res.metrics(priority=1).requests_per_s == pytest.approx(h.batch_rate, rel=0.2)
    assert res.metrics(priority=0).tpot.mean <= 1.1 * t


def test_day_totals(dep70):
    day = bf.day_of_batch(dep70, 1024, 256, 0.05, 20.0, 4.0, 16384, 1024, slots=12)
    chat = capacity.request_cost(dep70, 1024, 256, 0.05)
    assert day.fleet == diurnal.fixed_fleet(chat, 20.0, 4.0)
    assert day.mixed_requests == pytest.approx(sum(day.mixed_rate) * 7200)
    assert all(0 < n <= day.fleet.replicas for n in day.chat_replicas)
    assert day.drained_requests == pytest.approx(
        sum((day.fleet.replicas - n) * day.dedicated.cost.max_rate for n in day.chat_replicas) * 7200)
    # the slots' chat rates average to the mean (a cosine sampled at slot middles)
    assert np.mean(day.chat_rate) == pytest.approx(20.0, rel=1e-9)


def test_bad_inputs(dep70):
    with pytest.raises(ValueError, match="chat_rate"):
        bf.batch_headroom(dep70, -1.0, 1024, 256, 0.05, 16384, 1024)
    with pytest.raises(ValueError, match="batch_prompt"):
        bf.dedicated_batch(dep70, 0, 10)
    with pytest.raises(ValueError, match="slots"):
        bf.day_of_batch(dep70, 1024, 256, 0.05, 20.0, 4.0, 16384, 1024, slots=0)
