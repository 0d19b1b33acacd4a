"""lib.fleet.capacity_units: a replica's requests/s within the SLO, routing by capacity or GPU count, purchase."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity as c
from lib.fleet import capacity_units as cu
from lib.perf.deployment import deployment


@pytest.fixture(scope="module")
def units():
    h = cu.replica_capacity(deployment("llama-3.1-70b", "h100-sxm", tp=4), 3000, 400, 0.05, 1.0)
    b = cu.replica_capacity(deployment("llama-3.1-70b", "b200", tp=2), 3000, 400, 0.05, 1.0)
    return h, b


def test_unit_is_the_smaller_of_the_two_limits(units):
    for u in units:
        assert u.rate == pytest.approx(min(u.utilization / u.cost.replica_s, u.rho_ttft / u.cost.prefill_s), rel=1e-12)
        assert u.cost.decode_step_s <= 0.05
        assert u.usd_per_request_s_hour == pytest.approx(u.gpus * c.gpu_hour_usd(u.cost.dep.chip) / u.rate)


def test_unit_is_the_sizing_chain_read_per_replica(units):
    """One home for the two limits: the fleet chain at any rate needs rate / unit replicas by each limit."""
    from lib.fleet.sizing_chain import fleet_chain

    for u in units:
        ch = fleet_chain(u.cost.dep, 37.0, 3000, 400, 0, 0.05, 1.0)
        assert ch.by_tpot == pytest.approx(37.0 / u.rate_by_tpot, rel=1e-12)
        assert ch.by_ttft == pytest.approx(37.0 / u.rate_by_ttft, rel=1e-12)
        assert (ch.binding == "the TTFT target") == (u.binding == "the TTFT target")


def test_a_tight_ttft_target_binds():
    u = cu.replica_capacity(deployment("llama-3.1-70b", "h100-sxm", tp=4), 8000, 100, 0.05, 0.8)
    assert u.binding == "the TTFT target"
    with pytest.raises(ValueError, match="TTFT target"):
        cu.replica_capacity(deployment("llama-3.1-70b", "h100-sxm", tp=4), 16000, 100, 0.05, 1.0)


@settings(max_examples=20, deadline=None)
@given(n1=st.integers(1, 100), n2=st.integers(1, 100), frac=st.floats(0.1, 1.5))
def test_routing_by_capacity_equalises_load_and_gpu_routing_does_not(units, n1, n2, frac):
    pools = [cu.Pool("old", units[0], n1), cu.Pool("new", units[1], n2)]
    rate = frac * sum(p.capacity for p in pools)
    by_cap = cu.route(rate, pools, cu.weights_by_capacity(pools))
    assert by_cap[0].load == pytest.approx(frac) and by_cap[1].load == pytest.approx(frac)
    assert sum(pl.rate for pl in by_cap) == pytest.approx(rate)
    by_gpu = cu.route(rate, pools, cu.weights_by_gpus(pools))
    # the older generation serves less per GPU, so GPU-count routing overloads it relative to the newer one
    assert by_gpu[0].load > by_gpu[1].load


def test_md1_quantile_against_pollaczek_khinchine_mean(units):
    """Oracle: the sample-path mean wait of the same queue equals the P-K mean for constant service."""
    from lib.scheduling.queueing import lindley_waits, mg1_mean_wait_s

    s, rho = 0.2, 0.6
    rng = np.random.default_rng(1)
    arr = np.cumsum(rng.exponential(s / rho, 200_000))
    waits = np.asarray(lindley_waits(arr, np.full(len(arr), s)))
    assert waits.mean() == pytest.approx(mg1_mean_wait_s(rho / s, s, scv=0.0), rel=0.05)
    q50 = cu.ttft_quantile_s(s, rho / s, 0.5)
    assert s <= q50 <= s + 3 * waits.mean()
    assert cu.ttft_quantile_s(s, 1 / s, 0.99) == math.inf
    assert cu.ttft_quantile_s(s, 0.0, 0.99) == s


def test_ttft_bound_rate_puts_the_quantile_on_the_target(units):
    for u in units:
        assert cu.ttft_quantile_s(u.cost.prefill_s, u.rate_by_ttft, u.ttft_q, seed=5) == pytest.approx(u.ttft_target_s, rel=0.08)


def test_buy_sorts_by_dollars_and_covers_the_rate(units):
    opts = cu.buy(20.0, list(units))
    assert opts[0].usd_per_hour <= opts[1].usd_per_hour
    for o in opts:
        assert o.replicas * o.unit.rate >= 20.0 - 1e-9
        assert (o.replicas - 1) * o.unit.rate < 20.0


def test_refusals(units):
    with pytest.raises(ValueError, match="replicas"):
        cu.Pool("x", units[0], 0)
    with pytest.raises(ValueError, match="weights"):
        cu.route(1.0, [cu.Pool("x", units[0], 1)], [1, 2])
    with pytest.raises(ValueError, match="pools"):
        cu.weights_by_gpus([])
    with pytest.raises(ValueError, match="units"):
        cu.buy(1.0, ["h100"])


# ---- two generations, two roles (I060)


def test_node_replica_fits_by_whole_nodes():
    b = cu.node_replica("deepseek-v3", "b200")
    h = cu.node_replica("deepseek-v3", "h100-sxm")
    assert (b.tp, b.pp) == (8, 1) and (h.tp, h.pp) == (8, 2)
    assert h.weight_dtype == "fp8" and h.compute_dtype == "fp8"
    with pytest.raises(ValueError):  # one H100 node cannot hold it
        deployment("deepseek-v3", "h100-sxm", tp=8, weight_dtype="fp8", kv_dtype="fp8")
    with pytest.raises(ValueError, match="does not fit"):
        cu.node_replica("deepseek-v3", "h100-sxm", max_nodes=1)





def test_format_disagreement_against_brute_force():
    """Oracle: the same per-tensor quantization by nearest value over the E4M3 table."""
    from lib.numerics.fp8 import amax_scale, e4m3_values

    r = cu.fp8_format_disagreement(vocab=64, hidden=64, rows=16, block=32, seed=2)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 64)) * 0.02
    w[:, rng.choice(64, 4, replace=False)] *= 30.0
    h = rng.standard_normal((16, 64))
    s = float(np.asarray(amax_scale(w)).ravel()[0])
    mags = e4m3_values()[np.isfinite(e4m3_values())]  # the non-negative E4M3 values
    vals = np.unique(np.concatenate([-mags, mags]))
    w_pt = vals[np.abs((w / s)[..., None] - vals).argmin(axis=-1)] * s
    y = h @ w.T
    assert r.err_per_tensor == pytest.approx(np.linalg.norm(h @ w_pt.T - y) / np.linalg.norm(y), rel=1e-6)
    assert r.clipped_mx == 0.0
    assert cu.fp8_format_disagreement(vocab=64, hidden=64, rows=16, rounding="floor", seed=2).clipped_mx > 0
    with pytest.raises(ValueError, match="multiple of block"):
        cu.fp8_format_disagreement(hidden=48, block=32)
