"""lib.kvcache.tiering: fetch against recompute per tier, the break-even ratio, and SSD wear-out.

Expected values are worked by hand from the datasheet figures in data/assumptions.yaml (storage) and
data/hardware.yaml (H100 SXM dense BF16 989 TFLOP/s), or checked by a second method (bisection,
brute-force comparison)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kvcache import recompute_fetch as rf
from lib.kvcache import tiering as kt
from lib.registry.models import model

H100_BF16 = 989e12  # NVIDIA H100 SXM datasheet, dense BF16 (data/hardware.yaml)
KV_70B = 327_680  # 80 layers x 2 x 8 KV heads x 128 x 2 bytes (data/models.yaml published value)


def test_default_node_matches_the_yaml():
    n = kt.default_node()
    assert n.gpus_per_node == 8 and n.ssd_drives == 8
    assert n.dram_bytes == 2e12  # 32 x 64 GB DIMMs (MLPerf v4.1 NVIDIA H200 system JSON)
    assert math.isclose(n.dram_bandwidth, 16 * 38.4e9)  # 2 sockets x 8 DDR5-4800 channels
    assert (
        n.pcie_h2d_bandwidth == 55e9
        and n.ssd_read_bandwidth == 13e9
        and n.ssd_write_bandwidth == 6.6e9
    )
    assert n.ssd_dwpd == 1.0 and n.ssd_warranty_years == 5.0
    assert kt.default_node(ssd_drives=1).ssd_drives == 1
    with pytest.raises(ValueError, match="unknown NodeSpec"):
        kt.default_node(hbm=1)
    with pytest.raises(ValueError, match="ssd_read_efficiency"):
        kt.default_node(ssd_read_efficiency=1.5)
    assert set(kt.workload_defaults()) == {
        "prefill_share",
        "output_tokens_per_prompt_token",
        "spill_fraction",
    }


def test_fetch_time_by_hand():
    # 32,768 tokens x 327,680 B = 10.74 GB over 8 x 55 GB/s = 440 GB/s -> 24.4 ms (+ 20 us)
    t = kt.fetch_time_s("llama-3.1-70b", 32768, 440e9, "bf16", 20e-6)
    assert math.isclose(t, 20e-6 + 32768 * KV_70B / 440e9, rel_tol=1e-12)
    assert math.isclose(t, 0.02442, rel_tol=1e-3)
    assert kt.fetch_time_s("llama-3.1-70b", 10, math.inf) == 0.0
    assert kt.fetch_time_s("llama-3.1-70b", 10, 1e9, "fp8") * 2 == pytest.approx(
        kt.fetch_time_s("llama-3.1-70b", 10, 1e9, "bf16")
    )
    with pytest.raises(ValueError, match="bandwidth"):
        kt.fetch_time_s("llama-3.1-70b", 10, 0)
    with pytest.raises(ValueError, match="prefix_tokens"):
        kt.fetch_time_s("llama-3.1-70b", 0, 1e9)










def test_breakeven_prefix_edge_cases():
    # no latency and a huge bandwidth: fetch wins from the first token
    assert kt.breakeven_prefix_tokens("llama-3.1-70b", "h100-sxm", 1e15, 0.0, 8) == 0.0
    with pytest.raises(ValueError, match="latency_s"):
        kt.breakeven_prefix_tokens("llama-3.1-70b", "h100-sxm", 1e9, -1.0, 8)




def test_dram_bandwidth_caps_when_pcie_is_faster():
    node = kt.default_node(pcie_h2d_bandwidth=450e9)  # e.g. a C2C-attached CPU
    assert kt.host_bandwidth(node, 8) == pytest.approx(614.4e9)


def test_ssd_endurance_and_line_rate_floor_by_hand():
    # PM1743 15.36 TB, 1 DWPD over 5 years: 15.36e12 x 1825 = 28.03e15 bytes (28,032 TBW)
    assert kt.ssd_endurance_bytes(15.36e12, 1.0, 5.0) == pytest.approx(28.032e15)
    node = kt.default_node(ssd_drives=1)
    w = kt.ssd_wear(100e9, node)  # far more than one drive can write
    assert w.saturated and w.absorbed_rate == 6.6e9
    # floor: 3.84e12 x 1825 / 6.6e9 = 1.0618e6 s = 12.29 days (fill time 582 s x 1825)
    assert w.line_rate_lifetime_s == pytest.approx(3.84e12 * 1825 / 6.6e9)
    assert w.lifetime_days == pytest.approx(12.29, rel=1e-3)
    slow = kt.ssd_wear(1e9, node)
    assert not slow.saturated and slow.drive_writes_per_day == pytest.approx(1e9 * 86400 / 3.84e12)
    assert slow.lifetime_days == pytest.approx(5 * 365 / slow.drive_writes_per_day)
    assert math.isinf(kt.ssd_wear(0.0, node).lifetime_s)
    assert kt.ssd_wear(1e9, node, 2.0).lifetime_s == pytest.approx(slow.lifetime_s / 2)
    with pytest.raises(ValueError, match="no SSD"):
        kt.ssd_wear(1e9, kt.default_node(ssd_drives=0))
    with pytest.raises(ValueError, match="write_amplification"):
        kt.ssd_wear(1e9, node, 0.5)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(1e6, 1e12), b=st.floats(1e6, 1e12))
def test_lifetime_never_increases_with_the_write_rate(a, b):
    node = kt.default_node()
    lo, hi = sorted((a, b))
    assert kt.ssd_wear(hi, node).lifetime_s <= kt.ssd_wear(lo, node).lifetime_s
    assert kt.ssd_wear(hi, node).lifetime_s >= kt.ssd_wear(hi, node).line_rate_lifetime_s






def test_node_and_per_gpu_tiers_share_one_value_per_fact():
    # data/assumptions.yaml (storage) holds each fetch latency, the SSD read rate and its efficiency once:
    # the node of lib.kvcache.tiering and the per-GPU tiers of lib.kvcache.recompute_fetch read the same entries.
    n = kt.default_node()
    nvme, host = rf.storage_tier("local_nvme", "h100-sxm"), rf.storage_tier("host_dram", "h100-sxm")
    assert n.ssd_latency_s == nvme.latency_s == pytest.approx(500e-6)
    assert n.dram_latency_s == host.latency_s == pytest.approx(20e-6)
    assert n.ssd_read_bandwidth * n.ssd_read_efficiency == pytest.approx(nvme.bandwidth, rel=1e-12)
    # the measured 55 GB/s H2D and the host tier's efficiency are one measurement (55 / 63)
    assert n.pcie_h2d_bandwidth == pytest.approx(host.bandwidth, rel=1e-3)
    assert kt.facts()["host"]["nvlink_c2c_gbps_per_direction"] * 1e9 == rf.storage_tier("host_dram", "gb200").peak_bandwidth


@given(st.sampled_from(["llama-3.1-70b", "llama-3.1-8b", "llama-2-7b", "deepseek-v3"]),
       st.sampled_from([1, 2, 4, 8]), st.integers(1, 200_000))
def test_replica_view_is_lib_kvcache_prefix_per_gpu(key, n, p):
    # W* of the replica (unique bytes) = the per-GPU W* of lib.kvcache.recompute_fetch / the share each
    # GPU holds; with TP <= KV heads that is n x the per-GPU figure.
    from lib.perf.roofline import kv_shard_fraction

    m = model(key)
    per_gpu = rf.breakeven_bandwidth_closed_form(m, "h100-sxm", p, tp=n, mfu=0.6)
    w = kt.breakeven_bandwidth(m, "h100-sxm", p, n)
    assert w == pytest.approx(per_gpu / kv_shard_fraction(m, n), rel=1e-12)
    assert w == pytest.approx(kt.compute_rate("h100-sxm", n) / kt.recompute_intensity(m, p), rel=1e-12)
    if not m.is_mla and n <= m.num_kv_heads:
        assert w == pytest.approx(n * per_gpu, rel=1e-12)
    # and the break-even prefix of the replica is the per-GPU one at each GPU's share of W
    bw, lat = 50e9, 100e-6
    assert kt.breakeven_prefix_tokens(m, "h100-sxm", bw, lat, n) == pytest.approx(
        rf.breakeven_prefix_tokens_closed_form(m, "h100-sxm", bw * kv_shard_fraction(m, n), latency_s=lat,
                                               tp=n, mfu=0.6), rel=1e-12)


def test_fact_range_reads_the_yaml_bounds():
    # data/assumptions.yaml (storage): PM1743 capacities 1.92 to 15.36 TB (3.84 TB in a DGX H100);
    # NVMe read efficiency 0.3-0.95 around 0.7 (tiers.local_nvme, the alias ssd.read_efficiency)
    assert kt.fact_range("ssd", "capacity_tb") == (1.92, 15.36)
    assert kt.fact_range("ssd", "read_efficiency") == (0.3, 0.95)
    assert kt.fact_range("ssd", "dwpd") == (kt.facts()["ssd"]["dwpd"],) * 2  # no range stated
    for section, values in kt.facts().items():
        for name, value in values.items():
            low, high = kt.fact_range(section, name)
            assert low <= value <= high, f"{section}.{name}: {value} outside [{low}, {high}]"
    with pytest.raises(ValueError, match="section must be one of"):
        kt.fact_range("tiers", "capacity_tb")
    with pytest.raises(ValueError, match="no 'capacity'"):
        kt.fact_range("ssd", "capacity")
