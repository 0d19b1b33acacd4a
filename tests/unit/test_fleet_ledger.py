"""lib.fleet.ledger: a serving cost ledger line by line, and the audit that rejects wins that move cost or break a gate."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.fleet import capacity as c
from lib.fleet import ledger as lg
from lib.perf.deployment import deployment

TPOT, TTFT = 0.05, 1.0


@pytest.fixture(scope="module")
def base():
    return lg.price_ledger("base", deployment("llama-3.1-70b", "h100-sxm", tp=4), 50.0, 3000, 400, tpot_target_s=TPOT,
                           quality=80.0, n_path=20_000)


def test_lines_add_up_to_the_bill_of_whole_replicas(base):
    assert base.total == pytest.approx(base.replicas * 4 * c.gpu_hour_usd("h100-sxm"))
    cost = c.request_cost(deployment("llama-3.1-70b", "h100-sxm", tp=4), 3000, 400, TPOT)
    assert base.lines["prefill GPUs"] == pytest.approx(50 * cost.prefill_s / 0.7 * 4 * c.gpu_hour_usd("h100-sxm"))
    assert base.replicas == c.fleet_for_load(50.0, cost, 0.7).replicas


@settings(max_examples=10, deadline=None)
@given(rate=st.floats(1.0, 200.0), retry=st.floats(0.0, 0.3))
def test_bill_is_whole_replicas_for_any_rate_and_retry_share(rate, retry):
    led = lg.price_ledger("x", deployment("llama-3.1-8b", "h100-sxm"), rate, 1000, 200, tpot_target_s=TPOT, retry_share=retry,
                          n_path=2_000)
    assert led.total == pytest.approx(led.replicas * c.gpu_hour_usd("h100-sxm"))
    assert all(v >= -1e-9 for v in led.lines.values())


def test_sizing_for_ttft_adds_headroom_and_meets_the_target(base):
    dep = deployment("llama-3.1-70b", "h100-sxm", tp=4, kv_dtype="fp8")
    loose = lg.price_ledger("kv", dep, 50.0, 3000, 400, tpot_target_s=TPOT)
    sized = lg.price_ledger("kv", dep, 50.0, 3000, 400, tpot_target_s=TPOT, size_for_ttft_s=TTFT)
    assert loose.ttft_quantile_s > TTFT >= sized.ttft_quantile_s * 0.97  # the sample path's noise aside
    assert sized.lines["TTFT headroom"] > 0 and sized.replicas > loose.replicas


def test_audit_rejects_moved_cost_and_broken_gates(base):
    cheap = lg.proposal("cheaper GPU", base, tpot_target_s=TPOT, quality=80.0, n_path=20_000)
    a = lg.audit(base, cheap.ledger, cheap.claim, cheap.claimed_saving, quality_tolerance=0.5, tpot_target_s=TPOT,
                 ttft_target_s=TTFT)
    assert cheap.claimed_saving > 0 > a.total_saving and not a.accepted
    assert "prefill GPUs" in a.moved_to
    trunc = lg.proposal("truncate prompts", base, tpot_target_s=TPOT, quality=77.0, retry_share=0.08, n_path=20_000)
    t = lg.audit(base, trunc.ledger, trunc.claim, trunc.claimed_saving, quality_tolerance=0.5, tpot_target_s=TPOT,
                 ttft_target_s=TTFT)
    assert t.total_saving > 0 and not t.quality_ok and not t.accepted
    w8 = lg.proposal("FP8 weights", base, tpot_target_s=TPOT, quality=79.6, n_path=20_000)
    w = lg.audit(base, w8.ledger, w8.claim, w8.claimed_saving, quality_tolerance=0.5, tpot_target_s=TPOT, ttft_target_s=TTFT)
    assert w.accepted and not w.reasons
    assert lg.choose([a, t, w]) is w
    assert lg.choose([a, t]) is None


def test_unmeasured_quality_fails_the_gate(base):
    p = lg.proposal("higher utilization", base, tpot_target_s=TPOT, n_path=20_000)  # quality nan
    a = lg.audit(base, p.ledger, p.claim, p.claimed_saving, quality_tolerance=0.5, tpot_target_s=TPOT, ttft_target_s=5.0)
    assert not a.quality_ok and not a.accepted


def test_refusals(base):
    with pytest.raises(ValueError, match="kind"):
        lg.proposal("magic", base)
    with pytest.raises(ValueError, match="clashes"):
        lg.price_ledger("x", deployment("llama-3.1-8b", "h100-sxm"), 1.0, 100, 10, tpot_target_s=TPOT,
                        extra={"retries": 1.0})
    with pytest.raises(ValueError, match="Ledger"):
        lg.audit("base", base, "x", 1.0, quality_tolerance=0.5, tpot_target_s=TPOT, ttft_target_s=TTFT)
    with pytest.raises(ValueError, match="TTFT target"):
        lg.price_ledger("x", deployment("llama-3.1-70b", "h100-sxm", tp=4), 1.0, 16000, 10, tpot_target_s=TPOT,
                        size_for_ttft_s=0.5)
    assert math.isnan(base.quality) is False
