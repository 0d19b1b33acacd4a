"""lib.fleet.capacity: a request's replica-seconds by phase against the simulator, fleet sizing, prices, start time."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity as c
from lib.perf.deployment import deployment
from lib.perf.prefill import prefill_time
from lib.perf.throughput import step_s


@pytest.fixture(scope="module")
def dep70():
    return deployment("llama-3.1-70b", "h100-sxm", tp=8)


@pytest.fixture(scope="module")
def dep8b():
    return deployment("llama-3.1-8b", "h100-sxm")


def test_phases_come_from_the_step_and_prefill_models(dep8b):
    r = c.request_cost(dep8b, 1000, 200, batch=64)
    assert r.prefill_s == prefill_time(dep8b, 1000).time_s
    assert r.decode_step_s == step_s(dep8b, 64, 1100)
    assert r.decode_s == pytest.approx(200 * r.decode_step_s / 64)
    assert r.max_rate == pytest.approx(1 / (r.prefill_s + r.decode_s))


def test_tpot_target_sets_the_batch_and_is_met():
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    r = c.request_cost(dep, 1000, 300, 0.05)
    assert r.limits.binding == "the TPOT target"
    assert r.decode_step_s <= 0.05
    assert step_s(dep, r.batch + 1, 1300) > 0.05 * 0.999  # one more sequence would miss it (at the longest context)


@pytest.mark.parametrize("load", [0.5, 1.6])
def test_closed_form_against_the_simulator(dep8b, load):
    """Independent method: the discrete-event simulator with chunked prefill. Below saturation it
    completes the offered rate; past it, at least the closed form's 1 / replica_s (which charges prefill
    its own weight reads, so it is conservative) and not more than a quarter above."""
    from lib.scheduling.cost import step_cost
    from lib.scheduling.policies import Policy
    from lib.scheduling.replica import steady_run
    from lib.scheduling.workloads import Constant

    r = c.request_cost(dep8b, 1000, 200, batch=64)
    run = steady_run(step_cost(dep8b), Constant(1000), Constant(200), load * r.max_rate,
                     policy=Policy(max_running=64), seed=3)
    done = run.tokens_per_s / 200
    if load < 1:
        assert done == pytest.approx(load * r.max_rate, rel=0.1)
    else:
        assert r.max_rate <= done <= 1.25 * r.max_rate


def test_fleet_for_load(dep8b):
    r = c.request_cost(dep8b, 1000, 200, batch=64)
    f = c.fleet_for_load(100.0, r, 0.7)
    assert f.exact == pytest.approx(100 * r.replica_s / 0.7)
    assert f.replicas == math.ceil(f.exact) and f.busy <= 0.7
    assert f.gpus == f.replicas * dep8b.gpus_per_replica
    plain = c.fleet_for_load(100.0, r.replica_s, 0.7, gpus_per_replica=dep8b.gpus_per_replica)
    assert (plain.exact, plain.replicas, plain.gpus) == (f.exact, f.replicas, f.gpus)
    with pytest.raises(ValueError, match="gpus_per_replica"):
        c.fleet_for_load(100.0, r.replica_s, 0.7)
    exact_int = c.fleet_for_load(3 * 0.7 / r.replica_s, r, 0.7)
    assert exact_int.replicas == 3  # an integer load is not rounded up a whole replica


def test_prices_split_by_phase(dep8b):
    r = c.request_cost(dep8b, 1000, 200, batch=64)
    t = c.usd_per_million_tokens(r, usd_per_gpu_hour=3.6, utilization=0.5)
    per_replica_s = 3.6 / 3600 / 0.5
    assert t.output_usd_per_m == pytest.approx(1e6 / r.decode_tokens_per_s * per_replica_s)
    assert t.input_usd_per_m == pytest.approx(1e6 / r.prefill_tokens_per_s * per_replica_s)
    assert t.usd_per_request == pytest.approx(r.replica_s * per_replica_s)
    assert t.input_share == pytest.approx(r.prefill_share)


def test_gpu_hour_prices():
    from lib.perf.memory import fact

    assert c.gpu_hour_usd("h100-sxm") == c.gpu_hour_usd() == fact("gpu_hour_usd")
    assert c.gpu_hour_usd("b200") > c.gpu_hour_usd("h200") > c.gpu_hour_usd("h100-sxm") > c.gpu_hour_usd("a100-sxm")
    assert c.gpu_hour_usd("h200", 9.0) == 9.0
    with pytest.raises(ValueError, match="gpu must be one of|unknown GPU|not a known"):
        c.gpu_hour_usd("tpu-v5")


def test_replica_start():
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    s = c.replica_start_s(dep, load_gb_s=2.0, pull_s=30, warmup_s=45)
    assert s.weights_s == pytest.approx(dep.mdl.weight_bytes("bf16") / 2e9)
    assert s.total_s == pytest.approx(30 + 45 + s.weights_s)
    big = deployment("llama-3.1-405b", "h100-sxm", tp=8, pp=2, weight_dtype="fp8", compute_dtype="fp8")
    two = c.replica_start_s(big, load_gb_s=2.0)
    assert two.weights_s == pytest.approx(big.mdl.weight_bytes("fp8") / (2 * 2e9))  # two nodes load in parallel


def test_bad_inputs_name_the_input(dep8b):
    with pytest.raises(ValueError, match="exactly one of"):
        c.request_cost(dep8b, 100, 10)
    with pytest.raises(ValueError, match="TPOT target"):
        c.request_cost(deployment("llama-3.1-70b", "h100-sxm", tp=4), 1000, 100, 0.001)
    with pytest.raises(ValueError, match="KV pool"):
        c.request_cost(dep8b, 100_000, 10, batch=500)
    with pytest.raises(ValueError, match="rate"):
        c.fleet_for_load(0, c.request_cost(dep8b, 100, 10, batch=1))


def test_warm_prefill_is_the_chunk_model():
    from lib.kvcache.long_context import prefill_chunk_step_s

    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    assert c.prefill_s(dep, 8000) == prefill_time(dep, 8000).time_s
    assert c.prefill_s(dep, 8000, 0) == pytest.approx(prefill_chunk_step_s(dep, 8000, 0), rel=1e-9)  # cold = chunk at 0
    warm = c.request_cost(dep, 8000, 200, batch=8, cached_len=6000)
    assert warm.prefill_s == prefill_chunk_step_s(dep, 2000, 6000)
    assert prefill_time(dep, 2000).time_s < warm.prefill_s < prefill_time(dep, 8000).time_s
    # a short suffix still reads every weight: the warm prefill never drops below that floor
    assert c.prefill_s(dep, 200, 150) >= prefill_time(dep, 50).estimate.memory_s
    with pytest.raises(ValueError, match="cached_len"):
        c.prefill_s(dep, 100, 100)


def test_cold_is_the_prefill(dep70):
    assert c.prefill_s(dep70, 32768, 0) == prefill_time(dep70, 32768).time_s


def test_warm_compute_matches_the_flop_identity(dep70):
    # compute-bound: the compute term is the FLOPs of the uncached positions at the replica's achieved FLOP/s
    p, h = 32768, 30000
    own = prefill_time(dep70, p - h)
    from lib.kvcache.recompute_fetch import prefill_flops_with_cached_prefix

    flops = prefill_flops_with_cached_prefix(dep70.mdl, p, h)
    assert c.prefill_s(dep70, p, h) == pytest.approx(flops / own.estimate.replica_flops_per_s + own.allreduce_s, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 32768), st.data())
def test_warm_is_monotone(p, data):
    dep = deployment("llama-3.1-8b", "h100-sxm", tp=1)
    h = data.draw(st.integers(0, p - 1))
    w = c.prefill_s(dep, p, h)
    assert 0 < w <= c.prefill_s(dep, p, 0) * (1 + 1e-9)
    if h + 1 < p:
        assert c.prefill_s(dep, p, h + 1) <= w * (1 + 1e-9)


def test_refuses_a_full_hit(dep70):
    with pytest.raises(ValueError, match="cached_len"):
        c.prefill_s(dep70, 100, 100)


def test_warm_cost_replaces_only_the_prefill(dep70):
    c0 = c.request_cost(dep70, 8000, 200, 0.05)
    c1 = c.request_cost(dep70, 8000, 200, 0.05, cached_len=6000)
    assert c1.prefill_s < c0.prefill_s and c1.decode_s == c0.decode_s and c1.batch == c0.batch
