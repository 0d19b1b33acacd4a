"""lib.perf.gaps: the trace partitions the step, the closed form agrees with the trace, and the default
assumptions reproduce published batch-1 measurements (gpt-fast)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.book import widgets
from lib.perf import decode_kernels as dk
from lib.perf import gaps
from lib.perf import roofline as rf
from lib.perf.moe import expected_experts_touched
from lib.registry.models import model

DENSE = ("llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "llama-2-70b", "qwen2.5-72b", "gpt3-175b")


@settings(max_examples=60)
@given(
    st.sampled_from(DENSE),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 64),
    st.integers(1, 32768),
    st.sampled_from(dk.FUSION_LEVELS),
    st.sampled_from([None, 0.0, 5e-6, 30e-6]),
)
def test_buckets_partition_the_step(key, tp, batch, context, fusion, cpu):
    ov = gaps.default_overheads(fusion=fusion, cpu_launch_s=cpu)
    trace = gaps.decode_trace(key, "h100-sxm", tp, batch, context, overheads=ov)
    b = gaps.attribute_trace(trace)
    assert math.isclose(sum(b.values()), trace.step_s, rel_tol=1e-12)
    assert all(v >= -1e-15 for v in b.values())


@settings(max_examples=60)
@given(
    st.sampled_from(DENSE),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 64),
    st.integers(1, 32768),
    st.sampled_from(dk.FUSION_LEVELS),
)
def test_closed_form_equals_the_trace_attribution(key, tp, batch, context, fusion):
    # Second method: the same buckets from formulas, without laying out a timeline.
    ov = gaps.default_overheads(fusion=fusion)
    b = gaps.attribute_trace(gaps.decode_trace(key, "h100-sxm", tp, batch, context, overheads=ov))
    cf = gaps.gap_buckets_closed_form(key, "h100-sxm", tp, batch, context, overheads=ov)
    for k in b:
        assert math.isclose(b[k], cf[k], rel_tol=1e-9, abs_tol=1e-15), k


def test_eager_with_free_launches_equals_graph_replay_and_costly_launches_open_gaps():
    graph = gaps.decode_trace("llama-3.1-8b", "h100-sxm", overheads=gaps.default_overheads())
    free = gaps.decode_trace(
        "llama-3.1-8b", "h100-sxm", overheads=gaps.default_overheads(cpu_launch_s=0.0)
    )
    slow = gaps.decode_trace(
        "llama-3.1-8b", "h100-sxm", overheads=gaps.default_overheads(cpu_launch_s=20e-6)
    )
    assert math.isclose(graph.step_s, free.step_s, rel_tol=1e-12)
    assert gaps.attribute_trace(slow)["launch_gaps"] > gaps.attribute_trace(graph)["launch_gaps"]
    # a CPU-bound step can never beat launches x per-launch cost
    assert slow.step_s >= slow.host_end_s + len(slow.events) * 20e-6


def test_weight_floor_is_the_matmul_parameters():
    # Second method from lib.registry.models: matmul params (incl. LM head) x 2 B / tp / W.
    m = model("llama-3.1-70b")
    expected = m.matmul_params_active * 2 / 8 / 3.35e12
    assert math.isclose(gaps.weight_floor_s(m, "h100-sxm", 8), expected, rel_tol=1e-12)
    # and it sits below lib.perf.roofline's floor by exactly what non-GEMM kernels read: the norm
    # weights and the one embedding row (the roofline no longer counts the embedding table)
    diff = rf.decode_step(m, "h100-sxm", 8).memory_s - expected
    assert math.isclose(diff, (m.params_norm + m.hidden_size) * 2 / 8 / 3.35e12, rel_tol=1e-9)


# gpt-fast README (pytorch-labs/gpt-fast @ 0f925b5): 8xA100-80GB at 330 W, batch 1, 5-token
# prompt, torch.compile (CUDA graphs), no per-token host sync in the generate loop.
GPT_FAST = [
    ("llama-2-7b", 1, 104.9),
    ("llama-2-7b", 2, 168.84),
    ("llama-2-7b", 4, 254.02),
    ("llama-2-7b", 8, 328.43),
    ("llama-2-70b", 8, 62.50),
]


@pytest.mark.parametrize("key,tp,tokens_per_s", GPT_FAST)
def test_default_assumptions_reproduce_gpt_fast_within_12_percent(key, tp, tokens_per_s):
    ov = gaps.default_overheads(host_step_s=0.0, host_sync_s=0.0)
    trace = gaps.decode_trace(key, "a100-sxm", tp, 1, 100, overheads=ov)
    assert math.isclose(1 / trace.step_s, tokens_per_s, rel_tol=0.12), (key, tp, 1 / trace.step_s)


def test_gpt_fast_whole_step_bandwidth_is_below_the_empirical_peak():
    # README: Llama-2-7B moves 1397 GB/s effective against ~1700 GB/s empirical peak.
    measured = gaps.assumption("efficiency", "gpt_fast_whole_step_bandwidth_gbps") * 1e9
    assert measured < gaps.assumption("efficiency", "hbm_streaming") * 2.039e12


def test_prefill_tokens_per_step_and_waterfall_identity():
    assert gaps.prefill_tokens_per_step(32, 2000, 250) == 256
    ov = gaps.default_overheads()
    rows = gaps.plan_waterfall("llama-3.1-70b", "h100-sxm", 8, 32, 2125, 2000, 250, overheads=ov)
    trace = gaps.decode_trace("llama-3.1-70b", "h100-sxm", 8, 32, 2125, overheads=ov)
    d = dict(rows)
    assert d["clock throttling (compute-bound part)"] == 0.0  # clock_fraction = 1
    total = sum(v for _, v in rows)
    assert math.isclose(total, trace.step_s + d["prefill mixed into each step"], rel_tol=1e-12)
    slow = dict(
        gaps.plan_waterfall(
            "llama-3.1-70b", "h100-sxm", 8, 32, 2125, 2000, 250, overheads=ov, clock_fraction=0.8
        )
    )
    assert slow["clock throttling (compute-bound part)"] >= 0.0


def test_prefill_spike_by_hand():
    # 2048 prompt tokens with 32 decoders on TP8 H100: compute-bound, so the step grows by
    # (decode + chunk FLOPs) / achieved rate - weight time.
    m = model("llama-3.1-70b")
    ov = gaps.default_overheads()
    rate = ov.flops_efficiency * 989e12  # H100 SXM dense BF16 (NVIDIA datasheet: 1,979 sparse / 2)
    w = gaps.weight_floor_s(m, "h100-sxm", 8) / ov.hbm_efficiency
    f = (32 * m.weight_flops_per_token() + 2048 * m.prefill_flops(2048) / 2048) / 8
    assert math.isclose(
        gaps.prefill_chunk_spike(m, "h100-sxm", 8, 32, 2048, 2048), f / rate - w, rel_tol=1e-9
    )
    assert gaps.prefill_chunk_spike(m, "h100-sxm", 8, 32, 0, 2048) == 0.0


def test_expert_load_imbalance_against_exact_cases():
    # every token visits every expert: no imbalance
    assert gaps.expert_load_imbalance(8, 8, 16)["ratio"] == 1.0
    r = gaps.expert_load_imbalance(8, 2, 64, trials=4000, seed=1)
    assert r["mean"] == 16 and r["ratio"] > 1.0
    # Second method on a related quantity: the fraction of trials an expert is idle matches
    # the closed form behind lib.perf.moe (1 - k/E)^B, through E[distinct experts].
    one = gaps.expert_load_imbalance(64, 2, 1)
    assert one["max"] == 1.0  # one token: each of its 2 experts gets exactly 1
    assert math.isclose(expected_experts_touched(8, 2, 64), 8.0, rel_tol=1e-6)


@pytest.mark.parametrize("e,k,expected_max", [(4, 1, 1.25), (8, 2, 41 / 28), (3, 2, 2.0)])
def test_expert_load_max_against_enumeration(e, k, expected_max):
    # Two tokens. E=4, k=1: both on one expert w.p. 1/4 -> E[max] = 1.25. E=8, k=2: they share an
    # expert w.p. 1 - C(6,2)/C(8,2) = 13/28 -> 41/28. E=3, k=2: any two 2-subsets of 3 overlap -> 2.
    # Covers both sampling paths (rejection for k <= E/4, k-smallest uniforms otherwise).
    r = gaps.expert_load_imbalance(e, k, 2, trials=20000, seed=3)
    assert math.isclose(r["max"], expected_max, rel_tol=0.01)


def test_l2_fraction():
    assert gaps.l2_resident_fraction(10e6, "h100-sxm") == 1.0
    assert math.isclose(gaps.l2_resident_fraction(100e6, "h100-sxm"), 0.5)


@pytest.mark.parametrize(
    "field,value",
    [
        ("hbm_efficiency", 0.0),
        ("hbm_efficiency", 1.5),
        ("kernel_fixed_s", -1.0),
        ("sampling_kernels", 0),
        ("fusion", "max"),
        ("cpu_launch_s", -1e-6),
    ],
)
def test_invalid_overheads_raise(field, value):
    with pytest.raises(ValueError, match=field):
        gaps.default_overheads(**{field: value})


def test_unknown_override_and_assumption_raise():
    with pytest.raises(ValueError, match="unknown overhead"):
        gaps.default_overheads(bandwidth=1.0)
    with pytest.raises(ValueError, match="no 'nope'"):
        gaps.assumption("efficiency", "nope")
    with pytest.raises(ValueError, match="section"):
        gaps.assumption("sources", "x")


def test_tp_without_nvlink_raises():
    with pytest.raises(ValueError, match="NVLink"):
        gaps.decode_trace("llama-3.1-8b", "l4", 2)


def test_trace_figure_draws():
    trace = gaps.decode_trace("llama-3.1-8b", "h100-sxm")
    fig = gaps.trace_figure(trace, layers=1)
    assert len(fig.axes) == 2


@pytest.mark.parametrize("name", ["roofline.batch1_gap", "roofline.where_it_breaks"])
def test_gap_explorers_return_a_view_or_a_value_error(name, fuzz_explorer):
    fuzz_explorer(name)


def test_batch1_gap_explorer_defaults():
    view = widgets.render(
        "roofline.batch1_gap",
        model="llama-3.1-70b",
        gpu="h100-sxm",
        tp=8,
        context=4096,
        cuda_graphs=True,
        fusion="partial",
        hbm_efficiency=0.834,
        allreduce_us=16.7,
        host_step_us=400.0,
    )
    v = view.values
    assert math.isclose(sum(v[k] for k in ("floor",) + gaps.BUCKETS), v["step"], rel_tol=1e-12)
