"""lib.fleet.sizing_chain: the N033 chain (tokens per phase, replicas under the SLO pair, nodes, router state);
the TTFT ceiling against Erlang's exact M/D/1 waiting-time distribution."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity
from lib.fleet import sizing_chain as sc
from lib.perf.deployment import deployment


def md1_wait_cdf(t: float, rho: float) -> float:
    """Erlang / Crommelin: P(W <= t) of M/D/1 with unit service."""
    return (1 - rho) * sum((rho * (k - t)) ** k / math.factorial(k) * math.exp(-rho * (k - t)) for k in range(int(t) + 1))


def erlang_rho(ratio: float, q: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if md1_wait_cdf(ratio - 1, mid) >= q else (lo, mid)
    return lo


@pytest.fixture(scope="module")
def dep():
    return deployment("llama-3.1-70b", "h100-sxm", tp=4)


@pytest.mark.parametrize("ratio,q", [(2.0, 0.99), (3.0, 0.95), (5.0, 0.99), (9.0, 0.999), (12.0, 0.9)])
def test_ttft_utilization_matches_erlang(ratio, q):
    assert sc.ttft_utilization(1.0, ratio, q) == pytest.approx(erlang_rho(ratio, q), abs=0.025)


def test_ttft_utilization_scales_and_refuses():
    assert sc.ttft_utilization(0.1, 0.5) == sc.ttft_utilization(1.0, 5.0)  # depends on T / S only
    assert sc.ttft_utilization(1.0, 0.9) == 0.0  # the prefill alone misses the target
    with pytest.raises(ValueError, match="q"):
        sc.ttft_utilization(1.0, 5.0, q=1.0)


def test_chain_numbers(dep):
    ch = sc.fleet_chain(dep, 10_000, 1500, 250, 750, 0.05, 0.5, utilization=0.7)
    assert ch.prompt_tokens_per_s == 15e6 and ch.computed_prompt_tokens_per_s == 7.5e6 and ch.output_tokens_per_s == 2.5e6
    assert ch.by_tpot == pytest.approx(10_000 * ch.cost.replica_s / 0.7)
    assert ch.by_ttft == pytest.approx(10_000 * ch.cost.prefill_s / ch.rho_ttft)
    assert ch.replicas == math.ceil(max(ch.by_tpot, ch.by_ttft))
    assert ch.nodes == math.ceil(ch.replicas / 2)  # two TP4 replicas per 8-GPU node
    assert ch.usd_per_hour == pytest.approx(ch.gpus * capacity.gpu_hour_usd("h100-sxm"))
    b = dep.budget
    assert ch.router_entries == ch.replicas * (b.token_capacity // b.block_size)
    assert ch.router_events_per_s == pytest.approx((7.5e6 + 2.5e6) / b.block_size)
    assert ch.prefill_busy <= ch.rho_ttft + 1e-9


def test_cache_lowers_the_fleet(dep):
    warm = sc.fleet_chain(dep, 1000, 4000, 200, 3000, 0.05, 2.0)
    cold = sc.fleet_chain(dep, 1000, 4000, 200, 0, 0.05, 2.0)
    assert warm.cost.prefill_s < cold.cost.prefill_s and warm.replicas < cold.replicas
    assert warm.cost.decode_s == cold.cost.decode_s  # the cache changes the prefill only


def test_ttft_binds_when_tight(dep):
    ch = sc.fleet_chain(dep, 1000, 4000, 100, 0, 0.1, 1.2)
    assert ch.binding == "the TTFT target" and ch.replicas == math.ceil(ch.by_ttft - 1e-9)
    impossible = sc.fleet_chain(dep, 1000, 4000, 100, 0, 0.1, 0.05)
    with pytest.raises(ValueError, match="TTFT"):
        _ = impossible.replicas


@pytest.mark.parametrize("bad,match", [(dict(cached_len=1500), "cached_len"), (dict(rate=0), "rate"),
                                       (dict(ttft_q=1.0), "ttft_q")])
def test_refusals(dep, bad, match):
    args = dict(rate=100, prompt_len=1500, output_len=100, cached_len=0, tpot_target_s=0.05, ttft_target_s=1.0) | bad
    with pytest.raises(ValueError, match=match):
        sc.fleet_chain(dep, **args)


def test_serving_deployment_fp8():
    d = sc.serving_deployment("llama-3.1-70b", "h100-sxm", 4, "fp8")
    assert (d.weight_dtype, d.kv_dtype, d.compute_dtype) == ("fp8", "fp8", "fp8")
    assert sc.serving_deployment("llama-3.1-70b", "a100-sxm", 4, "fp8").compute_dtype == "bf16"
    with pytest.raises(ValueError, match="dtype"):
        sc.serving_deployment("llama-3.1-70b", "h100-sxm", 4, "int4")


@settings(max_examples=20, deadline=None)
@given(st.floats(100, 20_000), st.integers(0, 1400), st.sampled_from([0.03, 0.05, 0.1]))
def test_monotone_in_rate_and_cache(rate, cached, tpot):
    dep = deployment("llama-3.1-8b", "h100-sxm", tp=1)
    a = sc.fleet_chain(dep, rate, 1500, 200, cached, tpot, 2.0)
    assert sc.fleet_chain(dep, 2 * rate, 1500, 200, cached, tpot, 2.0).replicas >= a.replicas
    if cached <= 1300:
        assert sc.fleet_chain(dep, rate, 1500, 200, cached + 100, tpot, 2.0).cost.prefill_s <= a.cost.prefill_s
