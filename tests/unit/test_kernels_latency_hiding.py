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


# ---- Little's law over the chip, the fitted loaded latency, the decode GEMV ---------------------------------

import math  # noqa: E402

import numpy as np  # noqa: E402

from lib.registry.measured import measured  # noqa: E402


def test_littles_law_bandwidth_is_the_loop_fraction_times_w():
    loop = lh.streaming_loop("h100-sxm", 256, 32, 0, 2, 16)
    g = gpu("h100-sxm")
    got = lh.littles_law_bandwidth(loop.bytes_in_flight, g.compute_units, 600e-9, g.memory_bandwidth)
    assert got == pytest.approx(loop.bandwidth_fraction * g.memory_bandwidth)
    arr = lh.littles_law_bandwidth([512, 1e9], 132, 600e-9, 4.8e12)
    assert arr[0] == pytest.approx(132 * 512 / 600e-9) and arr[1] == 4.8e12
    assert lh.implied_latency_s(512, 132 * 512 / 600e-9, 132) == pytest.approx(600e-9)
    with pytest.raises(ValueError, match="bytes_in_flight_per_sm"):
        lh.littles_law_bandwidth(-1, 132, 600e-9, 4.8e12)
    with pytest.raises(ValueError, match="plateau"):
        lh.littles_law_bandwidth(512, 132, 600e-9, 0)


def _objective(b, w, sms, lat, top):
    return float(np.sum((np.log(np.minimum(top, sms * np.asarray(b) / lat)) - np.log(w)) ** 2))


@settings(max_examples=40, deadline=None)
@given(st.floats(250e-9, 1500e-9), st.floats(1e12, 9e12), st.sampled_from([58, 108, 132, 148]),
       st.integers(0, 2**31))
def test_the_fit_recovers_a_noiseless_curve(lat, top, sms, seed):
    rng = np.random.default_rng(seed)
    knee = top / sms * lat
    b = np.concatenate([knee * rng.uniform(0.05, 0.9, 4), knee * rng.uniform(1.1, 20, 3)])
    w = lh.littles_law_bandwidth(b, sms, lat, top)
    fit = lh.fit_loaded_latency(b, w, sms)
    assert fit.latency_s == pytest.approx(lat, rel=1e-6) and fit.plateau == pytest.approx(top, rel=1e-6)
    assert fit.rms_log_error < 1e-6 and fit.bytes_needed_per_sm == pytest.approx(knee, rel=1e-6)
    only_l = lh.fit_loaded_latency(b, w, sms, plateau=top)
    assert only_l.latency_s == pytest.approx(lat, rel=1e-6) and not only_l.plateau_fitted


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31), st.booleans())
def test_the_fit_beats_a_brute_force_grid_on_noisy_points(seed, fixed):
    rng = np.random.default_rng(seed)
    b = 2.0 ** rng.integers(8, 18, 12)
    w = lh.littles_law_bandwidth(b, 132, 500e-9, 4e12) * np.exp(rng.normal(0, 0.15, b.size))
    if np.unique(b).size < 2:
        return
    top = 4.5e12 if fixed else None
    fit = lh.fit_loaded_latency(b, w, 132, plateau=top)
    best = _objective(b, w, 132, fit.latency_s, fit.plateau)
    assert best == pytest.approx(fit.rms_log_error**2 * b.size, rel=1e-9)
    for lat in np.geomspace(100e-9, 3e-6, 120):  # the exact fit is no worse than any grid point
        for p in ([top] if fixed else np.geomspace(1e12, 1e13, 60)):
            assert best <= _objective(b, w, 132, lat, p) + 1e-9


def test_the_h200_fit_and_its_refusals():
    rows = measured("bytes_in_flight.rows")
    b = [r["bytes_in_flight_per_sm"] for r in rows]
    w = [r["read_GBps"] * 1e9 for r in rows]
    fit = lh.fit_loaded_latency(b, w, measured("bytes_in_flight.sms"))
    assert fit.latency_s == pytest.approx(427.8e-9, rel=1e-3) and fit.plateau == pytest.approx(4.140e12, rel=1e-3)
    cold = min(v["cold_ns_per_load"] for v in measured("pointer_chase").values() if "cold_ns_per_load" in v) * 1e-9
    assert fit.latency_s > cold  # a loaded latency is not below the unloaded one
    with pytest.raises(ValueError, match="two or more distinct"):
        lh.fit_loaded_latency([512, 512], [1e11, 2e11], 132)
    with pytest.raises(ValueError, match="same length"):
        lh.fit_loaded_latency([512, 1024], [1e11], 132)


