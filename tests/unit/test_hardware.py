"""lib.registry.hardware against the vendors' datasheets (dense peaks) and published ridge points."""

import math

import pytest

from lib.registry.hardware import gpu, gpu_names

REQUIRED = ["a100-sxm", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x", "l4"]


def test_registry_has_the_required_gpus():
    assert set(REQUIRED) <= set(gpu_names())


@pytest.mark.parametrize(
    ("key", "dtype", "tflops"),
    [
        ("a100-sxm", "bf16", 312),  # NVIDIA A100 datasheet: 312 dense / 624 sparse
        ("h100-sxm", "bf16", 989),  # NVIDIA H100 datasheet: 1,979* sparse -> 989 dense
        ("h100-sxm", "fp8", 1979),  # 3,958* sparse
        ("h100-pcie", "bf16", 756),  # 1,513* sparse
        ("h200", "bf16", 989),  # same GH100 compute as H100 SXM
        ("b200", "bf16", 2250),  # DGX B200: 72 PF FP8 sparse / 8 GPUs / 2 = 4.5 PF FP8 -> BF16 half
        ("mi300x", "bf16", 1307.4),  # ROCm MI300 peak-performance table (dense)
        ("l4", "bf16", 121),  # NVIDIA L4 datasheet: 242* sparse
    ],
)
def test_dense_peaks_match_datasheets(key, dtype, tflops):
    assert math.isclose(gpu(key).peak_flops(dtype), tflops * 1e12, rel_tol=1e-9)


@pytest.mark.parametrize(
    ("key", "tbps", "gb"),
    [("a100-sxm", 2.039, 80), ("h100-sxm", 3.35, 80), ("h100-pcie", 2.0, 80), ("h200", 4.8, 141),
     ("b200", 8.0, 180), ("mi300x", 5.3, 192), ("l4", 0.3, 24)],
)
def test_bandwidth_and_capacity_in_si(key, tbps, gb):
    g = gpu(key)
    assert math.isclose(g.memory_bandwidth, tbps * 1e12, rel_tol=1e-9)
    assert math.isclose(g.memory_bytes, gb * 1e9, rel_tol=1e-9)  # decimal GB as printed, not GiB


def test_ridge_points_match_published_values():
    # scaling-book gpus.md: H100 SXM BF16 990e12 / 3.35e12 = 295; B200 2250e12 / 8e12 = 281.
    assert math.isclose(gpu("h100-sxm").ridge_point("bf16"), 295, rel_tol=0.005)
    assert math.isclose(gpu("b200").ridge_point("bf16"), 281, rel_tol=0.005)


def test_nvlink_is_per_direction():
    # NVIDIA markets 900 GB/s (both directions) for H100; collectives use 450 per direction.
    assert gpu("h100-sxm").scaleup_bandwidth == 450e9
    assert gpu("b200").scaleup_bandwidth == 900e9
    assert gpu("l4").scaleup_bandwidth is None


def test_unknown_gpu_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: .*h100-sxm"):
        gpu("h100")


def test_missing_dtype_says_what_exists():
    with pytest.raises(ValueError, match="no 'fp8'.*available: .*bf16"):
        gpu("a100-sxm").peak_flops("fp8")


def test_records_are_immutable():
    g = gpu("h100-sxm")
    with pytest.raises(AttributeError):
        g.memory_bandwidth = 1.0
    with pytest.raises(TypeError):
        g.peak_flops_by_dtype["bf16"] = 1.0


def test_every_value_has_a_source():
    for key in gpu_names():
        for field, src in gpu(key).sources.items():
            assert "no source listed" not in src, f"{key}.{field} has no source"


# ---- optional on-chip figures (shared memory, special-function rate, tensor clock) ----------


def test_shared_memory_per_sm_from_the_cuda_guide():
    # CUDA C++ Programming Guide, 'Shared Memory' per compute capability: 164 KB (8.0),
    # 228 KB (9.0, 10.0), 100 KB (8.9); ROCm: 64 KiB LDS per CU on MI300X. KB there is 1024 bytes.
    assert gpu("a100-sxm").smem_per_sm_bytes == 164 * 1024
    assert gpu("h100-sxm").smem_per_sm_bytes == 228 * 1024
    assert gpu("l4").smem_per_sm_bytes == 100 * 1024
    assert gpu("mi300x").smem_per_sm_bytes == 64 * 1024


def test_h100_special_function_rate_reproduces_the_fa3_papers_figure():
    # FA3 paper (arXiv:2407.08608) footnote 5: 16 ops/SM/clock x 132 SMs x 1830 MHz = 3.9 TFLOPS,
    # against 989 TFLOPS FP16 matmul at the same clock (256x more).
    g = gpu("h100-sxm")
    sfu = g.sfu_ops_per_sm_clock * g.compute_units * g.tensor_clock_hz
    assert math.isclose(sfu, 3.9e12, rel_tol=0.01)
    assert math.isclose(g.peak_flops("fp16") / sfu, 256, rel_tol=0.01)


@pytest.mark.parametrize("key", ["a100-sxm", "h100-sxm", "h100-pcie", "h200"])
def test_tensor_clock_times_units_gives_a_power_of_two_per_sm_rate(key):
    # the dense peak is SMs x (FLOP per SM per clock) x clock, and FLOP per SM per clock is a
    # power of two (2048 on Ampere, 4096 on Hopper, dense FP16/BF16): the stored clock is that one
    g = gpu(key)
    per_clock = g.peak_flops("bf16") / (g.compute_units * g.tensor_clock_hz)
    assert math.isclose(per_clock, 2 ** round(math.log2(per_clock)), rel_tol=0.005)


def test_optional_figures_are_none_without_a_source_and_sourced_with_one():
    assert gpu("b200").sfu_ops_per_sm_clock is None and gpu("mi300x").tensor_clock_hz is None
    for key in gpu_names():
        g = gpu(key)
        for field, value in (("smem_per_sm_kib", g.smem_per_sm_bytes), ("sfu_ops_per_sm_clock", g.sfu_ops_per_sm_clock),
                             ("tensor_clock_mhz", g.tensor_clock_hz)):
            assert (value is None) == (field not in g.sources), f"{key}.{field}: value and source disagree"
