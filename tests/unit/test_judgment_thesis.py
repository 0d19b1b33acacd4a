"""lib.judgment.thesis: the claims of the thesis pages, their crossings and their refusals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.judgment import thesis
from lib.perf import datasheet, roofline
from lib.perf.deployment import deployment
from lib.scheduling.cost import step_cost

CHIPS = ["a100-sxm", "h100-sxm", "h200", "b200"]


def test_ridge_trend_matches_published_ridges():
    """scaling-book gpus.md: H100 SXM 295 FLOP/byte, B200 281 (BF16 dense)."""
    steps = thesis.ridge_trend(["h100-sxm", "b200"])
    assert steps[0].ridge_old == pytest.approx(295, rel=0.005)
    assert steps[0].ridge_new == pytest.approx(281, rel=0.005)
    assert not steps[0].ridge_rose  # bandwidth grew faster than FLOP/s on that step


@settings(max_examples=20, deadline=None)
@given(st.permutations(CHIPS), st.sampled_from(["bf16", "fp16"]))
def test_ridge_rises_exactly_when_flops_outgrow_bandwidth(order, dtype):
    for s in thesis.ridge_trend(order, dtype):
        assert s.ridge_ratio == pytest.approx(s.flops_ratio / s.bandwidth_ratio)
        assert s.ridge_rose == (s.flops_ratio > s.bandwidth_ratio)


@pytest.mark.parametrize("chips", [["h100-sxm"], ["h100-sxm", "h100-sxm"], []])
def test_ridge_trend_refuses_fewer_than_two_distinct(chips):
    with pytest.raises(ValueError, match="chips"):
        thesis.ridge_trend(chips)


def test_ridge_trend_refuses_missing_dtype():
    with pytest.raises(ValueError):
        thesis.ridge_trend(["a100-sxm", "h100-sxm"], "fp8")  # A100 has no FP8 peak


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 1400), st.sampled_from(["h100-sxm", "b200", "a100-sxm"]))
def test_compute_bound_batch_is_the_first_batch_at_the_supply(context, chip):
    b = thesis.decode_compute_bound_batch("llama-3.1-70b", chip, context)
    supply = datasheet.bytes_per_flop(chip, "bf16")
    if math.isinf(b):
        assert datasheet.decode_bytes_per_flop("llama-3.1-70b", 1 << 24, context) > supply
    else:
        assert datasheet.decode_bytes_per_flop("llama-3.1-70b", int(b), context) <= supply
        assert b == 1 or datasheet.decode_bytes_per_flop("llama-3.1-70b", int(b) - 1, context) > supply


def test_compute_bound_batch_oracle_roofline_step():
    """Independent oracle: lib.perf.roofline.decode_step (its own FLOP and byte counts) flips from memory- to
    compute-bound at the same batch, within a couple of sequences."""
    b = int(thesis.decode_compute_bound_batch("llama-3.1-70b", "h100-sxm", 512))
    assert roofline.decode_step("llama-3.1-70b", "h100-sxm", 1, b - 2, 512).bound == "memory"
    assert roofline.decode_step("llama-3.1-70b", "h100-sxm", 1, b + 2, 512).bound == "compute"
    # with no context, the crossing sits at the ridge (intensity ~ batch for BF16 weights)
    b0 = thesis.decode_compute_bound_batch("llama-3.1-70b", "h100-sxm", 0)
    assert b0 == pytest.approx(roofline.ridge_point("h100-sxm"), rel=0.02)


def test_long_context_is_memory_bound_at_any_batch():
    assert math.isinf(thesis.decode_compute_bound_batch("llama-3.1-70b", "h100-sxm", 32768))


@pytest.mark.parametrize("model,chip", [("llama-3.1-70b", "h100-sxm"), ("llama-3.1-8b", "b200"),
                                        ("qwen2.5-72b", "h200")])
def test_context_limit_separates_the_two_regimes(model, chip):
    lim = thesis.compute_bound_context_limit(model, chip)
    assert 0 < lim < 131072
    assert math.isfinite(thesis.decode_compute_bound_batch(model, chip, int(lim)))
    assert math.isinf(thesis.decode_compute_bound_batch(model, chip, int(lim) + 1))


def test_fp8_kv_does_not_lower_the_context_limit():
    bf16 = thesis.compute_bound_context_limit("llama-3.1-70b", "h100-sxm", "fp8", "bf16")
    fp8 = thesis.compute_bound_context_limit("llama-3.1-70b", "h100-sxm", "fp8", "fp8")
    assert fp8 >= bf16


def test_batch_limits_binding_is_the_smallest():
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    long, short = thesis.batch_limits(dep, 32768, 0.05), thesis.batch_limits(dep, 512, 0.05)
    assert long.binding == "KV capacity" and long.batch == long.kv
    assert short.binding != "KV capacity"
    assert short.batch == min(short.kv, short.latency, short.engine)


@pytest.mark.parametrize("kwargs", [{"context": 0, "tpot_s": 0.05}, {"context": 1024, "tpot_s": 0.0},
                                    {"context": 1024, "tpot_s": math.nan}, {"context": 10**7, "tpot_s": 0.05}])
def test_batch_limits_refuses_bad_inputs(kwargs):
    with pytest.raises(ValueError):
        thesis.batch_limits(deployment("llama-3.1-70b", "h100-sxm", tp=8), **kwargs)


def test_batch_limits_latency_zero_when_batch_one_misses():
    lim = thesis.batch_limits(deployment("llama-3.1-70b", "h100-sxm", tp=8), 1024, 1e-4)
    assert lim.latency == 0.0 and lim.binding == "latency target"


@settings(max_examples=8, deadline=None)
@given(st.floats(0.02, 0.2), st.sampled_from(["bf16", "fp8"]))
def test_kv_binding_context_is_the_first_binding_context(tpot_s, kv_dtype):
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8, kv_dtype=kv_dtype)
    c = thesis.kv_binding_context(dep, tpot_s)
    table = step_cost(dep)

    def binds(x, cost=table):
        lim = thesis.batch_limits(dep, x, tpot_s, cost)
        return lim.kv <= min(lim.latency if lim.latency > 0 else math.inf, lim.engine)

    if math.isfinite(c):
        assert binds(int(c)) and (c == 1 or not binds(int(c) - 1))
        # the exact step (bisection, no table) puts the crossing within 1% of the tabulated one
        assert binds(int(c * 1.01) + 1, None) and (c < 100 or not binds(int(c * 0.99) - 1, None))
    else:
        assert not binds(131072) and not binds(131072, None)


def test_fp8_kv_pushes_the_binding_context_out():
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    bf16 = thesis.kv_binding_context(dep, 0.05)
    fp8 = thesis.kv_binding_context(dep.replace(kv_dtype="fp8"), 0.05)
    assert 1000 < bf16 < fp8 < 131072


# ---- dated predictions (N092) -----------------------------------------------------------------------------


def test_chips_available_by_date():
    assert thesis.chips_available(CHIPS, 2023.0) == ["a100-sxm", "h100-sxm"]
    assert thesis.chips_available(list(reversed(CHIPS)), 2030.0) == CHIPS  # oldest first
    with pytest.raises(ValueError, match="announcement"):
        thesis.announced("mi300x")
    with pytest.raises(ValueError, match="date"):
        thesis.chips_available(CHIPS, math.nan)


@settings(max_examples=20, deadline=None)
@given(st.floats(2022.3, 2030.0), st.floats(0.0, 5.0))
def test_ridge_forecast_is_the_measured_rate_carried_forward(date, horizon):
    fc = thesis.ridge_forecast(CHIPS, date, date + horizon)
    years = thesis.announced(fc.latest) - thesis.announced(fc.first)
    r = datasheet.spec_ratios(fc.first, fc.latest)
    assert fc.ridge_per_year == pytest.approx((r["flops"] / r["bandwidth"]) ** (1 / years))
    ahead = fc.target - thesis.announced(fc.latest)
    assert fc.ridge_target == pytest.approx(fc.ridge_latest * fc.ridge_per_year**ahead)
    # holding the ridge at today's value with the extrapolated FLOP/s
    assert fc.flops_target / fc.bandwidth_to_hold == pytest.approx(fc.ridge_latest)


def test_ridge_forecast_refuses_a_date_with_one_chip():
    with pytest.raises(ValueError, match="two"):
        thesis.ridge_forecast(CHIPS, 2021.0, 2023.0)


def test_energy_levers_batch_beats_generation_and_hardware_line():
    old = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    new = old.replace(gpu="b200")
    el = thesis.energy_levers(old, new, 4096, 256, 32)
    assert el.j_old_1 > el.j_old_fleet > el.j_old_batch > el.j_new_batch
    assert el.batching_gain > el.generation_gain > 1
    b = thesis.batch_where_hardware_wins(old, new, 4096, 256)
    assert 1 < b < 256
    top = thesis.energy_levers(old, new, 4096, 256, int(b))
    assert top.fill_gain <= top.generation_gain
    assert thesis.energy_levers(old, new, 4096, 256, int(b) - 1).fill_gain > top.generation_gain
    with pytest.raises(ValueError):
        thesis.energy_levers(old, deployment("llama-3.1-8b", "b200", tp=1), 4096, 64)
    with pytest.raises(ValueError):
        thesis.energy_levers(old, new, 4096, 64, 128)  # the fleet cannot average above the batch it can run


def test_frontier_fleet_oracle_llama3_counts():
    """Oracle: the Llama 3 paper's 419 unexpected interruptions in 54 days on 16,384 GPUs, and the fleet
    equation by hand on the B200's 2,250 dense TFLOP/s at 43% MFU."""
    ff = thesis.frontier_fleet(2026.0, "b200", growth_per_year=4.0, days=90)
    assert ff.job_mtbf_s == pytest.approx(54 * 86400 * 16384 / 419 / math.ceil(ff.gpus), rel=0.01)
    assert ff.gpus == pytest.approx(ff.flops / (90 * 86400 * 2250e12 * 0.43), rel=1e-6)
    assert ff.gpus_human_limit == pytest.approx(54 * 86400 * 16384 / 419 / 86400, rel=0.01)
    # at the date the frontier crossed the limit, the fleet equals it
    at = thesis.frontier_fleet(ff.date_human_limit, "b200", growth_per_year=4.0, days=90)
    assert at.gpus == pytest.approx(ff.gpus_human_limit, rel=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.floats(2023.0, 2030.0), st.floats(1.5, 8.0), st.floats(30.0, 365.0))