def test_gemv_registers_follow_the_measured_kernel():
    """The registers of the page's GEMV compiled on the H200 (data/measured-h200.yaml gemv_probe)."""
    for r in measured("gemv_probe.rows"):
        assert lh.gemv_registers(r["batch"], r["bytes_per_load"]) == pytest.approx(r["registers"], rel=0.17), r


def test_gemv_on_the_default_o_proj():
    g = lh.gemv("h200", 4096, 4096)
    assert (g.rows_per_block, g.grid_blocks, g.occupancy.blocks_per_sm, g.loads_per_thread, g.rounds) == (8, 512, 8, 16, 4)
    assert g.bytes_in_flight == pytest.approx(512 * 256 * 4 * 16 / 132)
    assert g.memory_s == pytest.approx(g.weight_bytes / g.plateau)
    # lanes 16 B apart read 2-byte x values: words 4 apart, 8 banks, 4 words each: a 4-way conflict
    assert g.x_read_wavefronts == 4
    assert g.x_read_s == pytest.approx(4096 * 4096 / 32 * 4 / (132 * gpu("h200").tensor_clock_hz))
    assert g.time_s == pytest.approx(g.fixed_s + max(g.memory_s, g.x_read_s, g.fma_s))
    assert g.bound == ("x reads" if g.x_read_s > g.memory_s else "bandwidth")
    ways = {(t, v): lh.gemv("h200", 4096, 4096, threads_per_row=t, bytes_per_load=v).x_read_wavefronts
            for t in (8, 32) for v in (4, 8, 16)}
    assert ways == {(8, 4): 1, (8, 8): 1, (8, 16): 1, (32, 4): 1, (32, 8): 2, (32, 16): 4}  # 8 lanes: broadcasts
    assert lh.gemv("l4", 4096, 4096).x_read_s is None  # no SM clock in data/hardware.yaml
    assert g.bytes_needed == pytest.approx(lh.bytes_in_flight_needed("h200") * g.plateau / gpu("h200").memory_bandwidth)


def test_gemv_against_the_h200_probe():
    """The page's kernel timed on the H200 (gemv_probe): the batch's cost per sequence (the x reads) and the
    time where the source's unroll is what the SASS keeps in flight (16-byte loads, unroll 4)."""
    rows = {(r["n"], r["k"], r["threads_per_row"], r["bytes_per_load"], r["unroll"], r["batch"]): r["s"]
            for r in measured("gemv_probe.rows")}
    slope = (rows[(4096, 4096, 32, 16, 4, 28)] - rows[(4096, 4096, 32, 16, 4, 8)]) / 20
    model = lh.gemv("h200", 4096, 4096, 2).x_read_s - lh.gemv("h200", 4096, 4096, 1).x_read_s
    assert model == pytest.approx(slope, rel=0.25)
    for (n, k, t, v, u, b), s in rows.items():
        if (v, u) == (16, 4) and b == 1:
            assert lh.gemv("h200", n, k, b, t, v, u).call_s == pytest.approx(s, rel=0.35), (n, k, t)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([64, 256, 768, 1024]), st.sampled_from([512, 1024, 4096]), st.sampled_from([8, 32, 128]),
       st.sampled_from([4, 16]), st.integers(1, 8))
def test_gemv_memory_time_against_an_event_simulation(n, k, tpr, width, unroll):
    """One wave: every thread's loads in flight as requests through the latency and the plateau
    (closed_loop_throughput, the oracle of Little's law), against the wave formula."""
    g = lh.gemv("h100-sxm", n, k, threads_per_row=tpr, bytes_per_load=width, unroll=unroll)
    if g.waves != 1 or g.loads_per_thread % g.loads_in_flight:
        return
    active = min(tpr, k * 2 // width)  # threads of a row that have a load at all
    requests = n * active * g.loads_in_flight
    if requests > 40_000:
        return
    sim = lh.closed_loop_throughput(requests, width, g.latency_s, g.plateau, 20)
    assert g.weight_bytes / g.memory_s == pytest.approx(sim, rel=0.06)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NVIDIA), st.integers(1, 40000), st.sampled_from([512, 4096, 8192]), st.integers(1, 8),
       st.sampled_from(lh.GEMV_THREADS_PER_ROW), st.sampled_from([4, 8, 16]), st.integers(1, 15))
