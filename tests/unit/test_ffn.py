"""lib.perf.ffn: the FFN layer's three costs, closed-form regime boundaries against brute force."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import collectives, ffn, roofline
from lib.registry import assumptions
from lib.registry.models import model

SHAPES = [
    ffn.ffn_shape(k) for k in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "gpt3-175b")
]
SHAPES += [ffn.FFNShape(8192, 28672, "gelu")]


def test_shapes_from_configs():
    s = ffn.ffn_shape("llama-3.1-70b")
    assert (s.d_model, s.d_ff, s.kind, s.matrices) == (8192, 28672, "swiglu", 3)  # HF config.json
    assert s.weight_params == 3 * 8192 * 28672
    g = ffn.ffn_shape("gpt3-175b")
    assert (g.d_model, g.d_ff, g.matrices) == (
        12288,
        49152,
        2,
    )  # GPT-3 paper Table 2.1: d_ff = 4 d_model
    # second method: lib.registry.models counts the same FFN parameters per layer
    assert model("llama-3.1-70b").mlp_params_per_layer() == s.weight_params
    assert ffn.ffn_shape("mixtral-8x7b").d_ff == 14336  # one expert


@given(st.sampled_from(SHAPES), st.integers(1, 8192), st.sampled_from([1, 2, 4, 8]))
def test_flops_and_weight_bytes_equal_the_sum_of_the_gemms(shape, tokens, tp):
    # second method: every GEMM of the sharded FFN through lib.perf.roofline.gemm_flops_bytes
    f_n = shape.d_ff // tp
    gemms = [(tokens, f_n, shape.d_model)] * (shape.matrices - 1) + [(tokens, shape.d_model, f_n)]
    flops = sum(roofline.gemm_flops_bytes(*g)[0] for g in gemms)
    weights = 2 * sum(n * k for _, n, k in gemms)
    cost = ffn.ffn_cost(shape, "h100-sxm", tokens, tp)
    if shape.d_ff % tp == 0:
        assert math.isclose(cost.flops, flops, rel_tol=1e-12)
        assert math.isclose(cost.weight_bytes, weights, rel_tol=1e-12)


def test_decode_intensity_is_about_T_flop_per_byte():
    # the reference answer's rule: at small T a BF16 FFN does ~T FLOPs per byte
    shape = ffn.ffn_shape("llama-3.1-70b")
    for t in (1, 4, 16):
        assert math.isclose(ffn.ffn_cost(shape, "h100-sxm", t).intensity, t, rel_tol=0.01)


def test_activation_bytes_fused_and_unfused():
    s = ffn.FFNShape(4096, 14336, "swiglu")
    assert ffn.activation_elements_per_token(s, 1, fused=True) == 2 * 4096 + 2 * 14336
    assert ffn.activation_elements_per_token(s, 2, fused=False) == 2 * 4096 + 6 * 14336 / 2
    assert (
        ffn.activation_elements_per_token(ffn.FFNShape(4096, 16384, "gelu"), 1, fused=False)
        == 2 * 4096 + 4 * 16384
    )


def test_tp_halves_compute_and_weights_but_not_activation_input():
    s = SHAPES[1]
    one, two = ffn.ffn_cost(s, "h100-sxm", 512, 1), ffn.ffn_cost(s, "h100-sxm", 512, 2)
    assert math.isclose(two.compute_s * 2, one.compute_s, rel_tol=1e-12)
    assert math.isclose(two.weight_bytes * 2, one.weight_bytes, rel_tol=1e-12)
    assert (
        two.activation_bytes * 2 > one.activation_bytes
    )  # the d-wide input and output are replicated


def test_comm_is_ring_allreduce_of_the_output_priced_by_collectives():
    s = SHAPES[1]
    c = ffn.ffn_cost(s, "h100-sxm", 64, 8)
    eff = assumptions.value("collectives.nvlink.bus_efficiency")
    assert math.isclose(c.comm_bytes, 2 * 7 / 8 * 64 * 8192 * 2, rel_tol=1e-12)
    assert math.isclose(c.comm_bandwidth_s, c.comm_bytes / (450e9 * eff), rel_tol=1e-12)
    assert math.isclose(c.comm_latency_s, 15.0e-6, rel_tol=1e-12)  # NCCL ring/LL model, 8 ranks
    one = collectives.collective("all_reduce", 64 * 8192 * 2, 8, "h100-sxm")
    assert math.isclose(c.comm_s, one.time_s, rel_tol=1e-12)  # one collective model, no second formula
    assert c.link == "NVLink"
    assert ffn.ffn_cost(s, "h100-sxm", 64, 16).link == "NVLink + network"  # past one 8-GPU node
    assert ffn.ffn_cost(s, "mi300x", 64, 8).link == "Infinity Fabric"
    assert ffn.ffn_cost(SHAPES[0], "l4", 64, 2).link == "PCIe"


def test_sixteen_gpus_are_hierarchical_not_a_flat_ring_through_one_nic():
    # Finding (issue 9): a flat 16-GPU ring at one 50 GB/s NIC per GPU made "the network binds from TP4";
    # hierarchical with 8 NICs per node the bytes cost about 1/6 of that.
    s = SHAPES[1]
    c = ffn.ffn_cost(s, "h100-sxm", 4096, 16)
    net_eff = assumptions.value("collectives.network.bus_efficiency")
    flat_one_nic = 2 * 15 / 16 * 4096 * 8192 * 2 / (50e9 * net_eff)
    assert 1 / 8 < c.comm_bandwidth_s / flat_one_nic < 1 / 4
    # and the network binds large T from 16 GPUs, not 4: inside a node NVLink never binds this FFN
    assert ffn.comm_binds_from_tp(s, "h100-sxm") == 16
    assert all(ffn.comm_compute_ratio(s, "h100-sxm", n) < 1 for n in range(2, 9))


def _bisect(f, lo, hi):
    """Root of an increasing-sign-change f on a log scale."""
    for _ in range(300):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return lo


@given(
    st.sampled_from(SHAPES),
    st.sampled_from([1, 2, 4, 8, 16, 64]),
    st.booleans(),
    st.sampled_from(["h100-sxm", "b200", "a100-sxm"]),
)
def test_compute_hbm_boundary_against_bisection(shape, tp, fused, chip):
    t_star = ffn.compute_hbm_boundary_tokens(shape, chip, tp, fused=fused)
    if not math.isfinite(t_star):
        return

    def diff(t):
        c = ffn.ffn_cost(shape, chip, t, tp, fused=fused)
        return c.compute_s - c.hbm_s

    assert math.isclose(t_star, _bisect(diff, 1e-3, 1e9), rel_tol=1e-6)


def test_compute_hbm_boundary_is_about_the_ridge_without_activations():
    # T* -> R b / 2 = 295 for BF16 on H100 (scaling-book ridge 295) as d, f grow
    t = ffn.compute_hbm_boundary_tokens(ffn.FFNShape(65536, 262144), "h100-sxm", 1)
    assert math.isclose(t, 989e12 / 3.35e12, rel_tol=0.02)


@given(st.sampled_from(SHAPES), st.sampled_from([2, 4, 8, 16, 32]), st.sampled_from(["h100-sxm", "mi300x", "l40s"]))
def test_compute_comm_boundary_against_bisection(shape, tp, chip):
    if tp > 8 and chip == "l40s":
        return  # no network figure for a PCIe card
    t_star = ffn.compute_comm_boundary_tokens(shape, chip, tp)
    if not math.isfinite(t_star):
        c = ffn.ffn_cost(shape, chip, 1e7, tp)
        assert c.comm_s > c.compute_s  # comm above compute everywhere
        return

    def diff(t):
        c = ffn.ffn_cost(shape, chip, t, tp)
        return c.compute_s - c.comm_s

    assert math.isclose(t_star, _bisect(diff, 1e-3, 1e9), rel_tol=1e-6)


@given(st.sampled_from(SHAPES), st.sampled_from([2, 4, 8, 16]))
def test_hbm_comm_and_latency_bandwidth_boundaries(shape, tp):
    t_hc = ffn.hbm_comm_boundary_tokens(shape, "h100-sxm", tp)
    if math.isfinite(t_hc) and t_hc > 1e-3:
        c = ffn.ffn_cost(shape, "h100-sxm", t_hc, tp)
        assert math.isclose(c.hbm_s, c.comm_s, rel_tol=1e-9)
    t_lb = ffn.comm_latency_bandwidth_tokens(shape, "h100-sxm", tp)
    c = ffn.ffn_cost(shape, "h100-sxm", t_lb, tp)
    assert math.isclose(c.comm_latency_s, c.comm_bandwidth_s, rel_tol=1e-9)


def test_large_T_comm_to_compute_ratio_and_critical_degree():
    s = ffn.ffn_shape("llama-3.1-70b")
    eff = assumptions.value("collectives.nvlink.bus_efficiency")
    # (n - 1) b P / (k f B e) = 7 x 2 x 989e12 / (3 x 28672 x 450e9 x e) on NVLink
    assert math.isclose(
        ffn.comm_compute_ratio(s, "h100-sxm", 8),
        7 * 2 * 989e12 / (3 * 28672 * 450e9 * eff),
        rel_tol=1e-9,
    )
    c = ffn.ffn_cost(s, "h100-sxm", 1e9, 8)
    assert math.isclose(c.comm_s / c.compute_s, ffn.comm_compute_ratio(s, "h100-sxm", 8), rel_tol=1e-3)
    assert math.isclose(
        ffn.comm_binds_tp(s, "h100-sxm"), 1 + 3 * 28672 * 450e9 * eff / (2 * 989e12), rel_tol=1e-12
    )
    # Infinity Fabric is a full mesh: n - 1 links for n GPUs, so the ratio is flat in n
    r2, r8 = (ffn.comm_compute_ratio(s, "mi300x", n) for n in (2, 8))
    assert r8 == pytest.approx(r2, rel=1e-12)
    assert ffn.comm_binds_tp(s, "mi300x") in (1.0, math.inf)


def test_regime_map_corners():
    s = ffn.ffn_shape("llama-3.1-70b")
    grid = ffn.regime_grid(s, "h100-sxm", [1, 65536], [1, 8, 16])
    assert grid[0] == ["HBM", "compute"]  # decode reads weights; big prefill is matmul
    assert grid[1] == ["HBM", "compute"]  # TP8 inside a node: NVLink never binds
    assert grid[2] == ["comm latency", "comm bandwidth"]  # TP16 across nodes: the network binds


@given(st.sampled_from(SHAPES), st.integers(1, 65536), st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_bound_is_the_largest_cost_and_serial_exceeds_overlapped(shape, tokens, tp):
    c = ffn.ffn_cost(shape, "h100-sxm", tokens, tp)
    top = max(c.compute_s, c.hbm_s, c.comm_s)
    assert {"compute": c.compute_s, "HBM": c.hbm_s}.get(c.bound, c.comm_s) == top
    assert c.serial_s >= c.overlapped_s == top
    grid = ffn.regime_grid(shape, "h100-sxm", [tokens], [tp])
    assert grid[0][0] == c.bound  # vectorized map agrees with the scalar cost


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ffn.FFNShape(0, 10), "d_model"),
        (lambda: ffn.FFNShape(10, 10, "relu"), "kind must be"),
        (lambda: ffn.ffn_cost(SHAPES[0], "h100-sxm", 0), "tokens must be"),
        (lambda: ffn.ffn_cost(SHAPES[0], "h100-sxm", 1, 0), "tp must be"),
        (lambda: ffn.ffn_cost(SHAPES[0], "h100-sxm", 1, 2, "infiniband"), "link must be"),
        (lambda: ffn.ffn_cost(SHAPES[0], "h100-sxm", 1, 2, "nvlink"), "link must be"),
        (lambda: ffn.ffn_cost(SHAPES[0], "h100-sxm", 1, 12), "whole nodes"),
        (lambda: ffn.ffn_cost(SHAPES[0], "l4", 1, 16), "no network"),
        (lambda: ffn.ffn_cost("llama-3.1-8b", "h100-sxm", 1), "FFNShape"),
        (lambda: ffn.ffn_cost(SHAPES[0], "a100-sxm", 1, compute_dtype="fp8"), "no 'fp8'"),
    ],
)
def test_bad_inputs_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_regime_plot_returns_a_figure():
    assert ffn.plot_regime_map(SHAPES[1], "h100-sxm", point=(1, 8)).axes


def test_decode_crossover_is_not_the_optimum():
    # Finding (issue 9): "adding GPUs makes decode slower past n = 16.6" confused the crossover of
    # a / n and b + c n with the minimum of a / n + b + c n, which sits at sqrt(a / c).
    s = ffn.ffn_shape("llama-3.1-70b")
    read = 3 * 8192 * 28672 * 2 / 3.35e12  # a: the FFN's weight read on one GPU

    def alpha(n):  # NCCL ring/LL model: 6.6 us + 2 (n - 1) 0.6 us (data/assumptions.yaml)
        return (6.6 + 2 * (n - 1) * 0.6) * 1e-6

    n_cross = ffn.decode_comm_crossover_tp(s, "h100-sxm")
    assert math.isclose(n_cross, _bisect(lambda n: alpha(n) - read / n, 1e-3, 1e6), rel_tol=1e-6)
    assert n_cross == pytest.approx(16.6, abs=0.05)
    n_opt = ffn.decode_optimal_tp(s, "h100-sxm")
    assert n_opt == pytest.approx(math.sqrt(read / 1.2e-6), rel=1e-9)  # c = 2 x 0.6 us
    brute = min((1 + i / 1000 for i in range(60000)), key=lambda n: read / n + alpha(n))
    assert abs(brute - n_opt) < 2e-3
    assert n_opt > n_cross  # time still falls past the crossover
    assert read / (n_cross + 1) + alpha(n_cross + 1) < read / n_cross + alpha(n_cross)
    # priced for real (hierarchical past the node, network latency per call), the best group is one node
    assert ffn.decode_best_tp(s, "h100-sxm") == 8


def test_group_sizes_are_node_aligned_past_one_node():
    assert ffn.group_sizes(32) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32]
