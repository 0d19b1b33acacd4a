"""lib.widgets (registry, error views) and lib.check (self-check verdicts)."""

import pytest

from lib import widgets
from lib.check import self_check


def test_registry_finds_the_roofline_explorers():
    reg = widgets.registry()
    assert {"roofline.decode_floor", "roofline.ridge_point", "roofline.prefill_crossover"} <= set(reg)


def test_render_turns_valueerror_into_a_message():
    view = widgets.render("roofline.ridge_point", gpu="a100-sxm", dtype="fp8", m=1, n=8192, k=8192)
    assert isinstance(view, widgets.ErrorView)
    assert "no 'fp8'" in view.message
    assert "Traceback" not in view._repr_html_()


def test_render_rejects_unknown_inputs():
    view = widgets.render("roofline.ridge_point", gpu="h100-sxm", dtype="bf16", m=1, n=1, k=1, bogus=3)
    assert isinstance(view, widgets.ErrorView) and "bogus" in view.message


def test_decode_floor_view_values_match_lib():
    from lib import roofline

    view = widgets.render("roofline.decode_floor", model="llama-3.1-70b", gpu="h100-sxm", tp=8,
                          weight_dtype="bf16", kv_dtype="bf16", batch=1, context=0,
                          bandwidth_efficiency=1.0, allreduce_latency_us=0.0, kernels_per_layer=0,
                          launch_overhead_us=0.0)
    assert view.values["weights"] == roofline.decode_step("llama-3.1-70b", "h100-sxm", 8).memory_s
    assert view.svg().startswith("<svg ") and view.svg() in view._repr_html_()


def test_model_that_does_not_fit_is_a_clear_message():
    view = widgets.render("roofline.decode_floor", model="llama-3.1-405b", gpu="l4", tp=1,
                          weight_dtype="bf16", kv_dtype="bf16", batch=1, context=0,
                          bandwidth_efficiency=1.0, allreduce_latency_us=0.0, kernels_per_layer=0,
                          launch_overhead_us=0.0)
    assert isinstance(view, widgets.ErrorView) and "per GPU" in view.message


def test_unknown_explorer():
    with pytest.raises(ValueError, match="valid names"):
        widgets.get("nope")


def test_self_check_verdicts():
    assert self_check(None, 5.27, "ms").ok is None
    assert self_check(5.0, 5.27, "ms", rel_tol=0.1).ok is True
    miss = self_check(50, 5.27, "ms", hint="divide by 8")
    assert miss.ok is False and "too high" in miss.message and "5.27" not in miss.message
    assert "too low" in self_check(0.5, 5.27).message
    with pytest.raises(ValueError, match="rel_tol"):
        self_check(1, 1, rel_tol=0)
