"""lib.perf.throughput: the decode step-time line, its knee and the KV-capacity ceiling."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import memory, roofline
from lib.perf import throughput as tput
from lib.registry.models import model

DENSE = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-72b", "llama-2-7b"]


def test_fixed_cost_is_the_published_weight_floor():
    # (70.6B parameters (Llama 3.1 70B HF card) - the 128,256 x 8,192 embedding table, read a row
    # at a time) x 2 bytes / (8 x 3.35 TB/s, NVIDIA H100 SXM) = 5.19 ms
    line = tput.decode_step_line("llama-3.1-70b", "h100-sxm", 4096, tp=8)
    assert math.isclose(line.fixed_s, (70.6e9 - 128_256 * 8_192) * 2 / (8 * 3.35e12), rel_tol=0.005)
    # per-sequence KV: 4096 tokens x 320 KiB/token (80 layers x 8 KV heads x 128 x 2 x 2 B) / 8 ranks
    assert math.isclose(line.kv_s, 4096 * 327_680 / 8 / 3.35e12, rel_tol=1e-9)
    # and its embedding row: 8,192 x 2 B / 8 ranks
    assert math.isclose(line.row_s, 8_192 * 2 / 8 / 3.35e12, rel_tol=1e-12)


@given(
    st.sampled_from(DENSE),
    st.sampled_from(["h100-sxm", "h200", "b200", "a100-sxm"]),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 512),
    st.integers(0, 32768),
)
def test_line_is_the_no_overlap_sum_of_the_roofline_terms(mdl, chip, tp, batch, context):
    # second method: lib.perf.roofline.decode_step's memory and compute terms, added
    line = tput.decode_step_line(mdl, chip, context, tp)
    step = roofline.decode_step(mdl, chip, tp=tp, batch=batch, context=context)
    assert math.isclose(line.step_s(batch), step.memory_s + step.compute_s, rel_tol=1e-9)
    assert line.step_s(batch) >= step.time_s * (
        1 - 1e-12
    )  # an upper bound on the overlapped roofline


@given(st.floats(1e-5, 1.0), st.floats(1e-7, 1e-2), st.floats(0.0, 1e-2))
def test_knee_halves_the_ceiling_and_doubles_the_step(t0, kv, comp):
    line = tput.StepLine(t0, kv, comp)
    b = line.knee_batch
    assert math.isclose(line.throughput(b), line.ceiling_tokens_per_s / 2, rel_tol=1e-9)
    assert math.isclose(line.step_s(b), 2 * t0, rel_tol=1e-9)


@given(st.floats(1e-4, 0.1), st.floats(1e-6, 1e-3), st.floats(0.01, 0.99))
def test_batch_for_fraction_against_bisection(t0, c, f):
    line = tput.StepLine(t0, c, 0.0)
    lo, hi = 0.0, 1e12
    for _ in range(300):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if line.throughput(mid) < f * line.ceiling_tokens_per_s else (lo, mid)
    assert math.isclose(line.batch_for_fraction(f), lo, rel_tol=1e-6)


def test_batch_for_step_time_inverts_the_line():
    line = tput.StepLine(0.005, 1e-4, 2e-5)
    b = line.batch_for_step_time(0.02)
    assert math.isclose(line.step_s(b), 0.02, rel_tol=1e-12)
    with pytest.raises(ValueError, match="weight-read floor"):
        line.batch_for_step_time(0.001)


def test_kv_ceiling_published_numbers():
    # Llama 3.1 8B on one H100: 0.9 x 80 GB - 8.03e9 x 2 B = 55.9 GB free; 4096 tokens x 128 KiB = 537 MB per sequence
    free = 0.9 * 80e9 - model("llama-3.1-8b").params_total * 2
    assert tput.kv_batch_ceiling("llama-3.1-8b", "h100-sxm", 4096) == int(free // (4096 * 131_072))
    assert tput.kv_batch_ceiling("llama-3.1-8b", "h100-sxm", 4096) == 104


@given(
    st.sampled_from(DENSE),
    st.sampled_from(["h100-sxm", "h200", "b200"]),
    st.sampled_from([2, 4, 8]),
    st.integers(512, 65536),
)
def test_kv_ceiling_against_brute_force_allocation(mdl, chip, tp, context):
    m = model(mdl)
    budget = memory.kv_free_bytes_per_gpu(m, chip, tp, memory_utilization=0.9)  # the ceiling's default
    if budget < 0:
        with pytest.raises(ValueError, match="weights"):
            tput.kv_batch_ceiling(m, chip, context, tp)
        return
    per_seq = tput.kv_bytes_per_sequence_per_gpu(m, context, tp)
    n, used = 0, 0.0  # admit sequences one at a time until the next would not fit
    while used + per_seq <= budget and n < 10**6:
        used += per_seq
        n += 1
    assert tput.kv_batch_ceiling(m, chip, context, tp) == n


def test_compute_bound_batch_is_where_the_roofline_flips():
    # short context: per-sequence compute exceeds per-sequence KV read, so a finite batch flips it
    line = tput.decode_step_line("llama-3.1-8b", "h100-sxm", 128)
    b = tput.compute_bound_batch(line, "llama-3.1-8b", "h100-sxm", 128)
    below = roofline.decode_step("llama-3.1-8b", "h100-sxm", batch=math.floor(b), context=128)
    above = roofline.decode_step("llama-3.1-8b", "h100-sxm", batch=math.ceil(b) + 1, context=128)
    assert below.bound == "memory" and above.bound == "compute"
    # long context: each sequence's KV read outweighs its FLOPs, the tensor cores never bind
    line = tput.decode_step_line("llama-3.1-70b", "h100-sxm", 4096, tp=8)
    assert math.isinf(tput.compute_bound_batch(line, "llama-3.1-70b", "h100-sxm", 4096, tp=8))


def test_tensor_core_ceiling():
    m = model("llama-3.1-70b")
    x = tput.tensor_core_ceiling_tokens_per_s(m, "h100-sxm", 1024, tp=8)
    assert math.isclose(x, 8 * 989e12 / m.flops_per_token(1024), rel_tol=1e-12)


def test_smallest_tp_that_fits():
    # 70B BF16 = 141 GB: 2 x H100 hold 144 GB usable; one H200 holds 127 GB, so also 2
    assert tput.smallest_tp_that_fits("llama-3.1-70b", "h100-sxm") == 2
    assert tput.smallest_tp_that_fits("llama-3.1-70b", "h200") == 2
    assert tput.smallest_tp_that_fits("llama-3.1-70b", "h200", "fp8") == 1
    # 405B BF16 = 811 GB: 8 x 72 GB is too little, 16 GPUs hold it
    assert tput.smallest_tp_that_fits("llama-3.1-405b", "h100-sxm") == 16
    with pytest.raises(ValueError, match="does not fit"):
        tput.smallest_tp_that_fits("llama-3.1-405b", "l4", max_tp=8)


def test_validation_messages():
    with pytest.raises(ValueError, match="tp=3 must divide"):
        tput.decode_step_line("llama-3.1-8b", "h100-sxm", 1024, tp=3)
    with pytest.raises(ValueError, match="context"):
        tput.decode_step_line("llama-3.1-8b", "h100-sxm", -1)
    with pytest.raises(ValueError, match="bandwidth_efficiency"):
        tput.decode_step_line("llama-3.1-8b", "h100-sxm", 1024, bandwidth_efficiency=0)
    with pytest.raises(ValueError, match="raise tp or quantize"):
        tput.kv_batch_ceiling("llama-3.1-70b", "h100-sxm", 1024, tp=1)
    with pytest.raises(ValueError, match="fraction"):
        tput.StepLine(1e-3, 1e-5, 0).batch_for_fraction(1.0)
    with pytest.raises(ValueError, match="per-sequence"):
        tput.StepLine(1e-3, 0, 0)
    with pytest.raises(ValueError, match="batch"):
        tput.StepLine(1e-3, 1e-5, 0).step_s(-1)


@given(
    st.sampled_from(DENSE),
    st.sampled_from(["h100-sxm", "h200", "b200"]),
    st.sampled_from([1, 2, 4, 8]),
)
def test_balance_context_equalizes_kv_and_compute(mdl, chip, tp):
    ctx = tput.kv_compute_balance_context(mdl, chip, tp)
    lo, hi = math.floor(ctx), math.ceil(ctx) + 1
    below, above = (
        tput.decode_step_line(mdl, chip, lo, tp),
        tput.decode_step_line(mdl, chip, hi, tp),
    )
    assert below.kv_s + below.row_s <= below.compute_s and above.kv_s + above.row_s > above.compute_s
    assert math.isinf(tput.compute_bound_batch(above, mdl, chip, hi, tp))


def test_throughput_knee_view_uses_the_whole_per_sequence_cost():
    """The explorer's c is the lib's kv_s + row_s + compute_s (it once showed kv_s + compute_s)."""
    from lib.book import widgets
    from lib.units import fmt_time

    view = widgets.render("roofline.throughput_knee", model="llama-3.1-8b",
                          gpu="h100-sxm", tp=1, weight_dtype="bf16", kv_dtype="bf16", context=1, batch=64)
    line = tput.decode_step_line("llama-3.1-8b", "h100-sxm", 1, 1, "bf16", "bf16", "bf16")
    assert line.row_s > 0
    assert view.values["c"] == line.kv_s + line.row_s + line.compute_s
    assert view.values["ceiling"] == pytest.approx(1 / view.values["c"], rel=1e-12)
    shown = dict(view.rows)["c (per sequence: KV + embedding row + compute)"]
    assert fmt_time(line.row_s) in shown and shown.endswith(f"= {fmt_time(view.values['c'])}")
