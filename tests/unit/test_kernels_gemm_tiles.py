"""lib.kernels.gemm_tiles: the tile's intensity, swizzle row, register and shared-memory budgets and
pipeline against brute force and an event simulation; the model's verdicts against the H200 Triton
measurement; the SGEMM steps' traffic against a direct bank and sector count and the H200 SGEMM
measurement; the loop-nest grader against its drafts; the two explorers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.book import widgets
from lib.kernels import gemm_tiles as gt
from lib.kernels import tiled_gemm as tg
from lib.registry.hardware import gpu, gpu_names
from lib.registry.measured import measured

NO_CLOCK = [g for g in gpu_names() if gpu(g).compute_capability and gpu(g).tensor_clock_hz is None]

# ---- I036: the tile ---------------------------------------------------------------------------------


def test_intensity_examples_and_brute_force():
    assert gt.tile_intensity(128, 128, "bf16") == 64
    assert gt.tile_intensity(256, 128, "bf16") == pytest.approx(256 / 3)
    assert gt.tile_intensity(64, 64, "bf16") == 32
    assert gt.tile_intensity(128, 128, "fp8") == 128
    # count a K loop: elements loaded and FLOPs, for any bk
    for tm, tn, bk in ((128, 256, 64), (64, 32, 16), (256, 256, 32)):
        loaded = flops = 0
        for _k0 in range(0, 5 * bk, bk):
            loaded += (tm + tn) * bk
            flops += 2 * tm * tn * bk
        assert gt.tile_intensity(tm, tn, "bf16") == pytest.approx(flops / (2 * loaded))


@given(st.sampled_from(gt.TILE_SIDES), st.sampled_from(gt.TILE_SIDES), st.sampled_from(gt.TILE_SIDES))
def test_intensity_is_symmetric_and_grows_with_each_side(a, b, c):
    assert gt.tile_intensity(a, b) == gt.tile_intensity(b, a)
    if c > b:
        assert gt.tile_intensity(a, c) > gt.tile_intensity(a, b)
    assert gt.tile_intensity(a, a) == pytest.approx(a / 2)  # square bf16: t / e
    assert gt.square_side(gt.tile_intensity(a, a), "bf16") == pytest.approx(a)


def test_ridge_points():
    # H200: 989 TFLOP/s dense bf16 over the 9.77 TB/s L2 measurement (kernels_l2.l2_read_bandwidth_tbps.h200)
    assert gt.l2_ridge_point("h200", "bf16") == pytest.approx(989 / 9.77)
    assert gt.l2_ridge_point("h200", "bf16", 0.5) == pytest.approx(0.5 * 989 / 9.77)
    # 132 SMs x 128 B x 1.83 GHz; 4,096 dense FLOP per clock per SM over 128 B = 32
    assert gt.smem_bandwidth("h100-sxm") == pytest.approx(132 * 128 * 1.83e9)
    assert gt.smem_ridge_point("h100-sxm", "bf16") == pytest.approx(989.0e12 / (132 * 128 * 1.83e9))
    assert gt.smem_ridge_point("a100-sxm", "bf16") == pytest.approx(16.0, rel=1e-3)  # 2,048 FLOP/clk/SM / 128 B
    for g in NO_CLOCK:
        with pytest.raises(ValueError, match="no SM clock"):
            gt.smem_bandwidth(g)
    with pytest.raises(ValueError, match="fp8"):
        gt.l2_ridge_point("a100-sxm", "fp8")


def test_swizzle_row_sets_bk():
    """CUTLASS's Hopper examples: 48_hopper_warp_specialized_gemm (fp32 on TF32 tensor cores, TileShape
    128x128x32) and 54_hopper_fp8_warp_specialized_gemm (TileShape 64x128x128): bk = 128 B / e."""
    assert gt.swizzle_row_bytes("h100-sxm") == 128
    assert {d: gt.swizzle_bk(d) for d in ("tf32", "bf16", "fp16", "fp8")} == {"tf32": 32, "bf16": 64, "fp16": 64,
                                                                              "fp8": 128}
    with pytest.raises(ValueError):
        gt.swizzle_bk("bf16", "mi300x")  # no CUDA bank table for AMD


def test_budgets():
    assert gt.stage_bytes(128, 128, 64, "bf16") == 32 * 1024
    assert gt.smem_bytes(256, 128, 64, 3, "bf16") == 144 * 1024
    assert gt.max_stages("h100-sxm", 128, 128, 64) == 7  # 227 KiB // 32 KiB
    assert gt.max_stages("h100-sxm", 256, 256, 64, reserved_bytes=64 * 1024) == 2
    assert gt.accumulator_registers(256, 128, 256) == 128
    assert gt.accumulator_registers(256, 256, 256) == 256
    assert gt.accumulator_registers(100, 3, 256) == 2  # ceil
    assert gt.overhead_registers() == 64 and gt.overhead_registers(10) == 10


@settings(max_examples=120, deadline=None)
@given(st.floats(1e-8, 1e-5), st.floats(0, 1e-5), st.floats(0, 2e-6), st.integers(1, 8))
def test_pipeline_closed_form_matches_the_event_simulation(c, b, lat, s):
    closed = gt.pipeline_step_s(c, b, lat, s)
    assert gt.simulate_pipeline(c, b, lat, s, steps=600) == pytest.approx(closed, rel=1e-6)
    assert closed >= max(c, b)
    need = gt.stages_to_hide(c, b, lat)
    assert gt.pipeline_step_s(c, b, lat, need) == pytest.approx(max(c, b))
    if need > 1:
        assert gt.pipeline_step_s(c, b, lat, need - 1) > max(c, b) * (1 + 5e-10)


def test_plan_verdicts():
    p = gt.tile_plan("h200", 256, 128, "bf16", stages=3, warps=8)
    assert (p.bk, p.accumulator_per_thread, p.register_limit, p.verdict, p.bound) == (64, 128, 255, "runs", "compute")
    assert p.accumulator_share_of_sm == 0.5
    big = gt.tile_plan("h200", 256, 256, "bf16", stages=3, warps=8)
    assert big.verdict == "spills" and not big.accumulator_fits and big.accumulator_share_of_sm == 1.0
    wide = gt.tile_plan("h200", 256, 256, "bf16", stages=1, warps=16)
    assert wide.register_limit == 128 and wide.verdict == "spills"  # 512 threads share 64 K registers
    huge = gt.tile_plan("h200", 256, 256, "fp8", stages=4, warps=8)  # 4 x 64 KiB > 227 KiB
    assert huge.verdict == "does not launch" and huge.ctas_per_sm == 0
    small = gt.tile_plan("h200", 64, 64, "bf16", stages=4, warps=4)
    assert small.bound == "L2 bandwidth" and small.flops == pytest.approx(32 * 9.77e12)
    for bad in ({"tile_m": 96}, {"dtype": "fp8", "chip": "a100-sxm"}, {"chip": "mi300x"}, {"stages": 0}):
        kw = {"chip": "h200", "tile_m": 128, "tile_n": 128, "dtype": "bf16"} | bad
        with pytest.raises(ValueError):
            gt.tile_plan(**kw)


def test_model_against_the_h200_triton_measurement():
    """data/measured-h200.yaml, triton_tiles: shared memory exactly, the spill verdict for every config at
    both ends of the overhead range, and the rate of each config that fits within 25%."""
    rows = gt.triton_comparison("h200")
    assert len(rows) == 9
    for r, q in rows:
        assert q.smem_bytes == r["smem_bytes"]
        for ov in (32, 84):
            q2 = gt.tile_plan("h200", q.tile_m, q.tile_n, "bf16", q.bk, q.stages, q.warps, overhead=ov)
            assert (q2.verdict == "spills") == (r["spills"] > 0), r
        if q.verdict == "runs":
            assert q.flops / 1e12 == pytest.approx(r["TFLOPs"], rel=0.25), r


# ---- N099: the SGEMM steps --------------------------------------------------------------------------


def _bank_count(addr, width):
    """Distinct 4-byte words per bank, max over banks, summed over the lane groups (32, or 128 / width)."""
    per = 32 if width <= 4 else 128 // width
    total = 0
    for g in range(0, 32, per):
        words = {int(a) // 4 + w for a in addr[g:g + per] for w in range(max(1, width // 4))}
        banks: dict = {}
        for wd in words:
            banks.setdefault(wd % 32, set()).add(wd)
        total += max(len(v) for v in banks.values())
    return total


def test_sgemm_traffic_counts():
    s = gt.sgemm_steps("h200")
    assert s["naive_rows"].l2_bytes_per_fma == 33 and s["naive_cols"].l2_bytes_per_fma == 5
    assert s["smem"].operands_per_fma == 1 / 16 and s["reg2d"].operands_per_fma == 1 / 64
    assert s["reg2d"].l2_bytes_per_fma == 1 / 16
    w = {k: s[k].smem_wavefronts for k in ("smem", "reg2d", "reg2d_vec")}
    assert (w["smem"]["loads"], w["smem"]["stores"]) == (64, 2)
    assert (w["reg2d"]["loads"], w["reg2d"]["stores"]) == (192, 36)  # A's transposed store: 8-way conflicts
    assert (w["reg2d_vec"]["loads"], w["reg2d_vec"]["stores"]) == (192, 12)  # 2-way
    for key in ("smem", "reg2d", "reg2d_vec"):
        direct = sum(_bank_count(a, width) for _k, _op, a, width in gt.smem_instructions(key))
        assert direct == w[key]["loads"] + w[key]["stores"]
        # another warp of the CTA sees the same conflicts
        assert gt.smem_wavefronts(key, warp=3) == gt.smem_wavefronts(key, warp=0)


def test_sgemm_model_against_the_h200_measurement():
    s = gt.sgemm_steps("h200")
    for key in ("naive_rows", "smem", "reg2d", "reg2d_vec"):
        assert s[key].ceiling / 1e12 == pytest.approx(measured(f"sgemm_steps.{key}.TFLOPs"), rel=0.25), key
    model = s["reg2d"].smem_bytes_per_fma / s["reg2d_vec"].smem_bytes_per_fma
    meas = measured("sgemm_steps.reg2d_vec.TFLOPs") / measured("sgemm_steps.reg2d.TFLOPs")
    assert model == pytest.approx(meas, rel=0.1)
    assert s["naive_cols"].ceiling / 1e12 < measured("sgemm_steps.naive_cols.TFLOPs")  # L1 reuse: documented


def test_sgemm_other_gpus():
    for g in NO_CLOCK:  # no SM clock in data/hardware.yaml: the shared-memory ceiling is left out
        b = gt.sgemm_step("reg2d", g)
        assert b.smem_ceiling is None and b.ceiling == min(b.fp32_peak, b.l2_ceiling)
    a = gt.sgemm_step("reg2d_vec", "a100-sxm")
    assert a.fp32_peak == gpu("a100-sxm").peak_flops("fp32") and a.bound == "FP32 peak"
    with pytest.raises(ValueError):
        gt.sgemm_step("reg2d", "mi300x")
    with pytest.raises(ValueError, match="kernel must be one of"):
        gt.sgemm_step("tensor", "h200")


def test_kernel_source():
    src = gt.kernel_source("sgemm_reg2d")
    assert src.startswith("// 4.") and "#define BM 128" in src and 'extern "C" __global__' in src
    assert src.rstrip().endswith("}")
    loop = gt.kernel_source("sgemm_smem", "for (int k0", "if (row < M && col < N) C")
    assert loop.lstrip().startswith("for (int k0") and "__syncthreads" in loop
    with pytest.raises(ValueError, match="no kernel"):
        gt.kernel_source("sgemm_missing")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 50), st.sampled_from(((16, 16, 4, 4, 4), (32, 8, 8, 8, 2))))
def test_reference_loop_nest_matches_float64(m, n, k, shape):
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = gt.reference_tiled_matmul(a, b, *shape)
    mu = (k + 1) * 2.0**-24
    bound = mu / (1 - mu) * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert c.shape == (m, n) and c.dtype == np.float32
    assert (np.abs(c - tg.oracle(a, b)) <= bound + 1e-30).all()


def test_grader_passes_the_reference_and_fails_each_draft():
    assert gt.check_tiled_matmul(gt.reference_tiled_matmul).passed
    for name, draft in gt.LOOP_DRAFTS.items():
        rep = gt.check_tiled_matmul(draft)
        assert rep.status == "failed", name
        assert "First failing case" in rep.failure

    def skeleton(a, b, *args):
        raise NotImplementedError

    assert gt.check_tiled_matmul(skeleton).status == "not implemented"
    assert gt.check_tiled_matmul(lambda a, b, *args: np.asarray(a) @ np.asarray(b)).passed  # any correct order
    with pytest.raises(ValueError):
        gt.check_tiled_matmul("not a function")


# ---- explorers ----------------------------------------------------------------------------------------


def test_tile_explorer():
    v = widgets.render("cuda_kernels.gemm_tile_shape", gpu="h200", dtype="bf16", tile_m=256, tile_n=128, stages=3,
                       warps=8)
    assert isinstance(v, widgets.View) and v.caption
    assert v.values["accumulator_per_thread"] == 128 and v.values["spilled"] == 0
    assert math.isclose(v.values["flops"], gt.tile_plan("h200", 256, 128, stages=3, warps=8).flops)
    err = widgets.render("cuda_kernels.gemm_tile_shape", gpu="mi300x", dtype="bf16", tile_m=128, tile_n=128,
                         stages=3, warps=8)
    assert isinstance(err, widgets.ErrorView) and "NVIDIA" in err.message


def test_steps_explorer():
    v = widgets.render("cuda_kernels.tiled_gemm", gpu="h200", tc_dtype="bf16", tc_tile_n=256)
    assert isinstance(v, widgets.View) and v.caption and v.svg().startswith("<svg")
    assert v.values["reg2d"] == gt.sgemm_step("reg2d", "h200").ceiling
    v2 = widgets.render("cuda_kernels.tiled_gemm", gpu="b200", tc_dtype="fp8", tc_tile_n=128)
    assert isinstance(v2, widgets.View)
    assert isinstance(widgets.render("cuda_kernels.tiled_gemm", gpu="a100-sxm", tc_dtype="fp8", tc_tile_n=128),
                      widgets.ErrorView)
