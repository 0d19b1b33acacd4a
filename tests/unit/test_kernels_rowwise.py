"""lib.kernels.rowwise: the row-wise Triton kernels against torch, their traffic and the register
arithmetic of the wide-row limit; lib.kernels.softmax_practice: the grader fails every draft."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.kernels import rowwise as rw
from lib.kernels import softmax_practice as sp
from lib.kernels.sm import sm_limits
from lib.registry.hardware import gpu, gpu_names

NVIDIA = [g for g in gpu_names() if gpu(g).compute_capability is not None]
torch = pytest.importorskip("torch")


# ---- block size, the warp rule, the register cap -------------------------------------------------


def test_block_size_is_the_next_power_of_two():
    assert [rw.block_size(n) for n in (1, 2, 3, 1000, 1024, 1025, 128256)] == [1, 2, 4, 1024, 1024, 2048, 131072]
    with pytest.raises(ValueError, match="n_cols"):
        rw.block_size(0)


def test_the_published_warp_rule():
    """Published anchor: Unsloth's calculate_settings (copied by Liger): 4 warps below 2048, 8 below
    8192, 16 below 32768, 32 from 32768."""
    got = {b: rw.num_warps_for_block(b) for b in (1, 1024, 2048, 4096, 8192, 16384, 32768, 65536)}
    assert got == {1: 4, 1024: 4, 2048: 8, 4096: 8, 8192: 16, 16384: 16, 32768: 32, 65536: 32}


@pytest.mark.parametrize("chip", NVIDIA)
@pytest.mark.parametrize("warps", [1, 2, 4, 8, 16, 32])
def test_register_cap_is_the_closed_form(chip, warps):
    """The occupancy search equals min(255, 65,536 / threads rounded down to the 8-register unit of a
    warp's 256-register allocation)."""
    lim = sm_limits(chip)
    threads = 32 * warps
    closed = min(lim.max_registers_per_thread, lim.max_registers_per_block // threads // 8 * 8)
    assert rw.register_cap_per_thread(chip, warps) == closed


def test_widest_row_on_h100():
    """Published anchor (QuACK blog): one SM handles a 32k fp32 row; Liger's 32-warp kernel spills at 64k."""
    assert [rw.widest_row_in_registers("h100-sxm", w) for w in (4, 8, 16, 32)] == [16384, 32768, 32768, 32768]
    lo, hi = (rw.widest_row_in_registers("h100-sxm", 32, o) for o in (16, 32))
    assert lo == hi == 32768  # the whole assumed overhead range gives the same answer
    assert rw.widest_row_in_registers("h100-sxm", 32, 33) == 16384  # one register more and it halves
    with pytest.raises(ValueError, match="no row fits"):
        rw.widest_row_in_registers("h100-sxm", 32, 64)


def test_row_fit_of_the_default_shape_and_a_vocabulary():
    f = rw.row_fit("h100-sxm", 8192)
    assert (f.block, f.num_warps, f.threads, f.elements_per_thread, f.register_cap) == (8192, 16, 512, 16, 128)
    assert f.fits and f.registers_needed == 16 + rw.overhead_registers() and f.programs_per_sm == 3
    v = rw.row_fit("h100-sxm", 128256)
    assert not v.fits and v.block == 131072 and v.elements_per_thread == 128
    assert rw.row_fit("h100-sxm", 1000).idle_lane_fraction == pytest.approx(24 / 1024)
    assert rw.row_fit("h100-sxm", 64).elements_per_thread == 1  # a block narrower than 128 threads


def test_bad_inputs_are_refused_with_their_name():
    with pytest.raises(ValueError, match="power of two"):
        rw.row_fit("h100-sxm", 4096, num_warps=3)
    with pytest.raises(ValueError, match="num_warps"):
        rw.register_cap_per_thread("h100-sxm", 64)
    with pytest.raises(ValueError, match="compute capability"):
        rw.row_fit("mi300x", 4096)
    with pytest.raises(ValueError, match="design"):
        rw.row_kernel_cost(8, 8, "h100-sxm", "bf16", "four_pass")
    with pytest.raises(ValueError, match="dtype"):
        rw.copy_cost(8, 8, "h100-sxm", "fp8")


# ---- traffic and time ----------------------------------------------------------------------------


def test_design_io_agrees_with_the_attention_traffic_table():
    """lib.attention.softmax_traffic counts each score over the whole unfused attention: the softmax
    kernel's own reads and writes plus QK^T's write and PV's read."""
    from lib.attention.softmax_traffic import score_accesses_per_element

    names = {"row_in_registers": "row_on_chip", "online_two_pass": "online", "three_pass": "three_pass"}
    for design, name in names.items():
        r, w = score_accesses_per_element(name)
        assert rw.softmax_design_io(design) == (r - 1, w - 1)


def test_costs_by_hand():
    rows, cols = 16384, 8192
    c = rw.copy_cost(rows, cols, "h100-sxm", "bf16", efficiency=0.85, fixed_s=2.5e-6)
    assert c.bytes == c.min_bytes == 2 * rows * cols * 2
    assert c.time_s == pytest.approx(2.5e-6 + c.bytes / (3.35e12 * 0.85))
    row = rw.row_kernel_cost(rows, cols, "h100-sxm", "bf16", efficiency=0.85, fixed_s=2.5e-6)
    assert row.bytes == c.bytes and row.bound == "memory" and row.time_s == pytest.approx(c.time_s)
    online = rw.row_kernel_cost(rows, cols, "h100-sxm", "bf16", "online_two_pass")
    three = rw.row_kernel_cost(rows, cols, "h100-sxm", "bf16", "three_pass")
    assert online.bytes == 1.5 * c.bytes and three.bytes == 2 * c.bytes
    assert row.compute_s == pytest.approx(4 * rows * cols / 67e12)
    assert row.exp_s == pytest.approx(rows * cols / (16 * 132 * 1.83e9))
    assert rw.row_kernel_cost(rows, cols, "b200", "bf16").exp_s is None  # no SFU rate in data
    assert row.effective_bandwidth == pytest.approx(row.min_bytes / row.time_s)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 1 << 16), cols=st.integers(1, 1 << 18), chip=st.sampled_from(NVIDIA),
       dtype=st.sampled_from(rw.ROW_DTYPES))
