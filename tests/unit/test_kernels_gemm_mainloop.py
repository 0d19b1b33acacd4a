"""lib.kernels.gemm_mainloop: instruction counts against SASS compiled from a real kernel and against brute
force over the tile, shared-memory demand against a published Blackwell microbenchmark, tensor-core rates
against the datasheet, the accumulator's home and CUTLASS's register split, and every refusal."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import gemm_mainloop as gm
from lib.kernels.gemm_tiles import tile_intensity
from lib.kernels.sm import sm_limits
from lib.registry import assumptions
from lib.registry.hardware import gpu
from lib.registry.measured import measured


def _sass(key: str) -> float:
    return assumptions.value(f"kernels_mainloop.sass_hot_loop.{key}")


def test_counts_match_the_sass_of_the_measured_triton_gemm():
    """The H200 run's Triton GEMM (128 x 128, bk 64, 4 warps) compiled for sm_80 and sm_90: the copies, ldmatrix,
    mma.sync and wgmma of one K tile, counted in its SASS (kernels_mainloop.sass_hot_loop)."""
    amp = gm.ktile_instructions("a100-sxm", 128, 128, 64, copy="cp.async", mma="mma.sync", warps=4)
    assert amp.copies_per_loader_thread == _sass("sm80_ldgsts")
    assert amp.staging_per_warp == _sass("sm80_ldsm")
    assert amp.mma_per_issuer == _sass("sm80_hmma")
    hop = gm.ktile_instructions("h100-sxm", 128, 128, 64, copy="cp.async", mma="wgmma", warps=4)
    assert hop.copies_per_loader_thread == _sass("sm90_ldgsts")
    assert hop.mma_per_issuer == _sass("sm90_hgmma")
    tma = gm.ktile_instructions("h100-sxm", 128, 128, 64, copy="tma", mma="wgmma", warps=4)
    assert tma.copies == _sass("sm90_tma_utmaldg")  # one box of A, one of B
    assert _sass("sm90_tma_total") < _sass("sm90_total") and _sass("sm90_tma_registers") < _sass("sm90_registers")
    # the model's jobs are a part of each listing, never more than all of it
    assert amp.total / amp.mma_warps < _sass("sm80_total")
    assert hop.total / hop.mma_warps < _sass("sm90_total")


@settings(max_examples=60, deadline=None)
@given(tm=st.sampled_from([64, 128, 256]), tn=st.sampled_from([64, 128, 256]), bk=st.sampled_from([16, 32, 64, 128]),
       warps=st.sampled_from([1, 2, 4, 8]))
def test_mma_sync_counts_against_brute_force(tm, tn, bk, warps):
    """Walk every warp tile and every 16 x 8 x 16 block and 16 x 16 ldmatrix block of it; walk every 16-byte chunk."""
    k = gm.ktile_instructions("a100-sxm", tm, tn, bk, copy="cp.async", mma="mma.sync", warps=warps)
    wr, wc = gm._warp_grid(tm, tn, warps)
    mmas = ldsm = 0
    for w in range(warps):
        rows = range((w // wc) * tm // wr, (w // wc + 1) * tm // wr)
        cols = range((w % wc) * tn // wc, (w % wc + 1) * tn // wc)
        for _kk in range(0, bk, 16):
            ldsm += len(range(rows.start, rows.stop, 16)) + len(range(cols.start, cols.stop, 16))
            mmas += sum(1 for _ in range(rows.start, rows.stop, 16) for _ in range(cols.start, cols.stop, 8))
    assert (k.mmas, k.staging) == (mmas, ldsm)
    chunks = sum(1 for _ in range(0, (tm + tn) * bk * 2, 16))
    assert k.copies == warps * math.ceil(chunks / (32 * warps))
    assert k.operand_bytes == (tm + tn) * bk * 2


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 2048), bk=st.sampled_from([16, 32, 64, 128, 256]), dtype=st.sampled_from(["bf16", "fp8"]))
def test_tma_boxes_against_brute_force(rows, bk, dtype):
    """Cover the slice with boxes of at most 256 rows and 128 bytes of K, one at a time."""
    e = {"bf16": 2, "fp8": 1}[dtype]
    boxes = 0
    r = 0
    while r < rows:
        b = 0
        while b < bk * e:
            boxes += 1
            b += 128
        r += 256
    assert gm.tma_copies(rows, bk, dtype, "h100-sxm") == boxes


def test_wgmma_and_tcgen05_counts():
    h = gm.ktile_instructions("h100-sxm", 128, 256, 64, copy="tma", mma="wgmma", warps=8)
    assert h.mma_per_issuer == 4  # per warpgroup: 64 rows x 256 columns x 4 k16 steps
    assert h.mmas == 32 and h.copies == 2 and h.staging == 0 and h.operand_registers == 0
    b1 = gm.ktile_instructions("b200", 128, 256, 64, copy="tma", mma="tcgen05")
    b2 = gm.ktile_instructions("b200", 256, 256, 64, copy="tma", mma="tcgen05", cta_group=2)
    assert (b1.mmas, b1.mma_per_issuer, b2.mma_per_issuer, b2.mmas) == (4, 4, 4, 2)
    assert b2.operand_bytes == (128 + 128) * 64 * 2 and b1.operand_bytes == (128 + 256) * 64 * 2
    fp8 = gm.ktile_instructions("h100-sxm", 128, 256, 128, copy="tma", mma="wgmma", warps=8, dtype="fp8")
    assert fp8.mma_per_issuer == 4 and fp8.copies == 2  # k32 in fp8: bk 128 is 4 instructions, 128 B per box


def test_each_change_removes_what_it_takes_over():
    both = {(c, m): gm.ktile_instructions("h100-sxm", 128, 256, 64, copy=c, mma=m, warps=8)
            for c in ("cp.async", "tma") for m in ("mma.sync", "wgmma")}
    # TMA removes the copies and their address arithmetic, whatever the MMA
    for m in ("mma.sync", "wgmma"):
        assert both[("cp.async", m)].address_generation > 50 * both[("tma", m)].address_generation
        assert both[("cp.async", m)].operand_staging == both[("tma", m)].operand_staging
    # wgmma removes ldmatrix and 31 of every 32 warp MMA issues, whatever the copy
    for c in ("cp.async", "tma"):
        assert both[(c, "wgmma")].staging == 0
        assert both[(c, "mma.sync")].mmas == 32 * both[(c, "wgmma")].mmas
        assert both[(c, "mma.sync")].address_generation == both[(c, "wgmma")].address_generation


def test_tensor_rates_against_the_datasheet():
    """4,096 FLOP per SM per clock on Hopper: the H100's 989.4 TFLOPS over 132 SMs at 1,830 MHz; the dtype rule
    (2 / element bytes) against every datasheet tensor peak of the Hopper and Blackwell GPUs."""
    h = gpu("h100-sxm")
    assert gm.tensor_flops_per_sm_clock(h) == pytest.approx(h.peak_flops("bf16") / (h.compute_units * h.tensor_clock_hz),
                                                             rel=1e-3)
    for chip in ("h100-sxm", "h200", "h100-pcie", "b200", "gb200"):
        g = gpu(chip)
        for d in g.dtypes:
            if d == "fp32":
                continue
            ratio = gm.tensor_flops_per_sm_clock(chip, d) / gm.tensor_flops_per_sm_clock(chip, "bf16")
            assert ratio == pytest.approx(g.peak_flops(d) / g.peak_flops("bf16"), rel=2e-3), (chip, d)
    with pytest.raises(ValueError, match="no tensor FLOP per SM per clock"):
        gm.tensor_flops_per_sm_clock("a100-sxm")


def test_smem_port_against_the_blackwell_microbenchmark():
    """SemiAnalysis: a 1-SM tcgen05 MMA with both operands in shared memory is bound at ~128 B per cycle for
    N < 128 (kernels_mainloop.ss_mma_smem_bound_n)."""
    bound = assumptions.value("kernels_mainloop.ss_mma_smem_bound_n")
    at = gm.smem_port("b200", 128, bound)
    assert at.reads_per_clock == pytest.approx(at.port_bytes_per_clock)
    assert gm.smem_port("b200", 128, bound // 2).read_share > 1 > gm.smem_port("b200", 128, 2 * bound).read_share


def test_smem_port_numbers_and_the_pair():
    h = gm.smem_port("h100-sxm", 128, 256)
    assert (h.instruction_m, h.instruction_n, h.reads_per_clock, h.fill_per_clock) == (64, 256, 80, 48)
    one = gm.smem_port("b200", 128, 256)
    pair = gm.smem_port("b200", 256, 256, cta_group=2)
    assert (one.reads_per_clock, one.fill_per_clock) == (96, 96)
    assert (pair.reads_per_clock, pair.fill_per_clock) == (64, 64)
    assert pair.fill_intensity == tile_intensity(256, 256) and one.fill_intensity == tile_intensity(128, 256)
    fp8 = gm.smem_port("b200", 256, 256, "fp8", cta_group=2)
    assert fp8.reads_per_clock == pytest.approx(pair.reads_per_clock)  # twice the FLOP on half the bytes


@settings(max_examples=40, deadline=None)
@given(tm=st.sampled_from([64, 128]), tn=st.sampled_from([64, 128, 192, 256]))
def test_the_pair_never_needs_more_bytes_per_clock(tm, tn):
    """Same output rows per SM: the pair stages half of B, and its instruction reads B once for twice the rows."""
    one = gm.smem_port("b200", tm, tn)
    pair = gm.smem_port("b200", 2 * tm, tn, cta_group=2)
    assert pair.fill_per_clock < one.fill_per_clock
    assert pair.reads_per_clock <= one.reads_per_clock


def test_accumulator_homes():
    h = gm.accumulator("h100-sxm", 128, 256)
    assert (h.home, h.bytes, h.share, h.registers_per_thread) == ("registers", 128 * 1024, 0.5, 128)
    b = gm.accumulator("b200", 256, 256, cta_group=2)
    assert (b.home, b.bytes, b.tmem_columns, b.buffers, b.share) == ("tensor memory", 128 * 1024, 256, 2, 0.5)
    assert b.registers_freed_bytes == h.bytes and h.registers_freed_bytes == 0
    assert gm.mma_unit("b200").tmem_bytes == 256 * 1024 == sm_limits("b200").registers_per_sm * 4
    with pytest.raises(ValueError, match="tensor-memory columns"):
        gm.accumulator("b200", 128, 1024)


def test_warp_specialized_register_split():
    r = gm.warp_specialized_registers("h100-sxm", 128, 256)
    assert (r.accumulator_per_thread, r.producer, r.consumer, r.left_per_consumer) == (128, 40, 232, 104)
    assert r.total == 128 * 40 + 256 * 232 <= 65536 and r.fits_register_file
    heavy = gm.warp_specialized_registers("h100-sxm", 256, 208)
    assert heavy.heavy and (heavy.producer, heavy.consumer) == (24, 240) and heavy.fits_register_file
    big = gm.warp_specialized_registers("h100-sxm", 256, 256)
    assert not big.accumulator_fits and big.spilled > 0
    with pytest.raises(ValueError, match="setmaxnreg"):
        gm.warp_specialized_registers("a100-sxm", 128, 128)


def test_the_accumulator_is_a_floor_under_every_measured_triton_build():
    """H200 (data/measured-h200.yaml triton_tiles): every build holds at least its accumulator's registers (in
    registers or, spilled, in local memory: Triton's n_spills counts 4-byte words), and the one whose accumulator
    alone passes 255 is the one that spilled."""
    cap = sm_limits("h200").max_registers_per_thread
    for row in measured("triton_tiles.rows"):
        tm, tn = (int(x) for x in row["tile"].split("x"))
        acc = gm.accumulator("h200", tm, tn, threads=32 * row["warps"])
        assert acc.registers_per_thread <= row["registers"] + row["spills"]
        assert (acc.registers_per_thread > cap) == (row["spills"] > 0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(chip="a100-sxm", copy="tma", mma="mma.sync"), "TMA needs compute capability 9.0"),
    (dict(chip="b200", copy="tma", mma="wgmma"), "sm_90a only"),
    (dict(chip="h100-sxm", copy="tma", mma="tcgen05"), "does not exist on h100-sxm"),
    (dict(chip="b200", copy="cp.async", mma="tcgen05"), "fed by TMA"),
    (dict(chip="h100-sxm", copy="tma", mma="wgmma", cta_group=2), "must be 'tcgen05'"),
    (dict(chip="h100-sxm", copy="tma", mma="mma.sync", dtype="fp8", bk=64), "16-bit operands"),
    (dict(chip="h100-sxm", copy="dma", mma="wgmma"), "copy must be one of"),
    (dict(chip="h100-sxm", copy="tma", mma="wgmma", warps=6), "multiple of 4"),
    (dict(chip="mi300x", copy="cp.async", mma="mma.sync"), "compute capability"),
])
def test_refusals_say_what_is_allowed(kwargs, match):
    chip = kwargs.pop("chip")
    with pytest.raises(ValueError, match=match):
        gm.ktile_instructions(chip, 128, 128, **kwargs)


def test_tile_and_pair_refusals():
    with pytest.raises(ValueError, match="tile_m a multiple of 128"):
        gm.ktile_instructions("h100-sxm", 64, 128, copy="tma", mma="wgmma", warps=8)
    with pytest.raises(ValueError, match="no asynchronous MMA"):
        gm.smem_port("a100-sxm", 128, 128)
    with pytest.raises(ValueError, match="cta_group"):
        gm.smem_port("h100-sxm", 256, 256, cta_group=2)


def test_generation_configs_and_the_gpus_with_tma():
    assert set(gm.async_gpus()) == {"h100-sxm", "h100-pcie", "h200", "b200", "gb200"}
    cfg = gm.generation_configs("h100-sxm", "b200", 128, 256)
    h, one, pair = cfg["Hopper"], cfg["Blackwell 1 SM"], cfg["Blackwell pair"]
    assert (h.port.total_share, one.port.total_share, pair.port.total_share) == (1.0, 1.5, 1.0)
    assert (h.stage_bytes, one.stage_bytes, pair.stage_bytes) == (48 * 1024, 48 * 1024, 32 * 1024)
    assert (h.stages, one.stages, pair.stages) == (4, 4, 7)
    assert pair.acc.bytes == one.acc.bytes == h.acc.bytes and pair.tile_m == 256
    with pytest.raises(ValueError, match="compute capability 9.0"):
        gm.generation_configs("b200", "b200", 128, 256)
    with pytest.raises(ValueError, match="tile_m"):
        gm.generation_configs("h100-sxm", "b200", 256, 128)


def test_explorer_views_state_lib_numbers():
    from lib.book import widgets

    v = widgets.render("cuda_kernels.tma_wgmma", gpu="h100-sxm", tile="128x256", bk=64, consumer_warpgroups=2, stages=4)
    paths = gm.mainloop_paths("h100-sxm", 128, 256, 64, 2)
    assert v.values["base_total"] == paths["cp.async + mma.sync"].total
    assert v.values["best_total"] == paths["TMA + wgmma"].total
    w = widgets.render("cuda_kernels.hopper_blackwell", hopper="h100-sxm", blackwell="b200", tile="128x256", dtype="bf16")
    assert (w.values["hopper_share"], w.values["one_sm_share"], w.values["pair_share"]) == (1.0, 1.5, 1.0)
    assert w.values["freed_bytes"] == 128 * 1024
