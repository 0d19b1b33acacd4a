"""lib.book.widgets (registry, error views) and lib.book.check (self-check verdicts)."""

import pytest

from lib.book import widgets
from lib.book.check import self_check


def test_registry_finds_the_roofline_explorers():
    reg = widgets.registry()
    assert {"roofline.decode_floor", "roofline.ridge_point", "roofline.prefill_crossover"} <= set(reg)


def test_render_turns_valueerror_into_a_message():
    view = widgets.render("roofline.ridge_point", gpu="a100-sxm", dtype="fp8", m=1, m_prefill=4096, n=8192, k=8192)
    assert isinstance(view, widgets.ErrorView)
    assert "no 'fp8'" in view.message
    assert "Traceback" not in view._repr_html_()


def test_render_rejects_unknown_inputs():
    view = widgets.render("roofline.ridge_point", gpu="h100-sxm", dtype="bf16", m=1, m_prefill=4096, n=1, k=1, bogus=3)
    assert isinstance(view, widgets.ErrorView) and "bogus" in view.message


def test_decode_floor_view_values_match_lib():
    from lib.perf import roofline
    from lib.perf.deployment import Deployment
    from lib.perf.step import decode_step, step_assumptions

    view = widgets.render("roofline.decode_floor", model="llama-3.1-70b", gpu="h100-sxm", tp=8,
                          weight_dtype="bf16", kv_dtype="bf16", batch=1, context=1,
                          bandwidth_efficiency=1.0, cuda_graphs=True, allreduce_algorithm="ring")
    step = decode_step(Deployment("llama-3.1-70b", "h100-sxm", tp=8), 1, 1,
                       step_assumptions(gemv_efficiency=1.0, kv_efficiency=1.0))
    assert view.values["total"] == step.total_s  # a view of the one step model
    assert view.values["weights"] == pytest.approx(roofline.decode_step("llama-3.1-70b", "h100-sxm", 8).memory_s,
                                                   rel=0.02)
    assert view.svg().startswith("<svg ") and view.svg() in view._repr_html_()


def test_model_that_does_not_fit_is_a_clear_message():
    view = widgets.render("roofline.decode_floor", model="llama-3.1-405b", gpu="l4", tp=1,
                          weight_dtype="bf16", kv_dtype="bf16", batch=1, context=0,
                          bandwidth_efficiency=1.0, cuda_graphs=True, allreduce_algorithm="ring")
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


# Llama 3.1 8B in BF16 on one L4 with a 32k-token prompt: the memory budget holds no BF16 KV cache
# of that length beside the weights, but an FP8 one. The prefill explorers must size (and time) the
# KV in its own dtype.
_KV_CASE = dict(model="llama-3.1-8b", gpu="l4", dtype="bf16", prompt_len=32768, mfu=0.5)


@pytest.mark.parametrize(("name", "tp_arg", "extra"), [
    ("roofline.prefill_crossover", "tp", {}),
    ("roofline.prefill_floor", "n_gpus", {"include_attention": True}),
])
def test_prefill_explorers_size_the_kv_in_the_kv_dtype(name, tp_arg, extra):
    args = {**_KV_CASE, tp_arg: 1, **extra}
    assert isinstance(widgets.render(name, **args, kv_dtype="bf16"), widgets.ErrorView)
    assert isinstance(widgets.render(name, **args, kv_dtype="fp8"), widgets.View)


def test_prefill_explorer_times_match_lib_with_an_fp8_kv_cache():
    from lib.perf import prefill, roofline
    from lib.perf.deployment import Deployment

    # a short prompt on 8 GPUs is memory-bound, so the KV written moves the time
    view = widgets.render("roofline.prefill_crossover", model="llama-3.1-70b", gpu="h100-sxm", tp=8,
                          dtype="bf16", kv_dtype="fp8", prompt_len=64, mfu=0.5)
    step = roofline.prefill("llama-3.1-70b", "h100-sxm", 64, 8, 1, "bf16", "bf16", "fp8")
    assert step.memory_s > step.compute_s / 0.5
    assert view.values["floor"] == step.memory_s
    assert view.values["floor"] < roofline.prefill("llama-3.1-70b", "h100-sxm", 64, 8).memory_s
    # the TTFT it shows is THE prefill time: the floor plus the TP all-reduces, charged once
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=8, kv_dtype="fp8")
    assert view.values["ttft"] == prefill.prefill_time(dep, 64, mfu=0.5).time_s

    view = widgets.render("roofline.prefill_floor", model="llama-3.1-70b", gpu="h100-sxm", n_gpus=8,
                          dtype="bf16", kv_dtype="fp8", prompt_len=64, mfu=0.5, include_attention=True)
    est = prefill.prefill_estimate("llama-3.1-70b", "h100-sxm", 64, 8, 0.5, "bf16", "bf16", "fp8")
    assert est.bound == "memory" and view.values["floor_s"] == est.time_s
    assert view.values["prefill_s"] == prefill.prefill_time(dep, 64, mfu=0.5).time_s
    assert est.time_s < prefill.prefill_estimate("llama-3.1-70b", "h100-sxm", 64, 8, 0.5).time_s


def test_self_check_hint_comes_from_the_page_metadata(monkeypatch):
    """page= shows the notebook's interview.self_check_hint after a miss, never before trying."""
    from lib.book import domain

    monkeypatch.setattr(domain, "notebook_metadata", lambda slug: {"self_check_hint": f"hint of {slug}"})
    assert "hint of p" in self_check(50, 5.27, "ms", page="p").message
    assert "hint of" not in self_check(None, 5.27, "ms", page="p").message
    assert "hint of" not in self_check(5.27, 5.27, "ms", page="p").message
    with pytest.raises(ValueError, match="hint or page"):
        self_check(50, 5.27, hint="h", page="p")
    monkeypatch.setattr(domain, "notebook_metadata", lambda slug: {})
    with pytest.raises(ValueError, match="self_check_hint"):
        self_check(50, 5.27, page="p")