def test_no_design_beats_the_copy_and_more_bytes_never_help(rows, cols, chip, dtype):
    copy = rw.copy_cost(rows, cols, chip, dtype)
    times = [rw.row_kernel_cost(rows, cols, chip, dtype, d).time_s for d in rw.SOFTMAX_DESIGNS]
    assert times[0] >= copy.time_s * (1 - 1e-12)
    assert times == sorted(times)
    assert copy.time_s / times[1] <= 1 / 1.5 + copy.fixed_s / times[1] + 1e-12  # the second read caps it


def test_done_fraction_and_overhead_come_from_the_data():
    from lib.registry import assumptions

    assert rw.done_fraction_of_copy() == assumptions.value("kernels_rowwise.done_fraction_of_copy")
    lo, hi = assumptions.value_range("kernels_rowwise.row_kernel_overhead_registers")
    assert lo <= rw.overhead_registers() <= hi


def test_stream_cost_validates_and_prices_fractional_passes():
    c = rw.stream_cost(4096, 8192, "h100-sxm", "bf16", 1, 2, name="fp32 output")
    assert c.bytes_written == 2 * c.bytes_read
    with pytest.raises(ValueError, match="reads"):
        rw.stream_cost(4, 4, "h100-sxm", "bf16", -1, 1)


# ---- the Triton kernels (CPU interpreter here) ------------------------------------------------------


def _torch_softmax(x):
    want = torch.softmax(x.double(), dim=-1)
    return torch.nan_to_num(want, nan=0.0)  # the kernel writes zeros for an all -inf row


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-6), ("fp16", 2.0**-10), ("bf16", 2.0**-7)])
def test_softmax_matches_torch(dtype, tol):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(9, 300, generator=g) * 4).to(rw.torch_dtype(dtype))
    x[2] = -float("inf")
    x[3, ::2] = -float("inf")
    x[4] += 500
    y = rw.softmax(x)
    assert y.dtype == x.dtype and y.shape == x.shape
    want = _torch_softmax(x)
    assert torch.all(y[2] == 0)
    assert (y.double() - want).abs().max().item() <= tol * want.max().item()


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 4), cols=st.integers(1, 700), scale=st.sampled_from([0.1, 3.0, 50.0]),
       seed=st.integers(0, 10**6))
