"""lib.kernels.sm: per-SM limits from data/hardware.yaml and the occupancy arithmetic of cuda_occupancy.h."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels.sm import occupancy, sm_limits, wave_efficiency, waves
from lib.registry.hardware import gpu_names

NVIDIA = [g for g in gpu_names() if g != "mi300x"]


def test_limits_of_each_compute_capability():
    h100, l4, a100 = sm_limits("h100-sxm"), sm_limits("l4"), sm_limits("a100-sxm")
    assert (h100.max_warps_per_sm, h100.max_blocks_per_sm, h100.sm_count) == (64, 32, 132)
    assert (l4.max_warps_per_sm, l4.max_threads_per_sm, l4.max_blocks_per_sm) == (48, 1536, 24)
    assert a100.smem_per_sm_bytes == 164 * 1024 and a100.max_smem_per_block_bytes == 163 * 1024
    assert h100.registers_per_sm * 4 == 256 * 1024  # the 256 KiB register file


def test_amd_is_refused_with_the_nvidia_choices():
    with pytest.raises(ValueError, match="no CUDA compute capability.*h100-sxm"):
        sm_limits("mi300x")


def test_best_practices_guide_example():
    """Published anchor: CUDA C++ Best Practices Guide, 'Calculating Occupancy' (compute capability
    7.0): 37 registers per thread give 75% occupancy with 128-thread blocks (12 blocks) and about
    63% with 320-thread blocks (4 blocks)."""
    v100 = dataclasses.replace(sm_limits("a100-sxm"), compute_capability="7.0", smem_per_sm_bytes=96 * 1024,
                               max_smem_per_block_bytes=96 * 1024)
    small, big = occupancy(v100, 128, 37), occupancy(v100, 320, 37)
    assert (small.blocks_per_sm, small.occupancy) == (12, 0.75)
    assert big.blocks_per_sm == 4 and big.occupancy == pytest.approx(0.63, abs=0.01)
    assert small.binding == ("registers",)


def test_each_limit_can_bind():
    assert occupancy("h100-sxm", 1024, 32).binding == ("warps", "registers")  # 2 blocks of 32 warps
    assert occupancy("h100-sxm", 32, 16).binding == ("blocks",)  # 32 one-warp blocks: half the warps
    assert occupancy("h100-sxm", 32, 16).occupancy == 0.5
    assert occupancy("h100-sxm", 256, 128).binding == ("registers",)
    assert occupancy("h100-sxm", 128, 32, 100 * 1024).blocks_per_sm == 2  # (100 KiB + 1 KiB) x 2 <= 228 KiB
    assert occupancy("h100-sxm", 128, 32, 100 * 1024).binding == ("shared memory",)


def test_a_block_over_the_register_file_does_not_launch():
    o = occupancy("h100-sxm", 1024, 255)  # 255 x 32 -> 8,192 per warp x 32 warps = 262,144 > 65,536
    assert o.blocks_per_sm == 0 and o.occupancy == 0 and "registers" in o.binding
    assert occupancy("h100-sxm", 1024, 64).blocks_per_sm == 1  # exactly the per-block limit


def test_inputs_are_validated():
    with pytest.raises(ValueError, match="threads_per_block"):
        occupancy("h100-sxm", 2048, 32)
    with pytest.raises(ValueError, match="registers_per_thread"):
        occupancy("h100-sxm", 128, 256)
    with pytest.raises(ValueError, match="smem_per_block_bytes"):
        occupancy("l4", 128, 32, 100 * 1024)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NVIDIA), st.integers(1, 1024), st.integers(1, 255), st.integers(0, 99 * 1024))
def test_properties(chip, threads, regs, smem):
    o = occupancy(chip, threads, regs, smem)
    lim = sm_limits(chip)
    assert 0 <= o.occupancy <= 1 and o.warps_per_sm <= lim.max_warps_per_sm
    assert o.blocks_per_sm * o.registers_per_warp * o.warps_per_block <= lim.registers_per_sm
    assert o.blocks_per_sm * o.smem_allocated_per_block_bytes <= lim.smem_per_sm_bytes
    # more of any resource never raises occupancy
    if regs < 255:
        assert occupancy(chip, threads, regs + 1, smem).blocks_per_sm <= o.blocks_per_sm
    if smem + 128 <= lim.max_smem_per_block_bytes:
        assert occupancy(chip, threads, regs, smem + 128).blocks_per_sm <= o.blocks_per_sm


def test_waves():
    assert waves(132, 132) == 1 and waves(140, 132) == 2
    assert wave_efficiency(140, 132) == pytest.approx(140 / 264)
    assert wave_efficiency(96, 108) == pytest.approx(0.889, abs=1e-3)
    with pytest.raises(ValueError, match="slots"):
        waves(10, 0)
