"""lib.training.flops: functions added for the fleet pages (N037, N038, N041, N011)."""

# ==== fleet pages (training-time-estimate, fleet-size-estimate, cost-per-training-token, mfu) =========

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.registry.hardware import gpu
from lib.training import flops


def test_eval_time_fraction_by_counting_flops():
    # 1B eval tokens (forward only: 2N each) every 50B training tokens (6N each) at half the FLOP rate
    n = 70e9
    eval_s, train_s = 1e9 * 2 * n / 0.5, 50e9 * 6 * n
    assert math.isclose(flops.eval_time_fraction(1e9, 50e9, 0.5), eval_s / (eval_s + train_s), rel_tol=1e-12)
    assert flops.eval_time_fraction(0, 50e9) == 0
    with pytest.raises(ValueError, match="train_tokens_between"):
        flops.eval_time_fraction(1e9, 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 0.9), min_size=0, max_size=5))
def test_fleet_margin_gives_back_the_lost_time(fractions):
    # a fleet (1 + margin) x larger, losing each f_i of its wall time, does the compute-only fleet's work
    m = flops.fleet_margin(fractions)
    assert math.isclose((1 + m) * math.prod(1 - f for f in fractions), 1.0, rel_tol=1e-9)
    assert m >= 0


def test_fleet_margin_refuses_a_whole_loss():
    with pytest.raises(ValueError, match="below 1"):
        flops.fleet_margin([0.1, 1.0])


def test_usd_per_flop_by_hand_and_times_six_n():
    # 2.5 USD/h, H100 989 TFLOP/s dense BF16, 40% MFU
    want = 2.5 / 3600 / (989e12 * 0.4)
    assert math.isclose(flops.usd_per_flop("h100-sxm", 0.4, 2.5), want, rel_tol=1e-12)
    # the same chain as usd_per_training_token, with model FLOPs per token in place of 6N
    per_tok = flops.usd_per_training_token("llama-3.1-8b", 4096, "h100-sxm", 0.4, 2.5)
    assert math.isclose(per_tok, want * flops.model_flops_per_token("llama-3.1-8b", 4096), rel_tol=1e-12)
    assert flops.usd_per_flop("b200", 0.4, 2.5) < flops.usd_per_flop("h100-sxm", 0.4, 2.5)
    assert gpu("h100-sxm").peak_flops("fp8") > 0
    with pytest.raises(ValueError, match="mfu"):
        flops.usd_per_flop("h100-sxm", 0.0)
