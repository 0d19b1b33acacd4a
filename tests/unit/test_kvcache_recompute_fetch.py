"""lib.kvcache.recompute_fetch and lib.kvcache.tiering on the core: recompute = prefill_time,
the HBM tier = memory_budget, the context window refused (issue 9 regressions)."""

from __future__ import annotations

import math

import pytest

from lib.kvcache import recompute_fetch as rf
from lib.kvcache import tiering as kt
from lib.perf.deployment import Deployment
from lib.perf.prefill import prefill_time

DEP = Deployment("llama-3.1-70b", "h100-sxm", tp=8)


@pytest.mark.parametrize("p", [64, 2048, 32768])
def test_recompute_is_the_prefill_time(p):
    # one home: the recompute price is lib.perf.prefill.prefill_time, all-reduce included
    pt = prefill_time(DEP, p)
    assert rf.recompute_time_s(DEP, p) == pytest.approx(pt.time_s, rel=1e-12)
    assert pt.allreduce_s > 0
    assert rf.recompute_time_s(DEP, p, suffix_len=64) == pytest.approx(
        prefill_time(DEP, p + 64).time_s - prefill_time(DEP, 64).time_s, rel=1e-12)


def test_short_prefix_rides_free_only_without_tp():
    one = Deployment("llama-3.1-8b", "h100-sxm", tp=1)
    assert rf.recompute_time_s(one, 64, suffix_len=64) < 1e-5  # memory-bound pass, no all-reduce
    assert rf.recompute_time_s(DEP, 64, suffix_len=64) > 1e-4  # TP8: the extra tokens' all-reduce traffic


def test_breakeven_ties_and_is_below_the_compute_only_bound():
    w = rf.breakeven_bandwidth(DEP, 8192)
    probe = rf.StorageTier("probe", "probe", w, 1.0, 0.0, "test")
    assert rf.fetch_time_s(DEP.mdl, 8192, probe, tp=8) == pytest.approx(rf.recompute_time_s(DEP, 8192), rel=1e-9)
    bound = rf.breakeven_bandwidth_closed_form(DEP.mdl, DEP.chip, 8192, tp=8)
    pt = prefill_time(DEP, 8192)
    assert w == pytest.approx(bound * pt.compute_s / pt.time_s, rel=1e-9)


def test_breakeven_prefix_is_the_first_winning_length():
    host = rf.storage_tier("host_dram", "h100-sxm")
    one = Deployment("llama-3.1-8b", "h100-sxm", tp=1)
    p = int(rf.breakeven_prefix_tokens(one, host, suffix_len=64))

    def wins(n):
        return rf.fetch_time_s(one.mdl, n, host) < rf.recompute_time_s(one, n, suffix_len=64)

    assert wins(p) and not wins(p - 1)


def test_compare_validates_the_deployment():
    with pytest.raises(ValueError, match="Deployment"):
        rf.compare_recompute_fetch("llama-3.1-70b", 8192, "host_dram")


def test_hbm_tier_is_the_memory_budget():
    # finding: 401 GB on driver-visible memory, not 435 GB on datasheet memory
    hbm = kt.tier_costs(DEP, 32768)[0]
    assert hbm.capacity_tokens == DEP.budget.token_capacity
    assert hbm.capacity_bytes == pytest.approx(DEP.budget.kv_cache_bytes * 8, rel=1e-12)
    assert hbm.capacity_bytes / 1e9 == pytest.approx(401, abs=1)


def test_context_window_is_refused():
    mha = Deployment("llama-2-7b", "h100-sxm", tp=1)
    with pytest.raises(ValueError, match="4,096-token context window"):
        kt.tier_costs(mha, 32768)
    with pytest.raises(ValueError, match="context window"):
        kt.kv_write_rate(mha, 8192)
    assert kt.tier_costs(mha, 4096)[0].prefix_tokens == 4096


def test_write_rate_is_prefill_throughput_times_kv_bytes():
    rate = kt.kv_write_rate(DEP, 8192, None, 1.0, 0.0, 1.0)
    assert rate == pytest.approx(8192 / prefill_time(DEP, 8192).time_s * DEP.mdl.kv_bytes_per_token("bf16"), rel=1e-12)
    assert kt.kv_write_rate(DEP, 8192, None, 0.5, 1.0, 0.5) == pytest.approx(rate * 0.5 * 2 * 0.5, rel=1e-12)
    with pytest.raises(ValueError):
        kt.kv_write_rate(DEP, 8192, None, 0.0)


@pytest.mark.parametrize("model,tp,chip", [("llama-3.1-8b", 1, "b200"), ("llama-3.1-70b", 8, "h100-sxm")])
def test_closed_form_prefix_matches_a_scan(model, tp, chip):
    m = Deployment(model, chip, tp=tp).mdl
    node = kt.default_node()
    bw, lat = kt.ssd_bandwidth(node, tp), node.ssd_latency_s
    p = kt.breakeven_prefix_tokens(m, chip, bw, lat, tp)
    c = kt.compute_rate(chip, tp)
    for n in (max(int(p) - 2, 1), int(p) + 2):
        rec = m.prefill_flops(n) / c
        assert (rec < kt.fetch_time_s(m, n, bw, "bf16", lat)) == (n < p)
    assert math.isfinite(p)