def test_softmax_property_rows_sum_to_one(rows, cols, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * scale
    y = rw.softmax(x)
    assert torch.allclose(y.double().sum(dim=1), torch.ones(rows, dtype=torch.float64), atol=1e-5)
    assert (y.double() - _torch_softmax(x)).abs().max().item() < 1e-6


def test_softmax_on_a_strided_view_and_one_column():
    base = torch.randn(6, 64)
    view = base[:, ::2]  # non-contiguous columns: copied to contiguous
    assert torch.allclose(rw.softmax(view), torch.softmax(view, -1), atol=1e-6)
    rows = base[::2]  # row stride 128, contiguous columns: used as is
    assert torch.allclose(rw.softmax(rows), torch.softmax(rows, -1), atol=1e-6)
    assert torch.all(rw.softmax(torch.randn(5, 1)) == 1)


def test_without_the_max_large_rows_overflow():
    x = torch.randn(4, 100)
    x[1] += 100  # past ln(fp32 max) = 88.7
    x[2] -= 1000  # every exp underflows to 0
    raw = rw.softmax(x, subtract_max=False)
    assert torch.isnan(raw[1]).any() and torch.all(raw[2] == 0) and torch.isfinite(raw[0]).all()
    assert torch.allclose(rw.softmax(x), torch.softmax(x, -1), atol=1e-6)


def test_bf16_half_accumulation_is_refused_on_the_interpreter():
    from lib.kernels.triton_env import INTERPRETED

    if not INTERPRETED:
        pytest.skip("on a GPU the bf16 path runs")
    with pytest.raises(ValueError, match="interpreter"):
        rw.softmax(torch.randn(2, 8).bfloat16(), acc_fp32=False)


def test_launcher_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="2-D"):
        rw.softmax(torch.randn(3))
    with pytest.raises(ValueError, match="float32"):
        rw.softmax(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="tile"):
        rw.softmax_looped(torch.randn(2, 8), tile=100)


@pytest.mark.parametrize("dtype", rw.ROW_DTYPES)
def test_looped_kernel_matches_torch_and_the_online_recurrence(dtype):
    from lib.attention.online_softmax import online_softmax_trace

    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 5000, generator=g) * 3).to(rw.torch_dtype(dtype))
    x[1] = -float("inf")
    y, lse = rw.softmax_looped(x, tile=512)
    want = _torch_softmax(x)
    tol = {"fp32": 1e-6, "fp16": 2.0**-10, "bf16": 2.0**-7}[dtype]
    assert (y.double() - want).abs().max().item() <= tol
    assert torch.all(y[1] == 0) and lse[1].item() == -math.inf
    for r in (0, 2):
        assert lse[r].item() == pytest.approx(online_softmax_trace(x[r].float().numpy(), block_size=512).lse,
                                              abs=1e-5)
        assert lse[r].item() == pytest.approx(torch.logsumexp(x[r].double(), 0).item(), abs=1e-4)


# ---- the numerics emulation ----------------------------------------------------------------------------


def test_emulation_fp32_path_is_the_triton_kernel():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 3000)) * 3).astype(np.float32)
    emul = rw.emulate_softmax_program(x, "fp32", 256).astype(np.float64)
    tri = rw.softmax(torch.from_numpy(x)).double().numpy()
    assert rw.relative_error(tri, emul) < 1e-5


def test_half_accumulation_errors_and_the_fp16_sum_overflow():
    from lib.attention.naive import round_to_dtype, softmax_rows

    rng = np.random.default_rng(1)
    for dt in ("fp16", "bf16"):
        x = round_to_dtype(rng.standard_normal((4, 8000)) * 3, dt)
        exact = softmax_rows(x.astype(np.float64))[0]
        e32 = rw.relative_error(rw.emulate_softmax_program(x, "fp32", 512), exact)
        e16 = rw.relative_error(rw.emulate_softmax_program(x, dt, 512), exact)
        assert e32 < 1e-6 and e16 > 100 * e32
    flat = np.zeros((1, 70_000), np.float32)
    assert not rw.emulate_softmax_program(flat, "fp16", 1024).any()  # 70,000 > 65,504: the sum is inf
    assert rw.emulate_softmax_program(flat, "fp32", 1024).sum() == pytest.approx(1.0, rel=1e-5)
    masked = np.full((1, 10), -np.inf, np.float32)
    assert not rw.emulate_softmax_program(masked, "bf16", 32).any()


