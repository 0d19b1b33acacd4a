"""lib.perf.collectives: the one collective model, against hand computation and data/assumptions.yaml."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import collectives as c
from lib.registry import assumptions
from lib.units import GB, US

NVLINK_EFF = assumptions.value("collectives.nvlink.bus_efficiency")
H100_NVLINK = 450 * GB  # data/hardware.yaml: NVLink 4, per direction per GPU


def test_ring_bytes_are_two_n_minus_one_over_n_by_hand():
    assert c.ring_allreduce_bytes_per_gpu(1e9, 8) == pytest.approx(2 * 7 / 8 * 1e9, rel=1e-15)
    assert c.ring_allreduce_bytes_per_gpu(1e9, 2) == pytest.approx(1e9, rel=1e-15)
    assert c.ring_allreduce_bytes_per_gpu(1e9, 1) == 0.0
    # the bandwidth term of the ring is exactly those bytes over the achieved link rate
    t = c.collective("all_reduce", 1e9, 8, "h100-sxm")
    assert t.bandwidth_s == pytest.approx(2 * 7 / 8 * 1e9 / (H100_NVLINK * NVLINK_EFF), rel=1e-12)


def test_ring_latency_at_eight_gpus_is_the_data_value():
    # data/assumptions.yaml collectives.nvlink.ring_ll: 6.6 + 2 x 7 x 0.6 = 15.0 us at 8 GPUs
    ll = assumptions.entry("collectives.nvlink.ring_ll")
    assert ll["base_us"] + 2 * 7 * ll["per_step_us"] == pytest.approx(15.0)
    t = c.collective("all_reduce", 16384, 8, "h100-sxm")
    assert t.latency_s == pytest.approx(15.0 * US, rel=1e-12)
    assert t.time_s == pytest.approx(t.latency_s + t.bandwidth_s, rel=1e-15)
    assert t.fabric == "NVLink"


def test_tree_versus_ring():
    # tree: latency ~ log2 n steps, bytes 2M (not 2 (n-1)/n M): wins small messages at 8 GPUs, loses big ones
    small_ring = c.collective("all_reduce", 4096, 8, "h100-sxm", "ring")
    small_tree = c.collective("all_reduce", 4096, 8, "h100-sxm", "tree")
    assert small_tree.latency_s < small_ring.latency_s
    assert small_tree.time_s < small_ring.time_s
    big_ring = c.all_reduce_s(1e9, 8, "h100-sxm", "ring")
    big_tree = c.all_reduce_s(1e9, 8, "h100-sxm", "tree")
    assert big_tree > big_ring
    assert c.collective("all_reduce", 1e9, 8, "h100-sxm", "tree").bandwidth_s == pytest.approx(
        2e9 / (H100_NVLINK * NVLINK_EFF), rel=1e-12)


@pytest.mark.parametrize(("n", "us"), [(2, 4.5), (4, 4.8), (8, 7.8), (6, 6.3), (3, 4.65)])
def test_one_shot_latency_from_the_measured_table(n, us):
    # data/assumptions.yaml collectives.nvlink.one_shot (sglang PR 2904, 32 KB): measured at 2, 4, 8,
    # linear between
    t = c.collective("all_reduce", 32768, n, "h100-sxm", "one_shot")
    assert t.latency_s == pytest.approx(us * US, rel=1e-12)
    # one-shot reads the n - 1 other buffers
    assert t.bandwidth_s == pytest.approx((n - 1) * 32768 / (H100_NVLINK * NVLINK_EFF), rel=1e-12)


def test_one_shot_extrapolates_past_the_table_and_elsewhere_falls_back_to_ring():
    f = c.intra_node_fabric("h100-sxm")
    assert c.one_shot_latency_s(16, f) == pytest.approx((7.8 + (7.8 - 4.8) / 4 * 8) * US, rel=1e-12)
    amd = c.intra_node_fabric("mi300x")
    assert c.one_shot_latency_s(8, amd) == pytest.approx(amd.alpha_s(8, 14), rel=1e-12)


def test_mi300x_uses_infinity_fabric_peer_links():
    f = c.intra_node_fabric("mi300x")
    assert f.name == "Infinity Fabric"
    assert f.key == "infinity_fabric"
    assert f.peer_bandwidth == pytest.approx(64 * GB)  # one xGMI link per peer
    eff = assumptions.value("collectives.infinity_fabric.bus_efficiency")
    # TP2: the ring runs over the one 64 GB/s peer link
    two = c.collective("all_reduce", 1e9, 2, "mi300x")
    assert two.bandwidth_s == pytest.approx(1e9 / (64 * GB * eff), rel=1e-12)
    assert two.fabric == "Infinity Fabric"
    # TP8: n - 1 = 7 disjoint peer links at once (module docstring: RCCL runs several rings)
    eight = c.collective("all_reduce", 1e9, 8, "mi300x")
    assert eight.bandwidth_s == pytest.approx(2 * 7 / 8 * 1e9 / (7 * 64 * GB * eff), rel=1e-12)
    # its own latency entry (collectives.infinity_fabric.ring_ll), not NVLink's section
    ll = assumptions.entry("collectives.infinity_fabric.ring_ll")
    assert eight.latency_s == pytest.approx((ll["base_us"] + 14 * ll["per_step_us"]) * US, rel=1e-12)


def test_l40s_has_no_scale_up_link_and_falls_back_to_pcie():
    f = c.intra_node_fabric("l40s")
    assert f.name == "PCIe"
    assert f.peer_bandwidth == c.pcie_bandwidth("l40s")  # the generation is tested below
    t = c.collective("all_reduce", 1e6, 2, "l40s")
    assert t.fabric == "PCIe"
    assert t.latency_s == pytest.approx(assumptions.value("collectives.pcie.latency_us") * US)
    assert t.bandwidth_s == pytest.approx(
        1e6 / (f.peer_bandwidth * assumptions.value("collectives.pcie.bus_efficiency")), rel=1e-12)
    with pytest.raises(ValueError, match="no network"):
        c.network_fabric("l40s")


def test_hierarchical_sixteen_gpus_beat_a_flat_ring_over_one_nic():
    # Finding (issue 9): ffn-cost-model priced a flat 16-GPU ring at one 50 GB/s NIC per GPU.
    # Hierarchical over 2 nodes with 8 NICs each: reduce-scatter on NVLink, 1/8 shard across nodes,
    # all-gather on NVLink.
    m = 64 * 2**20
    hier = c.collective("all_reduce", m, 16, "h100-sxm")
    assert hier.fabric == "NVLink + network"
    net = c.network_fabric("h100-sxm")
    assert net.name == "network"
    flat_one_nic = 2 * 15 / 16 * m / (50 * GB * net.bus_efficiency)
    assert hier.bandwidth_s < flat_one_nic / 4  # about 6x cheaper
    # by hand: RS + AG inside the node, ring all-reduce of m/8 over 2 nodes through the NIC
    intra = c.intra_node_fabric("h100-sxm")
    by_hand = 2 * (7 / 8 * m / (H100_NVLINK * NVLINK_EFF)) + m / 8 / (net.peer_bandwidth * net.bus_efficiency)
    assert hier.bandwidth_s == pytest.approx(by_hand, rel=1e-12)
    # latency: the measured whole two-node call (it already holds the intra-node hops)
    assert hier.latency_s == pytest.approx(assumptions.value("collectives.network.allreduce_latency_us") * US)
    assert intra.name == "NVLink"


def test_cross_node_latency_adds_one_hop_per_doubling_and_never_exceeds_a_flat_nic_ring():
    small = 16e3
    lat = [c.collective("all_reduce", small, n, "h100-sxm").latency_s for n in (16, 32, 64)]
    assert lat[1] == pytest.approx(2 * lat[0]) and lat[2] == pytest.approx(3 * lat[0])
    net = c.network_fabric("h100-sxm")
    flat = sum(c._flat_all_reduce_s(small, 16, net, "ring"))
    assert c.collective("all_reduce", small, 16, "h100-sxm").time_s <= flat


def test_scale_up_domains_from_the_data():
    # H100 PCIe: the NVLink bridge joins pairs; larger groups in the server use PCIe
    assert c.intra_node_fabric("h100-pcie", 2).name == "NVLink"
    assert c.collective("all_reduce", 1e6, 8, "h100-pcie").fabric == "PCIe"
    # GB200 NVL72: 72 GPUs in one NVLink domain, no network below that
    assert c.gpus_per_node(chip="gb200") == 72
    assert c.collective("all_reduce", 1e6, 16, "gb200").fabric == "NVLink"
    assert c.collective("all_reduce", 1e6, 144, "gb200").fabric == "NVLink + network"


def test_a_send_is_one_hop():
    t = c.send(1e6, "h100-sxm")
    assert t.bandwidth_s == pytest.approx(1e6 / (H100_NVLINK * NVLINK_EFF))
    assert c.send(1e6, "h100-sxm", across_nodes=True).fabric == "network"


def test_all_gather_and_reduce_scatter_bytes():
    m = 1e9  # the full gathered buffer
    for kind in ("all_gather", "reduce_scatter"):
        t = c.collective(kind, m, 8, "h100-sxm")
        assert t.bandwidth_s == pytest.approx(7 / 8 * m / (H100_NVLINK * NVLINK_EFF), rel=1e-12)
        assert t.latency_s == pytest.approx(c.intra_node_fabric("h100-sxm").alpha_s(8, 7), rel=1e-12)
    # reduce-scatter + all-gather move the same bytes as one ring all-reduce
    rs = c.collective("reduce_scatter", m, 8, "h100-sxm").bandwidth_s
    ag = c.collective("all_gather", m, 8, "h100-sxm").bandwidth_s
    assert rs + ag == pytest.approx(c.collective("all_reduce", m, 8, "h100-sxm").bandwidth_s, rel=1e-12)
    # all-to-all: (n - 1)/n of the buffer leaves each rank
    a2a = c.collective("all_to_all", m, 8, "h100-sxm")
    assert a2a.bandwidth_s == pytest.approx(7 / 8 * m / (H100_NVLINK * NVLINK_EFF), rel=1e-12)


@pytest.mark.parametrize("chip", ["l4", "l40s"])
def test_ada_boards_are_pcie_gen4(chip):
    from lib.registry.data import load_yaml

    gen4 = load_yaml("hardware.yaml")["interconnect_standards"]["pcie_gen4_x16"]["unidirectional_gbps"]["value"]
    assert c.pcie_bandwidth(chip) == pytest.approx(gen4 * GB)


def test_hierarchical_reduce_scatter_plus_all_gather_equal_the_all_reduce():
    m, n = 1e9, 16
    ar = c.collective("all_reduce", m, n, "h100-sxm").bandwidth_s
    rs = c.collective("reduce_scatter", m, n, "h100-sxm").bandwidth_s
    ag = c.collective("all_gather", m, n, "h100-sxm").bandwidth_s
    assert rs + ag == pytest.approx(ar, rel=1e-9)
    # by hand: NVLink (g-1)/g M, NIC (N-1)/N M/g
    intra, net = c.intra_node_fabric("h100-sxm"), c.network_fabric("h100-sxm")
    by_hand = 7 / 8 * m / (H100_NVLINK * intra.bus_efficiency) + 1 / 2 * m / 8 / (net.peer_bandwidth * net.bus_efficiency)
    assert ag == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: c.collective("all_reduce", -1, 8, "h100-sxm"), "message_bytes"),
        (lambda: c.collective("all_reduce", 1e6, 0, "h100-sxm"), "n_gpus"),
        (lambda: c.collective("all_reduce", 1e6, 2.5, "h100-sxm"), "n_gpus"),
        (lambda: c.collective("broadcast", 1e6, 8, "h100-sxm"), "kind must be one of"),
        (lambda: c.collective("all_reduce", 1e6, 8, "h100-sxm", "butterfly"), "algorithm must be one of"),
        (lambda: c.collective("all_reduce", 1e6, 12, "h100-sxm"), "whole nodes"),
        (lambda: c.all_reduce_s(1e6, 2, "no-such-gpu"), "no-such-gpu"),
        (lambda: c.collective("all_reduce", 1e6, 16, "l40s"), "no network"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


CHIPS = ["h100-sxm", "mi300x", "l40s", "a100-sxm", "b200"]
KINDS = list(c.COLLECTIVES)


@given(
    st.sampled_from(CHIPS),
    st.sampled_from(KINDS),
    st.sampled_from([2, 3, 4, 8]),
    st.floats(1.0, 1e10),
    st.floats(1.0001, 100.0),
)
def test_time_grows_with_message_size(chip, kind, n, m, factor):
    small = c.collective(kind, m, n, chip)
    big = c.collective(kind, m * factor, n, chip)
    assert big.time_s > small.time_s
    assert big.latency_s == small.latency_s  # only the bytes term moves
    assert big.bandwidth_s == pytest.approx(small.bandwidth_s * factor, rel=1e-9)


@given(
    st.sampled_from(["h100-sxm", "mi300x", "b200"]),
    st.sampled_from([k for k in KINDS if k != "all_to_all"]),
    st.sampled_from([16, 32, 64]),
    st.floats(1.0, 1e10),
)
def test_hierarchical_time_grows_with_message_size(chip, kind, n, m):
    assert c.collective(kind, 2 * m, n, chip).time_s > c.collective(kind, m, n, chip).time_s


@given(st.sampled_from(CHIPS), st.sampled_from(KINDS), st.sampled_from(list(c.ALGORITHMS)), st.floats(0, 1e12))
def test_one_gpu_costs_nothing(chip, kind, algorithm, m):
    t = c.collective(kind, m, 1, chip, algorithm)
    assert t.time_s == 0.0 and t.latency_s == 0.0 and t.bandwidth_s == 0.0
    assert t.fabric == "none"


@given(st.sampled_from(CHIPS), st.integers(2, 8), st.floats(0, 1e9))
def test_zero_bytes_cost_only_latency_and_time_is_finite(chip, n, m):
    zero = c.collective("all_reduce", 0.0, n, chip)
    assert zero.bandwidth_s == 0.0 and zero.latency_s > 0
    assert math.isfinite(c.all_reduce_s(m, n, chip))


def test_ring_bytes_per_gpu_by_kind():
    # ring accounting: all-reduce moves twice what a gather or scatter does; a send moves its message
    assert c.ring_bytes_per_gpu("all_gather", 8e9, 8) == pytest.approx(7 / 8 * 8e9, rel=1e-15)
    assert c.ring_bytes_per_gpu("reduce_scatter", 8e9, 8) == c.ring_bytes_per_gpu("all_to_all", 8e9, 8)
    assert c.ring_bytes_per_gpu("all_reduce", 8e9, 8) == pytest.approx(2 * c.ring_bytes_per_gpu("all_gather", 8e9, 8))
    assert c.ring_bytes_per_gpu("send", 3e6, 2) == 3e6
    with pytest.raises(ValueError, match="kind"):
        c.ring_bytes_per_gpu("broadcast", 1e6, 4)