def test_frontier_fleet_grows_with_date_and_shrinks_with_time(date, growth, days):
    a = thesis.frontier_fleet(date, "b200", growth_per_year=growth, days=days)
    b = thesis.frontier_fleet(date + 1, "b200", growth_per_year=growth, days=days)
    c = thesis.frontier_fleet(date, "b200", growth_per_year=growth, days=2 * days)
    assert b.gpus == pytest.approx(a.gpus * growth)
    assert c.gpus == pytest.approx(a.gpus / 2)
    assert b.job_mtbf_s <= a.job_mtbf_s


def test_kv_handoff_sink_link_gives_the_share():
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    kv = thesis.kv_handoff(dep, 32768, 0.1)
    assert 0 < kv.share < 0.1 and kv.link_to_sink < kv.link_bytes_per_s
    from lib.fleet import disaggregation

    t = disaggregation.kv_transfer(dep, 32768)
    # at the sinking link rate the hand-off takes exactly the share of the prefill
    assert t.latency_s + t.bytes_per_lane / kv.link_to_sink == pytest.approx(0.1 * kv.prefill_s)
    with pytest.raises(ValueError):
        thesis.kv_handoff(dep, 32768, 0.0)


# ---- why this work (N078) --------------------------------------------------------------------------------


def test_decode_flop_utilization_is_intensity_over_ridge_below_the_ridge():
    u = thesis.decode_flop_utilization("llama-3.1-70b", "h100-sxm", 8, 32, 4096)
    st = roofline.decode_step("llama-3.1-70b", "h100-sxm", 8, 32, 4096)
    assert u == pytest.approx(st.intensity / roofline.ridge_point("h100-sxm"))
    # oracle: the datasheet module's demand against the chip's supply gives the same share
    assert u == pytest.approx(datasheet.bytes_per_flop("h100-sxm")
                              / datasheet.decode_bytes_per_flop("llama-3.1-70b", 32, 4096), rel=0.01)
    assert thesis.decode_flop_utilization("llama-3.1-8b", "h100-sxm", 1, 1024, 128) == pytest.approx(1.0)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, 512]), st.sampled_from([128, 1024, 8192, 65536]))