def test_emulation_and_error_refuse_bad_input():
    with pytest.raises(ValueError, match="threads"):
        rw.emulate_softmax_program(np.zeros((1, 8)), "fp32", 3)
    with pytest.raises(ValueError, match="acc_dtype"):
        rw.emulate_softmax_program(np.zeros((1, 8)), "fp8", 32)
    with pytest.raises(ValueError, match="every row"):
        rw.relative_error(np.zeros((1, 2)), np.zeros((1, 2)))


# ---- the practice grader ----------------------------------------------------------------------------


def test_reference_passes_and_every_draft_fails():
    assert sp.check(sp.reference_row_softmax).passed
    for name in sp.VARIANTS:
        report = sp.check(sp.variant(name))
        assert report.status == "failed", name
        assert "It matches" in report.failure, name


def test_grader_reports_the_skeleton_and_rejects_non_callables():
    assert sp.check(sp.skeleton).status == "not implemented"
    with pytest.raises(ValueError, match="row_softmax"):
        sp.check("softmax")
    with pytest.raises(ValueError, match="variant"):
        sp.variant("nonsense")


def test_grader_accepts_a_vectorized_answer_and_refuses_float16_output():
    def vectorized(x):
        x = np.asarray(x, np.float32)
        m = x.max(axis=1, keepdims=True)
        m = np.where(np.isneginf(m), 0, m)
        e = np.exp(x - m)
        s = e.sum(axis=1, keepdims=True)
        return e / np.where(s > 0, s, 1)

    assert sp.check(vectorized).passed
    assert sp.check(lambda x: vectorized(x).astype(np.float16)).status == "failed"


def test_cases_are_deterministic_and_described():
    a, b = sp.cases(4, seed=3), sp.cases(4, seed=3)
    assert a == b and len(a) == 10 + 4
    for case in a:
        x = sp.case_input(case.ops)
        assert x.dtype in (np.float32, np.float16) and x.ndim == 2
        assert "row_softmax(x)" in sp.describe(case.ops)


# ---- the explorer ------------------------------------------------------------------------------


def test_softmax_explorer_view():
    from lib.book import widgets

    v = widgets.render("cuda_kernels.softmax", gpu="h100-sxm", dtype="bf16", rows=16384, cols=8192, num_warps=32)
    assert isinstance(v, widgets.View) and v.caption
    assert v.values["fits"] == 1 and v.values["widest"] == 32768
    assert v.values["fraction_online"] == pytest.approx(2 / 3, rel=0.02)
    wide = widgets.render("cuda_kernels.softmax", gpu="a100-sxm", dtype="fp32", rows=64, cols=131072, num_warps=8)
    assert wide.values["fits"] == 0 and "spills" in wide.table_text()
    assert isinstance(widgets.render("cuda_kernels.softmax", gpu="h100-sxm", dtype="bf16", rows=8, cols=64,
                                     num_warps=3), widgets.ErrorView)


# ---- on a GPU: the register arithmetic against the compiler ------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiles the kernel)")
@pytest.mark.parametrize("block,warps", [(8192, 16), (32768, 32), (65536, 32)])
def test_compiled_kernel_spills_only_past_the_widest_row(block, warps):
    x = torch.randn(4, block, device="cuda")
    y = torch.empty_like(x)
    k = rw.kernels().softmax_rows.warmup(x, y, x.stride(0), y.stride(0), block, BLOCK=block, num_warps=warps,
                                         grid=(4,))
    k._init_handles()
    name = torch.cuda.get_device_name().lower()
    chip = "h100-sxm" if "h100" in name else "h200" if "h200" in name else "a100-sxm" if "a100" in name else None
    if chip is None:
        pytest.skip(f"no data for {name}")
    fits = block <= rw.widest_row_in_registers(chip, warps)
    assert (k.n_spills == 0) == fits, (k.n_regs, k.n_spills)


