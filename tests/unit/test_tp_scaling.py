"""lib.perf.tp_scaling: the decode step over TP degree, a view of lib.perf.step.decode_step.

Every time here is the one step model's; the tests hold the view to second methods (brute
force over degrees, the model itself at degrees the fit never saw) and to published figures.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.perf import tp_scaling as tps
from lib.perf.deployment import Deployment
from lib.perf.step import decode_step, step_assumptions

M70 = Deployment("llama-3.1-70b", "h100-sxm", tp=8)
DENSE = ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-72b"]


def test_weight_read_per_card_is_5_2_ms_for_70b_tp8_on_h100():
    # (70.6e9 parameters (Llama 3.1 70B model card) - the 128,256 x 8,192 embedding table, read
    # one row per step) x 2 B / 8 cards / 3.35 TB/s (NVIDIA H100 SXM datasheet)
    step, reason = tps.step_at(M70, 8)
    assert reason == ""
    assert math.isclose(step["weights"], (70.6e9 - 128_256 * 8_192) * 2 / 8 / 3.35e12, rel_tol=0.005)


def test_deployment_at_is_the_validated_record_when_valid():
    dep, reason = tps.deployment_at(M70, tp=4)
    assert reason == "" and dep == M70.replace(tp=4)


def test_deployment_at_prices_an_invalid_setup_as_hypothetical_with_the_reason():
    one, reason = tps.deployment_at(M70, tp=1)  # 141 GB of BF16 weights on one H100
    assert "no room for a KV cache" in reason
    with pytest.raises(ValueError):
        M70.replace(tp=1)
    three, reason3 = tps.deployment_at(M70, tp=3)
    assert "cannot shard" in reason3
    # the step model prices them; its sharded part is 1/n of TP1's (KV split by head), up to the
    # sampling kernels' logits read (counted in the shortfall, the same on every rank)
    s1, s3 = decode_step(one, 1, 2048), decode_step(three, 1, 2048)
    assert math.isclose(s3.sharded_s * 3, s1.sharded_s, rel_tol=1e-4)
    with pytest.raises(ValueError, match="tp must be"):
        tps.deployment_at(M70, tp=0)
    with pytest.raises(ValueError, match="unknown Deployment field"):
        tps.deployment_at(M70, bogus=1)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(DENSE), st.integers(1, 16), st.integers(0, 8192), st.sampled_from(["ring", "one_shot"]))
def test_fit_reproduces_the_model_at_degrees_it_never_saw(key, batch, context, algo):
    # second method: the step model itself at TP3, 5, 6, 7 against a / n + b + c n fitted at 2, 4, 8
    dep = Deployment(key, "h100-sxm", tp=8)
    assume = step_assumptions(allreduce_algorithm=algo)
    fit = tps.tp_cost_fit(dep, batch, context, assume)
    for n in (3, 5, 6, 7):
        if n > dep.mdl.num_kv_heads:
            continue  # past the KV heads the KV read stops shrinking: the form is piecewise
        model_s = tps.step_at(dep, n, batch, context, assume)[0].total_s
        if algo == "ring":
            assert math.isclose(fit.step_s(n), model_s, rel_tol=1e-9)
        else:  # the measured one-shot latency is piecewise linear in n: the fit is close, not exact
            assert math.isclose(fit.step_s(n), model_s, rel_tol=0.02)


def test_crossover_is_not_the_optimum_for_70b_tp8():
    # Issue 9: n* = 13.9 is where two costs are equal; the best TP of a/n + b + c n is sqrt(a/c) ~ 15.9.
    fit = tps.tp_cost_fit(M70, 1, 2048)
    n_x = tps.comm_crossover_tp(M70, 1, 2048)
    assert 13.0 < n_x < 14.5
    assert 15.5 < fit.optimum_tp < 16.5
    assert fit.optimum_tp > n_x
    # at the optimum the two moving terms are equal, at the crossover they are not
    assert math.isclose(fit.a_s / fit.optimum_tp, fit.c_s * fit.optimum_tp, rel_tol=1e-9)
    # second method for the optimum: brute force over real n on the fitted form
    grid = [1 + i / 1000 for i in range(60000)]
    brute = min(grid, key=fit.step_s)
    assert abs(brute - fit.optimum_tp) < 2e-3
    # c is the collective latency growth: 2L all-reduces x 2 hops x 0.6 us (NCCL tuning.cc)
    # plus the logits all-gather's one hop per GPU
    assert math.isclose(fit.c_s, (160 * 2 + 1) * 0.6e-6, rel_tol=1e-6)


def test_crossover_against_bisection_on_the_model():
    # second method: bisection on S(1)/n - C(n) with C priced by the model at integer n and
    # interpolated linearly between them
    s1 = tps.step_at(M70, 1, 1, 0)[0].sharded_s
    c = {n: tps.step_at(M70, n, 1, 0)[0].collective_s for n in range(2, 9)}
    n_x = tps.comm_crossover_tp(M70, 1, 0)
    # beyond 8 the fitted C(n) extrapolates; check the fit at the integer degrees instead
    fit_c = [c[n] for n in (2, 4, 8)]
    beta, a0, a1 = tps._fit3((2, 4, 8), fit_c)
    for n in range(2, 9):
        assert math.isclose(beta / n + a0 + a1 * n, c[n], rel_tol=1e-9)
    assert math.isclose(s1 / n_x, beta / n_x + a0 + a1 * n_x, rel_tol=1e-9)


def test_best_tp_is_the_minimum_over_deployable_degrees():
    best = tps.best_tp(M70, 1, 2048)
    assert best.tp == 8  # TP16 crosses nodes: every all-reduce pays the network
    assert best.steps[16] > best.steps[8]
    assert 1 in best.refused and 3 in best.refused  # does not fit; does not shard
    assert best.step_s == min(best.steps.values())
    # second method: each entry is the step model on the validated record
    for n, s in best.steps.items():
        assert s == decode_step(M70.replace(tp=n), 1, 2048).total_s
    assert best.runner_up[0] != 8


def test_speedup_curve_flags_hypothetical_points_and_is_sublinear():
    curve = tps.speedup_curve(M70, range(1, 9), 1, 2048)
    assert curve[0].speedup == 1.0 and not curve[0].valid and curve[0].reason
    assert [p.tp for p in curve if p.valid] == [2, 4, 8]
    assert [p.tp for p in curve if p.divides] == [1, 2, 4, 8]
    for p in curve[1:]:
        assert 1 < p.speedup < p.tp and 0 < p.efficiency < 1
    # about 4.4x over a (hypothetical) TP1 H100 at the central assumptions
    assert 4.0 < curve[-1].speedup < 5.0


def test_tp8_is_about_11_9_ms_for_70b_at_batch_1():
    # Issue 9's reference scenario: the one step model gives ~11.9 ms (was 13.4 / 10.9 / 11.8 by page)
    step, _ = tps.step_at(M70, 8, 1, 2048)
    assert 11.5e-3 < step.total_s < 12.3e-3


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: tps.speedup_curve(M70, []), "degrees"),
        (lambda: tps.tp_cost_fit(M70, degrees=(2, 4, 16)), "three different TP degrees"),
        (lambda: tps.tp_cost_fit(M70, degrees=(2, 2, 8)), "three different TP degrees"),
        (lambda: tps.candidate_degrees(M70, 0), "max_tp"),
        (lambda: tps.deployment_at("llama", tp=2), "Deployment"),
        (lambda: tps.plot_step_stack({}), "at least one"),
    ],
)
def test_bad_inputs_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_plots_return_figures():
    dep = Deployment("llama-3.1-8b", "h100-sxm", tp=8)
    steps = {"TP1": tps.step_at(dep, 1)[0], "TP8": tps.step_at(dep, 8)[0]}
    assert tps.plot_step_stack(steps).axes
    assert tps.plot_speedup(tps.speedup_curve(dep)).axes


# ---- the explorers of lib/explorers/roofline_tp.py (I001, N042, W06, I005, I103) ---------------

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
    from lib.book import widgets

    exp = widgets.get(name)

    @settings(max_examples=25, deadline=None)
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
        "roofline.tp_decode_step", model="llama-3.1-70b", gpu="h100-sxm", tp=8, batch=1, context=2048,
        weight_dtype="bf16", kv_dtype="bf16", allreduce="ring", level="central", cuda_graphs="yes",
    )
    step = decode_step(M70, 1, 2048)
    assert view.values["total"] == step.total_s and "hypothetical" in view.note
    assert view.svg().startswith("<svg ") and view.svg() in view._repr_html_()


def test_explorers_refuse_a_kv_cache_that_does_not_fit():
    from lib.book import widgets

    view = widgets.render(
        "roofline.tp_decode_step", model="llama-3.1-70b", gpu="h100-sxm", tp=2, batch=256, context=131072,
        weight_dtype="bf16", kv_dtype="bf16", allreduce="ring", level="central", cuda_graphs="yes",
    )
    assert isinstance(view, widgets.ErrorView) and "KV cache holds" in view.message


def test_require_serves_refuses_a_context_past_the_window_and_a_batch_the_cache_cannot_hold():
    dep = Deployment("llama-2-7b", "h100-sxm")
    assert tps.require_serves(dep, 1, 4096) is dep
    with pytest.raises(ValueError, match="4,096-token window"):
        tps.require_serves(dep, 1, 4097)
    room = dep.budget.max_concurrency(4096)
    with pytest.raises(ValueError, match="KV cache holds"):
        tps.require_serves(dep, math.ceil(room) + 1, 4096)


def test_group_link_names_the_vendor_fabric_and_the_network_beyond_a_node():
    assert tps.group_link(Deployment("llama-3.1-70b", "h100-sxm", tp=8)) == "NVLink"
    assert tps.group_link(Deployment("qwen2.5-72b", "mi300x", tp=8)) == "Infinity Fabric"
    assert tps.group_link(Deployment("llama-3.1-8b", "l40s", tp=4)) == "PCIe"
    assert tps.group_link(Deployment("llama-3.1-70b", "h100-sxm", tp=16)).endswith("the network between nodes")
    assert tps.group_link(Deployment("llama-3.1-8b", "h100-sxm")) == ""


def test_optimum_of_a_fit_where_nothing_shards_is_one_gpu():
    fit = tps.TPCostFit(-1e-3, 5e-3, 1e-4, (2, 4, 8))
    assert fit.optimum_tp == 1.0
    assert fit.optimum_step_s == fit.step_s(1.0)
    assert math.isinf(tps.TPCostFit(1e-3, 5e-3, -1e-6, (2, 4, 8)).optimum_tp)
