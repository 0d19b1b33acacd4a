"""lib.attention.utilization: the exponential-vs-matmul ceiling against the FA2/FA3 papers' figures."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.attention import utilization as ut
from lib.registry.hardware import gpu

SFU_GPUS = ["a100-sxm", "h100-sxm", "h100-pcie", "h200"]


def test_h100_ratio_is_the_fa3_papers_half():
    # FA3 paper (arXiv:2407.08608) sec. 3.1: 989 TFLOPS matmul vs 3.9 TFLOPS exp (256x), 512x more
    # matmul FLOPs than exponentials at head dim 128 -> the exponential takes 50% of the matmul time.
    a = ut.attention_utilization("h100-sxm", "bf16", 128)
    assert math.isclose(a.mma_flops_per_sm_clock / a.sfu_ops_per_sm_clock, 256, rel_tol=0.01)
    assert a.matmul_flops_per_score == 512
    assert math.isclose(a.exp_to_matmul_ratio, 0.5, rel_tol=0.01)
    assert math.isclose(1 / a.exp_s, 3.9e12, rel_tol=0.01)


def test_fp8_doubles_the_ratio_and_the_backward_dilutes_it():
    fwd = ut.exp_to_matmul_ratio("h100-sxm", "bf16", 128)
    assert math.isclose(ut.exp_to_matmul_ratio("h100-sxm", "fp8", 128), 2 * fwd, rel_tol=0.01)  # 1979 vs 989 TFLOPS
    # backward: 5 matmuls instead of 2 for one recomputed exponential per score (FA3 paper sec. 4.1: 2.5x)
    assert ut.matmul_flops_per_score(128, "backward") == 2.5 * ut.matmul_flops_per_score(128, "forward")
    assert math.isclose(ut.exp_to_matmul_ratio("h100-sxm", "bf16", 128, "backward"), fwd / 2.5, rel_tol=1e-9)


def test_flops_per_score_match_a_counted_numpy_tile():
    # oracle: numpy's own contraction count of QK^T and PV on a 64 x 48 tile, over its score count
    rng = np.random.default_rng(0)
    br, bc, d = 64, 48, 96
    q, k, v = rng.standard_normal((br, d)), rng.standard_normal((bc, d)), rng.standard_normal((bc, d))
    s = q @ k.T

    def counted(spec, x, y):
        return float(np.einsum_path(spec, x, y, optimize="optimal")[1].split("Naive FLOP count:")[1].split()[0])

    flops = counted("ik,jk->ij", q, k) + counted("ij,jk->ik", s, v)
    assert math.isclose(flops / s.size, ut.matmul_flops_per_score(d), rel_tol=1e-3)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(SFU_GPUS), d=st.sampled_from([32, 64, 96, 128, 256]),
       eff=st.floats(0.3, 1.0), alu=st.floats(0.0, 16.0), pass_=st.sampled_from(ut.PASSES))
def test_serialized_closed_form_and_overlap_bounds(key, d, eff, alu, pass_):
    ser = ut.attention_utilization(key, "bf16", d, pass_=pass_, mma_efficiency=eff, alu_ops_per_score=alu)
    ovl = ut.attention_utilization(key, "bf16", d, pass_=pass_, mma_efficiency=eff, alu_ops_per_score=alu,
                                   overlap=True)
    alu_ratio = ser.alu_s / ser.mma_s
    assert math.isclose(ser.utilization, 1 / (1 / eff + ser.exp_to_matmul_ratio + alu_ratio), rel_tol=1e-9)
    assert ser.utilization <= ovl.utilization <= eff + 1e-12
    assert math.isclose(ovl.utilization, min(eff, 1 / (ser.exp_to_matmul_ratio + alu_ratio)), rel_tol=1e-9)
    for a in (ser, ovl):
        parts = a.breakdown()
        assert math.isclose(sum(parts.values()), 1.0, rel_tol=1e-9)
        assert math.isclose(parts["matmul"], a.utilization, rel_tol=1e-12)
        assert all(v >= -1e-12 for v in parts.values())


def test_published_throughputs_sit_under_their_ceilings():
    h100 = gpu("h100-sxm")
    peak = h100.peak_flops("bf16")
    fa2_cap = ut.attention_utilization(h100, mma_efficiency=2 / 3).utilization  # mma.sync, serialized
    fa3_cap = ut.attention_utilization(h100, overlap=True).utilization
    assert ut.PUBLISHED_H100["fa2_fwd"][0] * 1e12 / peak < fa2_cap
    assert ut.PUBLISHED_H100["fa3_best"][0] * 1e12 / peak < fa3_cap
    fp8_cap = ut.attention_utilization(h100, "fp8", overlap=True).utilization
    assert ut.PUBLISHED_H100["fa3_fp8"][0] * 1e12 / h100.peak_flops("fp8") < fp8_cap
    # FA2 paper abstract: 50-73% of peak on A100, where mma.sync is native (eff 1) and r = 0.25
    assert 0.73 < ut.attention_utilization("a100-sxm").utilization


def test_a_gpu_without_the_rates_is_refused_unless_they_are_given():
    with pytest.raises(ValueError, match="sfu_ops_per_sm_clock"):
        ut.attention_utilization("b200")
    a = ut.attention_utilization("b200", sfu_ops_per_sm_clock=16, clock_hz=1.9e9)
    assert a.exp_to_matmul_ratio > 0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"pass_": "sideways"}, "pass_ must be one of"),
    ({"mma_efficiency": 0.0}, "mma_efficiency"),
    ({"alu_ops_per_score": -1.0}, "alu_ops_per_score"),
    ({"dtype": "fp4"}, "no 'fp4'"),
    ({"overlap": "yes"}, "overlap must be True or False"),
    ({"head_dim": 0}, "head_dim"),
])
def test_bad_inputs_say_what_is_allowed(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ut.attention_utilization("h100-sxm", **kwargs)


def test_schedules_order_and_the_mma_sync_penalty_only_on_hopper():
    h = ut.fa_schedules("h100-sxm")
    assert h["fa2"].utilization < h["wgmma"].utilization < h["fa3"].utilization
    assert math.isclose(h["fa2"].mma_efficiency, 2 / 3) and h["wgmma"].mma_efficiency == 1.0
    a = ut.fa_schedules("a100-sxm")
    assert a["fa2"].mma_efficiency == 1.0  # mma.sync is Ampere's own instruction
    assert ut.mma_sync_penalty_applies("h200") and not ut.mma_sync_penalty_applies("a100-sxm")
