"""lib.kernels.elementwise: the index and mask, the launch, the vector add against its host copies,
the fusion arithmetic, and the Triton kernels against torch; lib.kernels.vector_add_practice: the
grader fails every draft; the two explorers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import elementwise as ew
from lib.kernels import vector_add_practice as va
from lib.perf.collectives import pcie_bandwidth
from lib.perf.step import step_assumptions
from lib.registry import assumptions
from lib.registry.hardware import gpu

torch = pytest.importorskip("torch")
PCIE = ("a100-sxm", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s")


# ---- the index, the mask, the launch -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), block=st.sampled_from([1, 2, 8, 32, 128, 1024]))
def test_programs_cover_every_element_exactly_once(n, block):
    """Oracle: the union of the masked lanes of every program is range(n), each index once."""
    grid = ew.grid_size(n, block)
    seen = np.concatenate([o[m] for o, m in (ew.program_offsets(p, block, n) for p in range(grid))])
    assert np.array_equal(np.sort(seen), np.arange(n))
    assert (grid - 1) * block < n <= grid * block  # the smallest grid that covers n


def test_grid_size_refuses_bad_inputs():
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        ew.grid_size(0, 256)
    with pytest.raises(ValueError, match="block"):
        ew.grid_size(10, 0)


def test_launch_of_100m_on_h100():
    """256 threads at 16 registers: the 2,048-thread limit holds 8 blocks per SM, 132 x 8 = 1,056 slots."""
    c = ew.launch_config(100_000_000, "h100-sxm", 256, 16)
    assert (c.grid, c.blocks_per_sm, c.binding, c.slots, c.waves) == (390_625, 8, ("warps",), 1056, 370)
    assert c.masked_lanes == 0 and c.tail_elements == 256
    assert c.wave_efficiency == pytest.approx(390_625 / (370 * 1056))
    t = ew.launch_config(100_000_000, "h100-sxm", 128, 16, elements_per_thread=8)  # Triton: BLOCK 1024, 4 warps
    assert t.grid == math.ceil(1e8 / 1024) and t.elements_per_block == 1024 and t.blocks_per_sm == 16


def test_launch_that_no_sm_holds_is_refused():
    with pytest.raises(ValueError, match="does not fit on an SM"):
        ew.launch_config(1000, "h100-sxm", 1024, 255)
    with pytest.raises(ValueError, match="compute capability"):
        ew.launch_config(1000, "mi300x")


# ---- the vector add and its copies ---------------------------------------------------------------


@pytest.mark.parametrize("chip", PCIE)
def test_host_link_is_the_pcie_model(chip):
    """One model: the PCIe rate of lib.perf.collectives, the pinned efficiency of the host tier."""
    eff = assumptions.value("storage.tiers.host_dram.efficiency")
    assert ew.host_link_bandwidth(chip) == pytest.approx(pcie_bandwidth(chip) * eff)
    assert ew.host_link_bandwidth(chip, "pageable") == pytest.approx(pcie_bandwidth(chip) * eff * ew.pageable_fraction())


def test_non_pcie_host_link_and_bad_memory_are_refused():
    with pytest.raises(ValueError, match="not PCIe"):
        ew.vector_add_cost(1000, "gb200")
    with pytest.raises(ValueError, match="memory must be one of"):
        ew.host_link_bandwidth("h100-sxm", "swap")
    with pytest.raises(ValueError, match="dtype"):
        ew.vector_add_cost(1000, "h100-sxm", "fp8")


def test_vector_add_100m_fp32_on_h100():
    """The headline: 1.2 GB over HBM in about 0.42 ms, the same bytes over PCIe Gen5 in about 22 ms, ~50x."""
    v = ew.vector_add_cost(100_000_000, "h100-sxm")
    assert v.bytes == 1.2e9 and v.h2d_bytes == 0.8e9 and v.d2h_bytes == 0.4e9
    assert v.kernel.floor_s == pytest.approx(1.2e9 / 3.35e12)
    a = step_assumptions()
    assert v.kernel.time_s == pytest.approx(a.kernel_fixed_s + 1.2e9 / (3.35e12 * a.gemv_efficiency))
    assert v.copies_s == pytest.approx(3 * ew.copy_fixed_s() + 1.2e9 / (63e9 * 0.873))
    assert v.peak_ratio == pytest.approx(3.35e12 / 63e9)
    assert 45 < v.ratio < 60
    assert v.overlapped_copies_s == pytest.approx(v.h2d_s)  # two inputs in, one output out


@pytest.mark.parametrize("chip", PCIE)
@pytest.mark.parametrize("dtype", ew.DTYPES)
def test_large_ratio_is_the_bandwidth_ratio(chip, dtype):
    """n and b cancel: at 1e9 elements the ratio is (W_HBM eta) / (W_PCIe eta) within the fixed costs."""
    v = ew.vector_add_cost(10**9, chip, dtype)
    want = gpu(chip).memory_bandwidth * step_assumptions().gemv_efficiency / ew.host_link_bandwidth(chip)
    assert v.ratio == pytest.approx(want, rel=0.02)
    assert ew.vector_add_cost(10**9, chip, dtype, "pageable").ratio == pytest.approx(want / ew.pageable_fraction(), rel=0.02)


def test_small_vectors_are_fixed_cost_bound():
    v = ew.vector_add_cost(1000, "h100-sxm")
    assert v.kernel.fixed_s / v.kernel.time_s > 0.99
    assert v.ratio < ew.vector_add_cost(10**8, "h100-sxm").ratio


# ---- fusion arithmetic ---------------------------------------------------------------------------


def test_launch_sequence_rule():
    a = step_assumptions()
    assert ew.launch_sequence_s([1e-6, 2e-6, 3e-6], "cuda_graph") == pytest.approx(6e-6 + 2 * a.launch_gap_s)
    # eager, short kernels: the GPU waits for the CPU, which issues one every eager_launch_s
    assert ew.launch_sequence_s([1e-6] * 5, "eager") == pytest.approx(5 * a.eager_launch_s + 1e-6)
    # eager, long kernels: the CPU runs ahead and only the first issue shows
    long = 10 * a.eager_launch_s
    assert ew.launch_sequence_s([long] * 3, "eager") == pytest.approx(a.eager_launch_s + 3 * long + 2 * a.launch_gap_s)
    with pytest.raises(ValueError, match="launch must be one of"):
        ew.launch_sequence_s([1e-6], "graph")


@pytest.mark.parametrize("ops", [1, 2, 5, 9])
@pytest.mark.parametrize("dtype", ew.DTYPES)
def test_chain_bytes_and_passes(ops, dtype):
    c = ew.chain_cost(1 << 20, ops, "h100-sxm", dtype)
    b = {"fp32": 4, "fp16": 2, "bf16": 2}[dtype]
    assert c.passes_unfused == 2 * ops and c.passes_fused == 2
    assert c.bytes_fused == 2 * (1 << 20) * b
    assert c.bytes_unfused == pytest.approx(ops * c.bytes_fused)
    assert len(c.unfused) == ops


@pytest.mark.parametrize("launch", ew.LAUNCH_MODES)
def test_speedup_limits(launch):
    """Large tensors: the byte ratio k; tiny ones: the ratio of launch costs."""
    a = step_assumptions()
    big = ew.chain_cost(1 << 32, 5, "h100-sxm", "bf16", launch)
    assert big.speedup == pytest.approx(5, rel=0.03)
    tiny = ew.chain_cost(64, 5, "h100-sxm", "bf16", launch)
    if launch == "cuda_graph":
        want = (5 * a.kernel_fixed_s + 4 * a.launch_gap_s) / a.kernel_fixed_s
    else:
        want = (5 * a.eager_launch_s + a.kernel_fixed_s) / (a.eager_launch_s + a.kernel_fixed_s)
    assert tiny.speedup == pytest.approx(want, rel=1e-3)
    assert tiny.overhead_share_unfused > 0.99 and big.overhead_share_unfused < 0.05


@pytest.mark.parametrize("launch", ew.LAUNCH_MODES)
def test_crossover_is_where_memory_time_meets_the_overhead(launch):
    n = ew.launch_crossover_elements("h100-sxm", "bf16", launch)
    c = ew.chain_cost(round(n), 1, "h100-sxm", "bf16", launch)
    assert c.unfused[0].memory_s == pytest.approx(ew.per_kernel_overhead_s(launch), rel=1e-6)
    assert ew.launch_crossover_elements("h100-sxm", "fp32", launch) == pytest.approx(n / 2)


def test_epilogue_fusion_of_a_compute_bound_gemm():
    e = ew.epilogue_fusion("llama-3.1-8b", 8192, "h100-sxm")
    assert (e.k, e.n, e.act_out) == (4096, 2 * 14336, 14336) and e.bound == "compute"
    assert e.gemm_change_s == 0.0  # the matmul itself does not get faster
    assert e.epilogue_flop_share == pytest.approx(5 / (2 * 4096 * 2))  # SiLU-and-mul: 5 ops per output element
    assert e.saved_s == pytest.approx(e.launch_gap_s + e.activation.time_s)
    assert e.activation.bytes == pytest.approx(3 * 8192 * 14336 * 2)
    g = ew.epilogue_fusion("gpt3-175b", 4096, "h100-sxm")  # GELU: reads and writes the output once
    assert g.act_out == g.n and g.activation.bytes == pytest.approx(2 * 4096 * g.n * 2)


def test_epilogue_fusion_at_decode_saves_a_launch():
    e = ew.epilogue_fusion("llama-3.1-8b", 1, "h100-sxm")
    assert e.bound == "memory"
    assert e.saved_s == pytest.approx(e.launch_gap_s + e.activation.time_s + e.gemm_change_s)
    assert e.activation.fixed_s / e.activation.time_s > 0.95


# ---- the Triton kernels --------------------------------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 3000), block=st.sampled_from([16, 128, 1024]), seed=st.integers(0, 99))
def test_triton_add_matches_torch(n, block, seed):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    assert torch.equal(ew.add(x, y, block=block), x + y)


@pytest.mark.parametrize("n, block", [(1000, 256), (1, 1024), (4999, 16), (1024, 256)])
def test_unmasked_kernel_overwrites_exactly_the_lanes_past_n(n, block):
    bad = ew.mask_demo(n, block, masked=False)
    good = ew.mask_demo(n, block, masked=True)
    assert bad.neighbour_changed == ew.grid_size(n, block) * block - n == bad.lanes_past_n
    assert good.neighbour_changed == 0 and good.out_correct


def test_add_refuses_bad_tensors():
    x = torch.zeros(8)
    with pytest.raises(ValueError, match="power of two"):
        ew.add(x, x, block=100)
    with pytest.raises(ValueError, match="one shape and dtype"):
        ew.add(x, torch.zeros(9))
    with pytest.raises(ValueError, match="1-D"):
        ew.add(torch.zeros(2, 2), torch.zeros(2, 2))


PARAMS = {"s_in": 0.05, "bias": 0.1, "clamp": 2.0, "s_out": 8.0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_chain_kernels_match_torch(dtype):
    """Unfused: each op rounded to the dtype, as eager torch does; fused: fp32 throughout, one rounding."""
    x = (torch.randn(3000, generator=torch.Generator().manual_seed(1)) * 40).to(dtype)
    ulp = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    top = 2.0 * 8.0  # clamp x s_out: the largest magnitude
    unfused, fused = ew.chain_unfused(x, PARAMS), ew.chain_fused(x, PARAMS)
    ref, ref32 = ew.chain_reference(x, PARAMS), ew.chain_reference(x, PARAMS, fp32=True)
    assert (fused.float() - ref32.float()).abs().max().item() <= top * ulp
    assert (unfused.float() - ref.float()).abs().max().item() <= 2 * top * ulp


def test_counted_traffic_is_two_passes_per_kernel():
    x = torch.randn(3000).to(torch.bfloat16)
    with ew.counted_traffic() as unfused:
        ew.chain_unfused(x, PARAMS, block=1024)
    with ew.counted_traffic() as fused:
        ew.chain_fused(x, PARAMS, block=1024)
    assert (fused.read_bytes, fused.written_bytes) == (3000 * 2, 3000 * 2)
    assert unfused.bytes == len(ew.CHAIN_OPS) * fused.bytes
    assert (unfused.loads, fused.loads) == (5 * 3, 3)  # one load per program per kernel, 3 programs


# ---- the practice grader -------------------------------------------------------------------------


def candidate_grid(n, block):
    return -(-n // block)


def candidate_program(pid, block, n):
    idx = np.arange(pid * block, (pid + 1) * block)
    return idx, idx < n


def test_grader_passes_the_reference_and_a_standalone_candidate():
    assert va.check(*va.reference()).passed
    assert va.check(candidate_grid, candidate_program, num_random=30, seed=5).passed


@pytest.mark.parametrize("name", va.VARIANTS)
def test_grader_fails_every_draft_and_names_it(name):
    report = va.check(*va.variant(name))
    assert report.status == "failed"
    assert "It matches the classic mistake" in report.failure


def test_grader_reports_the_skeleton_and_bad_returns():
    assert va.check(va.skeleton_grid, va.skeleton_program).status == "not implemented"
    report = va.check(lambda n, block: n / block, candidate_program)
    assert report.status == "failed" and "must return an integer" in report.failure
    report = va.check(candidate_grid, lambda pid, block, n: (np.arange(block), None))
    assert report.status == "failed" and "mask" in report.failure
    report = va.check(candidate_grid, lambda pid, block, n: (np.arange(block) - 10**9, np.ones(block, bool)))
    assert report.status == "failed" and "illegal memory access" in report.failure
    with pytest.raises(ValueError, match="two functions"):
        va.check(candidate_grid, None)


def test_drafts_edit_the_reference():
    with pytest.raises(ValueError, match="variant must be"):
        va.variant("nonsense")
    assert va.variant("reference") == va.reference()


# ---- the explorers ---------------------------------------------------------------------------------


def test_explorers_give_the_headline_numbers():
    from lib.book.widgets import render

    v = render("cuda_kernels.vector_add", gpu="h100-sxm", n=100_000_000, dtype="fp32", threads=256, registers=16,
               memory="pinned")
    assert v.values["grid"] == 390_625 and v.values["waves"] == 370
    assert v.values["ratio"] == pytest.approx(ew.vector_add_cost(100_000_000, "h100-sxm").ratio)
    f = render("cuda_kernels.fusion", gpu="h100-sxm", n=1 << 25, ops=5, dtype="bf16", launch="cuda_graph")
    assert f.values["speedup"] == pytest.approx(ew.chain_cost(1 << 25, 5, "h100-sxm", "bf16").speedup)
    assert f.values["bytes_unfused"] == pytest.approx(5 * f.values["bytes_fused"])


def test_explorer_figures_are_reused():
    from lib.book.widgets import render
    from lib.explorers import cuda_kernels_elementwise as ce

    for n in (1 << 10, 1 << 20, 1 << 30):
        render("cuda_kernels.fusion", gpu="a100-sxm", n=n, ops=3, dtype="fp32", launch="eager").svg()
        render("cuda_kernels.vector_add", gpu="l4", n=n, dtype="bf16", threads=128, registers=32,
               memory="pageable").svg()
    assert ce._FUSION_FIGURE.builds == 1 and ce._VECTOR_FIGURE.builds == 1