def test_decode_flop_utilization_bounded_and_monotone_in_batch(batch, context):
    u1 = thesis.decode_flop_utilization("llama-3.1-70b", "b200", 8, batch, context)
    u2 = thesis.decode_flop_utilization("llama-3.1-70b", "b200", 8, 2 * batch, context)
    assert 0 < u1 <= u2 <= 1


def test_background_constraints_one_per_background():
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=8)
    cons = thesis.background_constraints(dep, 4096, 32, 2026.0, 32768)
    assert tuple(cons) == thesis.BACKGROUNDS
    assert cons["kernels"].value == pytest.approx(thesis.decode_flop_utilization("llama-3.1-70b", "h100-sxm", 8, 32, 4096))
    assert cons["SRE"].value == pytest.approx(thesis.frontier_fleet(2026.0, "b200").job_mtbf_s)
    assert all(c.sentence and c.constraint for c in cons.values())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 131072), st.floats(0.005, 0.3), st.sampled_from([("llama-3.1-70b", "h100-sxm", 8),
                                                                      ("llama-3.1-8b", "b200", 1),
                                                                      ("qwen2.5-72b", "h200", 4)]))
def test_kv_binds_on_the_table_agrees_with_the_exact_step(context, tpot_s, setup):
    """kv_binds read off the step table (what kv_binding_context and the explorer use) against an oracle that
    scans whole batches of the exact decode step (lib.perf.throughput.step_s) for the latency limit."""
    from lib.perf import throughput

    m, g, tp = setup
    dep = deployment(m, g, tp=tp)
    kv = throughput.kv_batch_ceiling(dep, context)
    if kv > dep.max_num_seqs:
        want = False
    elif throughput.step_s(dep, 1, context) > tpot_s:
        want = True  # no batch meets the target: the KV ceiling is what limits the batch held
    else:
        b = max(1, math.floor(kv))
        t_b, t_b1 = throughput.step_s(dep, b, context), throughput.step_s(dep, b + 1, context)
        t_kv = t_b + max(0.0, kv - b) * (t_b1 - t_b)  # the step is linear between whole batches
        if abs(t_kv - tpot_s) <= 2e-3 * tpot_s:
            return  # a tie within the table's 0.1%
        want = t_kv <= tpot_s
    assert thesis.kv_binds(dep, context, tpot_s, step_cost(dep)) == want
    assert thesis.kv_binds(dep, context, tpot_s) == want
