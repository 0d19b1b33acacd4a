"""lib.kernels.gemm_waves: tile counts and waves against a brute-force queue of SMs taking tiles,
the ideal time against lib.perf.roofline, the three fixes against their own brute force, and
published wave-quantization examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import gemm_waves as gw
from lib.kernels.sm import waves
from lib.perf.roofline import gemm_flops_bytes, roofline_time
from lib.registry.hardware import gpu, gpu_names

GPUS = gpu_names()


def test_the_default_prefill_shape_is_eight_tiles_over_one_wave():
    n, k = gw.projection_nk("llama-3.1-70b", "qkv_proj", 4)
    assert (n, k) == (2560, 8192)
    w = gw.gemm_waves(896, n, k, "h100-sxm")
    assert (w.rows, w.cols, w.tiles, w.slots, w.waves, w.last_wave_tiles) == (7, 20, 140, 132, 2, 8)
    assert w.bound == "compute" and w.waste_s > 0.4 * w.time_s
    assert w.wave_efficiency == pytest.approx(140 / 264)


def test_published_examples():
    """Stanford CS336 (2025) lecture 5, wave quantization on an A100 (108 SMs) with 256 x 128 tiles:
    1,792 x 1,792 gives 7 x 14 = 98 tiles (one wave); 1,793 gives 8 x 15 = 120 (two). Lecture 6
    (stanford-cs336/lectures lecture_06.py @ aa622dd): 160 blocks on a B200's 148 SMs run a first wave
    of 148 and a second of 12."""
    a = gw.gemm_waves(1792, 1792, 4096, "a100-sxm", "256x128")
    b = gw.gemm_waves(1793, 1793, 4096, "a100-sxm", "256x128")
    assert (a.tiles, a.waves, b.tiles, b.waves) == (98, 1, 120, 2)
    assert b.last_wave_tiles == 12
    makespan, _ = gw.simulate_tile_queue([1.0] * 160, gpu("b200").compute_units)
    assert makespan == 2.0 and waves(160, 148) == 2


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 30000), st.integers(64, 16384), st.sampled_from(gw.TILE_SHAPES),
       st.sampled_from(GPUS))
def test_waves_match_a_queue_of_sms(m, n, k, tile, chip):
    w = gw.gemm_waves(m, n, k, chip, tile)
    tm, tn = gw.parse_tile(tile)
    assert w.tiles == math.ceil(m / tm) * math.ceil(n / tn)
    if w.tiles <= 5000:
        makespan, idle = gw.simulate_tile_queue([w.tile_s] * w.tiles, w.slots)
        assert makespan == pytest.approx(w.compute_s, rel=1e-9)
        # idle slot-time / slots = the compute time the partial wave wastes
        assert idle / w.slots == pytest.approx(w.compute_s - w.tiles * w.tile_s / w.slots, rel=1e-9,
                                               abs=1e-9 * w.compute_s)
    # the ideal compute time is the roofline's at this efficiency; quantized >= ideal always
    flops, nbytes = gemm_flops_bytes(m, n, k, "bf16")
    roof = roofline_time(flops, nbytes, chip, "bf16")
    assert w.ideal_s == pytest.approx(max(roof.compute_s / w.efficiency, roof.memory_s), rel=1e-12)
    assert w.time_s >= w.ideal_s * (1 - 1e-12)
    assert 0 < w.wave_efficiency <= 1 and 0 <= w.padding_fraction < 1


def test_time_vs_tokens_is_gemm_waves_vectorized():
    n, k = gw.projection_nk("llama-3.1-8b", "gate_up_proj", 2)
    ms = np.array([1, 2, 63, 64, 65, 127, 128, 129, 1000, 4096, 4097, 9999])
    for tile in gw.TILE_SHAPES:
        for chip in ("h100-sxm", "l4", "mi300x"):
            q, i = gw.time_vs_tokens(n, k, chip, tile, "bf16", ms)
            for m, qq, ii in zip(ms, q, i, strict=True):
                w = gw.gemm_waves(int(m), n, k, chip, tile)
                assert qq == pytest.approx(w.time_s, rel=1e-12) and ii == pytest.approx(w.ideal_s, rel=1e-12)
    with pytest.raises(ValueError, match="tokens"):
        gw.time_vs_tokens(n, k, "h100-sxm", "128x128", "bf16", np.array([0, 5]))


def test_tile_efficiency_orders_shapes_and_uses_the_step_models_gemm_efficiency():
    from lib.perf.step import step_assumptions

    eff = {t: gw.tile_efficiency(t) for t in gw.TILE_SHAPES}
    assert eff["256x128"] == pytest.approx(step_assumptions().matmul_efficiency)
    assert eff["256x128"] >= eff["128x128"] > eff["128x64"] == eff["64x128"] > eff["64x64"]
    assert gw.tile_efficiency("128x128", 0.5) == pytest.approx(0.5 * 0.95)


def test_split_leftover_against_a_brute_force_queue_and_its_own_optimum():
    n, k = gw.projection_nk("llama-3.1-70b", "qkv_proj", 4)
    best = gw.split_leftover(896, n, k, "h100-sxm")
    assert best.leftover_tiles == 8 and best.full_waves == 1 and best.max_splits == 16
    times = {s: gw.split_leftover(896, n, k, "h100-sxm", splits=s).time_s for s in range(1, 17)}
    assert best.time_s == min(times.values()) and times[1] == pytest.approx(best.base.time_s)
    # the pieces on a queue of SMs: the full wave, then 8 x s pieces on the idle SMs
    s = best.splits
    pieces = [best.base.tile_s] * 132 + [best.base.tile_s / s] * (8 * s)
    makespan, _ = gw.simulate_tile_queue(pieces, 132)
    assert makespan + best.fixup_s == pytest.approx(best.compute_s, rel=1e-12)
    # the best s sits near sqrt(t_tile / t_read): the a/n + c n optimum
    assert abs(s - math.sqrt(best.base.tile_s / best.read_add_s)) <= 1.5
    # no leftover: nothing to split
    exact = gw.split_leftover(6 * 128, 22 * 128, 4096, "h100-sxm")  # 6 x 22 = 132 tiles
    assert exact.leftover_tiles == 0 and exact.time_s == exact.base.time_s
    with pytest.raises(ValueError, match="splits"):
        gw.split_leftover(896, n, k, "h100-sxm", splits=17)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 8192), st.sampled_from(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from(gw.TILE_SHAPES), st.sampled_from(["h100-sxm", "b200", "l4"]))
def test_split_never_loses_and_the_token_budget_is_the_largest_that_fits(m, proj, tp, tile, chip):
    n, k = gw.projection_nk("llama-3.1-70b", proj, tp)
    s = gw.split_leftover(m, n, k, chip, tile)
    assert s.time_s <= s.base.time_s * (1 + 1e-12)
    w = gw.gemm_waves(m, n, k, chip, tile)
    budget = gw.token_budget(n, chip, tile, w.waves)
    assert budget >= m and budget % w.tile_m == 0  # M itself fits its own waves
    assert gw.gemm_waves(budget, n, k, chip, tile).waves <= w.waves
    assert gw.gemm_waves(budget + 1, n, k, chip, tile).waves > w.waves  # one token more starts a new wave


def test_layer_waves_and_inputs():
    layer = gw.layer_waves("llama-3.1-70b", "h100-sxm", 4, 896)
    assert set(layer) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    assert layer["gate_up_proj"].n == 2 * 28672 // 4
    with pytest.raises(ValueError, match="tile must be one of"):
        gw.gemm_waves(896, 2560, 8192, "h100-sxm", "96x96")
    with pytest.raises(ValueError, match="projection"):
        gw.projection_nk("llama-3.1-70b", "attention", 1)
    with pytest.raises(ValueError, match="tp=3"):
        gw.projection_nk("llama-3.1-70b", "qkv_proj", 3)
    with pytest.raises(ValueError, match="m must be"):
        gw.gemm_waves(0, 2560, 8192, "h100-sxm")
    with pytest.raises(ValueError, match="fp8"):
        gw.gemm_waves(896, 2560, 8192, "a100-sxm", dtype="fp8")
