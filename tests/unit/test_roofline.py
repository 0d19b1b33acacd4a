"""lib.roofline, lib.comms and lib.moe: closed forms against published values and second methods."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib import comms, moe, roofline
from lib.hardware import gpu, gpu_names
from lib.models import model


def test_decode_floor_70b_tp8_matches_published_params():
    # 70.6B parameters (HF card) x 2 B / (8 x 3.35 TB/s, NVIDIA H100 SXM) = 5.27 ms
    t = roofline.decode_step("llama-3.1-70b", "h100-sxm", tp=8).memory_s
    assert math.isclose(t, 70.6e9 * 2 / (8 * 3.35e12), rel_tol=0.005)


def test_decode_is_memory_bound_and_prefill_compute_bound():
    assert roofline.decode_step("llama-3.1-70b", "h100-sxm", tp=8).bound == "memory"
    assert roofline.prefill("llama-3.1-70b", "h100-sxm", 4096, tp=8).bound == "compute"


def test_roofline_time_is_the_max_of_two_terms():
    t = roofline.roofline_time(989e12, 3.35e12, "h100-sxm", "bf16")
    assert math.isclose(t.compute_s, 1.0) and math.isclose(t.memory_s, 1.0)
    assert t.time_s == max(t.compute_s, t.memory_s)


@given(st.sampled_from(gpu_names()), st.floats(0.01, 1e5))
def test_attainable_never_exceeds_either_roof(key, intensity):
    g = gpu(key)
    perf = roofline.attainable_flops(intensity, g, "bf16")
    assert perf <= g.peak_flops("bf16") * (1 + 1e-12)
    assert perf <= intensity * g.memory_bandwidth * (1 + 1e-12)


@given(st.integers(1, 4096), st.integers(1, 8192), st.integers(1, 8192))
def test_gemm_bytes_by_brute_force(m, n, k):
    flops, nbytes = roofline.gemm_flops_bytes(m, n, k, "bf16")
    assert flops == 2 * m * n * k
    assert nbytes == 2 * (m * k + k * n + m * n)


def test_gemm_crossover_m_against_bisection():
    n, k = 28672, 8192
    m_star = roofline.gemm_crossover_m(n, k, "h100-sxm", "bf16")
    lo, hi = 1.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        f, b = 2 * mid * n * k, 2 * (mid * k + k * n + mid * n)
        lo, hi = (mid, hi) if f / 989e12 < b / 3.35e12 else (lo, mid)
    assert math.isclose(m_star, lo, rel_tol=1e-6)


def test_gemm_crossover_unreachable_raises():
    with pytest.raises(ValueError, match="never reaches"):
        roofline.gemm_crossover_m(16, 16, "h100-sxm")


def test_prefill_crossover_is_about_the_ridge_for_bf16():
    t = roofline.prefill_crossover_tokens("llama-3.1-70b", "h100-sxm")
    assert math.isclose(t, 295, rel_tol=0.03)  # scaling-book ridge 295 x N_total / N_matmul


def test_kv_shard_fraction_replicates_past_kv_heads():
    assert roofline.kv_shard_fraction("llama-3.1-70b", 8) == 1 / 8
    assert roofline.kv_shard_fraction("llama-3.1-70b", 16) == 1 / 8  # 8 KV heads replicated twice
    assert roofline.kv_shard_fraction("deepseek-v3", 8) == 1.0  # MLA latent on every rank


def test_tp_must_divide_heads():
    with pytest.raises(ValueError, match="must divide the 64 attention heads"):
        roofline.decode_step("llama-3.1-70b", "h100-sxm", tp=3)


def test_breakdown_weight_bucket_is_the_floor_and_allreduce_counts_calls():
    parts = roofline.decode_step_breakdown("llama-3.1-70b", "h100-sxm", tp=8, allreduce_latency_s=20e-6)
    assert math.isclose(parts["weights"], roofline.decode_step("llama-3.1-70b", "h100-sxm", 8).memory_s)
    ring = 2 * 7 / 8 * 8192 * 2 / 450e9
    assert math.isclose(parts["allreduce"], 160 * (20e-6 + ring), rel_tol=1e-12)


def test_breakdown_rejects_tp_without_links():
    with pytest.raises(ValueError, match="no NVLink"):
        roofline.decode_step_breakdown("llama-3.1-8b", "l4", tp=2)


def test_ring_allreduce_alpha_beta():
    assert comms.ring_allreduce_time_s(1e9, 1, 450e9, 1e-5) == 0.0
    t = comms.ring_allreduce_time_s(1e9, 8, 450e9, 1e-5)
    assert math.isclose(t, 1e-5 + 2 * 7 / 8 * 1e9 / 450e9)
    with pytest.raises(ValueError, match="link_bandwidth"):
        comms.ring_allreduce_time_s(1e6, 2, 0)


@pytest.mark.parametrize(("e", "k", "b"), [(8, 2, 1), (8, 2, 4), (8, 2, 16), (256, 8, 32), (64, 6, 8)])
def test_expected_experts_closed_form_matches_monte_carlo(e, k, b):
    sim = moe.simulate_experts_touched(e, k, b, trials=4000, seed=1)
    closed = moe.expected_experts_touched(e, k, b)
    stderr = sim.std(ddof=1) / math.sqrt(len(sim)) + 1e-9
    assert abs(sim.mean() - closed) < 5 * stderr + 1e-9


def test_expected_experts_edges():
    assert moe.expected_experts_touched(8, 2, 1) == 2
    assert moe.expected_experts_touched(8, 2, 0) == 0
    assert moe.expected_experts_touched(8, 8, 3) == 8
    with pytest.raises(ValueError, match="experts_per_token"):
        moe.expected_experts_touched(8, 9, 1)


def test_moe_weight_read_grows_with_batch_to_the_total():
    m = model("mixtral-8x7b")
    one = roofline.weight_bytes_read_per_step(m, 1)
    assert math.isclose(one, m.params_active * 2, rel_tol=1e-9)
    big = roofline.weight_bytes_read_per_step(m, 10_000)
    assert math.isclose(big, m.weight_bytes(), rel_tol=1e-6)