# ---- normalization: the review's pipelines, the kernel, the numerics (N006) -------------------------


def test_the_kernel_under_review_by_hand():
    """RMSNorm, bf16: add (2 reads, 1 write), norm (2 sweeps, fp32 write = 2 tensors), cast (2 + 1):
    10 tensors in 3 launches; LayerNorm adds a sweep."""
    t, h = 1024, 4096
    unit = t * h * 2
    rms = rw.norm_pipeline(t, h, "h100-sxm", "bf16", "rmsnorm")
    assert [k.name for k in rms.kernels] == ["residual add", "norm", "cast to bf16"]
    assert rms.bytes == 10 * unit and rms.launches == 3 and rms.accumulation == "bf16"
    assert rms.load_instructions_per_row == (2 + 2) * h * 2 / 64 + 2 * h * 2 / 128
    ln = rw.norm_pipeline(t, h, "h100-sxm", "bf16", "layernorm")
    assert ln.bytes == 11 * unit and ln.block_reductions == 2 and ln.statistics_passes == 2
    fp32 = rw.norm_pipeline(t, h, "h100-sxm", "fp32", "rmsnorm")
    assert fp32.launches == 2 and fp32.bytes == 6 * t * h * 4  # no cast kernel for fp32 storage


@pytest.mark.parametrize("kind", rw.NORM_KINDS)
@pytest.mark.parametrize("dtype", rw.ROW_DTYPES)
def test_the_review_reaches_the_ceiling_and_never_adds_bytes(kind, dtype):
    stages = rw.norm_review(4096, 8192, "h100-sxm", dtype, kind)
    assert len(stages) == 1 + len(rw.REVIEW_CHANGES)
    assert all(b.bytes <= a.bytes and b.time_s <= a.time_s for a, b in zip(stages[:-1], stages[1:], strict=True))
    ceiling = rw.norm_ceiling(4096, 8192, "h100-sxm", dtype)
    assert stages[-1].bytes == ceiling.bytes == 4 * 4096 * 8192 * bytes_of(dtype)
    assert stages[-1].time_s == pytest.approx(ceiling.time_s) and stages[-1].launches == 1
    assert stages[-1].accumulation == "fp32" and stages[-1].block_reductions == 1
    assert stages[-1].load_instructions_per_row == 2 * 8192 * bytes_of(dtype) / (32 * rw.VECTOR_BYTES)


def bytes_of(dtype):
    from lib.registry.dtypes import bytes_per_element

    return bytes_per_element(dtype)


def test_fusing_before_the_row_is_in_registers_does_not_pay():
    """The order matters: fused into the looped kernel, the norm re-reads x and the residual per sweep."""
    base = ("fp32_accumulation", "output_dtype")
    looped = rw.norm_pipeline(4096, 4096, "h100-sxm", "bf16", "rmsnorm", base)
    fused_looped = rw.norm_pipeline(4096, 4096, "h100-sxm", "bf16", "rmsnorm", (*base, "fuse_residual_add"))
    assert fused_looped.bytes == looped.bytes and fused_looped.launches == looped.launches - 1


def test_norm_pipeline_refuses_unknown_changes_and_kinds():
    with pytest.raises(ValueError, match="unknown change"):
        rw.norm_pipeline(8, 8, "h100-sxm", "bf16", "rmsnorm", ("make_it_fast",))
    with pytest.raises(ValueError, match="kind"):
        rw.norm_pipeline(8, 8, "h100-sxm", "bf16", "batchnorm")


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-5), ("fp16", 2.0**-10), ("bf16", 2.0**-7)])
@pytest.mark.parametrize("kind", rw.NORM_KINDS)
def test_add_norm_matches_torch(dtype, tol, kind):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    td = rw.torch_dtype(dtype)
    x, r = (torch.randn(6, 1000, generator=g) * 2).to(td), (torch.randn(6, 1000, generator=g) * 2).to(td)
    w, b = (1 + 0.1 * torch.randn(1000, generator=g)).to(td), (0.1 * torch.randn(1000, generator=g)).to(td)
    y, h = rw.add_norm(x, w, r, b if kind == "layernorm" else None, kind=kind, eps=1e-5)
    h64 = x.double() + r.double()
    assert (h.double() - h64).abs().max().item() <= tol * h64.abs().max().item()
    want = (F.rms_norm(h64, (1000,), w.double(), eps=1e-5) if kind == "rmsnorm" else
            F.layer_norm(h64, (1000,), w.double(), b.double(), eps=1e-5))
    assert (y.double() - want).abs().max().item() <= 1.01 * tol * want.abs().max().item() + 1e-6
    y0, h0 = rw.add_norm(x, w, None, b if kind == "layernorm" else None, kind=kind, eps=1e-5)
    assert h0 is None and y0.shape == x.shape


