"""lib.perf.tpdecode: the tensor-parallel decode step against published figures and second methods."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import collectives as comms
from lib.perf import roofline, tpdecode
from lib.registry.hardware import gpu
from lib.registry.models import model

DENSE = ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b", "llama-2-70b"]


def _bare(**changes):
    """A stack with every overhead off (pure roofline), then ``changes``."""
    base = dict(
        gemv_efficiency=1.0,
        kv_efficiency=1.0,
        small_kernel_s=0.0,
        launch_gap_s=0.0,
        sampling_s=0.0,
        scheduler_s=0.0,
    )
    return tpdecode.assumptions().replace(**(base | changes))


def test_weight_read_per_card_is_5_2_ms_for_70b_tp8_on_h100():
    # (70.6e9 parameters (Llama 3.1 70B model card) - the 128,256 x 8,192 embedding table, read
    # one row per step) x 2 B / 8 cards / 3.35 TB/s (NVIDIA H100 SXM datasheet)
    step = tpdecode.decode_step("llama-3.1-70b", "h100-sxm", tp=8)
    assert math.isclose(step["weights"], (70.6e9 - 128_256 * 8_192) * 2 / 8 / 3.35e12, rel_tol=0.005)
    assert math.isclose(step["weights"], 5.2e-3, rel_tol=0.01)


def test_counts_160_allreduces_and_hundreds_of_kernels():
    step = tpdecode.decode_step("llama-3.1-70b", "h100-sxm", tp=8)
    assert step.n_allreduces == 2 * 80
    # vLLM's Llama layer: 4 GEMMs + 5 small kernels + attention + 2 all-reduces = 12, plus 8 per step
    assert step.n_kernels == 80 * 12 + 8
    assert (
        tpdecode.decode_step("llama-3.1-70b", "h100-sxm", tp=1, strict=False).n_kernels
        == 80 * 10 + 8
    )


def test_nccl_ring_latency_model():
    # NCCL tuning.cc (nccl #1334): baseLat 6.6 us + 2 (n - 1) x 0.6 us
    assert math.isclose(tpdecode.allreduce_latency_s(8), 15.0e-6, rel_tol=1e-12)
    assert math.isclose(tpdecode.allreduce_latency_s(2), 7.8e-6, rel_tol=1e-12)
    assert tpdecode.allreduce_latency_s(1) == 0.0


def test_one_shot_latency_hits_the_measured_points_and_interpolates():
    # sglang PR #2904, H100, 32 KB: 4.5 / 4.8 / 7.8 us at TP 2 / 4 / 8
    for n, us in ((2, 4.5), (4, 4.8), (8, 7.8)):
        assert math.isclose(tpdecode.allreduce_latency_s(n, "one-shot"), us * 1e-6, rel_tol=1e-12)
    assert math.isclose(tpdecode.allreduce_latency_s(6, "one-shot"), 6.3e-6, rel_tol=1e-12)
    assert math.isclose(
        tpdecode.allreduce_latency_s(16, "one-shot"), (7.8 + 0.75 * 8) * 1e-6, rel_tol=1e-12
    )
    assert tpdecode.allreduce_latency_s(16, "network") == pytest.approx(46e-6)


@given(st.integers(2, 64))
def test_latency_models_grow_with_gpus(n):
    for alg in ("nccl-ring-ll", "one-shot"):
        assert tpdecode.allreduce_latency_s(n + 1, alg) > tpdecode.allreduce_latency_s(n, alg)


@given(
    st.sampled_from(DENSE), st.sampled_from([1, 2, 4, 8]), st.integers(1, 64), st.integers(0, 32768)
)
def test_floor_equals_lib_roofline_decode_step(key, tp, batch, context):
    # second method: lib.perf.roofline.decode_step computes the same bytes / bandwidth independently
    step = tpdecode.decode_step(key, "h100-sxm", tp, batch, context)
    ref = roofline.decode_step(key, "h100-sxm", tp, batch, context)
    assert math.isclose(step.floor_s, ref.memory_s, rel_tol=1e-9)


@given(
    st.sampled_from([2, 4, 8]),
    st.integers(1, 64),
    st.floats(0.3, 1.0),
    st.floats(0, 50e-6),
    st.floats(0, 10e-6),
)
def test_buckets_agree_with_decode_step_breakdown(tp, batch, eff, latency, launch):
    # second method: lib.perf.roofline.decode_step_breakdown with the same flat assumptions
    stack = _bare(
        gemv_efficiency=eff,
        kv_efficiency=eff,
        launch_gap_s=launch,
        kernels_per_step=0,
        link_efficiency=1.0,
        allreduce_latency_override_s=latency,
    )
    step = tpdecode.decode_step("llama-3.1-70b", "h100-sxm", tp, batch, 4096, stack=stack)
    ref = roofline.decode_step_breakdown(
        "llama-3.1-70b",
        "h100-sxm",
        tp,
        batch,
        4096,
        bandwidth_efficiency=eff,
        allreduce_latency_s=latency,
        kernels_per_layer=12,
        launch_overhead_s=launch,
    )
    assert math.isclose(step["weights"], ref["weights"], rel_tol=1e-9)
    assert math.isclose(step["kv_cache"], ref["kv_cache"], rel_tol=1e-9, abs_tol=1e-15)
    shortfall = step["weight_bandwidth_shortfall"] + step["kv_bandwidth_shortfall"]
    assert math.isclose(shortfall, ref["bandwidth_shortfall"], rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(step.allreduce_s, ref["allreduce"], rel_tol=1e-9)
    assert math.isclose(step["launch_gaps"], ref["launches"], rel_tol=1e-9, abs_tol=1e-15)


def test_allreduce_bucket_is_calls_times_alpha_beta():
    stack = tpdecode.assumptions()
    step = tpdecode.decode_step("llama-3.1-70b", "h100-sxm", 8, batch=4, stack=stack)
    one = comms.ring_allreduce_time_s(4 * 8192 * 2, 8, 450e9 * stack.link_efficiency, 15.0e-6)
    assert math.isclose(step.allreduce_s, 160 * one, rel_tol=1e-9)


def test_central_step_lands_in_the_9_to_12_ms_band_and_range_brackets_it():
    steps = {
        lvl: tpdecode.decode_step(
            "llama-3.1-70b", "h100-sxm", 8, 1, 2048, stack=tpdecode.assumptions(lvl)
        )
        for lvl in tpdecode.LEVELS
    }
    assert 9e-3 <= steps["central"].total_s <= 12e-3
    assert steps["optimistic"].total_s < steps["central"].total_s < steps["pessimistic"].total_s


@given(st.sampled_from(DENSE), st.sampled_from([2, 4, 8]), st.integers(1, 32), st.integers(0, 8192))
def test_sharded_part_shrinks_exactly_as_one_over_tp(key, tp, batch, context):
    one = tpdecode.decode_step(key, "h100-sxm", 1, batch, context, strict=False)
    many = tpdecode.decode_step(key, "h100-sxm", tp, batch, context)
    assert math.isclose(many.sharded_s * tp, one.sharded_s, rel_tol=1e-9)
    assert many.fixed_s >= one.fixed_s  # all-reduces only add


@given(st.sampled_from(DENSE), st.sampled_from(tpdecode.LEVELS))
def test_speedup_is_sublinear_and_grows_to_8(key, level):
    curve = tpdecode.speedup_curve(key, "h100-sxm", range(1, 9), stack=tpdecode.assumptions(level))
    assert curve[0].speedup == 1.0
    for p in curve[1:]:
        assert 1 < p.speedup < p.tp and 0 < p.efficiency < 1
    assert [p.tp for p in curve if p.divides] == [1, 2, 4, 8]


def test_tp8_speedup_is_about_5x_on_the_same_chip_and_below_4x_against_h200():
    stack = tpdecode.assumptions()
    curve = tpdecode.speedup_curve("llama-3.1-70b", "h100-sxm", [8], context=2048, stack=stack)
    assert 4.0 < curve[0].speedup < 5.5
    h200 = tpdecode.decode_step("llama-3.1-70b", "h200", 1, 1, 2048, stack=stack)
    vs_h200 = tpdecode.speedup_curve(
        "llama-3.1-70b", "h100-sxm", [8], context=2048, stack=stack, reference=h200
    )
    assert 3.0 < vs_h200[0].speedup < 4.0
    assert not tpdecode.speedup_curve("llama-3.1-70b", "h100-sxm", [1])[0].fits  # 141 GB > 80 GB


@given(st.sampled_from(["nccl-ring-ll", "one-shot", "network"]), st.sampled_from(DENSE))
def test_comm_crossover_against_bisection(alg, key):
    stack = tpdecode.assumptions().replace(allreduce_algorithm=alg)
    n_star = tpdecode.comm_crossover_tp(key, "h100-sxm", stack=stack)
    m, g = model(key), gpu("h100-sxm")
    # weights streamed at batch 1: every parameter but the embedding table, plus its one row
    streamed = m.params_total - m.vocab_size * m.hidden_size + m.hidden_size
    t_w = streamed * 2 / (stack.gemv_efficiency * g.memory_bandwidth)
    n_ar = m.num_layers * 2

    def alpha(n):  # continuous version of each latency model, from the published numbers
        if alg == "nccl-ring-ll":
            return (6.6 + 2 * (n - 1) * 0.6) * 1e-6
        if alg == "network":
            return 46e-6
        pts = [(2, 4.5), (4, 4.8), (8, 7.8)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            if n <= x1:
                return (y0 + (y1 - y0) * (n - x0) / (x1 - x0)) * 1e-6
        return (7.8 + 0.75 * (n - 8)) * 1e-6

    lo, hi = 1.0, 1e5
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_w / mid > n_ar * alpha(mid) else (lo, mid)
    assert math.isclose(n_star, lo, rel_tol=1e-4)


def test_mla_kv_is_read_by_every_rank():
    assert tpdecode.kv_read_fraction("deepseek-v3", 8) == 1.0
    assert tpdecode.kv_read_fraction("llama-3.1-70b", 16) == 1 / 8
    assert tpdecode.kv_read_fraction("llama-3.1-70b", 3) == 1 / 3


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(tp=3), "cannot shard"),
        (dict(tp=0), "tp must be"),
        (dict(batch=0), "batch must be"),
        (dict(context=-1), "context must be"),
        (dict(chip="l4", tp=2), "no NVLink-class link"),
    ],
)
def test_bad_inputs_are_clear_errors(bad, match):
    args = dict(mdl="llama-3.1-70b", chip="h100-sxm", tp=8) | bad
    with pytest.raises(ValueError, match=match):
        tpdecode.decode_step(**args)


def test_bad_assumptions_are_clear_errors():
    with pytest.raises(ValueError, match="gemv_efficiency"):
        tpdecode.assumptions().replace(gemv_efficiency=0)
    with pytest.raises(ValueError, match="unknown assumption"):
        tpdecode.assumptions().replace(bogus=1)
    with pytest.raises(ValueError, match="level must be"):
        tpdecode.assumptions("typical")
    with pytest.raises(ValueError, match="algorithm must be"):
        tpdecode.allreduce_latency_s(8, "tree")
    with pytest.raises(ValueError, match="degrees"):
        tpdecode.speedup_curve("llama-3.1-70b", "h100-sxm", [])


def test_eager_launches_cost_milliseconds():
    graph = tpdecode.decode_step("llama-3.1-70b", "h100-sxm", 8)
    eager = tpdecode.decode_step(
        "llama-3.1-70b",
        "h100-sxm",
        8,
        stack=tpdecode.assumptions().replace(launch_gap_s=tpdecode.eager_launch_gap_s()),
    )
    assert math.isclose(eager["launch_gaps"] - graph["launch_gaps"], 968 * 4e-6, rel_tol=1e-9)


def test_plots_return_figures():
    steps = {
        "TP1": tpdecode.decode_step("llama-3.1-8b", "h100-sxm", 1),
        "TP8": tpdecode.decode_step("llama-3.1-8b", "h100-sxm", 8),
    }
    assert tpdecode.plot_step_stack(steps).axes
    assert tpdecode.plot_speedup(tpdecode.speedup_curve("llama-3.1-8b", "h100-sxm")).axes


# ---- the explorers of lib/explorers/roofline_tp.py (N042, W06, I005, I103) ----------------------

MY_EXPLORERS = (
    "roofline.tp_decode_step",
    "roofline.ffn_cost",
    "roofline.mbu_diagnosis",
    "roofline.mbu_pitfalls",
)


def _domain_strategy(domain):
    from lib.book.widgets import Choice, IntRange

    if isinstance(domain, Choice):
        return st.sampled_from(domain.options)
    if isinstance(domain, IntRange):
        return st.integers(domain.low, domain.high)
    return st.floats(domain.low, domain.high)


@pytest.mark.parametrize("name", MY_EXPLORERS)
def test_explorers_return_a_view_or_a_message_for_any_input(name):
    from hypothesis import settings

    from lib.book import widgets

    exp = widgets.get(name)

    @settings(max_examples=25)
    @given(st.fixed_dictionaries({a: _domain_strategy(d) for a, d in exp.domains.items()}))
    def run(kwargs):
        view = widgets.render(name, **kwargs)
        assert isinstance(view, widgets.View | widgets.ErrorView)
        if isinstance(view, widgets.ErrorView):
            assert view.message

    run()


def test_tp_decode_view_values_match_lib():
    from lib.book import widgets

    view = widgets.render(
        "roofline.tp_decode_step",
        model="llama-3.1-70b",
        gpu="h100-sxm",
        tp=8,
        batch=1,
        context=2048,
        weight_dtype="bf16",
        allreduce="nccl-ring-ll",
        level="central",
        cuda_graphs="yes",
    )
    step = tpdecode.decode_step("llama-3.1-70b", "h100-sxm", 8, 1, 2048)
    assert view.values["total"] == step.total_s and "hypothetical" in view.note
    assert view.svg().startswith("<svg ") and view.svg() in view._repr_html_()
