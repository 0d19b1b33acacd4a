"""lib.perf.throughput: throughput against batch, read off the one decode-step model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf import roofline
from lib.perf import throughput as tput
from lib.perf.deployment import Deployment
from lib.perf.step import decode_step, step_assumptions

DEP = Deployment("llama-3.1-70b", "h100-sxm", tp=8)


def test_throughput_is_the_step_models():
    # no second step model: every number is decode_step's
    for b in (1, 7, 300):
        assert tput.step_s(DEP, b, 4096) == decode_step(DEP, b, 4096).total_s
        assert tput.tokens_per_s(DEP, b, 4096) == decode_step(DEP, b, 4096).tokens_per_s


def test_regression_gemm_flops_overlap_the_weight_read():
    # issue 9: the old line added each GEMM's FLOP time to its weight read. On the modelled step a
    # batch far below the ridge pays no compute beyond the read, and the per-sequence cost at large
    # batch is the KV read plus the GEMM FLOPs (which only then exceed the reads), not their sum
    # at every batch.
    assert decode_step(DEP, 8, 4096)["compute_excess"] == 0.0
    per = tput.per_sequence_buckets(DEP, 4096)
    kv_floor = 4096 * 327_680 / 8 / 3.35e12  # published: 327,680 B/token (80 x 8 x 128 x 2 x 2 B), H100 3.35 TB/s
    assert math.isclose(per["kv_cache"], kv_floor, rel_tol=1e-9)
    assert per["weights"] == pytest.approx(0.0, abs=1e-15)  # the weight read is paid once per step
    # the knee on the modelled step is not the old no-overlap line's 75 sequences
    assert 80 < tput.knee_batch(DEP, 4096) < 110


def test_ceiling_is_the_large_batch_slope():
    c = tput.per_sequence_s(DEP, 4096)
    b = 1 << 14
    slope = (tput.step_s(DEP, 2 * b, 4096) - tput.step_s(DEP, b, 4096)) / b
    assert math.isclose(c, slope, rel_tol=1e-6)
    assert math.isclose(tput.throughput_ceiling(DEP, 4096), 1 / c, rel_tol=1e-12)
    # and no batch passes it
    for b in (1, 100, 1000, 100_000):
        assert tput.tokens_per_s(DEP, b, 4096) < tput.throughput_ceiling(DEP, 4096)


@settings(max_examples=10, deadline=None)
@given(st.floats(0.05, 0.95))
def test_batch_for_fraction_against_a_scan(f):
    dep = Deployment("llama-3.1-8b", "l40s")
    b_f = tput.batch_for_fraction(dep, 1024, f)
    target = f * tput.throughput_ceiling(dep, 1024)
    if b_f < 1:
        assert tput.tokens_per_s(dep, 1, 1024) >= target
        return
    lo = math.floor(b_f)
    assert tput.tokens_per_s(dep, lo, 1024) <= target * (1 + 1e-12)
    assert tput.tokens_per_s(dep, lo + 1, 1024) >= target * (1 - 1e-12)
    # interpolated step at b_f gives exactly the target
    assert math.isclose(b_f / tput.step_s_at(dep, b_f, 1024), target, rel_tol=1e-9)


def test_knee_is_half_the_ceiling_and_a_crossing():
    k = tput.knee_batch(DEP, 4096)
    assert math.isclose(k / tput.step_s_at(DEP, k, 4096), 0.5 * tput.throughput_ceiling(DEP, 4096), rel_tol=1e-9)
    assert "not an optimum" in tput.knee_batch.__doc__


def test_batch_for_step_time_inverts_the_step():
    b = tput.batch_for_step_time(DEP, 4096, 0.05)
    assert math.isclose(tput.step_s_at(DEP, b, 4096), 0.05, rel_tol=1e-9)
    with pytest.raises(ValueError, match="below the batch-1 step"):
        tput.batch_for_step_time(DEP, 4096, 1e-3)


def test_batch_for_tokens_per_s_beyond_the_ceiling_is_infinite():
    assert tput.batch_for_tokens_per_s(DEP, 4096, 2 * tput.throughput_ceiling(DEP, 4096)) == math.inf


def test_kv_ceiling_is_the_memory_budget_with_its_fraction():
    # issue 9: capacity from memory_budget on driver-visible memory, not datasheet GB x 0.9 - weights
    b = tput.kv_batch_ceiling(DEP, 4096)
    assert b == DEP.budget.max_concurrency(4096)
    naive = (80e9 * 0.9 - 141.1e9 / 8) / (4096 * 327_680 / 8)  # the old formula: 324
    assert b != pytest.approx(naive, rel=0.01)
    per_seq = tput.kv_bytes_per_sequence_per_gpu(DEP, 4096)
    assert math.isclose(per_seq, 4096 * 327_680 / 8, rel_tol=1e-12)
    assert abs(DEP.budget.kv_cache_bytes / per_seq - b) <= DEP.block_size / 4096
    assert b != int(b)  # kept with its fraction


def test_compute_bound_batch_is_where_the_gemms_flip():
    b = tput.compute_bound_batch(DEP, 4096)
    assert decode_step(DEP, int(b), 4096)["compute_excess"] > 0
    assert decode_step(DEP, int(b) - 1, 4096)["compute_excess"] == 0
    # near the ridge of the achieved rates: P eta_P / (W eta_W) FLOP/byte over 2 FLOPs per weight byte at BF16
    a = step_assumptions()
    ridge = 989e12 * a.matmul_efficiency / (3.35e12 * a.gemv_efficiency)
    assert 0.8 * ridge < b < 1.2 * ridge


def test_step_never_beats_its_roofline_bound():
    for b in (1, 64, 1024):
        bound = roofline.decode_step("llama-3.1-70b", "h100-sxm", 8, b, 4096)
        assert tput.step_s(DEP, b, 4096) >= bound.time_s
    assert tput.throughput_ceiling(DEP, 4096) < tput.tensor_core_ceiling_tokens_per_s(DEP, 4096)


def test_tensor_core_ceiling():
    dep = Deployment("llama-3.1-8b", "h100-sxm")
    assert math.isclose(tput.tensor_core_ceiling_tokens_per_s(dep, 0),
                        989e12 / dep.mdl.flops_per_token(0), rel_tol=1e-3)


def test_smallest_tp_that_fits():
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
    assert tput.smallest_tp_that_fits(dep) == 2  # 141 GB of BF16 weights: one 85 GB card cannot hold them
    big = 200 * 4096 * 327_680  # 200 sequences of 4k tokens
    tp = tput.smallest_tp_that_fits(dep, big)
    assert Deployment("llama-3.1-70b", "h100-sxm", tp=tp).budget.max_concurrency(4096) >= 200
    with pytest.raises(ValueError, match="does not fit"):
        tput.smallest_tp_that_fits(dep, 1e15, max_tp=8)


def test_validation_messages():
    with pytest.raises(ValueError, match="Deployment"):
        tput.throughput_ceiling("llama-3.1-70b", 4096)
    with pytest.raises(ValueError, match="fraction_of_ceiling"):
        tput.batch_for_fraction(DEP, 4096, 1.0)
    with pytest.raises(ValueError, match="context"):
        tput.kv_batch_ceiling(DEP, 0)


def test_throughput_knee_view_uses_the_step_model():
    from lib.explorers.roofline_batch import throughput_knee

    v = throughput_knee("llama-3.1-70b", "h100-sxm", 8, "bf16", "bf16", 4096, 64)
    assert math.isclose(v.values["knee"], tput.knee_batch(DEP, 4096), rel_tol=1e-12)
    assert math.isclose(v.values["ceiling"], tput.throughput_ceiling(DEP, 4096), rel_tol=1e-12)
    assert v.values["b_max"] == DEP.budget.max_concurrency(4096)


def test_smallest_fitting_deployment():
    from lib.perf.throughput import smallest_fitting_deployment

    # 70B in bf16 (141 GB of weights) needs two H100s (about 85 GB visible each)
    assert smallest_fitting_deployment("llama-3.1-70b", "h100-sxm").tp == 2
    assert smallest_fitting_deployment("llama-3.1-8b", "l40s").tp == 1
    assert smallest_fitting_deployment("llama-3.1-405b", "h200").tp == 8
    with pytest.raises(ValueError, match="does not fit on 8 x l40s"):
        smallest_fitting_deployment("llama-3.1-405b", "l40s")
