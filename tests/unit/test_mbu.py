"""lib.perf.mbu: the MBU definition, its pitfalls priced by independent arithmetic, and the I005 split."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib.perf import mbu
from lib.perf.deployment import Deployment
from lib.perf.step import decode_step
from lib.registry.models import model
from lib.units import GB, GiB


def _step(key, chip, tp, batch, context, weight_dtype="bf16"):
    return decode_step(Deployment(key, chip, tp=tp, weight_dtype=weight_dtype), batch, context)


DSV3 = mbu.Scenario("deepseek-v3", "h200", 8, 32, 16384, "fp8", "bf16", 0.030, 0.6)


def test_databricks_worked_example():
    # Databricks, 'LLM Inference Performance Engineering': a 7B model in 16 bits at 14 ms TPOT
    # moves 14 GB in 14 ms = 1 TB/s; on a 2 TB/s part that is MBU 50%.
    assert math.isclose(mbu.mbu(14e9, 14e-3, 2e12), 0.5, rel_tol=1e-12)


def test_step_bytes_dense_and_moe():
    # every parameter but the 128,256 x 8,192 embedding table, of which the step reads one row
    b = mbu.step_bytes("llama-3.1-70b", 1, 0)
    assert b.weights == b.weights_all_experts
    assert b.weights == (model("llama-3.1-70b").params_total - 128_256 * 8_192 + 8_192) * 2
    # MoE at batch 1 reads the active parameters only (lib.registry.models counts them independently),
    # again less the 129,280 x 7,168 embedding table but one row
    one = mbu.step_bytes("deepseek-v3", 1, 0, weight_dtype="fp8")
    table = 129_280 * 7_168
    assert math.isclose(one.weights, model("deepseek-v3").params_active - table + 7_168, rel_tol=1e-9)
    assert one.weights_all_experts == model("deepseek-v3").params_total - table + 7_168
    kv = mbu.step_bytes("llama-3.1-70b", 4, 1000).kv
    assert kv == 4 * 1000 * 80 * 2 * 8 * 128 * 2  # layers x K,V x KV heads x head_dim x 2 B


def test_kv_summed_over_ranks():
    assert (
        mbu.step_bytes("deepseek-v3", 2, 100, tp=8).kv_summed_over_ranks
        == 8 * mbu.step_bytes("deepseek-v3", 2, 100).kv
    )
    b8 = mbu.step_bytes("llama-3.1-70b", 2, 100, tp=8)
    assert b8.kv_summed_over_ranks == b8.kv  # 8 KV heads over 8 ranks: no replica
    b16 = mbu.step_bytes("llama-3.1-70b", 2, 100, tp=16)
    assert b16.kv_summed_over_ranks == 2 * b16.kv  # each KV head on two ranks


def test_scenario_mbu_is_bytes_over_time_over_aggregate_peak():
    b = DSV3.bytes
    assert math.isclose(DSV3.mbu, (b.weights + b.kv) / 0.030 / (8 * 4.8e12), rel_tol=1e-12)
    assert math.isclose(DSV3.floor_s, DSV3.mbu * 0.030, rel_tol=1e-12)


def test_pitfalls_by_independent_arithmetic():
    p = {x.key: x for x in mbu.pitfalls(DSV3, "h100-sxm")}
    b, true = DSV3.bytes, DSV3.mbu
    w, kv = b.weights, b.kv
    assert math.isclose(p["forgot_kv"].reported, true * w / (w + kv), rel_tol=1e-12)
    assert math.isclose(
        p["all_experts"].reported, true * (b.weights_all_experts + kv) / (w + kv), rel_tol=1e-12
    )
    assert math.isclose(p["bf16_bytes"].reported, true * (2 * w + kv) / (w + kv), rel_tol=1e-12)
    assert math.isclose(p["wrong_peak"].reported, true * 4.8 / 3.35, rel_tol=1e-12)
    assert math.isclose(p["gib_vs_gb"].reported, true * GB / GiB, rel_tol=1e-12)
    assert math.isclose(p["idle_averaged"].reported, true * 0.6, rel_tol=1e-12)
    assert math.isclose(p["tp_replicated"].reported, true * (w + 8 * kv) / (w + kv), rel_tol=1e-12)
    assert math.isclose(p["throughput_time"].reported, true * 32, rel_tol=1e-12)
    assert math.isclose(p["idle_averaged"].error_points, -100 * 0.4 * true, rel_tol=1e-12)


def test_pitfalls_that_vanish_when_they_do_not_apply():
    dense = mbu.Scenario("llama-3.1-70b", "h100-sxm", 8, 16, 4096, "bf16", "bf16", 0.012)
    p = {x.key: x for x in mbu.pitfalls(dense, "h100-sxm")}
    for key in ("all_experts", "bf16_bytes", "wrong_peak", "idle_averaged", "tp_replicated"):
        assert p[key].error_points == pytest.approx(0, abs=1e-9), key


@given(
    st.sampled_from(["llama-3.1-70b", "mixtral-8x7b", "deepseek-v3"]),
    st.integers(1, 128),
    st.integers(0, 32768),
    st.floats(0.05, 1.0),
)
def test_signs_of_the_errors(key, batch, context, busy):
    s = mbu.Scenario(key, "h200", 8, batch, context, "fp8", "bf16", 0.05, busy)
    p = {x.key: x for x in mbu.pitfalls(s)}
    assert p["forgot_kv"].error_points <= 0 and p["idle_averaged"].error_points <= 0
    assert p["gib_vs_gb"].error_points < 0
    for key_up in ("all_experts", "bf16_bytes", "tp_replicated", "wrong_peak"):
        assert p[key_up].error_points >= -1e-9


def test_diagnosis_buckets_sum_to_the_measured_step():
    step = _step("llama-3.1-70b", "h100-sxm", 4, 32, 4096)
    d = mbu.diagnose(step, 0.6)
    assert math.isclose(d.measured_s, step.mbu_floor_s / 0.6, rel_tol=1e-12)
    assert math.isclose(
        d.floor_s + sum(d.buckets.values()) + d.residual_s, d.measured_s, rel_tol=1e-12
    )
    assert math.isclose(
        d.modelled_s, step.total_s, rel_tol=1e-12
    )  # buckets are the model's overheads
    assert math.isclose(sum(d.points().values()), 100 * (1 - 0.6), rel_tol=1e-9)
    assert set(d.buckets) == set(mbu.BUCKET_INFO)


@given(st.floats(0.05, 1.0))
def test_residual_sign_follows_the_modelled_mbu(measured):
    step = _step("llama-3.1-70b", "h100-sxm", 8, 8, 2048)
    d = mbu.diagnose(step, measured)
    assert (d.residual_s > 0) == (measured < step.mbu) or math.isclose(measured, step.mbu)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: mbu.mbu(1, 0, 1), "step_s must be a finite number > 0"),
        (lambda: mbu.mbu(-1, 1, 1), "bytes_per_step"),
        (lambda: mbu.mbu(float("nan"), 1, 1), "finite"),
        (
            lambda: mbu.Scenario("llama-3.1-70b", "h100-sxm", 8, 1, 0, "bf16", "bf16", 0.01, 0),
            "busy_fraction",
        ),
        (lambda: mbu.Scenario("llama-3.1-70b", "h100-sxm", 8, 1, 0, "bf16", "bf16", -1), "step_s"),
        (lambda: mbu.Scenario("nope", "h100-sxm", 8, 1, 0, "bf16", "bf16", 0.01), "unknown model"),
        (lambda: mbu.step_bytes("llama-3.1-70b", 0, 0), "batch must be"),
        (
            lambda: mbu.diagnose(_step("llama-3.1-8b", "h100-sxm", 1, 1, 0), 1.5),
            "measured_mbu",
        ),
    ],
)
def test_bad_inputs_are_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_diagnosis_floor_counts_replicated_kv_once():
    # MLA's latent is read by all 8 ranks: 7/8 of the per-rank KV read is a replication bucket,
    # and the floor equals the replica-level MBU floor of lib.perf.mbu.Scenario (second method).
    step = _step("deepseek-v3", "h200", 8, 16, 8192, "fp8")
    d = mbu.diagnose(step, 0.5)
    assert step.kv_copies == 8
    assert math.isclose(d.buckets["kv_replication"], step["kv_cache"] * 7 / 8, rel_tol=1e-12)
    # second method: the parameter count (roofline.weight_bytes_read_per_step) against the step
    # model's kernel-by-kernel bytes; they differ by the embedding rows and norms (parts per million)
    scn = mbu.Scenario("deepseek-v3", "h200", 8, 16, 8192, "fp8", "bf16", d.measured_s)
    assert math.isclose(d.floor_s, scn.floor_s, rel_tol=1e-4)
    assert math.isclose(scn.mbu, 0.5, rel_tol=1e-4)
    dense = mbu.diagnose(_step("llama-3.1-70b", "h100-sxm", 8, 16, 8192), 0.5)
    assert dense.buckets["kv_replication"] == 0.0


def test_diagnose_takes_the_step_models_decode_step():
    # regression (issue 9): MBU comes from lib.perf.step's DecodeStep, mbu_floor_s / total_s
    step = _step("llama-3.1-70b", "h100-sxm", 4, 32, 4096)
    d = mbu.diagnose(step, step.mbu)
    assert math.isclose(d.residual_s, 0.0, abs_tol=1e-12)
    assert math.isclose(step.mbu, step.mbu_floor_s / step.total_s, rel_tol=1e-12)
    with pytest.raises(ValueError, match="DecodeStep"):
        mbu.diagnose(object(), 0.5)


def test_scenario_refuses_a_server_that_cannot_exist():
    with pytest.raises(ValueError, match="no room for a KV cache"):
        mbu.Scenario("llama-3.1-70b", "h100-sxm", 1, 1, 0, "bf16", "bf16", 0.05)
    assert mbu.Scenario("llama-3.1-70b", "h100-sxm", 8, 1, 0, "bf16", "bf16", 0.05).deployment.tp == 8


def test_hand_computed_mbu_of_a_published_step():
    # independent arithmetic: Llama 3.1 70B BF16 TP8 on H100 at batch 1 reads (70.6e9 - 1.05e9) x 2 B
    # per step; at a measured 11.9 ms step on 8 x 3.35 TB/s that is 139.0e9 / 11.9e-3 / 26.8e12 = 43.6%
    s = mbu.Scenario("llama-3.1-70b", "h100-sxm", 8, 1, 0, "bf16", "bf16", 11.9e-3)
    assert math.isclose(s.mbu, (70.6e9 - 128_256 * 8_192) * 2 / 11.9e-3 / (8 * 3.35e12), rel_tol=0.005)


def test_mbu_diagnosis_explorer_prices_the_dtypes_it_is_given():
    from lib.book import widgets

    kw = dict(model="llama-3.1-70b", gpu="h100-sxm", tp=4, batch=32, context=4096, measured_mbu=0.6,
              allreduce="ring", level="central")
    bf16 = widgets.render("roofline.mbu_diagnosis", **kw).values
    fp8 = widgets.render("roofline.mbu_diagnosis", weight_dtype="fp8", kv_dtype="fp8", **kw).values
    dep = Deployment("llama-3.1-70b", "h100-sxm", tp=4, weight_dtype="fp8", kv_dtype="fp8")
    assert math.isclose(fp8["floor"], decode_step(dep, 32, 4096).mbu_floor_s, rel_tol=1e-12)
    assert fp8["floor"] < bf16["floor"]