def test_add_norm_refuses_bad_shapes():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight"):
        rw.add_norm(x, torch.ones(7))
    with pytest.raises(ValueError, match="residual"):
        rw.add_norm(x, torch.ones(8), torch.randn(3, 8))
    with pytest.raises(ValueError, match="bias"):
        rw.add_norm(x, torch.ones(8), kind="layernorm")


def test_norm_emulation_against_the_kernel_and_the_fp16_overflow():
    from lib.attention.naive import round_to_dtype

    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 4096)).astype(np.float32)
    for kind in rw.NORM_KINDS:
        emul = rw.emulate_norm_program(x, "fp32", 256, kind).astype(np.float64)
        tri, _ = rw.add_norm(torch.from_numpy(x), torch.ones(4096), bias=torch.zeros(4096), kind=kind)
        assert rw.relative_error(tri.double().numpy(), emul) < 1e-5
    big = round_to_dtype(rng.standard_normal((3, 4096)) * 4.5, "fp16")  # sum of squares ~ 83,000 > 65,504
    assert not rw.emulate_norm_program(big, "fp16", 256).any()
    exact = big.astype(np.float64) / np.sqrt((big.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6)
    assert rw.relative_error(rw.emulate_norm_program(big, "fp32", 256), exact) < 1e-6
    xb = round_to_dtype(x, "bf16")
    exact_b = xb.astype(np.float64) / np.sqrt((xb.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6)
    assert rw.relative_error(rw.emulate_norm_program(xb, "bf16", 256), exact_b) > 100 * rw.relative_error(
        rw.emulate_norm_program(xb, "fp32", 256), exact_b)


def test_layernorm_variance_methods():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 3000)) + 1000).astype(np.float32)  # mean 1000 x the spread
    exact = x.astype(np.float64).var(axis=1)

    def err(m):
        return float(np.abs(rw.layernorm_variance(x, m, 128) / exact - 1).max())

    assert err("two_pass") < 1e-5 and err("welford") < 1e-4 and err("sum_and_sumsq") > 1e-2
    small = rng.standard_normal((2, 37)).astype(np.float32)  # not a multiple of the threads
    assert np.allclose(rw.layernorm_variance(small, "welford", 16), small.astype(np.float64).var(1), rtol=1e-5)
    with pytest.raises(ValueError, match="method"):
        rw.layernorm_variance(x, "three_pass")


def test_normalization_explorer_view():
    from lib.book import widgets
    from lib.explorers.cuda_kernels_rowwise import change_worth

    v = widgets.render("cuda_kernels.normalization", model="llama-3.1-8b", tokens=8192, dtype="bf16", gpu="h100-sxm")
    assert isinstance(v, widgets.View) and v.caption
    assert v.values["reviewed_s"] == pytest.approx(v.values["ceiling_s"]) and v.values["launches"] == 3
    assert v.values["naive_bytes"] == 2.5 * v.values["reviewed_bytes"]
    stages = rw.norm_review(64, 4096, "h100-sxm", "fp32", "rmsnorm")
    assert "already fp32" in change_worth("output_dtype", stages[1], stages[2])
    assert "single statistic" in change_worth("one_pass_statistics", stages[4], stages[5])
    assert "correctness" not in change_worth("fp32_accumulation", stages[0], stages[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_add_norm_on_the_gpu_matches_torch():
    import torch.nn.functional as F

    x, r = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16), torch.randn(64, 4096, device="cuda",
                                                                               dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    y, h = rw.add_norm(x, w, r)
    want = F.rms_norm((x.float() + r.float()), (4096,), w.float(), eps=1e-6)
    assert (y.float() - want).abs().max().item() < 0.05
