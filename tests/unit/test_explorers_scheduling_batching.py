"""The batching explorers show lib's numbers: each view's values against the lib function it calls."""

import pytest

from lib.book.widgets import View, render
from lib.perf import throughput
from lib.perf.deployment import Deployment
from lib.scheduling import LogNormal, step_cost
from lib.scheduling.batching import continuous_gain, free_prefill_tokens, resident_kv_tokens

DEP = Deployment("llama-3.1-8b", "h100-sxm")


def test_static_vs_continuous_shows_the_closed_form_and_a_matching_schedule():
    v = render("scheduling.static_vs_continuous", batch=16, output_median=100, output_sigma=1.0, max_tokens=512)
    assert isinstance(v, View)
    assert v.values["gain"] == pytest.approx(continuous_gain(LogNormal(100, 1.0, cap=512), 16), rel=1e-12)
    assert v.values["continuous_live"] == pytest.approx(1.0)  # every slot live while requests wait
    assert v.values["simulated_gain"] == pytest.approx(v.values["gain"], rel=0.35)  # a few batches of a heavy tail
    flat = render("scheduling.static_vs_continuous", batch=16, output_median=100, output_sigma=0.0, max_tokens=512)
    assert flat.values["gain"] == 1.0 and flat.values["simulated_gain"] == pytest.approx(1.0)
    bad = render("scheduling.static_vs_continuous", batch=16, output_median=1024, output_sigma=0.5, max_tokens=512)
    assert "above max_tokens" in repr(bad)


def test_token_budget_marks_lib_knee():
    v = render("scheduling.token_budget", model="llama-3.1-8b", gpu="h100-sxm", tp=1, batch=32, context=1024,
               tpot_target=0.05)
    knee = 32 + free_prefill_tokens(step_cost(DEP, max_batch=32), 32, 32 * 1024)
    assert v.values["knee"] == knee
    assert v.values["default"] == DEP.max_num_batched_tokens


def test_goodput_vs_batch_edge_is_the_step_models():
    v = render("scheduling.goodput_vs_batch", model="llama-3.1-8b", gpu="h100-sxm", tp=1, context=1024, batch=64,
               tpot_slo=0.02)
    assert v.values["best"] == pytest.approx(min(throughput.batch_for_step_time(DEP, 1024, 0.02),
                                                 DEP.budget.max_sequences(1024)))
    step = throughput.step_s(DEP, 64, 1024)
    assert v.values["goodput_b"] == (pytest.approx(64 / step) if step <= 0.02 else 0.0)


def test_long_output_kv_steady_batch():
    v = render("scheduling.long_output_kv", model="llama-3.1-8b", gpu="h100-sxm", tp=1, prompt=300, output_median=3000,
               output_sigma=0.8, max_tokens=16384, clients=64)
    want = DEP.budget.token_capacity / resident_kv_tokens(300, LogNormal(3000, 0.8, cap=16384))
    assert v.values["steady_batch"] == pytest.approx(want, rel=1e-12)
    assert v.values["dry"] == pytest.approx(DEP.budget.token_capacity / 64 - 300)


def test_offline_batch_padding_never_beats_packing():
    v = render("scheduling.offline_batch", model="llama-3.1-8b", gpu="h100-sxm", tp=1, n_requests=64,
               prompt_median=512, prompt_sigma=0.8, max_tokens=512)
    assert 0 < v.values["waste"] < 1
    assert v.values["packed_s"] <= v.values["padded_s"]
    assert v.values["kv_packed"] >= v.values["kv_padded"]