def test_more_loads_in_flight_never_slow_a_gemv(chip, n, k, batch, tpr, width, unroll):
    try:
        a = lh.gemv(chip, n, k, batch, tpr, width, unroll)
    except ValueError:
        return
    b = lh.gemv(chip, n, k, batch, tpr, width, unroll + 1)
    if not (a.loads_per_thread % a.loads_in_flight or b.loads_per_thread % b.loads_in_flight):
        assert b.memory_s <= a.memory_s * (1 + 1e-12)  # equal rounds; a short last round may cost more (below)
    assert a.bytes_in_flight <= a.first_wave_blocks * a.threads_per_block * a.unroll * width / a.sms + 1e-9
    assert 0 < a.bandwidth_fraction <= 1 and a.streaming_bandwidth <= a.plateau * (1 + 1e-12)


def test_a_short_last_round_still_waits_a_latency():
    # 16 loads per thread: unroll 8 is two full rounds, unroll 15 is a round of 15 and one of a single load, which
    # waits a whole latency for its few bytes (the notebook's event simulation of the rounds agrees within 1%)
    even, uneven = (lh.gemv("a100-sxm", 226, 4096, 1, 32, 16, u) for u in (8, 15))
    assert (even.loads_per_thread, even.rounds, uneven.rounds) == (16, 2, 2)
    assert uneven.memory_s >= 2 * uneven.latency_s
    per_load = uneven.weight_bytes / uneven.loads_per_thread / uneven.plateau  # one load of every thread, at the plateau
    assert uneven.memory_s == pytest.approx(max(15 * per_load, uneven.latency_s) + max(per_load, uneven.latency_s))
    assert uneven.memory_s > even.memory_s


def test_the_three_places_and_the_refusals():
    small = lh.gemv("h200", 768, 4096)  # the QKV shard of Llama 3.1 8B at TP 8
    assert small.grid_blocks < gpu("h200").compute_units and lh.gemv_places(small)["rows"][1] > 1.1
    scalar = lh.gemv("h200", 4096, 4096, bytes_per_load=4, unroll=1)
    assert lh.gemv_places(scalar)["loads"][1] > 3
    batch16 = lh.gemv("h200", 4096, 4096, batch=16)
    assert batch16.occupancy.binding == ("shared memory",) and lh.gemv_places(batch16)["batch"][1] > 1.05
    assert all(math.isclose(v[1], 1.0) for v in lh.gemv_places(lh.gemv("h200", 4096, 4096)).values())
    with pytest.raises(ValueError, match="shared memory per block"):
        lh.gemv("h200", 4096, 4096, batch=32)
    with pytest.raises(ValueError, match="registers"):
        lh.gemv("h200", 4096, 512, batch=200)
    with pytest.raises(ValueError, match="threads_per_row"):
        lh.gemv("h200", 4096, 4096, threads_per_row=48)
    with pytest.raises(ValueError, match="compute capability"):
        lh.gemv("mi300x", 4096, 4096)


def test_the_gemv_explorer_names_the_place_that_bites():
    from lib.book.widgets import render
    from lib.explorers.cuda_kernels_gemv import places_phrase

    base = dict(model="llama-3.1-8b", projection="o_proj", tp=1, gpu="h200", batch=1, threads_per_row=32,
                bytes_per_load=16, unroll=4)
    assert "too few rows" in render("cuda_kernels.gemv_bytes_in_flight", **{**base, "projection": "qkv_proj", "tp": 8}).note
    assert "the batch" in render("cuda_kernels.gemv_bytes_in_flight", **{**base, "batch": 8}).note
    assert "too few bytes per thread" in places_phrase(lh.gemv("h200", 4096, 4096, 1, 32, 4, 1))
    assert places_phrase(lh.gemv("l4", 4096, 4096)).startswith("None bites")
    refused = render("cuda_kernels.gemv_bytes_in_flight", **{**base, "batch": 64})
    assert "shared memory per block" in refused.message
