"""lib.kernels.latency_hiding: Little's law against an event simulation of outstanding requests,
the launch-bound register cap against its closed form, spills, and achieved occupancy against a
queue of blocks."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import latency_hiding as lh
from lib.kernels.sm import occupancy, register_cap, sm_limits
from lib.registry.hardware import gpu, gpu_names

NVIDIA = [g for g in gpu_names() if gpu(g).compute_capability is not None]


def test_bytes_needed_on_an_h100():
    assert lh.bytes_in_flight_needed("h100-sxm", 600e-9) == pytest.approx(3.35e12 / 132 * 600e-9)
    assert lh.dram_latency_s() == pytest.approx(600e-9)
    assert lh.bytes_in_flight(16, 4, 16) == 16 * 32 * 4 * 16
    with pytest.raises(ValueError, match="bytes_per_load"):
        lh.bytes_in_flight(16, 4, 12)
    with pytest.raises(ValueError, match="latency_s"):
        lh.dram_latency_s(0.0)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 400), st.sampled_from([4, 16, 128, 512]), st.floats(200e-9, 1200e-9), st.floats(5e9, 60e9))
def test_littles_law_against_an_event_simulation(n, b, lat, bw):
    sim = lh.closed_loop_throughput(n, b, lat, bw, 30)
    closed = min(bw, n * b / (lat + b / bw))
    assert sim == pytest.approx(closed, rel=0.03)


def test_the_ilp_kernel_at_half_the_occupancy_draws_twice_the_bandwidth():
    one = lh.streaming_loop("h100-sxm", 256, 32, 0, 1, 4)
    ilp = lh.streaming_loop("h100-sxm", 256, 64, 0, 4, 4)
    assert (one.occupancy.occupancy, ilp.occupancy.occupancy) == (1.0, 0.5)
    assert ilp.bytes_in_flight == 2 * one.bytes_in_flight
    assert ilp.bandwidth_fraction / one.bandwidth_fraction == pytest.approx(1 / one.bandwidth_fraction)
    assert 1.8 < ilp.bandwidth_fraction / one.bandwidth_fraction <= 2.0


def _cap_closed_form(chip, threads, min_blocks):
    """Largest r: ceil(min_blocks x warps per block / 4) warps per register sub-partition, each
    holding ceil(32 r / 256) x 256 registers out of 16,384."""
    lim = sm_limits(chip)
    wpb = -(-threads // lim.warp_size)
    per_part = -(-min_blocks * wpb // lim.register_sub_partitions)
    regs_warp = (lim.registers_per_sm // lim.register_sub_partitions // per_part) // lim.register_alloc_unit * \
        lim.register_alloc_unit
    return min(lim.max_registers_per_thread, regs_warp // lim.warp_size)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(NVIDIA), st.sampled_from([32, 64, 96, 128, 192, 256, 384, 512, 1024]), st.integers(1, 16))
def test_register_cap_against_its_closed_form(chip, threads, min_blocks):
    lim = sm_limits(chip)
    wpb = threads // 32
    if min_blocks * wpb > lim.max_warps_per_sm:
        with pytest.raises(ValueError, match="warps limit allows"):
            register_cap(chip, threads, min_blocks)
        return
    cap = register_cap(chip, threads, min_blocks)
    assert cap == _cap_closed_form(chip, threads, min_blocks)
    assert occupancy(chip, threads, cap).blocks_per_sm >= min_blocks
    if cap < 255:
        assert occupancy(chip, threads, cap + 1).blocks_per_sm < min_blocks


def test_register_cap_examples_and_spills():
    assert [register_cap("h100-sxm", 256, b) for b in (1, 2, 3, 4, 8)] == [255, 128, 80, 64, 32]
    assert lh.spill_bytes_per_iteration(32) == 32 * 4 * 2
    assert lh.spill_bytes_per_iteration(32, accesses=1) == 128
    loop = lh.streaming_loop("h100-sxm", 256, 64, 0, 4, 16, spilled_registers=32)
    assert loop.spill_ratio == 256 / 64 and loop.slowdown_worst == pytest.approx(5 * loop.slowdown_best)


def _simulated_achieved(occ, grid, sms):
    """Average resident warps over the run: equal-length blocks (1 s) on sms x blocks_per_sm slots."""
    slots = [0.0] * (sms * occ.blocks_per_sm)
    heapq.heapify(slots)
    for _ in range(grid):
        t = heapq.heappop(slots)
        heapq.heappush(slots, t + 1.0)
    makespan = max(slots)
    warp_seconds = grid * occ.warps_per_block * 1.0
    return warp_seconds / (makespan * sms * occ.max_warps_per_sm)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NVIDIA), st.sampled_from([64, 128, 256, 512]), st.integers(16, 200), st.integers(1, 3000))
def test_achieved_occupancy_against_a_queue_of_blocks(chip, threads, regs, grid):
    occ = occupancy(chip, threads, regs)
    got = lh.achieved_occupancy(chip, occ, grid)
    if occ.blocks_per_sm == 0:  # the launch does not fit: nothing resident
        assert got == 0.0
        return
    assert got == pytest.approx(_simulated_achieved(occ, grid, gpu(chip).compute_units), rel=1e-9)
    assert got <= occ.occupancy
